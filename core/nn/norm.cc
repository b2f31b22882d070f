#include "core/nn/norm.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>

#include "core/ops/gemv.h"

namespace lgpt {
namespace {

// Float32 CPU rows are normalised by a host loop, one row at a time: one pass instead of seven
// LibTorch operations, and a row's bits do not depend on how many rows share the call (a
// decoding row of a prefill pass equals its own step). Rows split over the row pool's threads
// when there are many (prefill chunks).
bool HostRmsNormApplies(const at::Tensor& x, const at::Tensor& weight, int64_t size) {
  if (!x.device().is_cpu() || x.scalar_type() != at::kFloat || !x.is_contiguous()) return false;
  if (x.numel() == 0 || x.size(-1) != size) return false;
  if (weight.defined() && (weight.scalar_type() != at::kFloat || !weight.is_contiguous())) {
    return false;
  }
  return !c10::GradMode::is_enabled() ||
         !(x.requires_grad() || (weight.defined() && weight.requires_grad()));
}

// One row: yr = xr / rms(xr) · (w + offset). Shared by both host paths so they agree bitwise.
inline void RmsNormRow(const float* xr, const float* w, float offset, double eps, int64_t size,
                       float* yr) {
  float partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < size; ++i) partial[i & 7] += xr[i] * xr[i];
  const float sum = ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
                    ((partial[4] + partial[5]) + (partial[6] + partial[7]));
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(size) + static_cast<float>(eps));
  for (int64_t i = 0; i < size; ++i) yr[i] = xr[i] * inv * (w ? w[i] + offset : 1.0f);
}

// Rows per thread below which one thread normalises them all (a decoding step's few rows).
constexpr int64_t kMinRowsPerThread = 16;

at::Tensor HostRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps,
                       bool unit_offset) {
  const int64_t size = x.size(-1), rows = x.numel() / size;
  at::Tensor y = at::empty_like(x);
  const float* in = x.data_ptr<float>();
  const float* w = weight.defined() ? weight.data_ptr<float>() : nullptr;
  float* out = y.data_ptr<float>();
  ParallelForRows(rows, 1, kMinRowsPerThread, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      RmsNormRow(in + r * size, w, unit_offset ? 1.0f : 0.0f, eps, size, out + r * size);
    }
  });
  return y;
}

}  // namespace

NormOptions NormOptions::FromConfig(const Config& config, int64_t size) {
  NormOptions options;
  options.kind = config.norm_class;
  options.size = size;
  options.eps = config.norm_eps;
  options.unit_offset = config.NormUnitOffset();
  options.affine = config.NormHasAffine();
  return options;
}

NormImpl::NormImpl(const NormOptions& options) : options_(options) {
  TORCH_CHECK(!options_.shards || options_.kind == NormClass::kRMSNorm,
              "only an RMSNorm's features may be split over ranks");
  if (!options_.affine) return;
  // Gemma's weights are stored as offsets from 1, so they start at zero.
  weight_ = register_parameter(
      "weight", options_.unit_offset ? at::zeros({options_.size}) : at::ones({options_.size}));
  if (options_.kind == NormClass::kLayerNorm) {
    bias_ = register_parameter("bias", at::zeros({options_.size}));
  }
}

at::Tensor NormImpl::forward(const at::Tensor& x) {
  if (options_.kind == NormClass::kLayerNorm) {
    return at::layer_norm(x, {options_.size}, weight_, bias_, options_.eps);
  }
  if (!options_.shards && HostRmsNormApplies(x, weight_, options_.size)) {
    return HostRmsNorm(x, weight_, options_.eps, options_.unit_offset);
  }
  const at::ScalarType dtype = x.scalar_type();
  const at::Tensor x32 = x.to(at::kFloat);
  at::Tensor mean_square;  // [..., 1]
  if (options_.shards) {
    mean_square = (x32 * x32).sum(-1, /*keepdim=*/true);
    options_.shards->SumOverRanks(mean_square);
    mean_square = mean_square / static_cast<double>(options_.shards->total_size());
  } else {
    mean_square = (x32 * x32).mean(-1, /*keepdim=*/true);
  }
  at::Tensor normed = x32 * at::rsqrt(mean_square + options_.eps);
  if (weight_.defined()) {
    const at::Tensor scale = options_.unit_offset ? (weight_ + 1) : weight_;
    normed = normed * scale.to(at::kFloat);
  }
  return normed.to(dtype);
}

at::Tensor NormImpl::AddForward(const at::Tensor& x, const at::Tensor& delta, at::Tensor* sum) {
  const bool fused = options_.kind == NormClass::kRMSNorm && !options_.shards &&
                     delta.sizes() == x.sizes() && delta.scalar_type() == at::kFloat &&
                     delta.is_contiguous() && delta.device().is_cpu() &&
                     HostRmsNormApplies(x, weight_, options_.size) &&
                     !(c10::GradMode::is_enabled() && delta.requires_grad());
  if (!fused) {
    *sum = x + delta;
    return forward(*sum);
  }
  // One pass: the sum is written where the norm reads it back, still in cache.
  const int64_t size = options_.size, rows = x.numel() / size;
  *sum = at::empty_like(x);
  at::Tensor y = at::empty_like(x);
  const float* a = x.data_ptr<float>();
  const float* b = delta.data_ptr<float>();
  const float* w = weight_.defined() ? weight_.data_ptr<float>() : nullptr;
  float* s = sum->data_ptr<float>();
  float* out = y.data_ptr<float>();
  ParallelForRows(rows, 1, kMinRowsPerThread, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* sr = s + r * size;
      for (int64_t i = 0; i < size; ++i) sr[i] = a[r * size + i] + b[r * size + i];
      RmsNormRow(sr, w, options_.unit_offset ? 1.0f : 0.0f, options_.eps, size, out + r * size);
    }
  });
  return y;
}

}  // namespace lgpt
