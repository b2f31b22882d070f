// Cache-aware training: a sequence longer than the KV cache's budget runs through the cache
// policy it will meet at inference, chunk after chunk, and the gradient is the exact gradient
// of that chunked computation with the eviction decisions held constant (keys_values' method,
// on lgpt's KVCache contract). Memory follows the budget and the chunk, not the sequence's
// activations:
//
//   forward   no autograd: chunk c (positions [c0, c1)) runs every layer through the policy
//             cache, wrapped in a RecordingKVCache (the replay log: what each (row, group)
//             attended to); the input of every layer is kept (checkpoints [B, S, n_embd] per
//             layer, optionally int8: the only state that grows with the sequence), and the
//             loss summed.
//   backward  cell by cell (one layer, one chunk), top layer down. A cell recomputes its layer
//             with autograd over the rows of the entries the chunk attended to (gathered from
//             the layer's checkpoint, so their keys and values are recomputed by the layer's
//             own code) followed by the chunk's rows, each (row, group) masked to exactly what
//             the log says (ReplayKVCache); backward from the chunk's output gradient gives the
//             gradient of every input row it read, added into the layer's input gradient.
//             The head's gradient starts it chunk by chunk, the embedding's ends it.
//
// Costs: the forward pass once; every cell recomputes (replayed + chunk) rows of one block
// (up to budget · n_query_groups + chunk rows: the replayed entries go through the whole block
// though only their keys and values are used, so a cell costs about (replayed + chunk) / chunk
// times the chunk's own block), then its backward. Peak memory: the checkpoints, two gradient
// buffers [B, S, n_embd] and one cell's activations.
//
// Exactness: with 16-bit storage the gradient is that of the chunked computation (tests
// compare it with autograd through the same computation kept whole, and with plain autograd
// over the whole sequence when nothing is evicted). With int8/int4 storage the forward read
// quantised keys and values while the cells recompute them in full precision: quantisation is
// treated as the identity in the backward pass (straight-through). LoRA dropout draws new
// masks in the recomputation.
#ifndef LGPT_CORE_TRAIN_CHUNKED_BACKWARD_H_
#define LGPT_CORE_TRAIN_CHUNKED_BACKWARD_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/kv_cache_factory.h"
#include "core/model/gpt.h"

namespace lgpt {

struct ChunkedTrainingOptions {
  KVCacheSpec cache;         // the policy in place (positions must be "absolute")
  int64_t chunk_size = 128;  // tokens a step
  int64_t first_chunk = 0;   // tokens of the first step (a prefill); 0: chunk_size
  // Sequence classification (keys_values' head for long inputs: a long document -> one of
  // "A/B/C/D"): non-empty, the loss counts one target per row, the first that counts (the
  // response's first token), scored over the logits of these token ids only; that target must
  // be one of them. Empty: next-token loss over every target that counts.
  std::vector<int64_t> class_tokens;
  // The layer-input checkpoints: 16, the model's dtype (the gradient is exact); or 8, int8 per
  // token and group of 32 channels with a float16 scale (keys_values' quantised checkpoints:
  // ~0.27x the float32 bytes; the recomputed cells see inputs rounded to half a step of their
  // group, so the gradient is close to, not equal to, the exact one).
  int checkpoint_bits = 16;
};

struct ChunkedLossResult {
  double loss = 0;               // mean cross-entropy over the counted targets
  int64_t target_tokens = 0;     // targets counted
  int64_t chunks = 0;            // steps through the cache
  int64_t checkpoint_bytes = 0;  // layer inputs kept for the backward pass
  int64_t peak_cell_rows = 0;    // most rows a recomputed cell held (replayed + chunk)
};

// input_ids [B, S] and labels [B, S] int64, S within the model's context; labels follow
// SftLoss (tools/sft_data.h): logits at t predict labels[t + 1], kIgnoreIndex (-100) where
// nothing counts. Returns the loss of the chunked computation through a cache built from
// options.cache; with `grad_scale`, also adds grad_scale · d(loss)/dθ to the .grad of every
// parameter that requires grad. InvalidArgument for bad shapes or options.
absl::StatusOr<ChunkedLossResult> ChunkedLoss(GPTImpl& model, const at::Tensor& input_ids,
                                              const at::Tensor& labels,
                                              const ChunkedTrainingOptions& options,
                                              std::optional<double> grad_scale);

}  // namespace lgpt

#endif  // LGPT_CORE_TRAIN_CHUNKED_BACKWARD_H_
