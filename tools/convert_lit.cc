// Converts a LitGPT checkpoint directory into a Hugging Face Transformers one, as LitGPT's
// convert_lit_checkpoint.py does (but writing config.json and safetensors):
//   bazel run //tools:convert_lit -- --checkpoint_dir=DIR --out_dir=DIR [--max_shard_mb=N]
//       [--dtype=float32|bfloat16|float16]
// Writes config.json, model.safetensors (or shards of at most N MB with
// model.safetensors.index.json) and copies the tokenizer files. lm_head.weight is left out
// (tie_word_embeddings: true) when it equals the embedding. Prints statistics on stderr.
#include <chrono>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/convert/hf_checkpoint.h"
#include "tools/load_flags.h"
#include "tools/tool_util.h"

ABSL_FLAG(std::string, checkpoint_dir, "", "LitGPT checkpoint directory");
ABSL_FLAG(std::string, out_dir, "", "Hugging Face checkpoint directory to write");
ABSL_FLAG(int64_t, max_shard_mb, 0, "split the weights into shards of at most this size");
ABSL_FLAG(std::string, dtype, "", "float32, bfloat16 or float16 (default: keep the checkpoint's)");

int main(int argc, char** argv) {
  using namespace lgpt;
  InitTool(argc, argv,
           "convert_lit --checkpoint_dir=DIR --out_dir=DIR [--max_shard_mb=N] [--dtype=bfloat16]");
  const std::string checkpoint_dir = ResolvePath(absl::GetFlag(FLAGS_checkpoint_dir));
  const std::string out_dir = ResolvePath(absl::GetFlag(FLAGS_out_dir));
  if (checkpoint_dir.empty()) Die(absl::InvalidArgumentError("--checkpoint_dir is required"));
  if (out_dir.empty()) Die(absl::InvalidArgumentError("--out_dir is required"));
  if (absl::GetFlag(FLAGS_max_shard_mb) < 0) {
    Die(absl::InvalidArgumentError("--max_shard_mb must not be negative"));
  }
  ConvertOptions options;
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype == "float32") {
    options.dtype = c10::kFloat;
  } else if (dtype == "bfloat16") {
    options.dtype = c10::kBFloat16;
  } else if (dtype == "float16") {
    options.dtype = c10::kHalf;
  } else if (!dtype.empty()) {
    Die(absl::InvalidArgumentError(
        absl::StrCat("--dtype must be float32, bfloat16 or float16, not '", dtype, "'")));
  }
  options.max_shard_bytes = absl::GetFlag(FLAGS_max_shard_mb) * 1000 * 1000;
  options.progress = PrintProgress;
  options.verify_checksums = VerifyChecksumsFlag();
  const auto start = std::chrono::steady_clock::now();
  const ConvertResult result = ValueOrDie(ConvertLitCheckpoint(checkpoint_dir, out_dir, options));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(
      stderr, "converted %s: %lld tensors, %.1f MB in %.2f s, peak RSS %.1f MB; wrote %s to %s\n",
      result.config.name.c_str(), static_cast<long long>(result.tensors), result.bytes / 1e6,
      seconds, PeakRssBytes() / 1e6, absl::StrJoin(result.written, ", ").c_str(), out_dir.c_str());
  return 0;
}
