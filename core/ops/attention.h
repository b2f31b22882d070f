// Scaled dot-product attention over the keys a step actually attends to, with the mask
// built from token positions (LibTorch 1.13 has no fused attention).
//
// Grouped queries are computed without repeating keys: the q_per_kv query heads of a group
// are folded into the query axis, so keys and values are read once per group.
// Cost per call: O(B · n_head · T · S · head_size) multiply-adds and a [B, ·, T, S] mask,
// where S is the number of entries attended (the filled cache), never max_seq_length.
#ifndef LGPT_CORE_OPS_ATTENTION_H_
#define LGPT_CORE_OPS_ATTENTION_H_

#include <optional>

#include <ATen/core/Tensor.h>

namespace lgpt {

struct AttentionParams {
  double scale = 1.0;                // multiplies q·k
  std::optional<double> softcap;     // tanh soft-capping of the scores (Gemma 2)
  int64_t sliding_window = 0;        // 0: global; w: key positions q-w+1 .. q
};

// q [B, n_head, T, hs]; keys, values [B, G, S, hs]; query_positions [B, T];
// key_positions [B, 1 or G, S] (negative: empty slot).
// Returns [B, n_head, T, hs]. If `weights_out` is given, it receives the attention weights
// [B, n_head, T, S] (float32).
at::Tensor AttendByPositions(const at::Tensor& q, const at::Tensor& keys,
                             const at::Tensor& values, const at::Tensor& query_positions,
                             const at::Tensor& key_positions, const AttentionParams& params,
                             at::Tensor* weights_out = nullptr);

// Mask of allowed (query, key) pairs: key_position >= 0, <= query position and, with a
// window, > query position - window. Returns bool [B, 1 or G, T, S].
at::Tensor AttentionMask(const at::Tensor& query_positions, const at::Tensor& key_positions,
                         int64_t sliding_window);

}  // namespace lgpt

#endif  // LGPT_CORE_OPS_ATTENTION_H_
