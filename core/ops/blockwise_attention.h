// Attention over KV entries read block by block from their storage (quantised or not), for
// caches that attend in place: no full-precision copy of a layer's entries is ever made.
//
// The result equals the position-masked attention of core/ops/attention.h over the
// same entries: scores q·k · scale (then tanh soft-capping), a mask from positions (key
// position >= 0, <= the query's, and > query - window), softmax in float32 over every entry,
// then the weighted sum of values. Two passes: the first decodes each block's keys and fills
// its columns of the scores; the second decodes each block's values and accumulates weights ·
// values in float32.
// Transient memory per call: the scores/weights [B, n_head, T, S] float32 (as the plain kernel
// holds), the mask, and one decoded block [B, G, block, head_size] at a time.
// Cost: O(B · n_head · T · S · head_size) multiply-adds plus decoding each stored entry twice.
#ifndef LGPT_CORE_OPS_BLOCKWISE_ATTENTION_H_
#define LGPT_CORE_OPS_BLOCKWISE_ATTENTION_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "core/ops/attention.h"

namespace lgpt {

// A run of entries the attention reads in order.
struct KVBlockSource {
  int64_t size = 0;        // entries S_i
  int64_t block_size = 0;  // entries decoded per read; 0: the whole source at once
  at::Tensor positions;    // [B, 1 or G, S_i] int64, negative where empty
  // Decodes entries [begin, begin + length) into keys and/or values [B, G, length, hs] (either
  // pointer may be null).
  std::function<void(int64_t begin, int64_t length, at::Tensor* keys, at::Tensor* values)> read;
};

// q [B, n_head, T, hs], query_positions [B, T]; `groups` is G, the key/value heads. Sources
// are attended in order (their entries concatenated). If `weights_out` is given it receives
// the weights [B, n_head, T, sum S_i] (float32). Returns [B, n_head, T, hs] in q's dtype.
at::Tensor BlockwiseAttention(const at::Tensor& q, int64_t groups,
                              const std::vector<KVBlockSource>& sources,
                              const at::Tensor& query_positions, const AttentionParams& params,
                              at::Tensor* weights_out = nullptr);

// A source over plain tensors keys, values [B, G, S, hs] (read as views, no copy).
KVBlockSource TensorSource(const at::Tensor& keys, const at::Tensor& values,
                           const at::Tensor& positions);

}  // namespace lgpt

#endif  // LGPT_CORE_OPS_BLOCKWISE_ATTENTION_H_
