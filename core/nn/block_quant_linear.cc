#include "core/nn/block_quant_linear.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/GradMode.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/block_quant_device.h"
#include "core/ops/gemv.h"
#include "torch/csrc/autograd/custom_function.h"

namespace lgpt {
namespace {

// y = x · dequantised(W)^T + b with autograd, saving only the quantised weight for the
// backward pass (a frozen quantised base under trained LoRA weights keeps no float copy).
class BlockQuantLinear : public torch::autograd::Function<BlockQuantLinear> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& values, const at::Tensor& scales, int64_t format,
                            int64_t out_features, const at::Tensor& bias) {
    ctx->save_for_backward({values, scales});
    ctx->saved_data["format"] = format;
    ctx->saved_data["out_features"] = out_features;
    ctx->saved_data["bias_grad"] = bias.requires_grad();
    const at::Tensor w = DequantizeBlocks(Weight(values, scales, format, out_features));  // [N, K]
    return at::linear(x, w.to(x.device(), x.scalar_type()), bias.to(x.scalar_type()));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const BlockQuantWeight weight = Weight(saved[0], saved[1], ctx->saved_data["format"].toInt(),
                                           ctx->saved_data["out_features"].toInt());
    const at::Tensor& grad_y = grads[0];  // [..., N]
    const at::Tensor grad_x =
        at::matmul(grad_y, DequantizeBlocks(weight).to(grad_y.device(), grad_y.scalar_type()));
    at::Tensor grad_bias;
    if (ctx->saved_data["bias_grad"].toBool()) {
      grad_bias = grad_y.reshape({-1, grad_y.size(-1)}).sum(0);
    }
    return {grad_x, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), grad_bias};
  }

  static BlockQuantWeight Weight(const at::Tensor& values, const at::Tensor& scales, int64_t format,
                                 int64_t out_features) {
    BlockQuantWeight w;
    w.format = static_cast<BlockFormat>(format);
    w.values = values;
    w.scales = scales;
    w.out_features = out_features;
    w.in_features = scales.size(1) * kQuantBlock;  // scales [G, K / 32, 16]
    return w;
  }
};

}  // namespace

BlockQuantProjectionImpl::BlockQuantProjectionImpl(const LinearSpec& spec,
                                                   const BlockQuantOptions& options)
    : DenseProjectionImpl(spec), spec_(spec), options_(options) {}

absl::Status BlockQuantProjectionImpl::Quantize() {
  if (quantized()) return absl::OkStatus();
  absl::StatusOr<BlockQuantWeight> q = QuantizeBlocks(weight, options_.format);
  if (!q.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(LinearSiteName(spec_.site), " of layer ",
                                                   spec_.layer, ": ", q.status().message()));
  }
  return SetQuantized(*std::move(q));
}

absl::Status BlockQuantProjectionImpl::SetQuantized(BlockQuantWeight q) {
  const std::string site = absl::StrCat(LinearSiteName(spec_.site), " of layer ", spec_.layer);
  if (q.format != options_.format) {
    return absl::InvalidArgumentError(
        absl::StrCat(site, ": weights are ", BlockFormatName(q.format), ", the model expects ",
                     BlockFormatName(options_.format)));
  }
  if (q.out_features != spec_.out_features || q.in_features != spec_.in_features) {
    return absl::InvalidArgumentError(
        absl::StrCat(site, ": quantised weight is [", q.out_features, ", ", q.in_features,
                     "], the model expects [", spec_.out_features, ", ", spec_.in_features, "]"));
  }
  absl::Status well_formed = CheckBlockQuantWeight(q);
  if (!well_formed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(site, ": ", well_formed.message()));
  }
  // The quantised weight lives where the float one did (QuantizeBlocks' result is on the CPU).
  quantized_ = BlockQuantWeightTo(q, weight.device());
  // Frees the float weight (or drops this module's hold on a memory-mapped checkpoint's
  // pages); the parameter stays registered, empty, so the module's structure is unchanged.
  at::NoGradGuard no_grad;
  weight.set_data(at::empty({0}, weight.options()));
  return absl::OkStatus();
}

at::Tensor BlockQuantProjectionImpl::forward(const at::Tensor& x) {
  if (!quantized()) return DenseProjectionImpl::forward(x);
  const int64_t k = quantized_.in_features, n_out = quantized_.out_features;
  const c10::Device device = quantized_.values.device();
  const bool inference = !(c10::GradMode::is_enabled() &&
                           (x.requires_grad() || (bias.defined() && bias.requires_grad())));
  if (inference && x.device() == device && x.dim() >= 1 && x.size(-1) == k && x.numel() > 0) {
    if (device.is_cpu() && x.scalar_type() == at::kFloat &&
        (!bias.defined() || bias.scalar_type() == at::kFloat)) {
      return CpuGemv(x);
    }
    if (device.is_cuda()) return DeviceForward(x);
  }
  // Autograd functions take defined tensors only: a projection without bias adds zeros.
  const at::Tensor b = bias.defined() ? bias : at::zeros({n_out}, x.options());
  return BlockQuantLinear::apply(x, quantized_.values, quantized_.scales,
                                 static_cast<int64_t>(quantized_.format), n_out, b);
}

at::Tensor BlockQuantProjectionImpl::CpuGemv(const at::Tensor& x) const {
  const int64_t k = quantized_.in_features;
  const at::Tensor xc = x.contiguous();  // [..., K]
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = quantized_.out_features;
  at::Tensor y = at::empty(shape, x.options());  // [..., N]
  const at::Tensor b = bias.defined() ? bias.contiguous() : bias;
  BlockQuantGemv(quantized_, b.defined() ? b.data_ptr<float>() : nullptr, xc.data_ptr<float>(),
                 y.data_ptr<float>(), xc.numel() / k);
  return y;
}

at::Tensor BlockQuantProjectionImpl::DeviceForward(const at::Tensor& x) const {
  const int64_t k = quantized_.in_features, rows = x.numel() / k;
  if (rows > kDeviceGemvMaxRows) {
    // Prefill: the weight dequantised once on the device (in x's dtype where the kernel
    // writes it), the product through cuBLAS.
    absl::StatusOr<at::Tensor> w = DequantizeBlocksTo(quantized_, x.scalar_type());  // [N, K]
    const at::Tensor weight_in_x_dtype =
        w.ok() ? *w : DequantizeBlocks(quantized_).to(x.scalar_type());
    return at::linear(x, weight_in_x_dtype, bias.defined() ? bias.to(x.scalar_type()) : bias);
  }
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = quantized_.out_features;
  const at::Tensor x32 = x.reshape({rows, k}).to(at::kFloat).contiguous();  // [rows, K]
  const at::Tensor b32 = bias.defined() ? bias.to(at::kFloat).contiguous() : bias;
  absl::StatusOr<at::Tensor> y = BlockQuantGemvByParts(quantized_, x32, b32);
  // The arguments were checked above and by SetQuantized: an error here is a bug.
  TORCH_CHECK(y.ok(), LinearSiteName(spec_.site), " of layer ", spec_.layer, ": ",
              std::string(y.status().message()));
  return y->view(shape).to(x.scalar_type());
}

void BlockQuantProjectionImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  DenseProjectionImpl::to(device, dtype, non_blocking);
  quantized_ = BlockQuantWeightTo(quantized_, device);
}

void BlockQuantProjectionImpl::to(torch::Device device, bool non_blocking) {
  DenseProjectionImpl::to(device, non_blocking);
  quantized_ = BlockQuantWeightTo(quantized_, device);
}

at::Tensor BlockQuantProjectionImpl::DenseWeight() const {
  if (!quantized()) return DenseProjectionImpl::DenseWeight();
  return DequantizeBlocks(quantized_).to(weight.scalar_type());
}

ProjectionPtr BlockQuantLinearFactory::Make(const LinearSpec& spec) const {
  if ((spec.site == LinearSite::kHead && !options_.quantize_head) ||
      spec.site == LinearSite::kMoeGate || spec.in_features % kQuantBlock != 0) {
    return LinearFactory::Make(spec);
  }
  return std::make_shared<BlockQuantProjectionImpl>(spec, options_);
}

}  // namespace lgpt
