// What the PEFT methods share: which parameters each trains (LitGPT's lora_filter and
// adapter_filter), and how a PEFT model's names map back to the base model's.
//
// LitGPT's PEFT projections wrap the base linear as `linear` (`transformer.h.0.attn.qkv.
// linear.weight`, `lm_head.linear.weight`), so a base checkpoint maps onto a PEFT model by
// unwrapping `.linear.`; the PEFT-only parameters (lora_A/B, adapter_wte, gating_factor,
// adapter_bias/scale) have no base counterpart.
#ifndef LGPT_PEFT_PEFT_METHOD_H_
#define LGPT_PEFT_PEFT_METHOD_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/io/tensor_map.h"
#include "core/model/gpt.h"

namespace lgpt {

enum class PeftMethod { kLora, kAdapter, kAdapterV2, kFull };

// "lora", "adapter", "adapter_v2" or "full".
absl::StatusOr<PeftMethod> ParsePeftMethod(absl::string_view name);
absl::string_view PeftMethodName(PeftMethod method);

// Whether `method` trains the parameter `name` (everything for kFull).
bool IsTrainedParameter(PeftMethod method, absl::string_view name);
// Sets requires_grad on exactly the parameters `method` trains.
void MarkTrainable(GPTImpl& model, PeftMethod method);

// Whether `name` exists only in PEFT models (no base-model counterpart).
bool IsPeftOnlyParameter(absl::string_view name);
// The base model's name of a PEFT model's parameter: every `.linear.` unwrapped (stacked
// decorators nest it: `qkv.linear.linear.weight` -> `qkv.weight`).
std::string BaseParameterName(absl::string_view name);
// A PEFT state dict in base-model names: PEFT-only parameters dropped, `.linear.` unwrapped
// (tensors shared, not copied).
TensorMap UnwrapToBaseStateDict(const TensorMap& state);

}  // namespace lgpt

#endif  // LGPT_PEFT_PEFT_METHOD_H_
