// The attention kernels: scaled dot-product attention over the entries a step attends to,
// masked by token positions (core/ops/attention_mask.h), softmax in float32 as LitGPT's.
//
// Two entry points, one implementation:
// - AttendByPositions: keys and values as tensors (the dense cache's views). Decoding steps
//   on the CPU (few float32 queries) take the decode-step kernel (core/ops/decode_attention.h);
//   everything else the generic path below, over one source read whole. Prompts of float32
//   rows on the CPU take the flash kernel (core/ops/flash_attention.h) instead: without
//   autograd the inference kernel; in training (grad mode on and q, keys or values requiring
//   grad; one source read whole) the trainable one (core/ops/flash_attention_grad.h), which
//   keeps q, k, v, the output and one log-sum-exp per query for backward instead of the
//   [B, n_head, T, S] scores and weights.
// - AttendBlockwise: entries read block by block from any storage (quantised caches), so no
//   full-precision copy of a layer's entries is ever made. Two passes: the first decodes each
//   block's keys and fills its columns of the scores; the second decodes each block's values
//   and accumulates weights · values in float32.
//
// Grouped queries are computed without repeating keys: the q_per_kv query heads of a group
// are folded into the query axis, so keys and values are read once per group.
// Cost per call of the generic path: O(B · n_head · T · S · head_size) multiply-adds plus the
// scores/weights [B, n_head, T, S] float32 and the mask (kept for backward in training), where S is
// the number of entries attended (the filled cache), never max_seq_length; blockwise sources also
// decode each entry twice and hold one decoded block [B, G, block, head_size] at a time.
#ifndef LGPT_CORE_OPS_ATTENTION_H_
#define LGPT_CORE_OPS_ATTENTION_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "core/ops/attention_mask.h"

namespace lgpt {

// q [B, n_head, T, hs]; keys, values [B, G, S, hs]; query_positions [B, T];
// key_positions [B, 1 or G, S] (negative: empty slot).
// Returns [B, n_head, T, hs]. If `weights_out` is given, it receives the attention weights
// [B, n_head, T, S] (float32).
at::Tensor AttendByPositions(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                             const at::Tensor& query_positions, const at::Tensor& key_positions,
                             const AttentionParams& params, at::Tensor* weights_out = nullptr);

// A run of entries the attention reads in order.
struct KVBlockSource {
  int64_t size = 0;        // entries S_i
  int64_t read_chunk = 0;  // entries decoded per read; 0: the whole source at once
  at::Tensor positions;    // [B, 1 or G, S_i] int64 or int32, negative where empty
  // Decodes entries [begin, begin + length) into keys and/or values [B, G, length, hs] (either
  // pointer may be null).
  std::function<void(int64_t begin, int64_t length, at::Tensor* keys, at::Tensor* values)> read;
};

// A source over plain tensors keys, values [B, G, S, hs] (read as views, no copy).
KVBlockSource TensorSource(const at::Tensor& keys, const at::Tensor& values,
                           const at::Tensor& positions);

// q [B, n_head, T, hs], query_positions [B, T]; `groups` is G, the key/value heads. Sources
// are attended in order (their entries concatenated). If `weights_out` is given it receives
// the weights [B, n_head, T, sum S_i] (float32). Returns [B, n_head, T, hs] in q's dtype.
// One source read whole multiplies the weights by the values in the values' dtype (as
// AttendByPositions and LitGPT); several reads accumulate in float32.
at::Tensor AttendBlockwise(const at::Tensor& q, int64_t groups,
                           const std::vector<KVBlockSource>& sources,
                           const at::Tensor& query_positions, const AttentionParams& params,
                           at::Tensor* weights_out = nullptr);

}  // namespace lgpt

#endif  // LGPT_CORE_OPS_ATTENTION_H_
