#include "core/ops/attention.h"

#include <limits>

#include <ATen/ATen.h>

#include "core/ops/decode_attention.h"

namespace lgpt {

at::Tensor AttentionMask(const at::Tensor& query_positions, const at::Tensor& key_positions,
                         int64_t sliding_window) {
  const at::Tensor q = query_positions.unsqueeze(1).unsqueeze(-1);  // [B, 1, T, 1]
  const at::Tensor k = key_positions.unsqueeze(2);                   // [B, g, 1, S]
  at::Tensor allowed = at::logical_and(k >= 0, k <= q);  // broadcasts to [B, g, T, S]
  if (sliding_window > 0) allowed.logical_and_(k > q - sliding_window);
  return allowed;
}

at::Tensor AttendByPositions(const at::Tensor& q, const at::Tensor& keys,
                             const at::Tensor& values, const at::Tensor& query_positions,
                             const at::Tensor& key_positions, const AttentionParams& params,
                             at::Tensor* weights_out) {
  if (weights_out == nullptr &&
      DecodeAttentionApplies(q, keys, values, query_positions, key_positions)) {
    return DecodeAttention(q, keys, values, query_positions, key_positions, params.scale,
                           params.softcap, params.sliding_window);
  }
  const int64_t batch = q.size(0), n_head = q.size(1), steps = q.size(2), head_size = q.size(3);
  const int64_t groups = keys.size(1), entries = keys.size(2);
  const int64_t q_per_kv = n_head / groups;
  // Query head h uses key group h / q_per_kv (LitGPT's repeat_interleave layout).
  const at::Tensor q_grouped = q.reshape({batch, groups, q_per_kv * steps, head_size});
  at::Tensor scores = at::matmul(q_grouped, keys.transpose(-1, -2));  // [B, G, q·T, S]
  // Softmax runs in float32 whatever the model's dtype, as LitGPT's does.
  scores = scores.view({batch, groups, q_per_kv, steps, entries}).to(at::kFloat) * params.scale;
  if (params.softcap) scores = at::tanh(scores / *params.softcap) * *params.softcap;
  const at::Tensor allowed =
      AttentionMask(query_positions, key_positions, params.sliding_window).unsqueeze(2);
  // The lowest finite value instead of -inf: a row with no allowed key (a padding query)
  // yields uniform weights rather than NaN.
  scores = scores.masked_fill(allowed.logical_not(), std::numeric_limits<float>::lowest());
  at::Tensor weights = at::softmax(scores, -1, at::kFloat);
  if (weights_out != nullptr) *weights_out = weights.view({batch, n_head, steps, entries});
  weights = weights.to(q.scalar_type()).view({batch, groups, q_per_kv * steps, entries});
  const at::Tensor y = at::matmul(weights, values);  // [B, G, q·T, hs]
  return y.view({batch, n_head, steps, head_size});
}

}  // namespace lgpt
