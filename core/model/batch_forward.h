// One forward pass over the chunks of several sequences, each through its own batch-1 KV
// cache: the serving scheduler's step (prompt chunks of requests still reading their prompt,
// decode tokens of the others), with every weight read once for all of them.
//
// The chunks become one KVBatch (cache/kv_batch.h): one-token chunks only as a [chunks, 1]
// step (a decode step), else every chunk's tokens end to end in one [1, T_0 + T_1 + ...] step
// (Sarathi-Serve's stall-free batching); RoutingKVCache gives each chunk's attention to its own
// cache, and GPT::Forward (ForwardOptions.logit_steps) runs the head over each chunk's last
// token only.
#ifndef LGPT_CORE_MODEL_BATCH_FORWARD_H_
#define LGPT_CORE_MODEL_BATCH_FORWARD_H_

#include <ATen/core/Tensor.h>

#include <vector>

#include "absl/status/statusor.h"
#include "cache/kv_cache.h"
#include "core/model/gpt.h"

namespace lgpt {

// A sequence's part of a step: int64 ids and positions [1, T] fed through `cache` (batch size
// 1, not owned), with the adapter its request uses.
struct SequenceChunk {
  KVCache* cache = nullptr;
  at::Tensor ids;
  at::Tensor positions;
  // Its adapter slot in a multi-adapter model (peft/multi_lora.h; GPTImpl::adapter_slots()),
  // -1 for the base model. Chunks of different adapters share the step: the base projections
  // run once over every row, each adapter's update over its chunks' rows only.
  int64_t adapter = -1;
  // Logits of every token of the chunk, not only the last (a speculative verification chunk:
  // position j's logits choose the token after ids[j]).
  bool all_logits = false;
  // Its tokens attend as one-token steps would (ForwardOptions::sequential, KVStep::sequential):
  // speculative verification through a quantised cache.
  bool sequential = false;
};

// The logits [rows, padded_vocab_size]: per chunk in order, its last token's row, or with
// all_logits one row per token. Chunk s's rows equal the logits of model.Forward(ids, cache,
// {positions, last_logits_only or not, sequential}) run alone: bit for
// bit where the matrix products are row-invariant (float32 on CPUs with the AVX-512 GEMV;
// every other layer works token by token), else up to their rounding over another number of
// rows; with adapters, chunk s's row equals its adapter's model run alone (up to the rounding of
// the update). InvalidArgument for no chunks, chunks of another shape or an adapter slot the
// model lacks (SequenceChunk.adapter); the forward pass's errors.
absl::StatusOr<at::Tensor> ForwardChunks(GPTImpl& model, const std::vector<SequenceChunk>& chunks);

}  // namespace lgpt

#endif  // LGPT_CORE_MODEL_BATCH_FORWARD_H_
