#include "attention/decode_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <ATen/ATen.h>

#include "core/gemv.h"

namespace lgpt {
namespace {

constexpr int64_t kMaxSteps = 4;

bool RowsContiguous(const at::Tensor& t) {
  return t.dim() == 4 && t.stride(3) == 1 && t.stride(2) == t.size(3);
}

}  // namespace

bool DecodeAttentionApplies(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                            const at::Tensor& query_positions, const at::Tensor& key_positions) {
  for (const at::Tensor* t : {&q, &keys, &values}) {
    if (!t->device().is_cpu() || t->scalar_type() != at::kFloat || t->dim() != 4) return false;
  }
  if (!query_positions.device().is_cpu() || !key_positions.device().is_cpu() ||
      query_positions.scalar_type() != at::kLong || key_positions.scalar_type() != at::kLong ||
      key_positions.dim() != 3) {
    return false;
  }
  if (q.size(2) > kMaxSteps || keys.size(2) < 1) return false;
  if (q.requires_grad() || keys.requires_grad() || values.requires_grad()) return false;
  if (keys.size(1) < 1 || q.size(1) % keys.size(1) != 0) return false;
  return RowsContiguous(keys) && RowsContiguous(values) && keys.sizes() == values.sizes();
}

at::Tensor DecodeAttention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                           const at::Tensor& query_positions, const at::Tensor& key_positions,
                           double scale_in, std::optional<double> softcap, int64_t sliding_window) {
  const int64_t batch = q.size(0), n_head = q.size(1), steps = q.size(2), hs = q.size(3);
  const int64_t groups = keys.size(1), entries = keys.size(2);
  const int64_t q_per_kv = n_head / groups;
  const int64_t rows = q_per_kv * steps;  // queries of one group
  const at::Tensor qc = q.contiguous();
  const at::Tensor qpos = query_positions.contiguous();
  at::Tensor out = at::empty({batch, n_head, steps, hs}, q.options());
  const float* q_data = qc.data_ptr<float>();
  float* out_data = out.data_ptr<float>();
  const float* k_data = keys.data_ptr<float>();
  const float* v_data = values.data_ptr<float>();
  const int64_t* qp_data = qpos.data_ptr<int64_t>();
  const int64_t* kp_data = key_positions.data_ptr<int64_t>();
  const int64_t kp_b = key_positions.stride(0), kp_s = key_positions.stride(2);
  const int64_t kp_g = key_positions.size(1) == 1 ? 0 : key_positions.stride(1);
  const float scale = static_cast<float>(scale_in);
  const float lowest = std::numeric_limits<float>::lowest();

  // One task per (batch row, key group): its keys and values are read once for all of the
  // group's query heads and steps, as in the generic path.
  const int64_t per_task = 2 * entries * hs;
  const int64_t min_tasks = std::max<int64_t>(1, (int64_t{32} << 10) / per_task);
  ParallelForRows(batch * groups, 1, min_tasks, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(rows * entries);
    std::vector<float> acc(hs);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / groups, g = task % groups;
      const float* k = k_data + b * keys.stride(0) + g * keys.stride(1);
      const float* v = v_data + b * values.stride(0) + g * values.stride(1);
      const int64_t* kp = kp_data + b * kp_b + g * kp_g;
      // The group's queries are contiguous in q: heads g·q_per_kv .. (g+1)·q_per_kv - 1.
      const float* qg = q_data + ((b * n_head + g * q_per_kv) * steps) * hs;
      for (int64_t r = 0; r < rows; r += kGemvMaxRows) {
        const int64_t n = std::min(kGemvMaxRows, rows - r);
        GemvF32Serial(k, nullptr, qg + r * hs, scores.data() + r * entries, n, entries, hs);
      }
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = r % steps;
        const int64_t query_pos = qp_data[b * steps + t];
        float* s = scores.data() + r * entries;
        float max_score = lowest;
        for (int64_t e = 0; e < entries; ++e) {
          const int64_t key_pos = kp[e * kp_s];
          const bool allowed = key_pos >= 0 && key_pos <= query_pos &&
                               (sliding_window <= 0 || key_pos > query_pos - sliding_window);
          float x = s[e] * scale;
          if (softcap) {
            const float cap = static_cast<float>(*softcap);
            x = std::tanh(x / cap) * cap;
          }
          s[e] = allowed ? x : lowest;
          max_score = std::max(max_score, s[e]);
        }
        // Like masked_fill with the lowest finite value: a row with no allowed key gets
        // uniform weights.
        float total = 0;
        for (int64_t e = 0; e < entries; ++e) {
          s[e] = std::exp(s[e] - max_score);
          total += s[e];
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t e = 0; e < entries; ++e) {
          const float w = s[e];
          if (w == 0.0f) continue;
          const float* ve = v + e * hs;
          for (int64_t i = 0; i < hs; ++i) acc[i] += w * ve[i];
        }
        const float inv = 1.0f / total;
        float* o = out_data + ((b * n_head + g * q_per_kv) * steps + r) * hs;
        for (int64_t i = 0; i < hs; ++i) o[i] = acc[i] * inv;
      }
    }
  });
  return out;
}

}  // namespace lgpt
