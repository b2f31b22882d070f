// --lora=DIR[:SCALE]: LoRA fine-tunes applied at load time without merging (llama.cpp's
// --lora / --lora-scaled), for every tool that loads a checkpoint. Repeatable, and each
// value may list several adapters separated by commas; they stack in order.
#ifndef LGPT_TOOLS_PEFT_FLAGS_H_
#define LGPT_TOOLS_PEFT_FLAGS_H_

#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "peft/peft_checkpoint.h"

ABSL_DECLARE_FLAG(std::vector<std::string>, lora);

namespace lgpt {

// "DIR" or "DIR:SCALE" (the text after the last ':' is the scale, so a directory whose name
// holds ':' takes an explicit scale: "a:b:1"); DIR as ResolvePath gives it. InvalidArgument
// naming --lora for an empty directory or a scale that is not a finite number >= 0.
absl::StatusOr<LoraAdapterSpec> ParseLoraFlag(absl::string_view text);

// Every --lora of the command line, in order. absl keeps only the last occurrence of a
// flag, so argv is scanned (--lora=V, -lora=V, --lora V; up to a bare "--"); the flag's own
// value serves when argv names none (a --flagfile).
absl::StatusOr<std::vector<LoraAdapterSpec>> LoraFlags(int argc, char** argv);

// `serve`'s --lora values: "NAME=DIR[:SCALE]" serves the fine-tune per request under NAME (a
// request's `model`; EngineOptions.adapters), "DIR[:SCALE]" applies it to every request
// (EngineOptions.loras). InvalidArgument naming --lora for an empty name or directory.
struct ServeLoraFlags {
  std::vector<LoraAdapterSpec> loras;
  std::vector<NamedLoraAdapter> adapters;
};
absl::StatusOr<ServeLoraFlags> ServeLoras(int argc, char** argv);

// The directories a tool reads its model from: the checkpoint and each LoRA fine-tune (what
// its outputs must stay out of).
std::vector<std::string> ModelInputDirs(const std::string& checkpoint_dir,
                                        const std::vector<LoraAdapterSpec>& loras);

}  // namespace lgpt

#endif  // LGPT_TOOLS_PEFT_FLAGS_H_
