#include "core/config/config.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

constexpr char kGolden[] = "tests/testdata/golden/";

std::string ReadText(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

// A small valid LLaMA-style config; tests change or append keys.
constexpr char kBase[] = R"(name: tiny
n_layer: 4
n_embd: 64
n_head: 4
vocab_size: 250
padding_multiple: 64
mlp_class_name: LLaMAMLP
norm_class_name: RMSNorm
intermediate_size: 128
rotary_percentage: 1.0
parallel_residual: false
bias: false
)";

absl::StatusOr<Config> Parse(const std::string& extra) {
  return ConfigFromYaml(absl::StrCat(kBase, extra), "test.yaml");
}

// Expects an InvalidArgument error whose message contains every one of `parts`.
void ExpectError(const absl::StatusOr<Config>& result, std::initializer_list<const char*> parts,
                 absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
  ASSERT_FALSE(result.ok()) << "expected an error containing " << *parts.begin();
  EXPECT_EQ(result.status().code(), code) << result.status();
  for (const char* part : parts) {
    EXPECT_TRUE(absl::StrContains(result.status().message(), part))
        << "'" << part << "' not in: " << result.status().message();
  }
}

// ---- Golden files written by LitGPT. ----

TEST(ConfigTest, LoadsGoldenLlama2) {
  absl::StatusOr<Config> c = LoadConfigFile(absl::StrCat(kGolden, "llama2/model_config.yaml"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->name, "Llama-2-7b-hf-golden");
  EXPECT_TRUE(c->hf_org.empty());
  EXPECT_EQ(c->block_size, 128);
  EXPECT_EQ(c->n_layer, 2);
  EXPECT_EQ(c->n_embd, 64);
  EXPECT_EQ(c->n_head, 4);
  EXPECT_EQ(c->HeadSize(), 16);
  EXPECT_EQ(c->QueryGroups(), 4);
  EXPECT_EQ(c->IntermediateSize(), 128);
  EXPECT_EQ(c->vocab_size, 250);
  EXPECT_EQ(c->PaddedVocabSize(), 256);
  EXPECT_EQ(c->norm_class, NormClass::kRMSNorm);
  EXPECT_EQ(c->mlp_class, MlpClass::kLLaMAMLP);
  EXPECT_EQ(c->norm_eps, 1e-5);
  EXPECT_EQ(c->rope_base, 10000);
  EXPECT_EQ(c->rope_n_elem, 16);
  EXPECT_FALSE(c->parallel_residual);
  EXPECT_FALSE(c->bias);
  EXPECT_FALSE(c->rope_adjustments.has_value());
  EXPECT_FALSE(c->sliding_window_size.has_value());
  EXPECT_FALSE(c->sliding_window_indices.has_value());
  EXPECT_EQ(c->lora_r, 0);
  EXPECT_DOUBLE_EQ(c->AttentionScale(), 0.25);
}

TEST(ConfigTest, LoadsGoldenLlama2Lora) {
  absl::StatusOr<Config> c = LoadConfigFile(absl::StrCat(kGolden, "llama2_lora/model_config.yaml"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->lora_r, 4);
  EXPECT_EQ(c->lora_alpha, 8);
  EXPECT_EQ(c->lora_dropout, 0.0);
  EXPECT_TRUE(c->lora_query);
  EXPECT_TRUE(c->lora_key);
  EXPECT_TRUE(c->lora_value);
  EXPECT_TRUE(c->lora_projection);
  EXPECT_TRUE(c->lora_mlp);
  EXPECT_TRUE(c->lora_head);
  EXPECT_FALSE(c->adapter_prompt_length.has_value());
}

TEST(ConfigTest, LoadsGoldenLlama3Gqa) {
  absl::StatusOr<Config> c = LoadConfigFile(absl::StrCat(kGolden, "llama3_gqa/model_config.yaml"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->QueryGroups(), 1);
  EXPECT_EQ(c->rope_base, 500000);
  ASSERT_TRUE(c->rope_adjustments.has_value());
  EXPECT_TRUE(c->rope_adjustments->IsLlama3());
  EXPECT_EQ(c->rope_adjustments->factor, 32.0);
  EXPECT_EQ(c->rope_adjustments->low_freq_factor, 1.0);
  EXPECT_EQ(c->rope_adjustments->high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_adjustments->original_max_seq_len, 32.0);
  EXPECT_FALSE(c->rope_adjustments->beta_fast.has_value());
  EXPECT_DOUBLE_EQ(c->AttentionScale(), 0.25);  // No YaRN mscale.
}

TEST(ConfigTest, LoadsGoldenPythia) {
  absl::StatusOr<Config> c = LoadConfigFile(absl::StrCat(kGolden, "pythia/model_config.yaml"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->norm_class, NormClass::kLayerNorm);
  EXPECT_EQ(c->mlp_class, MlpClass::kGptNeoxMLP);
  EXPECT_TRUE(c->parallel_residual);
  EXPECT_TRUE(c->bias);
  EXPECT_EQ(c->rotary_percentage, 0.25);
  EXPECT_EQ(c->rope_n_elem, 4);
  EXPECT_EQ(c->padding_multiple, 128);
  EXPECT_TRUE(c->NormHasAffine());
  EXPECT_FALSE(c->NormUnitOffset());
}

TEST(ConfigTest, GoldenFilesAreWrittenBackByteForByte) {
  for (const char* name : {"llama2", "llama2_lora", "llama3_gqa", "pythia"}) {
    const std::string path = absl::StrCat(kGolden, name, "/model_config.yaml");
    absl::StatusOr<Config> c = LoadConfigFile(path);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(ConfigToYaml(*c), ReadText(path)) << name;
  }
}

TEST(ConfigTest, MissingFileIsNotFound) {
  absl::StatusOr<Config> c = LoadConfigFile("/nonexistent/dir/model_config.yaml");
  ExpectError(c, {"/nonexistent/dir/model_config.yaml"}, absl::StatusCode::kNotFound);
}

// ---- Errors. ----

TEST(ConfigTest, UnknownKeyIsNamed) {
  ExpectError(Parse("n_layers: 4\n"), {"test.yaml", "n_layers", "line 13"});
  ExpectError(Parse("hf_config: {org: a, nmae: b}\n"), {"test.yaml", "hf_config.nmae"});
  ExpectError(Parse("rope_adjustments: {factor: 2.0, fcator: 1}\n"), {"rope_adjustments.fcator"});
}

TEST(ConfigTest, WrongTypesAreNamed) {
  ExpectError(ConfigFromYaml("n_layer: abc\n", "f.yaml"), {"f.yaml", "n_layer", "'abc'"});
  ExpectError(ConfigFromYaml("n_layer: 2.5\n", "f.yaml"), {"n_layer", "integer", "'2.5'"});
  ExpectError(ConfigFromYaml("n_layer: [1, 2]\n", "f.yaml"), {"n_layer", "a list"});
  ExpectError(ConfigFromYaml("n_layer: {a: 1}\n", "f.yaml"), {"n_layer", "a mapping"});
  ExpectError(ConfigFromYaml("n_layer: '2'\n", "f.yaml"), {"n_layer", "quoted"});
  ExpectError(ConfigFromYaml("n_layer: 99999999999999999999999\n", "f.yaml"), {"n_layer"});
  ExpectError(ConfigFromYaml("n_layer:\n", "f.yaml"), {"n_layer", "null"});
  ExpectError(ConfigFromYaml("bias: 1\n", "f.yaml"), {"bias", "true or false"});
  ExpectError(ConfigFromYaml("bias: maybe\n", "f.yaml"), {"bias"});
  ExpectError(ConfigFromYaml("norm_eps: small\n", "f.yaml"), {"norm_eps", "number"});
  ExpectError(ConfigFromYaml("norm_eps: 1e\n", "f.yaml"), {"norm_eps"});
  ExpectError(ConfigFromYaml("name: [a, b]\n", "f.yaml"), {"name", "string"});
  ExpectError(ConfigFromYaml("hf_config: gpt\n", "f.yaml"), {"hf_config", "mapping"});
  ExpectError(ConfigFromYaml("hf_config: {name: [x]}\n", "f.yaml"), {"hf_config.name"});
  ExpectError(ConfigFromYaml("rope_adjustments: [1]\n", "f.yaml"), {"rope_adjustments"});
  ExpectError(ConfigFromYaml("rope_adjustments: {factor: big}\n", "f.yaml"),
              {"rope_adjustments.factor"});
  ExpectError(ConfigFromYaml("rope_adjustments: {truncate: 3}\n", "f.yaml"),
              {"rope_adjustments.truncate"});
  ExpectError(ConfigFromYaml("sliding_window_indices: 1\n", "f.yaml"),
              {"sliding_window_indices", "list"});
  ExpectError(ConfigFromYaml("sliding_window_indices: [1, x]\n", "f.yaml"),
              {"sliding_window_indices[1]"});
  ExpectError(ConfigFromYaml("latent_attention: 5\n", "f.yaml"), {"latent_attention"});
  ExpectError(ConfigFromYaml("sliding_window_size: 1.5\n", "f.yaml"), {"sliding_window_size"});
}

TEST(ConfigTest, UnknownEnumValuesAreNamed) {
  ExpectError(ConfigFromYaml("norm_class_name: BatchNorm\n", "f.yaml"),
              {"f.yaml", "norm_class_name", "'BatchNorm'", "'RMSNorm'"});
  ExpectError(ConfigFromYaml("mlp_class_name: Mlp\n", "f.yaml"), {"mlp_class_name", "'Mlp'"});
  ExpectError(Parse("norm_qk_type: olmo3\n"), {"norm_qk_type", "'olmo3'"});
  ExpectError(Parse("gelu_approximate: erf\n"), {"gelu_approximate", "'erf'"});
}

TEST(ConfigTest, DuplicateKeyIsAnError) {
  ExpectError(Parse("n_layer: 8\n"), {"duplicate", "n_layer"});
}

TEST(ConfigTest, MalformedYamlNamesSourceAndLine) {
  ExpectError(ConfigFromYaml("n_layer: 2\nn_embd: [1, 2\n", "bad.yaml"),
              {"bad.yaml", "malformed yaml", "line"});
  ExpectError(ConfigFromYaml("n_layer: 2\n  n_embd: 3\n bias: x\n", "bad.yaml"),
              {"bad.yaml", "line"});
  ExpectError(ConfigFromYaml("a: b: c\n", "bad.yaml"), {"bad.yaml", "line 1"});
  ExpectError(ConfigFromYaml("\"unterminated\n", "bad.yaml"), {"bad.yaml"});
  ExpectError(ConfigFromYaml("n_layer: *nowhere\n", "bad.yaml"), {"bad.yaml"});
  ExpectError(ConfigFromYaml(std::string("n_layer: \0\x01\xff\xfe", 13), "bad.yaml"), {"bad.yaml"});
}

// yaml-cpp 0.7's LoadAll loops, allocating without end, on a stray leading ','.
TEST(ConfigTest, StrayFlowEntryDoesNotExhaustMemory) {
  ExpectError(ConfigFromYaml(",n_layer: 2\n", "comma.yaml"), {"comma.yaml", "malformed yaml"});
  ExpectError(ConfigFromYaml(",", "comma.yaml"), {"comma.yaml", "malformed yaml"});
}

TEST(ConfigTest, EmptyOrNonMappingDocumentIsAnError) {
  ExpectError(ConfigFromYaml("", "empty.yaml"), {"empty.yaml", "empty"});
  ExpectError(ConfigFromYaml("# only a comment\n", "empty.yaml"), {"empty.yaml", "empty"});
  ExpectError(ConfigFromYaml("---\n", "empty.yaml"), {"empty.yaml", "empty"});
  ExpectError(ConfigFromYaml("null\n", "empty.yaml"), {"empty.yaml", "empty"});
  ExpectError(ConfigFromYaml("- n_layer\n- 2\n", "list.yaml"), {"list.yaml", "mapping"});
  ExpectError(ConfigFromYaml("42\n", "scalar.yaml"), {"scalar.yaml", "mapping"});
  ExpectError(ConfigFromYaml("n_layer: 2\n---\nn_layer: 3\n", "two.yaml"),
              {"two.yaml", "one yaml document", "line 2"});
  ExpectError(ConfigFromYaml("[1, 2]: 3\n", "key.yaml"), {"key.yaml", "key"});
}

TEST(ConfigTest, DeepNestingDoesNotCrash) {
  const std::string deep = absl::StrCat("n_layer: ", std::string(100000, '['));
  ExpectError(ConfigFromYaml(deep, "deep.yaml"), {"deep.yaml", "too deep"});
  const std::string deep_map = absl::StrCat("hf_config: ", std::string(100000, '{'));
  EXPECT_FALSE(ConfigFromYaml(deep_map, "deep.yaml").ok());
}

TEST(ConfigTest, NHeadNotDivisibleByQueryGroups) {
  ExpectError(Parse("n_query_groups: 3\n"), {"test.yaml", "n_head (4)", "n_query_groups (3)"});
  ExpectError(Parse("n_query_groups: 0\n"), {"n_query_groups (0)"});
}

TEST(ConfigTest, NEmbdNotDivisibleByNHead) {
  ExpectError(ConfigFromYaml("n_embd: 65\nn_head: 4\n", "f.yaml"), {"n_embd (65)", "n_head (4)"});
  // An explicit head_size lifts the requirement, as in LitGPT (Gemma 7B: 3072 / 16 != 256).
  absl::StatusOr<Config> c = ConfigFromYaml("n_embd: 65\nn_head: 4\nhead_size: 16\n", "f.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->HeadSize(), 16);
}

TEST(ConfigTest, ImpossibleSizes) {
  ExpectError(ConfigFromYaml("n_layer: 0\n", "f.yaml"), {"n_layer (0)"});
  ExpectError(ConfigFromYaml("n_embd: -64\n", "f.yaml"), {"n_embd (-64)"});
  ExpectError(ConfigFromYaml("n_head: 0\n", "f.yaml"), {"n_head (0)"});
  ExpectError(ConfigFromYaml("vocab_size: 0\n", "f.yaml"), {"vocab_size (0)"});
  ExpectError(ConfigFromYaml("block_size: 0\n", "f.yaml"), {"block_size (0)"});
  ExpectError(ConfigFromYaml("padding_multiple: 0\n", "f.yaml"), {"padding_multiple (0)"});
  ExpectError(ConfigFromYaml("head_size: 0\n", "f.yaml"), {"head_size (0)"});
  ExpectError(ConfigFromYaml("padded_vocab_size: 0\n", "f.yaml"), {"padded_vocab_size (0)"});
  ExpectError(ConfigFromYaml("intermediate_size: 0\n", "f.yaml"), {"intermediate_size (0)"});
  ExpectError(ConfigFromYaml("rope_condense_ratio: 0\n", "f.yaml"), {"rope_condense_ratio (0)"});
  // Absurd sizes are refused before anything is derived or allocated from them.
  ExpectError(ConfigFromYaml("n_layer: 1000000000000\nsliding_window_size: 4\n", "f.yaml"),
              {"n_layer (1000000000000)", "at most"});
  ExpectError(ConfigFromYaml("n_embd: 9223372036854775807\nhead_size: 1\n", "f.yaml"), {"n_embd"});
}

TEST(ConfigTest, ImpossibleFloats) {
  ExpectError(ConfigFromYaml("rotary_percentage: 1.5\n", "f.yaml"), {"rotary_percentage (1.5)"});
  ExpectError(ConfigFromYaml("rotary_percentage: -0.1\n", "f.yaml"), {"rotary_percentage"});
  ExpectError(ConfigFromYaml("rope_base: 0\n", "f.yaml"), {"rope_base (0)"});
  ExpectError(ConfigFromYaml("rope_base: .inf\n", "f.yaml"), {"rope_base"});
  ExpectError(ConfigFromYaml("norm_eps: -1.0e-05\n", "f.yaml"), {"norm_eps"});
  ExpectError(ConfigFromYaml("norm_eps: .nan\n", "f.yaml"), {"norm_eps"});
  ExpectError(ConfigFromYaml("attention_logit_softcapping: 0.0\n", "f.yaml"),
              {"attention_logit_softcapping (0)"});
  ExpectError(ConfigFromYaml("final_logit_softcapping: -30.0\n", "f.yaml"),
              {"final_logit_softcapping (-30)"});
  ExpectError(ConfigFromYaml("attention_scores_scalar: 0\n", "f.yaml"),
              {"attention_scores_scalar"});
  ExpectError(ConfigFromYaml("lora_dropout: 1.0\n", "f.yaml"), {"lora_dropout"});
}

TEST(ConfigTest, OddRotaryDimensionsAreAnError) {
  // head_size 16 * 0.3 = 4.8 -> 4 is fine; 16 * 0.2 = 3.2 -> 3 is odd.
  ASSERT_TRUE(ConfigFromYaml("n_embd: 64\nn_head: 4\nrotary_percentage: 0.3\n", "f").ok());
  ExpectError(ConfigFromYaml("n_embd: 64\nn_head: 4\nrotary_percentage: 0.2\n", "f"),
              {"rotary_percentage", "odd", "(3)"});
  absl::StatusOr<Config> none = ConfigFromYaml("rotary_percentage: 0.0\n", "f");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->rope_n_elem, 0);
}

TEST(ConfigTest, SlidingWindowSizeZero) {
  ExpectError(Parse("sliding_window_size: 0\n"), {"sliding_window_size (0)"});
}

TEST(ConfigTest, IndicatorLists) {
  // Shorter than n_layer: an error.
  ExpectError(Parse("sliding_window_size: 16\nsliding_window_indices: [1, 0]\n"),
              {"sliding_window_indices", "2", "n_layer (4)"});
  ExpectError(Parse("rope_local_base_freq: 10000\nrope_indices: [1]\n"), {"rope_indices"});
  // Other values than 0 and 1: an error.
  ExpectError(Parse("sliding_window_size: 16\nsliding_window_indices: [1, 0, 2, 1]\n"),
              {"sliding_window_indices[2]", "0 or 1"});
  // Longer: cut to n_layer.
  absl::StatusOr<Config> c =
      Parse("sliding_window_size: 16\nsliding_window_indices: [0, 1, 0, 1, 1, 1]\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c->sliding_window_indices, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_FALSE(c->IsSlidingWindowLayer(0));
  EXPECT_TRUE(c->IsSlidingWindowLayer(1));
  EXPECT_FALSE(c->IsSlidingWindowLayer(4));
  EXPECT_FALSE(c->IsSlidingWindowLayer(-1));
  // Missing: every layer.
  absl::StatusOr<Config> all = Parse("sliding_window_size: 16\n");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all->sliding_window_indices, (std::vector<int>{1, 1, 1, 1}));
  // Without a window the list is kept as it is and unused, as in LitGPT.
  absl::StatusOr<Config> unused = Parse("sliding_window_indices: [7]\n");
  ASSERT_TRUE(unused.ok()) << unused.status();
  EXPECT_FALSE(unused->IsSlidingWindowLayer(0));
  // Local RoPE.
  absl::StatusOr<Config> local = Parse("rope_local_base_freq: 10000\nrope_indices: [1, 1, 0, 1]\n");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_TRUE(local->UsesLocalRope(0));
  EXPECT_FALSE(local->UsesLocalRope(2));
  absl::StatusOr<Config> global = Parse("rope_indices: [1, 1, 1, 1]\n");
  ASSERT_TRUE(global.ok()) << global.status();
  EXPECT_FALSE(global->UsesLocalRope(0));  // No local base: nothing is local.
}

TEST(ConfigTest, RopeAdjustmentVariants) {
  ExpectError(Parse("rope_adjustments: {factor: 8.0, low_freq_factor: 1.0, high_freq_factor: "
                    "4.0, original_max_seq_len: 8192, beta_fast: 32, beta_slow: 1}\n"),
              {"rope_adjustments", "mutually exclusive"});
  ExpectError(Parse("rope_adjustments: {factor: 8.0, low_freq_factor: 1.0}\n"),
              {"Llama 3", "high_freq_factor", "original_max_seq_len"});
  ExpectError(Parse("rope_adjustments: {beta_fast: 32.0, beta_slow: 1.0}\n"),
              {"YaRN", "factor", "original_max_seq_len"});
  ExpectError(Parse("rope_adjustments: {factor: 0.0}\n"), {"rope_adjustments.factor"});
  ExpectError(Parse("rope_adjustments: {factor: 8.0, low_freq_factor: 2.0, high_freq_factor: "
                    "2.0, original_max_seq_len: 8192}\n"),
              {"low_freq_factor", "differ"});
  absl::StatusOr<Config> linear = Parse("rope_adjustments: {factor: 8.0}\n");
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_FALSE(linear->rope_adjustments->IsLlama3());
  EXPECT_FALSE(linear->rope_adjustments->IsYarn());
  absl::StatusOr<Config> empty = Parse("rope_adjustments: {}\n");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->rope_adjustments.has_value());
}

TEST(ConfigTest, YarnMscaleScalesAttention) {
  absl::StatusOr<Config> c = Parse(
      "rope_adjustments:\n  factor: 40.0\n  beta_fast: 32.0\n  beta_slow: 1.0\n"
      "  original_max_seq_len: 4096\n  mscale: 1.0\n  mscale_all_dim: 0.707\n"
      "  truncate: false\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->rope_adjustments->IsYarn());
  EXPECT_EQ(c->rope_adjustments->truncate, false);
  const double mscale = 0.1 * 0.707 * std::log(40.0) + 1.0;
  EXPECT_DOUBLE_EQ(c->AttentionScale(), 1.0 / std::sqrt(16.0) * mscale * mscale);
  // Without mscale_all_dim, or with a factor of at most 1, there is no extra scale.
  absl::StatusOr<Config> plain = Parse(
      "rope_adjustments: {factor: 40.0, beta_fast: 32.0, beta_slow: 1.0, "
      "original_max_seq_len: 4096, mscale: 1.0}\n");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_DOUBLE_EQ(plain->AttentionScale(), 0.25);
  absl::StatusOr<Config> small = Parse(
      "rope_adjustments: {factor: 1.0, beta_fast: 32.0, beta_slow: 1.0, "
      "original_max_seq_len: 4096, mscale_all_dim: 1.0}\n");
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_DOUBLE_EQ(small->AttentionScale(), 0.25);
}

TEST(ConfigTest, AttentionScoresScalar) {
  absl::StatusOr<Config> c = Parse("attention_scores_scalar: 144\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->AttentionScale(), 1.0 / 12.0);
}

TEST(ConfigTest, LatentAttentionIsUnimplemented) {
  ExpectError(Parse("latent_attention: {q_lora_rank: 8, kv_lora_rank: 8}\n"),
              {"latent attention is not supported"}, absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(Parse("latent_attention: null\n").ok());
}

TEST(ConfigTest, StructuralConstraints) {
  ExpectError(ConfigFromYaml("mlp_class_name: LLaMAMLP\nname: x\n", "f.yaml"),
              {"intermediate_size", "LLaMAMLP"});
  ExpectError(Parse("shared_attention_norm: true\n"),
              {"shared_attention_norm", "parallel_residual"});
  // Only LLaMAMLP insists on intermediate_size; GemmaMLP and LLaMAMoE default to 4 * n_embd.
  absl::StatusOr<Config> gemma = ConfigFromYaml("mlp_class_name: GemmaMLP\nn_embd: 64\n", "f");
  ASSERT_TRUE(gemma.ok()) << gemma.status();
  EXPECT_EQ(gemma->IntermediateSize(), 256);
}

TEST(ConfigTest, MixtureOfExpertsConstraints) {
  const std::string moe = "mlp_class_name: LLaMAMoE\nn_embd: 64\nn_head: 4\n";
  const auto parse = [&](const std::string& extra) {
    return ConfigFromYaml(moe + extra, "moe.yaml");
  };
  ExpectError(parse("n_expert: 0\nn_expert_per_token: 0\n"), {"n_expert (0)"});
  ExpectError(parse("n_expert: 4\nn_expert_per_token: 5\n"), {"n_expert_per_token (5)"});
  ExpectError(parse("n_expert: 4\nn_expert_per_token: 0\n"), {"n_expert_per_token (0)"});
  ExpectError(parse("n_expert: 4\nn_expert_per_token: 2\nn_shared_expert: 1\n"),
              {"moe_intermediate_size"});
  ExpectError(parse("n_expert: 4\nn_expert_per_token: 2\nmoe_intermediate_size: 0\n"),
              {"moe_intermediate_size (0)"});
  ExpectError(ConfigFromYaml("first_k_dense_replace: 1\n", "f"),
              {"first_k_dense_replace", "LLaMAMoE"});
  ExpectError(parse("n_expert: 8\nn_expert_per_token: 2\nn_expert_groups: 3\n"),
              {"n_expert_groups (3)"});
  ExpectError(parse("n_expert: 8\nn_expert_per_token: 2\nn_expert_groups: 1\n"),
              {"n_expert_groups (1)"});
  ExpectError(parse("n_expert: 8\nn_expert_per_token: 2\nn_expert_groups: 2\n"), {"n_topk_groups"});
  ExpectError(parse("n_expert: 8\nn_expert_per_token: 2\nn_expert_groups: 2\n"
                    "n_topk_groups: 1\nn_topk_scores_per_group: 5\n"),
              {"n_topk_scores_per_group (5)"});
  absl::StatusOr<Config> ok = parse(
      "n_expert: 8\nn_expert_per_token: 2\nn_expert_groups: 2\nn_topk_groups: 1\n"
      "n_topk_scores_per_group: 2\nmoe_intermediate_size: 32\nn_shared_expert: 1\n"
      "first_k_dense_replace: 1\nintermediate_size: 96\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->IntermediateSize(), 96);
}

// ---- Derived values. ----

TEST(ConfigTest, DerivedValues) {
  absl::StatusOr<Config> c = ConfigFromYaml(
      "hf_config: {org: EleutherAI, name: pythia-x}\nn_embd: 96\nn_head: 6\n"
      "vocab_size: 1000\npadding_multiple: 128\n",
      "f.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->name, "pythia-x");  // Taken from hf_config when empty.
  EXPECT_EQ(c->hf_org, "EleutherAI");
  EXPECT_EQ(c->HeadSize(), 16);
  EXPECT_EQ(c->QueryGroups(), 6);
  EXPECT_EQ(c->PaddedVocabSize(), 1024);
  EXPECT_EQ(c->vocab_size, 1000);
  EXPECT_EQ(c->IntermediateSize(), 384);
  EXPECT_EQ(c->rope_n_elem, 4);  // int(0.25 * 16)
  EXPECT_FALSE(c->sliding_window_indices.has_value());
  EXPECT_FALSE(c->rope_indices.has_value());

  // An explicit padded size caps the vocabulary instead.
  absl::StatusOr<Config> capped = ConfigFromYaml("vocab_size: 300\npadded_vocab_size: 256\n", "f");
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_EQ(capped->vocab_size, 256);
  EXPECT_EQ(capped->PaddedVocabSize(), 256);
}

TEST(ConfigTest, NormFlagsFollowTheName) {
  Config gemma;
  gemma.name = "Gemma-2b-custom";
  gemma.norm_class = NormClass::kRMSNorm;
  EXPECT_TRUE(gemma.NormUnitOffset());
  gemma.norm_class = NormClass::kLayerNorm;
  EXPECT_FALSE(gemma.NormUnitOffset());
  Config olmo;
  olmo.name = "OLMo-1B-hf";
  EXPECT_FALSE(olmo.NormHasAffine());
  olmo.norm_class = NormClass::kRMSNorm;
  EXPECT_TRUE(olmo.NormHasAffine());
}

TEST(ConfigTest, NumbersInOtherSpellings) {
  absl::StatusOr<Config> c = ConfigFromYaml(
      "n_layer: 2.0\nrope_base: 5.0e+05\nnorm_eps: 1e-6\nrotary_percentage: 1\n"
      "bias: False\nattn_bias: yes\nname: ~\nrope_adjustments: ~\nblock_size: +64\n",
      "f.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_layer, 2);
  EXPECT_EQ(c->rope_base, 500000);
  EXPECT_EQ(c->norm_eps, 1e-6);
  EXPECT_EQ(c->rotary_percentage, 1.0);
  EXPECT_FALSE(c->bias);
  EXPECT_TRUE(c->attn_bias);
  EXPECT_EQ(c->block_size, 64);
}

TEST(ConfigTest, FinalizeIsIdempotent) {
  absl::StatusOr<Config> c = Parse("sliding_window_size: 8\nrope_local_base_freq: 10000.0\n");
  ASSERT_TRUE(c.ok()) << c.status();
  Config again = *c;
  ASSERT_TRUE(again.Finalize().ok());
  EXPECT_TRUE(again == *c);
}

// ---- Writing. ----

TEST(ConfigTest, RoundTripOfUnusualValues) {
  Config c;
  c.name = "yes: a \"quoted\" name\\ with\ttab and ünïcode";
  c.hf_org = "org";
  c.hf_name = "123";
  c.n_layer = 3;
  c.n_embd = 48;
  c.n_head = 6;
  c.n_query_groups = 2;
  c.vocab_size = 77;
  c.padding_multiple = 5;
  c.norm_eps = 1.0 / 3.0;
  c.norm_qk = true;
  c.norm_qk_type = NormQkType::kOlmo2;
  c.rope_base = 1234.5678;
  c.rotary_percentage = 0.5;
  c.attention_scores_scalar = 0.1;
  c.sliding_window_size = 7;
  c.sliding_window_indices = std::vector<int>{0, 1, 1, 0};
  c.rope_local_base_freq = 1e300;
  c.attention_logit_softcapping = 1e-300;
  c.final_logit_softcapping = 123456789012345678.0;
  RopeAdjustments yarn;
  yarn.factor = 4.0;
  yarn.beta_fast = 32.5;
  yarn.beta_slow = 1.0;
  yarn.original_max_seq_len = 2048;
  yarn.mscale_all_dim = 0.1;
  yarn.truncate = false;
  c.rope_adjustments = yarn;
  c.mlp_class = MlpClass::kLLaMAMoE;
  c.n_expert = 4;
  c.n_expert_per_token = 2;
  c.moe_intermediate_size = 24;
  c.gelu_approximate = "tanh";
  c.routed_scaling_factor = 2.5;
  c.lora_r = 8;
  c.lora_alpha = 16.5;
  c.lora_dropout = 0.05;
  c.lora_mlp = true;
  c.adapter_prompt_length = 10;
  ASSERT_TRUE(c.Finalize().ok());
  const std::string yaml = ConfigToYaml(c);
  absl::StatusOr<Config> back = ConfigFromYaml(yaml, "roundtrip");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << yaml;
  EXPECT_TRUE(*back == c) << yaml;
  EXPECT_EQ(back->name, c.name);
  EXPECT_EQ(back->norm_eps, c.norm_eps);
  EXPECT_EQ(back->final_logit_softcapping, c.final_logit_softcapping);
  EXPECT_TRUE(absl::StrContains(yaml, "lora_query: false\n")) << yaml;
  EXPECT_TRUE(absl::StrContains(yaml, "adapter_prompt_length: 10\n")) << yaml;
  EXPECT_FALSE(absl::StrContains(yaml, "adapter_start_layer")) << yaml;
  // PyYAML reads floats only with a '.' in the mantissa.
  EXPECT_TRUE(absl::StrContains(yaml, "attention_logit_softcapping: 1.0e-300\n")) << yaml;
}

TEST(ConfigTest, WritesSortedKeysAndNullsLikeLitGpt) {
  absl::StatusOr<Config> c = Parse("");
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string yaml = ConfigToYaml(*c);
  EXPECT_TRUE(absl::StartsWith(yaml, "attention_logit_softcapping: null\n")) << yaml;
  EXPECT_TRUE(absl::StrContains(yaml, "hf_config: {}\n")) << yaml;
  EXPECT_TRUE(absl::StrContains(yaml, "latent_attention: null\n")) << yaml;
  EXPECT_TRUE(absl::StrContains(yaml, "norm_eps: 1.0e-05\n")) << yaml;
  EXPECT_TRUE(absl::StrContains(yaml, "rope_base: 10000\n")) << yaml;
  EXPECT_TRUE(absl::StrContains(yaml, "rotary_percentage: 1.0\n")) << yaml;
  EXPECT_FALSE(absl::StrContains(yaml, "lora_")) << yaml;
  EXPECT_TRUE(absl::EndsWith(yaml, "vocab_size: 250\n")) << yaml;
}

TEST(ConfigTest, EqualityNoticesEveryKindOfField) {
  absl::StatusOr<Config> a = Parse("");
  ASSERT_TRUE(a.ok());
  Config b = *a;
  EXPECT_TRUE(*a == b);
  b.rope_adjustments = RopeAdjustments();
  EXPECT_TRUE(*a != b);
  b = *a;
  b.lora_head = true;
  EXPECT_TRUE(*a != b);
  b = *a;
  b.rope_n_elem = 2;
  EXPECT_TRUE(*a != b);
}

}  // namespace
}  // namespace lgpt
