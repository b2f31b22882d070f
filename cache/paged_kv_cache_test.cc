// A request's paged cache over the block pool (cache/block_pool_test.cc tests the pool): a
// paged cache attends as the dense cache does (steps crossing block boundaries, windows,
// grouped queries), blocks come back on Reset and destruction, a full pool refuses a step
// without taking anything, and steps that do not continue the stream are refused. With a prefix
// cache (cache/prefix_cache_test.cc tests its keys): chains found block by block, LRU eviction
// of unreferenced cached blocks, copy-on-write of shared blocks. Evicting caches
// (PagedEviction, PagedEvictionTest): as the policy cache of the same sink or window policy,
// decode rows, narrow pools, the blocks held, rollback before and after the ring wraps, the
// plain contract, no prefix sharing.
#include "cache/paged_kv_cache.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cache/dense_kv_cache.h"
#include "cache/kv_cache_factory.h"
#include "cache/kv_codec.h"
#include "cache/rollback_test_util.h"
#include "cache/test_pools.h"
#include "core/base/device.h"
#include "core/ops/attention.h"
#include "core/ops/decode_attention.h"
#include "core/ops/paged_attention.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

TEST(PagedKVCacheTest, AttendsAsTheDenseCache) {
  std::shared_ptr<BlockPool> pool = TestPool(16);
  std::unique_ptr<PagedKVCache> paged = *PagedKVCache::Create(pool, 64);
  DenseKVCacheOptions dense_options;
  static_cast<KVCacheGeometry&>(dense_options) = TestPoolGeometry();
  std::unique_ptr<DenseKVCache> dense = *DenseKVCache::Create(dense_options);
  at::manual_seed(3);
  int64_t position = 0;
  for (const int64_t length : {3, 1, 6, 1, 1, 9, 1}) {  // crossing block boundaries
    const KVStep step = ContiguousStep(position, length);
    ASSERT_TRUE(paged->CheckStep(step, 1).ok());
    ASSERT_TRUE(dense->CheckStep(step, 1).ok());
    for (int64_t layer = 0; layer < 2; ++layer) {
      const at::Tensor k = at::randn({1, 2, length, 8}), v = at::randn({1, 2, length, 8});
      const at::Tensor q = at::randn({1, 6, length, 8});  // 3 query heads per group
      AttentionParams params;
      params.scale = 0.35;
      params.sliding_window = TestPoolGeometry().layers[layer].sliding_window;
      const at::Tensor a = *paged->UpdateAndAttend(layer, step, q, k, v, params);
      const at::Tensor b = *dense->UpdateAndAttend(layer, step, q, k, v, params);
      EXPECT_TRUE(at::allclose(a, b, 1e-5, 1e-6))
          << "layer " << layer << " at " << position << ": " << (a - b).abs().max().item<double>();
    }
    position += length;
  }
  EXPECT_EQ(paged->blocks_held(), (position + 3) / 4);
  EXPECT_EQ(paged->AllocatedBytes(), paged->blocks_held() * pool->BytesPerBlock());
  // The plain contract's view holds the same entries in order.
  const KVStep last = ContiguousStep(position, 1);
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
  ASSERT_TRUE(paged->CheckStep(ContiguousStep(0, 5), 1).ok());
  EXPECT_EQ(pool->free_blocks(), 14);
  paged.reset();
  EXPECT_EQ(pool->free_blocks(), 16);  // destruction gives the blocks back
}

TEST(PagedKVCacheTest, FullPoolAndOutOfOrderStepsAreRefused) {
  std::shared_ptr<BlockPool> pool = TestPool(3);
  std::unique_ptr<PagedKVCache> first = *PagedKVCache::Create(pool, 64);
  std::unique_ptr<PagedKVCache> second = *PagedKVCache::Create(pool, 64);
  ASSERT_TRUE(first->CheckStep(ContiguousStep(0, 9), 1).ok());  // 3 blocks
  const absl::Status full = second->CheckStep(ContiguousStep(0, 2), 1);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_EQ(second->blocks_held(), 0);
  first.reset();
  EXPECT_TRUE(second->CheckStep(ContiguousStep(0, 2), 1).ok());
  EXPECT_EQ(second->CheckStep(ContiguousStep(5, 1), 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(second->CheckStep(ContiguousStep(0, 70), 1).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(PagedKVCache::Create(nullptr, 8).status().code(), absl::StatusCode::kInvalidArgument);
}

// Writes `length` random entries at the cache's end in every layer; layer 0's keys after it.
at::Tensor Fill(PagedKVCache& cache, int64_t length) {
  const KVStep step = ContiguousStep(cache.length(), length);
  EXPECT_TRUE(cache.CheckStep(step, 1).ok());
  at::Tensor keys;
  for (int64_t layer = 0; layer < 2; ++layer) {
    absl::StatusOr<KVView> view =
        cache.Update(layer, step, at::randn({1, 2, length, 8}), at::randn({1, 2, length, 8}));
    EXPECT_TRUE(view.ok()) << view.status();
    if (layer == 0 && view.ok()) keys = view->keys.clone();
  }
  return keys;
}

TEST(PrefixCacheTest, ChainsAreFoundBlockByBlockAndEvictedLeastRecentlyUsedFirst) {
  std::shared_ptr<BlockPool> pool = TestPool(6);
  PrefixCache prefixes(pool);
  const std::vector<int64_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // 2 full blocks + 2
  {
    std::unique_ptr<PagedKVCache> writer = *PagedKVCache::Create(pool, 64);
    Fill(*writer, 10);
    writer->PublishPrefix(prefixes, a);
    EXPECT_EQ(pool->free_blocks(), 3);
  }
  EXPECT_EQ(pool->idle_blocks(), 2);  // the partial third block went back free
  EXPECT_EQ(pool->free_blocks(), 6);

  std::unique_ptr<PagedKVCache> reader = *PagedKVCache::Create(pool, 64);
  std::vector<int64_t> b = a;
  b[5] = 99;  // differs in the second block: only the first is shared
  EXPECT_EQ(reader->AttachPrefix(prefixes, b), 4);
  EXPECT_EQ(reader->blocks_held(), 1);
  EXPECT_EQ(pool->idle_blocks(), 1);
  reader.reset();

  // Allocations take free blocks first, then the least recently released cached block.
  std::vector<int64_t> taken;
  for (int i = 0; i < 4; ++i) taken.push_back(*pool->Allocate());
  EXPECT_EQ(pool->idle_blocks(), 2);
  taken.push_back(*pool->Allocate());
  EXPECT_EQ(pool->idle_blocks(), 1);  // the second block (released earlier) went first
  std::unique_ptr<PagedKVCache> again = *PagedKVCache::Create(pool, 64);
  EXPECT_EQ(again->AttachPrefix(prefixes, a), 4);  // the first block is still there, the chain ends
  again.reset();
  taken.push_back(*pool->Allocate());
  EXPECT_EQ(pool->idle_blocks(), 0);
  std::unique_ptr<PagedKVCache> none = *PagedKVCache::Create(pool, 64);
  EXPECT_EQ(none->AttachPrefix(prefixes, a), 0);
  for (int64_t block : taken) pool->Release(block);
}

TEST(PrefixCacheTest, WritesIntoSharedBlocksCopyThemFirst) {
  std::shared_ptr<BlockPool> pool = TestPool(8);
  PrefixCache prefixes(pool);
  const std::vector<int64_t> ids = {1, 2, 3, 4, 5, 6, 7, 8};  // exactly two blocks
  std::unique_ptr<PagedKVCache> writer = *PagedKVCache::Create(pool, 64);
  const at::Tensor before = Fill(*writer, 8);
  writer->PublishPrefix(prefixes, ids);
  std::unique_ptr<PagedKVCache> reader = *PagedKVCache::Create(pool, 64);
  ASSERT_EQ(reader->AttachPrefix(prefixes, ids), 7);  // the last token is computed again
  EXPECT_EQ(reader->BlocksNeeded(1), 1);              // a copy of the shared second block
  const int64_t free_before = pool->free_blocks();
  const at::Tensor mine = Fill(*reader, 1);
  EXPECT_EQ(pool->free_blocks(), free_before - 1);
  // The reader sees the shared first 7 entries and its own 8th; the writer's are untouched.
  EXPECT_TRUE(at::equal(mine.narrow(2, 0, 7), before.narrow(2, 0, 7)));
  EXPECT_FALSE(at::equal(mine.narrow(2, 7, 1), before.narrow(2, 7, 1)));
  const at::Tensor after = Fill(*writer, 1);
  EXPECT_TRUE(at::equal(after.narrow(2, 0, 8), before));
}

// Speculative decoding: the blocks past the kept entries go back to the pool, and the cache
// attends as one that decoded only the kept entries.
TEST(PagedKVCacheTest, TruncateForgetsRejectedEntriesAndGivesBlocksBack) {
  for (int64_t step = 1; step <= 6; ++step) {
    for (int64_t keep = 1; keep <= step; ++keep) {
      std::shared_ptr<BlockPool> pool = TestPool(32);
      std::unique_ptr<PagedKVCache> speculating = *PagedKVCache::Create(pool, 64);
      std::unique_ptr<PagedKVCache> plain = *PagedKVCache::Create(pool, 64);
      RollbackStream stream;
      stream.geometry = TestPoolGeometry();
      stream.begin = 11;  // the step crosses a block boundary
      stream.step = step;
      stream.keep = keep;
      EXPECT_LT(RollbackDifference(*speculating, *plain, stream), 1e-5)
          << "step " << step << ", keep " << keep;
      EXPECT_EQ(speculating->length(), plain->length());
      EXPECT_EQ(speculating->blocks_held(), plain->blocks_held());
    }
  }
  std::shared_ptr<BlockPool> pool = TestPool(8);
  std::unique_ptr<PagedKVCache> cache = *PagedKVCache::Create(pool, 64);
  Fill(*cache, 10);
  const int64_t free_before = pool->free_blocks();
  ASSERT_TRUE(cache->Truncate(5).ok());
  EXPECT_EQ(cache->length(), 5);
  EXPECT_EQ(cache->blocks_held(), 2);
  EXPECT_EQ(pool->free_blocks(), free_before + 1);
  EXPECT_TRUE(cache->CheckStep(ContiguousStep(5, 1), 1).ok());  // the stream goes on at 5
}

TEST(PagedKVCacheTest, TruncatingIntoAPublishedBlockCopiesItBeforeTheNextWrite) {
  std::shared_ptr<BlockPool> pool = TestPool(16);
  PrefixCache prefixes(pool);
  const std::vector<int64_t> ids = {1, 2, 3, 4, 5, 6, 7, 8};
  std::unique_ptr<PagedKVCache> cache = *PagedKVCache::Create(pool, 64);
  const at::Tensor before = Fill(*cache, 8);
  cache->PublishPrefix(prefixes, ids);
  ASSERT_TRUE(cache->Truncate(6).ok());
  EXPECT_EQ(cache->BlocksNeeded(1), 1);  // the published second block is copied, not written
  Fill(*cache, 2);
  // Another request still finds the published entries as they were.
  std::unique_ptr<PagedKVCache> reader = *PagedKVCache::Create(pool, 64);
  ASSERT_EQ(reader->AttachPrefix(prefixes, ids), 7);
  const at::Tensor seen = Fill(*reader, 1);
  EXPECT_TRUE(at::equal(seen.narrow(2, 0, 7), before.narrow(2, 0, 7)));
}

// TestPool's geometry with entries of `dtype` (a float32 model's 16-bit pool).
std::shared_ptr<BlockPool> PoolOf(at::ScalarType dtype, int64_t blocks,
                                  int64_t entries_per_block = 4) {
  KVCacheGeometry geometry = TestPoolGeometry();
  geometry.dtype = dtype;
  BlockPoolOptions options;
  options.entries_per_block = entries_per_block;
  options.num_blocks = blocks;
  absl::StatusOr<std::shared_ptr<BlockPool>> pool = BlockPool::Create(geometry, options);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? *pool : nullptr;
}

// A float32 model's keys and values written into a 16-bit pool are rounded as ATen rounds them,
// and every read path (the decode kernel over the blocks, a batched step's rows, FlashAttention
// over the blocks a tile at a time, the generic blockwise path, the plain contract's copy)
// gives what a float32 pool of the rounded entries gives, to the bit.
TEST(PagedKVCacheTest, SixteenBitPoolAttendsAsAFloat32PoolOfItsRoundedEntries) {
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    for (const bool grad_mode : {false, true}) {  // with grad mode on: the generic path
      c10::AutoGradMode mode(grad_mode);
      std::shared_ptr<BlockPool> narrow_pool = PoolOf(dtype, 16);
      EXPECT_EQ(narrow_pool->BytesPerBlock() * 2, TestPool(1)->BytesPerBlock());
      std::unique_ptr<PagedKVCache> narrow = *PagedKVCache::Create(narrow_pool, 64);
      std::unique_ptr<PagedKVCache> wide = *PagedKVCache::Create(TestPool(16), 64);
      at::manual_seed(5);
      int64_t position = 0;
      for (const int64_t length : {3, 1, 6, 1, 1, 9, 1, 7, 2}) {  // prefill steps >= 5: flash
        const KVStep step = ContiguousStep(position, length);
        ASSERT_TRUE(narrow->CheckStep(step, 1).ok());
        ASSERT_TRUE(wide->CheckStep(step, 1).ok());
        for (int64_t layer = 0; layer < 2; ++layer) {
          const at::Tensor k = at::randn({1, 2, length, 8}), v = at::randn({1, 2, length, 8});
          const at::Tensor q = at::randn({1, 6, length, 8});
          const at::Tensor k_rounded = k.to(dtype).to(at::kFloat);
          const at::Tensor v_rounded = v.to(dtype).to(at::kFloat);
          AttentionParams params;
          params.scale = 0.35;
          params.sliding_window = TestPoolGeometry().layers[layer].sliding_window;
          if (length == 1 && layer == 0 && !grad_mode) {
            // A batched step's row: read in place by DecodeAttentionRows.
            std::optional<DecodeRow> a = *narrow->UpdateForDecode(layer, step, k, v);
            std::optional<DecodeRow> b = *wide->UpdateForDecode(layer, step, k_rounded, v_rounded);
            ASSERT_TRUE(a.has_value() && b.has_value());
            EXPECT_TRUE(at::equal(DecodeAttentionRows(q, 2, {*a}, step.positions, params),
                                  DecodeAttentionRows(q, 2, {*b}, step.positions, params)))
                << dtype << " at " << position;
            continue;
          }
          const at::Tensor a = *narrow->UpdateAndAttend(layer, step, q, k, v, params);
          const at::Tensor b = *wide->UpdateAndAttend(layer, step, q, k_rounded, v_rounded, params);
          EXPECT_EQ(a.scalar_type(), at::kFloat);
          EXPECT_TRUE(at::equal(a, b))
              << dtype << " grad mode " << grad_mode << " layer " << layer << " at " << position
              << ": " << (a - b).abs().max().item<double>();
        }
        position += length;
      }
      const KVStep last = ContiguousStep(position, 1);
      ASSERT_TRUE(narrow->CheckStep(last, 1).ok());
      ASSERT_TRUE(wide->CheckStep(last, 1).ok());
      const at::Tensor k = at::randn({1, 2, 1, 8}), v = at::randn({1, 2, 1, 8});
      const KVView nv = *narrow->Update(0, last, k, v);
      const KVView wv =
          *wide->Update(0, last, k.to(dtype).to(at::kFloat), v.to(dtype).to(at::kFloat));
      EXPECT_EQ(nv.keys.scalar_type(), at::kFloat);
      EXPECT_TRUE(at::equal(nv.keys, wv.keys));
      EXPECT_TRUE(at::equal(nv.values, wv.values));
      EXPECT_EQ(narrow->AllocatedBytes() * 2, wide->AllocatedBytes());
    }
  }
}

// Prefix reuse, copy-on-write and Truncate over pools of narrow entries (`make_pool(blocks)`):
// a reader that attaches the writer's published blocks sees its entries, its own write lands in
// a copy, a truncated writer copies the published block before writing again, and a
// speculative step rolled back attends as plain decoding.
void ExpectPrefixReuseAndRollback(
    const std::function<std::shared_ptr<BlockPool>(int64_t blocks)>& make_pool) {
  std::shared_ptr<BlockPool> pool = make_pool(16);
  PrefixCache prefixes(pool);
  const std::vector<int64_t> ids = {1, 2, 3, 4, 5, 6, 7, 8};
  std::unique_ptr<PagedKVCache> writer = *PagedKVCache::Create(pool, 64);
  const at::Tensor before = Fill(*writer, 8);  // [1, G, 8, hs] float32 (widened or decoded)
  EXPECT_EQ(before.scalar_type(), at::kFloat);
  writer->PublishPrefix(prefixes, ids);
  std::unique_ptr<PagedKVCache> reader = *PagedKVCache::Create(pool, 64);
  ASSERT_EQ(reader->AttachPrefix(prefixes, ids), 7);
  EXPECT_EQ(reader->BlocksNeeded(1), 1);  // a copy of the shared second block
  const at::Tensor mine = Fill(*reader, 1);
  EXPECT_TRUE(at::equal(mine.narrow(2, 0, 7), before.narrow(2, 0, 7)));
  EXPECT_TRUE(at::equal(Fill(*writer, 1).narrow(2, 0, 8), before));
  ASSERT_TRUE(writer->Truncate(6).ok());
  EXPECT_EQ(writer->BlocksNeeded(1), 1);  // the published block is copied, not written
  Fill(*writer, 2);
  std::unique_ptr<PagedKVCache> late = *PagedKVCache::Create(pool, 64);
  ASSERT_EQ(late->AttachPrefix(prefixes, ids), 7);
  EXPECT_TRUE(at::equal(Fill(*late, 1).narrow(2, 0, 7), before.narrow(2, 0, 7)));
  for (int64_t step = 1; step <= 6; step += 5) {
    std::shared_ptr<BlockPool> spec_pool = make_pool(32);
    std::unique_ptr<PagedKVCache> speculating = *PagedKVCache::Create(spec_pool, 64);
    std::unique_ptr<PagedKVCache> plain = *PagedKVCache::Create(spec_pool, 64);
    RollbackStream stream;
    stream.geometry = TestPoolGeometry();
    stream.begin = 11;
    stream.step = step;
    stream.keep = 1;
    EXPECT_LT(RollbackDifference(*speculating, *plain, stream), 1e-5) << "step " << step;
    EXPECT_EQ(speculating->blocks_held(), plain->blocks_held());
  }
}

TEST(PagedKVCacheTest, SixteenBitPoolSharesPrefixesCopiesOnWriteAndTruncates) {
  ExpectPrefixReuseAndRollback([](int64_t blocks) { return PoolOf(at::kBFloat16, blocks); });
  // The entries read back are the bfloat16 roundings.
  std::unique_ptr<PagedKVCache> cache = *PagedKVCache::Create(PoolOf(at::kBFloat16, 4), 64);
  const at::Tensor keys = Fill(*cache, 5);
  EXPECT_TRUE(at::equal(keys, keys.to(at::kBFloat16).to(at::kFloat)));
}

// A pool of int8 or int4 entries over TestPoolGeometry() (head size 8: one scale an entry).
std::shared_ptr<BlockPool> QuantisedPool(int bits, int64_t blocks) {
  BlockPoolOptions options;
  options.entries_per_block = 4;
  options.num_blocks = blocks;
  options.entry_bits = bits;
  absl::StatusOr<std::shared_ptr<BlockPool>> pool = BlockPool::Create(TestPoolGeometry(), options);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? *pool : nullptr;
}

// int8 and int4 entries in pool blocks (codes and scales inside the block), every query
// reading them as stored: the paged cache attends as a dense cache of the entries' round trip
// (prompt chunks and decoding steps alike, within float32 rounding), decoding steps as the
// quantised policy cache without a full-precision residual (the same codes) to the bit, and
// the batched decode row as UpdateAndAttend to the bit.
TEST(PagedKVCacheTest, QuantisedPoolAttendsToItsEntriesAsStored) {
  for (const int bits : {8, 4}) {
    std::shared_ptr<BlockPool> pool = QuantisedPool(bits, 16);
    // 2 layers x keys and values x 2 groups x 4 entries x (8 or 4 code bytes + 2 scale bytes).
    EXPECT_EQ(pool->BytesPerBlock(), 2 * 2 * 2 * 4 * (bits + 2));
    EXPECT_EQ(pool->dtype(), at::kByte);
    std::unique_ptr<PagedKVCache> paged = *PagedKVCache::Create(pool, 64);
    std::unique_ptr<PagedKVCache> rows = *PagedKVCache::Create(pool, 64);
    KVCacheSpec spec;
    spec.bits = bits;
    spec.residual = 0;
    KVCacheShape shape;
    static_cast<KVCacheGeometry&>(shape) = TestPoolGeometry();
    std::unique_ptr<KVCache> policy = *MakeKVCache(spec, shape);
    DenseKVCacheOptions dense_options;
    static_cast<KVCacheGeometry&>(dense_options) = TestPoolGeometry();
    std::unique_ptr<DenseKVCache> round_trip = *DenseKVCache::Create(dense_options);
    std::unique_ptr<DenseKVCache> exact = *DenseKVCache::Create(dense_options);
    const auto stored = [&](const at::Tensor& x) {
      const QuantizedGroups codes = QuantizeGroups(x, bits, 8);
      return DequantizeGroups(codes.data, codes.scales, bits, 8, at::kFloat);
    };
    at::manual_seed(17);
    int64_t position = 0;
    for (const int64_t length : {5, 1, 1, 7, 1, 2, 1, 9, 1}) {
      const KVStep step = ContiguousStep(position, length);
      for (KVCache* cache :
           {static_cast<KVCache*>(paged.get()), static_cast<KVCache*>(rows.get()), policy.get(),
            static_cast<KVCache*>(round_trip.get()), static_cast<KVCache*>(exact.get())}) {
        ASSERT_TRUE(cache->CheckStep(step, 1).ok());
      }
      for (int64_t layer = 0; layer < 2; ++layer) {
        const at::Tensor k = at::randn({1, 2, length, 8}), v = at::randn({1, 2, length, 8});
        const at::Tensor q = at::randn({1, 6, length, 8});
        AttentionParams params;
        params.scale = 0.35;
        params.sliding_window = TestPoolGeometry().layers[layer].sliding_window;
        SCOPED_TRACE(testing::Message() << bits << " bits, layer " << layer << " at " << position);
        const at::Tensor a = *paged->UpdateAndAttend(layer, step, q, k, v, params);
        const at::Tensor reference =
            *round_trip->UpdateAndAttend(layer, step, q, stored(k), stored(v), params);
        EXPECT_TRUE(at::allclose(a, reference, 1e-5, 1e-6))
            << (a - reference).abs().max().item<double>();
        const at::Tensor b = *policy->UpdateAndAttend(layer, step, q, k, v, params);
        // (The policy cache keeps only a window layer's window, and attends to a prompt
        // chunk's own entries in full precision.)
        if (length == 1 && params.sliding_window == 0) {
          EXPECT_TRUE(at::equal(a, b)) << (a - b).abs().max().item<double>();
        }
        if (length == 1) {
          std::optional<DecodeRow> row = *rows->UpdateForDecode(layer, step, k, v);
          ASSERT_TRUE(row.has_value());
          EXPECT_TRUE(at::equal(DecodeAttentionRows(q, 2, {*row}, step.positions, params), a));
        } else {
          EXPECT_TRUE(at::equal(*rows->UpdateAndAttend(layer, step, q, k, v, params), a));
        }
        // Quantised, but close to the full-precision result.
        const at::Tensor full = *exact->UpdateAndAttend(layer, step, q, k, v, params);
        const double error = (a - full).abs().max().item<double>();
        EXPECT_GT(error, 0.0);
        EXPECT_LT(error, bits == 8 ? 0.05 : 0.6);
      }
      position += length;
    }
    EXPECT_EQ(paged->AllocatedBytes(), paged->blocks_held() * pool->BytesPerBlock());
    // The plain contract's view: the entries as stored.
    const KVStep last = ContiguousStep(position, 1);
    ASSERT_TRUE(paged->CheckStep(last, 1).ok());
    const at::Tensor k = at::randn({1, 2, 1, 8}), v = at::randn({1, 2, 1, 8});
    const KVView view = *paged->Update(0, last, k, v);
    ASSERT_EQ(view.keys.sizes(), (std::vector<int64_t>{1, 2, position + 1, 8}));
    EXPECT_TRUE(at::equal(view.keys.narrow(2, position, 1), stored(k)));
  }
}

// A prompt longer than one decoded run (2048 entries) is read in several runs: still the
// attention over the entries' round trip.
TEST(PagedKVCacheTest, QuantisedPoolReadsLongPromptsInRuns) {
  std::shared_ptr<BlockPool> pool = QuantisedPool(8, 700);
  std::unique_ptr<PagedKVCache> paged = *PagedKVCache::Create(pool, 2800);
  DenseKVCacheOptions dense_options;
  static_cast<KVCacheGeometry&>(dense_options) = TestPoolGeometry();
  dense_options.max_sequence_length = 2800;
  std::unique_ptr<DenseKVCache> round_trip = *DenseKVCache::Create(dense_options);
  at::manual_seed(29);
  int64_t position = 0;
  for (const int64_t length : {2100, 500}) {
    const KVStep step = ContiguousStep(position, length);
    const absl::Status checked = paged->CheckStep(step, 1);
    ASSERT_TRUE(checked.ok()) << checked;
    ASSERT_TRUE(round_trip->CheckStep(step, 1).ok());
    for (int64_t layer = 0; layer < 2; ++layer) {
      const at::Tensor k = at::randn({1, 2, length, 8}), v = at::randn({1, 2, length, 8});
      const at::Tensor q = at::randn({1, 6, length, 8});
      const QuantizedGroups kq = QuantizeGroups(k, 8, 8), vq = QuantizeGroups(v, 8, 8);
      AttentionParams params;
      params.scale = 0.35;
      params.sliding_window = TestPoolGeometry().layers[layer].sliding_window;
      const at::Tensor a = *paged->UpdateAndAttend(layer, step, q, k, v, params);
      const at::Tensor b = *round_trip->UpdateAndAttend(
          layer, step, q, DequantizeGroups(kq.data, kq.scales, 8, 8, at::kFloat),
          DequantizeGroups(vq.data, vq.scales, 8, 8, at::kFloat), params);
      EXPECT_TRUE(at::allclose(a, b, 1e-5, 1e-5))
          << "layer " << layer << ": " << (a - b).abs().max().item<double>();
    }
    position += length;
  }
}

// Prefix reuse, copy-on-write and Truncate over quantised pools (blocks copied as bytes).
TEST(PagedKVCacheTest, QuantisedPoolSharesPrefixesCopiesOnWriteAndTruncates) {
  for (const int bits : {8, 4}) {
    SCOPED_TRACE(testing::Message() << bits << " bits");
    ExpectPrefixReuseAndRollback([bits](int64_t blocks) { return QuantisedPool(bits, blocks); });
  }
}

// Table rows (KVTableRows, the device pools' batched step): three caches of different
// lengths over one pool hand their one-token steps over as rows, and one PagedDecodeRows call
// (here the kernel's CPU twin) attends as each cache's own UpdateAndAttend; an evicting cache
// and a prompt chunk hand over none (and store nothing).
TEST(PagedKVCacheTest, TableRowsOfSeveralCachesAttendAsEachAlone) {
  for (const int bits : {16, 8}) {
    SCOPED_TRACE(testing::Message() << bits << " bits");
    std::shared_ptr<BlockPool> pool = bits == 16 ? TestPool(64) : QuantisedPool(bits, 64);
    std::vector<std::unique_ptr<PagedKVCache>> rows, alone;
    const std::vector<int64_t> prompts = {3, 9, 1};
    at::manual_seed(29);
    for (const int64_t prompt : prompts) {
      rows.push_back(*PagedKVCache::Create(pool, 64));
      alone.push_back(*PagedKVCache::Create(pool, 64));
      const KVStep step = ContiguousStep(0, prompt);
      for (auto* cache : {rows.back().get(), alone.back().get()}) {
        ASSERT_TRUE(cache->CheckStep(step, 1).ok());
      }
      for (int64_t layer = 0; layer < 2; ++layer) {
        const at::Tensor k = at::randn({1, 2, prompt, 8}), v = at::randn({1, 2, prompt, 8});
        const at::Tensor q = at::randn({1, 6, prompt, 8});
        if (prompt > 1) {  // a prompt chunk is no table row (and stores nothing)
          EXPECT_FALSE(rows.back()->UpdateForTable(layer, step, k, v)->has_value());
        }
        for (auto* cache : {rows.back().get(), alone.back().get()}) {
          ASSERT_TRUE(cache->UpdateAndAttend(layer, step, q, k, v, AttentionParams{0.35}).ok());
        }
      }
    }
    for (int64_t decode = 0; decode < 6; ++decode) {
      for (size_t r = 0; r < rows.size(); ++r) {
        const KVStep step = ContiguousStep(rows[r]->length(), 1);
        ASSERT_TRUE(rows[r]->CheckStep(step, 1).ok());
        ASSERT_TRUE(alone[r]->CheckStep(step, 1).ok());
      }
      for (int64_t layer = 0; layer < 2; ++layer) {
        AttentionParams params;
        params.scale = 0.35;
        params.sliding_window = TestPoolGeometry().layers[layer].sliding_window;
        std::vector<PagedDecodeRow> table;
        std::vector<at::Tensor> queries, expected;
        PagedKVLayer layer_entries;
        for (size_t r = 0; r < rows.size(); ++r) {
          const KVStep step = ContiguousStep(rows[r]->length(), 1);
          const at::Tensor k = at::randn({1, 2, 1, 8}), v = at::randn({1, 2, 1, 8});
          const at::Tensor q = at::randn({1, 6, 1, 8});
          const absl::StatusOr<std::optional<KVTableRows::Row>> row =
              rows[r]->UpdateForTable(layer, step, k, v);
          ASSERT_TRUE(row.ok()) << row.status();
          ASSERT_TRUE(row->has_value());
          EXPECT_EQ((*row)->row.length, step.max_position + 1);
          EXPECT_TRUE((*row)->layer.keys.is_same(pool->layer_keys(layer)));
          layer_entries = (*row)->layer;
          table.push_back((*row)->row);
          queries.push_back(q.select(2, 0));
          expected.push_back(*alone[r]->UpdateAndAttend(layer, step, q, k, v, params));
        }
        const absl::StatusOr<at::Tensor> y =
            PagedDecodeRows(at::cat(queries), layer_entries, table, params);
        ASSERT_TRUE(y.ok()) << y.status();
        EXPECT_LT((y->unsqueeze(2) - at::cat(expected)).abs().max().item<double>(), 1e-5)
            << "layer " << layer;
      }
    }
  }
  std::unique_ptr<PagedKVCache> evicting =
      *PagedKVCache::Create(TestPool(16), 64, PagedEviction{6, 2});
  ASSERT_TRUE(evicting->CheckStep(ContiguousStep(0, 1), 1).ok());
  EXPECT_FALSE(evicting
                   ->UpdateForTable(0, ContiguousStep(0, 1), at::randn({1, 2, 1, 8}),
                                    at::randn({1, 2, 1, 8}))
                   ->has_value());
  EXPECT_EQ(evicting->table_rows(), nullptr);  // a CPU pool, and an evicting cache
}

// A pool on the GPU: decoding steps go through the CUDA paged decode kernel over the block
// table, prompt chunks through the generic path; both equal the CPU pool's, for every entry
// kind (float32, bfloat16, int8, int4). An evicting cache (a sink ring, wrapped by the steps)
// on the GPU attends as its CPU twin too (the generic path over its slots and waiting entry).
TEST(PagedKVCacheTest, CudaPoolAttendsAsTheCpuPool) {
  if (!PagedAttentionHasCudaKernel()) GTEST_SKIP() << "skipped: built against a CPU-only LibTorch";
  if (!CudaAvailable()) GTEST_SKIP() << "skipped: no CUDA device";
  const c10::Device cuda(c10::kCUDA, 0);
  struct Entries {
    at::ScalarType dtype;
    int bits;
  };
  for (const Entries entries : {Entries{at::kFloat, 16}, Entries{at::kBFloat16, 16},
                                Entries{at::kFloat, 8}, Entries{at::kFloat, 4}}) {
    for (const PagedEviction eviction : {PagedEviction{}, PagedEviction{6, 2}}) {
      SCOPED_TRACE(testing::Message()
                   << entries.dtype << " " << entries.bits << " bits, budget " << eviction.budget);
      std::shared_ptr<BlockPool> pools[2];
      for (int device = 0; device < 2; ++device) {
        KVCacheGeometry geometry = TestPoolGeometry();
        geometry.dtype = entries.dtype;
        if (device == 1) geometry.device = cuda;
        BlockPoolOptions options;
        options.entries_per_block = 4;
        options.num_blocks = 16;
        options.entry_bits = entries.bits;
        pools[device] = *BlockPool::Create(geometry, options);
      }
      std::unique_ptr<PagedKVCache> cpu = *PagedKVCache::Create(pools[0], 64, eviction);
      std::unique_ptr<PagedKVCache> gpu = *PagedKVCache::Create(pools[1], 64, eviction);
      ASSERT_EQ(gpu->evicts(), eviction.budget > 0);
      at::manual_seed(23);
      int64_t position = 0;
      for (const int64_t length : {6, 1, 1, 3, 1, 1, 1, 9, 1, 1}) {
        const KVStep step = ContiguousStep(position, length);
        KVStep gpu_step = step;
        gpu_step.positions = step.positions.to(cuda);
        ASSERT_TRUE(cpu->CheckStep(step, 1).ok());
        ASSERT_TRUE(gpu->CheckStep(gpu_step, 1).ok());
        for (int64_t layer = 0; layer < 2; ++layer) {
          const at::Tensor k = at::randn({1, 2, length, 8}), v = at::randn({1, 2, length, 8});
          const at::Tensor q = at::randn({1, 6, length, 8});
          AttentionParams params;
          params.scale = 0.35;
          params.softcap = layer == 0 ? std::optional<double>(3.0) : std::nullopt;
          params.sliding_window = TestPoolGeometry().layers[layer].sliding_window;
          const at::Tensor a = *cpu->UpdateAndAttend(layer, step, q, k, v, params);
          const absl::StatusOr<at::Tensor> b =
              gpu->UpdateAndAttend(layer, gpu_step, q.to(cuda), k.to(cuda), v.to(cuda), params);
          ASSERT_TRUE(b.ok()) << b.status();
          EXPECT_LT((b->cpu() - a).abs().max().item<double>(), 1e-5)
              << "layer " << layer << " at " << position;
        }
        position += length;
      }
    }
  }
}

TEST(PagedKVCacheTest, QuantisedPoolOptionsAreChecked) {
  BlockPoolOptions options;
  options.num_blocks = 4;
  options.entry_bits = 6;
  EXPECT_NE(BlockPool::Create(TestPoolGeometry(), options).status().message().find("entry_bits"),
            std::string::npos);
  options.entry_bits = 4;
  options.group_size = 0;
  EXPECT_NE(BlockPool::Create(TestPoolGeometry(), options).status().message().find("group_size"),
            std::string::npos);
  KVCacheGeometry odd = TestPoolGeometry();
  odd.layers[0].head_size = 9;  // int4 needs pairs of channels
  options.group_size = 32;
  EXPECT_EQ(BlockPool::Create(odd, options).status().code(), absl::StatusCode::kInvalidArgument);
  options.entry_bits = 8;
  EXPECT_TRUE(BlockPool::Create(odd, options).ok());
}

// Evicting caches (PagedEviction): StreamingLLM's sink and window policies in a ring of pool
// blocks, against the policy cache that defines them, the dense cache before the ring wraps,
// and the cache's own promises (memory bound, block accounting, rollback, the plain contract).

// A sink or window policy (PolicyKVCache's names) and what PagedEviction keeps for it.
struct RingPolicy {
  const char* policy;
  int64_t budget;
  int64_t sinks;
};
// 12 slots (3 whole blocks of 4), 9 slots (2 blocks and one of 1 slot), and sinks filling the
// budget (no ring: a decoding step's entry waits beside the slots and is evicted after it).
constexpr RingPolicy kSink{"sink", 12, 4};
constexpr RingPolicy kWindow{"window", 9, 0};
constexpr RingPolicy kAllSinks{"sink", 6, 6};

// Slots in blocks (a decoding step attends to them and its own entry, waiting beside them).
int64_t RingSlots(const RingPolicy& p) { return p.budget; }
int64_t RingBlocks(const RingPolicy& p, int64_t entries_per_block) {
  return (RingSlots(p) + entries_per_block - 1) / entries_per_block;
}

std::unique_ptr<PagedKVCache> EvictingCache(std::shared_ptr<BlockPool> pool, const RingPolicy& p) {
  absl::StatusOr<std::unique_ptr<PagedKVCache>> cache =
      PagedKVCache::Create(std::move(pool), kFourLayerContext, PagedEviction{p.budget, p.sinks});
  EXPECT_TRUE(cache.ok()) << cache.status();
  if (!cache.ok()) return nullptr;
  EXPECT_TRUE((*cache)->evicts());
  return std::move(*cache);
}

std::unique_ptr<PagedKVCache> DensePagedCache(std::shared_ptr<BlockPool> pool) {
  absl::StatusOr<std::unique_ptr<PagedKVCache>> cache =
      PagedKVCache::Create(std::move(pool), kFourLayerContext);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return cache.ok() ? std::move(*cache) : nullptr;
}

// The policy cache of `p` over FourLayerGeometry() (float32 entries).
std::unique_ptr<KVCache> PolicyCache(const RingPolicy& p) {
  KVCacheSpec spec;
  spec.policy = p.policy;
  spec.budget = p.budget;
  if (std::string(p.policy) == "sink") spec.sink_tokens = p.sinks;
  KVCacheShape shape;
  static_cast<KVCacheGeometry&>(shape) = FourLayerGeometry();
  absl::StatusOr<std::unique_ptr<KVCache>> cache = MakeKVCache(spec, shape);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return cache.ok() ? std::move(*cache) : nullptr;
}

std::unique_ptr<DenseKVCache> RingDenseCache() {
  DenseKVCacheOptions options;
  static_cast<KVCacheGeometry&>(options) = FourLayerGeometry();
  absl::StatusOr<std::unique_ptr<DenseKVCache>> cache = DenseKVCache::Create(options);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return cache.ok() ? std::move(*cache) : nullptr;
}

// Step lengths of a stream: prompt chunks of 1, 2, 3 and 5 entries, chunks longer than the
// rings (up to 10 slots), chunks that start the cache longer than the budget, or start it and
// end among the sinks, or start within the sinks and wrap, chunks that fill the ring exactly,
// and long runs of one-token decoding steps (the rings wrap many times). Each stream stays
// under kFourLayerContext.
std::vector<std::vector<int64_t>> RingSchedules() {
  // Runs of (length, repeats).
  const auto stream = [](std::initializer_list<std::pair<int64_t, int64_t>> runs) {
    std::vector<int64_t> lengths;
    for (const auto& [length, repeats] : runs) lengths.insert(lengths.end(), repeats, length);
    return lengths;
  };
  return {
      stream({{20, 1}, {1, 12}, {3, 1}, {1, 7}, {14, 1}, {1, 25}, {5, 1}, {1, 9}, {2, 1}, {1, 6}}),
      stream({{2, 1}, {1, 1}, {19, 1}, {1, 10}, {9, 1}, {1, 5}, {10, 1}, {1, 20}, {13, 1}, {1, 8}}),
      stream({{8, 1}, {1, 2}, {3, 1}, {1, 20}, {6, 1}, {1, 30}, {1, 1}, {30, 1}, {1, 20}}),
      stream({{1, 40}, {3, 1}, {1, 10}, {11, 1}, {1, 30}}),
  };
}

int64_t Total(const std::vector<int64_t>& lengths) {
  int64_t total = 0;
  for (const int64_t length : lengths) total += length;
  return total;
}

// The positions a step of `steps` entries at `begin` attends to in a cache keeping `budget`
// entries, the first `sinks` among them: what the cache kept after the previous step (every
// position while they fit in the budget; then the sinks and the budget - sinks most recent)
// and the step's own.
std::vector<int64_t> KeptPlusOwn(const RingPolicy& p, int64_t begin, int64_t steps) {
  std::vector<int64_t> positions;
  for (int64_t pos = 0; pos < begin; ++pos) {
    if (begin <= p.budget || pos < p.sinks || pos >= begin - (p.budget - p.sinks)) {
      positions.push_back(pos);
    }
  }
  for (int64_t pos = begin; pos < begin + steps; ++pos) positions.push_back(pos);
  return positions;
}

std::vector<int64_t> SortedPositions(const at::Tensor& positions) {
  const at::Tensor flat = positions.reshape({-1}).to(at::kLong).contiguous();
  std::vector<int64_t> out(flat.data_ptr<int64_t>(), flat.data_ptr<int64_t>() + flat.numel());
  std::sort(out.begin(), out.end());
  return out;
}

// Drives an evicting paged cache of `p`, the policy cache of the same policy and budget, and a
// dense cache through the steps of `schedule`, all fed the same random keys, values and
// queries. Returns per layer the largest difference between the paged and the policy cache's
// outputs; `from_dense` gets the largest between the paged and the dense cache's on global
// layers. The paged cache never holds more than its ring's blocks.
std::vector<double> PolicyDifferences(const RingPolicy& p, const std::vector<int64_t>& schedule,
                                      double* from_dense) {
  std::vector<double> largest(kFourLayers, HUGE_VAL);
  std::shared_ptr<BlockPool> pool = FourLayerPool(16);
  std::unique_ptr<PagedKVCache> paged = EvictingCache(pool, p);
  std::unique_ptr<KVCache> policy = PolicyCache(p);
  std::unique_ptr<DenseKVCache> dense = RingDenseCache();
  if (!paged || !policy || !dense) return largest;
  std::fill(largest.begin(), largest.end(), 0.0);
  *from_dense = 0;
  at::manual_seed(41);
  int64_t position = 0;
  for (const int64_t length : schedule) {
    const KVStep step = ContiguousStep(position, length);
    for (KVCache* cache :
         {static_cast<KVCache*>(paged.get()), policy.get(), static_cast<KVCache*>(dense.get())}) {
      const absl::Status checked = cache->CheckStep(step, 1);
      EXPECT_TRUE(checked.ok()) << cache->DebugName() << ": " << checked;
      if (!checked.ok()) return std::vector<double>(kFourLayers, HUGE_VAL);
    }
    for (int64_t layer = 0; layer < kFourLayers; ++layer) {
      const LayerInputs in = RandomInputs(layer, length);
      const AttentionParams params = FourLayerParams(layer);
      const absl::StatusOr<at::Tensor> a =
          paged->UpdateAndAttend(layer, step, in.q, in.k, in.v, params);
      const absl::StatusOr<at::Tensor> b =
          policy->UpdateAndAttend(layer, step, in.q, in.k, in.v, params);
      const absl::StatusOr<at::Tensor> c =
          dense->UpdateAndAttend(layer, step, in.q, in.k, in.v, params);
      EXPECT_TRUE(a.ok()) << a.status();
      EXPECT_TRUE(b.ok() && c.ok());
      if (!a.ok() || !b.ok() || !c.ok()) return std::vector<double>(kFourLayers, HUGE_VAL);
      largest[layer] = std::max(largest[layer], MaxDifference(*a, *b));
      if (params.sliding_window == 0) *from_dense = std::max(*from_dense, MaxDifference(*a, *c));
    }
    position += length;
    EXPECT_LE(paged->blocks_held(), RingBlocks(p, 4)) << "at " << position;
  }
  return largest;
}

bool PolicyKeepsAsThePagedCache(const RingPolicy& p, int64_t window) {
  return PagedEvictionKeepsAsThePolicy(PagedEviction{p.budget, p.sinks}, window);
}

// The same random keys, values and queries through an evicting paged cache, the policy cache of
// the same policy and budget, and a dense cache, over streams mixing prompt chunks of every
// kind with decoding steps: the paged cache attends as the policy cache (near-equality in
// float32: the two sum their entries in different orders, slot order and block order), and,
// for the comparison to have teeth, not as the dense cache once the ring has wrapped.
TEST(PagedEvictionTest, AttendsAsThePolicyCacheOfTheSamePolicyAndBudget) {
  for (const RingPolicy& p : {kSink, kWindow, kAllSinks}) {
    for (const std::vector<int64_t>& schedule : RingSchedules()) {
      ASSERT_LT(Total(schedule), kFourLayerContext);
      ASSERT_GT(Total(schedule), 7 * RingSlots(p));  // the ring wraps many times
      SCOPED_TRACE(testing::Message() << p.policy << " budget " << p.budget << " sinks " << p.sinks
                                      << ", stream of " << schedule.size() << " steps");
      double from_dense = 0;
      const std::vector<double> differences = PolicyDifferences(p, schedule, &from_dense);
      int compared = 0;
      for (int64_t layer = 0; layer < kFourLayers; ++layer) {
        if (!PolicyKeepsAsThePagedCache(p, FourLayerGeometry().layers[layer].sliding_window))
          continue;
        EXPECT_LE(differences[layer], 1e-5) << "layer " << layer;
        ++compared;
      }
      EXPECT_GE(compared, 2);
      EXPECT_GT(from_dense, 1e-3);
    }
  }
}

// Where PagedEvictionKeepsAsThePolicy says no (a sink cache's windowed layer whose recent
// entries do not cover the window), the two caches do attend differently: the paged cache keeps
// the sinks (one slot layout for every layer), the policy cache drops sinks that have left the
// window and keeps more recent entries instead. So the rule is not over-cautious.
TEST(PagedEvictionTest, SinkCachesOnWindowedLayersDifferWhereTheRuleSaysSo) {
  int divergent = 0;
  for (const RingPolicy& p : {kSink, kAllSinks}) {
    SCOPED_TRACE(testing::Message() << p.policy << " budget " << p.budget << " sinks " << p.sinks);
    double from_dense = 0;
    const std::vector<double> differences = PolicyDifferences(p, RingSchedules()[0], &from_dense);
    for (int64_t layer = 0; layer < kFourLayers; ++layer) {
      const int64_t window = FourLayerGeometry().layers[layer].sliding_window;
      if (PolicyKeepsAsThePagedCache(p, window)) continue;
      EXPECT_GT(differences[layer], 1e-3) << "layer " << layer << " (window " << window << ")";
      ++divergent;
    }
  }
  EXPECT_GE(divergent, 2);
}

// A batched decoding step's rows (UpdateForDecode, then DecodeAttentionRows over several
// requests) of wrapped evicting caches attend as each cache's own UpdateAndAttend, to the bit,
// over every kind of pool entry; each row holds the budget's slots and the step's own entry with
// the kept positions and the step's own.
TEST(PagedEvictionTest, DecodeRowsOfWrappedCachesAttendAsUpdateAndAttend) {
  for (const PoolKind& kind : {kFloat32Entries, kBFloat16Entries, kInt8Entries, kInt4Entries}) {
    SCOPED_TRACE(kind.name);
    std::shared_ptr<BlockPool> pool = FourLayerPool(32, kind);
    // Two requests batched together: a sink cache and a window cache at other positions.
    const RingPolicy policies[2] = {kSink, kWindow};
    std::unique_ptr<PagedKVCache> attending[2], rows[2];
    for (int r = 0; r < 2; ++r) {
      attending[r] = EvictingCache(pool, policies[r]);
      rows[r] = EvictingCache(pool, policies[r]);
      ASSERT_TRUE(attending[r] && rows[r]);
    }
    // Each request: a prompt chunk, 15 decoding steps, another prompt chunk (at the same step
    // as the other request's), 20 decoding steps. The sink cache's first chunk starts it longer
    // than its budget; the second chunks wrap the rings (shorter and longer than the ring).
    const auto stream = [](int64_t prompt, int64_t chunk) {
      std::vector<int64_t> lengths = {prompt};
      lengths.insert(lengths.end(), 15, 1);
      lengths.push_back(chunk);
      lengths.insert(lengths.end(), 20, 1);
      return lengths;
    };
    const std::vector<int64_t> schedules[2] = {stream(17, 3), stream(3, 12)};
    ASSERT_EQ(schedules[0].size(), schedules[1].size());
    at::manual_seed(43);
    int64_t positions[2] = {0, 0};
    int batched_steps = 0;
    for (size_t s = 0; s < schedules[0].size(); ++s) {
      KVStep steps[2];
      for (int r = 0; r < 2; ++r) {
        steps[r] = ContiguousStep(positions[r], schedules[r][s]);
        ASSERT_TRUE(attending[r]->CheckStep(steps[r], 1).ok());
        ASSERT_TRUE(rows[r]->CheckStep(steps[r], 1).ok());
      }
      const bool decoding = schedules[0][s] == 1 && schedules[1][s] == 1;
      for (int64_t layer = 0; layer < kFourLayers; ++layer) {
        const AttentionParams params = FourLayerParams(layer);
        LayerInputs in[2];
        at::Tensor expected[2];
        for (int r = 0; r < 2; ++r) {
          in[r] = RandomInputs(layer, schedules[r][s]);
          expected[r] =
              *attending[r]->UpdateAndAttend(layer, steps[r], in[r].q, in[r].k, in[r].v, params);
        }
        if (!decoding) {  // prompt chunks: each request on its own
          for (int r = 0; r < 2; ++r) {
            EXPECT_TRUE(at::equal(
                *rows[r]->UpdateAndAttend(layer, steps[r], in[r].q, in[r].k, in[r].v, params),
                expected[r]));
          }
          continue;
        }
        std::vector<DecodeRow> batch;
        for (int r = 0; r < 2; ++r) {
          absl::StatusOr<std::optional<DecodeRow>> row =
              rows[r]->UpdateForDecode(layer, steps[r], in[r].k, in[r].v);
          ASSERT_TRUE(row.ok()) << row.status();
          ASSERT_TRUE(row->has_value()) << "row " << r << " layer " << layer;
          const int64_t length = positions[r] + 1;
          EXPECT_EQ((*row)->entries, std::min(length, RingSlots(policies[r]) + 1));
          EXPECT_EQ(SortedPositions((*row)->key_positions.narrow(2, 0, (*row)->entries)),
                    KeptPlusOwn(policies[r], positions[r], 1))
              << "row " << r << " at " << positions[r];
          batch.push_back(**row);
        }
        const at::Tensor y = DecodeAttentionRows(
            at::cat({in[0].q, in[1].q}, 0), FourLayerGeometry().layers[layer].n_query_groups, batch,
            at::cat({steps[0].positions, steps[1].positions}, 0), params);
        EXPECT_TRUE(at::equal(y, at::cat({expected[0], expected[1]}, 0)))
            << "layer " << layer << " at " << positions[0] << ", " << positions[1] << ": "
            << MaxDifference(y, at::cat({expected[0], expected[1]}, 0));
      }
      if (decoding && positions[0] >= RingSlots(kSink) && positions[1] >= RingSlots(kWindow)) {
        ++batched_steps;  // both rings full or wrapped
      }
      for (int r = 0; r < 2; ++r) positions[r] += schedules[r][s];
    }
    EXPECT_GE(batched_steps, 20);
    EXPECT_GT(positions[0], 3 * RingSlots(kSink));  // the rings wrapped several times
    EXPECT_GT(positions[1], 3 * RingSlots(kWindow));
  }
}

// bfloat16 entries of a float32 model and int8 / int4 codes in an evicting cache:
// - it attends as an evicting cache over a float32 pool whose entries were rounded (or
//   quantised and dequantised) as the narrow pool stores them: to the bit for bfloat16, within
//   float32 rounding for the quantised ones (their kernels dequantise in registers and sum in
//   another order);
// - until the ring wraps, as a dense paged cache over the same kind of pool, to the bit (the
//   same entries and reads);
// - and within a quantisation tolerance of an evicting cache over a float32 pool of the exact
//   entries: bfloat16 keeps 8 significant bits (relative error up to 2^-9 per channel of
//   keys and values), int8 1/127 and int4 1/7 of each entry's largest channel, so scores and
//   outputs of unit-variance entries move by about that much (the same bounds as the quantised
//   pool's dense test above, 0.05 and 0.6; 0.03 for bfloat16, about three times the largest
//   difference these streams show, as for int8).
TEST(PagedEvictionTest, NarrowPoolsEvictAsAFloat32PoolOfTheirStoredEntries) {
  for (const PoolKind& kind : {kBFloat16Entries, kInt8Entries, kInt4Entries}) {
    const double tolerance = kind.bits == 4 ? 0.6 : kind.bits == 8 ? 0.05 : 0.03;
    for (const RingPolicy& p : {kSink, kWindow}) {
      for (const std::vector<int64_t>& schedule :
           {RingSchedules()[0], RingSchedules()[1], RingSchedules()[2]}) {
        SCOPED_TRACE(testing::Message() << kind.name << " " << p.policy << " budget " << p.budget
                                        << ", stream of " << schedule.size() << " steps");
        std::unique_ptr<PagedKVCache> narrow = EvictingCache(FourLayerPool(16, kind), p);
        std::unique_ptr<PagedKVCache> rounded = EvictingCache(FourLayerPool(16), p);
        std::unique_ptr<PagedKVCache> exact = EvictingCache(FourLayerPool(16), p);
        std::unique_ptr<PagedKVCache> dense = DensePagedCache(FourLayerPool(40, kind));
        ASSERT_TRUE(narrow && rounded && exact && dense);
        at::manual_seed(47);
        int64_t position = 0;
        double largest_error = 0;
        for (const int64_t length : schedule) {
          const KVStep step = ContiguousStep(position, length);
          for (PagedKVCache* cache : {narrow.get(), rounded.get(), exact.get(), dense.get()}) {
            ASSERT_TRUE(cache->CheckStep(step, 1).ok());
          }
          const bool wrapped = position + length > RingSlots(p);
          for (int64_t layer = 0; layer < kFourLayers; ++layer) {
            SCOPED_TRACE(testing::Message()
                         << "layer " << layer << ", step of " << length << " at " << position);
            const LayerInputs in = RandomInputs(layer, length);
            const AttentionParams params = FourLayerParams(layer);
            const at::Tensor a = *narrow->UpdateAndAttend(layer, step, in.q, in.k, in.v, params);
            const at::Tensor b = *rounded->UpdateAndAttend(layer, step, in.q, StoredAs(kind, in.k),
                                                           StoredAs(kind, in.v), params);
            const at::Tensor d = *dense->UpdateAndAttend(layer, step, in.q, in.k, in.v, params);
            const at::Tensor e = *exact->UpdateAndAttend(layer, step, in.q, in.k, in.v, params);
            ASSERT_EQ(a.scalar_type(), at::kFloat);
            if (kind.bits == 16) {
              EXPECT_TRUE(at::equal(a, b)) << MaxDifference(a, b);
            } else {
              EXPECT_LE(MaxDifference(a, b), 1e-5);
            }
            if (!wrapped) {
              EXPECT_TRUE(at::equal(a, d)) << MaxDifference(a, d);
            }
            const double error = MaxDifference(a, e);
            EXPECT_LE(error, tolerance);
            largest_error = std::max(largest_error, error);
          }
          position += length;
        }
        EXPECT_GT(largest_error, 0.0);  // the entries really were narrowed
      }
    }
  }
}

// However the steps come (random prompt chunks and decoding steps, blocks of 1 to 16 entries,
// rings that end in a partial block), an evicting cache never holds more than
// ceil(budget / entries_per_block) blocks, so a pool of exactly that many serves a long
// stream; BlocksNeeded before a step is what the step takes, BlocksToHold(n) what the cache
// holds after n entries; Reset and destruction give every block back.
TEST(PagedEvictionTest, HoldsAtMostTheRingsBlocksAndGivesThemBack) {
  struct Case {
    int64_t budget, sinks, entries_per_block;
  };
  std::mt19937 random(53);
  for (const Case c : {Case{12, 4, 4}, Case{9, 0, 4}, Case{7, 3, 1}, Case{10, 2, 3}, Case{11, 0, 5},
                       Case{6, 6, 4}, Case{20, 1, 16}, Case{1, 0, 2}}) {
    SCOPED_TRACE(testing::Message() << "budget " << c.budget << " sinks " << c.sinks
                                    << ", blocks of " << c.entries_per_block);
    const RingPolicy p{"sink", c.budget, c.sinks};
    const int64_t bound = RingBlocks(p, c.entries_per_block);
    std::shared_ptr<BlockPool> pool = FourLayerPool(bound, kFloat32Entries, c.entries_per_block);
    std::unique_ptr<PagedKVCache> cache = EvictingCache(pool, p);
    ASSERT_TRUE(cache);
    for (int64_t n = 0; n < kFourLayerContext; n += 7) {
      EXPECT_EQ(cache->BlocksToHold(n),
                (std::min(n, RingSlots(p)) + c.entries_per_block - 1) / c.entries_per_block)
          << n;
    }
    for (int round = 0; round < 2; ++round) {  // again after Reset
      int64_t position = 0;
      while (true) {
        const int64_t length =
            random() % 3 == 0 ? 1 + static_cast<int64_t>(random() % 30) : 1;  // mostly decoding
        if (position + length > kFourLayerContext) break;
        const int64_t needed = cache->BlocksNeeded(length);
        const int64_t free_before = pool->free_blocks();
        const absl::Status checked = cache->CheckStep(ContiguousStep(position, length), 1);
        ASSERT_TRUE(checked.ok()) << checked << " at " << position << ", step of " << length;
        EXPECT_EQ(free_before - pool->free_blocks(), needed)
            << "at " << position << ", step of " << length;
        EXPECT_EQ(cache->blocks_held(), cache->BlocksToHold(position + length));
        EXPECT_LE(cache->blocks_held(), bound);
        const KVStep step = ContiguousStep(position, length);
        for (int64_t layer = 0; layer < kFourLayers; ++layer) {
          const LayerInputs in = RandomInputs(layer, length);
          ASSERT_TRUE(cache->Update(layer, step, in.k, in.v).ok());
        }
        EXPECT_EQ(cache->blocks_held(), cache->BlocksToHold(position + length));
        EXPECT_EQ(cache->AllocatedBytes(), cache->blocks_held() * pool->BytesPerBlock());
        position += length;
      }
      EXPECT_EQ(cache->blocks_held(), bound);
      EXPECT_EQ(cache->BlocksNeeded(1), 0);  // a wrapped ring writes into its own blocks
      cache->Reset();
      EXPECT_EQ(cache->blocks_held(), 0);
      EXPECT_EQ(cache->length(), 0);
      EXPECT_EQ(pool->free_blocks(), bound);
    }
    ASSERT_TRUE(
        cache->CheckStep(ContiguousStep(0, kFourLayerContext - 1), 1).ok());  // one chunk: the ring
    EXPECT_EQ(cache->blocks_held(), bound);
    cache.reset();
    EXPECT_EQ(pool->free_blocks(), bound);  // destruction gives the blocks back
  }
}

// Inputs of one layer at positions [begin, begin + length), the same whichever step they come
// in (seeded per position and layer); `salt` gives other entries for the same positions (a
// speculative step's rejected proposals).
LayerInputs PositionInputs(int64_t layer, int64_t begin, int64_t length, int64_t salt = 0) {
  std::vector<at::Tensor> q, k, v;
  for (int64_t pos = begin; pos < begin + length; ++pos) {
    at::manual_seed(1000003 * salt + 7919 * layer + pos);
    const LayerInputs one = RandomInputs(layer, 1);
    q.push_back(one.q);
    k.push_back(one.k);
    v.push_back(one.v);
  }
  return {at::cat(q, 2), at::cat(k, 2), at::cat(v, 2)};
}

// One step of every layer with PositionInputs; the outputs per layer (empty on an error, which
// fails the calling test).
std::vector<at::Tensor> RunStep(KVCache& cache, int64_t begin, int64_t length,
                                int64_t rejected_from = -1) {
  const KVStep step = ContiguousStep(begin, length);
  const absl::Status checked = cache.CheckStep(step, 1);
  EXPECT_TRUE(checked.ok()) << checked;
  if (!checked.ok()) return {};
  std::vector<at::Tensor> outputs;
  for (int64_t layer = 0; layer < kFourLayers; ++layer) {
    LayerInputs in = PositionInputs(layer, begin, length);
    if (rejected_from >= 0 && rejected_from < begin + length) {
      // Entries from rejected_from on: proposals that get rejected.
      const int64_t kept = rejected_from - begin;
      const LayerInputs other = PositionInputs(layer, rejected_from, length - kept, /*salt=*/1);
      in.q = at::cat({in.q.narrow(2, 0, kept), other.q}, 2);
      in.k = at::cat({in.k.narrow(2, 0, kept), other.k}, 2);
      in.v = at::cat({in.v.narrow(2, 0, kept), other.v}, 2);
    }
    const absl::StatusOr<at::Tensor> y =
        cache.UpdateAndAttend(layer, step, in.q, in.k, in.v, FourLayerParams(layer));
    EXPECT_TRUE(y.ok()) << y.status();
    if (!y.ok()) return {};
    outputs.push_back(*y);
  }
  return outputs;
}

double LargestDifference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size() || a.empty()) return HUGE_VAL;
  double largest = 0;
  for (size_t i = 0; i < a.size(); ++i) largest = std::max(largest, MaxDifference(a[i], b[i]));
  return largest;
}

// Speculative decoding over an evicting cache: until the ring wraps, Truncate forgets a
// step's rejected proposals exactly as the dense cache does (the cache then attends, before and
// after wrapping, as one that decoded only the kept entries, and as a dense cache that was
// truncated alike until the ring wraps), and gives back the blocks past the kept entries. Once
// the ring has wrapped (a step that wraps it included) Truncate to a shorter length is
// FailedPrecondition and changes nothing; rollback() is null for an evicting cache, the role
// of a dense one.
TEST(PagedEvictionTest, TruncatesAsTheDenseCacheOnlyUntilTheRingWraps) {
  struct Case {
    int64_t begin, step, keep;
  };
  // kSink: 12 slots in 3 blocks of 4.
  for (const Case c : {Case{9, 3, 1}, Case{8, 4, 2}, Case{6, 6, 3}, Case{9, 3, 3}, Case{4, 5, 1},
                       Case{2, 10, 5}}) {
    SCOPED_TRACE(testing::Message()
                 << "step of " << c.step << " at " << c.begin << ", keeping " << c.keep);
    ASSERT_LE(c.begin + c.step, RingSlots(kSink));
    std::shared_ptr<BlockPool> pool = FourLayerPool(32);
    std::unique_ptr<PagedKVCache> speculating = EvictingCache(pool, kSink);
    std::unique_ptr<PagedKVCache> plain = EvictingCache(pool, kSink);
    std::unique_ptr<PagedKVCache> dense = DensePagedCache(pool);
    ASSERT_TRUE(speculating && plain && dense);
    EXPECT_EQ(speculating->rollback(), nullptr);
    ASSERT_NE(dense->rollback(), nullptr);
    for (PagedKVCache* cache : {speculating.get(), plain.get(), dense.get()}) {
      ASSERT_FALSE(RunStep(*cache, 0, 2).empty());
      for (int64_t p = 2; p < c.begin; ++p) ASSERT_FALSE(RunStep(*cache, p, 1).empty());
    }
    const std::vector<at::Tensor> verified =
        RunStep(*speculating, c.begin, c.step, c.begin + c.keep);
    const std::vector<at::Tensor> verified_dense =
        RunStep(*dense, c.begin, c.step, c.begin + c.keep);
    EXPECT_EQ(LargestDifference(verified, verified_dense), 0.0);
    const int64_t free_before = pool->free_blocks();
    const int64_t held_before = speculating->blocks_held();
    const absl::Status truncated = speculating->Truncate(c.begin + c.keep);
    ASSERT_TRUE(truncated.ok()) << truncated;
    EXPECT_EQ(speculating->length(), c.begin + c.keep);
    EXPECT_EQ(speculating->blocks_held(), speculating->BlocksToHold(c.begin + c.keep));
    EXPECT_EQ(pool->free_blocks() - free_before, held_before - speculating->blocks_held());
    ASSERT_TRUE(dense->rollback()->Truncate(c.begin + c.keep).ok());
    EXPECT_EQ(speculating->blocks_held(), dense->blocks_held());
    for (int64_t i = 0; i < c.keep; ++i) {
      const std::vector<at::Tensor> decoded = RunStep(*plain, c.begin + i, 1);
      std::vector<at::Tensor> row;
      for (const at::Tensor& y : verified) row.push_back(y.narrow(2, i, 1));
      EXPECT_LE(LargestDifference(row, decoded), 1e-5) << "kept row " << i;
    }
    EXPECT_EQ(speculating->blocks_held(), plain->blocks_held());
    for (int64_t p = c.begin + c.keep; p < 60; ++p) {
      const std::vector<at::Tensor> a = RunStep(*speculating, p, 1);
      EXPECT_LE(LargestDifference(a, RunStep(*plain, p, 1)), 1e-5) << "at " << p;
      const std::vector<at::Tensor> d = RunStep(*dense, p, 1);
      if (p < RingSlots(kSink)) {
        EXPECT_EQ(LargestDifference(a, d), 0.0) << "at " << p;
      }
    }
    // Wrapped: nothing shorter can come back; the cache goes on as it was.
    EXPECT_EQ(speculating->rollback(), nullptr);
    const int64_t held = speculating->blocks_held();
    EXPECT_EQ(speculating->Truncate(59).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(speculating->Truncate(0).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(speculating->Truncate(60).ok());  // nothing to forget
    EXPECT_TRUE(speculating->Truncate(70).ok());
    EXPECT_EQ(speculating->length(), 60);
    EXPECT_EQ(speculating->blocks_held(), held);
    EXPECT_LE(LargestDifference(RunStep(*speculating, 60, 1), RunStep(*plain, 60, 1)), 1e-5);
  }
  // A speculative step that wraps the ring cannot be undone either.
  std::shared_ptr<BlockPool> pool = FourLayerPool(8);
  std::unique_ptr<PagedKVCache> cache = EvictingCache(pool, kSink);
  ASSERT_TRUE(cache);
  ASSERT_FALSE(RunStep(*cache, 0, 11).empty());
  ASSERT_FALSE(RunStep(*cache, 11, 4, 12).empty());  // 15 entries in 12 slots
  const absl::Status refused = cache->Truncate(12);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_EQ(cache->length(), 15);
  EXPECT_FALSE(RunStep(*cache, 15, 1).empty());
  // Filling the ring exactly overwrites nothing: still undone.
  std::unique_ptr<PagedKVCache> full = EvictingCache(pool, kSink);
  ASSERT_FALSE(RunStep(*full, 0, RingSlots(kSink)).empty());
  EXPECT_TRUE(full->Truncate(5).ok());
  EXPECT_EQ(full->blocks_held(), 2);
  // Nor does a decoding step whose entry waits beside the full slots.
  std::unique_ptr<PagedKVCache> waiting = EvictingCache(pool, kSink);
  ASSERT_FALSE(RunStep(*waiting, 0, RingSlots(kSink)).empty());
  ASSERT_FALSE(RunStep(*waiting, RingSlots(kSink), 1).empty());
  EXPECT_TRUE(waiting->Truncate(RingSlots(kSink)).ok());
  EXPECT_EQ(waiting->length(), RingSlots(kSink));
}

TEST(PagedEvictionTest, CreateChecksTheBudgetAndBudgetsCoveringTheSequenceAreDense) {
  std::shared_ptr<BlockPool> pool = FourLayerPool(16);
  for (const PagedEviction bad :
       {PagedEviction{-1, 0}, PagedEviction{4, 5}, PagedEviction{4, -1}, PagedEviction{0, 1}}) {
    const absl::Status status = PagedKVCache::Create(pool, 32, bad).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << bad.budget << ", " << bad.sink_entries << ": " << status;
  }
  EXPECT_TRUE((*PagedKVCache::Create(pool, 32, PagedEviction{4, 4}))->evicts());
  EXPECT_TRUE((*PagedKVCache::Create(pool, 32, PagedEviction{30, 2}))->evicts());  // 31 slots
  EXPECT_FALSE((*PagedKVCache::Create(pool, 32, PagedEviction{0, 0}))->evicts());
  // budget + 1 >= max_sequence_length: every position fits, nothing is ever evicted.
  for (const PagedEviction covering :
       {PagedEviction{31, 2}, PagedEviction{32, 0}, PagedEviction{100, 4}}) {
    SCOPED_TRACE(testing::Message() << "budget " << covering.budget);
    std::unique_ptr<PagedKVCache> cache = *PagedKVCache::Create(pool, 32, covering);
    std::unique_ptr<PagedKVCache> dense = *PagedKVCache::Create(pool, 32);
    EXPECT_FALSE(cache->evicts());
    EXPECT_NE(cache->rollback(), nullptr);
    EXPECT_EQ(cache->BlocksToHold(32), 8);
    int64_t position = 0;
    for (const int64_t length : {20, 1, 1, 3, 1, 6}) {  // all 32 positions
      const std::vector<at::Tensor> a = RunStep(*cache, position, length);
      EXPECT_EQ(LargestDifference(a, RunStep(*dense, position, length)), 0.0);
      position += length;
    }
    EXPECT_EQ(cache->blocks_held(), 8);
    EXPECT_TRUE(cache->Truncate(3).ok());
  }
}

// The plain contract (Update) on an evicting cache: a step's view holds what the cache kept
// after the previous step (entries as written, with their positions) and the step's own; a
// chunk that wraps the ring (shorter or longer than the ring, or one that starts the cache
// longer than the budget) too, and attending over the view (AttendByPositions) is what
// UpdateAndAttend gives. Later steps see what the wrapping chunk left.
TEST(PagedEvictionTest, UpdateOnAWrappingChunkReturnsTheKeptEntriesAndTheChunk) {
  for (const RingPolicy& p : {kSink, kWindow, kAllSinks}) {
    for (const std::vector<int64_t>& schedule :
         {std::vector<int64_t>{10, 1, 1, 1, 1, 1, 1, 6, 1, 1, 1, 11, 1, 1, 2, 1},
          std::vector<int64_t>{20, 1, 5, 1, 30, 1}, std::vector<int64_t>{3, 14, 1, 9, 10, 1, 4}}) {
      SCOPED_TRACE(testing::Message() << p.policy << " budget " << p.budget << " sinks " << p.sinks
                                      << ", first step of " << schedule[0]);
      std::shared_ptr<BlockPool> pool = FourLayerPool(16);
      std::unique_ptr<PagedKVCache> cache = EvictingCache(pool, p);
      std::unique_ptr<PagedKVCache> twin = EvictingCache(pool, p);
      ASSERT_TRUE(cache && twin);
      // Every key and value written, per layer and position: [1, G, 1, hs].
      std::vector<std::vector<at::Tensor>> keys(kFourLayers), values(kFourLayers);
      at::manual_seed(59);
      int64_t position = 0;
      for (const int64_t length : schedule) {
        const KVStep step = ContiguousStep(position, length);
        ASSERT_TRUE(cache->CheckStep(step, 1).ok());
        ASSERT_TRUE(twin->CheckStep(step, 1).ok());
        for (int64_t layer = 0; layer < kFourLayers; ++layer) {
          SCOPED_TRACE(testing::Message()
                       << "layer " << layer << ", step of " << length << " at " << position);
          const LayerInputs in = RandomInputs(layer, length);
          for (int64_t t = 0; t < length; ++t) {
            keys[layer].push_back(in.k.narrow(2, t, 1));
            values[layer].push_back(in.v.narrow(2, t, 1));
          }
          const absl::StatusOr<KVView> view = cache->Update(layer, step, in.k, in.v);
          ASSERT_TRUE(view.ok()) << view.status();
          const std::vector<int64_t> expected = KeptPlusOwn(p, position, length);
          ASSERT_EQ(SortedPositions(view->positions), expected);
          ASSERT_EQ(view->keys.size(2), static_cast<int64_t>(expected.size()));
          const at::Tensor slot_positions = view->positions.reshape({-1}).to(at::kLong);
          for (int64_t s = 0; s < view->keys.size(2); ++s) {
            const int64_t pos = slot_positions[s].item<int64_t>();
            EXPECT_TRUE(at::equal(view->keys.narrow(2, s, 1), keys[layer][pos])) << "key " << pos;
            EXPECT_TRUE(at::equal(view->values.narrow(2, s, 1), values[layer][pos]))
                << "value " << pos;
          }
          const AttentionParams params = FourLayerParams(layer);
          const at::Tensor over_view = AttendByPositions(in.q, view->keys, view->values,
                                                         step.positions, view->positions, params);
          const at::Tensor attended = *twin->UpdateAndAttend(layer, step, in.q, in.k, in.v, params);
          EXPECT_LE(MaxDifference(over_view, attended), 1e-5);
        }
        position += length;
      }
      EXPECT_GT(position, 3 * RingSlots(p));
    }
  }
}

// An evicting cache takes no part in prefix sharing: it attaches nothing (its slots do not hold
// a prompt's blocks in order once the ring wraps) and publishes nothing.
TEST(PagedEvictionTest, EvictingCachesShareNoPrefixes) {
  std::shared_ptr<BlockPool> pool = TestPool(16);
  PrefixCache prefixes(pool);
  const std::vector<int64_t> ids = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::unique_ptr<PagedKVCache> writer = *PagedKVCache::Create(pool, 64);
  Fill(*writer, 10);
  writer->PublishPrefix(prefixes, ids);
  writer.reset();
  EXPECT_EQ(pool->idle_blocks(), 2);
  std::unique_ptr<PagedKVCache> evicting = *PagedKVCache::Create(pool, 64, PagedEviction{6, 2});
  ASSERT_TRUE(evicting->evicts());
  EXPECT_EQ(evicting->AttachPrefix(prefixes, ids), 0);
  EXPECT_EQ(evicting->blocks_held(), 0);
  EXPECT_EQ(evicting->length(), 0);
  EXPECT_EQ(pool->idle_blocks(), 2);  // nothing taken
  std::unique_ptr<PagedKVCache> dense = *PagedKVCache::Create(pool, 64);
  EXPECT_EQ(dense->AttachPrefix(prefixes, ids), 8);  // the prefix is there for a dense cache
  dense.reset();

  // What an evicting cache writes (before and after wrapping) is never published.
  std::shared_ptr<BlockPool> other = TestPool(16);
  PrefixCache other_prefixes(other);
  std::unique_ptr<PagedKVCache> writing = *PagedKVCache::Create(other, 64, PagedEviction{6, 2});
  Fill(*writing, 6);
  writing->PublishPrefix(other_prefixes, ids);
  Fill(*writing, 4);
  writing->PublishPrefix(other_prefixes, ids);
  writing.reset();
  EXPECT_EQ(other->idle_blocks(), 0);
  EXPECT_EQ(other->free_blocks(), 16);
  std::unique_ptr<PagedKVCache> reader = *PagedKVCache::Create(other, 64);
  EXPECT_EQ(reader->AttachPrefix(other_prefixes, ids), 0);
}

}  // namespace
}  // namespace lgpt
