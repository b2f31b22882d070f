// The scheduler under load (core/serving/scheduler.h): 500 requests of random lengths and
// caches, random cancellations and self-stops. CI runs it again under AddressSanitizer with
// LeakSanitizer (tag "lsan", --config=asan --config=lsan): nothing is freed twice or leaked. With a
// small block pool: preemptions and prefix reuse under the same churn leave the pool entirely free.
#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cache/block_pool.h"
#include "cache/kv_cache_factory.h"
#include "cache/paged_kv_cache.h"
#include "core/config/config_presets.h"
#include "core/model/gpt.h"
#include "core/serving/scheduler.h"
#include "gtest/gtest.h"
#include "tests/serving_test_util.h"
#include "tests/test_models.h"

namespace lgpt {
namespace {

// A batch-1 cache that counts the live instances, to prove every request's cache is released.
class CountedCache : public KVCache {
 public:
  CountedCache(std::unique_ptr<KVCache> inner, std::atomic<int>* live)
      : inner_(std::move(inner)), live_(live) {
    ++*live_;
  }
  ~CountedCache() override { --*live_; }
  absl::StatusOr<KVView> Update(int64_t layer, const KVStep& step, const at::Tensor& keys,
                                const at::Tensor& values) override {
    return inner_->Update(layer, step, keys, values);
  }
  absl::StatusOr<at::Tensor> UpdateAndAttend(int64_t layer, const KVStep& step, const at::Tensor& q,
                                             const at::Tensor& keys, const at::Tensor& values,
                                             const AttentionParams& params) override {
    return inner_->UpdateAndAttend(layer, step, q, keys, values, params);
  }
  absl::Status CheckStep(const KVStep& step, int64_t batch_size) const override {
    return inner_->CheckStep(step, batch_size);
  }
  void Reset() override { inner_->Reset(); }
  int64_t AllocatedBytes() const override { return inner_->AllocatedBytes(); }
  int64_t IndexBytes() const override { return inner_->IndexBytes(); }
  int64_t max_sequence_length() const override { return inner_->max_sequence_length(); }
  int64_t batch_size() const override { return 1; }
  int64_t num_layers() const override { return inner_->num_layers(); }
  std::string DebugName() const override { return "counted " + inner_->DebugName(); }

 private:
  std::unique_ptr<KVCache> inner_;
  std::atomic<int>* live_;
};

// 500 requests of random lengths and caches, a third cancelled at random moments, some
// stopping themselves: every request ends, the counters add up, and no cache outlives its
// request.
TEST(SchedulerTest, SoakOfRandomRequestsLeavesNothingBehind) {
  GPT model = RandomModel("pythia-14m", 9);
  std::atomic<int> live{0};
  std::mt19937 rng(2026);
  const std::vector<KVCacheSpec> specs = {TestSpec("dense", 0, 16), TestSpec("sink", 6, 16),
                                          TestSpec("h2o", 6, 8), TestSpec("window", 5, 4)};
  int cancelled_by_us = 0;
  {
    SchedulerOptions options;
    options.max_running = 12;
    options.prefill_chunk = 7;
    options.step_prefill_tokens = 20;
    Scheduler scheduler(model, options);
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (int i = 0; i < 500; ++i) {
      const int64_t length = 1 + rng() % 30;
      std::vector<int64_t> prompt(length);
      for (int64_t& id : prompt) id = rng() % 96;
      GenerateOptions o;
      o.max_new_tokens = 1 + rng() % 30;
      o.sampling = {1.0, 0, 1.0};
      o.seed = i;
      if (i % 7 == 0) {
        const int64_t stop_after = 1 + rng() % 5;
        auto count = std::make_shared<int64_t>(0);
        o.on_token = [count, stop_after](int64_t) { return ++*count < stop_after; };
      }
      auto cache = std::make_unique<CountedCache>(
          BatchOneCache(*model, specs[i % specs.size()], length + o.max_new_tokens), &live);
      absl::StatusOr<std::shared_ptr<RequestHandle>> handle =
          scheduler.Submit(prompt, o, std::move(cache));
      ASSERT_TRUE(handle.ok()) << handle.status();
      handles.push_back(*handle);
      if (rng() % 3 == 0) {
        handles[rng() % handles.size()]->Cancel();
        ++cancelled_by_us;
      }
    }
    int ended = 0;
    for (auto& handle : handles) {
      absl::StatusOr<RequestResult> result = handle->Wait();
      ASSERT_TRUE(result.ok()) << result.status();
      ++ended;
    }
    EXPECT_EQ(ended, 500);
    const SchedulerStats stats = scheduler.Stats();
    EXPECT_EQ(stats.submitted, 500);
    EXPECT_EQ(stats.completed + stats.cancelled + stats.failed, 500);
    EXPECT_EQ(stats.failed, 0);
    EXPECT_GT(stats.cancelled, 0);
    EXPECT_LE(stats.cancelled, cancelled_by_us);
    EXPECT_EQ(stats.running, 0);
    EXPECT_EQ(stats.waiting, 0);
    EXPECT_EQ(live.load(), 0);  // every finished request released its cache
  }
  EXPECT_EQ(live.load(), 0);
}

// The same load with half the requests paged over one small block pool (preemptions, prefix
// reuse from shared prompt starts, cancellations while waiting, running or preempted): every
// request ends, and afterwards the pool is entirely free (cached prefix blocks are free to
// take) and no block is referenced.
TEST(SchedulerTest, SoakOverASmallPoolLeavesThePoolFree) {
  GPT model = RandomModel("pythia-14m", 9);
  KVCacheGeometry geometry;
  geometry.layers = model->CacheLayout();
  BlockPoolOptions pool_options;
  pool_options.entries_per_block = 4;
  pool_options.num_blocks = 44;  // 176 entries: about five paged requests at once
  std::shared_ptr<BlockPool> pool = *BlockPool::Create(geometry, pool_options);
  std::mt19937 rng(77);
  std::vector<int64_t> common(24);
  for (int64_t& id : common) id = rng() % 96;
  {
    SchedulerOptions options;
    options.max_running = 10;
    options.prefill_chunk = 6;
    options.step_prefill_tokens = 18;
    Scheduler scheduler(model, options, pool);
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (int i = 0; i < 500; ++i) {
      const int64_t length = 1 + rng() % 30;
      std::vector<int64_t> prompt(length);
      for (int64_t& id : prompt) id = rng() % 96;
      if (i % 3 == 0) {  // a shared start
        std::copy(common.begin(), common.begin() + std::min<int64_t>(length, 24), prompt.begin());
      }
      GenerateOptions o;
      o.max_new_tokens = 1 + rng() % 34;
      o.sampling = {1.0, 0, 1.0};
      o.seed = i;
      std::unique_ptr<KVCache> cache;
      if (i % 2 == 0) {
        cache = *PagedKVCache::Create(pool, length + o.max_new_tokens);
      } else {
        cache = BatchOneCache(*model, TestSpec("sink", 6, 8), length + o.max_new_tokens);
      }
      absl::StatusOr<std::shared_ptr<RequestHandle>> handle =
          scheduler.Submit(prompt, o, std::move(cache));
      ASSERT_TRUE(handle.ok()) << handle.status();
      handles.push_back(*handle);
      if (rng() % 4 == 0) handles[rng() % handles.size()]->Cancel();
    }
    for (auto& handle : handles) {
      absl::StatusOr<RequestResult> result = handle->Wait();
      ASSERT_TRUE(result.ok()) << result.status();
    }
    const SchedulerStats stats = scheduler.Stats();
    std::cout << "preemptions " << stats.preemptions << ", prefix hits " << stats.prefix_hits
              << ", steps " << stats.steps << "\n";
    EXPECT_EQ(stats.completed + stats.cancelled + stats.failed, 500);
    EXPECT_EQ(stats.failed, 0);
    EXPECT_GT(stats.preemptions, 0);
    EXPECT_GT(stats.prefix_hits, 0);
    EXPECT_EQ(stats.pool_blocks_used, 0);
  }
  EXPECT_EQ(pool->free_blocks(), pool->num_blocks());
  // Every block can be taken at once: none is still referenced.
  std::vector<int64_t> all;
  for (int64_t i = 0; i < pool->num_blocks(); ++i) all.push_back(*pool->Allocate());
  EXPECT_EQ(pool->free_blocks(), 0);
  for (int64_t block : all) pool->Release(block);
}

}  // namespace
}  // namespace lgpt
