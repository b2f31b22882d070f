#include "core/ops/attention_mask.h"

#include <ATen/ATen.h>

namespace lgpt {

at::Tensor AttentionMask(const at::Tensor& query_positions, const at::Tensor& key_positions,
                         int64_t sliding_window) {
  const at::Tensor q = query_positions.unsqueeze(1).unsqueeze(-1);  // [B, 1, T, 1]
  const at::Tensor k = key_positions.unsqueeze(2);                  // [B, g, 1, S]
  at::Tensor allowed = at::logical_and(k >= 0, k <= q);             // broadcasts to [B, g, T, S]
  if (sliding_window > 0) allowed.logical_and_(k > q - sliding_window);
  return allowed;
}

}  // namespace lgpt
