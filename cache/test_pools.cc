#include "cache/test_pools.h"

#include "gtest/gtest.h"

namespace lgpt {

KVCacheGeometry TestPoolGeometry() {
  KVCacheGeometry g;
  g.batch_size = 1;
  g.max_sequence_length = 64;
  g.layers = {{2, 8, 0}, {2, 8, 5}};  // a global layer and a windowed one
  return g;
}

std::shared_ptr<BlockPool> TestPool(int64_t blocks, int64_t entries_per_block) {
  BlockPoolOptions options;
  options.entries_per_block = entries_per_block;
  options.num_blocks = blocks;
  absl::StatusOr<std::shared_ptr<BlockPool>> pool = BlockPool::Create(TestPoolGeometry(), options);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? *pool : nullptr;
}

}  // namespace lgpt
