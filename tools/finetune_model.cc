#include "tools/finetune_model.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/model/checkpoint.h"
#include "core/nn/int8_linear.h"
#include "peft/lora.h"

namespace lgpt {

absl::StatusOr<GPT> CreateFinetuneModel(const Config& config, PeftMethod method, bool int8_base) {
  if (int8_base && method != PeftMethod::kLora) {
    return absl::InvalidArgumentError(
        absl::StrCat("an int8 base is for LoRA only (QLoRA-style); ", PeftMethodName(method),
                     " trains parameters inside the base projections or needs float ones"));
  }
  ASSIGN_OR_RETURN(const ModelParts parts,
                   PeftModelParts(config, method,
                                  int8_base ? std::make_shared<Int8LinearFactory>() : nullptr));
  return GPTImpl::Create(config, parts);
}

TensorMap TrainedStateDict(GPTImpl& model, PeftMethod method) {
  TensorMap out;
  for (const auto& [name, tensor] : StateDict(model)) {
    if (IsTrainedParameter(method, name)) out[name] = tensor.detach().cpu().contiguous();
  }
  return out;
}

absl::StatusOr<TensorMap> MergedStateDict(GPTImpl& model, PeftMethod method) {
  switch (method) {
    case PeftMethod::kLora:
      return MergedBaseStateDict(model);
    case PeftMethod::kFull:
      return TrainedStateDict(model, method);
    default:
      return absl::UnimplementedError(
          absl::StrCat("--merge: ", PeftMethodName(method),
                       " cannot be merged into a base checkpoint (its prefix has no place "
                       "there); only lora and full"));
  }
}

}  // namespace lgpt
