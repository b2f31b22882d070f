// Measures the memory that loading a checkpoint costs: peak RSS against the size of the
// weights file.
//   bazel run //tools:checkpoint_memory -- --write_preset=pythia-160m --n_layer=4 --out_dir=DIR
//     writes a random float32 model of that preset twice: DIR/safetensors (model.safetensors)
//     and DIR/pth (lit_model.pth), each with model_config.yaml.
//   bazel run //tools:checkpoint_memory -- --checkpoint_dir=DIR [--read_only]
//     loads DIR with LoadCheckpoint (float32, CPU), or with --read_only only reads the tensors
//     (ReadCheckpointTensors) and touches every byte, and prints
//     "file_bytes=... baseline_rss=... peak_rss=... ratio=..." (ratio = peak / file size;
//     baseline = peak RSS before loading). --adopt measures a zero-copy load instead: the
//     model's parameters become the memory-mapped tensors.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <sys/stat.h>

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "core/config/config_presets.h"
#include "core/model/checkpoint.h"
#include "core/model/gpt.h"
#include "core/io/safetensors.h"
#include "core/io/torch_pickle_writer.h"
#include "tools/load_flags.h"
#include "tools/tool_util.h"

ABSL_FLAG(std::string, checkpoint_dir, "", "checkpoint directory to load");
ABSL_FLAG(bool, read_only, false, "only read the tensors (no model)");
ABSL_FLAG(bool, adopt, false,
          "build the model and make its parameters the mapped tensors (set_data) instead of "
          "copying them, to measure what a zero-copy LoadCheckpoint would cost");
ABSL_FLAG(std::string, write_preset, "", "write a random model of this preset");
ABSL_FLAG(int64_t, n_layer, 0, "with --write_preset: number of layers (default: the preset's)");
ABSL_FLAG(std::string, out_dir, "", "with --write_preset: where to write");

namespace lgpt {
namespace {

int64_t FileBytes(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}

void WriteRandom(const std::string& preset, int64_t n_layer, const std::string& out_dir) {
  Config config = ValueOrDie(PresetFromName(preset));
  if (n_layer > 0) config.n_layer = n_layer;
  DieIfError(config.Finalize());
  GPT model = ValueOrDie(GPTImpl::Create(config));
  const TensorMap state = StateDict(*model);
  int64_t params = 0;
  for (const auto& [name, t] : state) params += t.numel();
  for (const char* sub : {"safetensors", "pth"}) {
    const std::string dir = absl::StrCat(out_dir, "/", sub);
    ::mkdir(out_dir.c_str(), 0755);
    ::mkdir(dir.c_str(), 0755);
    FILE* f = std::fopen((dir + "/model_config.yaml").c_str(), "w");
    if (f == nullptr) Die(absl::NotFoundError(absl::StrCat(dir, ": cannot write")));
    const std::string yaml = ConfigToYaml(config);
    std::fwrite(yaml.data(), 1, yaml.size(), f);
    std::fclose(f);
  }
  DieIfError(WriteSafetensors(out_dir + "/safetensors/model.safetensors", state));
  DieIfError(WriteTorchStateDict(out_dir + "/pth/lit_model.pth", state));
  std::printf("wrote %s with %d layers: %lld parameters to %s/{safetensors,pth}\n",
              config.name.c_str(), static_cast<int>(config.n_layer), static_cast<long long>(params),
              out_dir.c_str());
}

}  // namespace
}  // namespace lgpt

int main(int argc, char** argv) {
  using namespace lgpt;
  InitTool(argc, argv,
           "checkpoint_memory (--checkpoint_dir=DIR [--read_only | --adopt] | --write_preset=NAME "
           "[--n_layer=N] --out_dir=DIR)");
  if (!absl::GetFlag(FLAGS_write_preset).empty()) {
    const std::string out_dir = ResolvePath(absl::GetFlag(FLAGS_out_dir));
    if (out_dir.empty()) Die(absl::InvalidArgumentError("--out_dir is required"));
    WriteRandom(absl::GetFlag(FLAGS_write_preset), absl::GetFlag(FLAGS_n_layer), out_dir);
    return 0;
  }
  const std::string dir = ResolvePath(absl::GetFlag(FLAGS_checkpoint_dir));
  if (dir.empty()) Die(absl::InvalidArgumentError("--checkpoint_dir is required"));
  std::string file = dir + "/model.safetensors";
  if (FileBytes(file) == 0) file = dir + "/lit_model.pth";
  const int64_t file_bytes = FileBytes(file);
  const int64_t baseline = PeakRssBytes();
  double checksum = 0;
  if (absl::GetFlag(FLAGS_read_only)) {
    const TensorMap tensors =
        ValueOrDie(ReadCheckpointTensors(dir, nullptr, VerifyChecksumsFlag()));
    for (const auto& [name, t] : tensors)
      checksum += t.sum().item<double>();  // Touches every byte, allocates nothing big.
  } else if (absl::GetFlag(FLAGS_adopt)) {
    const Config config = ValueOrDie(LoadConfigFile(dir + "/model_config.yaml"));
    GPT model = ValueOrDie(GPTImpl::Create(config));
    {
      const TensorMap tensors =
        ValueOrDie(ReadCheckpointTensors(dir, nullptr, VerifyChecksumsFlag()));
      at::NoGradGuard no_grad;
      for (auto& [name, param] : StateDict(*model)) {
        const auto it = tensors.find(name);
        if (it == tensors.end() || !it->second.sizes().equals(param.sizes()) ||
            it->second.scalar_type() != param.scalar_type()) {
          Die(absl::InvalidArgumentError(absl::StrCat(name, " cannot be adopted")));
        }
        param.set_data(it->second);
      }
    }
    for (const auto& [name, t] : StateDict(*model)) checksum += t.sum().item<double>();
  } else {
    LoadOptions options;
    ApplyLoadFlags(options);
    LoadedModel loaded = ValueOrDie(LoadCheckpoint(dir, options));
    for (const auto& [name, t] : StateDict(*loaded.model)) {
      checksum += t.sum().item<double>();  // Touches every byte, allocates nothing big.
    }
  }
  const int64_t peak = PeakRssBytes();
  std::printf(
      "%s: file_bytes=%lld baseline_rss=%lld peak_rss=%lld ratio=%.3f "
      "(peak-baseline)/file=%.3f checksum=%g\n",
      file.c_str(), static_cast<long long>(file_bytes), static_cast<long long>(baseline),
      static_cast<long long>(peak), static_cast<double>(peak) / file_bytes,
      static_cast<double>(peak - baseline) / file_bytes, checksum);
  return 0;
}
