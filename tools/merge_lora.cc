// Merges a LoRA fine-tune into a plain base checkpoint, as LitGPT's merge_lora:
//   bazel run //tools:merge_lora -- --checkpoint_dir=DIR [--pretrained_checkpoint_dir=BASE]
//       [--out_dir=DIR]
// DIR holds lit_model.pth.lora and model_config.yaml (with the lora_* fields), as
// //tools:finetune writes it; the base comes from --pretrained_checkpoint_dir or else
// hyperparameters.yaml's checkpoint_dir. Tools and Engine::Load also use DIR as it is, unmerged
// (peft/peft_checkpoint.h); merging makes a plain checkpoint for other programs and saves
// the LoRA branch's cost per token. By default (as LitGPT) DIR gets lit_model.pth with
// W + scaling · B·A in every LoRA projection and nothing else changes, so DIR loads as a
// plain model and merges again. With --out_dir, that directory gets a whole plain checkpoint
// (model_config.yaml without the LoRA fields, tokenizer and prompt-style files), written as
// one transaction; it may not be the base checkpoint.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <system_error>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "core/config/config.h"
#include "core/base/output_dir.h"
#include "core/io/torch_pickle_writer.h"
#include "peft/peft_checkpoint.h"
#include "tools/finetune_model.h"
#include "tools/load_flags.h"
#include "tools/tool_util.h"

ABSL_FLAG(std::string, checkpoint_dir, "", "fine-tuned directory with lit_model.pth.lora");
ABSL_FLAG(std::string, pretrained_checkpoint_dir, "",
          "base checkpoint; empty: hyperparameters.yaml's checkpoint_dir");
ABSL_FLAG(std::string, out_dir, "", "output directory; empty: --checkpoint_dir");

int main(int argc, char** argv) {
  using namespace lgpt;
  namespace fs = std::filesystem;
  InitTool(argc, argv,
           "merge_lora --checkpoint_dir=DIR [--pretrained_checkpoint_dir=BASE] [--out_dir=DIR]");
  const std::string dir = ResolvePath(absl::GetFlag(FLAGS_checkpoint_dir));
  if (dir.empty()) Die(absl::InvalidArgumentError("--checkpoint_dir is required"));
  std::string base_dir = ResolvePath(absl::GetFlag(FLAGS_pretrained_checkpoint_dir));
  const std::string lora_file = dir + "/" + TrainedFileName(PeftMethod::kLora);
  if (!fs::is_regular_file(lora_file)) {
    Die(absl::NotFoundError(absl::StrCat(dir, ": no ", TrainedFileName(PeftMethod::kLora))));
  }
  if (base_dir.empty()) base_dir = ValueOrDie(BaseDirFromHyperparameters(dir));
  // The default (LitGPT's): lit_model.pth beside the LoRA files, which stay as they are, so the
  // directory loads as a plain model (lora_* fields are ignored then) and merges again.
  // Elsewhere: a whole plain checkpoint, written as one transaction; never into the base.
  std::string out_dir = ResolvePath(absl::GetFlag(FLAGS_out_dir));
  std::error_code same_error;
  const bool beside = out_dir.empty() || fs::equivalent(out_dir, dir, same_error);
  if (!beside) {
    DieIfError(OutputDir::Check(out_dir, {dir, base_dir}));
  } else {
    out_dir = dir;
    if (fs::exists(dir + "/model.safetensors")) {
      Die(absl::FailedPreconditionError(absl::StrCat(
          dir,
          " holds model.safetensors, which loaders prefer to the lit_model.pth a merge "
          "writes: pass --out_dir")));
    }
  }
  LoadOptions load;
  load.verify_checksums = VerifyChecksumsFlag();
  LoadedModel loaded = ValueOrDie(LoadPeftCheckpoint(dir, PeftMethod::kLora, load, base_dir));
  const TensorMap merged = ValueOrDie(MergedStateDict(*loaded.model, PeftMethod::kLora));
  if (beside) {
    DieIfError(WriteTorchStateDict(dir + "/lit_model.pth", merged));
  } else {
    OutputDirOptions options;
    options.drop = {"model.safetensors", "lit_model.pth", "lit_model.pth.lora",
                    "hyperparameters.yaml"};
    const std::unique_ptr<OutputDir> out =
        ValueOrDie(OutputDir::Begin(out_dir, {dir, base_dir}, options));
    DieIfError(WriteTorchStateDict(out->Path("lit_model.pth"), merged));
    Config plain = loaded.config;
    plain.lora_r = 0;
    plain.lora_alpha = 1;
    plain.lora_dropout = 0;
    plain.lora_query = plain.lora_key = plain.lora_value = false;
    plain.lora_projection = plain.lora_mlp = plain.lora_head = false;
    DieIfError(out->WriteFile("model_config.yaml", ConfigToYaml(plain)));
    DieIfError(CopyPresentFiles(dir, kTokenizerFiles, *out).status());
    DieIfError(CopyPresentFiles(dir, {"prompt_style.yaml"}, *out).status());
    DieIfError(out->Commit());
  }
  std::fprintf(stderr, "merged %zu tensors into %s/lit_model.pth\n", merged.size(),
               out_dir.c_str());
  return 0;
}
