// The block pool and a request's paged cache over it: allocation and reference counts, a
// paged cache attends as the dense cache does (steps crossing block boundaries, windows,
// grouped queries), blocks come back on Reset and destruction, a full pool refuses a step
// without taking anything, and steps that do not continue the stream are refused.
#include "cache/paged_kv_cache.h"

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "cache/dense_kv_cache.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

KVCacheGeometry Geometry() {
  KVCacheGeometry g;
  g.batch_size = 1;
  g.max_sequence_length = 64;
  g.layers = {{2, 8, 0}, {2, 8, 5}};  // a global layer and a windowed one
  return g;
}

std::shared_ptr<BlockPool> Pool(int64_t blocks, int64_t block_size = 4) {
  BlockPoolOptions options;
  options.block_size = block_size;
  options.num_blocks = blocks;
  absl::StatusOr<std::shared_ptr<BlockPool>> pool = BlockPool::Create(Geometry(), options);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return *pool;
}

KVStep Step(int64_t begin, int64_t length) {
  KVStep step;
  step.positions = at::arange(begin, begin + length, at::kLong).unsqueeze(0);
  step.min_position = begin;
  step.max_position = begin + length - 1;
  return step;
}

TEST(BlockPoolTest, AllocatesCountsAndRefuses) {
  std::shared_ptr<BlockPool> pool = Pool(3);
  EXPECT_EQ(pool->BytesPerBlock(), 2 * 2 * (2 * 4 * 8 * 4));  // layers x (k, v) x floats
  const int64_t a = *pool->Allocate(), b = *pool->Allocate(), c = *pool->Allocate();
  EXPECT_NE(a, b);
  EXPECT_NE(b, c);
  EXPECT_EQ(pool->free_blocks(), 0);
  EXPECT_EQ(pool->Allocate().status().code(), absl::StatusCode::kResourceExhausted);
  pool->Retain(b);
  pool->Release(b);
  EXPECT_EQ(pool->free_blocks(), 0);  // still referenced once
  pool->Release(b);
  EXPECT_EQ(pool->free_blocks(), 1);
  EXPECT_EQ(*pool->Allocate(), b);
  BlockPoolOptions bad;
  bad.num_blocks = 0;
  EXPECT_EQ(BlockPool::Create(Geometry(), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PagedKVCacheTest, AttendsAsTheDenseCache) {
  std::shared_ptr<BlockPool> pool = Pool(16);
  std::unique_ptr<PagedKVCache> paged = *PagedKVCache::Create(pool, 64);
  DenseKVCacheOptions dense_options;
  static_cast<KVCacheGeometry&>(dense_options) = Geometry();
  std::unique_ptr<DenseKVCache> dense = *DenseKVCache::Create(dense_options);
  at::manual_seed(3);
  int64_t position = 0;
  for (const int64_t length : {3, 1, 6, 1, 1, 9, 1}) {  // crossing block boundaries
    const KVStep step = Step(position, length);
    ASSERT_TRUE(paged->CheckStep(step, 1).ok());
    ASSERT_TRUE(dense->CheckStep(step, 1).ok());
    for (int64_t layer = 0; layer < 2; ++layer) {
      const at::Tensor k = at::randn({1, 2, length, 8}), v = at::randn({1, 2, length, 8});
      const at::Tensor q = at::randn({1, 6, length, 8});  // 3 query heads per group
      AttentionParams params;
      params.scale = 0.35;
      params.sliding_window = Geometry().layers[layer].sliding_window;
      const at::Tensor a = *paged->UpdateAndAttend(layer, step, q, k, v, params);
      const at::Tensor b = *dense->UpdateAndAttend(layer, step, q, k, v, params);
      EXPECT_TRUE(at::allclose(a, b, 1e-5, 1e-6))
          << "layer " << layer << " at " << position << ": "
          << (a - b).abs().max().item<double>();
    }
    position += length;
  }
  EXPECT_EQ(paged->blocks_held(), (position + 3) / 4);
  EXPECT_EQ(paged->AllocatedBytes(), paged->blocks_held() * pool->BytesPerBlock());
  // The plain contract's view holds the same entries in order.
  const KVStep last = Step(position, 1);
  ASSERT_TRUE(paged->CheckStep(last, 1).ok());
  ASSERT_TRUE(dense->CheckStep(last, 1).ok());
  const at::Tensor k = at::randn({1, 2, 1, 8}), v = at::randn({1, 2, 1, 8});
  const KVView pv = *paged->Update(0, last, k, v);
  const KVView dv = *dense->Update(0, last, k, v);
  const int64_t n = position + 1;
  EXPECT_TRUE(at::equal(pv.keys, dv.keys.narrow(2, 0, n)));
  EXPECT_TRUE(at::equal(pv.values, dv.values.narrow(2, 0, n)));
  EXPECT_TRUE(at::equal(pv.positions.reshape({-1}), at::arange(n, at::kLong)));

  paged->Reset();
  EXPECT_EQ(pool->free_blocks(), 16);
  ASSERT_TRUE(paged->CheckStep(Step(0, 5), 1).ok());
  EXPECT_EQ(pool->free_blocks(), 14);
  paged.reset();
  EXPECT_EQ(pool->free_blocks(), 16);  // destruction gives the blocks back
}

TEST(PagedKVCacheTest, FullPoolAndOutOfOrderStepsAreRefused) {
  std::shared_ptr<BlockPool> pool = Pool(3);
  std::unique_ptr<PagedKVCache> first = *PagedKVCache::Create(pool, 64);
  std::unique_ptr<PagedKVCache> second = *PagedKVCache::Create(pool, 64);
  ASSERT_TRUE(first->CheckStep(Step(0, 9), 1).ok());  // 3 blocks
  const absl::Status full = second->CheckStep(Step(0, 2), 1);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_EQ(second->blocks_held(), 0);
  first.reset();
  EXPECT_TRUE(second->CheckStep(Step(0, 2), 1).ok());
  EXPECT_EQ(second->CheckStep(Step(5, 1), 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(second->CheckStep(Step(0, 70), 1).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(PagedKVCache::Create(nullptr, 8).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lgpt
