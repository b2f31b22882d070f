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

// The key positions of one (batch row, key group) as the CPU kernels read them: entry e at
// data[e * stride], int64 or int32 (the policy caches store int32 to save index bytes; a
// branch per read, well predicted, instead of a copy of the positions per step).
class KeyPositionRun {
 public:
  KeyPositionRun() = default;
  KeyPositionRun(const int64_t* data, int64_t stride) : wide_(data), stride_(stride) {}
  KeyPositionRun(const int32_t* data, int64_t stride) : narrow_(data), stride_(stride) {}

  // key_positions [B, 1 or G, S] int64 or int32 on the CPU: the run of (b, g).
  static KeyPositionRun Of(const at::Tensor& key_positions, int64_t b, int64_t g);
  // Whether Of accepts `key_positions`.
  static bool Readable(const at::Tensor& key_positions);

  int64_t operator[](int64_t e) const {
    return wide_ != nullptr ? wide_[e * stride_] : narrow_[e * stride_];
  }
  // The run from entry n on.
  KeyPositionRun Skip(int64_t n) const {
    return wide_ != nullptr ? KeyPositionRun(wide_ + n * stride_, stride_)
                            : KeyPositionRun(narrow_ + n * stride_, stride_);
  }

 private:
  const int64_t* wide_ = nullptr;
  const int32_t* narrow_ = nullptr;
  int64_t stride_ = 1;
};

// query_positions [B, T], key_positions [B, g, S] (g = 1 or G) -> bool [B, g, T, S].
at::Tensor AttentionMask(const at::Tensor& query_positions, const at::Tensor& key_positions,
                         int64_t sliding_window);

}  // namespace lgpt

#endif  // LGPT_CORE_OPS_ATTENTION_MASK_H_
