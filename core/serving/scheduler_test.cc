// Continuous batching (core/serving/scheduler.h) against batch-1 generation: every request's
// tokens equal lgpt::Generate's for its own prompt, options, seed and kind of cache, whatever
// else runs in the same steps: golden LitGPT checkpoints and small random models of the
// sliding-window / soft-capping families, dense, budgeted and quantised caches, greedy and
// sampled decoding, prompts of every length (chunked prefill). Then cancellation, callbacks that
// stop or throw, shutdown with requests in flight, and refused submissions.
#include "core/serving/scheduler.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/block_pool.h"
#include "cache/kv_cache_factory.h"
#include "cache/paged_kv_cache.h"
#include "core/config/config_presets.h"
#include "core/model/checkpoint.h"
#include "core/model/generate.h"
#include "core/model/gpt.h"
#include "gtest/gtest.h"
#include "tests/serving_test_util.h"
#include "tests/test_models.h"

namespace lgpt {
namespace {

// The scheduler's statistics after the requests (for checks of how they were batched).
SchedulerStats ExpectBatchedEqualsAlone(GPT model, int count, SchedulerOptions options) {
  const std::vector<Job> jobs = Jobs(*model, count, 7);
  Scheduler scheduler(model, options);
  std::vector<std::vector<int64_t>> expected;
  for (Job job : jobs) {
    job.options.prefill_chunk = scheduler.EffectiveChunk(job.options);
    expected.push_back(Alone(*model, job));
  }

  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (const Job& job : jobs) {
    absl::StatusOr<std::shared_ptr<RequestHandle>> handle = scheduler.Submit(
        job.prompt, job.options,
        BatchOneCache(*model, job.spec,
                      static_cast<int64_t>(job.prompt.size()) + job.options.max_new_tokens));
    EXPECT_TRUE(handle.ok()) << handle.status();
    if (!handle.ok()) return scheduler.Stats();
    handles.push_back(*handle);
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i, " ", DescribeKVCacheSpec(jobs[i].spec)));
    absl::StatusOr<RequestResult> result = handles[i]->Wait();
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) continue;
    EXPECT_FALSE(result->cancelled);
    EXPECT_EQ(result->tokens, expected[i]);
    EXPECT_EQ(result->stats.new_tokens, static_cast<int64_t>(expected[i].size()));
    EXPECT_EQ(result->inter_token_s.size() + 1, expected[i].size());
  }
  const SchedulerStats stats = scheduler.Stats();
  EXPECT_EQ(stats.completed, count);
  EXPECT_EQ(stats.failed, 0);
  EXPECT_GT(stats.decode_rows, stats.decode_passes);  // Steps really were batched.
  EXPECT_GE(stats.prefill_chunks, stats.prefill_passes);
  // Staggered prompts: decode rows rode along with prompt chunks in some steps.
  EXPECT_GT(stats.mixed_passes, 0);
  EXPECT_LE(stats.mixed_passes, std::min(stats.prefill_passes, stats.decode_passes));
  return stats;
}

class SchedulerGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SchedulerGoldenTest, EveryRequestEqualsItsBatchOneRun) {
  SchedulerOptions options;
  options.max_running = 5;
  options.prefill_chunk = 6;
  options.step_prefill_tokens = 9;
  ExpectBatchedEqualsAlone(GoldenModel(GetParam()), 14, options);
}

// A step budget of several chunks: the prompt chunks of several requests (different lengths
// and positions, whole prompts and 5-token chunks, dense, budgeted and quantised caches) run in
// one forward pass, and every request still equals its batch-1 run.
TEST_P(SchedulerGoldenTest, PromptChunksOfSeveralRequestsShareAPass) {
  SchedulerOptions options;
  options.max_running = 8;
  options.prefill_chunk = 7;
  options.step_prefill_tokens = 40;
  const SchedulerStats stats = ExpectBatchedEqualsAlone(GoldenModel(GetParam()), 14, options);
  EXPECT_GT(stats.prefill_chunks, stats.prefill_passes);
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, SchedulerGoldenTest,
                         ::testing::Values("golden/llama2", "golden/llama3_gqa", "golden/pythia"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param.substr(info.param.find('/') + 1);
                         });

class SchedulerFamilyTest : public ::testing::TestWithParam<std::string> {};

// Sliding windows, soft-capping, local RoPE, MoE: the families whose attention differs.
TEST_P(SchedulerFamilyTest, EveryRequestEqualsItsBatchOneRun) {
  SchedulerOptions options;
  options.max_running = 4;
  ExpectBatchedEqualsAlone(RandomModel(GetParam(), 3), 10, options);
}

TEST_P(SchedulerFamilyTest, PromptChunksOfSeveralRequestsShareAPass) {
  SchedulerOptions options;
  options.max_running = 6;
  options.prefill_chunk = 9;
  options.step_prefill_tokens = 32;
  const SchedulerStats stats = ExpectBatchedEqualsAlone(RandomModel(GetParam(), 4), 10, options);
  EXPECT_GT(stats.prefill_chunks, stats.prefill_passes);
}

INSTANTIATE_TEST_SUITE_P(Presets, SchedulerFamilyTest,
                         ::testing::Values("Gemma-2-2b", "Gemma-3-1b-it", "Mixtral-8x7B-v0.1",
                                           "phi-2"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

// Requests whose caches are pages of one shared BlockPool: each equals its batch-1 run with
// its own dense cache, the pool holds what is in use, and it is entirely free afterwards.
TEST(SchedulerTest, PagedCachesOverOneSharedPool) {
  GPT model = GoldenModel("golden/llama2");
  std::vector<Job> jobs = Jobs(*model, 12, 21);
  KVCacheGeometry geometry;
  geometry.layers = model->CacheLayout();
  BlockPoolOptions pool_options;
  pool_options.entries_per_block = 4;
  pool_options.num_blocks = 96;
  std::shared_ptr<BlockPool> pool = *BlockPool::Create(geometry, pool_options);
  SchedulerOptions options;
  options.max_running = 6;
  options.prefill_chunk = 5;
  Scheduler scheduler(model, options);
  std::vector<std::vector<int64_t>> expected;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (Job& job : jobs) {
    job.spec = TestSpec("dense", 0, 16);
    job.options.prefill_chunk = scheduler.EffectiveChunk(job.options);
    expected.push_back(Alone(*model, job));
    const int64_t length = static_cast<int64_t>(job.prompt.size()) + job.options.max_new_tokens;
    absl::StatusOr<std::unique_ptr<PagedKVCache>> cache = PagedKVCache::Create(pool, length);
    ASSERT_TRUE(cache.ok()) << cache.status();
    handles.push_back(*scheduler.Submit(job.prompt, job.options, *std::move(cache)));
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    absl::StatusOr<RequestResult> result = handles[i]->Wait();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->tokens, expected[i]) << "request " << i;
    EXPECT_GT(result->stats.kv_cache_bytes, 0);
  }
  EXPECT_EQ(pool->free_blocks(), pool->num_blocks());
}

TEST(SchedulerTest, CancelAndCallbacksEndOnlyTheirOwnRequest) {
  GPT model = GoldenModel("golden/llama2");
  std::vector<Job> jobs = Jobs(*model, 4, 11);
  for (Job& job : jobs) {
    job.options.max_new_tokens = 12;
    job.options.sampling = {0.0, 0, 1.0};
    job.spec = TestSpec("dense", 0, 16);
  }
  std::vector<std::vector<int64_t>> expected;
  for (const Job& job : jobs) expected.push_back(Alone(*model, job));

  SchedulerOptions options;
  options.max_running = 4;
  Scheduler scheduler(model, options);
  std::atomic<int> seen{0};
  std::shared_ptr<RequestHandle> cancelled_handle;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (size_t i = 0; i < jobs.size(); ++i) {
    GenerateOptions o = jobs[i].options;
    if (i == 1) o.on_token = [](int64_t) { return false; };  // stops after one token
    if (i == 2) o.on_token = [](int64_t) -> bool { throw std::runtime_error("boom"); };
    if (i == 3) {
      o.on_token = [&seen](int64_t) {
        ++seen;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        return true;
      };
    }
    absl::StatusOr<std::shared_ptr<RequestHandle>> handle =
        scheduler.Submit(jobs[i].prompt, o, BatchOneCache(*model, jobs[i].spec, 64));
    ASSERT_TRUE(handle.ok()) << handle.status();
    handles.push_back(*handle);
  }
  while (seen < 3) std::this_thread::yield();
  handles[3]->Cancel();

  absl::StatusOr<RequestResult> full = handles[0]->Wait();
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->tokens, expected[0]);
  absl::StatusOr<RequestResult> stopped = handles[1]->Wait();
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->tokens, std::vector<int64_t>{expected[1][0]});
  absl::StatusOr<RequestResult> threw = handles[2]->Wait();
  ASSERT_FALSE(threw.ok());
  EXPECT_NE(threw.status().message().find("boom"), std::string::npos) << threw.status();
  absl::StatusOr<RequestResult> cancelled = handles[3]->Wait();
  ASSERT_TRUE(cancelled.ok());
  EXPECT_TRUE(cancelled->cancelled);
  ASSERT_LT(cancelled->tokens.size(), expected[3].size());
  EXPECT_EQ(
      cancelled->tokens,
      std::vector<int64_t>(expected[3].begin(), expected[3].begin() + cancelled->tokens.size()));
  const SchedulerStats stats = scheduler.Stats();
  EXPECT_EQ(stats.completed, 2);
  EXPECT_EQ(stats.failed, 1);
  EXPECT_EQ(stats.cancelled, 1);
}

TEST(SchedulerTest, DestroyingTheSchedulerCancelsRequestsInFlight) {
  GPT model = GoldenModel("golden/llama2");
  std::vector<std::shared_ptr<RequestHandle>> handles;
  {
    SchedulerOptions options;
    options.max_running = 2;
    Scheduler scheduler(model, options);
    for (int i = 0; i < 6; ++i) {
      GenerateOptions o;
      o.max_new_tokens = 40;
      absl::StatusOr<std::shared_ptr<RequestHandle>> handle =
          scheduler.Submit({1, 2, 3}, o, BatchOneCache(*model, TestSpec("dense", 0, 16), 64));
      ASSERT_TRUE(handle.ok());
      handles.push_back(*handle);
    }
  }
  int cancelled = 0;
  for (auto& handle : handles) {
    ASSERT_TRUE(handle->Done());
    absl::StatusOr<RequestResult> result = handle->Wait();
    ASSERT_TRUE(result.ok());
    cancelled += result->cancelled;
  }
  EXPECT_GT(cancelled, 0);
}

TEST(SchedulerTest, SubmissionsThatCanNeverRunAreRefused) {
  GPT model = GoldenModel("golden/llama2");
  SchedulerOptions options;
  options.max_waiting = 0;
  Scheduler scheduler(model, options);
  GenerateOptions o;
  o.max_new_tokens = 4;
  auto code = [&](std::vector<int64_t> prompt, GenerateOptions opts,
                  std::unique_ptr<KVCache> cache) {
    return scheduler.Submit(std::move(prompt), opts, std::move(cache)).status().code();
  };
  EXPECT_EQ(code({}, o, BatchOneCache(*model, TestSpec("dense", 0, 16), 8)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({1, 2, 3}, o, nullptr), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({1, 2, 3, 4, 5}, o, BatchOneCache(*model, TestSpec("dense", 0, 16), 8)),
            absl::StatusCode::kOutOfRange);  // 5 + 4 tokens in a cache of 8
  EXPECT_EQ(code({1, 1 << 30}, o, BatchOneCache(*model, TestSpec("dense", 0, 16), 8)),
            absl::StatusCode::kOutOfRange);
  GenerateOptions negative = o;
  negative.max_new_tokens = -1;
  EXPECT_EQ(code({1}, negative, BatchOneCache(*model, TestSpec("dense", 0, 16), 8)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({1}, o, BatchOneCache(*model, TestSpec("dense", 0, 16), 8)),
            absl::StatusCode::kResourceExhausted);  // max_waiting 0
}

}  // namespace
}  // namespace lgpt
