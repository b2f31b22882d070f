#include "tools/finetune_model.h"

#include <ATen/ATen.h>

#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "core/base/status_macros.h"
#include "core/io/torch_pickle.h"
#include "peft/adapter.h"
#include "peft/adapter_v2.h"
#include "peft/lora.h"
#include "yaml-cpp/yaml.h"

namespace lgpt {

absl::StatusOr<FinetuneMethod> ParseFinetuneMethod(absl::string_view name) {
  if (name == "lora") return FinetuneMethod::kLora;
  if (name == "adapter") return FinetuneMethod::kAdapter;
  if (name == "adapter_v2") return FinetuneMethod::kAdapterV2;
  if (name == "full") return FinetuneMethod::kFull;
  return absl::InvalidArgumentError(absl::StrCat("unknown fine-tuning method '", name,
                                                 "' (expected lora, adapter, adapter_v2 or full)"));
}

absl::string_view FinetuneMethodName(FinetuneMethod method) {
  switch (method) {
    case FinetuneMethod::kLora:
      return "lora";
    case FinetuneMethod::kAdapter:
      return "adapter";
    case FinetuneMethod::kAdapterV2:
      return "adapter_v2";
    case FinetuneMethod::kFull:
      return "full";
  }
  return "";
}

std::string TrainedFileName(FinetuneMethod method) {
  if (method == FinetuneMethod::kFull) return "lit_model.pth";
  return absl::StrCat("lit_model.pth.", FinetuneMethodName(method));
}

bool IsTrainedParameter(FinetuneMethod method, absl::string_view name) {
  auto any_of = [name](std::initializer_list<const char*> parts) {
    for (const char* part : parts) {
      if (absl::StrContains(name, part)) return true;
    }
    return false;
  };
  switch (method) {
    case FinetuneMethod::kLora:
      return any_of({"lora_"});
    case FinetuneMethod::kAdapter:
      return any_of({"adapter_wte", "gating_factor"});
    case FinetuneMethod::kAdapterV2:
      return any_of({"adapter_wte", "gating_factor", "adapter_scale", "adapter_bias", "norm_1",
                     "norm_2", "ln_f"});
    case FinetuneMethod::kFull:
      return true;
  }
  return false;
}

absl::StatusOr<GPT> CreateFinetuneModel(const Config& config, FinetuneMethod method) {
  switch (method) {
    case FinetuneMethod::kLora:
      if (config.lora_r < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("LoRA needs lora_r >= 1, got ", config.lora_r));
      }
      if (!(config.lora_query || config.lora_key || config.lora_value || config.lora_projection ||
            config.lora_mlp || config.lora_head)) {
        return absl::InvalidArgumentError(
            "LoRA enabled on no projection: set at least one of lora_query, lora_key, "
            "lora_value, lora_projection, lora_mlp, lora_head");
      }
      return CreateLoraGPT(config);
    // The adapter files are LitGPT's (lit_model.pth.adapter / .adapter_v2): LitGPT's
    // adapter.py splits the prefix projection per query group, so training and loading use
    // that split (legacy_qkv_split) and the files mean the same in lgpt and in LitGPT.
    case FinetuneMethod::kAdapter:
      return CreateAdapterGPT(config, /*legacy_qkv_split=*/true);
    case FinetuneMethod::kAdapterV2:
      return CreateAdapterV2GPT(config, /*legacy_qkv_split=*/true);
    case FinetuneMethod::kFull:
      return GPTImpl::Create(config);
  }
  return absl::InternalError("unknown method");
}

absl::Status LoadBaseWeights(GPTImpl& model, const TensorMap& base, const std::string& source) {
  TensorMap mapped;
  std::set<std::string> used;
  std::vector<std::string> missing, unexpected;
  for (const auto& [name, tensor] : StateDict(model)) {
    // LitGPT's PEFT projections wrap the base linear as `.linear.` (lm_head.linear.weight too).
    const std::string base_name = absl::StrReplaceAll(name, {{".linear.", "."}});
    auto it = base.find(base_name);
    if (it != base.end()) {
      mapped[name] = it->second;
      used.insert(base_name);
    } else if (!absl::StrContains(name, "lora_") && !absl::StrContains(name, "adapter_") &&
               !absl::StrContains(name, "gating_factor")) {
      missing.push_back(base_name);
    }
  }
  for (const auto& [name, tensor] : base) {
    if (!used.count(name)) unexpected.push_back(name);
  }
  for (auto* names : {&missing, &unexpected}) {
    if (names->size() > 5) names->resize(5);
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": missing base tensors ", absl::StrJoin(missing, ", ")));
  }
  if (!unexpected.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": unexpected tensors ", absl::StrJoin(unexpected, ", ")));
  }
  RETURN_IF_ERROR(CheckFinite(base, source));  // names as in the file
  return LoadStateDict(model, mapped, source, /*allow_missing=*/true);
}

void MarkTrainable(GPTImpl& model, FinetuneMethod method) {
  switch (method) {
    case FinetuneMethod::kLora:
      MarkOnlyLoraTrainable(model);
      break;
    case FinetuneMethod::kAdapter:
      MarkOnlyAdapterTrainable(model);
      break;
    case FinetuneMethod::kAdapterV2:
      MarkOnlyAdapterV2Trainable(model);
      break;
    case FinetuneMethod::kFull:
      for (auto& p : model.parameters()) p.set_requires_grad(true);
      break;
  }
}

TensorMap TrainedStateDict(GPTImpl& model, FinetuneMethod method) {
  TensorMap out;
  for (const auto& [name, tensor] : StateDict(model)) {
    if (IsTrainedParameter(method, name)) out[name] = tensor.detach().cpu().contiguous();
  }
  return out;
}

absl::StatusOr<TensorMap> MergedStateDict(GPTImpl& model, FinetuneMethod method) {
  switch (method) {
    case FinetuneMethod::kLora:
      return MergedBaseStateDict(model);
    case FinetuneMethod::kFull:
      return TrainedStateDict(model, method);
    default:
      return absl::UnimplementedError(
          absl::StrCat("--merge: ", FinetuneMethodName(method),
                       " cannot be merged into a base checkpoint (its prefix has no place "
                       "there); only lora and full"));
  }
}

absl::StatusOr<std::string> BaseDirFromHyperparameters(const std::string& dir) {
  const std::string path = dir + "/hyperparameters.yaml";
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(path, " not found: give the base checkpoint directory explicitly"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  try {
    const YAML::Node root = YAML::Load(buffer.str());
    if (root.IsMap() && root["checkpoint_dir"] && root["checkpoint_dir"].IsScalar()) {
      return root["checkpoint_dir"].as<std::string>();
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
  return absl::InvalidArgumentError(absl::StrCat(path, ": no checkpoint_dir"));
}

absl::StatusOr<LoadedModel> LoadFinetuned(const std::string& dir, FinetuneMethod method,
                                          std::string base_dir, c10::ScalarType dtype) {
  ASSIGN_OR_RETURN(Config config, LoadConfigFile(dir + "/model_config.yaml"));
  if (base_dir.empty()) {
    ASSIGN_OR_RETURN(base_dir, BaseDirFromHyperparameters(dir));
  }
  ASSIGN_OR_RETURN(GPT model, CreateFinetuneModel(config, method));
  model->To(c10::Device(c10::kCPU), dtype);
  if (method != FinetuneMethod::kFull) {
    std::string source;
    ASSIGN_OR_RETURN(TensorMap base, ReadCheckpointTensors(base_dir, &source));
    RETURN_IF_ERROR(LoadBaseWeights(*model, base, source));
  }
  const std::string trained_path = dir + "/" + TrainedFileName(method);
  ASSIGN_OR_RETURN(TensorMap trained, ReadTorchStateDict(trained_path));
  for (const auto& [name, tensor] : trained) {
    if (!IsTrainedParameter(method, name)) {
      return absl::InvalidArgumentError(absl::StrCat(trained_path, ": tensor ", name, " is not a ",
                                                     FinetuneMethodName(method), " parameter"));
    }
  }
  for (const auto& [name, tensor] : TrainedStateDict(*model, method)) {
    if (!trained.count(name)) {
      return absl::InvalidArgumentError(absl::StrCat(trained_path, ": missing tensor ", name,
                                                     " (does model_config.yaml match the file?)"));
    }
  }
  RETURN_IF_ERROR(CheckFinite(trained, trained_path));
  RETURN_IF_ERROR(LoadStateDict(*model, trained, trained_path,
                                /*allow_missing=*/method != FinetuneMethod::kFull));
  model->eval();
  return LoadedModel{model->config(), model};
}

}  // namespace lgpt
