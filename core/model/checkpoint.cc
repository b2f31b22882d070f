#include "core/model/checkpoint.h"

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/config/config_presets.h"
#include "core/base/file_util.h"
#include "core/io/safetensors.h"
#include "core/base/status_macros.h"
#include "core/dist/tensor_parallel.h"
#include "core/model/tensor_parallel_model.h"
#include "core/io/torch_pickle.h"

namespace lgpt {
namespace {

std::string Shape(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

std::string Names(const std::vector<std::string>& names) {
  constexpr size_t kShown = 5;
  std::vector<std::string> shown(names.begin(), names.begin() + std::min(kShown, names.size()));
  std::string text = absl::StrJoin(shown, ", ");
  if (names.size() > kShown) absl::StrAppend(&text, " and ", names.size() - kShown, " more");
  return text;
}

}  // namespace

absl::Status CheckFinite(const TensorMap& tensors, const std::string& source) {
  constexpr int64_t kSlice = int64_t{1} << 22;  // elements checked at a time
  for (const auto& [name, tensor] : tensors) {
    if (!tensor.is_floating_point()) continue;
    const at::Tensor flat = tensor.reshape({-1});
    for (int64_t begin = 0; begin < flat.numel(); begin += kSlice) {
      const at::Tensor slice = flat.narrow(0, begin, std::min(kSlice, flat.numel() - begin));
      if (at::isfinite(slice).all().item<bool>()) continue;
      const int64_t index =
          begin + at::logical_not(at::isfinite(slice)).nonzero()[0][0].item<int64_t>();
      const double value = flat[index].item<double>();
      return absl::DataLossError(absl::StrCat(source, ": tensor ", name, " holds ",
                                              std::isnan(value) ? "NaN" : "infinity",
                                              " at element ", index, " of ", flat.numel()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<LoadedModel> LoadCheckpointUnchecked(const std::string& checkpoint_dir,
                                                    const LoadOptions& options);

TensorMap StateDict(const torch::nn::Module& module) {
  TensorMap tensors;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    tensors[item.key()] = item.value();
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    tensors[item.key()] = item.value();
  }
  return tensors;
}

absl::Status LoadStateDict(torch::nn::Module& module, const TensorMap& tensors,
                           const std::string& source, bool allow_missing, bool adopt_storage) {
  const TensorMap targets = StateDict(module);
  std::vector<std::string> missing, unexpected;
  for (const auto& [name, target] : targets) {
    if (!tensors.count(name)) missing.push_back(name);
  }
  for (const auto& [name, tensor] : tensors) {
    if (!targets.count(name)) unexpected.push_back(name);
  }
  if (!unexpected.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": unexpected tensors ", Names(unexpected)));
  }
  if (!missing.empty() && !allow_missing) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": missing tensors ", Names(missing)));
  }
  for (const auto& [name, tensor] : tensors) {
    const at::Tensor& target = targets.at(name);
    if (!tensor.sizes().equals(target.sizes())) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": tensor ", name, " has shape ",
                                                     Shape(tensor), ", the model expects ",
                                                     Shape(target)));
    }
    if (!tensor.is_floating_point() && target.is_floating_point()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": tensor ", name, " is not floating point"));
    }
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, tensor] : tensors) {
    at::Tensor target = targets.at(name);
    if (adopt_storage && tensor.scalar_type() == target.scalar_type() &&
        tensor.device() == target.device() && tensor.is_contiguous()) {
      target.set_data(tensor);  // every holder of the parameter sees the new storage
    } else {
      target.copy_(tensor);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorMap> ReadCheckpointTensors(const std::string& checkpoint_dir,
                                                std::string* source, bool verify_checksums) {
  const std::string safetensors = checkpoint_dir + "/model.safetensors";
  const std::string pth = checkpoint_dir + "/lit_model.pth";
  if (IsFile(safetensors)) {
    ASSIGN_OR_RETURN(TensorMap tensors, ReadSafetensors(safetensors));
    // A Hugging Face directory converted in place holds the HF model.safetensors beside
    // lit_model.pth: LitGPT names (every model has transformer.wte.weight) decide.
    if (tensors.count("transformer.wte.weight") || !IsFile(pth)) {
      if (source) *source = safetensors;
      return tensors;
    }
  }
  if (IsFile(pth)) {
    if (source) *source = pth;
    absl::StatusOr<TensorMap> tensors = ReadTorchStateDict(pth, verify_checksums);
    if (!tensors.ok()) {
      return WithVerifyChecksumsOption(tensors.status(), "LoadOptions.verify_checksums");
    }
    return tensors;
  }
  return absl::NotFoundError(
      absl::StrCat(checkpoint_dir, ": no model.safetensors or lit_model.pth"));
}

absl::Status CheckLoadOptions(const LoadOptions& options) {
  if (options.device.is_cpu() && options.dtype == c10::kHalf) {
    return absl::InvalidArgumentError(
        "float16 (16-true) matrix products are not implemented on CPU by LibTorch 1.13; use "
        "bf16-true or 32-true on CPU");
  }
  return absl::OkStatus();
}

absl::StatusOr<LoadedModel> LoadCheckpoint(const std::string& checkpoint_dir,
                                           const LoadOptions& options) {
  RETURN_IF_ERROR(CheckLoadOptions(options));
  try {
    return LoadCheckpointUnchecked(checkpoint_dir, options);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat(checkpoint_dir, ": loading failed: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(checkpoint_dir, ": loading failed: ", e.what()));
  }
}

std::optional<int64_t> TrainedContext(const std::string& checkpoint_dir, const Config& config) {
  const std::string train_config = checkpoint_dir + "/train_config.yaml";
  if (IsFile(train_config)) {
    absl::StatusOr<Config> trained = LoadConfigFile(train_config);
    if (trained.ok()) return trained->block_size;
  }
  absl::StatusOr<Config> preset = PresetFromName(config.name);
  if (preset.ok()) return preset->block_size;
  return std::nullopt;
}

absl::StatusOr<LoadedModel> LoadCheckpointUnchecked(const std::string& checkpoint_dir,
                                                    const LoadOptions& options) {
  auto progress = [&](const std::string& message) {
    if (options.progress) options.progress(message);
  };
  if (!IsDirectory(checkpoint_dir)) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint directory ", checkpoint_dir, " does not exist"));
  }
  progress("reading model_config.yaml");
  ASSIGN_OR_RETURN(Config config, LoadConfigFile(checkpoint_dir + "/model_config.yaml"));
  progress(absl::StrCat("building ", config.name, " (", config.n_layer, " layers)"));
  ASSIGN_OR_RETURN(const RankModelSpec rank_spec,
                   TensorParallelSpec(config, options.parts, options.tensor_parallel));
  GPT model;
  {
    // Every weight is loaded next: random initialisation would only cost time and memory.
    SkipProjectionInit skip_init;
    ASSIGN_OR_RETURN(model, GPTImpl::Create(rank_spec.config, rank_spec.parts));
  }
  std::string source;
  progress("reading weights");
  ASSIGN_OR_RETURN(TensorMap tensors,
                   ReadCheckpointTensors(checkpoint_dir, &source, options.verify_checksums));
  if (options.tensor_parallel && options.tensor_parallel->world_size() > 1) {
    // Views of the mapped file: only this rank's slices are read from here on.
    ASSIGN_OR_RETURN(tensors, ShardTensors(tensors, config, options.tensor_parallel->rank(),
                                           options.tensor_parallel->world_size()));
  }
  if (options.check_finite) {
    progress("checking the weights are finite");
    RETURN_IF_ERROR(CheckFinite(tensors, source));
  }
  progress(absl::StrCat("loading ", tensors.size(), " tensors from ", source));
  model->To(options.device, options.dtype);
  RETURN_IF_ERROR(LoadStateDict(*model, tensors, source, /*allow_missing=*/false,
                                /*adopt_storage=*/true));
  model->eval();
  return LoadedModel{model->config(), model, ContextWarnings(checkpoint_dir, config)};
}

std::vector<std::string> ContextWarnings(const std::string& checkpoint_dir,
                                         const Config& config) {
  const std::optional<int64_t> trained = TrainedContext(checkpoint_dir, config);
  if (!trained || config.block_size <= *trained) return {};
  return {absl::StrCat("block_size ", config.block_size, " in model_config.yaml exceeds the ",
                       *trained, " tokens the model was trained on; positions past ", *trained,
                       " are extrapolation")};
}

}  // namespace lgpt
