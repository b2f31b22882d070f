// BatchedKVCache: a step over many requests' caches attends for each row exactly as that
// row's cache alone would, to the bit, whether rows go through the one-pass path
// (UpdateForDecode + DecodeAttentionRows: dense and paged float32 rows) or their own
// UpdateAndAttend (windowed layers, eviction policies), rows at different lengths.
#include "cache/batched_kv_cache.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "cache/block_pool.h"
#include "cache/dense_kv_cache.h"
#include "cache/kv_cache_factory.h"
#include "cache/paged_kv_cache.h"

namespace lgpt {
namespace {

constexpr int64_t kGroups = 2, kHeads = 4, kHeadSize = 16, kContext = 64;

KVCacheShape Shape(int64_t window) {
  KVCacheShape shape;
  shape.batch_size = 1;
  shape.max_sequence_length = kContext;
  shape.layers = {{kGroups, kHeadSize, 0}, {kGroups, kHeadSize, window}};
  return shape;
}

KVStep Step(const at::Tensor& positions) {  // [B, T]
  KVStep step;
  step.positions = positions;
  step.min_position = positions.min().item<int64_t>();
  step.max_position = positions.max().item<int64_t>();
  return step;
}

// The kinds of row a serving batch mixes; `pool` for the paged one.
std::unique_ptr<KVCache> MakeRow(int kind, const std::shared_ptr<BlockPool>& pool) {
  KVCacheSpec spec;
  switch (kind) {
    case 0:  // dense, both layers global: one pass
      return *MakeKVCache(spec, Shape(0));
    case 1:  // paged: one pass
      return *PagedKVCache::Create(pool, kContext);
    case 2:  // dense with a windowed layer: that layer attends on its own
      return *MakeKVCache(spec, Shape(5));
    default:  // an eviction policy: attends on its own
      spec.policy = "sink";
      spec.budget = 6;
      return *MakeKVCache(spec, Shape(0));
  }
}

// Rows of `kinds` after prompts of `prompts` tokens, then decode steps: the batch's result
// for each row must equal the row's twin attending alone.
void ExpectRowsAttendAlone(const std::vector<int>& kinds, const std::vector<int64_t>& prompts) {
  at::manual_seed(3);
  BlockPoolOptions pool_options;
  pool_options.block_size = 4;
  pool_options.num_blocks = 64;
  KVCacheGeometry geometry = Shape(0);
  std::shared_ptr<BlockPool> pool = *BlockPool::Create(geometry, pool_options);
  const int64_t batch = static_cast<int64_t>(kinds.size());
  std::vector<std::unique_ptr<KVCache>> rows, alone;  // the batch's rows and their twins
  for (int kind : kinds) {
    rows.push_back(MakeRow(kind, pool));
    alone.push_back(MakeRow(kind, pool));
  }
  AttentionParams params;
  params.scale = 0.25;
  // Prompts, each row on its own (the same entries in a row and its twin).
  for (int64_t b = 0; b < batch; ++b) {
    const at::Tensor k = at::randn({1, kGroups, prompts[b], kHeadSize});
    const at::Tensor v = at::randn({1, kGroups, prompts[b], kHeadSize});
    const at::Tensor q = at::randn({1, kHeads, prompts[b], kHeadSize});
    const KVStep step = Step(at::arange(prompts[b], at::kLong).unsqueeze(0));
    for (KVCache* cache : {rows[b].get(), alone[b].get()}) {
      ASSERT_TRUE(cache->CheckStep(step, 1).ok());
      for (int64_t layer = 0; layer < 2; ++layer) {
        ASSERT_TRUE(cache->UpdateAndAttend(layer, step, q, k, v, params).ok());
      }
    }
  }
  std::vector<KVCache*> pointers;
  for (const auto& row : rows) pointers.push_back(row.get());
  absl::StatusOr<BatchedKVCache> batched = BatchedKVCache::Create(pointers);
  ASSERT_TRUE(batched.ok()) << batched.status();
  for (int64_t t = 0; t < 6; ++t) {  // decode steps, every row at its own position
    at::Tensor positions = at::empty({batch, 1}, at::kLong);
    for (int64_t b = 0; b < batch; ++b) positions[b][0] = prompts[b] + t;
    const KVStep step = Step(positions);
    ASSERT_TRUE(batched->CheckStep(step, batch).ok());
    for (int64_t b = 0; b < batch; ++b) {
      ASSERT_TRUE(alone[b]->CheckStep(Step(positions.narrow(0, b, 1)), 1).ok());
    }
    for (int64_t layer = 0; layer < 2; ++layer) {
      const at::Tensor q = at::randn({batch, kHeads, 1, kHeadSize});
      const at::Tensor k = at::randn({batch, kGroups, 1, kHeadSize});
      const at::Tensor v = at::randn({batch, kGroups, 1, kHeadSize});
      absl::StatusOr<at::Tensor> y = batched->UpdateAndAttend(layer, step, q, k, v, params);
      ASSERT_TRUE(y.ok()) << y.status();
      ASSERT_EQ(y->sizes(), q.sizes());
      for (int64_t b = 0; b < batch; ++b) {
        absl::StatusOr<at::Tensor> expected =
            alone[b]->UpdateAndAttend(layer, Step(positions.narrow(0, b, 1)), q.narrow(0, b, 1),
                                      k.narrow(0, b, 1), v.narrow(0, b, 1), params);
        ASSERT_TRUE(expected.ok()) << expected.status();
        EXPECT_TRUE(at::equal(y->narrow(0, b, 1), *expected))
            << "step " << t << " layer " << layer << " row " << b << " (kind " << kinds[b] << ")";
      }
    }
  }
}

TEST(BatchedKVCacheTest, OnePassRowsAttendAsAlone) {
  ExpectRowsAttendAlone({0, 1, 0, 1, 1}, {9, 3, 12, 1, 17});
}

TEST(BatchedKVCacheTest, MixedRowsAttendAsAlone) {
  // Windowed layers and a policy cache take their own path beside the one-pass rows.
  ExpectRowsAttendAlone({0, 1, 2, 3, 0, 1}, {9, 3, 12, 7, 1, 17});
}

TEST(BatchedKVCacheTest, OnlyFloat32CpuRowsTakeTheOnePassPath) {
  KVCacheSpec spec;
  std::unique_ptr<KVCache> dense = *MakeKVCache(spec, Shape(0));
  const at::Tensor k = at::randn({1, kGroups, 1, kHeadSize});
  const KVStep step = Step(at::zeros({1, 1}, at::kLong));
  ASSERT_TRUE(dense->CheckStep(step, 1).ok());
  absl::StatusOr<std::optional<DecodeRow>> row = dense->UpdateForDecode(0, step, k, k);
  ASSERT_TRUE(row.ok()) << row.status();
  ASSERT_TRUE(row->has_value());
  EXPECT_EQ((*row)->entries, 1);
  // A windowed layer, a policy cache and a bfloat16 cache decline without storing anything.
  std::unique_ptr<KVCache> windowed = *MakeKVCache(spec, Shape(5));
  ASSERT_TRUE(windowed->CheckStep(step, 1).ok());
  EXPECT_FALSE(windowed->UpdateForDecode(1, step, k, k)->has_value());
  spec.policy = "sink";
  spec.budget = 6;
  std::unique_ptr<KVCache> sink = *MakeKVCache(spec, Shape(0));
  ASSERT_TRUE(sink->CheckStep(step, 1).ok());
  EXPECT_FALSE(sink->UpdateForDecode(0, step, k, k)->has_value());
  EXPECT_EQ(sink->AllocatedBytes(), 0);
  KVCacheShape half = Shape(0);
  half.dtype = at::kBFloat16;
  std::unique_ptr<KVCache> bf16 = *MakeKVCache(KVCacheSpec(), half);
  ASSERT_TRUE(bf16->CheckStep(step, 1).ok());
  EXPECT_FALSE(bf16->UpdateForDecode(0, step, k, k)->has_value());
}

}  // namespace
}  // namespace lgpt
