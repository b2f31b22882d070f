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
#include "core/nn/int8_linear.h"
#include "peft/adapter.h"
#include "peft/adapter_v2.h"
#include "peft/lora.h"
#include "peft/peft_method.h"
#include "yaml-cpp/yaml.h"

namespace lgpt {

std::string TrainedFileName(PeftMethod method) {
  if (method == PeftMethod::kFull) return "lit_model.pth";
  return absl::StrCat("lit_model.pth.", PeftMethodName(method));
}

absl::StatusOr<GPT> CreateFinetuneModel(const Config& config, PeftMethod method, bool int8_base) {
  if (int8_base && method != PeftMethod::kLora) {
    return absl::InvalidArgumentError(
        absl::StrCat("an int8 base is for LoRA only (QLoRA-style); ", PeftMethodName(method),
                     " trains parameters inside the base projections or needs float ones"));
  }
  switch (method) {
    case PeftMethod::kLora:
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
      return CreateLoraGPT(config, int8_base ? std::make_shared<Int8LinearFactory>() : nullptr);
    // The adapter files are LitGPT's (lit_model.pth.adapter / .adapter_v2): LitGPT's
    // adapter.py splits the prefix projection per query group, so training and loading use
    // that split (legacy_qkv_split) and the files mean the same in lgpt and in LitGPT.
    case PeftMethod::kAdapter:
      return CreateAdapterGPT(config, /*legacy_qkv_split=*/true);
    case PeftMethod::kAdapterV2:
      return CreateAdapterV2GPT(config, /*legacy_qkv_split=*/true);
    case PeftMethod::kFull:
      return GPTImpl::Create(config);
  }
  return absl::InternalError("unknown method");
}

absl::Status LoadBaseWeights(GPTImpl& model, const TensorMap& base, const std::string& source) {
  TensorMap mapped;
  std::set<std::string> used;
  std::vector<std::string> missing, unexpected;
  for (const auto& [name, tensor] : StateDict(model)) {
    const std::string base_name = BaseParameterName(name);
    auto it = base.find(base_name);
    if (it != base.end()) {
      mapped[name] = it->second;
      used.insert(base_name);
    } else if (!IsPeftOnlyParameter(name)) {
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

absl::StatusOr<LoadedModel> LoadFinetuned(const std::string& dir, PeftMethod method,
                                          std::string base_dir, c10::ScalarType dtype,
                                          bool verify_checksums) {
  ASSIGN_OR_RETURN(Config config, LoadConfigFile(dir + "/model_config.yaml"));
  if (base_dir.empty()) {
    ASSIGN_OR_RETURN(base_dir, BaseDirFromHyperparameters(dir));
  }
  ASSIGN_OR_RETURN(GPT model, CreateFinetuneModel(config, method));
  model->To(c10::Device(c10::kCPU), dtype);
  if (method != PeftMethod::kFull) {
    std::string source;
    ASSIGN_OR_RETURN(TensorMap base, ReadCheckpointTensors(base_dir, &source, verify_checksums));
    RETURN_IF_ERROR(LoadBaseWeights(*model, base, source));
  }
  const std::string trained_path = dir + "/" + TrainedFileName(method);
  absl::StatusOr<TensorMap> read = ReadTorchStateDict(trained_path, verify_checksums);
  if (!read.ok()) return WithVerifyChecksumsOption(read.status(), "LoadOptions.verify_checksums");
  TensorMap trained = *std::move(read);
  for (const auto& [name, tensor] : trained) {
    if (!IsTrainedParameter(method, name)) {
      return absl::InvalidArgumentError(absl::StrCat(trained_path, ": tensor ", name, " is not a ",
                                                     PeftMethodName(method), " parameter"));
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
                                /*allow_missing=*/method != PeftMethod::kFull));
  model->eval();
  return LoadedModel{model->config(), model};
}

}  // namespace lgpt
