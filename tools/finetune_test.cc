// Fine-tuning on tiny random models: the loss falls, only the method's parameters change,
// the saved file reloads on top of the base to the same logits, merged LoRA equals
// unmerged, prompt tokens carry no loss; and the tools fail cleanly on bad input.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "core/config/config_presets.h"
#include "core/io/npy.h"
#include "core/io/safetensors.h"
#include "core/io/torch_pickle_writer.h"
#include "core/model/checkpoint.h"
#include "core/text/prompt_style.h"
#include "gtest/gtest.h"
#include "tests/test_models.h"
#include "tools/finetune_model.h"
#include "tools/sft_data.h"
#include "tools/sft_test_util.h"
#include "tools/sft_trainer.h"

namespace lgpt {
namespace {

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(base ? base : "/tmp", "/", name);
  EXPECT_EQ(std::system(absl::StrCat("mkdir -p ", dir).c_str()), 0) << dir;
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

TensorMap Clone(const TensorMap& tensors) {
  TensorMap out;
  for (const auto& [name, t] : tensors) out[name] = t.detach().clone();
  return out;
}

at::Tensor Logits(GPTImpl& model, const at::Tensor& tokens) {
  at::NoGradGuard no_grad;
  return model.Forward(tokens).value();
}

double MaxDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

struct Trained {
  Config config;
  TensorMap base;  // plain base-model names
  GPT model;
  SftTrainStats stats;
};

Trained Train(PeftMethod method, int64_t steps = 30) {
  Trained out;
  out.config = TinyConfig();
  GPT base = *GPTImpl::Create(out.config);
  RandomizeWeights(*base, 7);
  out.base = Clone(StateDict(*base));
  at::manual_seed(11);
  out.model = *CreateFinetuneModel(out.config, method);
  EXPECT_TRUE(LoadBaseWeights(*out.model, out.base, "base").ok());
  MarkTrainable(*out.model, method);
  const std::vector<SftExample> examples =
      *TokenizeSft(TinyRecords(), *PromptStyleFromName("phi-2"), CharEncoder(), {64, true});
  SftTrainOptions options;
  options.micro_batch_size = 2;
  options.global_batch_size = 4;
  options.max_steps = steps;
  options.lr = 2e-2;
  options.min_lr = 2e-3;
  options.warmup_steps = 2;
  options.eval_interval = steps;
  absl::StatusOr<SftTrainStats> stats = TrainSft(*out.model, examples, examples, options);
  EXPECT_TRUE(stats.ok()) << stats.status();
  if (stats.ok()) out.stats = *stats;
  return out;
}

class PeftMethodTest : public ::testing::TestWithParam<PeftMethod> {};

TEST_P(PeftMethodTest, LossFallsAndOnlyTheMethodsParametersChange) {
  const PeftMethod method = GetParam();
  Trained t = Train(method);
  ASSERT_EQ(t.stats.val_losses.size(), 2u);
  // The adapter has few parameters (prefix and gates) and learns slowest.
  const double margin = method == PeftMethod::kAdapter ? 0.05 : 0.3;
  EXPECT_LT(t.stats.val_losses.back().second, t.stats.val_losses.front().second - margin)
      << PeftMethodName(method) << ": " << t.stats.val_losses.front().second << " -> "
      << t.stats.val_losses.back().second;
  int changed = 0;
  for (const auto& item : t.model->named_parameters()) {
    const std::string& name = item.key();
    const bool trained = IsTrainedParameter(method, name);
    EXPECT_EQ(item.value().requires_grad(), trained) << name;
    if (!trained) {
      EXPECT_FALSE(item.value().grad().defined()) << name;
      const at::Tensor& before = t.base.at(absl::StrReplaceAll(name, {{".linear.", "."}}));
      EXPECT_TRUE(at::equal(item.value(), before)) << name << " changed";
    } else if (t.base.count(name) == 0 || !at::equal(item.value(), t.base.at(name))) {
      ++changed;
    }
  }
  EXPECT_GT(changed, 0);
}

TEST_P(PeftMethodTest, SavedFileLoadsOnTopOfTheBaseToTheSameLogits) {
  const PeftMethod method = GetParam();
  Trained t = Train(method, 5);
  const std::string base_dir = TempDir(absl::StrCat("base_", PeftMethodName(method)));
  const std::string out_dir = TempDir(absl::StrCat("out_", PeftMethodName(method)));
  ASSERT_TRUE(WriteSafetensors(base_dir + "/model.safetensors", t.base).ok());
  WriteText(base_dir + "/model_config.yaml", ConfigToYaml(t.config));
  const TensorMap trained = TrainedStateDict(*t.model, method);
  for (const auto& [name, tensor] : trained) EXPECT_TRUE(IsTrainedParameter(method, name)) << name;
  ASSERT_TRUE(WriteTorchStateDict(out_dir + "/" + TrainedFileName(method), trained).ok());
  WriteText(out_dir + "/model_config.yaml", ConfigToYaml(t.config));
  WriteText(out_dir + "/hyperparameters.yaml", absl::StrCat("checkpoint_dir: ", base_dir, "\n"));
  absl::StatusOr<LoadedModel> loaded = LoadPeftCheckpoint(out_dir, method);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  at::manual_seed(3);
  const at::Tensor tokens = at::randint(0, t.config.vocab_size, {2, 12}, at::kLong);
  EXPECT_EQ(MaxDiff(Logits(*loaded->model, tokens), Logits(*t.model, tokens)), 0.0);
  // A file of another method's parameters is refused.
  if (method == PeftMethod::kLora) {
    EXPECT_FALSE(LoadPeftCheckpoint(out_dir, PeftMethod::kAdapter, {}, base_dir).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Methods, PeftMethodTest,
                         ::testing::Values(PeftMethod::kLora, PeftMethod::kAdapter,
                                           PeftMethod::kAdapterV2, PeftMethod::kFull),
                         [](const auto& info) { return std::string(PeftMethodName(info.param)); });

// A LitGPT adapter fine-tune (base lit_model.pth plus lit_model.pth.adapter /
// .adapter_v2, split from LitGPT's golden model in tests/testdata/golden_adapter) loads to
// LitGPT's logits: LoadPeftCheckpoint uses LitGPT's per-group split of the prefix projection.
class LitGptAdapterFilesTest : public ::testing::TestWithParam<PeftMethod> {};

TEST_P(LitGptAdapterFilesTest, LoadToLitGptLogits) {
  const PeftMethod method = GetParam();
  const std::string name(PeftMethodName(method));
  const std::string golden = "tests/testdata/golden_adapter/" + name;
  absl::StatusOr<TensorMap> tensors = ReadCheckpointTensors(golden);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  TensorMap base, trained;
  for (const auto& [tensor_name, tensor] : *tensors) {
    if (IsTrainedParameter(method, tensor_name)) trained[tensor_name] = tensor;
    // The base checkpoint: every base-model tensor (norms included) under plain names.
    if (!absl::StrContains(tensor_name, "adapter_") &&
        !absl::StrContains(tensor_name, "gating_factor")) {
      base[absl::StrReplaceAll(tensor_name, {{".linear.", "."}})] = tensor;
    }
  }
  const std::string base_dir = TempDir("litgpt_base_" + name);
  const std::string out_dir = TempDir("litgpt_" + name);
  ASSERT_TRUE(WriteTorchStateDict(base_dir + "/lit_model.pth", base).ok());
  WriteText(base_dir + "/model_config.yaml", ReadAll(golden + "/model_config.yaml"));
  WriteText(out_dir + "/model_config.yaml", ReadAll(golden + "/model_config.yaml"));
  ASSERT_TRUE(WriteTorchStateDict(out_dir + "/" + TrainedFileName(method), trained).ok());
  absl::StatusOr<LoadedModel> loaded = LoadPeftCheckpoint(out_dir, method, {}, base_dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const at::Tensor tokens = ReadNpy(golden + "/tokens.npy").value().unsqueeze(0);
  const at::Tensor expected = ReadNpy(golden + "/logits.npy").value();
  EXPECT_LT(MaxDiff(Logits(*loaded->model, tokens).squeeze(0), expected), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Adapters, LitGptAdapterFilesTest,
                         ::testing::Values(PeftMethod::kAdapter, PeftMethod::kAdapterV2),
                         [](const auto& info) { return std::string(PeftMethodName(info.param)); });

TEST(FinetuneTest, MergedLoraEqualsUnmerged) {
  Trained t = Train(PeftMethod::kLora, 5);
  GPT plain = *GPTImpl::Create(t.config);
  ASSERT_TRUE(LoadStateDict(*plain, *MergedStateDict(*t.model, PeftMethod::kLora), "merged").ok());
  at::manual_seed(4);
  const at::Tensor tokens = at::randint(0, t.config.vocab_size, {1, 16}, at::kLong);
  EXPECT_LT(MaxDiff(Logits(*plain, tokens), Logits(*t.model, tokens)), 1e-5);
  EXPECT_EQ(MergedStateDict(*t.model, PeftMethod::kAdapter).status().code(),
            absl::StatusCode::kUnimplemented);
}

// A model whose activations are not numbers stops training with an error naming the step,
// and a NaN base is refused before training.
TEST(FinetuneTest, NonFiniteLossIsAnError) {
  const Config config = TinyConfig();
  GPT base = *GPTImpl::Create(config);
  RandomizeWeights(*base, 7);
  TensorMap weights = Clone(StateDict(*base));
  weights.at("transformer.h.0.mlp.fc_1.weight").view({-1})[3] = std::nanf("");
  GPT model = *CreateFinetuneModel(config, PeftMethod::kLora);
  const absl::Status refused = LoadBaseWeights(*model, weights, "base");
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << refused;
  EXPECT_NE(refused.message().find("transformer.h.0.mlp.fc_1.weight"), std::string::npos);

  weights = Clone(StateDict(*base));
  ASSERT_TRUE(LoadBaseWeights(*model, weights, "base").ok());
  MarkTrainable(*model, PeftMethod::kLora);
  {
    at::NoGradGuard no_grad;  // activations overflow after loading
    for (auto& p : model->parameters()) {
      if (!p.requires_grad()) p.fill_(std::numeric_limits<float>::infinity());
    }
  }
  const std::vector<SftExample> examples =
      *TokenizeSft(TinyRecords(), *PromptStyleFromName("phi-2"), CharEncoder(), {64, true});
  SftTrainOptions options;
  options.micro_batch_size = 2;
  options.global_batch_size = 2;
  options.max_steps = 2;
  options.eval_max_batches = 0;  // no validation: the training loss itself must be caught
  const absl::StatusOr<SftTrainStats> stats = TrainSft(*model, examples, examples, options);
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kFailedPrecondition) << stats.status();
  EXPECT_NE(stats.status().message().find("training loss is not finite"), std::string::npos)
      << stats.status();
}

// Optimizer settings that are not finite numbers >= 0 are refused by name; an infinite rate
// trained on and an infinite or NaN clip silently turned clipping off.
TEST(FinetuneTest, BadOptimizerSettingsAreRefusedByName) {
  const Config config = TinyConfig();
  GPT model = *CreateFinetuneModel(config, PeftMethod::kLora);
  MarkTrainable(*model, PeftMethod::kLora);
  const std::vector<SftExample> examples =
      *TokenizeSft(TinyRecords(), *PromptStyleFromName("phi-2"), CharEncoder(), {64, true});
  const auto refused = [&](void (*set)(SftTrainOptions&), const std::string& message) {
    SftTrainOptions options;
    options.micro_batch_size = 2;
    options.global_batch_size = 2;
    options.max_steps = 1;
    set(options);
    const absl::StatusOr<SftTrainStats> stats = TrainSft(*model, examples, examples, options);
    ASSERT_FALSE(stats.ok()) << message;
    EXPECT_EQ(stats.status().code(), absl::StatusCode::kInvalidArgument) << stats.status();
    EXPECT_EQ(stats.status().message(), message);
  };
  refused([](SftTrainOptions& o) { o.lr = std::numeric_limits<double>::infinity(); },
          "lr must be a finite number >= 0, got inf");
  refused([](SftTrainOptions& o) { o.min_lr = std::nan(""); },
          "min_lr must be a finite number >= 0, got nan");
  refused([](SftTrainOptions& o) { o.weight_decay = -0.1; },
          "weight_decay must be a finite number >= 0, got -0.1");
  refused([](SftTrainOptions& o) { o.grad_clip = std::nan(""); },
          "grad_clip must be a finite number >= 0, got nan");
}

// The last step's update is followed by no loss that would show it, so weights it leaves
// non-finite are an error, not a result (TrainSft returned OK and finetune saved them). Here
// weight decay overflows a large lora_A entry (B = 0, so the loss never sees it) to -inf.
TEST(FinetuneTest, NonFiniteWeightsAfterTheLastStepAreAnError) {
  const Config config = TinyConfig();
  GPT base = *GPTImpl::Create(config);
  RandomizeWeights(*base, 7);
  GPT model = *CreateFinetuneModel(config, PeftMethod::kLora);
  ASSERT_TRUE(LoadBaseWeights(*model, Clone(StateDict(*base)), "base").ok());
  MarkTrainable(*model, PeftMethod::kLora);
  {
    at::NoGradGuard no_grad;
    for (const auto& item : model->named_parameters()) {
      if (item.key().find("lora_A") != std::string::npos) item.value().view({-1})[0] = 1e21;
    }
  }
  const std::vector<SftExample> examples =
      *TokenizeSft(TinyRecords(), *PromptStyleFromName("phi-2"), CharEncoder(), {64, true});
  SftTrainOptions options;
  options.micro_batch_size = 2;
  options.global_batch_size = 2;
  options.max_steps = 1;
  options.warmup_steps = 0;
  options.lr = 1e20;
  options.weight_decay = 0.02;
  options.grad_clip = 0;
  options.eval_max_batches = 0;  // no validation loss after the step either
  const absl::StatusOr<SftTrainStats> stats = TrainSft(*model, examples, examples, options);
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kFailedPrecondition) << stats.status();
  EXPECT_NE(stats.status().message().find("lora_A holds values that are not finite after 1 "
                                          "optimizer steps"),
            std::string::npos)
      << stats.status();
}

TEST(SftDataTest, PromptTokensCarryNoLoss) {
  const PromptStyle style = *PromptStyleFromName("alpaca");
  std::vector<SftExample> examples =
      *TokenizeSft({{"Echo", "ab", "ab"}, {"Say hi.", "", "hi"}}, style, CharEncoder(), {});
  const SftExample& e = examples[0];
  const int64_t prompt = static_cast<int64_t>(style.Apply("Echo", "ab").size()) + 1;  // + BOS
  ASSERT_EQ(e.prompt_tokens, prompt);
  ASSERT_EQ(e.input_ids.size(), static_cast<size_t>(prompt + 3));  // "ab" + EOS
  for (int64_t t = 0; t < prompt; ++t) EXPECT_EQ(e.labels[t], kIgnoreIndex);
  for (size_t t = prompt; t < e.input_ids.size(); ++t) EXPECT_EQ(e.labels[t], e.input_ids[t]);

  // In a padded batch, only logits that predict response tokens get a gradient: logits at
  // prompt positions (but the last) and at padding can change without changing the loss.
  const SftBatch batch = CollateSft({&examples[0], &examples[1]}, /*pad_id=*/0);
  EXPECT_EQ(batch.target_tokens, 3 + 3);
  at::manual_seed(5);
  at::Tensor logits = at::randn({2, batch.input_ids.size(1), 96}).set_requires_grad(true);
  at::Tensor loss = SftLoss(logits, batch.labels);
  loss.backward();
  const at::Tensor touched = logits.grad().abs().sum(-1) > 0;  // [B, T]
  for (int64_t b = 0; b < 2; ++b) {
    const SftExample& x = examples[b];
    for (int64_t t = 0; t < batch.input_ids.size(1); ++t) {
      const bool predicts_response =
          t >= x.prompt_tokens - 1 && t < static_cast<int64_t>(x.input_ids.size()) - 1;
      EXPECT_EQ(touched[b][t].item<bool>(), predicts_response) << b << "," << t;
    }
  }
  // Changing prompt-position logits leaves the loss as it was.
  at::Tensor edited = logits.detach().clone();
  edited[0].narrow(0, 0, prompt - 1).normal_();
  EXPECT_EQ(SftLoss(edited, batch.labels).item<double>(), loss.item<double>());
  // Without the mask the prompt counts and the loss differs.
  SftOptions unmasked;
  unmasked.mask_prompt = false;
  EXPECT_EQ(TokenizeSft({{"Echo", "ab", "ab"}}, style, CharEncoder(), unmasked)->at(0).labels,
            e.input_ids);
}

TEST(SftDataTest, LongExamplesAreTruncatedOrDropped) {
  const PromptStyle style = *PromptStyleFromName("default");
  SftStats stats;
  std::vector<SftExample> examples =
      *TokenizeSft({{"abc", "", "0123456789"}, {"a long long prompt", "", "x"}, {"ab", "", "c"}},
                   style, CharEncoder(), {8, true}, &stats);
  EXPECT_EQ(stats.truncated, 1);
  EXPECT_EQ(stats.dropped, 1);
  ASSERT_EQ(examples.size(), 2u);
  EXPECT_EQ(examples[0].input_ids.size(), 8u);
  absl::StatusOr<std::vector<SftExample>> none =
      TokenizeSft({{"a long long prompt", "", "x"}}, style, CharEncoder(), {8, true});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("max_seq_length"), std::string::npos);
}

TEST(SftDataTest, AlpacaJsonErrors) {
  EXPECT_EQ(ParseAlpacaJson("[{\"instruction\": \"a\", \"output\": \"b\"}]", "f")->size(), 1u);
  for (const char* bad : {"[{\"instruction\": ", "{}", "[]", "[1]", "[{\"instruction\": \"a\"}]",
                          "[{\"instruction\": \"a\", \"output\": 3}]"}) {
    absl::StatusOr<std::vector<InstructionRecord>> records = ParseAlpacaJson(bad, "f.json");
    EXPECT_EQ(records.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StartsWith(records.status().message(), "f.json")) << bad;
  }
  EXPECT_EQ(LoadAlpacaJson("/nonexistent.json").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ParsePeftMethod("qlora").status().code(), absl::StatusCode::kInvalidArgument);
}

// The tools as a user runs them.
struct ToolRun {
  int status = -1;
  std::string out, err;
};

ToolRun Execute(const std::string& tool, const std::string& args) {
  const std::string out = TempDir("run") + "/stdout.txt", err = TempDir("run") + "/stderr.txt";
  ToolRun run;
  const int raw =
      std::system(absl::StrCat("tools/", tool, " ", args, " >", out, " 2>", err).c_str());
  run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  run.out = ReadAll(out);
  run.err = ReadAll(err);
  return run;
}

void ExpectCleanFailure(const ToolRun& run, const std::string& needle) {
  EXPECT_EQ(run.status, 1) << run.err;
  const std::string err(absl::StripTrailingAsciiWhitespace(run.err));
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 0) << "more than one line:\n" << err;
  EXPECT_NE(err.find("error"), std::string::npos) << err;
  EXPECT_NE(err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << err;
}

TEST(FinetuneToolTest, BadInputsFailWithOneLine) {
  const std::string dir = TempDir("tool_bad");
  WriteText(dir + "/bad.json", "[{\"instruction\": \"a\",");
  WriteText(dir + "/good.json",
            "[{\"instruction\": \"a\", \"output\": \"b\"}, "
            "{\"instruction\": \"c\", \"output\": \"d\"}]");
  const std::string out = " --out_dir=" + dir + "/out";
  ExpectCleanFailure(Execute("finetune", "--method=qlora --data=" + dir + "/good.json" + out),
                     "unknown fine-tuning method 'qlora'");
  ExpectCleanFailure(Execute("finetune", "--data=" + dir + "/missing.json" + out), "missing.json");
  ExpectCleanFailure(Execute("finetune", "--data=" + dir + "/bad.json" + out), "malformed JSON");
  ExpectCleanFailure(
      Execute("finetune", "--data=" + dir + "/good.json" + out + " --prompt_style=nope"),
      "unknown prompt style 'nope'");
  ExpectCleanFailure(
      Execute("finetune", "--data=" + dir + "/good.json" + out + " --max_seq_length=4"),
      "max_seq_length");
  ExpectCleanFailure(
      Execute("finetune", "--data=" + dir + "/good.json" + out + " --method=adapter --merge"),
      "--merge");
  ExpectCleanFailure(Execute("merge_lora", "--checkpoint_dir=" + dir + " --out_dir=" + dir + "/m"),
                     "lit_model.pth.lora");
  // The input directory is never the output, and that is known before any training.
  ExpectCleanFailure(
      Execute("finetune", "--data=" + dir + "/good.json --out_dir=tools/default_model"),
      "never writes into its input");
  WriteText(dir + "/a_file", "x");
  ExpectCleanFailure(
      Execute("finetune", "--data=" + dir + "/good.json --out_dir=" + dir + "/a_file"),
      "is a file");
  ExpectCleanFailure(
      Execute("finetune", "--data=" + dir + "/good.json --out_dir=" + dir + "/out --eval_iters=-1"),
      "eval");
  // An infinite rate trained and saved weights that are not numbers, with exit status 0.
  ExpectCleanFailure(Execute("finetune", "--data=" + dir + "/good.json" + out + " --lr=inf"),
                     "--lr must be a finite number >= 0, got inf");
  ExpectCleanFailure(Execute("finetune", "--data=" + dir + "/good.json" + out + " --grad_clip=-1"),
                     "--grad_clip must be a finite number >= 0, got -1");
  // A config that claims 2^20 layers over the 4-layer default model is refused from the
  // checkpoint's tensors before any module is built (it was built layer by layer for minutes).
  const std::string huge = dir + "/huge";
  ASSERT_EQ(std::system(("rm -rf " + huge + " && cp -rL tools/default_model " + huge).c_str()), 0);
  std::string yaml = ReadAll(huge + "/model_config.yaml");
  ASSERT_NE(yaml.find("n_layer: 4\n"), std::string::npos);
  yaml.replace(yaml.find("n_layer: 4\n"), 10, "n_layer: 1048576\n");
  WriteText(huge + "/model_config.yaml", yaml);
  const auto start = std::chrono::steady_clock::now();
  const ToolRun run =
      Execute("finetune", "--checkpoint_dir=" + huge + " --data=" + dir + "/good.json" + out);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  ExpectCleanFailure(run, "n_layer: 1048576");
  EXPECT_NE(run.err.find("holds 4 layers"), std::string::npos) << run.err;
}

TEST(FinetuneToolTest, LoraOnTheDefaultModelThenMergeThenGenerate) {
  const std::string dir = TempDir("tool_e2e");
  WriteText(dir + "/data.json",
            "[{\"instruction\": \"Quote Genesis 1:3.\", \"input\": \"\", \"output\": \"And God "
            "said, Let there be light: and there was light.\"},"
            " {\"instruction\": \"Which book?\", \"input\": \"In the beginning\", \"output\": "
            "\"Genesis\"},"
            " {\"instruction\": \"Which book?\", \"input\": \"The LORD is my shepherd\", "
            "\"output\": \"Psalms\"}]");
  const ToolRun tuned = Execute(
      "finetune", absl::StrCat("--method=lora --data=", dir, "/data.json --out_dir=", dir,
                               "/lora --max_steps=3 --global_batch_size=2 --micro_batch_size=1 "
                               "--val_split_fraction=0.3 --lr=1e-2 --warmup_steps=1 --merge "
                               "--lora_head"));
  ASSERT_EQ(tuned.status, 0) << tuned.err;
  // The statistics go to stderr; stdout stays empty.
  EXPECT_NE(tuned.err.find("peak_rss_bytes="), std::string::npos) << tuned.err;
  EXPECT_EQ(tuned.out, "");
  for (const char* file : {"lit_model.pth.lora", "lit_model.pth", "model_config.yaml",
                           "hyperparameters.yaml", "prompt_style.yaml", "tokenizer.model"}) {
    EXPECT_FALSE(ReadAll(absl::StrCat(dir, "/lora/", file)).empty()) << file;
  }
  EXPECT_EQ(ReadAll(dir + "/lora/prompt_style.yaml"), "class_path: litgpt.prompts.Alpaca\n");
  EXPECT_NE(ReadAll(dir + "/lora/model_config.yaml").find("lora_r: 8"), std::string::npos);

  // merge_lora (base from hyperparameters.yaml) writes the same merged weights.
  const ToolRun merged = Execute(
      "merge_lora", absl::StrCat("--checkpoint_dir=", dir, "/lora --out_dir=", dir, "/merged"));
  ASSERT_EQ(merged.status, 0) << merged.err;
  absl::StatusOr<TensorMap> a = ReadCheckpointTensors(dir + "/lora");
  absl::StatusOr<TensorMap> b = ReadCheckpointTensors(dir + "/merged");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), b->size());
  for (const auto& [name, tensor] : *a) EXPECT_TRUE(at::equal(tensor, b->at(name))) << name;

  // The merged checkpoint loads as a plain model with the unmerged LoRA model's logits.
  absl::StatusOr<LoadedModel> unmerged = LoadPeftCheckpoint(dir + "/lora", PeftMethod::kLora);
  absl::StatusOr<LoadedModel> plain = LoadCheckpoint(dir + "/merged");
  ASSERT_TRUE(unmerged.ok()) << unmerged.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  const at::Tensor tokens = at::arange(1, 40, at::kLong).unsqueeze(0);
  // Logits here are O(10): float32 rounding of W + B·A leaves ~1e-6 relative.
  const at::Tensor expected = Logits(*unmerged->model, tokens);
  EXPECT_LT(MaxDiff(Logits(*plain->model, tokens), expected),
            1e-6 * expected.abs().max().item<double>() + 1e-5);

  const ToolRun generated =
      Execute("generate", absl::StrCat("--checkpoint_dir=", dir,
                                       "/merged --prompt_ids=1,2,3 --max_new_tokens=4 "
                                       "--temperature=0 --print_ids"));
  EXPECT_EQ(generated.status, 0) << generated.err;

  // The default merge (LitGPT's) leaves the LoRA files as they are: it can run again, and the
  // directory generates as a plain model.
  for (int run = 0; run < 2; ++run) {
    const ToolRun beside = Execute("merge_lora", absl::StrCat("--checkpoint_dir=", dir, "/lora"));
    ASSERT_EQ(beside.status, 0) << beside.err;
  }
  EXPECT_NE(ReadAll(dir + "/lora/model_config.yaml").find("lora_r: 8"), std::string::npos);
  EXPECT_EQ(Execute("generate", absl::StrCat("--checkpoint_dir=", dir,
                                             "/lora --prompt_ids=1,2,3 --max_new_tokens=4 "
                                             "--temperature=0 --print_ids"))
                .status,
            0);
  // Never into the base checkpoint (named by hyperparameters.yaml).
  const std::string hyper = ReadAll(dir + "/lora/hyperparameters.yaml");
  const size_t at = hyper.find("checkpoint_dir: ") + 16;
  const std::string base = hyper.substr(at, hyper.find('\n', at) - at);
  ExpectCleanFailure(
      Execute("merge_lora", absl::StrCat("--checkpoint_dir=", dir, "/lora --out_dir=", base)),
      "never writes into its input");
}

// Cache-aware training from the tool: sequences in chunks through an h2o cache far smaller
// than the examples; bad cache flags end with one error line naming the flag.
TEST(FinetuneToolTest, CacheAwareLoraRunsThroughTheCachePolicy) {
  const std::string dir = TempDir("tool_chunked");
  WriteText(dir + "/data.json",
            "[{\"instruction\": \"Quote Genesis 1:1 to 1:3.\", \"input\": \"\", \"output\": "
            "\"In the beginning God created the heaven and the earth. And the earth was without "
            "form, and void; and darkness was upon the face of the deep. And the Spirit of God "
            "moved upon the face of the waters. And God said, Let there be light: and there was "
            "light.\"},"
            " {\"instruction\": \"Which book?\", \"input\": \"The LORD is my shepherd; I "
            "shall not want. He maketh me to lie down in green pastures\", \"output\": "
            "\"Psalms\"}]");
  const std::string common =
      absl::StrCat("--method=lora --data=", dir, "/data.json --max_steps=2 --global_batch_size=1 ",
                   "--micro_batch_size=1 --val_split_fraction=0.5 --warmup_steps=1 ");
  const ToolRun tuned =
      Execute("finetune", absl::StrCat(common, "--out_dir=", dir, "/out --kv_cache=h2o ",
                                       "--kv_budget=8 --chunk_size=4 --lora_dropout=0"));
  ASSERT_EQ(tuned.status, 0) << tuned.err;
  EXPECT_NE(tuned.err.find("cache-aware training: h2o budget=8 bits=16, chunks of 4 (first 8), "
                           "full-precision checkpoints"),
            std::string::npos)
      << tuned.err;
  EXPECT_NE(tuned.err.find("final_val_loss="), std::string::npos) << tuned.err;
  EXPECT_FALSE(ReadAll(dir + "/out/lit_model.pth.lora").empty());
  const ToolRun packed = Execute(
      "finetune", absl::StrCat(common, "--out_dir=", dir, "/packed --kv_cache=h2o --kv_budget=8 ",
                               "--chunk_size=4 --lora_dropout=0 --checkpoint_bits=8"));
  ASSERT_EQ(packed.status, 0) << packed.err;
  EXPECT_NE(packed.err.find("(first 8), int8 checkpoints"), std::string::npos) << packed.err;
  EXPECT_FALSE(ReadAll(dir + "/packed/lit_model.pth.lora").empty());
  ExpectCleanFailure(Execute("finetune", absl::StrCat(common, "--out_dir=", dir,
                                                      "/bad --kv_cache=h2o --kv_budget=8 "
                                                      "--checkpoint_bits=4")),
                     "--checkpoint_bits must be 16 or 8, got 4");
  ExpectCleanFailure(Execute("finetune", absl::StrCat(common, "--out_dir=", dir,
                                                      "/bad --kv_cache=qh2o "
                                                      "--kv_budget=8")),
                     "--kv_bits 8 or 4");
  ExpectCleanFailure(Execute("finetune", absl::StrCat(common, "--out_dir=", dir,
                                                      "/bad --kv_cache=h2o "
                                                      "--kv_budget=8 --chunk_size=0")),
                     "--chunk_size must be >= 1");
  ExpectCleanFailure(
      Execute("finetune", absl::StrCat(common, "--out_dir=", dir, "/bad --kv_cache=h2o")),
      "--kv_budget must be >= 1");
}

// A `finetune` LoRA used at run time: the fine-tune directory itself and --lora over the base
// score, generate and measure perplexity as the merge_lora output does; bad --lora values
// end with one error line.
TEST(FinetuneToolTest, LoraAtRunTimeEqualsTheMergedLora) {
  const std::string dir = TempDir("tool_runtime");
  const std::string base = "tools/default_model";
  WriteText(dir + "/data.json",
            "[{\"instruction\": \"Which book?\", \"input\": \"In the beginning\", \"output\": "
            "\"Genesis\"},"
            " {\"instruction\": \"Which book?\", \"input\": \"The LORD is my shepherd\", "
            "\"output\": \"Psalms\"},"
            " {\"instruction\": \"Which book?\", \"input\": \"Let there be light\", "
            "\"output\": \"Genesis\"}]");
  const ToolRun tuned = Execute(
      "finetune", absl::StrCat("--method=lora --data=", dir, "/data.json --out_dir=", dir,
                               "/lora --max_steps=3 --global_batch_size=1 --micro_batch_size=1 "
                               "--val_split_fraction=0.3 --lr=2e-2 --warmup_steps=1 --lora_mlp "
                               "--lora_head"));
  ASSERT_EQ(tuned.status, 0) << tuned.err;
  const ToolRun merged = Execute(
      "merge_lora", absl::StrCat("--checkpoint_dir=", dir, "/lora --out_dir=", dir, "/merged"));
  ASSERT_EQ(merged.status, 0) << merged.err;

  int scored = 0;
  auto score = [&](const std::string& flags) {
    const std::string out = absl::StrCat(dir, "/logits", scored++, ".npy");
    const ToolRun run =
        Execute("score", absl::StrCat(flags, " --token_ids=1,5,9,20,33,7,2 --logits_out=", out));
    EXPECT_EQ(run.status, 0) << flags << ": " << run.err;
    return ReadNpy(out).value();
  };
  const at::Tensor finetune = score("--checkpoint_dir=" + dir + "/lora");
  const at::Tensor merged_logits = score("--checkpoint_dir=" + dir + "/merged");
  const at::Tensor base_logits = score("--checkpoint_dir=" + base);
  EXPECT_GT(MaxDiff(finetune, base_logits), 1e-4);  // the fine-tune matters
  // Logits here are O(10): float32 rounding leaves ~1e-6 relative.
  const double tolerance = 1e-6 * finetune.abs().max().item<double>() + 1e-5;
  EXPECT_LT(MaxDiff(finetune, merged_logits), tolerance);
  EXPECT_EQ(MaxDiff(score("--checkpoint_dir=" + base + " --lora=" + dir + "/lora"), finetune), 0);
  // Repeated and comma-separated --lora stack: halves add up to the whole.
  const std::string half = dir + "/lora:0.5";
  EXPECT_LT(
      MaxDiff(score("--checkpoint_dir=" + base + " --lora=" + half + " --lora " + half), finetune),
      tolerance);
  EXPECT_LT(MaxDiff(score(absl::StrCat("--checkpoint_dir=", base, " --lora=", dir, "/lora:0.25,",
                                       dir, "/lora:0.75")),
                    finetune),
            tolerance);
  EXPECT_LT(MaxDiff(score("--checkpoint_dir=" + base + " --lora=" + dir + "/lora:0"), base_logits),
            1e-6);

  const std::string greedy = " --prompt_ids=1,2,3 --max_new_tokens=8 --temperature=0 --print_ids";
  const ToolRun generated = Execute("generate", "--checkpoint_dir=" + dir + "/lora" + greedy);
  ASSERT_EQ(generated.status, 0) << generated.err;
  EXPECT_EQ(Execute("generate", "--checkpoint_dir=" + dir + "/merged" + greedy).out, generated.out);
  EXPECT_EQ(Execute("generate", "--lora=" + dir + "/lora" + greedy).out, generated.out);

  WriteText(dir + "/text.txt", "In the beginning God created the heaven and the earth.\n");
  const std::string text = " --text_file=" + dir + "/text.txt";
  const ToolRun perplexity = Execute("perplexity", "--checkpoint_dir=" + dir + "/lora" + text);
  ASSERT_EQ(perplexity.status, 0) << perplexity.err;
  EXPECT_EQ(Execute("perplexity", "--lora=" + dir + "/lora" + text).out, perplexity.out);

  // eval_cache: the dense perplexity (column 7 of results.csv) is the fine-tune's both ways.
  auto eval_cache = [&](const std::string& flags) {
    const std::string out = dir + "/eval_cache" + std::to_string(scored++);
    const ToolRun run = Execute("eval_cache", flags +
                                                  " --random_tokens=64 --policies=dense --bits=16 "
                                                  "--attention_report=false --out_dir=" +
                                                  out);
    EXPECT_EQ(run.status, 0) << flags << ": " << run.err;
    const std::string csv = ReadAll(out + "/results.csv");
    const std::string row = csv.substr(csv.find('\n') + 1);
    std::vector<std::string> cells;
    for (size_t begin = 0, end; begin <= row.size(); begin = end + 1) {
      end = std::min(row.find_first_of(",\n", begin), row.size());
      cells.push_back(row.substr(begin, end - begin));
    }
    return cells.size() > 6 ? cells[6] : "";
  };
  const std::string finetune_ppl = eval_cache("--checkpoint_dir=" + dir + "/lora");
  EXPECT_FALSE(finetune_ppl.empty());
  EXPECT_EQ(eval_cache("--lora=" + dir + "/lora --checkpoint_dir=" + base), finetune_ppl);
  EXPECT_NE(eval_cache("--checkpoint_dir=" + base), finetune_ppl);

  // Bad --lora values: one line, status 1, naming the flag.
  const std::string ids = " --token_ids=1,2 --logits_out=" + dir + "/bad.npy";
  ExpectCleanFailure(
      Execute("score", "--checkpoint_dir=" + base + " --lora=" + dir + "/nowhere" + ids),
      "--lora[0] " + dir + "/nowhere: no such directory");
  ExpectCleanFailure(Execute("score", "--checkpoint_dir=" + base + " --lora=" + base + ids),
                     "no lit_model.pth.lora");
  ExpectCleanFailure(Execute("generate", "--lora=" + dir + "/lora:abc" + greedy),
                     "scale 'abc' is not a number");
  ExpectCleanFailure(Execute("generate", "--lora=" + dir + "/lora:-1" + greedy),
                     "must be finite and >= 0");
  ExpectCleanFailure(Execute("chat", "--lora=" + dir + "/lora:nan"), "--lora=");
  ExpectCleanFailure(Execute("perplexity", "--lora=:1" + text), "names no directory");
  ExpectCleanFailure(Execute("generate", "--lora=" + greedy), "--lora is empty");
  ExpectCleanFailure(
      Execute("eval_cache", "--random_model=pythia-14m --random_tokens=8 --lora=" + dir + "/lora"),
      "--lora applies to a --checkpoint_dir");
}

}  // namespace
}  // namespace lgpt
