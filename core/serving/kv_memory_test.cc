// KVMemory: the pool a byte budget buys, the cache kind each request gets, and a lease's
// memory through Reserve / Settle / Release / Close and prefix sharing.
#include "core/serving/kv_memory.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <vector>

#include "cache/paged_kv_cache.h"
#include "cache/scored_paged_kv_cache.h"

namespace lgpt {
namespace {

constexpr int64_t kGroups = 2, kHeadSize = 8, kBlock = 4;

KVCacheGeometry Geometry() {
  KVCacheGeometry geometry;
  geometry.layers = {{kGroups, kHeadSize, 0}, {kGroups, kHeadSize, 0}};
  return geometry;
}

// Bytes of one block: keys and values of both layers in float32.
constexpr int64_t kBlockBytes = 2 * 2 * kGroups * kBlock * kHeadSize * 4;

std::unique_ptr<KVMemory> Memory(int64_t blocks, bool prefix_caching = true) {
  KVMemoryOptions options;
  options.pool_bytes = blocks * kBlockBytes;
  options.entries_per_block = kBlock;
  options.prefix_caching = prefix_caching;
  absl::StatusOr<std::unique_ptr<KVMemory>> memory = KVMemory::Create(Geometry(), options);
  EXPECT_TRUE(memory.ok()) << memory.status();
  return memory.ok() ? *std::move(memory) : nullptr;
}

KVCacheSpec Sink() {
  KVCacheSpec spec;
  spec.policy = "sink";
  spec.budget = 8;
  return spec;
}

// A scoring policy a pool's blocks keep (cache/scored_paged_kv_cache.h).
KVCacheSpec H2O() {
  KVCacheSpec spec;
  spec.policy = "h2o";
  spec.budget = 8;
  return spec;
}

// A scoring policy whose priorities span the row (qh2o's normalised quantisation error): a
// cache of its own, charged to the pool.
KVCacheSpec Charged() {
  KVCacheSpec spec;
  spec.policy = "qh2o";
  spec.bits = 8;
  spec.budget = 8;
  return spec;
}

// Writes `count` entries at positions [from, from + count) into every layer of `cache`.
void Fill(KVCache& cache, int64_t from, int64_t count) {
  KVStep step;
  step.positions = at::arange(from, from + count, at::kLong).unsqueeze(0);
  step.min_position = from;
  step.max_position = from + count - 1;
  ASSERT_TRUE(cache.CheckStep(step, 1).ok());
  const at::Tensor kv = at::randn({1, kGroups, count, kHeadSize});
  AttentionParams params;
  params.scale = 0.5;
  for (int64_t layer = 0; layer < 2; ++layer) {
    ASSERT_TRUE(cache.UpdateAndAttend(layer, step, kv, kv, kv, params).ok());
  }
}

TEST(KVMemoryTest, PoolSizedFromBytes) {
  KVMemoryOptions options;
  options.entries_per_block = kBlock;
  options.pool_bytes = 10 * kBlockBytes + kBlockBytes / 2;
  absl::StatusOr<BlockPoolOptions> pool = KVMemory::PoolFor(Geometry(), options);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->num_blocks, 10);
  EXPECT_EQ(pool->entries_per_block, kBlock);
  options.pool_bytes = kBlockBytes - 1;  // less than one block
  EXPECT_EQ(KVMemory::PoolFor(Geometry(), options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.entries_per_block = int64_t{1} << 60;  // overflows bytes per block: still refused
  options.pool_bytes = int64_t{1} << 40;
  EXPECT_EQ(KVMemory::PoolFor(Geometry(), options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A float32 model's pool of 16-bit entries: the same bytes buy twice the blocks, and the pool's
// blocks, statistics and dense caches follow; caches with storage of their own keep the
// model's dtype.
TEST(KVMemoryTest, SixteenBitEntriesDoubleThePoolsBlocks) {
  for (const c10::ScalarType dtype : {c10::kBFloat16, c10::kHalf}) {
    KVMemoryOptions options;
    options.entries_per_block = kBlock;
    options.pool_bytes = 10 * kBlockBytes;
    options.entry_dtype = dtype;
    absl::StatusOr<BlockPoolOptions> sized = KVMemory::PoolFor(Geometry(), options);
    ASSERT_TRUE(sized.ok()) << sized.status();
    EXPECT_EQ(sized->num_blocks, 20);
    options.pool_bytes = kBlockBytes / 2 - 1;  // less than one 16-bit block
    EXPECT_EQ(KVMemory::PoolFor(Geometry(), options).status().code(),
              absl::StatusCode::kInvalidArgument);
    options.pool_bytes = 10 * kBlockBytes;
    std::unique_ptr<KVMemory> memory = *KVMemory::Create(Geometry(), options);
    ASSERT_NE(memory->pool(), nullptr);
    EXPECT_EQ(memory->pool()->dtype(), dtype);
    const KVMemoryStats stats = memory->Stats();
    EXPECT_EQ(stats.blocks, 20);
    EXPECT_EQ(stats.block_bytes, kBlockBytes / 2);
    std::unique_ptr<KVCache> dense = *memory->NewCache(KVCacheSpec(), Geometry(), 32);
    auto* paged = dynamic_cast<PagedKVCache*>(dense.get());
    ASSERT_NE(paged, nullptr);
    EXPECT_EQ(paged->pool()->dtype(), dtype);
    KVLease lease = *memory->Lease(std::move(dense), 32, true);
    Fill(*lease.cache(), 0, 9);  // 3 blocks
    EXPECT_EQ(lease.cache()->AllocatedBytes(), 3 * kBlockBytes / 2);
    EXPECT_EQ(memory->Stats().blocks_used, 3);
    memory->Close(lease);
    EXPECT_EQ(memory->free_blocks(), 20);
  }
}

// int8 / int4 pool entries (head size 8: one float16 scale an entry): the bytes buy 3.2x /
// 5.3x the float32 blocks; dense requests are paged in it, requests with a quantised spec keep
// their policy caches (storage of their own, charged to the pool).
TEST(KVMemoryTest, QuantisedEntriesArePagedForDenseRequests) {
  for (const int bits : {8, 4}) {
    KVMemoryOptions options;
    options.entries_per_block = kBlock;
    options.pool_bytes = 64 * kBlockBytes;
    options.entry_bits = bits;
    std::unique_ptr<KVMemory> memory = *KVMemory::Create(Geometry(), options);
    const int64_t block_bytes = 2 * 2 * kGroups * kBlock * (kHeadSize * bits / 8 + 2);
    EXPECT_EQ(memory->Stats().block_bytes, block_bytes);
    EXPECT_EQ(memory->Stats().blocks, 64 * kBlockBytes / block_bytes);
    const auto paged_in_pool = [&](const KVCacheSpec& spec) {
      std::unique_ptr<KVCache> cache = *memory->NewCache(spec, Geometry(), 32);
      auto* paged = dynamic_cast<PagedKVCache*>(cache.get());
      return paged != nullptr && paged->pool() == memory->pool().get();
    };
    KVCacheSpec spec;
    EXPECT_TRUE(paged_in_pool(spec));
    spec.bits = bits;
    spec.residual = 0;
    EXPECT_FALSE(paged_in_pool(spec));
    spec.bits = 12 - bits;  // the other width
    EXPECT_FALSE(paged_in_pool(spec));
  }
}

TEST(KVMemoryTest, PoolDtypeOptionNamesTheField) {
  const c10::Device cpu(c10::kCPU), cuda(c10::kCUDA);
  const auto dtype = [&](const char* name, c10::ScalarType model, c10::Device device) {
    const KVPoolEntries entries = *KVPoolEntriesFor(name, model, device, "f");
    EXPECT_EQ(entries.bits, 16) << name;
    return entries.dtype;
  };
  EXPECT_EQ(dtype("auto", c10::kFloat, cpu), c10::kBFloat16);
  EXPECT_EQ(dtype("auto", c10::kBFloat16, cpu), c10::kBFloat16);
  EXPECT_EQ(dtype("auto", c10::kFloat, cuda), c10::kFloat);
  EXPECT_EQ(dtype("model", c10::kFloat, cpu), c10::kFloat);
  EXPECT_EQ(dtype("float32", c10::kBFloat16, cpu), c10::kFloat);
  EXPECT_EQ(dtype("bfloat16", c10::kFloat, cpu), c10::kBFloat16);
  EXPECT_EQ(dtype("float16", c10::kFloat, cpu), c10::kHalf);
  EXPECT_EQ(KVPoolEntriesFor("int8", c10::kFloat, cpu, "f")->bits, 8);
  EXPECT_EQ(KVPoolEntriesFor("int4", c10::kBFloat16, cuda, "f")->bits, 4);
  const absl::Status bad =
      KVPoolEntriesFor("int2", c10::kFloat, cpu, "EngineOptions.kv_pool_dtype").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("EngineOptions.kv_pool_dtype"), std::string::npos) << bad;
  EXPECT_NE(bad.message().find("int2"), std::string::npos) << bad;
}

TEST(KVMemoryTest, WithoutAPoolRequestsKeepTheirOwnCaches) {
  absl::StatusOr<std::unique_ptr<KVMemory>> memory = KVMemory::Create(Geometry(), {});
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_EQ((*memory)->pool(), nullptr);
  std::unique_ptr<KVCache> cache = *(*memory)->NewCache(KVCacheSpec(), Geometry(), 32);
  EXPECT_EQ(dynamic_cast<PagedKVCache*>(cache.get()), nullptr);
  absl::StatusOr<KVLease> lease = (*memory)->Lease(std::move(cache), 32, true);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->use(), KVLease::Use::kNone);
  EXPECT_FALSE(lease->shares_prefixes());
  EXPECT_TRUE((*memory)->Reserve(*lease, 1000).ok());
  EXPECT_EQ((*memory)->BlocksForStep(*lease, 1000, true), 0);
  EXPECT_EQ((*memory)->Stats().blocks, 0);
}

TEST(KVMemoryTest, DenseRequestsArePagedOthersCharged) {
  std::unique_ptr<KVMemory> memory = Memory(16);
  std::unique_ptr<KVCache> dense = *memory->NewCache(KVCacheSpec(), Geometry(), 32);
  ASSERT_NE(dynamic_cast<PagedKVCache*>(dense.get()), nullptr);
  KVLease paged = *memory->Lease(std::move(dense), 32, true);
  EXPECT_EQ(paged.use(), KVLease::Use::kBlocks);
  EXPECT_TRUE(paged.shares_prefixes());
  // A request from another position shares no prefixes.
  EXPECT_FALSE(memory->Lease(*memory->NewCache(KVCacheSpec(), Geometry(), 32), 32, false)
                   ->shares_prefixes());
  KVLease charged = *memory->Lease(*memory->NewCache(Charged(), Geometry(), 32), 32, true);
  EXPECT_EQ(charged.use(), KVLease::Use::kBytes);
  EXPECT_FALSE(charged.shares_prefixes());
  EXPECT_TRUE(KVMemory::Bounded(charged));
  EXPECT_FALSE(KVMemory::Bounded(paged));
}

TEST(KVMemoryTest, SinkAndWindowRequestsArePagedInABoundedRing) {
  std::unique_ptr<KVMemory> memory = Memory(16);
  KVCacheSpec window;
  window.policy = "window";
  window.budget = 6;
  for (const KVCacheSpec& spec : {Sink(), window}) {
    SCOPED_TRACE(spec.policy);
    std::unique_ptr<KVCache> cache = *memory->NewCache(spec, Geometry(), 32);
    auto* paged = dynamic_cast<PagedKVCache*>(cache.get());
    ASSERT_NE(paged, nullptr);
    EXPECT_TRUE(paged->evicts());
    KVLease lease = *memory->Lease(std::move(cache), 32, true);
    EXPECT_EQ(lease.use(), KVLease::Use::kBlocks);
    EXPECT_FALSE(lease.shares_prefixes());  // its blocks are overwritten as the ring turns
    EXPECT_TRUE(KVMemory::Bounded(lease));
    // `budget` slots in blocks of 4, whatever the length.
    const int64_t bound = (spec.budget + kBlock - 1) / kBlock;
    EXPECT_EQ(memory->BlocksForStep(lease, 30, /*started=*/false), bound);
    ASSERT_TRUE(memory->Reserve(lease, 3).ok());
    Fill(*lease.cache(), 0, 3);
    for (int64_t position = 3; position < 30; ++position) {
      ASSERT_TRUE(memory->Reserve(lease, 1).ok());
      Fill(*lease.cache(), position, 1);
      EXPECT_LE(paged->blocks_held(), bound);
    }
    EXPECT_EQ(paged->blocks_held(), bound);
    EXPECT_EQ(memory->BlocksForStep(lease, 100, /*started=*/true), 0);
    memory->Close(lease);
    EXPECT_EQ(memory->free_blocks(), 16);
  }
  // What a ring cannot serve keeps a cache of its own: explicit int8 entries, cache positions,
  // a pyramid budget, a sliding-window model.
  KVCacheSpec int8 = Sink();
  int8.bits = 8;
  KVCacheSpec shifting = Sink();
  shifting.positions = "cache";
  KVCacheSpec pyramid = Sink();
  pyramid.budget_rule = "pyramid";
  for (const KVCacheSpec& spec : {int8, shifting, pyramid}) {
    EXPECT_EQ(dynamic_cast<PagedKVCache*>(memory->NewCache(spec, Geometry(), 32)->get()), nullptr)
        << DescribeKVCacheSpec(spec);
  }
  // A sliding-window layer whose window the recent entries do not cover (sink budget 8 with 4
  // sinks: 4 recent entries, a window of 8); one they cover is paged.
  KVCacheGeometry sliding = Geometry();
  sliding.layers[1].sliding_window = 8;
  EXPECT_EQ(dynamic_cast<PagedKVCache*>(memory->NewCache(Sink(), sliding, 32)->get()), nullptr);
  sliding.layers[1].sliding_window = 5;
  EXPECT_NE(dynamic_cast<PagedKVCache*>(memory->NewCache(Sink(), sliding, 32)->get()), nullptr);
  EXPECT_NE(dynamic_cast<PagedKVCache*>(memory->NewCache(window, sliding, 32)->get()), nullptr);
  // A bad spec is refused with its field.
  KVCacheSpec bad = Sink();
  bad.budget = 2;  // below its 4 sink tokens
  EXPECT_EQ(memory->NewCache(bad, Geometry(), 32).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// h2o and tova requests keep budget + 1 slots in pool blocks, admitted by that bound (float32,
// bfloat16 and float16 models alike); what they cannot serve keeps a cache of its own.
TEST(KVMemoryTest, ScoringRequestsArePagedInTheirSlots) {
  std::unique_ptr<KVMemory> memory = Memory(16);
  KVCacheSpec tova = H2O();
  tova.policy = "tova";
  for (const KVCacheSpec& spec : {H2O(), tova}) {
    SCOPED_TRACE(spec.policy);
    std::unique_ptr<KVCache> cache = *memory->NewCache(spec, Geometry(), 32);
    auto* scored = dynamic_cast<ScoredPagedKVCache*>(cache.get());
    ASSERT_NE(scored, nullptr);
    EXPECT_EQ(scored->pool(), memory->pool().get());
    KVLease lease = *memory->Lease(std::move(cache), 32, true);
    EXPECT_EQ(lease.use(), KVLease::Use::kBlocks);
    EXPECT_FALSE(lease.shares_prefixes());
    EXPECT_TRUE(KVMemory::Bounded(lease));
    // budget + 1 = 9 slots in blocks of 4, whatever the length.
    const int64_t bound = (spec.budget + 1 + kBlock - 1) / kBlock;
    EXPECT_EQ(memory->BlocksForStep(lease, 30, /*started=*/false), bound);
    ASSERT_TRUE(memory->Reserve(lease, 3).ok());
    Fill(*lease.cache(), 0, 3);
    for (int64_t position = 3; position < 30; ++position) {
      ASSERT_TRUE(memory->Reserve(lease, 1).ok());
      Fill(*lease.cache(), position, 1);
      EXPECT_LE(scored->blocks_held(), bound);
    }
    EXPECT_EQ(scored->blocks_held(), bound);
    EXPECT_EQ(memory->BlocksForStep(lease, 1, /*started=*/true), 0);
    memory->Release(lease);  // preempted: the blocks back, the cache kept
    EXPECT_EQ(memory->free_blocks(), 16);
    memory->Close(lease);
  }
  for (const c10::ScalarType dtype : {c10::kBFloat16, c10::kHalf}) {
    KVCacheGeometry geometry = Geometry();
    geometry.dtype = dtype;
    EXPECT_NE(dynamic_cast<ScoredPagedKVCache*>(memory->NewCache(tova, geometry, 32)->get()),
              nullptr)
        << c10::toString(dtype);
  }
  KVCacheSpec int8 = H2O();
  int8.bits = 8;
  for (const auto& [spec, geometry] :
       {std::make_pair(Charged(), Geometry()), std::make_pair(int8, Geometry())}) {
    EXPECT_EQ(dynamic_cast<ScoredPagedKVCache*>(memory->NewCache(spec, geometry, 32)->get()),
              nullptr)
        << DescribeKVCacheSpec(spec, geometry.dtype);
  }
  KVCacheSpec bad = H2O();
  bad.budget = 0;
  EXPECT_EQ(memory->NewCache(bad, Geometry(), 32).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KVMemoryTest, RefusesRequestsLargerThanThePool) {
  std::unique_ptr<KVMemory> memory = Memory(4);
  // 17 entries need 5 blocks of 4.
  EXPECT_EQ(
      memory->Lease(*memory->NewCache(KVCacheSpec(), Geometry(), 64), 17, true).status().code(),
      absl::StatusCode::kResourceExhausted);
  // The cache's own length bounds it: 16 entries fit.
  EXPECT_TRUE(memory->Lease(*memory->NewCache(KVCacheSpec(), Geometry(), 16), 100, true).ok());
}

TEST(KVMemoryTest, PagedLeaseTakesAndGivesBackBlocks) {
  std::unique_ptr<KVMemory> memory = Memory(8);
  KVLease lease = *memory->Lease(*memory->NewCache(KVCacheSpec(), Geometry(), 32), 32, true);
  EXPECT_EQ(memory->BlocksForStep(lease, 5, /*started=*/false), 2);
  ASSERT_TRUE(memory->Reserve(lease, 5).ok());
  EXPECT_TRUE(memory->Holds(lease));
  EXPECT_EQ(memory->free_blocks(), 6);
  Fill(*lease.cache(), 0, 5);
  EXPECT_EQ(memory->BlocksForStep(lease, 3, /*started=*/true), 0);  // room in block 2
  EXPECT_EQ(memory->BlocksForStep(lease, 4, /*started=*/true), 1);
  memory->Release(lease);  // preempted: blocks back, the cache kept
  EXPECT_FALSE(memory->Holds(lease));
  EXPECT_EQ(memory->free_blocks(), 8);
  ASSERT_NE(lease.cache(), nullptr);
  // More than the pool holds: refused, taking nothing.
  EXPECT_EQ(memory->Reserve(lease, 33).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(memory->free_blocks(), 8);
  ASSERT_TRUE(memory->Reserve(lease, 4).ok());
  memory->Close(lease);
  EXPECT_EQ(lease.cache(), nullptr);
  EXPECT_EQ(memory->free_blocks(), 8);
}

TEST(KVMemoryTest, ChargedLeaseReservesItsGrowthAndSettles) {
  std::unique_ptr<KVMemory> memory = Memory(16);
  KVLease lease = *memory->Lease(*memory->NewCache(Charged(), Geometry(), 32), 32, true);
  const int64_t step_bound = lease.cache()->storage_bound()->BytesAfterStep(3);
  EXPECT_EQ(memory->BlocksForStep(lease, 3, true), memory->pool()->BlocksForBytes(step_bound));
  ASSERT_TRUE(memory->Reserve(lease, 3).ok());
  EXPECT_EQ(lease.charged_bytes(), step_bound);
  EXPECT_EQ(memory->charged_blocks(), memory->pool()->BlocksForBytes(step_bound));
  EXPECT_TRUE(memory->Holds(lease));
  Fill(*lease.cache(), 0, 3);
  memory->Settle(lease);  // at most what the cache holds now
  const int64_t used = lease.cache()->AllocatedBytes() + lease.cache()->IndexBytes();
  EXPECT_EQ(lease.charged_bytes(), std::min(step_bound, used));
  EXPECT_EQ(memory->charged_blocks(), memory->pool()->BlocksForBytes(lease.charged_bytes()));
  memory->Release(lease);
  EXPECT_EQ(lease.charged_bytes(), 0);
  EXPECT_EQ(lease.cache()->AllocatedBytes(), 0);
  EXPECT_EQ(memory->charged_blocks(), 0);
  ASSERT_TRUE(memory->Reserve(lease, 3).ok());
  memory->Close(lease);
  EXPECT_EQ(memory->charged_blocks(), 0);
}

TEST(KVMemoryTest, PublishedPrefixesAttachToLaterLeases) {
  for (bool prefix_caching : {true, false}) {
    SCOPED_TRACE(prefix_caching ? "prefix caching" : "no prefix caching");
    std::unique_ptr<KVMemory> memory = Memory(16, prefix_caching);
    std::vector<int64_t> tokens(10);
    std::iota(tokens.begin(), tokens.end(), 3);
    KVLease first = *memory->Lease(*memory->NewCache(KVCacheSpec(), Geometry(), 32), 32, true);
    ASSERT_TRUE(memory->Reserve(first, 10).ok());
    Fill(*first.cache(), 0, 10);
    memory->Publish(first, tokens);  // two full blocks
    KVLease second = *memory->Lease(*memory->NewCache(KVCacheSpec(), Geometry(), 32), 32, true);
    EXPECT_EQ(memory->AttachPrefix(second, tokens), prefix_caching ? 8 : 0);
    KVLease elsewhere = *memory->Lease(*memory->NewCache(KVCacheSpec(), Geometry(), 32), 32,
                                       /*from_start=*/false);
    EXPECT_EQ(memory->AttachPrefix(elsewhere, tokens), 0);
  }
}

}  // namespace
}  // namespace lgpt
