#include "core/nn/int8_linear.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/GradMode.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/gemv.h"
#include "torch/csrc/autograd/custom_function.h"

namespace lgpt {
namespace {

// y = x · dequantised(W)^T + b with autograd, saving only the int8 weight and its scales for
// the backward pass: the float weight exists during each matmul only, never for the whole
// forward-backward of a training step (the frozen base of QLoRA-style fine-tuning).
class Int8Linear : public torch::autograd::Function<Int8Linear> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& values, const at::Tensor& scales,
                            int64_t group_size, const at::Tensor& bias) {
    ctx->save_for_backward({values, scales});
    ctx->saved_data["group_size"] = group_size;
    ctx->saved_data["bias_grad"] = bias.requires_grad();
    const Int8Weight weight{values, scales, group_size};
    return at::linear(x, DequantizeInt8(weight).to(x.device(), x.scalar_type()),
                      bias.to(x.scalar_type()));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Int8Weight weight{saved[0], saved[1], ctx->saved_data["group_size"].toInt()};
    const at::Tensor& grad_y = grads[0];  // [..., out_features]
    const at::Tensor grad_x =
        at::matmul(grad_y, DequantizeInt8(weight).to(grad_y.device(), grad_y.scalar_type()));
    at::Tensor grad_bias;
    if (ctx->saved_data["bias_grad"].toBool()) grad_bias = grad_y.reshape({-1, grad_y.size(-1)}).sum(0);
    return {grad_x, at::Tensor(), at::Tensor(), at::Tensor(), grad_bias};
  }
};

}  // namespace

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
    // Larger inputs (prefill, training): dequantise and multiply; the weight is rebuilt per
    // call, which costs about what reading it once costs.
    // Autograd functions take defined tensors only: a projection without bias adds zeros.
    const at::Tensor b = bias.defined() ? bias : at::zeros({n_out}, x.options());
    return Int8Linear::apply(x, quantized_.values, quantized_.scales, quantized_.group_size, b);
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

at::Tensor Int8ProjectionImpl::DenseWeight() const {
  if (!quantized()) return DenseProjectionImpl::DenseWeight();
  return DequantizeInt8(quantized_).to(weight.scalar_type());
}

ProjectionPtr Int8LinearFactory::Make(const LinearSpec& spec) const {
  if (spec.site == LinearSite::kHead && !options_.quantize_head) {
    return LinearFactory::Make(spec);
  }
  return std::make_shared<Int8ProjectionImpl>(spec, options_);
}

}  // namespace lgpt
