// config.json -> Config: published config.json texts derive their presets' computation with
// and without the preset, every preset's config survives HfConfigJson -> ReadHfConfig with its
// name and without, config.json wins over a preset (and says where), every RoPE scaling type
// maps or fails by name, and keys lgpt cannot compute are errors naming them.
#include "core/convert/hf_config.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "core/config/config_presets.h"
#include "core/convert/hf_checkpoint.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

std::string DirWithConfig(const std::string& name, const std::string& config_json) {
  const std::string dir = absl::StrCat(testing::TempDir(), "/", name);
  ::mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/config.json", std::ios::trunc) << config_json;
  return dir;
}

// What the model computes: the config without its names and LitGPT's tokenizer vocabulary.
std::string Computation(Config c) {
  EXPECT_TRUE(c.Finalize().ok());
  // LitGPT chooses these by the name.
  const std::string by_name = absl::StrCat("unit offset: ", c.NormUnitOffset(),
                                           "\naffine norms: ", c.NormHasAffine(), "\n");
  c.name = c.hf_org = c.hf_name = "";
  c.vocab_size = c.PaddedVocabSize();
  c.padding_multiple = 1;
  return by_name + ConfigToYaml(c);
}

// Drops `"_name_or_path": "...",` so no preset is found by name.
std::string WithoutName(std::string json) {
  const size_t at = json.find("\"_name_or_path\"");
  if (at == std::string::npos) return json;
  const size_t end = json.find(',', at);
  return json.erase(at, end + 1 - at);
}

// The preset with the fields published config.json files state differently: the context
// (max_position_embeddings) and the norm epsilon.
Config Overridden(Config preset, const Config& read) {
  preset.block_size = read.block_size;
  preset.norm_eps = read.norm_eps;
  return preset;
}

struct Published {
  std::string preset, json;
  std::vector<std::string> overridden;  // Fields config.json changes in the preset.
};

// config.json as Hugging Face publishes them (trimmed of training-only keys).
const std::vector<Published>& PublishedConfigs() {
  static const auto* const configs = new std::vector<Published>{
      {"Llama-2-7b-hf", R"({
        "_name_or_path": "meta-llama/Llama-2-7b-hf", "architectures": ["LlamaForCausalLM"],
        "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
        "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": null, "tie_word_embeddings": false, "torch_dtype": "float16",
        "transformers_version": "4.31.0.dev0", "use_cache": true, "vocab_size": 32000})",
       {}},
      {"Llama-3.2-1B", R"({
        "_name_or_path": "meta-llama/Llama-3.2-1B", "architectures": ["LlamaForCausalLM"],
        "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 128000,
        "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
        "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32,
        "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
        "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
        "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
        "use_cache": true, "vocab_size": 128256})",
       {}},
      {"pythia-14m", R"({
        "_name_or_path": "EleutherAI/pythia-14m",
        "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0,
        "hidden_act": "gelu", "hidden_size": 128, "initializer_range": 0.02,
        "intermediate_size": 512, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
        "model_type": "gpt_neox", "num_attention_heads": 4, "num_hidden_layers": 6,
        "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": false,
        "torch_dtype": "float16", "use_cache": true, "use_parallel_residual": true,
        "vocab_size": 50304})",
       {"block_size"}},
      {"falcon-7b", R"({
        "_name_or_path": "tiiuae/falcon-7b", "alibi": false,
        "apply_residual_connection_post_layernorm": false,
        "architectures": ["FalconForCausalLM"], "attention_dropout": 0.0, "bias": false,
        "bos_token_id": 11, "eos_token_id": 11, "hidden_dropout": 0.0, "hidden_size": 4544,
        "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "falcon",
        "multi_query": true, "new_decoder_architecture": false, "num_attention_heads": 71,
        "num_hidden_layers": 32, "parallel_attn": true, "torch_dtype": "bfloat16",
        "vocab_size": 65024})",
       {}},
      {"Mistral-7B-v0.1", R"({
        "_name_or_path": "mistralai/Mistral-7B-v0.1", "architectures": ["MistralForCausalLM"],
        "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
        "vocab_size": 32000})",
       {"block_size"}},
      {"Qwen2.5-0.5B", R"({
        "_name_or_path": "Qwen/Qwen2.5-0.5B", "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
        "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
        "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
        "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
        "use_cache": true, "use_mrope": false, "use_sliding_window": false,
        "vocab_size": 151936})",
       {}},
      {"Gemma-2-2b", R"({
        "_name_or_path": "google/gemma-2-2b", "architectures": ["Gemma2ForCausalLM"],
        "attention_bias": false, "attention_dropout": 0.0, "attn_logit_softcapping": 50.0,
        "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
        "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304,
        "initializer_range": 0.02, "intermediate_size": 9216, "max_position_embeddings": 8192,
        "model_type": "gemma2", "num_attention_heads": 8, "num_hidden_layers": 26,
        "num_key_value_heads": 4, "pad_token_id": 0, "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096,
        "torch_dtype": "float32", "use_cache": true, "vocab_size": 256000})",
       {"norm_eps"}},  // LitGPT's preset says 1e-5.
      {"phi-2", R"({
        "_name_or_path": "microsoft/phi-2", "architectures": ["PhiForCausalLM"],
        "attention_dropout": 0.0, "bos_token_id": 50256, "embd_pdrop": 0.0,
        "eos_token_id": 50256, "hidden_act": "gelu_new", "hidden_size": 2560,
        "initializer_range": 0.02, "intermediate_size": 10240, "layer_norm_eps": 1e-05,
        "max_position_embeddings": 2048, "model_type": "phi", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 32, "partial_rotary_factor": 0.4,
        "qk_layernorm": false, "resid_pdrop": 0.1, "rope_scaling": null, "rope_theta": 10000.0,
        "tie_word_embeddings": false, "torch_dtype": "float16", "use_cache": true,
        "vocab_size": 51200})",
       {}},
  };
  return *configs;
}

TEST(ReadHfConfigTest, PublishedConfigsFillTheirPresets) {
  for (const Published& p : PublishedConfigs()) {
    SCOPED_TRACE(p.preset);
    absl::StatusOr<Config> preset = ConfigFromName(p.preset);
    ASSERT_TRUE(preset.ok()) << preset.status();
    absl::StatusOr<HfConfig> read =
        ReadHfConfig(DirWithConfig("published_" + p.preset, p.json), "");
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->preset, p.preset);
    EXPECT_EQ(read->config.name, p.preset);
    EXPECT_EQ(read->config.vocab_size, preset->vocab_size);  // LitGPT's, from the preset.
    std::vector<std::string> fields;
    for (const std::string& o : read->overridden) fields.push_back(o.substr(0, o.find(':')));
    EXPECT_EQ(fields, p.overridden) << absl::StrJoin(read->overridden, "; ");
    EXPECT_EQ(Computation(read->config), Computation(Overridden(*preset, read->config)));
  }
}

TEST(ReadHfConfigTest, PublishedConfigsDeriveAloneTheSameComputation) {
  for (const Published& p : PublishedConfigs()) {
    SCOPED_TRACE(p.preset);
    absl::StatusOr<Config> preset = ConfigFromName(p.preset);
    ASSERT_TRUE(preset.ok()) << preset.status();
    absl::StatusOr<HfConfig> read =
        ReadHfConfig(DirWithConfig("my-model", WithoutName(p.json)), "");
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->preset, "");
    // The directory's name, with Gemma in it where LitGPT needs that.
    EXPECT_EQ(read->config.name,
              absl::StartsWith(p.preset, "Gemma") ? "Gemma-my-model" : "my-model");
    EXPECT_EQ(Computation(read->config), Computation(Overridden(*preset, read->config)));
  }
}

// Every preset a family covers: config.json written for it reads back as the same config, with
// its name (the preset fills LitGPT's vocabulary) and without (config.json alone).
TEST(ReadHfConfigTest, EveryPresetSurvivesConfigJsonWithAndWithoutItsName) {
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
    const std::string json = HfConfigJson(*preset, *family, false, at::kFloat);
    absl::StatusOr<HfConfig> named = ReadHfConfig(DirWithConfig("preset_named", json), "");
    ASSERT_TRUE(named.ok()) << named.status();
    EXPECT_EQ(named->preset, name);
    EXPECT_TRUE(named->overridden.empty()) << absl::StrJoin(named->overridden, "; ");
    EXPECT_EQ(ConfigToYaml(named->config), ConfigToYaml(*preset));
    EXPECT_EQ(named->family, *family);

    absl::StatusOr<HfConfig> alone =
        ReadHfConfig(DirWithConfig("preset_alone", WithoutName(json)), "");
    ASSERT_TRUE(alone.ok()) << alone.status();
    EXPECT_EQ(alone->preset, "");
    EXPECT_EQ(Computation(alone->config), Computation(*preset));
    ++converted;
  }
  EXPECT_EQ(converted + skipped, static_cast<int>(PresetNames().size()));
  EXPECT_GT(converted, 200);
  std::printf("%d presets converted, %d of families without a conversion\n", converted, skipped);
}

// A user's Llama 3 with its own rope_scaling converted with --model_name: the directory's
// values win and are reported.
TEST(ReadHfConfigTest, ConfigJsonWinsOverThePresetAndSaysWhere) {
  absl::StatusOr<Config> preset = ConfigFromName("Llama-3.2-1B");
  ASSERT_TRUE(preset.ok());
  const std::string dir = DirWithConfig("custom-llama3", R"({
      "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
      "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
      "vocab_size": 256, "max_position_embeddings": 128, "rms_norm_eps": 1e-05,
      "rope_theta": 500000.0, "rope_scaling": {"factor": 4.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 32, "rope_type": "llama3"}})");
  absl::StatusOr<HfConfig> read = ReadHfConfig(dir, "Llama-3.2-1B");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->preset, "Llama-3.2-1B");
  ASSERT_TRUE(read->config.rope_adjustments.has_value());
  EXPECT_EQ(read->config.rope_adjustments->original_max_seq_len, 32);
  EXPECT_EQ(read->config.rope_adjustments->factor, 4);
  EXPECT_EQ(read->config.n_layer, 2);
  EXPECT_EQ(read->config.HeadSize(), 16);  // width / heads, not the preset's 64
  EXPECT_EQ(read->config.vocab_size, 256);
  const std::string overridden = absl::StrJoin(read->overridden, "\n");
  for (const char* field : {"rope_adjustments: {factor: 4", "n_layer: 2 (preset Llama-3.2-1B: 16)",
                            "n_embd", "block_size", "padded_vocab_size", "n_query_groups"}) {
    EXPECT_TRUE(absl::StrContains(overridden, field)) << field << " not in\n" << overridden;
  }
  EXPECT_FALSE(absl::StrContains(overridden, "rope_base")) << overridden;  // Same value.
}

std::string LlamaWithRope(const std::string& rope_scaling) {
  return absl::StrCat(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
      "intermediate_size": 96, "num_attention_heads": 4, "num_hidden_layers": 2,
      "vocab_size": 256, "max_position_embeddings": 128, "rope_scaling": )",
                      rope_scaling, "}");
}

TEST(ReadHfConfigTest, EveryRopeScalingTypeMapsOrFailsByName) {
  struct Case {
    std::string rope_scaling;
    std::string expect;  // Show() of rope_adjustments, "condense N", or an error fragment
  };
  const std::vector<Case> cases = {
      {"null", "none"},
      {R"({"rope_type": "default"})", "none"},
      {R"({"type": "linear", "factor": 4.0})", "condense 4"},
      {R"({"rope_type": "linear", "factor": 2.5})", "factor: 2.5"},
      {R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 32})",
       "factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_seq_len: 32"},
      {R"({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32})",
       "factor: 4, original_max_seq_len: 32, beta_fast: 32, beta_slow: 1"},
      {R"({"type": "dynamic", "factor": 2.0})", "none"},
      {R"({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]})",
       "'rope_scaling.rope_type': \"longrope\""},
      {R"({"type": "su", "short_factor": [1.0], "long_factor": [1.0]})",
       "'rope_scaling.rope_type': \"su\""},
      {R"({"rope_type": "llama3", "factor": 8.0})", "'rope_scaling' needs 'low_freq_factor'"},
      {R"({"rope_type": "linear", "factor": -1})", "'rope_scaling.factor' must be"},
      {R"({"rope_type": "yarn", "factor": 4.0, "attention_factor": 0.5})",
       "'rope_scaling.attention_factor'"},
      {R"("linear")", "'rope_scaling' must be an object"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.rope_scaling);
    absl::StatusOr<HfConfig> read =
        ReadHfConfig(DirWithConfig("rope", LlamaWithRope(c.rope_scaling)), "");
    if (absl::StrContains(c.expect, "'")) {
      ASSERT_FALSE(read.ok());
      EXPECT_TRUE(absl::StrContains(read.status().message(), c.expect)) << read.status();
      EXPECT_TRUE(absl::StrContains(read.status().message(), "config.json")) << read.status();
      continue;
    }
    ASSERT_TRUE(read.ok()) << read.status();
    if (absl::StartsWith(c.expect, "condense")) {
      EXPECT_EQ(absl::StrCat("condense ", read->config.rope_condense_ratio), c.expect);
      EXPECT_FALSE(read->config.rope_adjustments.has_value());
    } else if (c.expect == "none") {
      EXPECT_FALSE(read->config.rope_adjustments.has_value());
      EXPECT_EQ(read->config.rope_condense_ratio, 1);
    } else {
      ASSERT_TRUE(read->config.rope_adjustments.has_value());
      // The overridden-field report shows rope_adjustments in this very form.
      absl::StatusOr<HfConfig> over = ReadHfConfig(
          DirWithConfig("rope_over", LlamaWithRope(c.rope_scaling)), "Llama-2-7b-hf");
      ASSERT_TRUE(over.ok()) << over.status();
      const std::string all = absl::StrJoin(over->overridden, "\n");
      EXPECT_TRUE(absl::StrContains(all, absl::StrCat("rope_adjustments: {", c.expect, "}")))
          << all;
    }
  }
  // Dynamic NTK changes nothing within the context, and the user hears so.
  absl::StatusOr<HfConfig> dynamic = ReadHfConfig(
      DirWithConfig("rope", LlamaWithRope(R"({"type": "dynamic", "factor": 2.0})")), "");
  ASSERT_TRUE(dynamic.ok());
  ASSERT_EQ(dynamic->notes.size(), 1u);
  EXPECT_TRUE(absl::StrContains(dynamic->notes[0], "dynamic")) << dynamic->notes[0];
}

TEST(ReadHfConfigTest, KeysLgptCannotComputeAreErrorsNamingThem) {
  struct Case {
    std::string json, error;
    absl::StatusCode code;
  };
  const std::string llama = R"("architectures": ["LlamaForCausalLM"], "hidden_size": 64,
      "intermediate_size": 96, "num_attention_heads": 4, "num_hidden_layers": 2,
      "vocab_size": 256)";
  const std::vector<Case> cases = {
      {absl::StrCat("{", llama, R"(, "attention_bias": true})"), "'attention_bias': true",
       absl::StatusCode::kUnimplemented},
      {absl::StrCat("{", llama, R"(, "hidden_act": "gelu"})"), "'hidden_act': \"gelu\"",
       absl::StatusCode::kUnimplemented},
      {absl::StrCat("{", llama, R"(, "quantization_config": {"quant_method": "gptq"}})"),
       "'quantization_config'", absl::StatusCode::kUnimplemented},
      {absl::StrCat("{", llama, R"(, "num_hidden_layers": "2"})"), "'num_hidden_layers'",
       absl::StatusCode::kInvalidArgument},
      {absl::StrCat("{", llama, R"(, "rms_norm_eps": "small"})"), "'rms_norm_eps'",
       absl::StatusCode::kInvalidArgument},
      {absl::StrCat("{", llama, R"(, "num_key_value_heads": 3})"), "n_query_groups",
       absl::StatusCode::kInvalidArgument},
      {R"({"architectures": ["PhiForCausalLM"], "qk_layernorm": true})", "'qk_layernorm': true",
       absl::StatusCode::kUnimplemented},
      {R"({"architectures": ["FalconForCausalLM"], "alibi": true})", "'alibi': true",
       absl::StatusCode::kUnimplemented},
      {R"({"architectures": ["GPTNeoXForCausalLM"], "attention_bias": false})",
       "'attention_bias': false", absl::StatusCode::kUnimplemented},
      {R"({"architectures": ["StableLmForCausalLM"], "qk_layernorm": true})",
       "'qk_layernorm': true", absl::StatusCode::kUnimplemented},
      {R"({"architectures": ["Qwen3MoeForCausalLM"], "norm_topk_prob": false})",
       "'norm_topk_prob': false", absl::StatusCode::kUnimplemented},
      {R"({"architectures": ["Qwen3MoeForCausalLM"], "norm_topk_prob": true,
           "mlp_only_layers": [0]})",
       "'mlp_only_layers'", absl::StatusCode::kUnimplemented},
      {R"({"architectures": ["Gemma2ForCausalLM"], "hidden_activation": "relu"})",
       "'hidden_activation': \"relu\"", absl::StatusCode::kUnimplemented},
      {R"({"architectures": ["BertModel"]})", "unknown architecture BertModel",
       absl::StatusCode::kUnimplemented},
      {R"({"model_type": "bert"})", "'model_type': \"bert\"", absl::StatusCode::kUnimplemented},
      {R"({"hidden_size": 64})", "neither 'architectures' nor 'model_type'",
       absl::StatusCode::kInvalidArgument},
      {R"({"architectures": ["Gemma2ForCausalLM"], "layer_types": ["full_attention"]})",
       "'layer_types'", absl::StatusCode::kInvalidArgument},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.json);
    absl::StatusOr<HfConfig> read = ReadHfConfig(DirWithConfig("bad", c.json), "");
    ASSERT_FALSE(read.ok());
    EXPECT_EQ(read.status().code(), c.code) << read.status();
    EXPECT_TRUE(absl::StrContains(read.status().message(), c.error)) << read.status();
    EXPECT_TRUE(absl::StrContains(read.status().message(), "config.json")) << read.status();
  }
  // Keys that change nothing lgpt computes are ignored.
  absl::StatusOr<HfConfig> harmless = ReadHfConfig(
      DirWithConfig("harmless", absl::StrCat("{", llama, R"(, "use_cache": false,
          "initializer_range": 0.5, "some_future_key": [1, 2], "sliding_window": 8,
          "attention_bias": false, "mlp_bias": false})")),
      "");
  ASSERT_TRUE(harmless.ok()) << harmless.status();
  EXPECT_FALSE(harmless->config.sliding_window_size.has_value());  // Llama reads no window.
}

// Llama with attention_bias and mlp_bias both set is LitGPT's bias=True.
TEST(ReadHfConfigTest, LlamaWithAllBiases) {
  absl::StatusOr<HfConfig> read = ReadHfConfig(
      DirWithConfig("biased", LlamaWithRope("null").replace(1, 0, R"("attention_bias": true,
          "mlp_bias": true, )")),
      "");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->config.bias);
}

TEST(ReadHfConfigTest, WindowsPerLayerAsEachArchitectureReadsThem) {
  // Qwen 2 windows the layers from max_window_layers on, when use_sliding_window says so.
  absl::StatusOr<HfConfig> qwen = ReadHfConfig(DirWithConfig("qwen-window", R"({
      "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
      "num_attention_heads": 4, "num_hidden_layers": 4, "vocab_size": 256,
      "use_sliding_window": true, "sliding_window": 16, "max_window_layers": 2})"),
                                                "");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ(qwen->config.sliding_window_size, 16);
  EXPECT_EQ(qwen->config.sliding_window_indices, (std::vector<int>{0, 0, 1, 1}));
  // Without sliding_window, Qwen's class default of 4096.
  absl::StatusOr<HfConfig> qwen_default = ReadHfConfig(DirWithConfig("qwen-window-default", R"({
      "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
      "num_attention_heads": 4, "num_hidden_layers": 4, "vocab_size": 256,
      "use_sliding_window": true, "max_window_layers": 1})"),
                                                        "");
  ASSERT_TRUE(qwen_default.ok()) << qwen_default.status();
  EXPECT_EQ(qwen_default->config.sliding_window_size, 4096);
  EXPECT_EQ(qwen_default->config.sliding_window_indices, (std::vector<int>{0, 1, 1, 1}));
  // Gemma 3: every sliding_window_pattern-th layer is global, with the global RoPE base.
  absl::StatusOr<HfConfig> gemma3 = ReadHfConfig(DirWithConfig("gemma3-pattern", R"({
      "architectures": ["Gemma3ForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
      "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16,
      "num_hidden_layers": 6, "vocab_size": 256, "sliding_window": 8,
      "sliding_window_pattern": 3})"),
                                                  "");
  ASSERT_TRUE(gemma3.ok()) << gemma3.status();
  EXPECT_EQ(gemma3->config.sliding_window_indices, (std::vector<int>{1, 1, 0, 1, 1, 0}));
  EXPECT_EQ(gemma3->config.rope_indices, (std::vector<int>{1, 1, 0, 1, 1, 0}));
  EXPECT_EQ(gemma3->config.rope_local_base_freq, 10000);
  EXPECT_EQ(gemma3->config.attention_scores_scalar, 256);  // The class default.
  // layer_types, where given, says it per layer.
  absl::StatusOr<HfConfig> typed = ReadHfConfig(DirWithConfig("gemma2-types", R"({
      "architectures": ["Gemma2ForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
      "num_attention_heads": 4, "head_dim": 16, "num_hidden_layers": 3, "vocab_size": 256,
      "sliding_window": 8, "layer_types": ["full_attention", "sliding_attention",
      "full_attention"], "attn_logit_softcapping": null})"),
                                                "");
  ASSERT_TRUE(typed.ok()) << typed.status();
  EXPECT_EQ(typed->config.sliding_window_indices, (std::vector<int>{0, 1, 0}));
  EXPECT_FALSE(typed->config.attention_logit_softcapping.has_value());  // null: off
  EXPECT_EQ(typed->config.final_logit_softcapping, 30);                 // absent: default
}

// Multimodal Gemma 3: sizes under text_config, whose vocab_size counts image tokens; with the
// preset, LitGPT keeps the text vocabulary.
TEST(ReadHfConfigTest, MultimodalGemma3KeepsTheTextVocabulary) {
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
  EXPECT_EQ(ConfigToYaml(*actual), ConfigToYaml(*expected));
}

TEST(ReadHfConfigTest, PresetOfAnotherArchitectureIsAnError) {
  absl::StatusOr<HfConfig> read =
      ReadHfConfig(DirWithConfig("llama-for-pythia", LlamaWithRope("null")), "pythia-14m");
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(absl::StrContains(read.status().message(), "pythia-14m")) << read.status();
  EXPECT_EQ(ReadHfConfig(DirWithConfig("llama-unknown", LlamaWithRope("null")), "no-such-model")
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

// Random byte edits of a config.json: every result is a config or a clean error naming the file.
// Deep nesting is refused by name; 100,000 levels overflowed the stack when the parsed value
// was copied. Ordinary nesting (rope_scaling, text_config) still reads.
TEST(ReadHfConfigTest, DeeplyNestedConfigJsonIsAnError) {
  for (const int depth : {65, 100000}) {
    const std::string text = absl::StrCat(R"({"architectures": ["LlamaForCausalLM"], "x": )",
                                          std::string(depth, '['), std::string(depth, ']'), "}");
    const absl::StatusOr<HfConfig> read = ReadHfConfig(DirWithConfig("deep", text), "");
    ASSERT_FALSE(read.ok()) << depth;
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument) << read.status();
    EXPECT_NE(read.status().message().find("config.json: JSON nested more than 64 deep"),
              std::string::npos)
        << read.status();
  }
  const absl::StatusOr<HfConfig> shallow = ReadHfConfig(
      DirWithConfig("shallow", absl::StrCat(R"({"architectures": ["LlamaForCausalLM"], "x": )",
                                            std::string(60, '['), std::string(60, ']'), "}")),
      "");
  EXPECT_EQ(shallow.status().message().find("nested"), std::string::npos) << shallow.status();
}

TEST(ReadHfConfigTest, MutatedConfigJsonNeverCrashes) {
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
    absl::StatusOr<Config> config = ConfigFromHfDir(DirWithConfig("mutated", text), "");
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

}  // namespace
}  // namespace lgpt
