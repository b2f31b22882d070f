// Merges a LoRA fine-tune into a plain base checkpoint, as LitGPT's merge_lora:
//   bazel run //tools:merge_lora -- --checkpoint_dir=DIR [--pretrained_checkpoint_dir=BASE]
//       [--out_dir=DIR]
// DIR holds lit_model.pth.lora and model_config.yaml (with the lora_* fields), as
// //tools:finetune writes it; the base comes from --pretrained_checkpoint_dir or else
// hyperparameters.yaml's checkpoint_dir. out_dir (default: DIR) gets lit_model.pth with
// W + scaling · B·A in every LoRA projection, a model_config.yaml without the LoRA fields,
// and the tokenizer and prompt-style files, so //tools:generate loads it.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/torch_pickle_writer.h"
#include "tools/finetune_model.h"
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
  std::string out_dir = ResolvePath(absl::GetFlag(FLAGS_out_dir));
  if (out_dir.empty()) out_dir = dir;
  const std::string lora_file = dir + "/" + TrainedFileName(FinetuneMethod::kLora);
  if (!fs::is_regular_file(lora_file)) {
    Die(absl::NotFoundError(absl::StrCat(dir, ": no ", TrainedFileName(FinetuneMethod::kLora))));
  }
  LoadedModel loaded = ValueOrDie(LoadFinetuned(
      dir, FinetuneMethod::kLora, ResolvePath(absl::GetFlag(FLAGS_pretrained_checkpoint_dir))));
  const TensorMap merged = ValueOrDie(MergedStateDict(*loaded.model, FinetuneMethod::kLora));

  std::error_code error;
  fs::create_directories(out_dir, error);
  if (error)
    Die(absl::InternalError(absl::StrCat("cannot create ", out_dir, ": ", error.message())));
  DieIfError(WriteTorchStateDict(out_dir + "/lit_model.pth", merged));
  Config plain = loaded.config;
  plain.lora_r = 0;
  plain.lora_alpha = 1;
  plain.lora_dropout = 0;
  plain.lora_query = plain.lora_key = plain.lora_value = false;
  plain.lora_projection = plain.lora_mlp = plain.lora_head = false;
  {
    std::ofstream out(out_dir + "/model_config.yaml", std::ios::binary);
    out << ConfigToYaml(plain);
    if (!out)
      Die(absl::InternalError(absl::StrCat("cannot write ", out_dir, "/model_config.yaml")));
  }
  if (fs::absolute(out_dir) != fs::absolute(dir)) {
    for (const char* name :
         {"tokenizer.model", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
          "special_tokens_map.json", "prompt_style.yaml"}) {
      const fs::path from = fs::path(dir) / name;
      if (!fs::exists(from)) continue;
      fs::copy_file(from, fs::path(out_dir) / name, fs::copy_options::overwrite_existing, error);
      if (error) Die(absl::InternalError(absl::StrCat("cannot copy ", from.string())));
    }
  }
  std::fprintf(stderr, "merged %zu tensors into %s/lit_model.pth\n", merged.size(), out_dir.c_str());
  return 0;
}
