#include "cache/attention_probe.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "cache/dense_kv_cache.h"
#include "cache/kv_cache_factory.h"

namespace lgpt {
namespace {

constexpr int64_t kGroups = 1, kHeadSize = 4, kHeads = 2;

std::unique_ptr<KVCache> Dense(int64_t layers) {
  DenseKVCacheOptions options;
  options.max_sequence_length = 32;
  options.layers.assign(layers, KVLayerSpec{kGroups, kHeadSize, 0});
  return std::move(DenseKVCache::Create(options)).value();
}

KVStep Step(int64_t first, int64_t count) {
  return KVStep{at::arange(first, first + count, at::kLong).view({1, count}), first,
                first + count - 1};
}

TEST(AttentionProbe, MeasuresMassOnTheFirstTokensPerHead) {
  AttentionProbeOptions options;
  options.first_tokens = 2;
  options.min_query_position = 8;
  auto probe = std::move(AttentionProbe::Create(Dense(1), options)).value();
  // Ten entries; queries at 8 and 9 are measured, 7 is not.
  const at::Tensor kv = at::randn({1, kGroups, 8, kHeadSize});
  ASSERT_TRUE(probe->Update(0, Step(0, 8), kv, kv).ok());
  at::Tensor early = at::zeros({1, kHeads, 8, 8});
  early.select(3, 0).fill_(1.0);  // would count fully if position 7 were measured
  probe->ObserveAttentionWeights(0, early);
  const at::Tensor kv2 = at::randn({1, kGroups, 2, kHeadSize});
  ASSERT_TRUE(probe->Update(0, Step(8, 2), kv2, kv2).ok());
  at::Tensor w = at::full({1, kHeads, 2, 10}, 0.1);  // head 1: uniform
  w[0][0].zero_();
  w[0][0].select(1, 0).fill_(0.3);  // head 0: 0.3 on position 0, 0.2 on 1, 0.5 on 9
  w[0][0].select(1, 1).fill_(0.2);
  w[0][0].select(1, 9).fill_(0.5);
  probe->ObserveAttentionWeights(0, w);
  const AttentionStartMass result = probe->Result();
  ASSERT_EQ(result.per_head.size(), 1u);
  ASSERT_EQ(result.per_head[0].size(), 2u);
  EXPECT_NEAR(result.per_head[0][0], 0.5, 1e-6);
  EXPECT_NEAR(result.per_head[0][1], 0.2, 1e-6);
  EXPECT_EQ(result.queries[0], 2);
  EXPECT_NEAR(result.uniform[0], (2.0 / 9 + 2.0 / 10) / 2, 1e-9);
}

TEST(AttentionProbe, ForwardsStorageAndKeepsMeasuringAcrossResets) {
  AttentionProbeOptions options;
  options.first_tokens = 1;
  options.min_query_position = 0;
  auto probe = std::move(AttentionProbe::Create(Dense(2), options)).value();
  EXPECT_EQ(probe->num_layers(), 2);
  EXPECT_TRUE(probe->WantsAttentionWeights(1));
  const at::Tensor kv = at::randn({1, kGroups, 3, kHeadSize});
  const KVView view = std::move(probe->Update(1, Step(0, 3), kv, kv)).value();
  EXPECT_TRUE(at::equal(view.keys, kv));
  EXPECT_GT(probe->AllocatedBytes(), 0);
  probe->ObserveAttentionWeights(1, at::full({1, kHeads, 3, 3}, 1.0 / 3));
  probe->Reset();
  ASSERT_TRUE(probe->Update(1, Step(0, 1), kv.narrow(2, 0, 1), kv.narrow(2, 0, 1)).ok());
  probe->ObserveAttentionWeights(1, at::ones({1, kHeads, 1, 1}));
  const AttentionStartMass result = probe->Result();
  EXPECT_EQ(result.queries[0], 0);  // layer 0 never observed
  EXPECT_TRUE(result.per_head[0].empty());
  EXPECT_EQ(result.queries[1], 4);
  EXPECT_NEAR(result.per_head[1][0], (3 * (1.0 / 3) + 1.0) / 4, 1e-6);
}

// A quantised cache attends block by block on its own; behind the probe it serves decoded
// views instead, so the probe sees the weights, and the attention output stays the same.
TEST(AttentionProbe, MeasuresQuantisedCachesThroughTheirViews) {
  KVCacheSpec spec;
  spec.bits = 8;
  KVCacheShape shape;
  shape.max_sequence_length = 32;
  shape.layers.assign(1, KVLayerSpec{kGroups, 32, 0});
  auto direct = MakeKVCache(spec, shape);
  auto wrapped = MakeKVCache(spec, shape);
  ASSERT_TRUE(direct.ok() && wrapped.ok()) << direct.status();
  AttentionProbeOptions options;
  options.first_tokens = 2;
  options.min_query_position = 0;
  auto probe = AttentionProbe::Create(std::move(*wrapped), options);
  ASSERT_TRUE(probe.ok()) << probe.status();
  at::manual_seed(4);
  AttentionParams params;
  params.scale = 0.2;
  for (const auto& [first, count] : {std::pair<int64_t, int64_t>{0, 20}, {20, 1}, {21, 1}}) {
    const at::Tensor q = at::randn({1, kHeads, count, 32});
    const at::Tensor k = at::randn({1, kGroups, count, 32});
    const at::Tensor v = at::randn({1, kGroups, count, 32});
    auto a = (*direct)->UpdateAndAttend(0, Step(first, count), q, k, v, params);
    auto b = (*probe)->UpdateAndAttend(0, Step(first, count), q, k, v, params);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    EXPECT_LT((*a - *b).abs().max().item<double>(), 1e-5) << "step at " << first;
  }
  const AttentionStartMass result = (*probe)->Result();
  EXPECT_EQ(result.queries[0], 22);
  EXPECT_GT(result.per_head[0][0], 0.0);
  EXPECT_LT(result.per_head[0][0], 1.0);
}

TEST(AttentionProbe, RejectsBadOptions) {
  AttentionProbeOptions bad;
  bad.first_tokens = 0;
  EXPECT_EQ(AttentionProbe::Create(Dense(1), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AttentionProbe::Create(nullptr, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lgpt
