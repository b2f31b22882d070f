// Unit tests of the Hugging Face tensor conversion that need no model: the interleaved qkv
// layout against a per-head loop, and the shapes the converter expects. config.json is tested
// in hf_config_test.cc; whole-model round trips are in tests/convert_roundtrip_test.cc.
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

// Integer weights are refused by name both ways: HfToLit concatenated an integer q_proj
// with float k/v into a float qkv, and wrote an integer lm_head into a lit_model.pth that the
// loader refuses; LitToHf wrote them out as they were.
TEST(HfToLitTest, IntegerWeightsAreErrorsNamingThem) {
  absl::StatusOr<Config> preset = PresetFromName("Llama-2-7b-hf");
  ASSERT_TRUE(preset.ok());
  Config c = *preset;
  c.n_layer = 1;
  c.n_embd = 16;
  c.n_head = 2;
  c.n_query_groups = 2;
  c.head_size = 8;
  c.intermediate_size = 32;
  c.padded_vocab_size = 10;
  c.vocab_size = 10;
  ASSERT_TRUE(c.Finalize().ok());
  TensorMap lit;
  at::manual_seed(3);
  for (const auto& [name, shape] : ExpectedLitShapes(c)) lit[name] = at::randn(shape);
  absl::StatusOr<TensorMap> hf = LitToHf(c, lit, "test");
  ASSERT_TRUE(hf.ok()) << hf.status();
  for (const char* name : {"model.layers.0.self_attn.q_proj.weight", "lm_head.weight"}) {
    TensorMap bad = *hf;
    bad[name] = bad.at(name).to(at::kInt);
    const absl::StatusOr<TensorMap> converted = HfToLit(c, bad, "test");
    ASSERT_FALSE(converted.ok()) << name;
    EXPECT_EQ(converted.status().message(),
              absl::StrCat("test: tensor ", name, " is Int, not a floating-point weight"));
  }
  lit["transformer.ln_f.weight"] = lit.at("transformer.ln_f.weight").to(at::kLong);
  const absl::StatusOr<TensorMap> back = LitToHf(c, lit, "test");
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.status().message(),
            "test: tensor transformer.ln_f.weight is Long, not a floating-point weight");
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
