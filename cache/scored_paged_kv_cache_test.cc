// ScoredPagedKVCache against PolicyKVCache of the same policy: the same random streams of
// prompt chunks and decoding steps through both, outputs and kept positions compared; narrow
// pools against a float32 pool of their stored entries; the block bound, forks and errors.
#include "cache/scored_paged_kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <iostream>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "cache/block_pool.h"
#include "cache/dense_kv_cache.h"
#include "cache/policy_kv_cache.h"
#include "cache/test_pools.h"
#include "core/base/device.h"
#include "core/base/dtype_support.h"
#include "core/base/status_field.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

EvictionPolicyOptions Policy(PolicyKind kind, int64_t budget, bool normalize = false) {
  EvictionPolicyOptions policy;
  policy.kind = kind;
  policy.budget = budget;
  policy.normalize_scores = normalize;
  return policy;
}

// h2o with half its budget recent, tova without a recent window, h2o normalised with a budget
// of one block and a bit, per-layer budgets, and h2o-vlen (scores weighed by value norms).
std::vector<EvictionPolicyOptions> Policies() {
  EvictionPolicyOptions pyramid = Policy(PolicyKind::kH2O, 8);
  pyramid.layer_budgets = {12, 9, 7, 4};
  return {Policy(PolicyKind::kH2O, 12), Policy(PolicyKind::kTova, 9),
          Policy(PolicyKind::kH2O, 5, /*normalize=*/true), pyramid,
          Policy(PolicyKind::kH2OVlen, 10)};
}

// Where the slot work runs: the host's loops, and the device's tensor operations on a CPU pool.
constexpr ScoredSlotWork kSlotWorks[] = {ScoredSlotWork::kHost, ScoredSlotWork::kPoolDevice};

const char* SlotWorkName(ScoredSlotWork work) {
  return work == ScoredSlotWork::kHost ? "host slot work" : "device slot work";
}

std::unique_ptr<ScoredPagedKVCache> ScoredCache(std::shared_ptr<BlockPool> pool,
                                                const EvictionPolicyOptions& policy,
                                                ScoredSlotWork work = ScoredSlotWork::kAuto) {
  ScoredPagedKVCacheOptions options;
  options.pool = std::move(pool);
  options.max_sequence_length = kFourLayerContext;
  options.policy = policy;
  options.slot_work = work;
  absl::StatusOr<std::unique_ptr<ScoredPagedKVCache>> cache = ScoredPagedKVCache::Create(options);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return cache.ok() ? std::move(*cache) : nullptr;
}

std::unique_ptr<PolicyKVCache> PolicyCache(const EvictionPolicyOptions& policy,
                                           at::ScalarType dtype = at::kFloat,
                                           const KVCacheGeometry& geometry = FourLayerGeometry()) {
  PolicyKVCacheOptions options;
  static_cast<KVCacheGeometry&>(options) = geometry;
  options.dtype = dtype;
  options.policy = policy;
  absl::StatusOr<std::unique_ptr<PolicyKVCache>> cache = PolicyKVCache::Create(options);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return cache.ok() ? std::move(*cache) : nullptr;
}

std::unique_ptr<DenseKVCache> DenseCache(at::ScalarType dtype = at::kFloat) {
  DenseKVCacheOptions options;
  static_cast<KVCacheGeometry&>(options) = FourLayerGeometry();
  options.dtype = dtype;
  absl::StatusOr<std::unique_ptr<DenseKVCache>> cache = DenseKVCache::Create(options);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return cache.ok() ? std::move(*cache) : nullptr;
}

// Step lengths: prompt chunks short and longer than the budgets, chunks that start the cache
// beyond the budget, single entries, and long runs of decoding steps; each under kFourLayerContext.
std::vector<std::vector<int64_t>> Schedules() {
  const auto stream = [](std::initializer_list<std::pair<int64_t, int64_t>> runs) {
    std::vector<int64_t> lengths;
    for (const auto& [length, repeats] : runs) lengths.insert(lengths.end(), repeats, length);
    return lengths;
  };
  return {
      stream({{20, 1}, {1, 12}, {3, 1}, {1, 7}, {14, 1}, {1, 25}, {5, 1}, {1, 9}, {2, 1}, {1, 6}}),
      stream({{2, 1}, {1, 1}, {19, 1}, {1, 10}, {9, 1}, {1, 5}, {10, 1}, {1, 20}, {13, 1}, {1, 8}}),
      stream({{1, 40}, {3, 1}, {1, 10}, {11, 1}, {1, 30}}),
  };
}

int64_t MostBlocks(const EvictionPolicyOptions& policy, int64_t entries_per_block) {
  int64_t budget = policy.budget;
  for (int64_t b : policy.layer_budgets) budget = std::max(budget, b);
  return (budget + 1 + entries_per_block - 1) / entries_per_block;
}

// The same random keys, values and queries (seeded with `seed`, in `dtype`) through a scored
// paged cache over `pool`, the policy cache of `policy` in `dtype` and a dense cache, over
// `schedule`: every output equal to the policy cache's to the bit and the same positions kept in
// every layer and group after every step; the paged cache never holds more than its slots'
// blocks. `from_dense`: the largest difference from the dense cache's outputs.
void ExpectAttendsAsThePolicyCache(const EvictionPolicyOptions& policy,
                                   std::shared_ptr<BlockPool> pool, at::ScalarType dtype,
                                   const std::vector<int64_t>& schedule, uint64_t seed,
                                   double* from_dense,
                                   ScoredSlotWork work = ScoredSlotWork::kAuto) {
  std::unique_ptr<ScoredPagedKVCache> paged = ScoredCache(std::move(pool), policy, work);
  std::unique_ptr<PolicyKVCache> reference = PolicyCache(policy, dtype);
  std::unique_ptr<DenseKVCache> dense = DenseCache(dtype);
  ASSERT_TRUE(paged && reference && dense);
  at::manual_seed(seed);
  int64_t position = 0;
  *from_dense = 0;
  for (const int64_t length : schedule) {
    const KVStep step = ContiguousStep(position, length);
    for (KVCache* cache :
         {static_cast<KVCache*>(paged.get()), static_cast<KVCache*>(reference.get()),
          static_cast<KVCache*>(dense.get())}) {
      ASSERT_TRUE(cache->CheckStep(step, 1).ok()) << cache->DebugName();
    }
    for (int64_t layer = 0; layer < kFourLayers; ++layer) {
      SCOPED_TRACE(testing::Message()
                   << "layer " << layer << ", step of " << length << " at " << position);
      const LayerInputs in = RandomInputs(layer, length);
      const at::Tensor q = in.q.to(dtype), k = in.k.to(dtype), v = in.v.to(dtype);
      const AttentionParams params = FourLayerParams(layer);
      const absl::StatusOr<at::Tensor> a = paged->UpdateAndAttend(layer, step, q, k, v, params);
      const absl::StatusOr<at::Tensor> b = reference->UpdateAndAttend(layer, step, q, k, v, params);
      const absl::StatusOr<at::Tensor> c = dense->UpdateAndAttend(layer, step, q, k, v, params);
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(b.ok() && c.ok());
      ASSERT_EQ(a->scalar_type(), dtype);
      EXPECT_TRUE(at::equal(*a, *b)) << MaxDifference(a->to(at::kFloat), b->to(at::kFloat));
      *from_dense = std::max(*from_dense, MaxDifference(a->to(at::kFloat), c->to(at::kFloat)));
      for (int64_t g = 0; g < FourLayerGeometry().layers[layer].n_query_groups; ++g) {
        ASSERT_EQ(paged->KeptPositions(layer, g), reference->KeptPositions(layer, 0, g))
            << "group " << g;
      }
    }
    position += length;
    EXPECT_LE(paged->blocks_held(), MostBlocks(policy, 4)) << "at " << position;
  }
}

// The same random keys, values and queries through the scored paged cache (float32 pool), the
// policy cache of the same policy and a dense cache, over streams mixing prompt chunks and
// decoding steps: every output equal to the policy cache's to the bit, the same positions kept
// in every layer and group after every step, and (so the check has teeth) outputs unlike the
// dense cache's once entries were evicted. The paged cache never holds more than its slots'
// blocks. Both slot works.
TEST(ScoredPagedKVCacheTest, AttendsAndEvictsAsThePolicyCacheToTheBit) {
  for (const ScoredSlotWork work : kSlotWorks) {
    for (const EvictionPolicyOptions& policy : Policies()) {
      for (const std::vector<int64_t>& schedule : Schedules()) {
        SCOPED_TRACE(testing::Message()
                     << SlotWorkName(work) << ", " << PolicyName(policy.kind) << " budget "
                     << policy.budget << " layer budgets " << policy.layer_budgets.size()
                     << ", stream of " << schedule.size() << " steps");
        double from_dense = 0;
        ExpectAttendsAsThePolicyCache(policy, FourLayerPool(16), at::kFloat, schedule, 43,
                                      &from_dense, work);
        if (HasFatalFailure()) return;
        EXPECT_GT(from_dense, 1e-3);
      }
    }
  }
}

// A pool of bfloat16, int8 or int4 entries attends as a float32 pool fed its stored entries
// (to the bit for 16-bit entries; within 1e-5 for quantised ones, which the decode kernel
// dequantises in registers), so every query reads every entry as stored and the scores come
// from those reads; until the first eviction, within a tolerance of the float32 pool fed the
// entries themselves.
TEST(ScoredPagedKVCacheTest, NarrowPoolsAttendAsAFloat32PoolOfTheirStoredEntries) {
  for (const ScoredSlotWork work : kSlotWorks) {
    for (const PoolKind& kind : {kBFloat16Entries, kInt8Entries, kInt4Entries}) {
      const double tolerance = kind.bits == 4 ? 0.6 : kind.bits == 8 ? 0.05 : 0.03;
      for (const EvictionPolicyOptions& policy :
           {Policy(PolicyKind::kH2O, 12), Policy(PolicyKind::kTova, 9)}) {
        SCOPED_TRACE(testing::Message()
                     << SlotWorkName(work) << ", " << kind.name << " " << PolicyName(policy.kind));
        std::unique_ptr<ScoredPagedKVCache> narrow =
            ScoredCache(FourLayerPool(16, kind), policy, work);
        std::unique_ptr<ScoredPagedKVCache> rounded = ScoredCache(FourLayerPool(16), policy, work);
        std::unique_ptr<ScoredPagedKVCache> exact = ScoredCache(FourLayerPool(16), policy, work);
        ASSERT_TRUE(narrow && rounded && exact);
        at::manual_seed(47);
        int64_t position = 0;
        double largest_error = 0;
        const std::vector<int64_t> schedule = Schedules()[0];
        for (const int64_t length : schedule) {
          const KVStep step = ContiguousStep(position, length);
          for (ScoredPagedKVCache* cache : {narrow.get(), rounded.get(), exact.get()}) {
            ASSERT_TRUE(cache->CheckStep(step, 1).ok());
          }
          for (int64_t layer = 0; layer < kFourLayers; ++layer) {
            SCOPED_TRACE(testing::Message()
                         << "layer " << layer << ", step of " << length << " at " << position);
            const LayerInputs in = RandomInputs(layer, length);
            const AttentionParams params = FourLayerParams(layer);
            const absl::StatusOr<at::Tensor> narrowed =
                narrow->UpdateAndAttend(layer, step, in.q, in.k, in.v, params);
            const absl::StatusOr<at::Tensor> stored = rounded->UpdateAndAttend(
                layer, step, in.q, StoredAs(kind, in.k), StoredAs(kind, in.v), params);
            const absl::StatusOr<at::Tensor> full =
                exact->UpdateAndAttend(layer, step, in.q, in.k, in.v, params);
            ASSERT_TRUE(narrowed.ok()) << narrowed.status();
            ASSERT_TRUE(stored.ok() && full.ok());
            const at::Tensor &a = *narrowed, &b = *stored, &e = *full;
            if (kind.bits == 16) {
              EXPECT_TRUE(at::equal(a, b)) << MaxDifference(a, b);
            } else {
              EXPECT_LE(MaxDifference(a, b), 1e-5);
            }
            // Until something is evicted; then the narrowed scores may choose other entries.
            const double error = MaxDifference(a, e);
            if (position + length <= policy.budget) {
              EXPECT_LE(error, tolerance);
            }
            largest_error = std::max(largest_error, error);
          }
          position += length;
        }
        EXPECT_GT(largest_error, 0.0);  // the entries really were narrowed
      }
    }
  }
}

// A bfloat16 or float16 model's keys, values and queries through the scored paged cache over a
// pool of the model's dtype (the serving default for such models) and over a float32 pool (which
// holds them exactly), and through the policy cache of the same policy in that dtype: every
// output equal to the policy cache's to the bit, the same positions kept, and outputs unlike a
// dense cache's once entries were evicted. (float16 where this LibTorch computes in it on the
// CPU; the test says when it does not.)
TEST(ScoredPagedKVCacheTest, SixteenBitModelsAttendAsThePolicyCache) {
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    if (!MultipliesMatrices(c10::Device(c10::kCPU), dtype)) {
      std::cout << "[   NOTE   ] " << c10::toString(dtype)
                << " models not tested: this LibTorch has no CPU matmul in that dtype\n";
      RecordProperty("untested_model_dtype", c10::toString(dtype));
      continue;
    }
    const PoolKind model_entries{"model", dtype, 16};
    for (const PoolKind& kind : {model_entries, kFloat32Entries}) {
      for (const EvictionPolicyOptions& policy :
           {Policy(PolicyKind::kH2O, 12), Policy(PolicyKind::kTova, 9)}) {
        for (const ScoredSlotWork work : kSlotWorks) {
          SCOPED_TRACE(testing::Message()
                       << SlotWorkName(work) << ", " << c10::toString(dtype) << " model, "
                       << c10::toString(kind.dtype) << " pool, " << PolicyName(policy.kind)
                       << " budget " << policy.budget);
          double from_dense = 0;
          ExpectAttendsAsThePolicyCache(policy, FourLayerPool(16, kind), dtype, Schedules()[0], 53,
                                        &from_dense, work);
          if (HasFatalFailure()) return;
          EXPECT_GT(from_dense, 1e-2);
        }
      }
    }
  }
}

// A bfloat16 model over int8 / int4 pools: its entries are encoded from their float32 widening,
// so until the first eviction it attends within the codes' rounding of the same model over a
// bfloat16 pool, and it never holds more than its slots' blocks.
TEST(ScoredPagedKVCacheTest, SixteenBitModelsOverQuantisedPools) {
  constexpr PoolKind kModelEntries{"bfloat16", at::kBFloat16, 16};
  for (const PoolKind& kind :
       {PoolKind{"int8", at::kBFloat16, 8}, PoolKind{"int4", at::kBFloat16, 4}}) {
    const EvictionPolicyOptions policy = Policy(PolicyKind::kH2O, 12);
    SCOPED_TRACE(kind.name);
    std::unique_ptr<ScoredPagedKVCache> quantised = ScoredCache(FourLayerPool(16, kind), policy);
    std::unique_ptr<ScoredPagedKVCache> model =
        ScoredCache(FourLayerPool(16, kModelEntries), policy);
    ASSERT_TRUE(quantised && model);
    at::manual_seed(59);
    int64_t position = 0;
    double largest_error = 0;
    const std::vector<int64_t> schedule = Schedules()[1];
    for (const int64_t length : schedule) {
      const KVStep step = ContiguousStep(position, length);
      ASSERT_TRUE(quantised->CheckStep(step, 1).ok());
      ASSERT_TRUE(model->CheckStep(step, 1).ok());
      for (int64_t layer = 0; layer < kFourLayers; ++layer) {
        SCOPED_TRACE(testing::Message()
                     << "layer " << layer << ", step of " << length << " at " << position);
        const LayerInputs in = RandomInputs(layer, length);
        const at::Tensor q = in.q.to(at::kBFloat16), k = in.k.to(at::kBFloat16),
                         v = in.v.to(at::kBFloat16);
        const AttentionParams params = FourLayerParams(layer);
        const absl::StatusOr<at::Tensor> a =
            quantised->UpdateAndAttend(layer, step, q, k, v, params);
        const absl::StatusOr<at::Tensor> b = model->UpdateAndAttend(layer, step, q, k, v, params);
        ASSERT_TRUE(a.ok()) << a.status();
        ASSERT_TRUE(b.ok()) << b.status();
        ASSERT_EQ(a->scalar_type(), at::kBFloat16);
        const double error = MaxDifference(a->to(at::kFloat), b->to(at::kFloat));
        if (position + length <= policy.budget) {
          EXPECT_LE(error, kind.bits == 4 ? 0.6 : 0.06);
        }
        largest_error = std::max(largest_error, error);
      }
      position += length;
      EXPECT_LE(quantised->blocks_held(), MostBlocks(policy, 4)) << "at " << position;
    }
    EXPECT_GT(largest_error, 0.0);  // the entries really were quantised
  }
}

// Random steps over blocks of 1 to 16 entries: BlocksNeeded is what a step takes, the cache
// never holds more than ceil((budget + 1) / entries_per_block) blocks, so a pool of exactly that
// many serves a long stream; a full pool refuses a step and takes nothing; Reset and
// destruction give every block back.
TEST(ScoredPagedKVCacheTest, HoldsAtMostItsSlotsBlocksAndGivesThemBack) {
  std::mt19937 random(5);
  for (const ScoredSlotWork work : kSlotWorks) {
    for (const int64_t entries_per_block : {1, 3, 4, 16}) {
      for (const EvictionPolicyOptions& policy :
           {Policy(PolicyKind::kH2O, 12), Policy(PolicyKind::kTova, 7)}) {
        SCOPED_TRACE(testing::Message() << SlotWorkName(work) << ", " << PolicyName(policy.kind)
                                        << ", blocks of " << entries_per_block);
        const int64_t most = MostBlocks(policy, entries_per_block);
        std::shared_ptr<BlockPool> pool = FourLayerPool(most, kFloat32Entries, entries_per_block);
        {
          std::unique_ptr<ScoredPagedKVCache> cache = ScoredCache(pool, policy, work);
          ASSERT_TRUE(cache);
          int64_t position = 0;
          while (position < kFourLayerContext - 20) {
            const int64_t length = random() % 3 == 0 ? 1 + random() % 17 : 1;
            const int64_t needed = cache->BlocksNeeded(length);
            const int64_t free_before = pool->free_blocks();
            ASSERT_TRUE(cache->CheckStep(ContiguousStep(position, length), 1).ok())
                << "at " << position;
            EXPECT_EQ(free_before - pool->free_blocks(), needed);
            EXPECT_EQ(cache->blocks_held(), cache->BlocksToHold(position + length));
            for (int64_t layer = 0; layer < kFourLayers; ++layer) {
              const LayerInputs in = RandomInputs(layer, length);
              ASSERT_TRUE(cache
                              ->UpdateAndAttend(layer, ContiguousStep(position, length), in.q, in.k,
                                                in.v, FourLayerParams(layer))
                              .ok());
            }
            position += length;
            EXPECT_LE(cache->blocks_held(), most);
          }
          EXPECT_EQ(cache->blocks_held(), most);
          // A second cache finds the pool full: refused, nothing taken.
          std::unique_ptr<ScoredPagedKVCache> other = ScoredCache(pool, policy, work);
          const absl::Status full = other->CheckStep(ContiguousStep(0, 1), 1);
          EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
          EXPECT_EQ(other->blocks_held(), 0);
          cache->Reset();
          EXPECT_EQ(pool->free_blocks(), most);
          ASSERT_TRUE(cache->CheckStep(ContiguousStep(0, 5), 1).ok());
          EXPECT_LT(pool->free_blocks(), most);
        }
        EXPECT_EQ(pool->free_blocks(), most);  // destruction gives them back
      }
    }
  }
}

// A fork (the n choices of one prompt) shares every block until its first step, which copies
// them; the original and the fork then attend, fed the same steps, as the original alone would.
TEST(ScoredPagedKVCacheTest, ForksShareBlocksAndGoOnAsTheOriginal) {
  for (const ScoredSlotWork work : kSlotWorks) {
    SCOPED_TRACE(SlotWorkName(work));
    const EvictionPolicyOptions policy = Policy(PolicyKind::kH2O, 12);
    std::shared_ptr<BlockPool> pool = FourLayerPool(32);
    std::unique_ptr<ScoredPagedKVCache> original = ScoredCache(pool, policy, work);
    std::unique_ptr<ScoredPagedKVCache> fork = ScoredCache(pool, policy, work);
    std::unique_ptr<ScoredPagedKVCache> alone = ScoredCache(FourLayerPool(32), policy, work);
    ASSERT_TRUE(original && fork && alone);
    at::manual_seed(53);
    std::vector<LayerInputs> prompt;
    for (int64_t layer = 0; layer < kFourLayers; ++layer) prompt.push_back(RandomInputs(layer, 19));
    for (ScoredPagedKVCache* cache : {original.get(), alone.get()}) {
      ASSERT_TRUE(cache->CheckStep(ContiguousStep(0, 19), 1).ok());
      for (int64_t layer = 0; layer < kFourLayers; ++layer) {
        const LayerInputs& in = prompt[layer];
        ASSERT_TRUE(cache
                        ->UpdateAndAttend(layer, ContiguousStep(0, 19), in.q, in.k, in.v,
                                          FourLayerParams(layer))
                        .ok());
      }
    }
    const int64_t free_before = pool->free_blocks();
    ASSERT_TRUE(original->CheckCopyInto(*fork).ok());
    ASSERT_TRUE(original->CopyInto(*fork).ok());
    EXPECT_EQ(pool->free_blocks(), free_before);  // shared, nothing taken
    EXPECT_EQ(fork->BlocksNeeded(1), fork->blocks_held());
    for (int64_t position = 19; position < 60; ++position) {
      const KVStep step = ContiguousStep(position, 1);
      for (ScoredPagedKVCache* cache : {original.get(), fork.get(), alone.get()}) {
        ASSERT_TRUE(cache->CheckStep(step, 1).ok());
      }
      for (int64_t layer = 0; layer < kFourLayers; ++layer) {
        const LayerInputs in = RandomInputs(layer, 1);
        const at::Tensor a =
            *original->UpdateAndAttend(layer, step, in.q, in.k, in.v, FourLayerParams(layer));
        const at::Tensor b =
            *fork->UpdateAndAttend(layer, step, in.q, in.k, in.v, FourLayerParams(layer));
        const at::Tensor c =
            *alone->UpdateAndAttend(layer, step, in.q, in.k, in.v, FourLayerParams(layer));
        EXPECT_TRUE(at::equal(a, c)) << "original at " << position;
        EXPECT_TRUE(at::equal(b, c)) << "fork at " << position;
      }
    }
    std::unique_ptr<ScoredPagedKVCache> tova =
        ScoredCache(pool, Policy(PolicyKind::kTova, 12), work);
    EXPECT_EQ(original->CheckCopyInto(*tova).code(), absl::StatusCode::kFailedPrecondition);
  }
}

// The same stream through `a` and `b` (fed `to_b`'s copies of its tensors): after every step of
// every layer the same positions kept in every group and outputs within `tolerance` (0: equal).
void ExpectSameCaches(ScoredPagedKVCache& a, ScoredPagedKVCache& b, const c10::Device& to_b,
                      const std::vector<int64_t>& schedule, double tolerance) {
  int64_t position = 0;
  for (const int64_t length : schedule) {
    const KVStep step = ContiguousStep(position, length);
    KVStep b_step = step;
    b_step.positions = step.positions.to(to_b);
    ASSERT_TRUE(a.CheckStep(step, 1).ok());
    ASSERT_TRUE(b.CheckStep(b_step, 1).ok());
    for (int64_t layer = 0; layer < kFourLayers; ++layer) {
      SCOPED_TRACE(testing::Message()
                   << "layer " << layer << ", step of " << length << " at " << position);
      const LayerInputs in = RandomInputs(layer, length);
      const AttentionParams params = FourLayerParams(layer);
      const absl::StatusOr<at::Tensor> x = a.UpdateAndAttend(layer, step, in.q, in.k, in.v, params);
      const absl::StatusOr<at::Tensor> y =
          b.UpdateAndAttend(layer, b_step, in.q.to(to_b), in.k.to(to_b), in.v.to(to_b), params);
      ASSERT_TRUE(x.ok()) << x.status();
      ASSERT_TRUE(y.ok()) << y.status();
      ASSERT_EQ(y->device(), to_b);
      const at::Tensor y_here = y->to(at::kCPU);
      if (tolerance == 0) {
        EXPECT_TRUE(at::equal(*x, y_here)) << MaxDifference(*x, y_here);
      } else {
        EXPECT_LE(MaxDifference(*x, y_here), tolerance);
      }
      for (int64_t g = 0; g < FourLayerGeometry().layers[layer].n_query_groups; ++g) {
        ASSERT_EQ(a.KeptPositions(layer, g), b.KeptPositions(layer, g)) << "group " << g;
      }
    }
    position += length;
  }
}

// The device's slot work on a CPU pool keeps what the host's keeps, in every pool kind (int8 /
// int4 rows are moved as stored, never re-encoded), and attends alike: to the bit for 16-bit
// entries; within 1e-5 for quantised ones (the host's decode kernel dequantises in registers).
TEST(ScoredPagedKVCacheTest, DeviceSlotWorkKeepsWhatTheHostKeeps) {
  for (const PoolKind& kind : {kFloat32Entries, kBFloat16Entries, kInt8Entries, kInt4Entries}) {
    for (const EvictionPolicyOptions& policy : Policies()) {
      for (size_t i = 0; i < Schedules().size(); ++i) {
        SCOPED_TRACE(testing::Message() << kind.name << " " << PolicyName(policy.kind) << " budget "
                                        << policy.budget << ", schedule " << i);
        std::unique_ptr<ScoredPagedKVCache> host =
            ScoredCache(FourLayerPool(16, kind), policy, ScoredSlotWork::kHost);
        std::unique_ptr<ScoredPagedKVCache> device =
            ScoredCache(FourLayerPool(16, kind), policy, ScoredSlotWork::kPoolDevice);
        ASSERT_TRUE(host && device);
        at::manual_seed(61 + i);
        ExpectSameCaches(*host, *device, c10::Device(c10::kCPU), Schedules()[i],
                         kind.bits == 16 ? 0.0 : 1e-5);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Negates a layer's step scores (so h2o keeps the least attended entries) and counts its calls:
// a stand-in for the all-reduce that adds up a group's copies on tensor-parallel ranks.
class NegatingReducer : public KVScoreReducer {
 public:
  void Reduce(at::Tensor& scores) const override {
    ++calls;
    scores.neg_();
  }
  mutable int64_t calls = 0;
};

// Layers with a score reducer pass every step's scores through it, as the policy cache over the
// same layers does: outputs to the bit and the same positions kept, with either slot work; and
// (teeth) other positions than the same cache without the reducer.
TEST(ScoredPagedKVCacheTest, StepScoresPassThroughTheLayersReducer) {
  const auto reducer = std::make_shared<NegatingReducer>();
  KVCacheGeometry geometry = FourLayerGeometry();
  for (KVLayerSpec& layer : geometry.layers) layer.score_reducer = reducer;
  const EvictionPolicyOptions policy = Policy(PolicyKind::kH2O, 12);
  for (const ScoredSlotWork work : kSlotWorks) {
    SCOPED_TRACE(SlotWorkName(work));
    BlockPoolOptions pool_options;
    pool_options.entries_per_block = 4;
    pool_options.num_blocks = 16;
    absl::StatusOr<std::shared_ptr<BlockPool>> pool = BlockPool::Create(geometry, pool_options);
    ASSERT_TRUE(pool.ok()) << pool.status();
    std::unique_ptr<ScoredPagedKVCache> reduced = ScoredCache(*pool, policy, work);
    std::unique_ptr<ScoredPagedKVCache> plain = ScoredCache(FourLayerPool(16), policy, work);
    std::unique_ptr<PolicyKVCache> reference = PolicyCache(policy, at::kFloat, geometry);
    ASSERT_TRUE(reduced && plain && reference);
    const int64_t calls_before = reducer->calls;
    at::manual_seed(71);
    int64_t position = 0, differing = 0;
    const std::vector<int64_t> schedule = Schedules()[0];
    for (const int64_t length : schedule) {
      const KVStep step = ContiguousStep(position, length);
      for (KVCache* cache :
           {static_cast<KVCache*>(reduced.get()), static_cast<KVCache*>(plain.get()),
            static_cast<KVCache*>(reference.get())}) {
        ASSERT_TRUE(cache->CheckStep(step, 1).ok());
      }
      for (int64_t layer = 0; layer < kFourLayers; ++layer) {
        SCOPED_TRACE(testing::Message()
                     << "layer " << layer << ", step of " << length << " at " << position);
        const LayerInputs in = RandomInputs(layer, length);
        const AttentionParams params = FourLayerParams(layer);
        const absl::StatusOr<at::Tensor> a =
            reduced->UpdateAndAttend(layer, step, in.q, in.k, in.v, params);
        const absl::StatusOr<at::Tensor> b =
            reference->UpdateAndAttend(layer, step, in.q, in.k, in.v, params);
        ASSERT_TRUE(a.ok()) << a.status();
        ASSERT_TRUE(b.ok()) << b.status();
        ASSERT_TRUE(plain->UpdateAndAttend(layer, step, in.q, in.k, in.v, params).ok());
        EXPECT_TRUE(at::equal(*a, *b)) << MaxDifference(*a, *b);
        for (int64_t g = 0; g < geometry.layers[layer].n_query_groups; ++g) {
          const std::vector<int64_t> kept = reduced->KeptPositions(layer, g);
          ASSERT_EQ(kept, reference->KeptPositions(layer, 0, g)) << "group " << g;
          differing += kept != plain->KeptPositions(layer, g) ? 1 : 0;
        }
      }
      position += length;
    }
    EXPECT_GT(reducer->calls, calls_before);
    EXPECT_GT(differing, 0);
  }
}

// On a GPU: a cache over a CUDA pool (slot work on the device, scores from ATen's attention
// there) keeps what the same cache over a CPU pool keeps and attends within rounding of it, for
// every pool kind; host slot work over a CUDA pool is refused, naming the field.
TEST(ScoredPagedKVCacheTest, CudaPoolKeepsWhatTheCpuPoolKeeps) {
  if (!CudaAvailable()) GTEST_SKIP() << "skipped: no CUDA device";
  const c10::Device cuda(c10::kCUDA, 0);
  for (const PoolKind& kind : {kFloat32Entries, kBFloat16Entries, kInt8Entries, kInt4Entries}) {
    for (const EvictionPolicyOptions& policy : Policies()) {
      SCOPED_TRACE(testing::Message()
                   << kind.name << " " << PolicyName(policy.kind) << " budget " << policy.budget);
      KVCacheGeometry geometry = FourLayerGeometry();
      geometry.dtype = kind.dtype;
      geometry.device = cuda;
      BlockPoolOptions options;
      options.entries_per_block = 4;
      options.num_blocks = 16;
      options.entry_bits = kind.bits;
      absl::StatusOr<std::shared_ptr<BlockPool>> pool = BlockPool::Create(geometry, options);
      ASSERT_TRUE(pool.ok()) << pool.status();
      std::unique_ptr<ScoredPagedKVCache> cpu = ScoredCache(FourLayerPool(16, kind), policy);
      std::unique_ptr<ScoredPagedKVCache> gpu = ScoredCache(*pool, policy);
      ASSERT_TRUE(cpu && gpu);
      at::manual_seed(67);
      ExpectSameCaches(*cpu, *gpu, cuda, Schedules()[0], 1e-4);
      if (HasFatalFailure()) return;
    }
  }
  ScoredPagedKVCacheOptions host_on_gpu;
  KVCacheGeometry geometry = FourLayerGeometry();
  geometry.device = cuda;
  BlockPoolOptions options;
  options.num_blocks = 4;
  host_on_gpu.pool = *BlockPool::Create(geometry, options);
  host_on_gpu.max_sequence_length = kFourLayerContext;
  host_on_gpu.policy = Policy(PolicyKind::kH2O, 8);
  host_on_gpu.slot_work = ScoredSlotWork::kHost;
  const absl::StatusOr<std::unique_ptr<ScoredPagedKVCache>> refused =
      ScoredPagedKVCache::Create(host_on_gpu);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(ErrorField(refused.status()).value_or(""), "ScoredPagedKVCacheOptions.slot_work");
}

// Create names what it refuses; steps out of order and dtypes it does not take are errors that
// change nothing.
TEST(ScoredPagedKVCacheTest, RefusesWhatItDoesNotKeep) {
  ScoredPagedKVCacheOptions options;
  options.max_sequence_length = kFourLayerContext;
  options.policy = Policy(PolicyKind::kH2O, 8);
  absl::StatusOr<std::unique_ptr<ScoredPagedKVCache>> missing = ScoredPagedKVCache::Create(options);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(ErrorField(missing.status()).value_or(""), "ScoredPagedKVCacheOptions.pool");
  options.pool = FourLayerPool(8);
  options.policy = Policy(PolicyKind::kSink, 8);
  absl::StatusOr<std::unique_ptr<ScoredPagedKVCache>> sink = ScoredPagedKVCache::Create(options);
  ASSERT_FALSE(sink.ok());
  EXPECT_EQ(ErrorField(sink.status()).value_or(""), "ScoredPagedKVCacheOptions.policy.kind");
  options.policy = Policy(PolicyKind::kH2O, 8);
  options.policy.layer_budgets = {4, 4};
  absl::StatusOr<std::unique_ptr<ScoredPagedKVCache>> budgets = ScoredPagedKVCache::Create(options);
  ASSERT_FALSE(budgets.ok());
  EXPECT_EQ(ErrorField(budgets.status()).value_or(""),
            "ScoredPagedKVCacheOptions.policy.layer_budgets");
  options.policy.layer_budgets.clear();
  options.policy.budget = 0;
  EXPECT_FALSE(ScoredPagedKVCache::Create(options).ok());

  options.policy.budget = 8;
  std::unique_ptr<ScoredPagedKVCache> cache = *ScoredPagedKVCache::Create(options);
  EXPECT_EQ(cache->CheckStep(ContiguousStep(3, 2), 1).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(cache->CheckStep(ContiguousStep(0, 2), 1).ok());
  const LayerInputs in = RandomInputs(0, 2);
  const absl::StatusOr<at::Tensor> wide =
      cache->UpdateAndAttend(0, ContiguousStep(0, 2), in.q.to(at::kDouble), in.k.to(at::kDouble),
                             in.v.to(at::kDouble), FourLayerParams(0));
  EXPECT_EQ(wide.status().code(), absl::StatusCode::kInvalidArgument);
  const absl::StatusOr<at::Tensor> mixed = cache->UpdateAndAttend(
      0, ContiguousStep(0, 2), in.q, in.k, in.v.to(at::kBFloat16), FourLayerParams(0));
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      cache->UpdateAndAttend(0, ContiguousStep(0, 2), in.q, in.k, in.v, FourLayerParams(0)).ok());
  EXPECT_EQ(cache->KeptPositions(0, 1), (std::vector<int64_t>{0, 1}));
}

}  // namespace
}  // namespace lgpt
