// The one mask rule of every attention kernel, and the scalars of one layer's attention.
//
// A query at position q may read a key at position k when k >= 0 (negative: an empty slot),
// k <= q (causality) and, with a sliding window w > 0, k > q - w. Causality, windows, evicted
// entries and rows of different lengths sharing a cache all follow from positions alone, so a
// cache may keep any subset of entries in any slot order. KeyAllowed is the rule for one pair
// (the decode-step kernel's loop); AttentionMask applies the same rule to whole tensors.
#ifndef LGPT_CORE_OPS_ATTENTION_MASK_H_
#define LGPT_CORE_OPS_ATTENTION_MASK_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace lgpt {

struct AttentionParams {
  double scale = 1.0;             // multiplies q·k
  std::optional<double> softcap;  // tanh soft-capping of the scores (Gemma 2)
  int64_t sliding_window = 0;     // 0: global; w: key positions q-w+1 .. q
};

inline bool KeyAllowed(int64_t query_position, int64_t key_position, int64_t sliding_window) {
  return key_position >= 0 && key_position <= query_position &&
         (sliding_window <= 0 || key_position > query_position - sliding_window);
}

// query_positions [B, T], key_positions [B, g, S] (g = 1 or G) -> bool [B, g, T, S].
at::Tensor AttentionMask(const at::Tensor& query_positions, const at::Tensor& key_positions,
                         int64_t sliding_window);

}  // namespace lgpt

#endif  // LGPT_CORE_OPS_ATTENTION_MASK_H_
