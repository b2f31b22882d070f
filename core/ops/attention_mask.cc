#include "core/ops/attention_mask.h"

#include <ATen/ATen.h>

namespace lgpt {

bool KeyPositionRun::Readable(const at::Tensor& key_positions) {
  return key_positions.device().is_cpu() && key_positions.dim() == 3 &&
         (key_positions.scalar_type() == at::kLong || key_positions.scalar_type() == at::kInt);
}

KeyPositionRun KeyPositionRun::Of(const at::Tensor& key_positions, int64_t b, int64_t g) {
  const int64_t offset = b * key_positions.stride(0) +
                         (key_positions.size(1) == 1 ? 0 : g * key_positions.stride(1));
  const int64_t stride = key_positions.stride(2);
  if (key_positions.scalar_type() == at::kInt) {
    return KeyPositionRun(key_positions.data_ptr<int32_t>() + offset, stride);
  }
  return KeyPositionRun(key_positions.data_ptr<int64_t>() + offset, stride);
}

at::Tensor AttentionMask(const at::Tensor& query_positions, const at::Tensor& key_positions,
                         int64_t sliding_window) {
  const at::Tensor q = query_positions.unsqueeze(1).unsqueeze(-1);  // [B, 1, T, 1]
  const at::Tensor k = key_positions.unsqueeze(2);                  // [B, g, 1, S]
  at::Tensor allowed = at::logical_and(k >= 0, k <= q);             // broadcasts to [B, g, T, S]
  if (sliding_window > 0) allowed.logical_and_(k > q - sliding_window);
  return allowed;
}

}  // namespace lgpt
