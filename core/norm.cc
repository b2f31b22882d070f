#include "core/norm.h"

#include <ATen/ATen.h>

namespace lgpt {

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
  if (!options_.affine) return;
  // Gemma's weights are stored as offsets from 1, so they start at zero.
  weight_ = register_parameter("weight", options_.unit_offset ? at::zeros({options_.size})
                                                              : at::ones({options_.size}));
  if (options_.kind == NormClass::kLayerNorm) {
    bias_ = register_parameter("bias", at::zeros({options_.size}));
  }
}

at::Tensor NormImpl::forward(const at::Tensor& x) {
  if (options_.kind == NormClass::kLayerNorm) {
    return at::layer_norm(x, {options_.size}, weight_, bias_, options_.eps);
  }
  const at::ScalarType dtype = x.scalar_type();
  const at::Tensor x32 = x.to(at::kFloat);
  const at::Tensor mean_square = (x32 * x32).mean(-1, /*keepdim=*/true);
  at::Tensor normed = x32 * at::rsqrt(mean_square + options_.eps);
  if (weight_.defined()) {
    const at::Tensor scale = options_.unit_offset ? (weight_ + 1) : weight_;
    normed = normed * scale.to(at::kFloat);
  }
  return normed.to(dtype);
}

}  // namespace lgpt
