// A request's paged cache over the block pool (cache/block_pool_test.cc tests the pool): a
// paged cache attends as the dense cache does (steps crossing block boundaries, windows,
// grouped queries), blocks come back on Reset and destruction, a full pool refuses a step
// without taking anything, and steps that do not continue the stream are refused. With a prefix
// cache (cache/prefix_cache_test.cc tests its keys): chains found block by block, LRU eviction
// of unreferenced cached blocks, copy-on-write of shared blocks.
#include "cache/paged_kv_cache.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cache/dense_kv_cache.h"
#include "cache/kv_cache_factory.h"
#include "cache/kv_codec.h"
#include "cache/rollback_test_util.h"
#include "cache/test_pools.h"
#include "core/base/device.h"
#include "core/ops/decode_attention.h"
#include "core/ops/paged_attention.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

KVStep Step(int64_t begin, int64_t length) {
  KVStep step;
  step.positions = at::arange(begin, begin + length, at::kLong).unsqueeze(0);
  step.min_position = begin;
  step.max_position = begin + length - 1;
  return step;
}

TEST(PagedKVCacheTest, AttendsAsTheDenseCache) {
  std::shared_ptr<BlockPool> pool = TestPool(16);
  std::unique_ptr<PagedKVCache> paged = *PagedKVCache::Create(pool, 64);
  DenseKVCacheOptions dense_options;
  static_cast<KVCacheGeometry&>(dense_options) = TestPoolGeometry();
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
  std::shared_ptr<BlockPool> pool = TestPool(3);
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

// Writes `length` random entries at the cache's end in every layer; layer 0's keys after it.
at::Tensor Fill(PagedKVCache& cache, int64_t length) {
  const KVStep step = Step(cache.length(), length);
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
  EXPECT_TRUE(cache->CheckStep(Step(5, 1), 1).ok());  // the stream goes on at 5
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
        const KVStep step = Step(position, length);
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
      const KVStep last = Step(position, 1);
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
      const KVStep step = Step(position, length);
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
    const KVStep last = Step(position, 1);
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
    const KVStep step = Step(position, length);
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

// A pool on the GPU: decoding steps go through the CUDA paged decode kernel over the block
// table, prompt chunks through the generic path; both equal the CPU pool's, for every entry
// kind (float32, bfloat16, int8, int4).
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
    SCOPED_TRACE(testing::Message() << entries.dtype << " " << entries.bits << " bits");
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
    std::unique_ptr<PagedKVCache> cpu = *PagedKVCache::Create(pools[0], 64);
    std::unique_ptr<PagedKVCache> gpu = *PagedKVCache::Create(pools[1], 64);
    at::manual_seed(23);
    int64_t position = 0;
    for (const int64_t length : {6, 1, 1, 3, 1, 1, 1, 9, 1, 1}) {
      const KVStep step = Step(position, length);
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

}  // namespace
}  // namespace lgpt
