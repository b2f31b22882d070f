// Hugging Face <-> LitGPT conversion (core/convert/hf_checkpoint.h), end to end on small random models
// of every family: lit dir -> HF dir -> lit dir gives bit-identical tensors and equal logits;
// hand-built HF directories (names and layouts written out here, not by the converter) load
// with the original logits; sharded safetensors, pytorch_model.bin and its shards convert; and
// hostile directories give clear errors.
#include <ATen/ATen.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/config/config.h"
#include "core/config/config_presets.h"
#include "core/convert/hf_checkpoint.h"
#include "core/model/checkpoint.h"
#include "core/model/gpt.h"
#include "core/io/safetensors.h"
#include "core/io/torch_pickle.h"
#include "core/io/torch_pickle_writer.h"
#include "gtest/gtest.h"
#include "tests/test_models.h"

namespace lgpt {
namespace {

std::string NewDir(const std::string& name) {
  static int counter = 0;
  const std::string dir = absl::StrCat(testing::TempDir(), "/convert_", name, "_", ++counter);
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

struct LitModel {
  Config config;
  GPT model;
  TensorMap state;  // Cloned, so later writes cannot alias it.
  at::Tensor tokens;
  at::Tensor logits;
};

LitModel MakeModel(const std::string& preset_name, uint64_t seed) {
  absl::StatusOr<Config> preset = PresetFromName(preset_name);
  EXPECT_TRUE(preset.ok()) << preset.status();
  absl::StatusOr<Config> config = ShrinkConfig(*preset);
  EXPECT_TRUE(config.ok()) << config.status();
  absl::StatusOr<GPT> created = GPTImpl::Create(*config);
  EXPECT_TRUE(created.ok()) << created.status();
  LitModel m{*config, *created, {}, {}, {}};
  RandomizeWeights(*m.model, seed);
  m.model->eval();
  for (const auto& [name, t] : StateDict(*m.model)) m.state[name] = t.detach().clone();
  at::manual_seed(seed + 1);
  m.tokens = at::randint(0, m.config.vocab_size, {2, 7}, at::kLong);
  absl::StatusOr<at::Tensor> logits = m.model->Forward(m.tokens);
  EXPECT_TRUE(logits.ok()) << logits.status();
  m.logits = *logits;
  return m;
}

void WriteLitDir(const LitModel& m, const std::string& dir) {
  WriteFile(dir + "/model_config.yaml", ConfigToYaml(m.config));
  ASSERT_TRUE(WriteTorchStateDict(dir + "/lit_model.pth", m.state).ok());
}

void ExpectBitIdentical(const TensorMap& actual, const TensorMap& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [name, e] : expected) {
    SCOPED_TRACE(name);
    ASSERT_EQ(actual.count(name), 1u);
    const at::Tensor a = actual.at(name).contiguous(), ec = e.contiguous();
    ASSERT_EQ(a.scalar_type(), ec.scalar_type());
    ASSERT_EQ(a.sizes(), ec.sizes());
    EXPECT_EQ(std::memcmp(a.data_ptr(), ec.data_ptr(), a.numel() * a.element_size()), 0);
  }
}

// Loads a LitGPT dir and checks its logits equal the original model's.
void ExpectSameLogits(const LitModel& m, const std::string& lit_dir) {
  absl::StatusOr<LoadedModel> loaded = LoadCheckpoint(lit_dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  absl::StatusOr<at::Tensor> logits = loaded->model->Forward(m.tokens);
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_TRUE(at::equal(*logits, m.logits))
      << "max difference " << (*logits - m.logits).abs().max().item<double>();
}

// The config after a round trip: what config.json cannot carry is the tokenizer's vocabulary
// size (Hugging Face's vocab_size is the embedding rows, LitGPT's padded_vocab_size).
void ExpectSameConfig(Config actual, const Config& expected) {
  EXPECT_EQ(actual.padded_vocab_size, expected.padded_vocab_size);
  actual.vocab_size = expected.vocab_size;
  EXPECT_EQ(ConfigToYaml(actual), ConfigToYaml(expected));
}

const std::vector<std::string> kFamilies = {
    "Llama-2-7b-hf",  "Llama-3.2-1B",  "Mistral-7B-v0.1", "Mixtral-8x7B-v0.1",
    "Qwen2.5-0.5B",   "Qwen3-0.6B",    "Qwen3-30B-A3B",   "SmolLM2-135M",
    "pythia-14m",     "falcon-7b",     "falcon-40b",      "Gemma-2b",
    "Gemma-2-2b",     "Gemma-3-1b-it", "phi-2",           "Phi-3-mini-4k-instruct",
    "OLMo-2-1124-7B", "stablelm-3b-4e1t",
};

class RoundTripTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RoundTripTest, LitToHfToLitIsBitIdenticalWithEqualLogits) {
  const LitModel m = MakeModel(GetParam(), 11);
  const std::string lit_dir = NewDir("lit"), hf_dir = NewDir("hf"), back_dir = NewDir("back");
  WriteLitDir(m, lit_dir);
  WriteFile(lit_dir + "/tokenizer.json", "{}");
  absl::StatusOr<ConvertResult> to_hf = ConvertLitCheckpoint(lit_dir, hf_dir);
  ASSERT_TRUE(to_hf.ok()) << to_hf.status();
  EXPECT_TRUE(Exists(hf_dir + "/config.json"));
  EXPECT_TRUE(Exists(hf_dir + "/model.safetensors"));
  EXPECT_TRUE(Exists(hf_dir + "/tokenizer.json"));
  absl::StatusOr<TensorMap> hf = ReadSafetensors(hf_dir + "/model.safetensors");
  ASSERT_TRUE(hf.ok()) << hf.status();
  for (const auto& [name, t] : *hf) {
    EXPECT_FALSE(absl::StrContains(name, ".attn.") || absl::StrContains(name, ".mlp.fc_") ||
                 absl::StrContains(name, "norm_1"))
        << name << " kept its LitGPT name";
  }

  absl::StatusOr<ConvertResult> back = ConvertHfCheckpoint(hf_dir, back_dir);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->config.name, m.config.name);
  ExpectSameConfig(back->config, m.config);
  EXPECT_TRUE(Exists(back_dir + "/tokenizer.json"));
  absl::StatusOr<TensorMap> lit = ReadTorchStateDict(back_dir + "/lit_model.pth");
  ASSERT_TRUE(lit.ok()) << lit.status();
  ExpectBitIdentical(*lit, m.state);
  ExpectSameLogits(m, back_dir);
}

// config.json alone (no name that matches a preset) is enough: the derived config computes
// the same logits.
TEST_P(RoundTripTest, ConfigJsonAloneDerivesTheSameModel) {
  const LitModel m = MakeModel(GetParam(), 12);
  const std::string lit_dir = NewDir("lit"), hf_dir = NewDir("hf"), back_dir = NewDir("back");
  WriteLitDir(m, lit_dir);
  ASSERT_TRUE(ConvertLitCheckpoint(lit_dir, hf_dir).ok());
  std::ifstream in(hf_dir + "/config.json");
  std::stringstream text;
  text << in.rdbuf();
  std::string config = text.str();
  const size_t name = config.find("\"_name_or_path\"");
  ASSERT_NE(name, std::string::npos);
  config.erase(name, config.find('\n', name) + 1 - name);
  WriteFile(hf_dir + "/config.json", config);
  absl::StatusOr<ConvertResult> back = ConvertHfCheckpoint(hf_dir, back_dir);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << config;
  EXPECT_EQ(back->preset, "");
  EXPECT_TRUE(absl::StrContains(back->config.name, "convert_hf_")) << back->config.name;
  ExpectSameLogits(m, back_dir);
}

INSTANTIATE_TEST_SUITE_P(Families, RoundTripTest, ::testing::ValuesIn(kFamilies),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

TEST(ConvertTest, TiedEmbeddingsAreLeftOutAndRestored) {
  LitModel m = MakeModel("Llama-3.2-1B", 5);
  m.state["lm_head.weight"] = m.state.at("transformer.wte.weight").clone();
  const std::string lit_dir = NewDir("tied"), hf_dir = NewDir("tied_hf"),
                    back_dir = NewDir("tied_back");
  WriteLitDir(m, lit_dir);
  ASSERT_TRUE(ConvertLitCheckpoint(lit_dir, hf_dir).ok());
  absl::StatusOr<TensorMap> hf = ReadSafetensors(hf_dir + "/model.safetensors");
  ASSERT_TRUE(hf.ok());
  EXPECT_EQ(hf->count("lm_head.weight"), 0u);
  std::ifstream config(hf_dir + "/config.json");
  std::stringstream text;
  text << config.rdbuf();
  EXPECT_NE(text.str().find("\"tie_word_embeddings\": true"), std::string::npos) << text.str();
  ASSERT_TRUE(ConvertHfCheckpoint(hf_dir, back_dir).ok());
  absl::StatusOr<TensorMap> lit = ReadTorchStateDict(back_dir + "/lit_model.pth");
  ASSERT_TRUE(lit.ok());
  ExpectBitIdentical(*lit, m.state);
}

// ---------------------------------------------------------------------------------------
// Hand-built Hugging Face directories.

at::Tensor Rows(const at::Tensor& t, int64_t start, int64_t n) { return t.narrow(0, start, n); }

TEST(ConvertTest, HandBuiltLlamaDirectoryWithSeparateQkv) {
  const LitModel m = MakeModel("Llama-2-7b-hf", 21);
  const Config& c = m.config;
  const TensorMap& s = m.state;
  const int64_t hs = c.HeadSize(), q = c.n_head * hs, kv = c.QueryGroups() * hs;
  TensorMap hf;
  hf["model.embed_tokens.weight"] = s.at("transformer.wte.weight");
  hf["model.norm.weight"] = s.at("transformer.ln_f.weight");
  hf["lm_head.weight"] = s.at("lm_head.weight");
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string h = absl::StrCat("transformer.h.", l, ".");
    const std::string p = absl::StrCat("model.layers.", l, ".");
    const at::Tensor qkv = s.at(h + "attn.qkv.weight");
    hf[p + "self_attn.q_proj.weight"] = Rows(qkv, 0, q);
    hf[p + "self_attn.k_proj.weight"] = Rows(qkv, q, kv);
    hf[p + "self_attn.v_proj.weight"] = Rows(qkv, q + kv, kv);
    hf[p + "self_attn.o_proj.weight"] = s.at(h + "attn.proj.weight");
    hf[p + "self_attn.rotary_emb.inv_freq"] = at::ones({hs / 2});  // Old checkpoints; dropped.
    hf[p + "input_layernorm.weight"] = s.at(h + "norm_1.weight");
    hf[p + "post_attention_layernorm.weight"] = s.at(h + "norm_2.weight");
    hf[p + "mlp.gate_proj.weight"] = s.at(h + "mlp.fc_1.weight");
    hf[p + "mlp.up_proj.weight"] = s.at(h + "mlp.fc_2.weight");
    hf[p + "mlp.down_proj.weight"] = s.at(h + "mlp.proj.weight");
  }
  const std::string dir = NewDir("llama_hand"), out = NewDir("llama_hand_out");
  WriteFile(dir + "/config.json",
            absl::StrCat(R"({
  "_name_or_path": "/home/someone/models/meta-llama/Llama-2-7b-hf",
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": )",
                         c.n_embd, R"(, "intermediate_size": )", c.IntermediateSize(),
                         R"(, "num_hidden_layers": )", c.n_layer, R"(, "num_attention_heads": )",
                         c.n_head, R"(, "num_key_value_heads": )", c.QueryGroups(),
                         R"(, "max_position_embeddings": 64,
  "rms_norm_eps": 1e-05, "vocab_size": )",
                         c.PaddedVocabSize(), R"(, "torch_dtype": "float32",
  "tie_word_embeddings": false, "rope_theta": 10000.0, "rope_scaling": null})"));
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", hf).ok());
  absl::StatusOr<ConvertResult> result = ConvertHfCheckpoint(dir, out);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->config.name, "Llama-2-7b-hf");
  ExpectSameLogits(m, out);
}

// Hand-written config.json files with each RoPE scaling type, over the weights of a Llama whose
// LitGPT config has the matching rope_adjustments: equal logits.
TEST(ConvertTest, HandWrittenRopeScalingOfEveryType) {
  struct Case {
    const char* name;
    std::optional<RopeAdjustments> lit;
    std::string rope_scaling;
  };
  RopeAdjustments llama3, linear4, linear25, yarn;
  llama3.factor = 8;
  llama3.low_freq_factor = 1;
  llama3.high_freq_factor = 4;
  llama3.original_max_seq_len = 16;
  linear4.factor = 4;
  linear25.factor = 2.5;
  yarn.factor = 4;
  yarn.original_max_seq_len = 16;
  yarn.beta_fast = 32;
  yarn.beta_slow = 1;
  const std::vector<Case> cases = {
      {"llama3", llama3,
       R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 16})"},
      {"linear_whole", linear4, R"({"type": "linear", "factor": 4.0})"},
      {"linear", linear25, R"({"rope_type": "linear", "factor": 2.5})"},
      {"yarn", yarn,
       R"({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16})"},
      {"dynamic", std::nullopt, R"({"rope_type": "dynamic", "factor": 2.0})"},
      {"none", std::nullopt, "null"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<Config> preset = PresetFromName("Llama-3.2-1B");
    ASSERT_TRUE(preset.ok());
    absl::StatusOr<Config> config = ShrinkConfig(*preset);
    ASSERT_TRUE(config.ok());
    config->rope_adjustments = c.lit;
    ASSERT_TRUE(config->Finalize().ok());
    absl::StatusOr<GPT> model = GPTImpl::Create(*config);
    ASSERT_TRUE(model.ok());
    RandomizeWeights(**model, 31);
    (*model)->eval();
    LitModel m{*config, *model, {}, {}, {}};
    for (const auto& [name, t] : StateDict(*m.model)) m.state[name] = t.detach().clone();
    at::manual_seed(32);
    m.tokens = at::randint(0, m.config.vocab_size, {1, 40}, at::kLong);  // Past 16 positions.
    m.logits = *m.model->Forward(m.tokens);
    const std::string lit_dir = NewDir("rope_lit"), hf_dir = NewDir("rope_hf"),
                      out = NewDir("rope_out");
    WriteLitDir(m, lit_dir);
    ASSERT_TRUE(ConvertLitCheckpoint(lit_dir, hf_dir).ok());
    const Config& k = m.config;
    WriteFile(hf_dir + "/config.json",
              absl::StrCat(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": )", k.n_embd,
                           R"(, "intermediate_size": )", k.IntermediateSize(),
                           R"(, "num_hidden_layers": )", k.n_layer, R"(, "num_attention_heads": )",
                           k.n_head, R"(, "num_key_value_heads": )", k.QueryGroups(),
                           R"(, "head_dim": )", k.HeadSize(), R"(, "vocab_size": )",
                           k.PaddedVocabSize(), R"(, "max_position_embeddings": 64,
                           "rms_norm_eps": )", k.norm_eps, R"(, "rope_theta": )", k.rope_base,
                           R"(, "tie_word_embeddings": false, "rope_scaling": )", c.rope_scaling,
                           "}"));
    absl::StatusOr<ConvertResult> result = ConvertHfCheckpoint(hf_dir, out);
    ASSERT_TRUE(result.ok()) << result.status();
    absl::StatusOr<LoadedModel> loaded = LoadCheckpoint(out);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    const at::Tensor logits = *loaded->model->Forward(m.tokens);
    // A whole linear factor becomes rope_condense_ratio: positions / 4 instead of
    // frequencies / 4, equal to rounding.
    EXPECT_TRUE(at::allclose(logits, m.logits, 0, 1e-5))
        << (logits - m.logits).abs().max().item<double>();
    if (std::string(c.name) == "dynamic") {
      EXPECT_EQ(result->notes.size(), 1u);
    }
  }
}

TEST(ConvertTest, HandBuiltPhi3DirectoryWithFusedQkvAndGateUp) {
  const LitModel m = MakeModel("Phi-3-mini-4k-instruct", 22);
  const Config& c = m.config;
  const TensorMap& s = m.state;
  TensorMap hf;
  hf["model.embed_tokens.weight"] = s.at("transformer.wte.weight");
  hf["model.norm.weight"] = s.at("transformer.ln_f.weight");
  hf["lm_head.weight"] = s.at("lm_head.weight");
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string h = absl::StrCat("transformer.h.", l, ".");
    const std::string p = absl::StrCat("model.layers.", l, ".");
    hf[p + "self_attn.qkv_proj.weight"] = s.at(h + "attn.qkv.weight");
    hf[p + "self_attn.o_proj.weight"] = s.at(h + "attn.proj.weight");
    hf[p + "input_layernorm.weight"] = s.at(h + "norm_1.weight");
    hf[p + "post_attention_layernorm.weight"] = s.at(h + "norm_2.weight");
    hf[p + "mlp.gate_up_proj.weight"] =
        at::cat({s.at(h + "mlp.fc_1.weight"), s.at(h + "mlp.fc_2.weight")}, 0);
    hf[p + "mlp.down_proj.weight"] = s.at(h + "mlp.proj.weight");
  }
  const std::string dir = NewDir("phi3_hand"), out = NewDir("phi3_hand_out");
  WriteFile(dir + "/config.json",
            absl::StrCat(R"({"architectures": ["Phi3ForCausalLM"], "hidden_size": )", c.n_embd,
                         R"(, "intermediate_size": )", c.IntermediateSize(),
                         R"(, "num_hidden_layers": )", c.n_layer, R"(, "num_attention_heads": )",
                         c.n_head, R"(, "num_key_value_heads": )", c.QueryGroups(),
                         R"(, "vocab_size": )", c.PaddedVocabSize(),
                         R"(, "max_position_embeddings": 64, "sliding_window": 4})"));
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", hf).ok());
  // No name in config.json: the preset is given, as --model_name does.
  ConvertOptions options;
  options.model_name = "Phi-3-mini-4k-instruct";
  absl::StatusOr<ConvertResult> result = ConvertHfCheckpoint(dir, out, options);
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectSameLogits(m, out);
}

// GPT-NeoX's query_key_value interleaves per head: [q_h, k_h, v_h] for each head h.
TEST(ConvertTest, HandBuiltPythiaDirectoryWithInterleavedQkv) {
  const LitModel m = MakeModel("pythia-14m", 23);
  const Config& c = m.config;
  const TensorMap& s = m.state;
  const int64_t hs = c.HeadSize(), q = c.n_head * hs, kv = c.QueryGroups() * hs;
  ASSERT_EQ(c.n_head, c.QueryGroups());
  TensorMap hf;
  hf["gpt_neox.embed_in.weight"] = s.at("transformer.wte.weight");
  hf["gpt_neox.final_layer_norm.weight"] = s.at("transformer.ln_f.weight");
  hf["gpt_neox.final_layer_norm.bias"] = s.at("transformer.ln_f.bias");
  hf["embed_out.weight"] = s.at("lm_head.weight");
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string h = absl::StrCat("transformer.h.", l, ".");
    const std::string p = absl::StrCat("gpt_neox.layers.", l, ".");
    for (const char* kind : {"weight", "bias"}) {
      const at::Tensor qkv = s.at(h + "attn.qkv." + kind);
      std::vector<at::Tensor> rows;
      for (int64_t head = 0; head < c.n_head; ++head) {
        rows.push_back(Rows(qkv, head * hs, hs));
        rows.push_back(Rows(qkv, q + head * hs, hs));
        rows.push_back(Rows(qkv, q + kv + head * hs, hs));
      }
      hf[p + "attention.query_key_value." + kind] = at::cat(rows, 0);
    }
    hf[p + "attention.bias"] = at::ones({1, 1, 8, 8}, at::kBool);  // Causal mask buffer.
    for (const auto& [lit, name] :
         std::vector<std::pair<std::string, std::string>>{{"norm_1", "input_layernorm"},
                                                          {"norm_2", "post_attention_layernorm"},
                                                          {"attn.proj", "attention.dense"},
                                                          {"mlp.fc", "mlp.dense_h_to_4h"},
                                                          {"mlp.proj", "mlp.dense_4h_to_h"}}) {
      hf[p + name + ".weight"] = s.at(h + lit + ".weight");
      hf[p + name + ".bias"] = s.at(h + lit + ".bias");
    }
  }
  const std::string dir = NewDir("pythia_hand"), out = NewDir("pythia_hand_out");
  WriteFile(dir + "/config.json",
            absl::StrCat(R"({"_name_or_path": "EleutherAI/pythia-14m",
                "architectures": ["GPTNeoXForCausalLM"], "hidden_size": )",
                         c.n_embd, R"(, "intermediate_size": )", c.IntermediateSize(),
                         R"(, "num_hidden_layers": )", c.n_layer, R"(, "num_attention_heads": )",
                         c.n_head, R"(, "vocab_size": )", c.PaddedVocabSize(),
                         R"(, "max_position_embeddings": 64, "rotary_pct": 0.25})"));
  // A pytorch_model.bin this time.
  ASSERT_TRUE(WriteTorchStateDict(dir + "/pytorch_model.bin", hf).ok());
  absl::StatusOr<ConvertResult> result = ConvertHfCheckpoint(dir, out);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->config.name, "pythia-14m");
  ExpectSameLogits(m, out);
}

// Gemma 3 4b+ checkpoints are multimodal: the text model under model.language_model., sizes
// under text_config, image-token rows after the text vocabulary, vision weights to skip.
TEST(ConvertTest, HandBuiltMultimodalGemma3Directory) {
  const LitModel m = MakeModel("Gemma-3-4b-it", 24);
  const std::string lit_dir = NewDir("gemma3_lit"), text_dir = NewDir("gemma3_text");
  WriteLitDir(m, lit_dir);
  ASSERT_TRUE(ConvertLitCheckpoint(lit_dir, text_dir).ok());
  absl::StatusOr<TensorMap> text = ReadSafetensors(text_dir + "/model.safetensors");
  ASSERT_TRUE(text.ok());
  std::ifstream in(text_dir + "/config.json");
  std::stringstream text_config;
  text_config << in.rdbuf();
  for (const char* prefix : {"model.language_model.", "language_model.model."}) {
    SCOPED_TRACE(prefix);
    TensorMap hf;
    for (const auto& [name, t] : *text) {
      ASSERT_TRUE(absl::StartsWith(name, "model.") || name == "lm_head.weight") << name;
      const std::string renamed =
          name == "lm_head.weight"
              ? (std::string(prefix) == "language_model.model." ? "language_model.lm_head.weight"
                                                                : name)
              : prefix + name.substr(6);
      hf[renamed] = name == "model.embed_tokens.weight"
                        ? at::cat({t, at::randn({8, t.size(1)})})  // 8 image tokens.
                        : t;
    }
    hf["model.vision_tower.vision_model.embeddings.patch_embedding.weight"] = at::randn({4, 3});
    hf["model.multi_modal_projector.mm_input_projection_weight"] = at::randn({4, 4});
    const std::string dir = NewDir("gemma3_mm"), out = NewDir("gemma3_mm_out");
    std::string vocab_rows = text_config.str();
    const std::string rows = absl::StrCat("\"vocab_size\": ", m.config.PaddedVocabSize());
    ASSERT_NE(vocab_rows.find(rows), std::string::npos);
    vocab_rows.replace(vocab_rows.find(rows), rows.size(),
                       absl::StrCat("\"vocab_size\": ", m.config.PaddedVocabSize() + 8));
    WriteFile(dir + "/config.json",
              absl::StrCat("{\"architectures\": [\"Gemma3ForConditionalGeneration\"], "
                           "\"_name_or_path\": \"google/gemma-3-4b-it\", \"text_config\": ",
                           vocab_rows, "}"));
    ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", hf).ok());
    // A shrunken model's text vocabulary is no preset's: the yaml gives it (the config side,
    // text_config with the preset's vocabulary, is in core/convert/hf_checkpoint_test.cc).
    ConvertOptions options;
    options.model_config = lit_dir + "/model_config.yaml";
    absl::StatusOr<ConvertResult> result = ConvertHfCheckpoint(dir, out, options);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->config.PaddedVocabSize(), m.config.PaddedVocabSize());
    ExpectSameLogits(m, out);
  }
}

// ---------------------------------------------------------------------------------------
// Shards and pytorch_model.bin.

struct HfFixture {
  LitModel m;
  std::string hf_dir;
  TensorMap hf;
};

HfFixture MakeHfDir(const std::string& preset, const ConvertOptions& options = {}) {
  HfFixture f{MakeModel(preset, 31), NewDir("hf_fixture"), {}};
  const std::string lit_dir = NewDir("lit_fixture");
  WriteLitDir(f.m, lit_dir);
  absl::StatusOr<ConvertResult> result = ConvertLitCheckpoint(lit_dir, f.hf_dir, options);
  EXPECT_TRUE(result.ok()) << result.status();
  absl::StatusOr<TensorMap> hf = ReadHfTensors(f.hf_dir);
  EXPECT_TRUE(hf.ok()) << hf.status();
  for (const auto& [name, t] : *hf) f.hf[name] = t.clone();
  return f;
}

void ExpectConvertsBack(const HfFixture& f, const std::string& dir) {
  const std::string out = NewDir("back");
  absl::StatusOr<ConvertResult> result = ConvertHfCheckpoint(dir, out);
  ASSERT_TRUE(result.ok()) << result.status();
  absl::StatusOr<TensorMap> lit = ReadTorchStateDict(out + "/lit_model.pth");
  ASSERT_TRUE(lit.ok()) << lit.status();
  ExpectBitIdentical(*lit, f.m.state);
  ExpectSameLogits(f.m, out);
}

TEST(ConvertTest, ShardedSafetensorsWithIndex) {
  ConvertOptions options;
  options.max_shard_bytes = 40000;
  const HfFixture f = MakeHfDir("Qwen2.5-0.5B", options);
  EXPECT_FALSE(Exists(f.hf_dir + "/model.safetensors"));
  EXPECT_TRUE(Exists(f.hf_dir + "/model.safetensors.index.json"));
  std::vector<std::string> files;
  ASSERT_TRUE(ReadHfTensors(f.hf_dir, &files).ok());
  ASSERT_GT(files.size(), 2u);
  char second[64];
  std::snprintf(second, sizeof(second), "/model-00002-of-%05zu.safetensors", files.size());
  EXPECT_TRUE(absl::EndsWith(files[1], second)) << files[1];
  ExpectConvertsBack(f, f.hf_dir);
}

TEST(ConvertTest, PytorchModelBinAndItsShards) {
  const HfFixture f = MakeHfDir("Mixtral-8x7B-v0.1");
  const std::string config = f.hf_dir + "/config.json";
  std::ifstream in(config);
  std::stringstream text;
  text << in.rdbuf();

  const std::string single = NewDir("bin");
  WriteFile(single + "/config.json", text.str());
  ASSERT_TRUE(WriteTorchStateDict(single + "/pytorch_model.bin", f.hf).ok());
  WriteFile(single + "/training_args.bin", "not a checkpoint");  // Ignored, as LitGPT does.
  ExpectConvertsBack(f, single);

  // Two shards, the q/k/v of layer 0 split across them, and an index.
  const std::string sharded = NewDir("bin_sharded");
  WriteFile(sharded + "/config.json", text.str());
  TensorMap first, second;
  std::string weight_map;
  for (const auto& [name, t] : f.hf) {
    const bool in_first = absl::StrContains(name, "q_proj") || absl::StrContains(name, "embed");
    (in_first ? first : second)[name] = t;
    absl::StrAppend(
        &weight_map, weight_map.empty() ? "" : ",\n", "\"", name, "\": \"",
        in_first ? "pytorch_model-00001-of-00002.bin" : "pytorch_model-00002-of-00002.bin", "\"");
  }
  ASSERT_TRUE(WriteTorchStateDict(sharded + "/pytorch_model-00001-of-00002.bin", first).ok());
  ASSERT_TRUE(WriteTorchStateDict(sharded + "/pytorch_model-00002-of-00002.bin", second).ok());
  WriteFile(sharded + "/pytorch_model.bin.index.json",
            absl::StrCat("{\"metadata\": {}, \"weight_map\": {", weight_map, "}}"));
  ExpectConvertsBack(f, sharded);
}

// ---------------------------------------------------------------------------------------
// Hostile inputs.

void ExpectError(const absl::Status& status, absl::StatusCode code, const std::string& detail) {
  ASSERT_FALSE(status.ok()) << "expected an error containing: " << detail;
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_NE(status.message().find(detail), std::string::npos) << status;
}

class HostileTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { fixture_ = new HfFixture(MakeHfDir("Llama-2-7b-hf")); }
  static void TearDownTestSuite() { delete fixture_; }

  // A copy of the fixture's HF dir with `tensors` (default: the fixture's) and config.json
  // text `config` (default: the fixture's).
  std::string Dir(const TensorMap* tensors = nullptr, const std::string* config = nullptr) {
    const std::string dir = NewDir("hostile");
    std::ifstream in(fixture_->hf_dir + "/config.json");
    std::stringstream text;
    text << in.rdbuf();
    WriteFile(dir + "/config.json", config ? *config : text.str());
    EXPECT_TRUE(
        WriteSafetensors(dir + "/model.safetensors", tensors ? *tensors : fixture_->hf).ok());
    return dir;
  }
  absl::Status Convert(const std::string& dir) {
    return ConvertHfCheckpoint(dir, NewDir("hostile_out")).status();
  }
  std::string ConfigText() {
    std::ifstream in(fixture_->hf_dir + "/config.json");
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  static HfFixture* fixture_;
};
HfFixture* HostileTest::fixture_ = nullptr;

TEST_F(HostileTest, MissingConfigJson) {
  const std::string dir = Dir();
  ASSERT_EQ(std::remove((dir + "/config.json").c_str()), 0);
  ExpectError(Convert(dir), absl::StatusCode::kNotFound, "no config.json");
}

TEST_F(HostileTest, MalformedConfigJson) {
  const std::string bad = "{\"architectures\": [\"LlamaForCausalLM\"], ";
  ExpectError(Convert(Dir(nullptr, &bad)), absl::StatusCode::kInvalidArgument, "config.json");
  const std::string negative =
      "{\"architectures\": [\"LlamaForCausalLM\"], \"_name_or_path\": \"Llama-2-7b-hf\", "
      "\"num_hidden_layers\": -3}";
  ExpectError(Convert(Dir(nullptr, &negative)), absl::StatusCode::kInvalidArgument,
              "num_hidden_layers");
}

TEST_F(HostileTest, UnknownArchitecture) {
  const std::string config = "{\"architectures\": [\"MambaForCausalLM\"], \"hidden_size\": 32}";
  ExpectError(Convert(Dir(nullptr, &config)), absl::StatusCode::kUnimplemented,
              "unknown architecture MambaForCausalLM");
}

// A model no preset knows converts from config.json alone; an unknown preset name is an error.
TEST_F(HostileTest, NoPresetNeeded) {
  std::string config = ConfigText();
  config.replace(config.find("meta-llama/Llama-2-7b-hf"), 24, "someone/unheard-of-model");
  const std::string dir = Dir(nullptr, &config);
  absl::StatusOr<ConvertResult> result = ConvertHfCheckpoint(dir, NewDir("hostile_out"));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->config.name, "unheard-of-model");
  EXPECT_EQ(result->config.hf_org, "someone");
  EXPECT_EQ(result->preset, "");
  ConvertOptions options;
  options.model_name = "no-such-model";
  ExpectError(ConvertHfCheckpoint(dir, NewDir("x"), options).status(), absl::StatusCode::kNotFound,
              "no-such-model");
}

TEST_F(HostileTest, MissingTensors) {
  TensorMap tensors = fixture_->hf;
  tensors.erase("model.layers.1.self_attn.k_proj.weight");
  ExpectError(Convert(Dir(&tensors)), absl::StatusCode::kInvalidArgument,
              "missing tensor model.layers.1.self_attn.k_proj.weight");
  tensors = fixture_->hf;
  tensors.erase("model.norm.weight");
  ExpectError(Convert(Dir(&tensors)), absl::StatusCode::kInvalidArgument,
              "missing tensors for Llama-2-7b-hf: transformer.ln_f.weight");
}

TEST_F(HostileTest, WrongShapes) {
  TensorMap tensors = fixture_->hf;
  tensors["model.layers.0.mlp.down_proj.weight"] =
      tensors.at("model.layers.0.mlp.down_proj.weight").t().contiguous();
  ExpectError(Convert(Dir(&tensors)), absl::StatusCode::kInvalidArgument,
              "tensor transformer.h.0.mlp.proj.weight has shape [48, 32]");
  tensors = fixture_->hf;
  tensors["model.layers.0.self_attn.v_proj.weight"] = at::zeros({5, 32});
  ExpectError(Convert(Dir(&tensors)), absl::StatusCode::kInvalidArgument,
              "model.layers.0.self_attn.v_proj.weight has shape [5, 32]");
}

TEST_F(HostileTest, UnexpectedTensor) {
  TensorMap tensors = fixture_->hf;
  tensors["model.layers.0.self_attn.mystery.weight"] = at::zeros({2});
  ExpectError(Convert(Dir(&tensors)), absl::StatusCode::kInvalidArgument,
              "unexpected tensor model.layers.0.self_attn.mystery.weight");
}

TEST_F(HostileTest, IndexProblems) {
  const std::string dir = Dir();
  std::string map;
  for (const auto& [name, t] : fixture_->hf) {
    absl::StrAppend(&map, map.empty() ? "" : ",", "\"", name, "\": \"model.safetensors\"");
  }
  const std::string index = dir + "/model.safetensors.index.json";
  WriteFile(index, absl::StrCat("{\"weight_map\": {", map,
                                ", \"extra.weight\": \"model-00002-of-00002.safetensors\"}}"));
  ExpectError(Convert(dir), absl::StatusCode::kNotFound,
              "model-00002-of-00002.safetensors is missing");
  WriteFile(index,
            absl::StrCat("{\"weight_map\": {", map, ", \"extra.weight\": \"model.safetensors\"}}"));
  ExpectError(Convert(dir), absl::StatusCode::kInvalidArgument, "places tensor extra.weight in");
  WriteFile(index, "{\"weight_map\": [1, 2]}");
  ExpectError(Convert(dir), absl::StatusCode::kInvalidArgument, "weight_map");
}

// LitGPT converts in place; lgpt does when asked (in_place), never by accident, and the
// loader then reads lit_model.pth, not the HF model.safetensors beside it.
TEST_F(HostileTest, InPlaceConversion) {
  const std::string dir = Dir();
  ExpectError(ConvertHfCheckpoint(dir, dir).status(), absl::StatusCode::kFailedPrecondition,
              "never writes into its input");
  EXPECT_FALSE(Exists(dir + "/lit_model.pth"));
  ConvertOptions options;
  options.in_place = true;
  ASSERT_TRUE(ConvertHfCheckpoint(dir, dir, options).ok());
  EXPECT_TRUE(Exists(dir + "/lit_model.pth"));
  EXPECT_TRUE(Exists(dir + "/config.json"));  // the HF files stay
  std::string source;
  absl::StatusOr<TensorMap> loaded = ReadCheckpointTensors(dir, &source);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_NE(source.find("lit_model.pth"), std::string::npos) << source;
  ExpectBitIdentical(*loaded, fixture_->m.state);
  options.write_safetensors = true;
  ExpectError(ConvertHfCheckpoint(dir, dir, options).status(),
              absl::StatusCode::kFailedPrecondition, "replace the Hugging Face weights");
  absl::StatusOr<TensorMap> lit = ReadTorchStateDict(dir + "/lit_model.pth");
  ASSERT_TRUE(lit.ok()) << lit.status();
  ExpectBitIdentical(*lit, fixture_->m.state);
}

TEST_F(HostileTest, NoWeights) {
  const std::string dir = Dir();
  ASSERT_EQ(std::remove((dir + "/model.safetensors").c_str()), 0);
  ExpectError(Convert(dir), absl::StatusCode::kNotFound, "no model.safetensors");
}

TEST_F(HostileTest, CorruptWeightsFile) {
  const std::string dir = Dir();
  WriteFile(dir + "/model.safetensors", "garbage that is not a safetensors file");
  const absl::Status status = Convert(dir);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("model.safetensors"), std::string::npos) << status;
}

TEST(ConvertLitErrorsTest, LoraWeightsAndMissingDirs) {
  const LitModel m = MakeModel("Llama-2-7b-hf", 41);
  const std::string dir = NewDir("lora");
  TensorMap state = m.state;
  state["transformer.h.0.attn.qkv.lora_A"] = at::zeros({2, 32});
  WriteFile(dir + "/model_config.yaml", ConfigToYaml(m.config));
  ASSERT_TRUE(WriteTorchStateDict(dir + "/lit_model.pth", state).ok());
  ExpectError(ConvertLitCheckpoint(dir, NewDir("lora_out")).status(),
              absl::StatusCode::kFailedPrecondition, "merge them");
  ExpectError(ConvertLitCheckpoint(dir, dir).status(), absl::StatusCode::kFailedPrecondition,
              "another output directory");
  ExpectError(ConvertLitCheckpoint(dir + "/nope", NewDir("x")).status(),
              absl::StatusCode::kNotFound, "nope");
  state.erase("transformer.h.0.attn.qkv.lora_A");
  state.erase("transformer.h.1.attn.proj.weight");
  ASSERT_TRUE(WriteTorchStateDict(dir + "/lit_model.pth", state).ok());
  ExpectError(ConvertLitCheckpoint(dir, NewDir("x")).status(), absl::StatusCode::kInvalidArgument,
              "transformer.h.1.attn.proj.weight");
}

// A NaN or infinity anywhere in the weights is refused at load, naming the tensor and the
// element; check_finite = false skips the pass for trusted files.
TEST(LoadCheckpointTest, NonFiniteWeightsAreRefused) {
  const LitModel m = MakeModel("Llama-2-7b-hf", 43);
  for (const float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    const std::string dir = NewDir("nonfinite");
    TensorMap state = m.state;
    at::Tensor weight = state.at("transformer.h.1.mlp.fc_2.weight").clone();
    weight.view({-1})[7] = bad;
    state["transformer.h.1.mlp.fc_2.weight"] = weight;
    WriteFile(dir + "/model_config.yaml", ConfigToYaml(m.config));
    ASSERT_TRUE(WriteTorchStateDict(dir + "/lit_model.pth", state).ok());
    const absl::StatusOr<LoadedModel> loaded = LoadCheckpoint(dir);
    ASSERT_FALSE(loaded.ok());
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss) << loaded.status();
    EXPECT_NE(loaded.status().message().find("transformer.h.1.mlp.fc_2.weight"), std::string::npos)
        << loaded.status();
    EXPECT_NE(loaded.status().message().find("element 7"), std::string::npos) << loaded.status();
    LoadOptions trusted;
    trusted.check_finite = false;
    EXPECT_TRUE(LoadCheckpoint(dir, trusted).ok());
  }
}

// 40 bytes flipped inside a tensor's record of lit_model.pth (xor 1 keeps the values finite,
// so nothing else would notice) fail its CRC-32 at load and at conversion, naming the tensor
// and the option that skips the check; with the check off the file loads as it is.
TEST(LoadCheckpointTest, CorruptRecordsAreRefused) {
  const LitModel m = MakeModel("Llama-2-7b-hf", 45);
  const std::string dir = NewDir("corrupt");
  WriteFile(dir + "/model_config.yaml", ConfigToYaml(m.config));
  const std::string path = dir + "/lit_model.pth";
  ASSERT_TRUE(WriteTorchStateDict(path, m.state).ok());
  const at::Tensor weight = m.state.at("transformer.h.1.mlp.fc_2.weight").contiguous();
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = bytes.find(std::string(static_cast<const char*>(weight.data_ptr()),
                                           weight.numel() * weight.element_size()));
  ASSERT_NE(at, std::string::npos);
  for (size_t i = 0; i < 40; ++i) bytes[at + 8 + i] ^= 1;
  WriteFile(path, bytes);

  const absl::StatusOr<LoadedModel> loaded = LoadCheckpoint(dir);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss) << loaded.status();
  for (const char* part : {"lit_model.pth: record ", "(tensor transformer.h.1.mlp.fc_2.weight)",
                           "CRC-32", "set LoadOptions.verify_checksums = false"}) {
    EXPECT_NE(loaded.status().message().find(part), std::string::npos) << loaded.status();
  }
  LoadOptions trusted;
  trusted.verify_checksums = false;
  absl::StatusOr<LoadedModel> unverified = LoadCheckpoint(dir, trusted);
  ASSERT_TRUE(unverified.ok()) << unverified.status();
  EXPECT_FALSE(unverified->model->named_parameters()["transformer.h.1.mlp.fc_2.weight"].equal(
      m.state.at("transformer.h.1.mlp.fc_2.weight")));

  const absl::Status converted = ConvertLitCheckpoint(dir, NewDir("corrupt_hf")).status();
  EXPECT_EQ(converted.code(), absl::StatusCode::kDataLoss) << converted;
  EXPECT_NE(converted.message().find("set ConvertOptions.verify_checksums = false"),
            std::string::npos)
      << converted;
  ConvertOptions convert;
  convert.verify_checksums = false;
  EXPECT_TRUE(ConvertLitCheckpoint(dir, NewDir("corrupt_hf"), convert).ok());
}

// A block_size past the trained context (train_config.yaml's, or the preset's) is loaded, with
// a warning that says so.
TEST(LoadCheckpointTest, BlockSizeBeyondTheTrainedContextWarns) {
  const LitModel m = MakeModel("Llama-2-7b-hf", 44);
  const std::string dir = NewDir("context");
  WriteFile(dir + "/model_config.yaml", ConfigToYaml(m.config));
  ASSERT_TRUE(WriteTorchStateDict(dir + "/lit_model.pth", m.state).ok());
  absl::StatusOr<LoadedModel> loaded = LoadCheckpoint(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->warnings.empty());
  Config trained = m.config;
  trained.block_size = m.config.block_size / 2;
  WriteFile(dir + "/train_config.yaml", ConfigToYaml(trained));
  loaded = LoadCheckpoint(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->warnings.size(), 1u);
  EXPECT_NE(
      loaded->warnings[0].find(absl::StrCat(trained.block_size, " tokens the model was trained")),
      std::string::npos)
      << loaded->warnings[0];
  // A train_config.yaml that does not parse is not silently ignored.
  WriteFile(dir + "/train_config.yaml", "block_size: [unclosed\n");
  loaded = LoadCheckpoint(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->warnings.size(), 1u);
  EXPECT_NE(loaded->warnings[0].find("ignoring train_config.yaml"), std::string::npos)
      << loaded->warnings[0];
}

}  // namespace
}  // namespace lgpt
