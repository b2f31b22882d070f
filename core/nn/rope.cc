#include "core/nn/rope.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "core/ops/gemv.h"

namespace lgpt {
namespace {

// YaRN's attention magnitude correction.
double YarnMscale(double scale, double mscale) {
  if (scale <= 1) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

at::Tensor BaseTheta(double base, int64_t n_elem, const at::TensorOptions& f32) {
  const at::Tensor exponent = at::arange(0, n_elem, 2, f32) / static_cast<double>(n_elem);
  return at::reciprocal(at::pow(base, exponent));
}

// Float32 CPU rotations run as host loops over the heads of each token: one pass instead of
// about ten LibTorch operations (narrows, a negation, a concatenation, products and a sum, each
// a pass over the tensor). Any number of steps: decoding rotates a few positions a step,
// prefill chunks hundreds (their tokens split over the row pool's threads).
bool HostRopeApplies(const at::Tensor& x, const RopeTables& tables, bool interleave) {
  if (interleave || x.dim() != 4 || !x.device().is_cpu()) return false;
  if (x.scalar_type() != at::kFloat || tables.cos.scalar_type() != at::kFloat) return false;
  if (!tables.cos.device().is_cpu() || tables.cos.dim() != 3 || tables.sin.dim() != 3) {
    return false;
  }
  if (tables.cos.size(0) != x.size(0) || tables.cos.size(1) != x.size(2)) return false;
  return !c10::GradMode::is_enabled() || !x.requires_grad();
}

// One head's row: o = x·cos + rotate_half(x)·sin over the first n_elem features, the rest
// copied (rotate_half(x) = [-x[half:], x[:half]], products and sum in float32 as LibTorch's
// operations round them). x may be strided (xs); every rotation path shares this loop, so they
// give the same bits as each other.
inline void RopeRow(const float* xv, int64_t xs, const float* c, const float* s, int64_t n_elem,
                    int64_t hs, float* o) {
  const int64_t half = n_elem / 2, first = n_elem - half;
  if (xs == 1) {  // contiguous heads: branch-free loops the compiler vectorises
    for (int64_t i = 0; i < first; ++i) o[i] = xv[i] * c[i] + (-xv[i + half]) * s[i];
    for (int64_t i = first; i < n_elem; ++i) o[i] = xv[i] * c[i] + xv[i - first] * s[i];
    for (int64_t i = n_elem; i < hs; ++i) o[i] = xv[i];
    return;
  }
  for (int64_t i = 0; i < n_elem; ++i) {
    const float rotated = i < first ? -xv[(i + half) * xs] : xv[(i - first) * xs];
    o[i] = xv[i * xs] * c[i] + rotated * s[i];
  }
  for (int64_t i = n_elem; i < hs; ++i) o[i] = xv[i * xs];
}

// Tokens per thread below which one thread rotates them all (a fork costs more than ~16 tokens
// of a 4k-wide model).
constexpr int64_t kMinTokensPerThread = 16;

// fn(token) for token < tokens, over the row pool's threads when there are enough.
void ForTokens(int64_t tokens, const std::function<void(int64_t)>& fn) {
  ParallelForRows(tokens, 1, kMinTokensPerThread, [&](int64_t begin, int64_t end) {
    for (int64_t token = begin; token < end; ++token) fn(token);
  });
}

at::Tensor HostRope(const at::Tensor& x, const RopeTables& tables) {
  const int64_t batch = x.size(0), heads = x.size(1), steps = x.size(2), hs = x.size(3);
  const int64_t n_elem = tables.cos.size(-1);
  const at::Tensor cos_t = tables.cos.contiguous(), sin_t = tables.sin.contiguous();
  at::Tensor y = at::empty({batch, heads, steps, hs}, x.options());
  const float* in = x.data_ptr<float>();
  const float* cos = cos_t.data_ptr<float>();
  const float* sin = sin_t.data_ptr<float>();
  float* out = y.data_ptr<float>();
  ForTokens(batch * steps, [&](int64_t token) {
    const int64_t b = token / steps, t = token % steps;
    for (int64_t h = 0; h < heads; ++h) {
      RopeRow(in + b * x.stride(0) + h * x.stride(1) + t * x.stride(2), x.stride(3),
              cos + token * n_elem, sin + token * n_elem, n_elem, hs,
              out + ((b * heads + h) * steps + t) * hs);
    }
  });
  return y;
}

}  // namespace

Rope::Rope(const Config& config, const at::Device& device)
    : n_elem_(config.rope_n_elem),
      condense_ratio_(static_cast<double>(config.rope_condense_ratio)) {
  const at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  const double base = config.rope_base;
  at::Tensor theta = BaseTheta(base, n_elem_, f32);
  if (config.rope_adjustments) {
    const RopeAdjustments& adj = *config.rope_adjustments;
    const double factor = adj.factor.value_or(1.0);
    if (adj.IsYarn()) {
      const double beta_fast = adj.beta_fast.value_or(32);
      const double beta_slow = adj.beta_slow.value_or(1);
      const double original = adj.original_max_seq_len.value_or(4096);
      const double mscale = adj.mscale.value_or(0);
      const double mscale_all_dim = adj.mscale_all_dim.value_or(0);
      if (mscale != 0 && mscale_all_dim != 0) {
        attention_scaling_ = YarnMscale(factor, mscale) / YarnMscale(factor, mscale_all_dim);
      } else if (mscale_all_dim != 0) {
        attention_scaling_ = YarnMscale(factor, mscale_all_dim);
      } else if (mscale != 0) {
        attention_scaling_ = YarnMscale(factor, mscale);
      }
      const at::Tensor pos_freqs =
          at::pow(base, at::arange(0, n_elem_, 2, f32) / static_cast<double>(n_elem_));
      const at::Tensor extrapolation = at::reciprocal(pos_freqs);
      const at::Tensor interpolation = at::reciprocal(pos_freqs * factor);
      auto correction_dim = [&](double rotations) {
        return (n_elem_ * std::log(original / (rotations * 2 * M_PI))) / (2 * std::log(base));
      };
      double low = correction_dim(beta_fast);
      double high = correction_dim(beta_slow);
      if (adj.truncate.value_or(true)) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(n_elem_ / 2 - 1));
      if (low == high) high += 0.001;  // Avoids a zero-width ramp.
      const at::Tensor ramp =
          at::clamp((at::arange(n_elem_ / 2, f32) - low) / (high - low), 0.0, 1.0);
      theta = interpolation * (1 - ramp) + extrapolation * ramp;
    } else if (adj.original_max_seq_len) {
      const double low_freq_factor = adj.low_freq_factor.value_or(1);
      const double high_freq_factor = adj.high_freq_factor.value_or(4);
      const at::Tensor wavelen = (2 * M_PI) / theta;
      const at::Tensor ratio = *adj.original_max_seq_len / wavelen;
      const at::Tensor smooth =
          at::clamp((ratio - low_freq_factor) / (high_freq_factor - low_freq_factor), 0.0, 1.0);
      theta = (1 - smooth) * (theta / factor) + smooth * theta;
    } else if (adj.factor) {
      theta = theta / factor;
    }
  }
  theta_ = theta;
  if (config.rope_local_base_freq) {
    local_theta_ = BaseTheta(*config.rope_local_base_freq, n_elem_, f32);
  }
}

RopeTables Rope::RotationTables(const at::Tensor& shift, bool local) const {
  const at::Tensor& theta = local ? local_theta_ : theta_;
  const at::Tensor seq = shift.to(theta.device(), at::kFloat) / condense_ratio_;
  at::Tensor angles = seq.unsqueeze(-1) * theta;  // [B, T, ceil(n_elem / 2)]
  angles = at::cat({angles, angles}, -1);
  if (angles.size(-1) > n_elem_ && n_elem_ > 1) angles = angles.narrow(-1, 0, n_elem_);
  return RopeTables{at::cos(angles), at::sin(angles)};
}

RopeTables Rope::Tables(const at::Tensor& positions, bool local) const {
  RopeTables tables = RotationTables(positions, local);
  if (attention_scaling_ != 1.0) {
    tables.cos = tables.cos * attention_scaling_;
    tables.sin = tables.sin * attention_scaling_;
  }
  return tables;
}

at::Tensor ApplyRope(const at::Tensor& x, const RopeTables& tables, bool interleave) {
  const int64_t n_elem = tables.cos.size(-1);
  if (n_elem == 0) return x;
  if (HostRopeApplies(x, tables, interleave)) return HostRope(x, tables);
  const int64_t head_size = x.size(-1);
  at::Tensor part = x.narrow(-1, 0, n_elem);
  if (interleave) {
    // Gathers even then odd features, as Hugging Face's interleaved RoPE does.
    std::vector<int64_t> shape = part.sizes().vec();
    shape.back() = n_elem / 2;
    shape.push_back(2);
    part = part.reshape(shape).transpose(-1, -2).reshape(part.sizes());
  }
  const int64_t half = n_elem / 2;
  const at::Tensor rotated = at::cat({-part.narrow(-1, half, n_elem - half), part.narrow(-1, 0, half)}, -1);
  const at::Tensor cos = tables.cos.unsqueeze(1);  // [B, 1, T, n_elem]
  const at::Tensor sin = tables.sin.unsqueeze(1);
  const at::Tensor roped = (part * cos + rotated * sin).to(x.scalar_type());
  if (n_elem == head_size) return roped;
  return at::cat({roped, x.narrow(-1, n_elem, head_size - n_elem)}, -1);
}

bool SplitQkvRope(const at::Tensor& qkv, int64_t n_head, int64_t n_query_groups,
                  int64_t head_size, const RopeTables& tables, bool interleave, at::Tensor* q,
                  at::Tensor* k, at::Tensor* v) {
  const int64_t q_size = n_head * head_size, kv_size = n_query_groups * head_size;
  if (qkv.dim() != 3 || !qkv.device().is_cpu() || qkv.scalar_type() != at::kFloat ||
      !qkv.is_contiguous() || qkv.size(-1) != q_size + 2 * kv_size) {
    return false;
  }
  const int64_t batch = qkv.size(0), steps = qkv.size(1);
  const int64_t n_elem = tables.cos.defined() ? tables.cos.size(-1) : 0;
  // [B, T, q_size + 2 · kv_size] viewed as heads: the view HostRope would get, so the
  // conditions (and the values) are ApplyRope's.
  if (n_elem > 0 && !HostRopeApplies(qkv.view({batch, steps, -1, head_size}).transpose(1, 2),
                                     tables, interleave)) {
    return false;
  }
  if (c10::GradMode::is_enabled() && qkv.requires_grad()) return false;
  *q = at::empty({batch, n_head, steps, head_size}, qkv.options());
  *k = at::empty({batch, n_query_groups, steps, head_size}, qkv.options());
  *v = at::empty({batch, n_query_groups, steps, head_size}, qkv.options());
  const at::Tensor cos_t = n_elem > 0 ? tables.cos.contiguous() : at::Tensor();
  const at::Tensor sin_t = n_elem > 0 ? tables.sin.contiguous() : at::Tensor();
  const float* cos = n_elem > 0 ? cos_t.data_ptr<float>() : nullptr;
  const float* sin = n_elem > 0 ? sin_t.data_ptr<float>() : nullptr;
  const float* in = qkv.data_ptr<float>();
  float* q_out = q->data_ptr<float>();
  float* k_out = k->data_ptr<float>();
  float* v_out = v->data_ptr<float>();
  const int64_t row = q_size + 2 * kv_size;
  ForTokens(batch * steps, [&](int64_t token) {
    const int64_t b = token / steps, t = token % steps;
    const float* x = in + token * row;
    const float* c = cos ? cos + token * n_elem : nullptr;
    const float* s = sin ? sin + token * n_elem : nullptr;
    for (int64_t h = 0; h < n_head; ++h) {
      RopeRow(x + h * head_size, 1, c, s, n_elem, head_size,
              q_out + ((b * n_head + h) * steps + t) * head_size);
    }
    for (int64_t g = 0; g < n_query_groups; ++g) {
      const int64_t out = ((b * n_query_groups + g) * steps + t) * head_size;
      RopeRow(x + q_size + g * head_size, 1, c, s, n_elem, head_size, k_out + out);
      std::memcpy(v_out + out, x + q_size + kv_size + g * head_size, head_size * sizeof(float));
    }
  });
  return true;
}

}  // namespace lgpt
