#include "core/model/checkpoint.h"

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/base/dtype_support.h"
#include "core/base/file_util.h"
#include "core/base/shape_text.h"
#include "core/base/status_macros.h"
#include "core/base/system_memory.h"
#include "core/config/config_presets.h"
#include "core/dist/tensor_parallel.h"
#include "core/io/safetensors.h"
#include "core/io/torch_pickle.h"
#include "core/model/quantized_checkpoint.h"
#include "core/model/tensor_parallel_model.h"

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
  if (options.device.is_cpu() && options.dtype == c10::kHalf &&
      !MultipliesMatrices(options.device, c10::kHalf)) {
    return absl::InvalidArgumentError(
        "float16 (16-true) matrix products are not implemented on CPU by this LibTorch "
        "(Debian's 1.13; PyPI's 2.x has them); use bf16-true or 32-true on CPU");
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

// One more than the largest N of the tensor names `prefix`N.* (0 when none).
int64_t CountIndexed(const TensorMap& tensors, absl::string_view prefix) {
  int64_t count = 0;
  for (const auto& [name, tensor] : tensors) {
    const size_t at = absl::string_view(name).find(prefix);
    if (at == absl::string_view::npos) continue;
    const absl::string_view rest = absl::string_view(name).substr(at + prefix.size());
    int64_t index = 0;
    if (absl::SimpleAtoi(rest.substr(0, rest.find('.')), &index)) {
      count = std::max(count, index + 1);
    }
  }
  return count;
}

// A weight's shape as the config implies it; checked when the checkpoint holds the tensor.
struct ExpectedShape {
  std::string name;
  std::vector<int64_t> shape;
  const char* fields;  // the config fields that make the shape
};

std::vector<ExpectedShape> ExpectedShapes(const Config& config) {
  const int64_t embd = config.n_embd;
  const int64_t heads = config.n_head * config.HeadSize();
  const int64_t qkv = (config.n_head + 2 * config.QueryGroups()) * config.HeadSize();
  const int64_t vocab = config.PaddedVocabSize();
  std::vector<ExpectedShape> shapes = {
      {"transformer.wte.weight", {vocab, embd}, "padded_vocab_size, n_embd"},
      {"lm_head.weight", {vocab, embd}, "padded_vocab_size, n_embd"},
  };
  if (!config.has_latent_attention) {
    shapes.push_back({"transformer.h.0.attn.qkv.weight",
                      {qkv, embd},
                      "(n_head + 2 * n_query_groups) * head_size, n_embd"});
    shapes.push_back(
        {"transformer.h.0.attn.proj.weight", {embd, heads}, "n_embd, n_head * head_size"});
  }
  if (config.n_expert == 0 && config.intermediate_size) {
    const int64_t inner = config.IntermediateSize();
    for (const char* fc : {"fc", "fc_1", "fc_2"}) {
      shapes.push_back({absl::StrCat("transformer.h.0.mlp.", fc, ".weight"),
                        {inner, embd},
                        "intermediate_size, n_embd"});
    }
    shapes.push_back(
        {"transformer.h.0.mlp.proj.weight", {embd, inner}, "n_embd, intermediate_size"});
  }
  return shapes;
}

absl::Status CheckBlockSize(const Config& config) {
  if (config.block_size < 1 || config.block_size > kMostBlockSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_config.yaml has block_size: ", config.block_size, ", outside [1, ",
                     kMostBlockSize, "]"));
  }
  return absl::OkStatus();
}

// The layers and experts the tensor names hold against n_layer and n_expert.
absl::Status CheckCounts(const Config& config, const TensorMap& tensors,
                         const std::string& source) {
  const int64_t layers = CountIndexed(tensors, "transformer.h.");
  if (layers != config.n_layer) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_config.yaml has n_layer: ", config.n_layer, " but ", source, " holds ",
                     layers, " layers (transformer.h.0 .. transformer.h.", layers - 1, ")"));
  }
  const int64_t experts = CountIndexed(tensors, ".mlp.experts.");
  if (experts != config.n_expert) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_config.yaml has n_expert: ", config.n_expert, " but ", source,
                     " holds ", experts, " experts per layer"));
  }
  return absl::OkStatus();
}

// The weights converted to `dtype` against the memory available: a weight already of `dtype`
// on the CPU is adopted from the mapped file and needs no copy.
absl::Status CheckFitsMemory(const TensorMap& tensors, const std::string& source,
                             c10::ScalarType dtype) {
  const std::optional<int64_t> available = AvailableMemoryBytes();
  if (!available) return absl::OkStatus();
  int64_t needed = 0;
  for (const auto& [name, tensor] : tensors) {
    if (tensor.scalar_type() != dtype) needed += tensor.numel() * c10::elementSize(dtype);
  }
  if (needed <= *available) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the weights of ", source, " need ", needed >> 20, " MiB as ", c10::toString(dtype), " and ",
      *available >> 20, " MiB of memory are available"));
}

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

absl::Status CheckConfigAgainstCheckpoint(const Config& config, const TensorMap& tensors,
                                          const std::string& source, c10::ScalarType dtype) {
  RETURN_IF_ERROR(CheckBlockSize(config));
  RETURN_IF_ERROR(CheckCounts(config, tensors, source));
  for (const ExpectedShape& expected : ExpectedShapes(config)) {
    const auto found = tensors.find(expected.name);
    if (found == tensors.end() || found->second.sizes() == at::IntArrayRef(expected.shape)) {
      continue;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "model_config.yaml makes ", expected.name, " ", ShapeText(expected.shape), " (",
        expected.fields, ") but ", source, " holds ", ShapeText(found->second.sizes())));
  }
  return CheckFitsMemory(tensors, source, dtype);
}

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
  const bool sharded = options.tensor_parallel && options.tensor_parallel->world_size() > 1;
  if (sharded && IsFile(quantized)) {
    return absl::UnimplementedError(
        absl::StrCat(checkpoint_dir, ": tensor parallelism over a quantised checkpoint (",
                     kQuantizedWeightsFile, ") is not implemented; load the float checkpoint"));
  }
  // The weights are read (mapped) and checked against the config before any module is built.
  std::string source;
  TensorMap tensors;
  if (!IsFile(quantized)) {
    progress("reading weights");
    ASSIGN_OR_RETURN(tensors,
                     ReadCheckpointTensors(checkpoint_dir, &source, options.verify_checksums));
    RETURN_IF_ERROR(CheckConfigAgainstCheckpoint(config, tensors, source, options.dtype));
  } else {
    // The quantised file's tensor names give its layers and experts (its shapes are blocks).
    RETURN_IF_ERROR(CheckBlockSize(config));
    ASSIGN_OR_RETURN(const TensorMap quantised_tensors, ReadSafetensors(quantized));
    RETURN_IF_ERROR(CheckCounts(config, quantised_tensors, quantized));
  }
  progress(absl::StrCat("building ", config.name, " (", config.n_layer, " layers)"));
  ASSIGN_OR_RETURN(const RankModelSpec rank_spec,
                   TensorParallelSpec(config, parts, options.tensor_parallel));
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

std::vector<std::string> ContextWarnings(const std::string& checkpoint_dir, const Config& config) {
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
