// The prefix cache's map over a block pool: keys are never reused after a block is recycled,
// entries whose block was recycled are dropped when met, the same ids in two blocks publish
// once. Chains through paged caches and copy-on-write: cache/paged_kv_cache_test.cc.
#include "cache/prefix_cache.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "cache/test_pools.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

TEST(PrefixCacheTest, KeysAreNeverReusedAfterEviction) {
  std::shared_ptr<BlockPool> pool = TestPool(2);
  PrefixCache prefixes(pool);
  const std::vector<int64_t> first = {1, 2, 3, 4}, second = {5, 6, 7, 8};
  const int64_t a = *pool->Allocate(), b = *pool->Allocate();
  const uint64_t key_a = prefixes.Publish(a, PrefixCache::kRootKey, first);
  const uint64_t key_b = prefixes.Publish(b, key_a, second);
  EXPECT_NE(key_a, key_b);
  pool->Release(a);
  pool->Release(b);
  // Block a is evicted and published again for the same ids: a new key, so the old chain
  // (key_a -> b) cannot be reached from it.
  const int64_t a2 = *pool->Allocate();
  EXPECT_EQ(a2, a);
  const uint64_t key_a2 = prefixes.Publish(a2, PrefixCache::kRootKey, first);
  EXPECT_NE(key_a2, key_a);
  EXPECT_FALSE(prefixes.Lookup(key_a2, second).has_value());
  std::optional<PrefixCache::Hit> stale = prefixes.Lookup(key_a, second);  // still cached
  ASSERT_TRUE(stale.has_value());
  EXPECT_EQ(stale->block, b);
  pool->Release(b);
  pool->Release(a2);
  EXPECT_EQ(pool->free_blocks(), 2);
}

TEST(PrefixCacheTest, RecycledBlocksAreNotFoundAndTheSameIdsPublishOnce) {
  std::shared_ptr<BlockPool> pool = TestPool(2);
  PrefixCache prefixes(pool);
  const std::vector<int64_t> ids = {1, 2, 3, 4};
  const int64_t a = *pool->Allocate(), b = *pool->Allocate();
  const uint64_t key = prefixes.Publish(a, PrefixCache::kRootKey, ids);
  // The same ids in another block: the published block's key, b stays private.
  EXPECT_EQ(prefixes.Publish(b, PrefixCache::kRootKey, ids), key);
  EXPECT_FALSE(pool->IsShared(b));
  pool->Release(a);
  pool->Release(b);
  // Both blocks taken again: a is recycled for other entries, its entry no longer leads to it.
  const int64_t c = *pool->Allocate(), d = *pool->Allocate();
  EXPECT_EQ(pool->idle_blocks(), 0);
  EXPECT_FALSE(prefixes.Lookup(PrefixCache::kRootKey, ids).has_value());
  // Published again after recycling: found again, under a new key.
  const uint64_t again = prefixes.Publish(d, PrefixCache::kRootKey, ids);
  EXPECT_NE(again, key);
  std::optional<PrefixCache::Hit> hit = prefixes.Lookup(PrefixCache::kRootKey, ids);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->block, d);
  EXPECT_EQ(hit->key, again);
  EXPECT_FALSE(prefixes.Lookup(PrefixCache::kRootKey, {1, 2, 3}).has_value());  // not a block
  for (int64_t block : {c, d, d}) pool->Release(block);
  EXPECT_EQ(pool->free_blocks(), 2);  // d stays kept, idle (counted free)
  EXPECT_EQ(pool->idle_blocks(), 1);
}

}  // namespace
}  // namespace lgpt
