#include "cache/dense_kv_cache.h"

#include <ATen/ATen.h>

#include "cache/rollback_test_util.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

constexpr int64_t kGroups = 2, kHeadSize = 4;

DenseKVCacheOptions Options(int64_t batch, int64_t max_length, std::vector<int64_t> windows,
                            int64_t initial = 0) {
  DenseKVCacheOptions options;
  options.batch_size = batch;
  options.max_sequence_length = max_length;
  options.initial_capacity = initial;
  for (int64_t w : windows) options.layers.push_back({kGroups, kHeadSize, w});
  return options;
}

KVStep Step(int64_t batch, int64_t start, int64_t length) {
  KVStep step;
  step.positions = at::arange(start, start + length, at::kLong)
                       .unsqueeze(0)
                       .expand({batch, length})
                       .contiguous();
  step.min_position = start;
  step.max_position = start + length - 1;
  return step;
}

// Keys whose every element equals the token position, so views can be checked by value.
at::Tensor KeysFor(int64_t batch, int64_t start, int64_t length) {
  return at::arange(start, start + length, at::kFloat)
      .view({1, 1, length, 1})
      .expand({batch, kGroups, length, kHeadSize})
      .contiguous();
}

TEST(DenseKVCacheTest, BytesFollowTheFormula) {
  auto cache = DenseKVCache::Create(Options(3, 40, {0, 0, 0}, /*initial=*/40));
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ((*cache)->AllocatedBytes(), 2 * 3 * 3 * kGroups * 40 * kHeadSize * 4);
}

TEST(DenseKVCacheTest, WindowedLayersHoldWindowSizedStorage) {
  auto cache = DenseKVCache::Create(Options(1, 100, {0, 8}, /*initial=*/100));
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ((*cache)->capacity(1), 8);
  EXPECT_EQ((*cache)->AllocatedBytes(), 2 * kGroups * (100 + 8) * kHeadSize * 4);
}

TEST(DenseKVCacheTest, ReturnsOnlyTheFilledPrefixWithItsPositions) {
  auto cache = DenseKVCache::Create(Options(2, 1000, {0}));
  ASSERT_TRUE(cache.ok());
  auto view = (*cache)->Update(0, Step(2, 0, 5), KeysFor(2, 0, 5), KeysFor(2, 0, 5));
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->keys.size(2), 5);
  EXPECT_TRUE(at::equal(view->positions[0][0], at::arange(5, at::kLong)));
  view = (*cache)->Update(0, Step(2, 5, 1), KeysFor(2, 5, 1), KeysFor(2, 5, 1));
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->keys.size(2), 6);
  EXPECT_TRUE(at::equal(view->keys, KeysFor(2, 0, 6)));
  // Storage grows with use, not with max_sequence_length.
  EXPECT_LT((*cache)->capacity(0), 1000);
}

TEST(DenseKVCacheTest, StorageFollowsUseNotMaxSequenceLength) {
  // A cache that could hold a million positions costs what ten positions need.
  auto cache = DenseKVCache::Create(Options(1, 1000000, {0, 0}));
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ((*cache)->AllocatedBytes(), 0);
  for (int64_t layer : {0, 1}) {
    ASSERT_TRUE((*cache)->Update(layer, Step(1, 0, 10), KeysFor(1, 0, 10), KeysFor(1, 0, 10)).ok());
  }
  EXPECT_LE((*cache)->AllocatedBytes(), 2 * 2 * kGroups * 64 * kHeadSize * 4);
  EXPECT_LE((*cache)->IndexBytes(), 64 * 8);
}

TEST(DenseKVCacheTest, GrowthKeepsEntries) {
  auto cache = DenseKVCache::Create(Options(1, 500, {0}));
  ASSERT_TRUE(cache.ok());
  for (int64_t p = 0; p < 300; ++p) {
    auto view = (*cache)->Update(0, Step(1, p, 1), KeysFor(1, p, 1), KeysFor(1, p, 1));
    ASSERT_TRUE(view.ok());
  }
  auto view = (*cache)->Update(0, Step(1, 300, 1), KeysFor(1, 300, 1), KeysFor(1, 300, 1));
  ASSERT_TRUE(view.ok());
  EXPECT_TRUE(at::equal(view->values, KeysFor(1, 0, 301)));
  EXPECT_LE((*cache)->capacity(0), 500);
}

TEST(DenseKVCacheTest, RingKeepsTheLastWindowWhenDecoding) {
  const int64_t window = 4;
  auto cache = DenseKVCache::Create(Options(1, 64, {window}));
  ASSERT_TRUE(cache.ok());
  for (int64_t p = 0; p < 11; ++p) {
    auto view = (*cache)->Update(0, Step(1, p, 1), KeysFor(1, p, 1), KeysFor(1, p, 1));
    ASSERT_TRUE(view.ok());
    const at::Tensor positions = std::get<0>(view->positions.reshape({-1}).sort());
    const int64_t first = std::max<int64_t>(0, p - window + 1);
    at::Tensor expected = at::arange(first, p + 1, at::kLong);
    if (expected.numel() < window) {
      expected = at::cat({at::full({window - expected.numel()}, -1, at::kLong), expected});
    }
    EXPECT_TRUE(at::equal(positions, expected)) << "after position " << p;
    // Every slot's key matches the position it claims.
    const at::Tensor keys = view->keys[0][0].select(-1, 0).to(at::kLong);
    const at::Tensor claimed = view->positions.reshape({-1});
    EXPECT_TRUE(at::equal(keys.masked_select(claimed >= 0), claimed.masked_select(claimed >= 0)));
  }
  EXPECT_EQ((*cache)->capacity(0), window);
}

TEST(DenseKVCacheTest, ChunkLongerThanWindowSeesOldAndNewEntries) {
  const int64_t window = 4;
  auto cache = DenseKVCache::Create(Options(1, 64, {window}));
  ASSERT_TRUE(cache.ok());
  ASSERT_TRUE((*cache)->Update(0, Step(1, 0, 6), KeysFor(1, 0, 6), KeysFor(1, 0, 6)).ok());
  auto view = (*cache)->Update(0, Step(1, 6, 7), KeysFor(1, 6, 7), KeysFor(1, 6, 7));
  ASSERT_TRUE(view.ok());
  // The old window (2..5) plus the chunk (6..12): position 6 still sees 3, 4, 5.
  const at::Tensor positions = std::get<0>(view->positions.reshape({-1}).sort());
  EXPECT_TRUE(at::equal(positions, at::arange(2, 13, at::kLong)));
  EXPECT_EQ((*cache)->capacity(0), window);
}

TEST(DenseKVCacheTest, RejectsOutOfRangePositionsWithoutChangingState) {
  auto cache = DenseKVCache::Create(Options(1, 8, {0}));
  ASSERT_TRUE(cache.ok());
  ASSERT_TRUE((*cache)->Update(0, Step(1, 0, 4), KeysFor(1, 0, 4), KeysFor(1, 0, 4)).ok());
  auto view = (*cache)->Update(0, Step(1, 6, 4), KeysFor(1, 6, 4), KeysFor(1, 6, 4));
  EXPECT_EQ(view.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(view.status().message().find("max_sequence_length 8"), std::string::npos);
  view = (*cache)->Update(0, Step(1, 4, 1), KeysFor(1, 4, 1), KeysFor(1, 4, 1));
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->keys.size(2), 5);
}

TEST(DenseKVCacheTest, RejectsBadShapesAndBatches) {
  auto cache = DenseKVCache::Create(Options(1, 8, {0}));
  ASSERT_TRUE(cache.ok());
  const at::Tensor wrong = at::zeros({1, kGroups + 1, 1, kHeadSize});
  EXPECT_EQ((*cache)->Update(0, Step(1, 0, 1), wrong, wrong).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*cache)->Update(0, Step(2, 0, 1), KeysFor(2, 0, 1), KeysFor(2, 0, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*cache)->Update(7, Step(1, 0, 1), KeysFor(1, 0, 1), KeysFor(1, 0, 1)).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_FALSE(DenseKVCache::Create(Options(0, 8, {0})).ok());
  EXPECT_FALSE(DenseKVCache::Create(Options(1, 0, {0})).ok());
}

// A fork (core/serving's n choices without a pool): a copy after the prompt returns the views
// the original returns, on global layers and rings, and leaves the original alone.
TEST(DenseKVCacheTest, ACopyGoesOnAsTheOriginalDoes) {
  auto cache = DenseKVCache::Create(Options(1, 64, {0, 4}));
  ASSERT_TRUE(cache.ok());
  for (int64_t layer : {0, 1}) {
    ASSERT_TRUE((*cache)->Update(layer, Step(1, 0, 7), KeysFor(1, 0, 7), KeysFor(1, 0, 7)).ok());
  }
  // Another length: the ring stays a ring, the entries fit.
  auto copy = DenseKVCache::Create(Options(1, 20, {0, 4}));
  ASSERT_TRUE(copy.ok());
  ASSERT_TRUE((*cache)->forker()->CopyInto(**copy).ok());
  EXPECT_EQ((*copy)->AllocatedBytes(), (*cache)->AllocatedBytes());
  for (int64_t p = 7; p < 12; ++p) {
    for (int64_t layer : {0, 1}) {
      auto mine = (*copy)->Update(layer, Step(1, p, 1), KeysFor(1, p, 1), KeysFor(1, p, 1));
      auto theirs = (*cache)->Update(layer, Step(1, p, 1), KeysFor(1, p, 1), KeysFor(1, p, 1));
      ASSERT_TRUE(mine.ok() && theirs.ok());
      EXPECT_TRUE(at::equal(mine->keys, theirs->keys)) << "layer " << layer << " position " << p;
      EXPECT_TRUE(at::equal(mine->values, theirs->values));
      EXPECT_TRUE(at::equal(mine->positions, theirs->positions));
    }
  }
  // A copy needs the same layers (a window that is a ring in one and not the other) and room.
  auto no_ring = DenseKVCache::Create(Options(1, 4, {0, 4}));
  ASSERT_TRUE(no_ring.ok());
  EXPECT_EQ((*cache)->forker()->CopyInto(**no_ring).code(), absl::StatusCode::kFailedPrecondition);
  auto short_one = DenseKVCache::Create(Options(1, 10, {0, 4}));
  ASSERT_TRUE(short_one.ok());
  EXPECT_EQ((*cache)->forker()->CheckCopyInto(**short_one).code(),
            absl::StatusCode::kFailedPrecondition);
  auto other_groups = DenseKVCache::Create(Options(2, 64, {0, 4}));
  ASSERT_TRUE(other_groups.ok());
  EXPECT_EQ((*cache)->forker()->CopyInto(**other_groups).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(DenseKVCacheTest, ResetForgetsEntries) {
  auto cache = DenseKVCache::Create(Options(1, 16, {0, 3}));
  ASSERT_TRUE(cache.ok());
  for (int64_t layer : {0, 1}) {
    ASSERT_TRUE((*cache)->Update(layer, Step(1, 0, 5), KeysFor(1, 0, 5), KeysFor(1, 0, 5)).ok());
  }
  (*cache)->Reset();
  auto view = (*cache)->Update(0, Step(1, 0, 1), KeysFor(1, 0, 1), KeysFor(1, 0, 1));
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->keys.size(2), 1);
  view = (*cache)->Update(1, Step(1, 0, 1), KeysFor(1, 0, 1), KeysFor(1, 0, 1));
  ASSERT_TRUE(view.ok());
  EXPECT_EQ((view->positions >= 0).sum().item<int64_t>(), 1);
}

// Speculative decoding: a step of `step` entries of which the first `keep` stay attends from
// then on as a cache that decoded only those, windows included (their rings keep spare slots).
TEST(DenseKVCacheTest, TruncateForgetsRejectedEntries) {
  for (const std::vector<int64_t>& windows : {std::vector<int64_t>{0}, {0, 6}}) {
    for (int64_t step = 1; step <= 5; ++step) {
      for (int64_t keep = 1; keep <= step; ++keep) {
        DenseKVCacheOptions options = Options(1, 40, windows);
        options.rollback_slots = 4;
        std::unique_ptr<DenseKVCache> speculating = *DenseKVCache::Create(options);
        std::unique_ptr<DenseKVCache> plain = *DenseKVCache::Create(options);
        RollbackStream stream;
        stream.geometry = options;
        stream.step = step;
        stream.keep = keep;
        EXPECT_LT(RollbackDifference(*speculating, *plain, stream), 1e-5)
            << windows.size() << " layers, step " << step << ", keep " << keep;
        // The global layer's view ends where the kept entries do.
        const at::Tensor k = KeysFor(1, stream.total, 1);
        auto view = speculating->Update(0, Step(1, stream.total, 1), k, k);
        ASSERT_TRUE(view.ok());
        EXPECT_EQ(view->keys.size(2), stream.total + 1);
      }
    }
  }
}

TEST(DenseKVCacheTest, TruncateStopsWhereARingLostWhatItNeeds) {
  DenseKVCacheOptions options = Options(1, 40, {0, 4});  // no spare slots: 1 entry forgotten
  auto cache = DenseKVCache::Create(options);
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ((*cache)->max_rollback(), 1);
  for (int64_t layer : {0, 1}) {
    ASSERT_TRUE((*cache)->Update(layer, Step(1, 0, 10), KeysFor(1, 0, 10), KeysFor(1, 0, 10)).ok());
  }
  ASSERT_TRUE((*cache)->Truncate(9).ok());            // the ring still holds 6, 7, 8
  const absl::Status status = (*cache)->Truncate(7);  // it no longer holds 4
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find("rollback_slots"), std::string::npos) << status;
  auto view = (*cache)->Update(1, Step(1, 9, 1), KeysFor(1, 9, 1), KeysFor(1, 9, 1));
  ASSERT_TRUE(view.ok());  // unchanged by the refusal: 6, 7, 8 and the new 9
  EXPECT_EQ((view->positions >= 6).sum().item<int64_t>(), 4);
  // A cut below everything the ring holds (it holds 6..9) is refused too; a cut to nothing
  // empties the cache.
  const absl::Status below = (*cache)->Truncate(3);
  EXPECT_EQ(below.code(), absl::StatusCode::kFailedPrecondition) << below;
  EXPECT_NE(below.message().find("rollback_slots"), std::string::npos) << below;
  EXPECT_TRUE((*cache)->Truncate(0).ok());
  // Without windows anything goes.
  auto global = DenseKVCache::Create(Options(1, 40, {0}));
  EXPECT_EQ((*global)->max_rollback(), KVRollback::kUnlimited);
  EXPECT_EQ((*global)->rollback(), global->get());
}

}  // namespace
}  // namespace lgpt
