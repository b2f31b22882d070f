// Fine-tunes at run time, without merging: the directories `finetune` (and LitGPT's
// finetune) write, and LoRA adapters applied over a base checkpoint (llama.cpp's --lora and
// --lora-scaled).
//
// A fine-tune directory holds the trained parameters alone (`lit_model.pth.lora`,
// `.adapter` or `.adapter_v2`, LitGPT's names), `model_config.yaml` with the PEFT fields and
// `hyperparameters.yaml`, whose `checkpoint_dir` names the base checkpoint. Loading builds
// the method's model over the base's weights and loads the trained file on top.
//
// Several LoRA adapters stack by nesting the linear factory, one LoraLinearFactory per
// adapter (LoraLinearFactory(opts2, LoraLinearFactory(opts1, base))), so each keeps its own
// r, alpha and targets, and every projection computes
//   W x + sum_i scale_i · (alpha_i / r_i) · B_i A_i x.
// The nesting shows in the names: with two adapters the base weight is
// `qkv.linear.linear.weight`, the first adapter's `qkv.linear.lora_A`, the second's
// `qkv.lora_A`; each adapter's file (plain `qkv.lora_A`) is mapped onto its level.
#ifndef LGPT_PEFT_PEFT_CHECKPOINT_H_
#define LGPT_PEFT_PEFT_CHECKPOINT_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/config/config.h"
#include "core/io/tensor_map.h"
#include "core/model/checkpoint.h"
#include "core/model/gpt.h"
#include "core/model/model_parts.h"
#include "core/nn/linear_factory.h"
#include "peft/multi_lora.h"
#include "peft/peft_method.h"

namespace lgpt {

// lit_model.pth.lora, lit_model.pth.adapter, lit_model.pth.adapter_v2; lit_model.pth (full).
std::string TrainedFileName(PeftMethod method);

// Which fine-tune `dir` holds: the method of its lit_model.pth.<method> file; nullopt for a
// plain checkpoint, and for a merged LoRA fine-tune (lit_model.pth or model.safetensors
// beside lit_model.pth.lora, as merge_lora leaves it), which loads as plain. NotFound when
// `dir` is not a directory; InvalidArgument, naming the files, when it holds several
// trained files, or full weights beside an adapter file (adapters do not merge).
absl::StatusOr<std::optional<PeftMethod>> PeftMethodOfDir(const std::string& dir);

// The base checkpoint of fine-tune `dir`: hyperparameters.yaml's checkpoint_dir. A relative
// path is taken from the current directory (LitGPT writes it so), else from `dir`'s parent;
// NotFound, saying where it looked, when neither is a directory.
absl::StatusOr<std::string> BaseDirFromHyperparameters(const std::string& dir);

// OK when `config` describes the same model as `base` in every field but the PEFT ones
// (lora_*, adapter_*); else InvalidArgument naming the first differing model_config.yaml
// key and both values. `what` names `config`'s file in the message.
absl::Status CheckSameBaseModel(const Config& config, const Config& base, absl::string_view what);

// The parts of a `method` model for `config`'s PEFT fields, whose base projections come from
// `base` (null: dense; Int8LinearFactory: an int8 base). LoRA needs lora_r >= 1 and at least
// one enabled projection; the adapters split their prefix projection as LitGPT does
// (legacy_qkv_split, peft/adapter.h). kFull: the base model's parts.
absl::StatusOr<ModelParts> PeftModelParts(const Config& config, PeftMethod method,
                                          std::shared_ptr<const LinearFactory> base = nullptr);

// Copies base-checkpoint tensors (plain LitGPT names) into a PEFT model, mapping x.weight to
// x.linear.weight (x.linear.linear.weight, ... for stacked adapters). Every parameter the
// method does not add must be present; tensors the model lacks are errors. With
// `check_finite`, NaN or infinity is refused (CheckFinite); with `adopt_storage`, tensors of
// the model's dtype and device become its storage (LoadStateDict).
absl::Status LoadBaseWeights(GPTImpl& model, const TensorMap& base, const std::string& source,
                             bool check_finite = true, bool adopt_storage = false);

// One LoRA adapter to apply at load time.
struct LoraAdapterSpec {
  std::string dir;     // a LoRA fine-tune: lit_model.pth.lora and model_config.yaml
  double scale = 1.0;  // weight of its update, finite and >= 0 (0: no effect)
};

// InvalidArgument naming `field`[i].dir or `field`[i].scale, and carrying `field`, for an
// empty dir or a scale that is negative, NaN or infinite.
absl::Status ValidateLoraAdapterSpecs(const std::vector<LoraAdapterSpec>& loras,
                                      absl::string_view field);

// Loads fine-tune `dir` of `method` (kLora, kAdapter, kAdapterV2) over `base_dir` (empty:
// BaseDirFromHyperparameters); kFull loads `dir` as a whole checkpoint. `dir`'s
// model_config.yaml must match the base's (CheckSameBaseModel). The options apply as in
// LoadCheckpoint; options.parts.linear_factory, when set, makes the base projections under
// the PEFT ones (Int8ModelParts().linear_factory: an int8 base to quantise after loading),
// and its attention extensions join the method's. The model is in eval mode.
absl::StatusOr<LoadedModel> LoadPeftCheckpoint(const std::string& dir, PeftMethod method,
                                               const LoadOptions& options = {},
                                               std::string base_dir = "");

// The one loader of tools and Engine::Load: any checkpoint directory, plain or fine-tune
// (PeftMethodOfDir), with `loras` applied on top, unmerged, in order. A LoRA fine-tune as
// `checkpoint_dir` is the first adapter (scale 1) over its base, and `loras` stack on it;
// `loras` over an adapter fine-tune are refused. Each adapter's model_config.yaml must match
// the base's but for the lora_* fields, and its file the shapes those fields give. Errors name
// the adapter as `loras_field`[i] with its directory and carry `loras_field` as their field
// (core/base/status_field.h). Without PEFT this is LoadCheckpoint.
absl::StatusOr<LoadedModel> LoadModelWithPeft(const std::string& checkpoint_dir,
                                              const std::vector<LoraAdapterSpec>& loras = {},
                                              const LoadOptions& options = {},
                                              absl::string_view loras_field = "loras");

// One adapter of a multi-adapter model: the name requests pick it by, and its LoRA fine-tune.
struct NamedLoraAdapter {
  std::string name;  // non-empty, unique among the model's adapters
  LoraAdapterSpec lora;
};

// A base model serving LoRA adapters per request (peft/multi_lora.h): slot k is the k-th
// adapter given to LoadMultiLoraModel.
struct MultiLoraModel {
  LoadedModel loaded;
  std::vector<std::string> adapter_names;  // by slot

  // The slot of adapter `name`, for SequenceChunk.adapter / ForwardOptions.adapters; -1 for
  // the empty name (the base model); NotFound, listing the names, otherwise.
  absl::StatusOr<int64_t> AdapterSlot(absl::string_view name) const {
    return AdapterSlotByName(adapter_names, name);
  }
};

// Loads plain checkpoint `base_dir` with `adapters` (LoRA fine-tune directories: lit_model.pth.lora
// and model_config.yaml) as per-request slots, adapter k in slot k with its scale. Each
// adapter's model_config.yaml must match the base's but for the lora_* fields, and its file
// the shapes those fields give; adapters may differ in rank, alpha and targets. Errors about
// an adapter name it as `adapters_field`[k] with its name and directory and carry
// `adapters_field` (core/base/status_field.h). options.parts.linear_factory makes the base
// projections (QuantizedModelParts(kInt8 / kInt4).linear_factory: quantise with
// QuantizeModel after loading); tensor parallelism is Unimplemented. The model is in eval
// mode.
absl::StatusOr<MultiLoraModel> LoadMultiLoraModel(const std::string& base_dir,
                                                  const std::vector<NamedLoraAdapter>& adapters,
                                                  const LoadOptions& options = {},
                                                  absl::string_view adapters_field = "adapters");

// Where a checkpoint's side files (tokenizer, prompt style) are looked for, in order: `dir`,
// then, for a fine-tune directory, its base (a fine-tune may hold no tokenizer of its own).
std::vector<std::string> CheckpointFileDirs(const std::string& dir);

}  // namespace lgpt

#endif  // LGPT_PEFT_PEFT_CHECKPOINT_H_
