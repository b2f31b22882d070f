// Quantises a checkpoint once and saves it, so later runs load the small file directly:
//
//   bazel run //tools:quantize -- --checkpoint_dir=DIR --quantize=int4 --out_dir=OUT
//
// OUT gets model.quantized.safetensors (format in core/model/quantized_checkpoint.h),
// model_config.yaml and the tokenizer files, written as one transaction. Every tool and
// Engine::Load then take OUT like any checkpoint directory (--quantize may be left out, or
// must name the stored format). PEFT fine-tunes: merge them first (merge_lora).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "core/base/output_dir.h"
#include "core/config/config.h"
#include "core/model/checkpoint.h"
#include "core/model/quantize_model.h"
#include "core/model/quantized_checkpoint.h"
#include "tools/load_flags.h"
#include "tools/tool_util.h"

ABSL_FLAG(std::string, checkpoint_dir, "", "float checkpoint to quantise");
ABSL_FLAG(std::string, quantize, "int8", "int8 (q8_0 blocks) or int4 (q4_0 blocks)");
ABSL_FLAG(std::string, out_dir, "", "output directory (not the input)");

int main(int argc, char** argv) {
  using namespace lgpt;
  namespace fs = std::filesystem;
  InitTool(argc, argv, "quantize --checkpoint_dir=DIR --quantize=int8|int4 --out_dir=OUT");
  const std::string dir = ResolvePath(absl::GetFlag(FLAGS_checkpoint_dir));
  if (dir.empty()) Die(absl::InvalidArgumentError("--checkpoint_dir is required"));
  const std::string out_dir = ResolvePath(absl::GetFlag(FLAGS_out_dir));
  if (out_dir.empty()) Die(absl::InvalidArgumentError("--out_dir is required"));
  const absl::StatusOr<WeightQuantization> quantization =
      ParseWeightQuantization(absl::GetFlag(FLAGS_quantize));
  if (!quantization.ok() || *quantization == WeightQuantization::kNone) {
    Die(absl::InvalidArgumentError(absl::StrCat("--quantize must be int8 or int4, got '",
                                                absl::GetFlag(FLAGS_quantize), "'")));
  }
  DieIfError(OutputDir::Check(out_dir, {dir}));
  if (fs::exists(fs::path(dir) / kQuantizedWeightsFile)) {
    Die(absl::InvalidArgumentError(
        absl::StrCat(dir, " is already quantised (", kQuantizedWeightsFile, ")")));
  }

  const auto start = std::chrono::steady_clock::now();
  LoadOptions load;
  ApplyLoadFlags(load);
  load.parts = QuantizedModelParts(*quantization);
  LoadedModel loaded = ValueOrDie(LoadCheckpoint(dir, load));
  const int64_t float_bytes = [&] {
    int64_t bytes = 0;
    for (const at::Tensor& p : loaded.model->parameters()) bytes += p.numel() * 4;
    return bytes;
  }();
  DieIfError(QuantizeModel(*loaded.model));

  OutputDirOptions options;
  options.drop = {"model.safetensors", "lit_model.pth", "lit_model.pth.lora",
                  "hyperparameters.yaml"};
  const std::unique_ptr<OutputDir> out = ValueOrDie(OutputDir::Begin(out_dir, {dir}, options));
  DieIfError(SaveQuantizedCheckpoint(*loaded.model, out->Path(kQuantizedWeightsFile)));
  DieIfError(out->WriteFile("model_config.yaml", ConfigToYaml(loaded.config)));
  DieIfError(CopyPresentFiles(dir, kTokenizerFiles, *out).status());
  DieIfError(CopyPresentFiles(dir, {"prompt_style.yaml", "train_config.yaml"}, *out).status());
  DieIfError(out->Commit());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto file_bytes = fs::file_size(fs::path(out_dir) / kQuantizedWeightsFile);
  std::printf("quantised %s to %s in %.1f s: %s/%s\n", dir.c_str(),
              WeightQuantizationName(*quantization), seconds, out_dir.c_str(),
              kQuantizedWeightsFile);
  std::printf("weights_bytes=%lld float32_bytes=%lld ratio=%.3f\n",
              static_cast<long long>(file_bytes), static_cast<long long>(float_bytes),
              static_cast<double>(file_bytes) / static_cast<double>(float_bytes));
  return 0;
}
