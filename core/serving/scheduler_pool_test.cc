// The scheduler over a shared KV block pool (core/serving/scheduler.h, cache/block_pool.h):
// a pool too small for everything at once preempts and recomputes requests without changing
// a single token (dense paged requests beside budgeted and quantised ones with their own
// caches, greedy and sampled, prefix reuse on and off); shared prompt prefixes are computed
// once and reused, including a prompt that is a whole number of blocks (copy-on-write of
// its last block); a request larger than the pool is refused; the pool is entirely free when
// every request has ended.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/block_pool.h"
#include "cache/kv_cache_factory.h"
#include "cache/paged_kv_cache.h"
#include "core/model/generate.h"
#include "core/model/gpt.h"
#include "core/serving/scheduler.h"
#include "gtest/gtest.h"
#include "tests/serving_test_util.h"

namespace lgpt {
namespace {

int64_t Length(const Job& job) {
  return static_cast<int64_t>(job.prompt.size()) + job.options.max_new_tokens;
}

// Dense jobs draw blocks from the pool; the others keep their own caches, grown a block at a
// time and charged to the pool (as Engine::Submit makes them).
std::unique_ptr<KVCache> CacheOf(GPTImpl& model, const Job& job,
                                 const std::shared_ptr<BlockPool>& pool) {
  if (job.spec.policy == "dense" && job.spec.bits == 16) {
    absl::StatusOr<std::unique_ptr<PagedKVCache>> paged = PagedKVCache::Create(pool, Length(job));
    EXPECT_TRUE(paged.ok()) << paged.status();
    return *std::move(paged);
  }
  return BatchOneCache(model, job.spec, Length(job), pool->entries_per_block());
}

struct Outcome {
  std::vector<RequestResult> results;
  SchedulerStats stats;
};

// `prefixes`: the prefix cache over `pool` that outlives this scheduler (null: one of its own,
// as options.prefix_caching says).
Outcome Serve(GPT model, const std::vector<Job>& jobs, SchedulerOptions options,
              const std::shared_ptr<BlockPool>& pool,
              const std::shared_ptr<PrefixCache>& prefixes = nullptr) {
  Scheduler scheduler(model, options,
                      prefixes != nullptr
                          ? std::make_unique<KVMemory>(pool, prefixes)
                          : std::make_unique<KVMemory>(pool, options.prefix_caching));
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (const Job& job : jobs) {
    absl::StatusOr<std::shared_ptr<RequestHandle>> handle =
        scheduler.Submit(job.prompt, job.options, CacheOf(*model, job, pool));
    EXPECT_TRUE(handle.ok()) << handle.status();
    if (handle.ok()) handles.push_back(*handle);
  }
  Outcome outcome;
  for (auto& handle : handles) {
    absl::StatusOr<RequestResult> result = handle->Wait();
    EXPECT_TRUE(result.ok()) << result.status();
    outcome.results.push_back(result.ok() ? *result : RequestResult());
  }
  outcome.stats = scheduler.Stats();
  return outcome;
}

class PreemptionTest : public ::testing::TestWithParam<bool> {};

TEST_P(PreemptionTest, NeverChangesAToken) {
  GPT model = GoldenModel("golden/llama2");
  std::vector<Job> jobs = Jobs(*model, 18, 5);
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (i % 2 == 0) jobs[i].spec = TestSpec("dense", 0, 16);  // most requests paged
    jobs[i].options.max_new_tokens += 10;
  }
  SchedulerOptions options;
  options.max_running = 8;
  options.prefill_chunk = 6;
  options.prefix_caching = GetParam();
  // 9 blocks of 4 entries hold the longest request (19 + 24 tokens) alone, far from all.
  std::shared_ptr<BlockPool> pool = TestPool(*model, 14, 4);
  std::vector<std::vector<int64_t>> expected;
  for (Job& job : jobs) {
    job.options.prefill_chunk = job.options.prefill_chunk > 0 ? job.options.prefill_chunk : 6;
    expected.push_back(Alone(*model, job));
  }
  const Outcome outcome = Serve(model, jobs, options, pool);
  ASSERT_EQ(outcome.results.size(), jobs.size());
  int64_t preempted = 0, preempted_own_storage = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i, " ", DescribeKVCacheSpec(jobs[i].spec)));
    EXPECT_EQ(outcome.results[i].tokens, expected[i]);
    preempted += outcome.results[i].preemptions;
    if (i % 2 == 1) preempted_own_storage += outcome.results[i].preemptions;
  }
  EXPECT_GT(outcome.stats.preemptions, 0);
  // Requests with storage of their own (charged to the pool) are preempted too.
  EXPECT_GT(preempted_own_storage, 0);
  EXPECT_EQ(outcome.stats.preemptions, preempted);
  EXPECT_EQ(outcome.stats.completed, static_cast<int64_t>(jobs.size()));
  EXPECT_EQ(outcome.stats.pool_blocks_used, 0);
  EXPECT_EQ(pool->free_blocks(), pool->num_blocks());
  if (!GetParam()) {
    EXPECT_EQ(pool->idle_blocks(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(PrefixCaching, PreemptionTest, ::testing::Bool());

TEST(PrefixReuseTest, SharedPrefixIsComputedOnce) {
  GPT model = GoldenModel("golden/llama2");
  const int64_t vocab = model->config().PaddedVocabSize();
  at::manual_seed(9);
  const at::Tensor shared = at::randint(0, vocab, {24}, at::kLong);
  std::vector<Job> jobs;
  for (int i = 0; i < 6; ++i) {
    Job job;
    job.prompt.assign(shared.data_ptr<int64_t>(), shared.data_ptr<int64_t>() + 24);
    // Suffixes of 1, 2, .. 5 tokens, and none (the whole prompt is cached: copy-on-write of
    // its last block).
    for (int j = 0; j < (i == 5 ? 0 : i + 1); ++j) job.prompt.push_back((7 * i + 3 * j) % vocab);
    job.options.max_new_tokens = 8;
    job.options.sampling = i % 2 ? SamplingOptions{0.9, 10, 1.0} : SamplingOptions{0.0, 0, 1.0};
    job.options.seed = 40 + i;
    job.options.prefill_chunk = 8;
    job.spec = TestSpec("dense", 0, 16);
    jobs.push_back(job);
  }
  std::shared_ptr<BlockPool> pool = TestPool(*model, 64, 4);
  const auto prefixes = std::make_shared<PrefixCache>(pool);
  SchedulerOptions options;
  options.prefill_chunk = 8;
  // The first request fills the cache; the later ones (one at a time, then all at once) hit.
  Outcome first = Serve(model, {jobs[0]}, options, pool, prefixes);
  EXPECT_EQ(first.results[0].prefix_hit_tokens, 0);
  EXPECT_GT(pool->idle_blocks(), 0);
  std::vector<Job> later(jobs.begin() + 1, jobs.end());
  Outcome rest = Serve(model, later, options, pool, prefixes);
  for (size_t i = 0; i < later.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i + 1));
    EXPECT_EQ(rest.results[i].tokens, Alone(*model, later[i]));
    // All 24 shared tokens, or 23 when the prompt is exactly the cached blocks (the last
    // token is computed again for its logits).
    EXPECT_EQ(rest.results[i].prefix_hit_tokens, later[i].prompt.size() == 24 ? 23 : 24);
  }
  EXPECT_EQ(rest.stats.prefix_hits, static_cast<int64_t>(later.size()));
  EXPECT_EQ(rest.stats.prefill_tokens, 2 + 3 + 4 + 5 + 1);  // suffixes; the recomputed last token
  EXPECT_EQ(pool->free_blocks(), pool->num_blocks());
}

// Prefix hits beside misses in the same prefill passes (a budget of several chunks), beside
// budgeted and quantised requests with their own caches: every request equals its batch-1
// run, each hit counts only its suffix against the step's budget, and requests submitted
// together with a common prefix still compute it once (those that would continue blocks a
// chunk of the step computes wait for them).
TEST(PrefixReuseTest, HitsAndMissesShareAPrefillPass) {
  GPT model = GoldenModel("golden/llama2");
  const int64_t vocab = model->config().PaddedVocabSize();
  at::manual_seed(13);
  const at::Tensor shared = at::randint(0, vocab, {16}, at::kLong);
  const std::vector<int64_t> prefix(shared.data_ptr<int64_t>(), shared.data_ptr<int64_t>() + 16);
  std::vector<Job> others = Jobs(*model, 8, 17);  // misses, of every kind of cache
  std::vector<Job> jobs;
  for (int i = 0; i < 12; ++i) {
    Job job;
    if (i % 3 == 2) {
      job = others[i / 3];
    } else {
      job.prompt = prefix;
      for (int j = 0; j < 1 + i % 5; ++j) job.prompt.push_back((11 * i + 5 * j) % vocab);
      job.options.max_new_tokens = 6 + i % 4;
      job.options.sampling = i % 4 == 1 ? SamplingOptions{0.8, 12, 1.0} : SamplingOptions{};
      job.options.seed = 70 + i;
      job.spec = TestSpec("dense", 0, 16);
    }
    job.options.prefill_chunk = 6;
    jobs.push_back(job);
  }
  std::vector<std::vector<int64_t>> expected;
  for (const Job& job : jobs) expected.push_back(Alone(*model, job));
  SchedulerOptions options;
  options.max_running = 12;
  options.prefill_chunk = 6;
  options.step_prefill_tokens = 24;
  std::shared_ptr<BlockPool> pool = TestPool(*model, 160, 4);
  const Outcome outcome = Serve(model, jobs, options, pool);
  ASSERT_EQ(outcome.results.size(), jobs.size());
  int64_t hits = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i, " ", DescribeKVCacheSpec(jobs[i].spec)));
    EXPECT_EQ(outcome.results[i].tokens, expected[i]);
    if (i % 3 != 2 && i > 0) {
      // Everything the first request computed of the common 16 ids.
      EXPECT_EQ(outcome.results[i].prefix_hit_tokens, 16);
      ++hits;
    }
  }
  EXPECT_EQ(outcome.stats.prefix_hits, hits);
  EXPECT_GT(outcome.stats.prefill_chunks, outcome.stats.prefill_passes);
  EXPECT_EQ(pool->free_blocks(), pool->num_blocks());
}

TEST(PrefixReuseTest, LogitsOfAPrefixHitMatchAFreshPrefill) {
  GPT model = GoldenModel("golden/llama3_gqa");
  const int64_t vocab = model->config().PaddedVocabSize();
  at::manual_seed(4);
  const at::Tensor ids = at::randint(0, vocab, {21}, at::kLong);
  const std::vector<int64_t> prompt(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + 21);
  std::shared_ptr<BlockPool> pool = TestPool(*model, 32, 4);
  PrefixCache prefixes(pool);
  at::NoGradGuard no_grad;
  auto last_logits = [&](PagedKVCache& cache, int64_t from) {
    ForwardOptions forward;
    forward.positions = at::arange(from, 21, at::kLong).unsqueeze(0);
    forward.last_logits_only = true;
    const at::Tensor input = ids.narrow(0, from, 21 - from).unsqueeze(0);
    absl::StatusOr<at::Tensor> logits = model->Forward(input, &cache, forward);
    EXPECT_TRUE(logits.ok()) << logits.status();
    return *logits;
  };
  std::unique_ptr<PagedKVCache> fresh = *PagedKVCache::Create(pool, 32);
  const at::Tensor expected = last_logits(*fresh, 0);
  fresh->PublishPrefix(prefixes, prompt);
  std::unique_ptr<PagedKVCache> reused = *PagedKVCache::Create(pool, 32);
  ASSERT_EQ(reused->AttachPrefix(prefixes, prompt), 20);
  EXPECT_TRUE(at::allclose(last_logits(*reused, 20), expected, 1e-4, 1e-4));
}

TEST(PoolAdmissionTest, RequestLargerThanThePoolIsRefused) {
  GPT model = GoldenModel("golden/llama2");
  std::shared_ptr<BlockPool> pool = TestPool(*model, 4, 4);
  Scheduler scheduler(model, {}, pool);
  GenerateOptions options;
  options.max_new_tokens = 10;
  const std::vector<int64_t> prompt(8, 1);  // 18 entries: 5 blocks of 4
  absl::StatusOr<std::shared_ptr<RequestHandle>> refused =
      scheduler.Submit(prompt, options, *PagedKVCache::Create(pool, 18));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  options.max_new_tokens = 8;  // 16 entries: fits alone
  absl::StatusOr<std::shared_ptr<RequestHandle>> fits =
      scheduler.Submit(prompt, options, *PagedKVCache::Create(pool, 16));
  ASSERT_TRUE(fits.ok()) << fits.status();
  ASSERT_TRUE((*fits)->Wait().ok());
  EXPECT_EQ(scheduler.Stats().pool_blocks_used, 0);
}

// Budgeted and quantised caches keep their own storage, charged to the pool as it grows (at
// most its bound, MaxBytes): the pool limits how many run at once, their tokens do not change,
// and the charge is returned.
TEST(PoolAdmissionTest, BudgetedCachesChargeTheirBytesToThePool) {
  GPT model = GoldenModel("golden/llama2");
  std::vector<Job> jobs = Jobs(*model, 8, 13);
  for (Job& job : jobs) job.spec = TestSpec("sink", 8, 4);
  const std::unique_ptr<KVCache> probe = BatchOneCache(*model, jobs[0].spec, 64);
  const int64_t bytes = probe->storage_bound()->MaxBytes();
  // Blocks of 1 entry: the pool's budget in bytes is close to what three caches need.
  std::shared_ptr<BlockPool> pool = TestPool(*model, 1, 1);
  const int64_t per_block = pool->BytesPerBlock();
  {
    Scheduler too_small(model, {}, pool);
    EXPECT_EQ(
        too_small.Submit(jobs[0].prompt, jobs[0].options, BatchOneCache(*model, jobs[0].spec, 64))
            .status()
            .code(),
        absl::StatusCode::kResourceExhausted);
  }
  pool = TestPool(*model, (3 * bytes + per_block - 1) / per_block, 1);  // room for three at once
  SchedulerOptions options;
  options.max_running = 8;
  Scheduler scheduler(model, options, pool);
  std::atomic<int64_t> most_reserved{0};
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (const Job& job : jobs) {
    GenerateOptions o = job.options;
    o.on_token = [&most_reserved, &pool, &scheduler](int64_t) {
      most_reserved = std::max(most_reserved.load(),
                               scheduler.memory().charged_blocks() * pool->BytesPerBlock());
      return true;
    };
    // One length for all, so every request reserves the same bytes.
    handles.push_back(*scheduler.Submit(job.prompt, o, BatchOneCache(*model, job.spec, 64)));
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    absl::StatusOr<RequestResult> result = handles[i]->Wait();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->tokens, Alone(*model, jobs[i])) << "request " << i;
  }
  // Three at once, never four (reservations in bytes, rounded up to a block together).
  EXPECT_GT(most_reserved.load(), 2 * bytes);
  EXPECT_LE(most_reserved.load(), 3 * bytes + per_block);
  EXPECT_EQ(scheduler.memory().charged_blocks(), 0);
  EXPECT_EQ(scheduler.Stats().pool_blocks_used, 0);
}

// Budgeted caches whose prompts are far below their budget grow while they decode: admitted by
// what they will hold at their bound, as many run as the pool holds at that bound, and none is
// preempted (admitted on their first chunk, they would be, again and again, as they grow).
TEST(PoolAdmissionTest, BudgetedCachesAreAdmittedByTheirBound) {
  GPT model = GoldenModel("golden/llama2");
  std::vector<Job> jobs = Jobs(*model, 10, 17);
  for (size_t i = 0; i < jobs.size(); ++i) {
    Job& job = jobs[i];
    job.spec = TestSpec(i % 2 == 0 ? "sink" : "h2o", 12, 4);
    job.prompt.resize(std::min<size_t>(job.prompt.size(), 3));
    job.options.max_new_tokens = 24;
  }
  const std::unique_ptr<KVCache> probe = BatchOneCache(*model, jobs[0].spec, 64);
  const int64_t bytes = probe->storage_bound()->MaxBytes();
  std::shared_ptr<BlockPool> pool = TestPool(*model, 1, 1);
  const int64_t per_block = pool->BytesPerBlock();
  pool = TestPool(*model, (3 * bytes + per_block - 1) / per_block, 1);  // three at their bound
  SchedulerOptions options;
  options.max_running = 10;
  Scheduler scheduler(model, options, pool);
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (const Job& job : jobs) {
    handles.push_back(
        *scheduler.Submit(job.prompt, job.options, BatchOneCache(*model, job.spec, 64, 1)));
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    absl::StatusOr<RequestResult> result = handles[i]->Wait();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->tokens, Alone(*model, jobs[i])) << "request " << i;
    EXPECT_EQ(result->preemptions, 0) << "request " << i;
  }
  const SchedulerStats stats = scheduler.Stats();
  EXPECT_EQ(stats.preemptions, 0);
  EXPECT_GE(stats.peak_decode_rows, 2);
  EXPECT_LE(stats.peak_decode_rows, 3);
  EXPECT_EQ(scheduler.memory().charged_blocks(), 0);
}

// An unbudgeted int8 cache grows a block at a time with its request: the pool's charge follows
// the entries it holds (never all of max_new_tokens up front) and goes back at the end.
TEST(PoolAdmissionTest, QuantisedCachesAreChargedAsTheyGrow) {
  GPT model = GoldenModel("golden/llama2");
  std::vector<Job> jobs = Jobs(*model, 1, 21);
  Job& job = jobs[0];
  job.spec = TestSpec("dense", 0, 8);
  job.options.max_new_tokens = 40;
  std::shared_ptr<BlockPool> pool = TestPool(*model, 64, 4);
  Scheduler scheduler(model, {}, pool);
  std::vector<int64_t> reserved;  // blocks charged when each token arrives
  GenerateOptions options = job.options;
  options.on_token = [&reserved, &scheduler](int64_t) {
    reserved.push_back(scheduler.memory().charged_blocks());
    return true;
  };
  std::unique_ptr<KVCache> cache = CacheOf(*model, job, pool);
  const int64_t max_blocks = pool->BlocksForBytes(cache->storage_bound()->MaxBytes());
  absl::StatusOr<std::shared_ptr<RequestHandle>> handle =
      scheduler.Submit(job.prompt, options, std::move(cache));
  ASSERT_TRUE(handle.ok()) << handle.status();
  absl::StatusOr<RequestResult> result = (*handle)->Wait();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->tokens, Alone(*model, job));
  ASSERT_EQ(reserved.size(), 40u);
  EXPECT_TRUE(std::is_sorted(reserved.begin(), reserved.end()));
  EXPECT_LT(reserved.front(), reserved.back());
  EXPECT_LT(reserved.front(), max_blocks / 2);
  EXPECT_LE(reserved.back(), max_blocks);
  EXPECT_EQ(scheduler.memory().charged_blocks(), 0);
}

}  // namespace
}  // namespace lgpt
