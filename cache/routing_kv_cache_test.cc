// RoutingKVCache: a step over many requests' caches attends for each sequence exactly as
// that sequence's cache alone would, to the bit: decode rows along the batch axis or behind
// prompt chunks along the time axis, whether rows go through the one-pass path
// (UpdateForDecode + DecodeAttentionRows: dense and paged float32 rows) or their own
// UpdateAndAttend (windowed layers, eviction policies), sequences at different lengths.
#include "cache/routing_kv_cache.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <vector>

#include "cache/block_pool.h"
#include "cache/dense_kv_cache.h"
#include "cache/kv_batch.h"
#include "cache/kv_cache_factory.h"
#include "cache/paged_kv_cache.h"
#include "core/base/device.h"
#include "core/ops/paged_attention.h"

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

// A pool of 64 blocks of 4 entries for Shape(0) on `device`.
std::shared_ptr<BlockPool> RowPool(const c10::Device& device) {
  BlockPoolOptions pool_options;
  pool_options.entries_per_block = 4;
  pool_options.num_blocks = 64;
  KVCacheGeometry geometry = Shape(0);
  geometry.device = device;
  return *BlockPool::Create(geometry, pool_options);
}

// Rows `make(kind)` of `kinds` (and their twins) after prompts of `prompts` tokens, then decode
// steps, on `device`: the batch's result for each row must equal the row's twin attending
// alone, to the bit (`exact`) or within 1e-5.
void ExpectRowsAttendAlone(const std::vector<int>& kinds, const std::vector<int64_t>& prompts,
                           const std::function<std::unique_ptr<KVCache>(int)>& make,
                           const c10::Device& device, bool exact) {
  at::manual_seed(3);
  const int64_t batch = static_cast<int64_t>(kinds.size());
  std::vector<std::unique_ptr<KVCache>> rows, alone;  // the batch's rows and their twins
  for (int kind : kinds) {
    rows.push_back(make(kind));
    alone.push_back(make(kind));
  }
  AttentionParams params;
  params.scale = 0.25;
  // Prompts, each row on its own (the same entries in a row and its twin).
  for (int64_t b = 0; b < batch; ++b) {
    const at::Tensor k = at::randn({1, kGroups, prompts[b], kHeadSize}).to(device);
    const at::Tensor v = at::randn({1, kGroups, prompts[b], kHeadSize}).to(device);
    const at::Tensor q = at::randn({1, kHeads, prompts[b], kHeadSize}).to(device);
    const KVStep step = Step(at::arange(prompts[b], at::kLong).unsqueeze(0).to(device));
    for (KVCache* cache : {rows[b].get(), alone[b].get()}) {
      ASSERT_TRUE(cache->CheckStep(step, 1).ok());
      for (int64_t layer = 0; layer < 2; ++layer) {
        ASSERT_TRUE(cache->UpdateAndAttend(layer, step, q, k, v, params).ok());
      }
    }
  }
  std::vector<KVCache*> pointers;
  for (const auto& row : rows) pointers.push_back(row.get());
  KVBatch layout;
  layout.axis = KVBatch::Axis::kBatch;
  layout.caches = pointers;
  layout.lengths.assign(pointers.size(), 1);
  absl::StatusOr<RoutingKVCache> batched = RoutingKVCache::Create(layout);
  ASSERT_TRUE(batched.ok()) << batched.status();
  for (int64_t t = 0; t < 6; ++t) {  // decode steps, every row at its own position
    at::Tensor positions = at::empty({batch, 1}, at::kLong);
    for (int64_t b = 0; b < batch; ++b) positions[b][0] = prompts[b] + t;
    positions = positions.to(device);
    const KVStep step = Step(positions);
    ASSERT_TRUE(batched->CheckStep(step, batch).ok());
    for (int64_t b = 0; b < batch; ++b) {
      ASSERT_TRUE(alone[b]->CheckStep(Step(positions.narrow(0, b, 1)), 1).ok());
    }
    for (int64_t layer = 0; layer < 2; ++layer) {
      const at::Tensor q = at::randn({batch, kHeads, 1, kHeadSize}).to(device);
      const at::Tensor k = at::randn({batch, kGroups, 1, kHeadSize}).to(device);
      const at::Tensor v = at::randn({batch, kGroups, 1, kHeadSize}).to(device);
      absl::StatusOr<at::Tensor> y = batched->UpdateAndAttend(layer, step, q, k, v, params);
      ASSERT_TRUE(y.ok()) << y.status();
      ASSERT_EQ(y->sizes(), q.sizes());
      for (int64_t b = 0; b < batch; ++b) {
        absl::StatusOr<at::Tensor> expected =
            alone[b]->UpdateAndAttend(layer, Step(positions.narrow(0, b, 1)), q.narrow(0, b, 1),
                                      k.narrow(0, b, 1), v.narrow(0, b, 1), params);
        ASSERT_TRUE(expected.ok()) << expected.status();
        const double difference = (y->narrow(0, b, 1) - *expected).abs().max().item<double>();
        EXPECT_TRUE(exact ? at::equal(y->narrow(0, b, 1), *expected) : difference < 1e-5)
            << difference << " at step " << t << " layer " << layer << " row " << b << " (kind "
            << kinds[b] << ")";
      }
    }
  }
}

// The CPU rows: kinds of MakeRow over one CPU pool, batched to the bit.
void ExpectRowsAttendAlone(const std::vector<int>& kinds, const std::vector<int64_t>& prompts) {
  const std::shared_ptr<BlockPool> pool = RowPool(c10::Device(c10::kCPU));
  ExpectRowsAttendAlone(
      kinds, prompts, [&](int kind) { return MakeRow(kind, pool); }, c10::Device(c10::kCPU),
      /*exact=*/true);
}

TEST(RoutingKVCacheTest, OnePassRowsAttendAsAlone) {
  ExpectRowsAttendAlone({0, 1, 0, 1, 1}, {9, 3, 12, 1, 17});
}

TEST(RoutingKVCacheTest, MixedRowsAttendAsAlone) {
  // Windowed layers and a policy cache take their own path beside the one-pass rows.
  ExpectRowsAttendAlone({0, 1, 2, 3, 0, 1}, {9, 3, 12, 7, 1, 17});
}

// Sequences of `lengths` tokens end to end in one [1, sum] step (prompt chunks, and one-token
// sequences that attend as rows when two or more end the step), over rows of `kinds` after
// prompts of `prompts` tokens: each sequence's part equals its cache's own UpdateAndAttend.
void ExpectSequencesAttendAlone(const std::vector<int>& kinds, const std::vector<int64_t>& prompts,
                                const std::vector<int64_t>& lengths) {
  at::manual_seed(5);
  BlockPoolOptions pool_options;
  pool_options.entries_per_block = 4;
  pool_options.num_blocks = 64;
  std::shared_ptr<BlockPool> pool = *BlockPool::Create(Shape(0), pool_options);
  const size_t count = kinds.size();
  std::vector<std::unique_ptr<KVCache>> caches, alone;
  AttentionParams params;
  params.scale = 0.25;
  for (size_t s = 0; s < count; ++s) {
    caches.push_back(MakeRow(kinds[s], pool));
    alone.push_back(MakeRow(kinds[s], pool));
    const at::Tensor k = at::randn({1, kGroups, prompts[s], kHeadSize});
    const at::Tensor q = at::randn({1, kHeads, prompts[s], kHeadSize});
    const KVStep step = Step(at::arange(prompts[s], at::kLong).unsqueeze(0));
    for (KVCache* cache : {caches[s].get(), alone[s].get()}) {
      ASSERT_TRUE(cache->CheckStep(step, 1).ok());
      for (int64_t layer = 0; layer < 2; ++layer) {
        ASSERT_TRUE(cache->UpdateAndAttend(layer, step, q, k, k, params).ok());
      }
    }
  }
  KVBatch layout;
  for (const auto& cache : caches) layout.caches.push_back(cache.get());
  layout.lengths = lengths;
  absl::StatusOr<RoutingKVCache> routed = RoutingKVCache::Create(layout);
  ASSERT_TRUE(routed.ok()) << routed.status();
  ASSERT_EQ(routed->batch_size(), 1);
  std::vector<at::Tensor> parts;
  for (size_t s = 0; s < count; ++s) {
    parts.push_back(at::arange(prompts[s], prompts[s] + lengths[s], at::kLong));
  }
  const at::Tensor positions = at::cat(parts).unsqueeze(0);  // [1, tokens]
  const int64_t tokens = positions.size(1);
  const KVStep step = Step(positions);
  ASSERT_TRUE(routed->CheckStep(step, 1).ok());
  for (int64_t layer = 0; layer < 2; ++layer) {
    const at::Tensor q = at::randn({1, kHeads, tokens, kHeadSize});
    const at::Tensor k = at::randn({1, kGroups, tokens, kHeadSize});
    const at::Tensor v = at::randn({1, kGroups, tokens, kHeadSize});
    absl::StatusOr<at::Tensor> y = routed->UpdateAndAttend(layer, step, q, k, v, params);
    ASSERT_TRUE(y.ok()) << y.status();
    ASSERT_EQ(y->sizes(), q.sizes());
    int64_t begin = 0;
    for (size_t s = 0; s < count; ++s) {
      const int64_t length = lengths[s];
      const KVStep own = Step(positions.narrow(1, begin, length));
      if (layer == 0) {
        ASSERT_TRUE(alone[s]->CheckStep(own, 1).ok());
      }
      absl::StatusOr<at::Tensor> expected = alone[s]->UpdateAndAttend(
          layer, own, q.narrow(2, begin, length).contiguous(),
          k.narrow(2, begin, length).contiguous(), v.narrow(2, begin, length).contiguous(), params);
      ASSERT_TRUE(expected.ok()) << expected.status();
      EXPECT_TRUE(at::equal(y->narrow(2, begin, length), *expected))
          << "layer " << layer << " sequence " << s << " (kind " << kinds[s] << ")";
      begin += length;
    }
  }
}

TEST(RoutingKVCacheTest, ChunksAndTrailingRowsAlongTimeAttendAsAlone) {
  ExpectSequencesAttendAlone({0, 2, 1, 0, 1, 3}, {9, 3, 12, 7, 1, 17}, {5, 3, 4, 1, 1, 1});
}

TEST(RoutingKVCacheTest, OneTokenSequencesBetweenChunksAttendAlone) {
  // A one-token sequence before a chunk, and a single trailing one, attend on their own.
  ExpectSequencesAttendAlone({1, 0, 3, 1}, {4, 9, 6, 2}, {1, 6, 1, 1});
  ExpectSequencesAttendAlone({0, 1}, {4, 9}, {3, 1});
}

TEST(RoutingKVCacheTest, RefusesBadLayoutsAndSteps) {
  std::unique_ptr<KVCache> a = MakeRow(0, nullptr), b = MakeRow(2, nullptr);
  KVBatch layout;
  EXPECT_EQ(RoutingKVCache::Create(layout).status().code(), absl::StatusCode::kInvalidArgument);
  layout.caches = {a.get(), b.get()};
  layout.lengths = {2};
  EXPECT_EQ(RoutingKVCache::Create(layout).status().code(), absl::StatusCode::kInvalidArgument);
  layout.lengths = {2, 0};
  EXPECT_EQ(RoutingKVCache::Create(layout).status().code(), absl::StatusCode::kInvalidArgument);
  layout.lengths = {2, 1};
  layout.axis = KVBatch::Axis::kBatch;  // rows are one token each
  EXPECT_EQ(RoutingKVCache::Create(layout).status().code(), absl::StatusCode::kInvalidArgument);
  layout.axis = KVBatch::Axis::kTime;
  layout.caches = {a.get(), nullptr};
  EXPECT_EQ(RoutingKVCache::Create(layout).status().code(), absl::StatusCode::kInvalidArgument);
  layout.caches = {a.get(), b.get()};
  absl::StatusOr<RoutingKVCache> routed = RoutingKVCache::Create(layout);
  ASSERT_TRUE(routed.ok()) << routed.status();
  // Three tokens along time: positions [1, 3] only, one row.
  EXPECT_FALSE(routed->CheckStep(Step(at::zeros({1, 4}, at::kLong)), 1).ok());
  EXPECT_FALSE(routed->CheckStep(Step(at::zeros({3, 1}, at::kLong)), 3).ok());
  EXPECT_TRUE(routed->CheckStep(Step(at::arange(3, at::kLong).unsqueeze(0)), 1).ok());
  // A sequence's own bound: position kContext is past sequence 1's cache.
  const absl::Status past = routed->CheckStep(
      Step(at::tensor(std::vector<int64_t>{0, 1, kContext}, at::kLong).unsqueeze(0)), 1);
  EXPECT_FALSE(past.ok());
  EXPECT_NE(past.message().find("sequence 1"), absl::string_view::npos) << past;
}

// On the GPU, rows of caches over device pools attend in one paged kernel launch per pool
// (KVTableRows), beside rows that attend on their own (a dense cache, an evicting ring), and
// each row equals its twin attending alone (the same kernel over one request).
TEST(RoutingKVCacheTest, DeviceRowsAttendInOneLaunchPerPoolAsAlone) {
  if (!PagedAttentionHasCudaKernel()) GTEST_SKIP() << "skipped: built against a CPU-only LibTorch";
  if (!CudaAvailable()) GTEST_SKIP() << "skipped: no CUDA device";
  const c10::Device cuda(c10::kCUDA, 0);
  const std::shared_ptr<BlockPool> pools[2] = {RowPool(cuda), RowPool(cuda)};
  KVCacheShape shape = Shape(0);
  shape.device = cuda;
  // Kinds: 0, 1 paged over the first pool or the second; 2 a dense cache on the device; 3 a
  // sink ring over the first pool.
  const auto make = [&](int kind) -> std::unique_ptr<KVCache> {
    switch (kind) {
      case 0:
      case 1:
        return *PagedKVCache::Create(pools[kind], kContext);
      case 2:
        return *MakeKVCache(KVCacheSpec(), shape);
      default:
        return *PagedKVCache::Create(pools[0], kContext, PagedEviction{6, 2});
    }
  };
  ExpectRowsAttendAlone({0, 1, 0, 2, 3, 0}, {9, 3, 12, 5, 14, 1}, make, cuda, /*exact=*/false);
}

TEST(RoutingKVCacheTest, OnlyFloat32CpuRowsTakeTheOnePassPath) {
  KVCacheSpec spec;
  std::unique_ptr<KVCache> dense = *MakeKVCache(spec, Shape(0));
  const at::Tensor k = at::randn({1, kGroups, 1, kHeadSize});
  const KVStep step = Step(at::zeros({1, 1}, at::kLong));
  ASSERT_TRUE(dense->CheckStep(step, 1).ok());
  absl::StatusOr<std::optional<DecodeRow>> row =
      dense->decode_rows()->UpdateForDecode(0, step, k, k);
  ASSERT_TRUE(row.ok()) << row.status();
  ASSERT_TRUE(row->has_value());
  EXPECT_EQ((*row)->entries, 1);
  // A windowed layer, a policy cache and a bfloat16 cache decline without storing anything.
  std::unique_ptr<KVCache> windowed = *MakeKVCache(spec, Shape(5));
  ASSERT_TRUE(windowed->CheckStep(step, 1).ok());
  EXPECT_FALSE(windowed->decode_rows()->UpdateForDecode(1, step, k, k)->has_value());
  spec.policy = "sink";
  spec.budget = 6;
  std::unique_ptr<KVCache> sink = *MakeKVCache(spec, Shape(0));
  ASSERT_TRUE(sink->CheckStep(step, 1).ok());
  EXPECT_EQ(sink->decode_rows(), nullptr);
  EXPECT_EQ(sink->AllocatedBytes(), 0);
  KVCacheShape half = Shape(0);
  half.dtype = at::kBFloat16;
  std::unique_ptr<KVCache> bf16 = *MakeKVCache(KVCacheSpec(), half);
  ASSERT_TRUE(bf16->CheckStep(step, 1).ok());
  EXPECT_FALSE(bf16->decode_rows()->UpdateForDecode(0, step, k, k)->has_value());
}

}  // namespace
}  // namespace lgpt
