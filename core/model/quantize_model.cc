#include "core/model/quantize_model.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace lgpt {

ModelParts Int8ModelParts(const Int8Options& options) {
  ModelParts parts;
  parts.linear_factory = std::make_shared<Int8LinearFactory>(options);
  return parts;
}

absl::Status QuantizeModelInt8(GPTImpl& model) {
  if (!model.device().is_cpu() || model.dtype() != c10::kFloat) {
    return absl::FailedPreconditionError(
        "int8 quantisation needs a float32 model on the CPU");
  }
  int quantized = 0;
  for (const std::shared_ptr<torch::nn::Module>& module : model.modules()) {
    auto* projection = dynamic_cast<Int8ProjectionImpl*>(module.get());
    if (projection == nullptr) continue;
    RETURN_IF_ERROR(projection->Quantize());
    ++quantized;
  }
  if (quantized == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(model.config().name,
                     ": no quantisable projections; build the model with Int8ModelParts()"));
  }
  return absl::OkStatus();
}

int64_t ModelWeightBytes(GPTImpl& model) {
  int64_t bytes = 0;
  for (const at::Tensor& p : model.parameters()) {
    bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  for (const std::shared_ptr<torch::nn::Module>& module : model.modules()) {
    auto* projection = dynamic_cast<Int8ProjectionImpl*>(module.get());
    if (projection == nullptr || !projection->quantized()) continue;
    const Int8Weight& weight = projection->int8_weight();
    bytes += weight.values.numel() + weight.scales.numel() * 4;
  }
  return bytes;
}

}  // namespace lgpt
