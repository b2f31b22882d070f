#include "core/dist/tensor_parallel.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace lgpt {
namespace {

using ::testing::HasSubstr;

Config Small(int64_t n_head, int64_t groups) {
  Config c;
  c.name = "small";
  c.n_layer = 1;
  c.n_embd = 32;
  c.n_head = n_head;
  c.head_size = 4;
  c.rotary_percentage = 1.0;
  c.n_query_groups = groups;
  c.intermediate_size = 48;
  c.vocab_size = 64;
  c.padded_vocab_size = 64;
  c.block_size = 16;
  return c;
}

// Row r of a [rows, 1] tensor holds r, so a shard shows which rows it took.
at::Tensor Rows(int64_t rows) { return at::arange(rows, at::kFloat).unsqueeze(1); }

std::vector<int64_t> RowIds(const at::Tensor& t) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < t.size(0); ++i) ids.push_back(t[i][0].item<int64_t>());
  return ids;
}

std::vector<int64_t> Range(int64_t begin, int64_t end) {
  std::vector<int64_t> r;
  for (int64_t i = begin; i < end; ++i) r.push_back(i);
  return r;
}

std::vector<int64_t> Concat(std::vector<int64_t> a, const std::vector<int64_t>& b,
                            const std::vector<int64_t>& c) {
  a.insert(a.end(), b.begin(), b.end());
  a.insert(a.end(), c.begin(), c.end());
  return a;
}

TEST(ShardConfigTest, GqaSplitsHeadsGroupsAndIntermediate) {
  absl::StatusOr<Config> local = ShardConfig(Small(8, 4), 1, 2);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->n_head, 4);
  EXPECT_EQ(local->QueryGroups(), 2);
  EXPECT_EQ(local->HeadSize(), 4);
  EXPECT_EQ(local->IntermediateSize(), 24);
  EXPECT_EQ(local->n_embd, 32);
  EXPECT_EQ(local->PaddedVocabSize(), 64);
}

TEST(ShardConfigTest, FewerGroupsThanRanksReplicatesGroups) {
  absl::StatusOr<Config> local = ShardConfig(Small(8, 2), 3, 4);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->n_head, 2);
  EXPECT_EQ(local->QueryGroups(), 1);
  absl::StatusOr<Config> mqa = ShardConfig(Small(4, 1), 0, 2);
  ASSERT_TRUE(mqa.ok()) << mqa.status();
  EXPECT_EQ(mqa->QueryGroups(), 1);
}

TEST(ShardConfigTest, WorldSizeOneIsTheFinalisedConfig) {
  absl::StatusOr<Config> local = ShardConfig(Small(8, 4), 0, 1);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->n_head, 8);
  EXPECT_EQ(local->QueryGroups(), 4);
}

TEST(ShardConfigTest, NonDividingSizesNameTheField) {
  EXPECT_THAT(ShardConfig(Small(6, 6), 0, 4).status().message(),
              HasSubstr("n_head (6) is not divisible by the tensor-parallel size 4"));
  EXPECT_THAT(ShardConfig(Small(12, 3), 0, 2).status().message(),
              HasSubstr("n_query_groups (3) and the tensor-parallel size 2"));
  Config c = Small(8, 8);
  c.intermediate_size = 50;
  EXPECT_THAT(ShardConfig(c, 0, 4).status().message(),
              HasSubstr("intermediate_size (50) is not divisible"));
  c.intermediate_size = 48;
  c.moe_intermediate_size = 6;
  EXPECT_THAT(ShardConfig(c, 0, 4).status().message(),
              HasSubstr("moe_intermediate_size (6) is not divisible"));
}

TEST(ShardTensorsTest, Olmo2QkNormsTakeTheRanksHeadsAndGroups) {
  Config c = Small(8, 4);  // head_size 4: q norm 32 features, k norm 16
  c.norm_qk = true;
  c.norm_qk_type = NormQkType::kOlmo2;
  ASSERT_TRUE(ShardConfig(c, 1, 2).ok());
  const std::map<std::string, at::Tensor> full = {
      {"transformer.h.0.attn.norm_q.weight", at::arange(32, at::kFloat)},
      {"transformer.h.0.attn.norm_k.weight", at::arange(16, at::kFloat)}};
  absl::StatusOr<std::map<std::string, at::Tensor>> rank1 = ShardTensors(full, c, 1, 2);
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  EXPECT_TRUE(
      at::equal(rank1->at("transformer.h.0.attn.norm_q.weight"), at::arange(16, 32, at::kFloat)));
  EXPECT_TRUE(
      at::equal(rank1->at("transformer.h.0.attn.norm_k.weight"), at::arange(8, 16, at::kFloat)));
  // Fewer groups than ranks: rank 3 of 4 reads group 1 (of 2).
  Config mqa = Small(8, 2);
  mqa.norm_qk = true;
  mqa.norm_qk_type = NormQkType::kOlmo2;
  const std::map<std::string, at::Tensor> narrow = {
      {"transformer.h.0.attn.norm_k.weight", at::arange(8, at::kFloat)}};
  absl::StatusOr<std::map<std::string, at::Tensor>> rank3 = ShardTensors(narrow, mqa, 3, 4);
  ASSERT_TRUE(rank3.ok()) << rank3.status();
  EXPECT_TRUE(
      at::equal(rank3->at("transformer.h.0.attn.norm_k.weight"), at::arange(4, 8, at::kFloat)));
}

TEST(ShardTensorsTest, QkvTakesTheRanksHeadsAndGroups) {
  // n_head 8, 4 groups, head_size 4: Q rows [0, 32), K [32, 48), V [48, 64).
  const Config c = Small(8, 4);
  std::map<std::string, at::Tensor> full = {{"transformer.h.0.attn.qkv.weight", Rows(64)}};
  absl::StatusOr<std::map<std::string, at::Tensor>> shard = ShardTensors(full, c, 1, 2);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(RowIds(shard->at("transformer.h.0.attn.qkv.weight")),
            Concat(Range(16, 32), Range(40, 48), Range(56, 64)));
}

TEST(ShardTensorsTest, QkvReplicatesTheGroupOfTheRanksHeads) {
  // n_head 8, 2 groups, 4 ranks: rank 2 owns heads 4, 5, which read group 1.
  const Config c = Small(8, 2);
  std::map<std::string, at::Tensor> full = {
      {"transformer.h.0.attn.qkv.bias", at::arange(48, at::kFloat)}};
  absl::StatusOr<std::map<std::string, at::Tensor>> shard = ShardTensors(full, c, 2, 4);
  ASSERT_TRUE(shard.ok()) << shard.status();
  const at::Tensor b = shard->at("transformer.h.0.attn.qkv.bias").unsqueeze(1);
  EXPECT_EQ(RowIds(b), Concat(Range(16, 24), Range(36, 40), Range(44, 48)));
}

TEST(ShardTensorsTest, MlpAndProjectionsAreSlicedAsViews) {
  const Config c = Small(8, 8);
  const at::Tensor fc = Rows(48).expand({48, 32}).contiguous();
  const at::Tensor proj = at::arange(32 * 48, at::kFloat).view({32, 48});
  const at::Tensor wte = at::zeros({64, 32});
  std::map<std::string, at::Tensor> full = {
      {"transformer.wte.weight", wte},
      {"transformer.h.0.mlp.fc.weight", fc},
      {"transformer.h.0.mlp.experts.3.fc_1.weight", fc},
      {"transformer.h.0.mlp.proj.weight", proj},
      {"transformer.h.0.mlp.proj.bias", at::ones({32})},
      {"transformer.h.0.attn.proj.weight", proj.narrow(1, 0, 32)},
      {"transformer.h.0.mlp.gate.weight", at::ones({4, 32})},
  };
  absl::StatusOr<std::map<std::string, at::Tensor>> shard = ShardTensors(full, c, 1, 2);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->at("transformer.wte.weight").data_ptr(), wte.data_ptr());
  EXPECT_EQ(RowIds(shard->at("transformer.h.0.mlp.fc.weight")), Range(24, 48));
  EXPECT_EQ(RowIds(shard->at("transformer.h.0.mlp.experts.3.fc_1.weight")), Range(24, 48));
  // Views into the full tensor, not copies: a memory-mapped file is read only there.
  EXPECT_EQ(shard->at("transformer.h.0.mlp.fc.weight").storage().data(), fc.storage().data());
  EXPECT_TRUE(at::equal(shard->at("transformer.h.0.mlp.proj.weight"), proj.narrow(1, 24, 24)));
  EXPECT_TRUE(at::equal(shard->at("transformer.h.0.attn.proj.weight"),
                        proj.narrow(1, 16, 16)));  // [n_embd, n_head · hs / 2]
  EXPECT_EQ(shard->at("transformer.h.0.mlp.proj.bias").size(0), 32);
  EXPECT_EQ(shard->at("transformer.h.0.mlp.gate.weight").size(0), 4);
}

TEST(ShardTensorsTest, UnshardableTensorsAreErrors) {
  const Config c = Small(8, 8);
  std::map<std::string, at::Tensor> other = {{"transformer.h.0.attn.qkv.absmax", at::zeros({64})}};
  EXPECT_EQ(ShardTensors(other, c, 0, 2).status().code(), absl::StatusCode::kUnimplemented);
  std::map<std::string, at::Tensor> odd = {{"transformer.h.0.mlp.fc.weight", at::zeros({47, 32})}};
  EXPECT_THAT(ShardTensors(odd, c, 0, 2).status().message(),
              HasSubstr("transformer.h.0.mlp.fc.weight has size 47"));
}

TEST(ShardLoraTensorsTest, ColumnSitesSplitBRowsAndRowSitesSplitAColumns) {
  // n_head 8, 4 groups, head_size 4: q part 32 rows, k and v parts 16 rows each.
  const Config c = Small(8, 4);
  const at::Tensor qkv_b = at::arange(48 * 2, at::kFloat).reshape({48, 2});  // q and v parts
  const at::Tensor proj_a = at::arange(2 * 32, at::kFloat).reshape({2, 32});
  const at::Tensor fc_b = at::arange(64 * 2, at::kFloat).reshape({64, 2});
  const std::map<std::string, at::Tensor> lora = {
      {"transformer.h.0.attn.qkv.lora_A", at::ones({4, 32})},
      {"transformer.h.0.attn.qkv.lora_B", qkv_b},
      {"transformer.h.0.attn.proj.lora_A", proj_a},
      {"transformer.h.0.attn.proj.lora_B", at::ones({32, 2})},
      {"transformer.h.0.mlp.fc.lora_B", fc_b},
      {"lm_head.lora_A", at::ones({2, 32})}};
  absl::StatusOr<std::map<std::string, at::Tensor>> rank1 =
      ShardLoraTensors(lora, c, {/*query=*/true, /*key=*/false, /*value=*/true}, 1, 2);
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  // qkv B: the q part's rows of heads 4..7, then the v part's rows of groups 2..3.
  EXPECT_TRUE(at::equal(rank1->at("transformer.h.0.attn.qkv.lora_B"),
                        at::cat({qkv_b.narrow(0, 16, 16), qkv_b.narrow(0, 32 + 8, 8)})));
  EXPECT_TRUE(at::equal(rank1->at("transformer.h.0.attn.qkv.lora_A"), at::ones({4, 32})));
  EXPECT_TRUE(at::equal(rank1->at("transformer.h.0.attn.proj.lora_A"), proj_a.narrow(1, 16, 16)));
  EXPECT_TRUE(at::equal(rank1->at("transformer.h.0.attn.proj.lora_B"), at::ones({32, 2})));
  EXPECT_TRUE(at::equal(rank1->at("transformer.h.0.mlp.fc.lora_B"), fc_b.narrow(0, 32, 32)));
  EXPECT_EQ(rank1->at("lm_head.lora_A").size(1), 32);
  // B rows that do not add up to the adapted parts are refused, naming the tensor.
  absl::StatusOr<std::map<std::string, at::Tensor>> wrong =
      ShardLoraTensors(lora, c, {true, true, true}, 1, 2);
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr("transformer.h.0.attn.qkv.lora_B"));
}

TEST(TensorParallelLinearFactoryTest, RowParallelKeepsNamesAndAddsBiasOnce) {
  // One rank: the all-reduce is the identity, so the result is the dense projection's.
  TensorParallelLinearFactory single(nullptr, ProcessGroup::Single());
  LinearSpec spec;
  spec.site = LinearSite::kAttnProj;
  spec.in_features = 8;
  spec.out_features = 4;
  spec.bias = true;
  ProjectionPtr dense = DefaultLinearFactory()->Make(spec);
  RowParallelProjectionImpl row(DefaultLinearFactory()->Make([&] {
    LinearSpec s = spec;
    s.bias = false;
    return s;
  }()),
                                spec, ProcessGroup::Single());
  std::vector<std::string> names;
  for (const auto& item : row.named_parameters()) names.push_back(item.key());
  EXPECT_EQ(names, (std::vector<std::string>{"weight", "bias"}));
  at::NoGradGuard no_grad;
  row.named_parameters()["weight"].copy_(dense->DenseWeight());
  row.named_parameters()["bias"].normal_();
  dense->named_parameters()["bias"].copy_(row.bias);
  const at::Tensor x = at::randn({2, 3, 8});
  EXPECT_TRUE(at::allclose(row.forward(x), dense->forward(x), 1e-6, 1e-6));
}

}  // namespace
}  // namespace lgpt
