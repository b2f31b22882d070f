#include "peft/peft_method.h"

#include <initializer_list>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace lgpt {
namespace {

bool ContainsAny(absl::string_view name, std::initializer_list<absl::string_view> parts) {
  for (absl::string_view part : parts) {
    if (absl::StrContains(name, part)) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<PeftMethod> ParsePeftMethod(absl::string_view name) {
  if (name == "lora") return PeftMethod::kLora;
  if (name == "adapter") return PeftMethod::kAdapter;
  if (name == "adapter_v2") return PeftMethod::kAdapterV2;
  if (name == "full") return PeftMethod::kFull;
  return absl::InvalidArgumentError(absl::StrCat("unknown fine-tuning method '", name,
                                                 "' (expected lora, adapter, adapter_v2 or full)"));
}

absl::string_view PeftMethodName(PeftMethod method) {
  switch (method) {
    case PeftMethod::kLora:
      return "lora";
    case PeftMethod::kAdapter:
      return "adapter";
    case PeftMethod::kAdapterV2:
      return "adapter_v2";
    case PeftMethod::kFull:
      return "full";
  }
  return "";
}

bool IsTrainedParameter(PeftMethod method, absl::string_view name) {
  switch (method) {
    case PeftMethod::kLora:
      return ContainsAny(name, {"lora_"});
    case PeftMethod::kAdapter:
      return ContainsAny(name, {"adapter_wte", "gating_factor"});
    case PeftMethod::kAdapterV2:
      return ContainsAny(name, {"adapter_wte", "gating_factor", "adapter_scale", "adapter_bias",
                                "norm_1", "norm_2", "ln_f"});
    case PeftMethod::kFull:
      return true;
  }
  return false;
}

void MarkTrainable(GPTImpl& model, PeftMethod method) {
  for (auto& item : model.named_parameters()) {
    item.value().set_requires_grad(IsTrainedParameter(method, item.key()));
  }
}

bool IsPeftOnlyParameter(absl::string_view name) {
  return ContainsAny(name, {"lora_", "adapter_wte", "gating_factor", "adapter_bias",
                            "adapter_scale"});
}

std::string BaseParameterName(absl::string_view name) {
  // Stacked decorators nest `linear` (`qkv.linear.linear.weight`); one StrReplaceAll pass
  // leaves every second of two adjacent occurrences, so unwrap until none is left.
  std::string base(name);
  while (absl::StrContains(base, ".linear.")) {
    base = absl::StrReplaceAll(base, {{".linear.", "."}});
  }
  while (absl::StartsWith(base, "linear.")) base = base.substr(7);
  return base;
}

TensorMap UnwrapToBaseStateDict(const TensorMap& state) {
  TensorMap base;
  for (const auto& [name, tensor] : state) {
    if (!IsPeftOnlyParameter(name)) base[BaseParameterName(name)] = tensor;
  }
  return base;
}

}  // namespace lgpt
