// Writes the logits of one full forward pass over given token ids as a NumPy file:
//   bazel run //tools:score -- --checkpoint_dir=DIR --token_ids=1,2,3 --logits_out=FILE.npy
// (--tp=N: tensor parallel over N ranks; rank 0 writes the file)
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cstdio>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "core/base/device.h"
#include "core/base/output_dir.h"
#include "core/io/npy.h"
#include "core/model/checkpoint.h"
#include "tools/load_flags.h"
#include "tools/peft_flags.h"
#include "tools/tool_util.h"
#include "tools/tp_flags.h"

ABSL_FLAG(std::string, checkpoint_dir, "",
          "LitGPT checkpoint directory, or a fine-tune directory (finetune's --out_dir)");
ABSL_FLAG(std::string, token_ids, "", "comma-separated token ids, e.g. 1,2,3");
ABSL_FLAG(std::string, logits_out, "", "output .npy file: float32 [T, padded_vocab_size]");
ABSL_FLAG(std::string, precision, "32-true", "32-true, bf16-true or 16-true");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda[:N]");

int main(int argc, char** argv) {
  using namespace lgpt;
  InitTool(argc, argv, "score --checkpoint_dir=DIR --token_ids=1,2,3 --logits_out=FILE.npy");
  const std::string checkpoint_dir = ResolvePath(absl::GetFlag(FLAGS_checkpoint_dir));
  const std::string out = ResolvePath(absl::GetFlag(FLAGS_logits_out));
  if (checkpoint_dir.empty()) Die(absl::InvalidArgumentError("--checkpoint_dir is required"));
  if (out.empty()) Die(absl::InvalidArgumentError("--logits_out is required"));
  const std::vector<int64_t> ids =
      ValueOrDie(ParseIds(absl::GetFlag(FLAGS_token_ids), "token_ids"));
  const std::vector<LoraAdapterSpec> loras = ValueOrDie(LoraFlags(argc, argv));
  // --logits_out=DIR/model.safetensors replaced the checkpoint's weights with the logits.
  DieIfError(CheckOutputFile(out, ModelInputDirs(checkpoint_dir, loras)));
  if (std::optional<int> code = ValueOrDie(LaunchTensorParallel(argc, argv))) return *code;

  LoadOptions options;
  options.dtype = ValueOrDie(ParsePrecision(absl::GetFlag(FLAGS_precision)));
  options.device = ValueOrDie(ParseDevice(absl::GetFlag(FLAGS_device)));
  options.progress = PrintProgress;
  ApplyLoadFlags(options);
  options.tensor_parallel = ValueOrDie(JoinTensorParallel(options.device));
  LoadedModel loaded = ValueOrDie(LoadModelWithPeft(checkpoint_dir, loras, options, "--lora"));
  if (static_cast<int64_t>(ids.size()) > loaded.config.block_size) {
    Die(absl::InvalidArgumentError(
        absl::StrCat(ids.size(), " tokens exceed the context of ", loaded.config.block_size)));
  }
  at::NoGradGuard no_grad;
  const at::Tensor tokens = at::tensor(ids, at::kLong).unsqueeze(0);
  const at::Tensor logits = ValueOrDie(loaded.model->Forward(tokens));
  if (!at::isfinite(logits).all().item<bool>()) {
    Die(absl::FailedPreconditionError(
        "the model's logits are not finite (NaN or infinity): its activations overflowed"));
  }
  // Every rank holds the whole (replicated-head) logits; rank 0 writes them.
  if (options.tensor_parallel && options.tensor_parallel->rank() != 0) return 0;
  DieIfError(WriteNpy(out, logits.squeeze(0).to(at::kCPU, at::kFloat).contiguous()));
  std::fprintf(stderr, "wrote logits [%zu, %lld] to %s\n", ids.size(),
               static_cast<long long>(logits.size(-1)), out.c_str());
  return 0;
}
