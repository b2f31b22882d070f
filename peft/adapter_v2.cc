#include "peft/adapter_v2.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/model/checkpoint.h"
#include "core/base/status_macros.h"
#include "peft/adapter.h"
#include "peft/peft_method.h"

namespace lgpt {

AdapterV2ProjectionImpl::AdapterV2ProjectionImpl(const LinearSpec& spec, ProjectionPtr base) {
  linear = register_module("linear", std::move(base));
  adapter_bias = register_parameter("adapter_bias", at::zeros({spec.out_features}));
  adapter_scale = register_parameter("adapter_scale", at::ones({spec.out_features}));
}

at::Tensor AdapterV2ProjectionImpl::forward(const at::Tensor& x) {
  return adapter_scale * (linear->forward(x) + adapter_bias);
}

ProjectionPtr AdapterV2LinearFactory::Make(const LinearSpec& spec) const {
  return std::make_shared<AdapterV2ProjectionImpl>(spec, base_->Make(spec));
}

absl::StatusOr<ModelParts> AdapterV2Parts(const Config& config, bool legacy_qkv_split) {
  ASSIGN_OR_RETURN(ModelParts parts, AdapterParts(config, legacy_qkv_split));
  parts.linear_factory = std::make_shared<AdapterV2LinearFactory>();
  return parts;
}

absl::StatusOr<GPT> CreateAdapterV2GPT(const Config& config, bool legacy_qkv_split) {
  ASSIGN_OR_RETURN(ModelParts parts, AdapterV2Parts(config, legacy_qkv_split));
  return GPTImpl::Create(config, parts);
}

absl::StatusOr<TensorMap> FoldedAdapterV2StateDict(GPTImpl& model) {
  at::NoGradGuard no_grad;
  TensorMap folded = UnwrapToBaseStateDict(StateDict(model));
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto v2 = std::dynamic_pointer_cast<AdapterV2ProjectionImpl>(item.value());
    if (!v2) continue;
    const at::Tensor scale = v2->adapter_scale.detach();
    folded[item.key() + ".weight"] = v2->linear->DenseWeight() * scale.unsqueeze(1);
    const at::Tensor bias = v2->adapter_bias.detach();
    const at::Tensor base_bias = v2->linear->DenseBias();
    if (base_bias.defined()) {
      folded[item.key() + ".bias"] = scale * (bias + base_bias);
    } else if (bias.abs().max().item<double>() != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          item.key(), " has a non-zero adapter_bias but the base model has no bias there"));
    }
  }
  for (auto& [name, tensor] : folded) tensor = tensor.detach().clone();
  return folded;
}

}  // namespace lgpt
