// A LitGPT checkpoint directory with freshly initialised weights, for benchmarks and smoke
// tests of a model shape without downloading or training one:
//   ./lgpt init_checkpoint --model_config=FILE.yaml | --model_name=PRESET --out_dir=DIR
//       [--seed=42] [--precision=32-true] [--tokenizer_dir=DIR]
// Writes model_config.yaml and lit_model.pth (the model's own initialisation, as pretrain
// starts from, seeded by --seed; float32 unless --precision says otherwise) and copies the
// tokenizer files of --tokenizer_dir, as one transaction (core/base/output_dir): a killed run
// leaves DIR as it was. The weights are random: the speed and memory of the shape are real,
// the text is not (bench_serve feeds random token ids and needs no tokenizer).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "core/base/output_dir.h"
#include "core/config/config.h"
#include "core/config/config_presets.h"
#include "core/io/torch_pickle_writer.h"
#include "core/model/gpt.h"
#include "core/model/state_dict.h"
#include "tools/model_memory.h"
#include "tools/tool_util.h"

ABSL_FLAG(std::string, model_config, "", "model_config.yaml of the model");
ABSL_FLAG(std::string, model_name, "", "or: a LitGPT preset name");
ABSL_FLAG(std::string, out_dir, "", "checkpoint directory to write");
ABSL_FLAG(uint64_t, seed, 42, "seed of the initialisation");
ABSL_FLAG(std::string, precision, "32-true",
          "dtype of the saved weights (32-true, bf16-true, ...)");
ABSL_FLAG(std::string, tokenizer_dir, "",
          "checkpoint whose tokenizer files are copied; empty: none");

namespace lgpt {
namespace {

Config ConfigFromFlags() {
  const std::string file = absl::GetFlag(FLAGS_model_config);
  const std::string name = absl::GetFlag(FLAGS_model_name);
  if (file.empty() == name.empty()) {
    Die(absl::InvalidArgumentError("pass exactly one of --model_config and --model_name"));
  }
  return file.empty() ? ValueOrDie(ConfigFromName(name))
                      : ValueOrDie(LoadConfigFile(ResolvePath(file)));
}

}  // namespace
}  // namespace lgpt

int main(int argc, char** argv) {
  using namespace lgpt;
  namespace fs = std::filesystem;
  InitTool(argc, argv,
           "init_checkpoint --model_config=FILE|--model_name=PRESET --out_dir=DIR [--seed=N] "
           "[--precision=32-true] [--tokenizer_dir=DIR]");
  const std::string out_dir = ResolvePath(absl::GetFlag(FLAGS_out_dir));
  if (out_dir.empty()) Die(absl::InvalidArgumentError("--out_dir is required"));
  const Config config = ConfigFromFlags();
  const c10::ScalarType dtype = ValueOrDie(ParsePrecision(absl::GetFlag(FLAGS_precision)));
  const std::string tokenizer_dir = ResolvePath(absl::GetFlag(FLAGS_tokenizer_dir));
  if (!tokenizer_dir.empty() && !fs::exists(fs::path(tokenizer_dir) / "tokenizer.model") &&
      !fs::exists(fs::path(tokenizer_dir) / "tokenizer.json")) {
    Die(absl::NotFoundError(absl::StrCat("--tokenizer_dir ", tokenizer_dir,
                                         " holds no tokenizer.model or tokenizer.json")));
  }
  DieIfError(OutputDir::Check(out_dir, {tokenizer_dir}));

  // The float32 weights, plus their copy in a narrower save dtype.
  DieIfError(CheckParametersFitMemory(
      config, 4 + (dtype == at::kFloat ? 0 : c10::elementSize(dtype)), "initialising them"));
  const int64_t parameters = ValueOrDie(CountParameters(config));
  at::manual_seed(absl::GetFlag(FLAGS_seed));
  const std::shared_ptr<GPTImpl> model = ValueOrDie(GPTImpl::Create(config));
  TensorMap tensors;
  for (const auto& [name, tensor] : StateDict(*model)) {
    tensors[name] = tensor.detach().to(dtype).contiguous();
  }

  OutputDirOptions options;
  // A model.safetensors left from an earlier checkpoint would shadow the new lit_model.pth.
  options.drop = {"model.safetensors"};
  const std::unique_ptr<OutputDir> out =
      ValueOrDie(OutputDir::Begin(out_dir, {tokenizer_dir}, options));
  DieIfError(WriteTorchStateDict(out->Path("lit_model.pth"), tensors));
  DieIfError(out->WriteFile("model_config.yaml", ConfigToYaml(config)));
  if (!tokenizer_dir.empty()) {
    DieIfError(CopyPresentFiles(tokenizer_dir, kTokenizerFiles, *out).status());
  }
  DieIfError(out->Commit());
  std::printf("wrote %s: %s, %lld parameters (%s), seed %llu\n", out_dir.c_str(),
              config.name.c_str(), static_cast<long long>(parameters),
              absl::GetFlag(FLAGS_precision).c_str(),
              static_cast<unsigned long long>(absl::GetFlag(FLAGS_seed)));
  return 0;
}
