// The block pool: allocation and reference counts, one allocation whose pages follow the
// blocks in use, kept blocks idle but stored until recycled (last) with a new generation.
#include "cache/block_pool.h"

#include <ATen/ATen.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "cache/test_pools.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

TEST(BlockPoolTest, AllocatesCountsAndRefuses) {
  std::shared_ptr<BlockPool> pool = TestPool(3);
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
  EXPECT_EQ(BlockPool::Create(TestPoolGeometry(), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad.num_blocks = std::numeric_limits<int64_t>::max() / 2;  // bookkeeping past any memory
  const absl::Status huge = BlockPool::Create(TestPoolGeometry(), bad).status();
  EXPECT_EQ(huge.code(), absl::StatusCode::kResourceExhausted) << huge;
  EXPECT_NE(huge.message().find("BlockPoolOptions.num_blocks"), absl::string_view::npos) << huge;
}

// Pages of [p, p + bytes) that lie wholly inside it, and how many of them are resident.
std::pair<int64_t, int64_t> ResidentPages(const void* p, int64_t bytes) {
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (begin + page - 1) / page * page, last = (begin + bytes) / page * page;
  if (first >= last) return {0, 0};
  std::vector<unsigned char> resident((last - first) / page);
  EXPECT_EQ(::mincore(reinterpret_cast<void*>(first), last - first, resident.data()), 0);
  int64_t count = 0;
  for (unsigned char r : resident) count += r & 1;
  return {static_cast<int64_t>(resident.size()), count};
}

// One allocation for the pool (a block's keys and values are slices of it), pages taken as
// blocks are written and given back when they are free again.
TEST(BlockPoolTest, StorageIsAllocatedOnceAndFreeBlocksGiveTheirPagesBack) {
  KVCacheGeometry geometry;
  geometry.layers = {{4, 64, 0}};  // 64 KiB of keys a block: whole pages inside each
  BlockPoolOptions options;
  options.entries_per_block = 64;
  options.num_blocks = 4;
  std::shared_ptr<BlockPool> pool = *BlockPool::Create(geometry, options);
  const int64_t a = *pool->Allocate(), b = *pool->Allocate();
  const at::Tensor& keys_a = pool->keys(a, 0);
  const at::Tensor& keys_b = pool->keys(b, 0);
  EXPECT_TRUE(keys_a.is_alias_of(keys_b));
  EXPECT_TRUE(keys_a.is_contiguous());
  const int64_t bytes = keys_a.nbytes();
  EXPECT_EQ(
      static_cast<const char*>(keys_b.data_ptr()) - static_cast<const char*>(keys_a.data_ptr()),
      (b - a) * bytes);
  const void* where = keys_a.data_ptr();
  pool->keys(a, 0).fill_(1.0f);
  const auto [pages, written] = ResidentPages(where, bytes);
  ASSERT_GT(pages, 0);
  EXPECT_EQ(written, pages);
  pool->Release(a);
  EXPECT_EQ(ResidentPages(where, bytes).second, 0);
  EXPECT_EQ(*pool->Allocate(), a);
  EXPECT_EQ(pool->keys(a, 0).data_ptr(), where);  // the same slice again
}

TEST(BlockPoolTest, KeptBlocksStayStoredWhileIdleAndAreRecycledLast) {
  std::shared_ptr<BlockPool> pool = TestPool(3);
  EXPECT_EQ(pool->stored_blocks(), 0);  // no block holds entries yet
  const int64_t a = *pool->Allocate(), b = *pool->Allocate();
  EXPECT_EQ(pool->stored_blocks(), 2);
  EXPECT_EQ(pool->keys(a, 1).sizes(), (std::vector<int64_t>{2, 4, 8}));
  EXPECT_FALSE(pool->IsShared(a));
  const uint64_t generation = pool->Keep(a);
  EXPECT_TRUE(pool->IsShared(a));  // a write would change what the keeper holds
  pool->Release(a);
  pool->Release(b);
  EXPECT_EQ(pool->stored_blocks(), 1);  // b's storage is gone, a is idle
  EXPECT_EQ(pool->idle_blocks(), 1);
  EXPECT_EQ(pool->free_blocks(), 3);  // idle blocks count as free
  ASSERT_TRUE(pool->RetainKept(a, generation));
  EXPECT_EQ(pool->idle_blocks(), 0);
  EXPECT_EQ(pool->free_blocks(), 2);
  pool->Release(a);
  // Free blocks go first; the idle kept block only when nothing else is left.
  const int64_t c = *pool->Allocate(), d = *pool->Allocate();
  EXPECT_NE(c, a);
  EXPECT_NE(d, a);
  EXPECT_TRUE(pool->IsKept(a, generation));
  EXPECT_EQ(*pool->Allocate(), a);  // recycled: a new generation, no longer kept
  EXPECT_FALSE(pool->IsKept(a, generation));
  EXPECT_FALSE(pool->RetainKept(a, generation));
  EXPECT_EQ(pool->Allocate().status().code(), absl::StatusCode::kResourceExhausted);
  for (int64_t block : {a, c, d}) pool->Release(block);
  EXPECT_EQ(pool->stored_blocks(), 0);
  EXPECT_EQ(pool->free_blocks(), 3);
}

}  // namespace
}  // namespace lgpt
