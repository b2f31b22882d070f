// The training side of fine-tuning: building the model of a method (LoRA, LLaMA-Adapter,
// Adapter v2, full) to train on a base checkpoint, and what it saves (the trained
// parameters under LitGPT's names, or a merged plain checkpoint). Loading fine-tunes,
// LitGPT's file layout included, is the library's: peft/peft_checkpoint.h.
#ifndef LGPT_TOOLS_FINETUNE_MODEL_H_
#define LGPT_TOOLS_FINETUNE_MODEL_H_

#include "absl/status/statusor.h"
#include "core/config/config.h"
#include "core/io/tensor_map.h"
#include "core/model/gpt.h"
#include "peft/peft_checkpoint.h"
#include "peft/peft_method.h"

namespace lgpt {

// A model of the method's architecture for `config` (its lora_* / adapter_* fields), see
// PeftModelParts. `int8_base` (LoRA only): the base projections are int8 projections
// (Int8LinearFactory under LoraLinearFactory), to be quantised by QuantizeModelInt8 after
// the base weights load (LoadBaseWeights).
absl::StatusOr<GPT> CreateFinetuneModel(const Config& config, PeftMethod method,
                                        bool int8_base = false);

// What the method saves: its parameters under LitGPT's names, detached, on the CPU.
TensorMap TrainedStateDict(GPTImpl& model, PeftMethod method);

// A plain base-model state dict: LoRA merged in, or the full model. Unimplemented for the
// adapters (their prefix has no place in the base model).
absl::StatusOr<TensorMap> MergedStateDict(GPTImpl& model, PeftMethod method);

}  // namespace lgpt

#endif  // LGPT_TOOLS_FINETUNE_MODEL_H_
