#include "core/ops/blockwise_attention.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>

namespace lgpt {

KVBlockSource TensorSource(const at::Tensor& keys, const at::Tensor& values,
                           const at::Tensor& positions) {
  KVBlockSource source;
  source.size = keys.size(2);
  source.positions = positions;
  source.read = [keys, values](int64_t begin, int64_t length, at::Tensor* k, at::Tensor* v) {
    if (k != nullptr) *k = keys.narrow(2, begin, length);
    if (v != nullptr) *v = values.narrow(2, begin, length);
  };
  return source;
}

at::Tensor BlockwiseAttention(const at::Tensor& q, int64_t groups,
                              const std::vector<KVBlockSource>& sources,
                              const at::Tensor& query_positions, const AttentionParams& params,
                              at::Tensor* weights_out) {
  const int64_t batch = q.size(0), n_head = q.size(1), steps = q.size(2), head_size = q.size(3);
  const int64_t q_per_kv = n_head / groups;
  int64_t total = 0;
  bool grouped_positions = false;
  for (const KVBlockSource& source : sources) {
    total += source.size;
    grouped_positions = grouped_positions || source.positions.size(1) != 1;
  }
  // Query head h uses key group h / q_per_kv, as in the plain kernel.
  const at::Tensor q_grouped = q.reshape({batch, groups, q_per_kv * steps, head_size});
  at::Tensor scores =
      at::empty({batch, groups, q_per_kv, steps, total}, q.options().dtype(at::kFloat));
  std::vector<at::Tensor> positions;
  int64_t offset = 0;
  for (const KVBlockSource& source : sources) {
    const int64_t block_size = source.block_size > 0 ? source.block_size : source.size;
    for (int64_t begin = 0; begin < source.size; begin += block_size) {
      const int64_t length = std::min(block_size, source.size - begin);
      at::Tensor keys;
      source.read(begin, length, &keys, nullptr);
      const at::Tensor block = at::matmul(q_grouped, keys.transpose(-1, -2));  // [B, G, q·T, n]
      scores.narrow(-1, offset + begin, length)
          .copy_(block.view({batch, groups, q_per_kv, steps, length}));
    }
    positions.push_back(grouped_positions ? source.positions.expand({batch, groups, source.size})
                                          : source.positions);
    offset += source.size;
  }
  scores.mul_(params.scale);
  if (params.softcap) scores = at::tanh(scores / *params.softcap) * *params.softcap;
  const at::Tensor key_positions = positions.size() == 1 ? positions[0] : at::cat(positions, -1);
  const at::Tensor allowed =
      AttentionMask(query_positions, key_positions, params.sliding_window).unsqueeze(2);
  // The lowest finite value, as the plain kernel: a query with no allowed key gets uniform
  // weights rather than NaN.
  scores.masked_fill_(allowed.logical_not(), std::numeric_limits<float>::lowest());
  const at::Tensor weights = at::softmax(scores, -1, at::kFloat);  // [B, G, q, T, S]
  if (weights_out != nullptr) *weights_out = weights.view({batch, n_head, steps, total});
  const at::Tensor flat = weights.view({batch, groups, q_per_kv * steps, total});

  at::Tensor y;
  offset = 0;
  for (const KVBlockSource& source : sources) {
    const int64_t block_size = source.block_size > 0 ? source.block_size : source.size;
    for (int64_t begin = 0; begin < source.size; begin += block_size) {
      const int64_t length = std::min(block_size, source.size - begin);
      at::Tensor values;
      source.read(begin, length, nullptr, &values);
      const at::Tensor part =
          at::matmul(flat.narrow(-1, offset + begin, length), values.to(at::kFloat));
      if (y.defined()) {
        y.add_(part);
      } else {
        y = part;
      }
    }
    offset += source.size;
  }
  if (!y.defined()) y = at::zeros({batch, groups, q_per_kv * steps, head_size}, scores.options());
  return y.to(q.scalar_type()).view({batch, n_head, steps, head_size});
}

}  // namespace lgpt
