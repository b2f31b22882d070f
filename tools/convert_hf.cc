// Converts a Hugging Face Transformers checkpoint directory into a LitGPT one, as LitGPT's
// convert_hf_checkpoint.py does:
//   bazel run //tools:convert_hf -- --hf_dir=DIR --out_dir=DIR [--model_name=NAME]
//       [--model_config=FILE.yaml] [--dtype=float32|bfloat16|float16] [--safetensors]
// Derives the config from config.json (a preset, --model_name or the one named like the model,
// only fills what config.json leaves out; the fields where config.json overrides the preset are
// printed) and reads model.safetensors, pytorch_model.bin or their shards;
// writes model_config.yaml, lit_model.pth (and model.safetensors with --safetensors) and
// copies the tokenizer files. Prints statistics (tensors, bytes, seconds, peak RSS) on stderr.
#include <chrono>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/convert/hf_checkpoint.h"
#include "tools/load_flags.h"
#include "tools/tool_util.h"

ABSL_FLAG(std::string, hf_dir, "", "Hugging Face checkpoint directory (config.json + weights)");
ABSL_FLAG(std::string, out_dir, "", "LitGPT checkpoint directory to write (may equal --hf_dir)");
ABSL_FLAG(std::string, model_name, "",
          "LitGPT preset filling what config.json does not state (default: the preset named like "
          "the model, if any; config.json alone suffices)");
ABSL_FLAG(std::string, model_config, "",
          "LitGPT model_config.yaml to use instead of a preset (models that are no preset)");
ABSL_FLAG(std::string, dtype, "", "float32, bfloat16 or float16 (default: keep the checkpoint's)");
ABSL_FLAG(bool, safetensors, false, "also write model.safetensors");
ABSL_FLAG(bool, in_place, false,
          "allow --out_dir to be --hf_dir (LitGPT's layout: the LitGPT files beside the HF ones)");

namespace lgpt {

absl::StatusOr<c10::ScalarType> ParseDtype(const std::string& name) {
  if (name == "float32") return c10::kFloat;
  if (name == "bfloat16") return c10::kBFloat16;
  if (name == "float16") return c10::kHalf;
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype must be float32, bfloat16 or float16, not '", name, "'"));
}

}  // namespace lgpt

int main(int argc, char** argv) {
  using namespace lgpt;
  InitTool(argc, argv,
           "convert_hf --hf_dir=DIR --out_dir=DIR [--model_name=NAME | --model_config=FILE.yaml] "
           "[--dtype=bfloat16] [--safetensors]");
  const std::string hf_dir = ResolvePath(absl::GetFlag(FLAGS_hf_dir));
  const std::string out_dir = ResolvePath(absl::GetFlag(FLAGS_out_dir));
  if (hf_dir.empty()) Die(absl::InvalidArgumentError("--hf_dir is required"));
  if (out_dir.empty()) Die(absl::InvalidArgumentError("--out_dir is required"));
  ConvertOptions options;
  options.model_name = absl::GetFlag(FLAGS_model_name);
  options.model_config = ResolvePath(absl::GetFlag(FLAGS_model_config));
  if (!absl::GetFlag(FLAGS_dtype).empty()) {
    options.dtype = ValueOrDie(ParseDtype(absl::GetFlag(FLAGS_dtype)));
  }
  options.write_safetensors = absl::GetFlag(FLAGS_safetensors);
  options.in_place = absl::GetFlag(FLAGS_in_place);
  options.progress = PrintProgress;
  options.verify_checksums = VerifyChecksumsFlag();
  const auto start = std::chrono::steady_clock::now();
  const ConvertResult result = ValueOrDie(ConvertHfCheckpoint(hf_dir, out_dir, options));
  if (!result.preset.empty()) {
    std::fprintf(stderr, "preset %s fills what config.json does not state\n",
                 result.preset.c_str());
  }
  for (const std::string& field : result.overridden) {
    std::fprintf(stderr, "config.json overrides %s\n", field.c_str());
  }
  for (const std::string& note : result.notes) std::fprintf(stderr, "note: %s\n", note.c_str());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(
      stderr, "converted %s: %lld tensors, %.1f MB in %.2f s, peak RSS %.1f MB; wrote %s to %s\n",
      result.config.name.c_str(), static_cast<long long>(result.tensors), result.bytes / 1e6,
      seconds, PeakRssBytes() / 1e6, absl::StrJoin(result.written, ", ").c_str(), out_dir.c_str());
  return 0;
}
