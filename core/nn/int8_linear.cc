#include "core/nn/int8_linear.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/gemv.h"

namespace lgpt {

Int8ProjectionImpl::Int8ProjectionImpl(const LinearSpec& spec, const Int8Options& options)
    : DenseProjectionImpl(spec), options_(options) {}

absl::Status Int8ProjectionImpl::Quantize() {
  if (quantized()) return absl::OkStatus();
  const int64_t k = weight.size(1);
  const int64_t group = options_.group_size > 0 ? options_.group_size : k;
  if (k % group != 0 || (group != k && group % 8 != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("int8 group size ", options_.group_size,
                                                   " must divide in_features ", k,
                                                   " and be a multiple of 8"));
  }
  quantized_ = QuantizeInt8(weight, options_.group_size);
  // Frees the float weight; the parameter stays registered (empty) so the module's
  // structure does not change.
  at::NoGradGuard no_grad;
  weight.set_data(at::empty({0}, weight.options()));
  return absl::OkStatus();
}

at::Tensor Int8ProjectionImpl::forward(const at::Tensor& x) {
  if (!quantized()) return DenseProjectionImpl::forward(x);
  const int64_t k = quantized_.values.size(1), n_out = quantized_.values.size(0);
  const bool gemv = x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() >= 1 &&
                    x.size(-1) == k && x.numel() > 0 && x.numel() / k <= kGemvMaxRows &&
                    (!bias.defined() || bias.scalar_type() == at::kFloat) &&
                    !(c10::GradMode::is_enabled() && x.requires_grad());
  if (!gemv) {
    // Larger inputs (prefill): dequantise and multiply; the weight is rebuilt per call,
    // which costs about what reading it once costs.
    return at::linear(x, DequantizeInt8(quantized_).to(x.device(), x.scalar_type()),
                      bias.defined() ? bias.to(x.scalar_type()) : bias);
  }
  const at::Tensor xc = x.contiguous();
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = n_out;
  at::Tensor y = at::empty(shape, x.options());
  const at::Tensor b = bias.defined() ? bias.contiguous() : bias;
  Int8Gemv(quantized_, b.defined() ? b.data_ptr<float>() : nullptr, xc.data_ptr<float>(),
           y.data_ptr<float>(), xc.numel() / k, CpuHasAvx2Fma());
  return y;
}

ProjectionPtr Int8LinearFactory::Make(const LinearSpec& spec) const {
  if (spec.site == LinearSite::kHead && !options_.quantize_head) {
    return LinearFactory::Make(spec);
  }
  return std::make_shared<Int8ProjectionImpl>(spec, options_);
}

}  // namespace lgpt
