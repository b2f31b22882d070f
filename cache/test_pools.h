// Small block pools for the cache tests: two layers (a global one and a window of 5 entries),
// 2 query groups of head size 8, float32 on the CPU.
#ifndef LGPT_CACHE_TEST_POOLS_H_
#define LGPT_CACHE_TEST_POOLS_H_

#include <cstdint>
#include <memory>

#include "cache/block_pool.h"
#include "cache/kv_cache.h"

namespace lgpt {

// Batch 1, 64 positions, the two layers.
KVCacheGeometry TestPoolGeometry();
// A pool of `blocks` blocks of `entries_per_block` entries over TestPoolGeometry() (a failure
// to make it fails the calling test).
std::shared_ptr<BlockPool> TestPool(int64_t blocks, int64_t entries_per_block = 4);

}  // namespace lgpt

#endif  // LGPT_CACHE_TEST_POOLS_H_
