#include "peft/peft_checkpoint.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/base/file_util.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "core/dist/process_group.h"
#include "core/dist/tensor_parallel.h"
#include "core/io/torch_pickle.h"
#include "core/model/tensor_parallel_model.h"
#include "peft/adapter.h"
#include "peft/adapter_v2.h"
#include "peft/lora.h"
#include "yaml-cpp/yaml.h"

namespace lgpt {
namespace {

namespace fs = std::filesystem;

// The methods whose directories hold a lit_model.pth.<method> file.
constexpr PeftMethod kFileMethods[] = {PeftMethod::kLora, PeftMethod::kAdapter,
                                       PeftMethod::kAdapterV2};

std::string ShapeText(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

bool HasFullWeights(const std::string& dir) {
  return IsFile(dir + "/lit_model.pth") || IsFile(dir + "/model.safetensors");
}

Config WithoutPeftFields(Config config) {
  const Config defaults;
  config.lora_r = defaults.lora_r;
  config.lora_alpha = defaults.lora_alpha;
  config.lora_dropout = defaults.lora_dropout;
  config.lora_query = config.lora_key = config.lora_value = false;
  config.lora_projection = config.lora_mlp = config.lora_head = false;
  config.adapter_prompt_length.reset();
  config.adapter_start_layer.reset();
  return config;
}

// model_config.yaml's top-level keys with their text (block values included).
std::map<std::string, std::string> YamlEntries(const std::string& yaml) {
  std::map<std::string, std::string> entries;
  std::string key;
  for (absl::string_view line : absl::StrSplit(yaml, '\n', absl::SkipEmpty())) {
    const size_t colon = line.find(':');
    if (line[0] != ' ' && line[0] != '-' && colon != absl::string_view::npos) {
      key = std::string(line.substr(0, colon));
      entries[key] = std::string(absl::StripLeadingAsciiWhitespace(line.substr(colon + 1)));
    } else if (!key.empty()) {
      absl::StrAppend(&entries[key], entries[key].empty() ? "" : " ",
                      absl::StripAsciiWhitespace(line));
    }
  }
  return entries;
}

// How many decorators wrap the projection a parameter belongs to, counted from the
// outermost: `qkv.lora_A` 0, `qkv.linear.lora_A` 1 (the base model names no module
// `linear`).
int Depth(absl::string_view name) {
  const size_t dot = name.rfind('.');
  absl::string_view module = dot == absl::string_view::npos ? "" : name.substr(0, dot);
  int depth = 0;
  while (absl::ConsumeSuffix(&module, ".linear")) ++depth;
  return depth;
}

// `qkv.lora_A` at depth 2: `qkv.linear.linear.lora_A`.
std::string Nest(absl::string_view name, int depth) {
  const size_t dot = name.rfind('.');
  if (dot == absl::string_view::npos || depth == 0) return std::string(name);
  std::string nested(name.substr(0, dot));
  for (int i = 0; i < depth; ++i) nested += ".linear";
  return absl::StrCat(nested, name.substr(dot));
}

// The inverse of Nest: `qkv.linear.lora_A` at depth 1 is the file's `qkv.lora_A`.
std::string Unnest(absl::string_view name, int depth) {
  const size_t dot = name.rfind('.');
  if (dot == absl::string_view::npos) return std::string(name);
  absl::string_view module = name.substr(0, dot);
  for (int i = 0; i < depth; ++i) absl::ConsumeSuffix(&module, ".linear");
  return absl::StrCat(module, name.substr(dot));
}

// A trained LoRA config's options: at least rank 1 on at least one projection.
absl::StatusOr<LoraOptions> TrainedLoraOptions(const Config& config) {
  if (config.lora_r < 1) {
    return absl::InvalidArgumentError(absl::StrCat("LoRA needs lora_r >= 1, got ", config.lora_r));
  }
  if (!(config.lora_query || config.lora_key || config.lora_value || config.lora_projection ||
        config.lora_mlp || config.lora_head)) {
    return absl::InvalidArgumentError(
        "LoRA enabled on no projection: set at least one of lora_query, lora_key, lora_value, "
        "lora_projection, lora_mlp, lora_head");
  }
  // LoraParts checks the rest (finite alpha, dropout, r <= n_embd).
  RETURN_IF_ERROR(LoraParts(config).status());
  return LoraOptions::FromConfig(config);
}

// A trained file to load over the base weights: where its tensors go in the model.
struct TrainedFile {
  std::string path;
  PeftMethod method;
  // The model's name of the file's tensor `name`.
  std::function<std::string(absl::string_view)> to_model;
  // The file's name of the model's parameter `name`, nullopt when it is not this file's.
  std::function<std::optional<std::string>(absl::string_view)> to_file;
  // Names the file in errors (carrying the field), when set.
  std::string label, field;
  // Under tensor parallelism: the rank's part of the file's tensors (file names); null: all.
  std::function<absl::StatusOr<TensorMap>(const TensorMap&)> shard;
};

// Under tensor parallelism (options.tensor_parallel), the rank's part of a LoRA file of
// `lora` over `base` (ShardLoraTensors); null otherwise.
std::function<absl::StatusOr<TensorMap>(const TensorMap&)> LoraFileShard(const LoadOptions& options,
                                                                         const Config& base,
                                                                         const LoraOptions& lora) {
  const std::shared_ptr<ProcessGroup>& group = options.tensor_parallel;
  if (group == nullptr || group->world_size() <= 1) return nullptr;
  const LoraQkvParts qkv{lora.query, lora.key, lora.value};
  return [base, qkv, group](const TensorMap& tensors) {
    return ShardLoraTensors(tensors, base, qkv, group->rank(), group->world_size());
  };
}

// A file loading into the decorators at `depth` of stacked LoRA (0: outermost).
TrainedFile NestedFile(const std::string& path, PeftMethod method, int depth) {
  TrainedFile file{path, method, nullptr, nullptr, "", ""};
  file.to_model = [depth](absl::string_view name) { return Nest(name, depth); };
  file.to_file = [depth](absl::string_view name) -> std::optional<std::string> {
    if (Depth(name) != depth) return std::nullopt;
    return Unnest(name, depth);
  };
  return file;
}

// A LoRA file loading into slot `slot` of a multi-adapter model: `qkv.lora_A` is
// `qkv.slot<k>.lora_A`.
TrainedFile SlotFile(const std::string& path, int64_t slot) {
  TrainedFile file{path, PeftMethod::kLora, nullptr, nullptr, "", ""};
  const std::string module = absl::StrCat("slot", slot);
  file.to_model = [module](absl::string_view name) {
    const size_t dot = name.rfind('.');
    if (dot == absl::string_view::npos) return std::string(name);
    return absl::StrCat(name.substr(0, dot), ".", module, name.substr(dot));
  };
  file.to_file = [module](absl::string_view name) -> std::optional<std::string> {
    const size_t dot = name.rfind('.');
    if (dot == absl::string_view::npos) return std::nullopt;
    absl::string_view owner = name.substr(0, dot);
    const size_t owner_dot = owner.rfind('.');
    if (owner.substr(owner_dot == absl::string_view::npos ? 0 : owner_dot + 1) != module) {
      return std::nullopt;
    }
    return absl::StrCat(owner_dot == absl::string_view::npos ? "" : owner.substr(0, owner_dot),
                        name.substr(dot));
  };
  return file;
}

// Loads the trained `file` into the model. Every tensor must be one of the method's
// parameters that model_config.yaml gives, with its shape; messages use the file's names.
absl::Status LoadTrainedFile(GPTImpl& model, const TrainedFile& file, const LoadOptions& options) {
  const std::string& path = file.path;
  const PeftMethod method = file.method;
  absl::StatusOr<TensorMap> read = ReadTorchStateDict(path, options.verify_checksums);
  if (!read.ok()) return WithVerifyChecksumsOption(read.status(), "LoadOptions.verify_checksums");
  TensorMap trained = *std::move(read);
  if (file.shard) {
    absl::StatusOr<TensorMap> shard = file.shard(trained);
    if (!shard.ok())
      return WithMessage(shard.status(), absl::StrCat(path, ": ", shard.status().message()));
    trained = *std::move(shard);
  }
  const bool check_finite = options.check_finite;
  const TensorMap targets = StateDict(model);
  const absl::string_view name_of_method = PeftMethodName(method);
  TensorMap mapped;
  for (const auto& [name, tensor] : trained) {
    if (!IsTrainedParameter(method, name) || Depth(name) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor ", name, " is not a ", name_of_method, " parameter"));
    }
    const std::string target = file.to_model(name);
    auto it = targets.find(target);
    if (it == targets.end()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": unexpected tensor ", name,
                                                     " (does model_config.yaml match the file?)"));
    }
    if (!tensor.sizes().equals(it->second.sizes())) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor ", name, " has shape ", ShapeText(tensor),
                       ", model_config.yaml gives ", ShapeText(it->second)));
    }
    mapped[target] = tensor;
  }
  for (const auto& [name, tensor] : targets) {
    if (!IsTrainedParameter(method, name) || mapped.count(name)) continue;
    const std::optional<std::string> in_file = file.to_file(name);
    if (in_file.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": missing tensor ", *in_file,
                                                     " (does model_config.yaml match the file?)"));
    }
  }
  if (check_finite) RETURN_IF_ERROR(CheckFinite(trained, path));
  return LoadStateDict(model, mapped, path, /*allow_missing=*/true);
}

// Builds the model for `parts`, loads `base_dir`'s weights into it and `trained` files on
// top.
absl::StatusOr<LoadedModel> BuildAndLoad(const Config& config, const ModelParts& parts,
                                         const std::string& base_dir,
                                         const std::vector<TrainedFile>& trained,
                                         const LoadOptions& options) {
  auto progress = [&](const std::string& message) {
    if (options.progress) options.progress(message);
  };
  // The base weights are read (mapped) and checked against the config before anything is built.
  std::string source;
  progress("reading the base weights");
  ASSIGN_OR_RETURN(TensorMap base,
                   ReadCheckpointTensors(base_dir, &source, options.verify_checksums));
  RETURN_IF_ERROR(CheckConfigAgainstCheckpoint(config, base, source, options.dtype));
  // Tensor parallelism: this rank's model and its slices of the base (the trained files'
  // slices come through their TrainedFile::shard).
  RankModelSpec spec{config, parts};
  if (const std::shared_ptr<ProcessGroup>& group = options.tensor_parallel;
      group && group->world_size() > 1) {
    for (const TrainedFile& file : trained) {
      if (file.shard) continue;
      return absl::UnimplementedError(
          absl::StrCat(file.path, ": tensor parallelism over ", PeftMethodName(file.method),
                       " fine-tunes is not supported (LoRA fine-tunes and adapters are)"));
    }
    ASSIGN_OR_RETURN(spec, TensorParallelSpec(config, parts, group));
    ASSIGN_OR_RETURN(base, ShardTensors(base, config, group->rank(), group->world_size()));
  }
  progress(absl::StrCat("building ", config.name, " (", config.n_layer, " layers)"));
  GPT model;
  {
    SkipWeightInit skip_init;  // every base weight is loaded next
    ASSIGN_OR_RETURN(model, GPTImpl::Create(spec.config, spec.parts));
  }
  model->To(options.device, options.dtype);
  progress(absl::StrCat("loading ", base.size(), " tensors from ", source));
  RETURN_IF_ERROR(LoadBaseWeights(*model, base, source, options.check_finite,
                                  /*adopt_storage=*/true));
  for (const TrainedFile& file : trained) {
    progress(absl::StrCat("loading ", file.path));
    const absl::Status loaded = LoadTrainedFile(*model, file, options);
    if (!loaded.ok() && !file.label.empty()) {
      // The file's label before the message; the field of the file, unless the error names
      // its own (LoadOptions.verify_checksums).
      const std::string message = absl::StrCat(file.label, ": ", loaded.message());
      if (file.field.empty() || ErrorField(loaded).has_value()) {
        return WithMessage(loaded, message);
      }
      return WithFields(absl::Status(loaded.code(), message), file.field);
    }
    RETURN_IF_ERROR(loaded);
  }
  model->eval();
  return LoadedModel{model->config(), model, ContextWarnings(base_dir, config)};
}

// The config of fine-tune `dir` when it matches the base's.
absl::StatusOr<Config> FinetuneConfig(const std::string& dir, const Config& base) {
  const std::string path = dir + "/model_config.yaml";
  ASSIGN_OR_RETURN(Config config, LoadConfigFile(path));
  RETURN_IF_ERROR(CheckSameBaseModel(config, base, path));
  return config;
}

// How errors name an adapter: "EngineOptions.loras[1] /dir" (the caller's `field` alone, carried
// by the error: core/base/status_field.h), or a directory (no field).
struct AdapterLabel {
  std::string text;
  std::string field;  // empty: none
};

// `status` about the adapter `label` names: its message after the label, its field carried.
absl::Status AboutAdapter(const AdapterLabel& label, absl::StatusCode code,
                          absl::string_view message) {
  const absl::Status status(code, absl::StrCat(label.text, ": ", message));
  return label.field.empty() ? status : WithFields(status, label.field);
}

// `base_dir` with LoRA adapters stacked over it: adapter i decorates adapters 0..i-1, so the
// last is outermost. `labels` name the adapters in errors.
absl::StatusOr<LoadedModel> LoadLoraStack(const std::string& base_dir,
                                          const std::vector<LoraAdapterSpec>& adapters,
                                          const std::vector<AdapterLabel>& labels,
                                          const LoadOptions& options) {
  RETURN_IF_ERROR(CheckLoadOptions(options));
  if (!IsDirectory(base_dir)) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory ", base_dir, " does not exist"));
  }
  ASSIGN_OR_RETURN(const Config base_config, LoadConfigFile(base_dir + "/model_config.yaml"));
  std::shared_ptr<const LinearFactory> factory =
      LinearFactoryOrDefault(options.parts.linear_factory);
  std::vector<TrainedFile> trained;
  const int count = static_cast<int>(adapters.size());
  for (int i = 0; i < count; ++i) {
    const std::string& dir = adapters[i].dir;
    const std::string path = dir + "/" + TrainedFileName(PeftMethod::kLora);
    if (!IsDirectory(dir)) {
      return AboutAdapter(labels[i], absl::StatusCode::kNotFound, "no such directory");
    }
    if (!IsFile(path)) {
      return AboutAdapter(labels[i], absl::StatusCode::kNotFound,
                          "no lit_model.pth.lora (a LoRA fine-tune directory holds it beside "
                          "model_config.yaml)");
    }
    absl::StatusOr<Config> config = FinetuneConfig(dir, base_config);
    absl::StatusOr<LoraOptions> lora =
        config.ok() ? TrainedLoraOptions(*config) : absl::StatusOr<LoraOptions>(config.status());
    if (!lora.ok()) return AboutAdapter(labels[i], lora.status().code(), lora.status().message());
    lora->scale = adapters[i].scale;
    factory = std::make_shared<LoraLinearFactory>(*lora, std::move(factory));
    trained.push_back(NestedFile(path, PeftMethod::kLora, count - 1 - i));
    trained.back().shard = LoraFileShard(options, base_config, *lora);
  }
  ModelParts parts;
  parts.linear_factory = std::move(factory);
  parts.attention_extensions = options.parts.attention_extensions;
  return BuildAndLoad(base_config, parts, base_dir, trained, options);
}

// An adapter or adapter v2 fine-tune over its base.
absl::StatusOr<LoadedModel> LoadAdapterFinetune(const std::string& dir, PeftMethod method,
                                                const std::string& base_dir,
                                                const LoadOptions& options) {
  RETURN_IF_ERROR(CheckLoadOptions(options));
  const std::string path = dir + "/" + TrainedFileName(method);
  if (!IsFile(path)) {
    return absl::NotFoundError(absl::StrCat(dir, ": no ", TrainedFileName(method)));
  }
  if (!IsDirectory(base_dir)) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory ", base_dir, " does not exist"));
  }
  ASSIGN_OR_RETURN(const Config base_config, LoadConfigFile(base_dir + "/model_config.yaml"));
  ASSIGN_OR_RETURN(const Config config, FinetuneConfig(dir, base_config));
  ASSIGN_OR_RETURN(ModelParts parts, PeftModelParts(config, method, options.parts.linear_factory));
  parts.attention_extensions.insert(parts.attention_extensions.end(),
                                    options.parts.attention_extensions.begin(),
                                    options.parts.attention_extensions.end());
  return BuildAndLoad(config, parts, base_dir, {NestedFile(path, method, 0)}, options);
}

// LoadCheckpoint's net for exceptions LibTorch throws on hostile input.
template <typename Load>
absl::StatusOr<LoadedModel> Guarded(const std::string& dir, Load load) {
  try {
    return load();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(dir, ": loading failed: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(dir, ": loading failed: ", e.what()));
  }
}

}  // namespace

std::string TrainedFileName(PeftMethod method) {
  if (method == PeftMethod::kFull) return "lit_model.pth";
  return absl::StrCat("lit_model.pth.", PeftMethodName(method));
}

absl::StatusOr<std::optional<PeftMethod>> PeftMethodOfDir(const std::string& dir) {
  if (!IsDirectory(dir)) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory ", dir, " does not exist"));
  }
  std::vector<PeftMethod> found;
  std::vector<std::string> names;
  for (PeftMethod method : kFileMethods) {
    if (IsFile(dir + "/" + TrainedFileName(method))) {
      found.push_back(method);
      names.push_back(TrainedFileName(method));
    }
  }
  if (found.empty()) return std::nullopt;
  if (found.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(dir, " holds several fine-tunes (",
                                                   absl::StrJoin(names, ", "), "): keep one"));
  }
  if (!HasFullWeights(dir)) return found[0];
  // merge_lora writes lit_model.pth beside the LoRA files: the merged model is the one meant.
  if (found[0] == PeftMethod::kLora) return std::nullopt;
  return absl::InvalidArgumentError(
      absl::StrCat(dir, " holds full weights beside ", names[0],
                   ", which no merge writes (adapters do not merge): keep one"));
}

absl::StatusOr<std::string> BaseDirFromHyperparameters(const std::string& dir) {
  const std::string path = dir + "/hyperparameters.yaml";
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(path, " not found: it names the base checkpoint (checkpoint_dir)"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string base;
  try {
    const YAML::Node root = YAML::Load(buffer.str());
    if (root.IsMap() && root["checkpoint_dir"] && root["checkpoint_dir"].IsScalar()) {
      base = root["checkpoint_dir"].as<std::string>();
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
  if (base.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no checkpoint_dir"));
  if (fs::path(base).is_absolute()) {
    if (IsDirectory(base)) return base;
    return absl::NotFoundError(
        absl::StrCat(path, ": the base checkpoint_dir ", base, " is not a directory"));
  }
  if (IsDirectory(base)) return base;
  // The fine-tune moved with its base beside it (out/lora + out/base, say).
  const fs::path parent = fs::path(dir).lexically_normal().parent_path();
  const fs::path beside = (parent.empty() ? fs::path(".") : parent) / base;
  if (IsDirectory(beside.string())) return beside.string();
  std::error_code error;
  const fs::path cwd = fs::current_path(error);
  return absl::NotFoundError(
      absl::StrCat(path, ": the base checkpoint_dir ", base,
                   " is a directory neither relative to the current ", "directory (", cwd.string(),
                   ") nor relative to the fine-tune's parent (", beside.string(), ")"));
}

absl::Status CheckSameBaseModel(const Config& config, const Config& base, absl::string_view what) {
  const Config a = WithoutPeftFields(config), b = WithoutPeftFields(base);
  if (a == b) return absl::OkStatus();
  const std::map<std::string, std::string> ours = YamlEntries(ConfigToYaml(a));
  const std::map<std::string, std::string> theirs = YamlEntries(ConfigToYaml(b));
  std::set<std::string> keys;
  for (const auto& [key, value] : ours) keys.insert(key);
  for (const auto& [key, value] : theirs) keys.insert(key);
  for (const std::string& key : keys) {
    auto mine = ours.find(key), base_value = theirs.find(key);
    const std::string x = mine == ours.end() ? "unset" : mine->second;
    const std::string y = base_value == theirs.end() ? "unset" : base_value->second;
    if (x != y) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", key, " is ", x,
                                                     " but the base model's is ", y,
                                                     " (a fine-tune applies to its own base)"));
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": describes another model than the base's model_config.yaml"));
}

absl::StatusOr<ModelParts> PeftModelParts(const Config& config, PeftMethod method,
                                          std::shared_ptr<const LinearFactory> base) {
  base = LinearFactoryOrDefault(std::move(base));
  ModelParts parts;
  switch (method) {
    case PeftMethod::kLora: {
      ASSIGN_OR_RETURN(const LoraOptions options, TrainedLoraOptions(config));
      parts.linear_factory = std::make_shared<LoraLinearFactory>(options, std::move(base));
      return parts;
    }
    // The adapter files are LitGPT's (lit_model.pth.adapter / .adapter_v2): LitGPT's
    // adapter.py splits the prefix projection per query group, so training and loading use
    // that split (legacy_qkv_split) and the files mean the same in lgpt and in LitGPT.
    case PeftMethod::kAdapter: {
      ASSIGN_OR_RETURN(parts, AdapterParts(config, /*legacy_qkv_split=*/true));
      parts.linear_factory = std::move(base);
      return parts;
    }
    case PeftMethod::kAdapterV2: {
      ASSIGN_OR_RETURN(parts, AdapterV2Parts(config, /*legacy_qkv_split=*/true));
      parts.linear_factory = std::make_shared<AdapterV2LinearFactory>(std::move(base));
      return parts;
    }
    case PeftMethod::kFull:
      parts.linear_factory = std::move(base);
      return parts;
  }
  return absl::InternalError("unknown method");
}

absl::Status LoadBaseWeights(GPTImpl& model, const TensorMap& base, const std::string& source,
                             bool check_finite, bool adopt_storage) {
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
  if (check_finite) RETURN_IF_ERROR(CheckFinite(base, source));  // names as in the file
  return LoadStateDict(model, mapped, source, /*allow_missing=*/true, adopt_storage);
}

absl::Status ValidateLoraAdapterSpecs(const std::vector<LoraAdapterSpec>& loras,
                                      absl::string_view field) {
  for (size_t i = 0; i < loras.size(); ++i) {
    if (loras[i].dir.empty()) {
      return InvalidFieldError(field, absl::StrCat(field, "[", i, "].dir is empty"));
    }
    const double scale = loras[i].scale;
    if (!std::isfinite(scale) || scale < 0) {
      return InvalidFieldError(
          field, absl::StrCat(field, "[", i, "].scale must be finite and >= 0, got ", scale, " (",
                              loras[i].dir, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<LoadedModel> LoadPeftCheckpoint(const std::string& dir, PeftMethod method,
                                               const LoadOptions& options, std::string base_dir) {
  if (method == PeftMethod::kFull) return LoadCheckpoint(dir, options);
  if (!IsDirectory(dir)) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory ", dir, " does not exist"));
  }
  if (base_dir.empty()) {
    ASSIGN_OR_RETURN(base_dir, BaseDirFromHyperparameters(dir));
  }
  return Guarded(dir, [&]() -> absl::StatusOr<LoadedModel> {
    if (method == PeftMethod::kLora) {
      return LoadLoraStack(base_dir, {{dir, 1.0}}, {AdapterLabel{dir, ""}}, options);
    }
    return LoadAdapterFinetune(dir, method, base_dir, options);
  });
}

absl::StatusOr<LoadedModel> LoadModelWithPeft(const std::string& checkpoint_dir,
                                              const std::vector<LoraAdapterSpec>& loras,
                                              const LoadOptions& options,
                                              absl::string_view loras_field) {
  RETURN_IF_ERROR(ValidateLoraAdapterSpecs(loras, loras_field));
  ASSIGN_OR_RETURN(const std::optional<PeftMethod> method, PeftMethodOfDir(checkpoint_dir));
  if (!method && loras.empty()) return LoadCheckpoint(checkpoint_dir, options);
  if (method && *method != PeftMethod::kLora) {
    if (!loras.empty()) {
      return InvalidFieldError(
          loras_field,
          absl::StrCat(loras_field, " apply over a plain checkpoint or a LoRA fine-tune; ",
                       checkpoint_dir, " is an ", PeftMethodName(*method), " fine-tune"));
    }
    return LoadPeftCheckpoint(checkpoint_dir, *method, options);
  }
  // A LoRA fine-tune directory is the first adapter over its base; the others stack on it.
  std::string base_dir = checkpoint_dir;
  std::vector<LoraAdapterSpec> stack;
  std::vector<AdapterLabel> labels;
  if (method) {
    ASSIGN_OR_RETURN(base_dir, BaseDirFromHyperparameters(checkpoint_dir));
    stack.push_back({checkpoint_dir, 1.0});
    labels.push_back({checkpoint_dir, ""});
  }
  for (size_t i = 0; i < loras.size(); ++i) {
    stack.push_back(loras[i]);
    labels.push_back(
        {absl::StrCat(loras_field, "[", i, "] ", loras[i].dir), std::string(loras_field)});
  }
  return Guarded(checkpoint_dir, [&]() { return LoadLoraStack(base_dir, stack, labels, options); });
}

absl::StatusOr<MultiLoraModel> LoadMultiLoraModel(const std::string& base_dir,
                                                  const std::vector<NamedLoraAdapter>& adapters,
                                                  const LoadOptions& options,
                                                  absl::string_view adapters_field) {
  const std::string field(adapters_field);
  if (adapters.empty()) {
    return InvalidFieldError(field, absl::StrCat(field,
                                                 " is empty: a multi-adapter model "
                                                 "serves at least one adapter"));
  }
  std::vector<LoraAdapterSpec> specs;
  std::set<std::string> names;
  for (size_t k = 0; k < adapters.size(); ++k) {
    const std::string& name = adapters[k].name;
    if (name.empty()) {
      return InvalidFieldError(
          field, absl::StrCat(field, "[", k, "].name is empty (", adapters[k].lora.dir, ")"));
    }
    if (!names.insert(name).second) {
      return InvalidFieldError(
          field, absl::StrCat(field, "[", k, "].name '", name, "' names an earlier adapter too"));
    }
    specs.push_back(adapters[k].lora);
  }
  RETURN_IF_ERROR(ValidateLoraAdapterSpecs(specs, field));
  RETURN_IF_ERROR(CheckLoadOptions(options));
  ASSIGN_OR_RETURN(const std::optional<PeftMethod> base_method, PeftMethodOfDir(base_dir));
  if (base_method.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(base_dir, " is a ", PeftMethodName(*base_method),
                     " fine-tune: the adapters' base must be a plain checkpoint"));
  }
  MultiLoraModel out;
  absl::StatusOr<LoadedModel> loaded = Guarded(base_dir, [&]() -> absl::StatusOr<LoadedModel> {
    ASSIGN_OR_RETURN(const Config base_config, LoadConfigFile(base_dir + "/model_config.yaml"));
    std::vector<LoraOptions> loras;
    std::vector<TrainedFile> trained;
    for (size_t k = 0; k < adapters.size(); ++k) {
      const std::string& dir = specs[k].dir;
      const AdapterLabel label{absl::StrCat(field, "[", k, "] '", adapters[k].name, "' ", dir),
                               field};
      const std::string path = dir + "/" + TrainedFileName(PeftMethod::kLora);
      if (!IsDirectory(dir)) {
        return AboutAdapter(label, absl::StatusCode::kNotFound, "no such directory");
      }
      if (!IsFile(path)) {
        return AboutAdapter(label, absl::StatusCode::kNotFound,
                            "no lit_model.pth.lora (a LoRA fine-tune directory holds it beside "
                            "model_config.yaml)");
      }
      absl::StatusOr<Config> config = FinetuneConfig(dir, base_config);
      absl::StatusOr<LoraOptions> lora =
          config.ok() ? TrainedLoraOptions(*config) : absl::StatusOr<LoraOptions>(config.status());
      if (lora.ok()) {
        lora->scale = specs[k].scale;
        const absl::Status fits = CheckMultiLoraAdapter(base_config, *lora);
        if (!fits.ok()) lora = absl::StatusOr<LoraOptions>(fits);
      }
      if (!lora.ok()) return AboutAdapter(label, lora.status().code(), lora.status().message());
      loras.push_back(*lora);
      TrainedFile file = SlotFile(path, static_cast<int64_t>(k));
      file.label = label.text;
      file.field = label.field;
      file.shard = LoraFileShard(options, base_config, *lora);
      trained.push_back(std::move(file));
    }
    ASSIGN_OR_RETURN(ModelParts parts,
                     MultiLoraParts(base_config, loras, options.parts.linear_factory));
    parts.attention_extensions = options.parts.attention_extensions;
    return BuildAndLoad(base_config, parts, base_dir, trained, options);
  });
  RETURN_IF_ERROR(loaded.status());
  out.loaded = *std::move(loaded);
  for (const NamedLoraAdapter& adapter : adapters) out.adapter_names.push_back(adapter.name);
  return out;
}

std::vector<std::string> CheckpointFileDirs(const std::string& dir) {
  std::vector<std::string> dirs = {dir};
  absl::StatusOr<std::optional<PeftMethod>> method = PeftMethodOfDir(dir);
  if (method.ok() && method->has_value()) {
    absl::StatusOr<std::string> base = BaseDirFromHyperparameters(dir);
    if (base.ok()) dirs.push_back(*base);
  }
  return dirs;
}

}  // namespace lgpt
