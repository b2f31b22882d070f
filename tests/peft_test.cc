// PEFT variants composed on the base model: LitGPT's LoRA, LLaMA-Adapter and Adapter v2
// golden outputs (with and without a KV cache), fresh variants
// equal the base model exactly, cached decoding equals the full forward pass for every
// chunking (sliding-window presets included), and merged LoRA equals unmerged LoRA.
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "absl/strings/str_replace.h"
#include "core/config/config_presets.h"
#include "core/base/device.h"
#include "core/model/checkpoint.h"
#include "core/model/gpt.h"
#include "core/io/npy.h"
#include "gtest/gtest.h"
#include "peft/adapter.h"
#include "peft/adapter_v2.h"
#include "peft/lora.h"
#include "peft/peft_method.h"
#include "tests/test_models.h"

namespace lgpt {
namespace {

double MaxDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a.cpu() - b.cpu()).abs().max().item<double>();
}

at::Tensor Logits(GPTImpl& model, const at::Tensor& tokens) {
  at::NoGradGuard no_grad;
  absl::StatusOr<at::Tensor> logits = model.Forward(tokens);
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? logits->cpu() : at::Tensor();
}

// Prefill `prompt` tokens in chunks, then decode one token a step; all logits.
at::Tensor CachedLogits(GPTImpl& model, const at::Tensor& tokens, int64_t chunk, int64_t prompt) {
  at::NoGradGuard no_grad;
  auto cache = model.NewDenseCache(tokens.size(0), tokens.size(1));
  EXPECT_TRUE(cache.ok());
  std::vector<at::Tensor> pieces;
  for (int64_t position = 0; position < tokens.size(1);) {
    const int64_t length = position < prompt ? std::min(chunk, prompt - position) : 1;
    ForwardOptions options;
    options.positions = at::arange(position, position + length, at::kLong)
                            .unsqueeze(0)
                            .expand({tokens.size(0), length});
    auto logits = model.Forward(tokens.narrow(1, position, length), cache->get(), options);
    EXPECT_TRUE(logits.ok()) << logits.status();
    pieces.push_back(logits->cpu());
    position += length;
  }
  return at::cat(pieces, 1);
}

// Copies base weights into a variant: `x.weight` feeds `x.linear.weight`; the variant's own
// parameters keep their fresh initialisation.
void LoadBaseInto(GPTImpl& base, GPTImpl& variant) {
  TensorMap base_state = StateDict(base);
  TensorMap mapped;
  for (const auto& [name, tensor] : StateDict(variant)) {
    const std::string base_name = absl::StrReplaceAll(name, {{".linear.", "."}});
    if (base_state.count(base_name)) mapped[name] = base_state[base_name];
  }
  ASSERT_TRUE(LoadStateDict(variant, mapped, "base", /*allow_missing=*/true).ok());
}

struct Variant {
  std::string name;
  std::function<absl::StatusOr<GPT>(const Config&)> create;
};

std::vector<Variant> Variants() {
  return {
      {"lora", [](const Config& c) { return CreateLoraGPT(c); }},
      {"adapter", [](const Config& c) { return CreateAdapterGPT(c); }},
      {"adapter_legacy", [](const Config& c) { return CreateAdapterGPT(c, true); }},
      {"adapter_v2", [](const Config& c) { return CreateAdapterV2GPT(c); }},
  };
}

Config PeftConfig(const std::string& preset) {
  Config config = ShrinkConfig(*PresetFromName(preset)).value();
  config.lora_r = 4;
  config.lora_alpha = 8;
  config.lora_query = config.lora_key = config.lora_value = true;
  config.lora_projection = config.lora_mlp = config.lora_head = true;
  config.adapter_prompt_length = 3;
  config.adapter_start_layer = 1;
  return config;
}

class PeftPresetTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PeftPresetTest, FreshVariantsEqualTheBaseModel) {
  const Config config = PeftConfig(GetParam());
  GPT base = *GPTImpl::Create(config);
  RandomizeWeights(*base, 5);
  at::manual_seed(3);
  const at::Tensor tokens = at::randint(0, config.vocab_size, {2, 10}, at::kLong);
  const at::Tensor expected = Logits(*base, tokens);
  for (const Variant& variant : Variants()) {
    absl::StatusOr<GPT> model = variant.create(config);
    ASSERT_TRUE(model.ok()) << model.status();
    LoadBaseInto(*base, **model);
    EXPECT_EQ(MaxDiff(Logits(**model, tokens), expected), 0.0) << variant.name;
  }
}

TEST_P(PeftPresetTest, CachedDecodingEqualsFullForward) {
  const Config config = PeftConfig(GetParam());
  at::manual_seed(11);
  const at::Tensor tokens = at::randint(0, config.vocab_size, {2, 13}, at::kLong);
  const int64_t window = config.sliding_window_size.value_or(4);
  for (const Variant& variant : Variants()) {
    GPT model = *variant.create(config);
    // Non-zero LoRA B, gates, scales and biases, so every variant's parameters matter.
    RandomizeWeights(*model, 17);
    model->eval();
    const at::Tensor full = Logits(*model, tokens);
    for (int64_t chunk : {int64_t{1}, int64_t{2}, int64_t{3}, window, window + 2}) {
      EXPECT_LT(MaxDiff(CachedLogits(*model, tokens, chunk, 8), full), 1e-5)
          << variant.name << ", chunk " << chunk;
    }
  }
}

TEST_P(PeftPresetTest, MergedLoraEqualsUnmergedLora) {
  const Config config = PeftConfig(GetParam());
  GPT lora = *CreateLoraGPT(config);
  RandomizeWeights(*lora, 23);
  at::manual_seed(4);
  const at::Tensor tokens = at::randint(0, config.vocab_size, {1, 12}, at::kLong);
  const at::Tensor unmerged = Logits(*lora, tokens);
  // Exported as a plain base checkpoint...
  GPT base = *GPTImpl::Create(config);
  ASSERT_TRUE(LoadStateDict(*base, MergedBaseStateDict(*lora), "merged").ok());
  EXPECT_LT(MaxDiff(Logits(*base, tokens), unmerged), 1e-5);
  // ... and merged in place.
  ASSERT_TRUE(MergeLora(*lora).ok());
  EXPECT_LT(MaxDiff(Logits(*lora, tokens), unmerged), 1e-5);
  EXPECT_GT(MaxDiff(Logits(*base, tokens), Logits(*GPTImpl::Create(config).value(), tokens)), 0);
}

INSTANTIATE_TEST_SUITE_P(Presets, PeftPresetTest,
                         ::testing::Values("Llama-3.2-1B", "pythia-14m", "Gemma-2-2b",
                                           "Mistral-7B-v0.1", "Mixtral-8x7B-v0.1", "phi-2",
                                           "Qwen3-0.6B", "falcon-7b"));

TEST(AdapterV2Test, FoldedScalesAndBiasesEqualTheAdapterV2Model) {
  Config config = PeftConfig("phi-2");  // biases on every linear
  config.adapter_start_layer = config.n_layer;  // no prefix: only scales and biases
  GPT v2 = *CreateAdapterV2GPT(config);
  RandomizeWeights(*v2, 29);
  at::manual_seed(5);
  const at::Tensor tokens = at::randint(0, config.vocab_size, {1, 9}, at::kLong);
  absl::StatusOr<TensorMap> folded = FoldedAdapterV2StateDict(*v2);
  ASSERT_TRUE(folded.ok()) << folded.status();
  GPT base = *GPTImpl::Create(config);
  ASSERT_TRUE(LoadStateDict(*base, *folded, "folded").ok());
  EXPECT_LT(MaxDiff(Logits(*base, tokens), Logits(*v2, tokens)), 1e-5);
  // Without a bias slot, a non-zero adapter bias cannot be folded.
  GPT llama = *CreateAdapterV2GPT(PeftConfig("Llama-3.2-1B"));
  RandomizeWeights(*llama, 30);
  EXPECT_EQ(FoldedAdapterV2StateDict(*llama).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(LoraTest, GqaWithOnlyQueryAndValue) {
  Config config = PeftConfig("Llama-3.2-1B");
  ASSERT_LT(config.QueryGroups(), config.n_head);
  config.lora_key = false;
  config.lora_projection = config.lora_mlp = config.lora_head = false;
  GPT lora = *CreateLoraGPT(config);
  const TensorMap state = StateDict(*lora);
  const int64_t q = config.n_head * config.HeadSize(), kv = config.QueryGroups() * config.HeadSize();
  EXPECT_EQ(state.at("transformer.h.0.attn.qkv.lora_A").size(0), 2 * config.lora_r);
  EXPECT_EQ(state.at("transformer.h.0.attn.qkv.lora_B").size(0), q + kv);
  EXPECT_EQ(state.count("transformer.h.0.attn.proj.lora_A"), 0u);
  RandomizeWeights(*lora, 31);
  // The update touches Q and V rows only.
  auto projections = LoraProjections(*lora);
  const at::Tensor delta = projections.front()->DeltaWeight();
  EXPECT_GT(delta.narrow(0, 0, q).abs().max().item<double>(), 0);
  EXPECT_EQ(delta.narrow(0, q, kv).abs().max().item<double>(), 0);
  EXPECT_GT(delta.narrow(0, q + kv, kv).abs().max().item<double>(), 0);
  at::manual_seed(6);
  const at::Tensor tokens = at::randint(0, config.vocab_size, {1, 10}, at::kLong);
  const at::Tensor unmerged = Logits(*lora, tokens);
  EXPECT_LT(MaxDiff(CachedLogits(*lora, tokens, 3, 6), unmerged), 1e-5);
  ASSERT_TRUE(MergeLora(*lora).ok());
  EXPECT_LT(MaxDiff(Logits(*lora, tokens), unmerged), 1e-5);
}

TEST(LoraTest, MatchesLitGptGolden) {
  const std::string dir = "tests/testdata/golden/llama2_lora";
  Config config = LoadConfigFile(dir + "/model_config.yaml").value();
  LoadOptions options;
  options.device = DefaultDevice();
  options.parts = LoraParts(config).value();
  absl::StatusOr<LoadedModel> loaded = LoadCheckpoint(dir, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const at::Tensor tokens = ReadNpy(dir + "/tokens.npy").value().unsqueeze(0);
  const at::Tensor expected = ReadNpy(dir + "/logits.npy").value();
  EXPECT_LT(MaxDiff(Logits(*loaded->model, tokens).squeeze(0), expected), 1e-4);
  for (int64_t chunk : {1, 3, 20}) {
    EXPECT_LT(MaxDiff(CachedLogits(*loaded->model, tokens, chunk, 20).squeeze(0), expected), 1e-4);
  }
  // The same file also loads as lit_model.pth.
  auto pth = ReadCheckpointTensors(dir);
  ASSERT_TRUE(pth.ok());
  EXPECT_GT(LoraStateDict(*loaded->model).size(), 0u);
  // Merged into a plain checkpoint, the base model reproduces LitGPT's LoRA logits.
  GPT base = *GPTImpl::Create(config);
  ASSERT_TRUE(LoadStateDict(*base, MergedBaseStateDict(*loaded->model), "merged").ok());
  EXPECT_LT(MaxDiff(Logits(*base, tokens).squeeze(0), expected), 1e-4);
}

// LitGPT's adapter.py / adapter_v2.py goldens (tests/testdata/golden_adapter, made by
// make_golden_adapter.py): GQA, prefix on layers 1 and 2 only, every gate, prefix, adapter
// bias and scale non-zero. LitGPT splits the prefix's QKV projection per query group, so
// its checkpoints load with legacy_qkv_split.
absl::StatusOr<LoadedModel> LoadAdapterGolden(const std::string& dir, bool v2,
                                              bool legacy_qkv_split) {
  absl::StatusOr<Config> config = LoadConfigFile(dir + "/model_config.yaml");
  if (!config.ok()) return config.status();
  LoadOptions options;
  options.device = DefaultDevice();
  absl::StatusOr<ModelParts> parts =
      v2 ? AdapterV2Parts(*config, legacy_qkv_split) : AdapterParts(*config, legacy_qkv_split);
  if (!parts.ok()) return parts.status();
  options.parts = *parts;
  return LoadCheckpoint(dir, options);
}

// Greedy continuation recomputed without a cache (argmax over all padded logits).
at::Tensor Greedy(GPTImpl& model, const at::Tensor& prompt, int64_t steps) {
  at::Tensor sequence = prompt.unsqueeze(0);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < steps; ++i) {
    const int64_t next = Logits(model, sequence)[0][-1].argmax().item<int64_t>();
    out.push_back(next);
    sequence = at::cat({sequence, at::full({1, 1}, next, at::kLong)}, 1);
  }
  return at::tensor(out, at::kLong);
}

class AdapterGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(AdapterGoldenTest, MatchesLitGpt) {
  const std::string dir = "tests/testdata/golden_adapter/" + GetParam();
  const bool v2 = GetParam() == "adapter_v2";
  absl::StatusOr<LoadedModel> loaded = LoadAdapterGolden(dir, v2, /*legacy_qkv_split=*/true);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  GPTImpl& model = *loaded->model;
  EXPECT_EQ(loaded->config.adapter_prompt_length, 5);
  EXPECT_EQ(loaded->config.adapter_start_layer, 1);
  const TensorMap state = StateDict(model);
  EXPECT_EQ(state.count("transformer.h.0.attn.gating_factor"), 0u);
  ASSERT_EQ(state.count("transformer.h.1.attn.gating_factor"), 1u);
  EXPECT_EQ(state.count("lm_head.adapter_scale"), v2 ? 1u : 0u);

  const at::Tensor tokens = ReadNpy(dir + "/tokens.npy").value().unsqueeze(0);
  const at::Tensor expected = ReadNpy(dir + "/logits.npy").value();
  EXPECT_LT(MaxDiff(Logits(model, tokens).squeeze(0), expected), 1e-4);
  // Cached decoding: prompt prefilled in chunks, then one token a step.
  for (int64_t chunk : {1, 3, 8}) {
    EXPECT_LT(MaxDiff(CachedLogits(model, tokens, chunk, 8).squeeze(0), expected), 1e-4)
        << "chunk " << chunk;
  }
  EXPECT_LT(MaxDiff(CachedLogits(model, tokens, 20, 20).squeeze(0), expected), 1e-4);
  const at::Tensor prompt = ReadNpy(dir + "/prompt.npy").value();
  const at::Tensor greedy = ReadNpy(dir + "/greedy.npy").value();
  EXPECT_TRUE(at::equal(Greedy(model, prompt, greedy.size(0)), greedy))
      << Greedy(model, prompt, greedy.size(0)) << " vs " << greedy;

  // The comparison is sensitive to the prefix: one layer's gates zeroed change the logits...
  {
    at::NoGradGuard no_grad;
    at::Tensor gate = state.at("transformer.h.2.attn.gating_factor");
    const at::Tensor saved = gate.clone();
    gate.zero_();
    EXPECT_GT(MaxDiff(Logits(model, tokens).squeeze(0), expected), 1e-2);
    gate.copy_(saved);
    EXPECT_LT(MaxDiff(Logits(model, tokens).squeeze(0), expected), 1e-4);
  }
  // ... and to the layout: the [Q | K | V] split of the prefix does not reproduce LitGPT.
  absl::StatusOr<LoadedModel> split = LoadAdapterGolden(dir, v2, /*legacy_qkv_split=*/false);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_GT(MaxDiff(Logits(*split->model, tokens).squeeze(0), expected), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(LitGpt, AdapterGoldenTest, ::testing::Values("adapter", "adapter_v2"));

TEST(PeftTrainableTest, OnlyTheMethodsParametersTrain) {
  const Config config = PeftConfig("Llama-3.2-1B");
  GPT lora = *CreateLoraGPT(config);
  MarkTrainable(*lora, PeftMethod::kLora);
  for (const auto& p : lora->named_parameters()) {
    EXPECT_EQ(p.value().requires_grad(), p.key().find("lora_") != std::string::npos) << p.key();
  }
  GPT adapter = *CreateAdapterGPT(config);
  MarkTrainable(*adapter, PeftMethod::kAdapter);
  int trainable = 0;
  for (const auto& p : adapter->named_parameters()) trainable += p.value().requires_grad();
  // adapter_wte and gating_factor on layers 1 .. n_layer-1.
  EXPECT_EQ(trainable, 2 * (config.n_layer - 1));
}

}  // namespace
}  // namespace lgpt
