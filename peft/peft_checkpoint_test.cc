// Fine-tunes at run time: LitGPT's LoRA golden split into a base and a fine-tune directory
// loads to LitGPT's logits and to the merged model's; stacked adapters with scales equal the
// hand-merged W + s1·d1 + s2·d2 (over an int8 base, close to it); LitGPT's adapter goldens
// load from fine-tune directories; bad directories, files and scales are clear errors.
#include "peft/peft_checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config/config_presets.h"
#include "core/io/npy.h"
#include "core/io/torch_pickle.h"
#include "core/io/torch_pickle_writer.h"
#include "core/model/quantize_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "peft/lora.h"
#include "tests/test_models.h"

namespace lgpt {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr char kLoraGolden[] = "tests/testdata/golden/llama2_lora";

std::string TempDir(const std::string& name) {
  const std::string dir = (fs::path(::testing::TempDir()) / name).lexically_normal().string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

at::Tensor Logits(GPTImpl& model, const at::Tensor& tokens) {
  at::NoGradGuard no_grad;
  return model.Forward(tokens).value();
}

double MaxDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

Config WithoutLora(Config config) {
  config.lora_r = 0;
  config.lora_alpha = 1;
  config.lora_dropout = 0;
  config.lora_query = config.lora_key = config.lora_value = false;
  config.lora_projection = config.lora_mlp = config.lora_head = false;
  return config;
}

// A base checkpoint: model_config.yaml without PEFT fields and lit_model.pth.
void WriteBase(const std::string& dir, const Config& config, const TensorMap& tensors) {
  WriteText(dir + "/model_config.yaml", ConfigToYaml(WithoutLora(config)));
  ASSERT_TRUE(WriteTorchStateDict(dir + "/lit_model.pth", tensors).ok());
}

// A fine-tune directory as `finetune` writes it.
void WriteFinetune(const std::string& dir, const Config& config, PeftMethod method,
                   const TensorMap& trained, const std::string& base_dir) {
  WriteText(dir + "/model_config.yaml", ConfigToYaml(config));
  ASSERT_TRUE(WriteTorchStateDict(dir + "/" + TrainedFileName(method), trained).ok());
  WriteText(dir + "/hyperparameters.yaml",
            absl::StrCat("checkpoint_dir: ", base_dir, "\nmethod: ", PeftMethodName(method), "\n"));
}

TensorMap Only(const TensorMap& tensors, PeftMethod method) {
  TensorMap out;
  for (const auto& [name, tensor] : tensors) {
    if (IsTrainedParameter(method, name)) out[name] = tensor.detach().contiguous();
  }
  return out;
}

// LitGPT's LoRA golden (a whole LoRA model's state dict) as a base directory and a
// fine-tune directory over it.
struct GoldenSplit {
  Config config;
  std::string base_dir, lora_dir;
};

GoldenSplit SplitLoraGolden(const std::string& name) {
  GoldenSplit split;
  split.config = LoadConfigFile(std::string(kLoraGolden) + "/model_config.yaml").value();
  const TensorMap whole = ReadCheckpointTensors(kLoraGolden).value();
  split.base_dir = TempDir(name + "_base");
  split.lora_dir = TempDir(name + "_lora");
  WriteBase(split.base_dir, split.config, UnwrapToBaseStateDict(whole));
  WriteFinetune(split.lora_dir, split.config, PeftMethod::kLora, Only(whole, PeftMethod::kLora),
                split.base_dir);
  return split;
}

TEST(PeftCheckpointTest, GoldenLoraAtRunTimeEqualsLitGptAndTheMergedModel) {
  const GoldenSplit split = SplitLoraGolden("golden");
  EXPECT_EQ(PeftMethodOfDir(split.lora_dir).value(), PeftMethod::kLora);
  EXPECT_EQ(PeftMethodOfDir(split.base_dir).value(), std::nullopt);
  const at::Tensor tokens = ReadNpy(std::string(kLoraGolden) + "/tokens.npy").value().unsqueeze(0);
  const at::Tensor expected = ReadNpy(std::string(kLoraGolden) + "/logits.npy").value();

  // The fine-tune directory itself, and the same adapter over the base.
  absl::StatusOr<LoadedModel> finetune = LoadModelWithPeft(split.lora_dir);
  ASSERT_TRUE(finetune.ok()) << finetune.status();
  const at::Tensor runtime = Logits(*finetune->model, tokens).squeeze(0);
  EXPECT_LT(MaxDiff(runtime, expected), 1e-4);
  absl::StatusOr<LoadedModel> over_base = LoadModelWithPeft(split.base_dir, {{split.lora_dir}});
  ASSERT_TRUE(over_base.ok()) << over_base.status();
  EXPECT_EQ(MaxDiff(Logits(*over_base->model, tokens).squeeze(0), runtime), 0.0);

  // The merged model (merge_lora's weights) gives the same logits.
  GPT merged = *GPTImpl::Create(WithoutLora(split.config));
  ASSERT_TRUE(LoadStateDict(*merged, MergedBaseStateDict(*finetune->model), "merged").ok());
  const at::Tensor merged_logits = Logits(*merged, tokens).squeeze(0);
  EXPECT_LT(MaxDiff(merged_logits, expected), 1e-4);
  // float32 rounding of W + B·A: ~1e-6 relative to logits of up to ~10.
  EXPECT_LT(MaxDiff(merged_logits, runtime), 1e-6 * runtime.abs().max().item<double>() + 1e-5);

  // merge_lora's default leaves lit_model.pth beside the LoRA files: that directory is plain.
  ASSERT_TRUE(WriteTorchStateDict(split.lora_dir + "/lit_model.pth",
                                  MergedBaseStateDict(*finetune->model))
                  .ok());
  EXPECT_EQ(PeftMethodOfDir(split.lora_dir).value(), std::nullopt);
  absl::StatusOr<LoadedModel> plain = LoadModelWithPeft(split.lora_dir);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(MaxDiff(Logits(*plain->model, tokens).squeeze(0), merged_logits), 0.0);
}

// A relative checkpoint_dir is taken from the current directory, else beside the fine-tune.
TEST(PeftCheckpointTest, RelativeBaseDirectories) {
  const GoldenSplit split = SplitLoraGolden("relative");
  const std::string parent = fs::path(split.lora_dir).parent_path().string();
  const std::string base_name = fs::path(split.base_dir).filename().string();
  WriteText(split.lora_dir + "/hyperparameters.yaml", "checkpoint_dir: " + base_name + "\n");
  EXPECT_EQ(BaseDirFromHyperparameters(split.lora_dir).value(), parent + "/" + base_name);
  EXPECT_TRUE(LoadModelWithPeft(split.lora_dir).ok());
  // From the current directory first (the runfiles root holds tests/testdata/...).
  WriteText(split.lora_dir + "/hyperparameters.yaml", "checkpoint_dir: tests/testdata\n");
  EXPECT_EQ(BaseDirFromHyperparameters(split.lora_dir).value(), "tests/testdata");

  WriteText(split.lora_dir + "/hyperparameters.yaml", "checkpoint_dir: no/such/base\n");
  const absl::Status missing = LoadModelWithPeft(split.lora_dir).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("no/such/base"));
  EXPECT_THAT(missing.message(), HasSubstr("current directory"));
  EXPECT_THAT(missing.message(), HasSubstr(parent + "/no/such/base"));
  fs::remove(split.lora_dir + "/hyperparameters.yaml");
  const absl::Status no_file = LoadModelWithPeft(split.lora_dir).status();
  EXPECT_EQ(no_file.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(no_file.message(), HasSubstr("hyperparameters.yaml"));
}

// A tiny random base and two LoRA fine-tunes of it with different ranks, alphas and targets.
struct TwoAdapters {
  Config config;
  TensorMap base;
  std::string base_dir, first_dir, second_dir;
  TensorMap first_delta, second_delta;  // merged minus base, per base tensor
};

Config TinyConfig() {
  Config config = ShrinkConfig(*PresetFromName("Llama-3.2-1B")).value();
  config.n_layer = 2;
  EXPECT_TRUE(config.Finalize().ok());
  return config;
}

// Trains nothing: draws the LoRA weights of `config` over `base` at random, writes the
// fine-tune directory and returns the update merging would add.
TensorMap MakeLoraDir(const std::string& dir, const Config& config, const TensorMap& base,
                      const std::string& base_dir, uint64_t seed) {
  GPT model = *CreateLoraGPT(config);
  EXPECT_TRUE(LoadBaseWeights(*model, base, "base").ok());
  at::manual_seed(seed);
  {
    at::NoGradGuard no_grad;
    for (auto& item : model->named_parameters()) {
      if (IsTrainedParameter(PeftMethod::kLora, item.key())) item.value().normal_(0, 0.2);
    }
  }
  WriteFinetune(dir, config, PeftMethod::kLora, Only(StateDict(*model), PeftMethod::kLora),
                base_dir);
  TensorMap delta = MergedBaseStateDict(*model);
  for (auto& [name, tensor] : delta) tensor = tensor - base.at(name);
  return delta;
}

TwoAdapters MakeTwoAdapters(const std::string& name) {
  TwoAdapters out;
  out.config = TinyConfig();
  GPT base = *GPTImpl::Create(out.config);
  RandomizeWeights(*base, 7);
  for (const auto& [tensor_name, tensor] : StateDict(*base)) {
    out.base[tensor_name] = tensor.detach().clone();
  }
  out.base_dir = TempDir(name + "_base");
  WriteBase(out.base_dir, out.config, out.base);
  Config first = out.config;
  first.lora_r = 4;
  first.lora_alpha = 8;
  first.lora_query = first.lora_value = first.lora_mlp = true;
  Config second = out.config;
  second.lora_r = 2;
  second.lora_alpha = 3;
  second.lora_key = second.lora_query = second.lora_projection = second.lora_head = true;
  out.first_dir = TempDir(name + "_first");
  out.second_dir = TempDir(name + "_second");
  out.first_delta = MakeLoraDir(out.first_dir, first, out.base, out.base_dir, 11);
  out.second_delta = MakeLoraDir(out.second_dir, second, out.base, out.base_dir, 12);
  return out;
}

// W + s1·d1 + s2·d2 as a plain model.
GPT HandMerged(const TwoAdapters& adapters, double s1, double s2) {
  TensorMap weights;
  for (const auto& [name, tensor] : adapters.base) {
    weights[name] =
        tensor + s1 * adapters.first_delta.at(name) + s2 * adapters.second_delta.at(name);
  }
  GPT model = *GPTImpl::Create(adapters.config);
  EXPECT_TRUE(LoadStateDict(*model, weights, "hand-merged").ok());
  model->eval();
  return model;
}

at::Tensor Tokens(const Config& config) {
  at::manual_seed(3);
  return at::randint(0, config.vocab_size, {2, 12}, at::kLong);
}

TEST(PeftCheckpointTest, StackedAdaptersWithScalesEqualTheHandMergedModel) {
  const TwoAdapters adapters = MakeTwoAdapters("stack");
  const at::Tensor tokens = Tokens(adapters.config);
  // Both adapters matter: each changes the logits.
  ASSERT_GT(MaxDiff(Logits(*HandMerged(adapters, 1, 0), tokens),
                    Logits(*HandMerged(adapters, 0, 0), tokens)),
            1e-2);
  ASSERT_GT(MaxDiff(Logits(*HandMerged(adapters, 0, 1), tokens),
                    Logits(*HandMerged(adapters, 0, 0), tokens)),
            1e-2);
  for (const auto& [s1, s2] : std::vector<std::pair<double, double>>{{0.5, 2}, {1, 1}, {0, 0}}) {
    absl::StatusOr<LoadedModel> loaded = LoadModelWithPeft(
        adapters.base_dir, {{adapters.first_dir, s1}, {adapters.second_dir, s2}});
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    const at::Tensor expected = Logits(*HandMerged(adapters, s1, s2), tokens);
    EXPECT_LT(MaxDiff(Logits(*loaded->model, tokens), expected), 1e-5) << s1 << ", " << s2;
    // Merging the stacked model sums every adapter's update.
    GPT merged = *GPTImpl::Create(adapters.config);
    ASSERT_TRUE(LoadStateDict(*merged, MergedBaseStateDict(*loaded->model), "merged").ok());
    EXPECT_LT(MaxDiff(Logits(*merged, tokens), expected), 1e-5) << s1 << ", " << s2;
  }
  // A LoRA fine-tune as the checkpoint is the first adapter (scale 1); others stack on it.
  absl::StatusOr<LoadedModel> on_finetune =
      LoadModelWithPeft(adapters.first_dir, {{adapters.second_dir, 2}});
  ASSERT_TRUE(on_finetune.ok()) << on_finetune.status();
  EXPECT_LT(MaxDiff(Logits(*on_finetune->model, tokens),
                    Logits(*HandMerged(adapters, 1, 2), tokens)),
            1e-5);
  // Stacked projections cannot merge in place (the outer one's base is not dense).
  EXPECT_EQ(MergeLora(*on_finetune->model).code(), absl::StatusCode::kFailedPrecondition);
}

// LoRA over an int8 base (quantised after loading, as EngineOptions.quantize_int8 does) is
// close to the float hand-merged model: int8 rounds only the base weights.
TEST(PeftCheckpointTest, StackedAdaptersOverAnInt8Base) {
  const TwoAdapters adapters = MakeTwoAdapters("int8");
  const at::Tensor tokens = Tokens(adapters.config);
  LoadOptions options;
  options.parts = Int8ModelParts();
  absl::StatusOr<LoadedModel> loaded = LoadModelWithPeft(
      adapters.base_dir, {{adapters.first_dir, 0.5}, {adapters.second_dir, 2}}, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(QuantizeModelInt8(*loaded->model).ok());
  const at::Tensor expected = Logits(*HandMerged(adapters, 0.5, 2), tokens);
  const at::Tensor int8 = Logits(*loaded->model, tokens);
  const double scale = expected.abs().max().item<double>();
  EXPECT_LT(MaxDiff(int8, expected), 0.05 * scale);  // measured 0.022 · scale
  // ... and closer to it than the float base without the adapters.
  EXPECT_LT(MaxDiff(int8, expected),
            0.2 * MaxDiff(Logits(*HandMerged(adapters, 0, 0), tokens), expected));
}

// LitGPT's adapter goldens as fine-tune directories (lit_model.pth.adapter / .adapter_v2
// over a plain base) load to LitGPT's logits, also over an int8 base (loosely).
class AdapterDirTest : public ::testing::TestWithParam<PeftMethod> {};

TEST_P(AdapterDirTest, LoadsToLitGptLogits) {
  const PeftMethod method = GetParam();
  const std::string name(PeftMethodName(method));
  const std::string golden = "tests/testdata/golden_adapter/" + name;
  const TensorMap whole = ReadCheckpointTensors(golden).value();
  TensorMap base;
  for (const auto& [tensor_name, tensor] : whole) {
    if (!IsPeftOnlyParameter(tensor_name)) base[BaseParameterName(tensor_name)] = tensor;
  }
  const Config config = LoadConfigFile(golden + "/model_config.yaml").value();
  const std::string base_dir = TempDir("adapter_base_" + name);
  const std::string dir = TempDir("adapter_" + name);
  WriteBase(base_dir, config, base);
  WriteText(dir + "/model_config.yaml", ReadAll(golden + "/model_config.yaml"));
  ASSERT_TRUE(WriteTorchStateDict(dir + "/" + TrainedFileName(method), Only(whole, method)).ok());
  WriteText(dir + "/hyperparameters.yaml", "checkpoint_dir: " + base_dir + "\n");
  EXPECT_EQ(PeftMethodOfDir(dir).value(), method);

  const at::Tensor tokens = ReadNpy(golden + "/tokens.npy").value().unsqueeze(0);
  const at::Tensor expected = ReadNpy(golden + "/logits.npy").value();
  absl::StatusOr<LoadedModel> loaded = LoadModelWithPeft(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_LT(MaxDiff(Logits(*loaded->model, tokens).squeeze(0), expected), 1e-4);
  absl::StatusOr<LoadedModel> explicit_method = LoadPeftCheckpoint(dir, method, {}, base_dir);
  ASSERT_TRUE(explicit_method.ok()) << explicit_method.status();
  EXPECT_EQ(MaxDiff(Logits(*explicit_method->model, tokens), Logits(*loaded->model, tokens)), 0);

  LoadOptions int8;
  int8.parts = Int8ModelParts();
  absl::StatusOr<LoadedModel> quantised = LoadModelWithPeft(dir, {}, int8);
  ASSERT_TRUE(quantised.ok()) << quantised.status();
  ASSERT_TRUE(QuantizeModelInt8(*quantised->model).ok());
  EXPECT_LT(MaxDiff(Logits(*quantised->model, tokens).squeeze(0), expected),
            0.05 * expected.abs().max().item<double>());

  // LoRA adapters apply over plain and LoRA checkpoints only.
  const absl::Status refused = LoadModelWithPeft(dir, {{dir}}).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr(name + " fine-tune"));
  // Full weights beside an adapter file: which is meant is unclear.
  ASSERT_TRUE(WriteTorchStateDict(dir + "/lit_model.pth", base).ok());
  EXPECT_EQ(PeftMethodOfDir(dir).status().code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Adapters, AdapterDirTest,
                         ::testing::Values(PeftMethod::kAdapter, PeftMethod::kAdapterV2),
                         [](const auto& info) { return std::string(PeftMethodName(info.param)); });

absl::Status LoadError(const std::string& checkpoint_dir,
                       const std::vector<LoraAdapterSpec>& loras) {
  return LoadModelWithPeft(checkpoint_dir, loras).status();
}

TEST(PeftCheckpointTest, BadAdaptersAreClearErrors) {
  const TwoAdapters adapters = MakeTwoAdapters("errors");
  const std::string& base = adapters.base_dir;
  Config first = LoadConfigFile(adapters.first_dir + "/model_config.yaml").value();

  // Scales and directories (the field names the adapter).
  for (double scale : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    const absl::Status bad = LoadError(base, {{adapters.first_dir}, {adapters.second_dir, scale}});
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << scale;
    EXPECT_THAT(bad.message(), HasSubstr("loras[1].scale must be finite and >= 0"));
  }
  EXPECT_THAT(LoadError(base, {{""}}).message(), HasSubstr("loras[0].dir is empty"));
  const absl::Status nowhere = LoadError(base, {{base + "/nowhere"}});
  EXPECT_EQ(nowhere.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(nowhere.message(), HasSubstr("loras[0] " + base + "/nowhere: no such directory"));
  // A directory without lit_model.pth.lora (the base itself).
  const absl::Status no_file = LoadError(base, {{adapters.first_dir}, {base}});
  EXPECT_EQ(no_file.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(no_file.message(), HasSubstr("loras[1] " + base + ": no lit_model.pth.lora"));

  // An adapter of another model: the first differing model_config.yaml key is named.
  const std::string other = TempDir("errors_other");
  Config deeper = first;
  deeper.n_layer = 3;
  WriteText(other + "/model_config.yaml", ConfigToYaml(deeper));
  fs::copy_file(adapters.first_dir + "/lit_model.pth.lora", other + "/lit_model.pth.lora");
  const absl::Status mismatch = LoadError(base, {{other}});
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mismatch.message(), HasSubstr("n_layer is 3 but the base model's is 2"));

  // A file that does not match its model_config.yaml: another rank, more or fewer targets.
  Config rank = first;
  rank.lora_r = 8;
  WriteText(other + "/model_config.yaml", ConfigToYaml(rank));
  const absl::Status shape = LoadError(base, {{other}});
  EXPECT_EQ(shape.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(shape.message(), HasSubstr("lit_model.pth.lora: tensor "));
  EXPECT_THAT(shape.message(), HasSubstr("model_config.yaml gives"));
  Config more = first;
  more.lora_head = true;
  WriteText(other + "/model_config.yaml", ConfigToYaml(more));
  EXPECT_THAT(LoadError(base, {{other}}).message(), HasSubstr("missing tensor lm_head.lora_A"));
  Config fewer = first;
  fewer.lora_mlp = false;
  WriteText(other + "/model_config.yaml", ConfigToYaml(fewer));
  EXPECT_THAT(LoadError(base, {{other}}).message(), HasSubstr("unexpected tensor"));
  Config none = first;
  none.lora_r = 0;
  WriteText(other + "/model_config.yaml", ConfigToYaml(none));
  EXPECT_THAT(LoadError(base, {{other}}).message(), HasSubstr("lora_r >= 1"));

  // Tensors that are not LoRA parameters, and non-finite ones.
  WriteText(other + "/model_config.yaml", ConfigToYaml(first));
  TensorMap tensors = ReadTorchStateDict(adapters.first_dir + "/lit_model.pth.lora").value();
  TensorMap foreign = tensors;
  foreign["lm_head.weight"] = at::zeros({2, 2});
  ASSERT_TRUE(WriteTorchStateDict(other + "/lit_model.pth.lora", foreign).ok());
  EXPECT_THAT(LoadError(base, {{other}}).message(),
              HasSubstr("tensor lm_head.weight is not a lora parameter"));
  tensors.begin()->second = tensors.begin()->second.clone();
  tensors.begin()->second.view({-1})[0] = std::nanf("");
  ASSERT_TRUE(WriteTorchStateDict(other + "/lit_model.pth.lora", tensors).ok());
  EXPECT_EQ(LoadError(base, {{other}}).code(), absl::StatusCode::kDataLoss);

  // Several fine-tunes in one directory.
  fs::copy_file(adapters.first_dir + "/lit_model.pth.lora", other + "/lit_model.pth.adapter");
  const absl::Status several = PeftMethodOfDir(other).status();
  EXPECT_EQ(several.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(several.message(), HasSubstr("lit_model.pth.lora, lit_model.pth.adapter"));
  EXPECT_EQ(LoadError(other, {}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PeftMethodOfDir(base + "/nowhere").status().code(), absl::StatusCode::kNotFound);
}

TEST(PeftCheckpointTest, SideFilesComeFromTheFinetuneThenItsBase) {
  const TwoAdapters adapters = MakeTwoAdapters("side");
  EXPECT_EQ(CheckpointFileDirs(adapters.first_dir),
            (std::vector<std::string>{adapters.first_dir, adapters.base_dir}));
  EXPECT_EQ(CheckpointFileDirs(adapters.base_dir), std::vector<std::string>{adapters.base_dir});
}

}  // namespace
}  // namespace lgpt
