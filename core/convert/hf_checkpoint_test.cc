// Unit tests of the Hugging Face conversion pieces that need no model: config.json texts as
// Hugging Face publishes them map to their presets, every preset's config survives
// HfConfigJson -> ConfigFromHfDir, the interleaved qkv layout against a per-head loop, and
// the shapes the converter expects. Whole-model round trips are in
// tests/convert_roundtrip_test.cc.
#include "core/convert/hf_checkpoint.h"

#include <ATen/ATen.h>
#include <sys/stat.h>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config/config_presets.h"
#include "core/io/safetensors.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

std::string DirWithConfig(const std::string& name, const std::string& config_json) {
  const std::string dir = absl::StrCat(testing::TempDir(), "/", name);
  ::mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/config.json") << config_json;
  return dir;
}

void ExpectSameConfig(const Config& actual, const Config& expected) {
  EXPECT_EQ(ConfigToYaml(actual), ConfigToYaml(expected));
}

TEST(ConfigFromHfDirTest, PublishedConfigsMatchTheirPresets) {
  struct Case {
    std::string dir, preset, json;
  };
  const std::vector<Case> cases = {
      {"llama2", "Llama-2-7b-hf", R"({
        "_name_or_path": "meta-llama/Llama-2-7b-hf", "architectures": ["LlamaForCausalLM"],
        "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
        "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": null, "tie_word_embeddings": false, "torch_dtype": "float16",
        "transformers_version": "4.31.0.dev0", "use_cache": true, "vocab_size": 32000})"},
      // No name inside: the directory's name is the preset's.
      {"pythia-14m", "pythia-14m", R"({
        "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0,
        "hidden_act": "gelu", "hidden_size": 128, "initializer_range": 0.02,
        "intermediate_size": 512, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
        "model_type": "gpt_neox", "num_attention_heads": 4, "num_hidden_layers": 6,
        "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": false,
        "torch_dtype": "float16", "use_cache": true, "use_parallel_residual": true,
        "vocab_size": 50304})"},
      {"falcon", "falcon-7b", R"({
        "_name_or_path": "tiiuae/falcon-7b", "alibi": false, "apply_residual_connection_post_layernorm": false,
        "architectures": ["FalconForCausalLM"], "attention_dropout": 0.0, "bias": false,
        "bos_token_id": 11, "eos_token_id": 11, "hidden_dropout": 0.0, "hidden_size": 4544,
        "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "falcon",
        "multi_query": true, "new_decoder_architecture": false, "num_attention_heads": 71,
        "num_hidden_layers": 32, "parallel_attn": true, "torch_dtype": "bfloat16",
        "vocab_size": 65024})"},
      {"mistral", "Mistral-7B-v0.1", R"({
        "_name_or_path": "mistralai/Mistral-7B-v0.1", "architectures": ["MistralForCausalLM"],
        "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
        "vocab_size": 32000})"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.preset);
    absl::StatusOr<Config> expected = ConfigFromName(c.preset);
    ASSERT_TRUE(expected.ok()) << expected.status();
    absl::StatusOr<Config> actual = ConfigFromHfDir(DirWithConfig(c.dir, c.json), "");
    ASSERT_TRUE(actual.ok()) << actual.status();
    ExpectSameConfig(*actual, *expected);
  }
}

// Multimodal Gemma 3: sizes under text_config, whose vocab_size counts image tokens; LitGPT
// keeps the text vocabulary.
TEST(ConfigFromHfDirTest, MultimodalGemma3KeepsTheTextVocabulary) {
  absl::StatusOr<Config> expected = ConfigFromName("Gemma-3-4b-it");
  ASSERT_TRUE(expected.ok());
  std::string text_config = HfConfigJson(*expected, HfFamily::kGemma3, true, at::kBFloat16);
  const std::string rows = absl::StrCat("\"vocab_size\": ", expected->PaddedVocabSize());
  ASSERT_NE(text_config.find(rows), std::string::npos);
  text_config.replace(text_config.find(rows), rows.size(), "\"vocab_size\": 262208");
  const std::string dir = DirWithConfig(
      "gemma3_mm", absl::StrCat(R"({"architectures": ["Gemma3ForConditionalGeneration"],
          "_name_or_path": "google/gemma-3-4b-it", "model_type": "gemma3", "text_config": )",
                                text_config, "}"));
  absl::StatusOr<Config> actual = ConfigFromHfDir(dir, "");
  ASSERT_TRUE(actual.ok()) << actual.status();
  ExpectSameConfig(*actual, *expected);
}

TEST(ConfigFromHfDirTest, SizesSelectAPresetWhenNoNameMatches) {
  const std::string dir = DirWithConfig("renamed_llama", R"({
      "_name_or_path": "/models/my-finetune", "architectures": ["LlamaForCausalLM"],
      "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32,
      "num_hidden_layers": 16, "num_key_value_heads": 8, "vocab_size": 128256,
      "rope_theta": 500000.0, "rms_norm_eps": 1e-05, "max_position_embeddings": 131072})");
  absl::StatusOr<Config> config = ConfigFromHfDir(dir, "");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->n_layer, 16);
  EXPECT_EQ(config->n_embd, 2048);
  EXPECT_EQ(config->QueryGroups(), 8);
  EXPECT_EQ(config->PaddedVocabSize(), 128256);
  EXPECT_EQ(*HfFamilyOf(*config), HfFamily::kLlama);
}

// Every preset a family covers: config.json written for it reads back as the same config
// (LitGPT's vocab_size aside, which config.json does not hold).
TEST(ConfigFromHfDirTest, EveryPresetSurvivesConfigJson) {
  int converted = 0, skipped = 0;
  for (const std::string& name : PresetNames()) {
    absl::StatusOr<Config> preset = ConfigFromName(name);
    ASSERT_TRUE(preset.ok()) << name;
    absl::StatusOr<HfFamily> family = HfFamilyOf(*preset);
    if (!family.ok()) {
      ++skipped;
      continue;
    }
    SCOPED_TRACE(name);
    const std::string dir = DirWithConfig("preset_" + std::to_string(converted),
                                          HfConfigJson(*preset, *family, false, at::kFloat));
    absl::StatusOr<Config> back = ConfigFromHfDir(dir, "");
    ASSERT_TRUE(back.ok()) << back.status();
    Config expected = *preset;
    expected.vocab_size = back->vocab_size;
    ExpectSameConfig(*back, expected);
    ++converted;
  }
  EXPECT_EQ(converted + skipped, static_cast<int>(PresetNames().size()));
  EXPECT_GT(converted, 200);
  std::printf("%d presets converted, %d of families without a conversion\n", converted, skipped);
}

// Random byte edits of a config.json: every result is a config or a clean error, and a
// config that comes back checks its tensors in bounded time.
TEST(ConfigFromHfDirTest, MutatedConfigJsonNeverCrashes) {
  absl::StatusOr<Config> preset = ConfigFromName("Mixtral-8x7B-v0.1");
  ASSERT_TRUE(preset.ok());
  const std::string original = HfConfigJson(*preset, HfFamily::kMixtral, false, at::kBFloat16);
  std::mt19937 rng(77);
  const std::string digits = "0123456789";
  int ok = 0, failed = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::string text = original;
    for (int edit = 0; edit < 1 + static_cast<int>(rng() % 3); ++edit) {
      const size_t at = rng() % text.size();
      switch (rng() % 3) {
        case 0:
          text[at] = digits[rng() % digits.size()];  // Sizes change, often hugely.
          break;
        case 1:
          text[at] ^= static_cast<char>(1 << (rng() % 8));
          break;
        default:
          text.erase(at, 1 + rng() % 8);
      }
    }
    const std::string dir = DirWithConfig("mutated", text);
    absl::StatusOr<Config> config = ConfigFromHfDir(dir, "");
    if (!config.ok()) {
      ++failed;
      EXPECT_NE(config.status().message().find("config.json"), std::string::npos)
          << config.status();
      continue;
    }
    ++ok;
    // No tensors: a clean "missing" (or "too many") error, never unbounded work.
    EXPECT_FALSE(CheckLitTensors(*config, {}, "mutated").ok());
  }
  EXPECT_GT(ok, 0);
  EXPECT_GT(failed, 0);
}

// GPT-NeoX/Falcon interleave [q heads of group g, k_g, v_g] per group.
TEST(HfToLitTest, InterleavedQkvMatchesPerGroupLoop) {
  absl::StatusOr<Config> preset = PresetFromName("falcon-40b");
  ASSERT_TRUE(preset.ok());
  Config c = *preset;
  c.n_layer = 1;
  c.n_embd = 24;
  c.n_head = 6;
  c.n_query_groups = 2;
  c.head_size = 4;
  c.intermediate_size = 8;
  c.padded_vocab_size = 10;
  c.vocab_size = 10;
  ASSERT_TRUE(c.Finalize().ok());
  const auto shapes = ExpectedLitShapes(c);
  TensorMap lit;
  at::manual_seed(3);
  for (const auto& [name, shape] : shapes) lit[name] = at::randn(shape);
  absl::StatusOr<TensorMap> hf = LitToHf(c, lit, "test");
  ASSERT_TRUE(hf.ok()) << hf.status();
  const at::Tensor qkv = lit.at("transformer.h.0.attn.qkv.weight");  // [(6 + 2 * 2) * 4, 24]
  std::vector<at::Tensor> rows;
  const int64_t q_per_kv = 3, hs = 4, q = 6 * hs, kv = 2 * hs;
  for (int64_t g = 0; g < 2; ++g) {
    rows.push_back(qkv.narrow(0, g * q_per_kv * hs, q_per_kv * hs));
    rows.push_back(qkv.narrow(0, q + g * hs, hs));
    rows.push_back(qkv.narrow(0, q + kv + g * hs, hs));
  }
  EXPECT_TRUE(
      at::equal(hf->at("transformer.h.0.self_attention.query_key_value.weight"), at::cat(rows)));
  EXPECT_EQ(hf->count("transformer.h.0.ln_attn.weight"), 1u);  // 40b names its two norms.
  EXPECT_EQ(hf->count("transformer.h.0.ln_mlp.weight"), 1u);
  absl::StatusOr<TensorMap> back = HfToLit(c, *hf, "test");
  ASSERT_TRUE(back.ok()) << back.status();
  for (const auto& [name, t] : lit) EXPECT_TRUE(at::equal(back->at(name), t)) << name;
}

TEST(ExpectedLitShapesTest, Llama2) {
  absl::StatusOr<Config> c = ConfigFromName("Llama-2-7b-hf");
  ASSERT_TRUE(c.ok());
  const auto shapes = ExpectedLitShapes(*c);
  EXPECT_EQ(shapes.size(), 3 + 32 * 7u);  // wte, ln_f, lm_head; 2 norms and 5 linears a layer.
  EXPECT_EQ(shapes.at("transformer.h.31.attn.qkv.weight"), (std::vector<int64_t>{12288, 4096}));
  EXPECT_EQ(shapes.at("transformer.h.0.mlp.fc_2.weight"), (std::vector<int64_t>{11008, 4096}));
  EXPECT_EQ(shapes.at("lm_head.weight"), (std::vector<int64_t>{32000, 4096}));
}

}  // namespace
}  // namespace lgpt
