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
// 1, not owned).
struct SequenceChunk {
  KVCache* cache = nullptr;
  at::Tensor ids;
  at::Tensor positions;
};

// The logits of each chunk's last token, [chunks, padded_vocab_size]: chunk s's row equals the
// last logits of model.Forward(ids, cache, {positions, last_logits_only}) run alone: bit for
// bit where the matrix products are row-invariant (float32 on CPUs with the AVX-512 GEMV;
// every other layer works token by token), else up to their rounding over another number of
// rows. InvalidArgument for no chunks or chunks of another shape; the forward pass's errors.
absl::StatusOr<at::Tensor> ForwardChunks(GPTImpl& model, const std::vector<SequenceChunk>& chunks);

}  // namespace lgpt

#endif  // LGPT_CORE_MODEL_BATCH_FORWARD_H_
