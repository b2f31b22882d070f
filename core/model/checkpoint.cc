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
#include "core/model/quantized_checkpoint.h"

namespace lgpt {

absl::StatusOr<LoadedModel> LoadCheckpointUnchecked(const std::string& checkpoint_dir,
                                                    const LoadOptions& options);

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

namespace {

// TrainedContext, and in `parse_error` (when given) why a train_config.yaml that exists did
// not parse.
std::optional<int64_t> TrainedContextOf(const std::string& checkpoint_dir, const Config& config,
                                        absl::Status* parse_error) {
  const std::string train_config = checkpoint_dir + "/train_config.yaml";
  if (IsFile(train_config)) {
    absl::StatusOr<Config> trained = LoadConfigFile(train_config);
    if (trained.ok()) return trained->block_size;
    if (parse_error != nullptr) *parse_error = trained.status();
  }
  absl::StatusOr<Config> preset = PresetFromName(config.name);
  if (preset.ok()) return preset->block_size;
  return std::nullopt;
}

}  // namespace

std::optional<int64_t> TrainedContext(const std::string& checkpoint_dir, const Config& config) {
  return TrainedContextOf(checkpoint_dir, config, nullptr);
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
  // A quantised checkpoint builds block-quantised projections of its format unless the
  // caller chose the parts (which must then be of that format; loading says where not).
  const std::string quantized = checkpoint_dir + "/" + kQuantizedWeightsFile;
  ModelParts parts = options.parts;
  if (IsFile(quantized) && parts.linear_factory == nullptr) {
    ASSIGN_OR_RETURN(const BlockFormat format, QuantizedCheckpointFormat(quantized));
    parts.linear_factory = QuantizedCheckpointParts(format).linear_factory;
  }
  progress(absl::StrCat("building ", config.name, " (", config.n_layer, " layers)"));
  ASSIGN_OR_RETURN(const RankModelSpec rank_spec,
                   TensorParallelSpec(config, parts, options.tensor_parallel));
  const bool sharded = options.tensor_parallel && options.tensor_parallel->world_size() > 1;
  if (sharded && IsFile(quantized)) {
    return absl::UnimplementedError(absl::StrCat(
        checkpoint_dir, ": tensor parallelism over a quantised checkpoint (", kQuantizedWeightsFile,
        ") is not implemented; load the float checkpoint"));
  }
  GPT model;
  {
    // Every weight is loaded next: random initialisation would only cost time and memory.
    SkipWeightInit skip_init;
    ASSIGN_OR_RETURN(model, GPTImpl::Create(rank_spec.config, rank_spec.parts));
  }
  if (IsFile(quantized)) {
    progress(absl::StrCat("loading quantised weights from ", quantized));
    model->To(options.device, options.dtype);
    RETURN_IF_ERROR(LoadQuantizedCheckpoint(*model, quantized, options.verify_checksums));
    model->eval();
    return LoadedModel{model->config(), model, ContextWarnings(checkpoint_dir, config)};
  }
  std::string source;
  progress("reading weights");
  ASSIGN_OR_RETURN(TensorMap tensors,
                   ReadCheckpointTensors(checkpoint_dir, &source, options.verify_checksums));
  if (sharded) {
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
  std::vector<std::string> warnings;
  absl::Status parsed;
  const std::optional<int64_t> trained = TrainedContextOf(checkpoint_dir, config, &parsed);
  // The preset stood in for a train_config.yaml that does not parse: say so.
  if (!parsed.ok()) {
    warnings.push_back(
        absl::StrCat("ignoring train_config.yaml, which does not parse (", parsed.message(), ")"));
  }
  if (!trained || config.block_size <= *trained) return warnings;
  warnings.push_back(absl::StrCat(
      "block_size ", config.block_size, " in model_config.yaml exceeds the ", *trained,
      " tokens the model was trained on; positions past ", *trained, " are extrapolation"));
  return warnings;
}

}  // namespace lgpt
