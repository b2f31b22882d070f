// The model side of fine-tuning: which parameters each method (LoRA, LLaMA-Adapter,
// Adapter v2, full) trains, building the model on a base checkpoint, and LitGPT's file
// layout for the result (lit_model.pth.lora / .adapter / .adapter_v2 with LitGPT's names,
// model_config.yaml with the PEFT fields, hyperparameters.yaml naming the base).
#ifndef LGPT_TOOLS_FINETUNE_MODEL_H_
#define LGPT_TOOLS_FINETUNE_MODEL_H_

#include <c10/core/ScalarType.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/config/config.h"
#include "core/model/checkpoint.h"
#include "core/model/gpt.h"
#include "core/io/tensor_map.h"
#include "peft/peft_method.h"

namespace lgpt {

// lit_model.pth.lora, lit_model.pth.adapter, lit_model.pth.adapter_v2; lit_model.pth (full).
std::string TrainedFileName(PeftMethod method);

// A model of the method's architecture for `config` (its lora_* / adapter_* fields). The
// adapters split their prefix projection as LitGPT does (legacy_qkv_split, peft/adapter.h).
// `int8_base` (LoRA only): the base projections are int8 projections (Int8LinearFactory
// under LoraLinearFactory), to be quantised by QuantizeModelInt8 after the base weights load.
absl::StatusOr<GPT> CreateFinetuneModel(const Config& config, PeftMethod method,
                                        bool int8_base = false);

// Copies base-checkpoint tensors (plain LitGPT names) into the model, mapping x.weight to
// x.linear.weight where the method wraps linears. Every parameter the method does not add
// must be present; tensors the model lacks are errors.
absl::Status LoadBaseWeights(GPTImpl& model, const TensorMap& base, const std::string& source);

// What the method saves: its parameters under LitGPT's names, detached, on the CPU.
TensorMap TrainedStateDict(GPTImpl& model, PeftMethod method);

// A plain base-model state dict: LoRA merged in, or the full model. Unimplemented for the
// adapters (their prefix has no place in the base model).
absl::StatusOr<TensorMap> MergedStateDict(GPTImpl& model, PeftMethod method);

// Loads a fine-tuned directory: model_config.yaml (with the PEFT fields), the base weights of
// `base_dir` (empty: hyperparameters.yaml's checkpoint_dir) and the trained file on top.
// The model is in eval mode. `verify_checksums`: as LoadOptions::verify_checksums, for both
// files.
absl::StatusOr<LoadedModel> LoadFinetuned(const std::string& dir, PeftMethod method,
                                          std::string base_dir = "",
                                          c10::ScalarType dtype = c10::kFloat,
                                          bool verify_checksums = true);

// hyperparameters.yaml's checkpoint_dir (LitGPT writes it for merge_lora).
absl::StatusOr<std::string> BaseDirFromHyperparameters(const std::string& dir);

}  // namespace lgpt

#endif  // LGPT_TOOLS_FINETUNE_MODEL_H_
