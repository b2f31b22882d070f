// Serving over a pool of int8 / int4 KV entries (KVMemoryOptions.entry_bits,
// EngineOptions.kv_pool_dtype "int8" / "int4": codes and float16 scales inside the blocks):
// every paged request's tokens equal lgpt::Generate's alone with a paged cache over a pool of
// the same entries (batched rows decode the blocks as a batch-1 step does), greedy and
// sampled, through preemption and prefix reuse; requests whose caches keep storage of their
// own beside the pool give theirs. On the default model the engine's greedy tokens over an
// int8 pool are Generate's over one, and are compared with the float32 pool's and with the
// quantised policy cache's (the agreement is printed, not asserted equal).
#include <ATen/ATen.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/block_pool.h"
#include "cache/kv_cache_factory.h"
#include "cache/paged_kv_cache.h"
#include "core/model/generate.h"
#include "core/model/gpt.h"
#include "core/serving/kv_memory.h"
#include "core/serving/scheduler.h"
#include "gtest/gtest.h"
#include "lgpt.h"
#include "tests/serving_test_util.h"

namespace lgpt {
namespace {

int64_t Length(const Job& job) {
  return static_cast<int64_t>(job.prompt.size()) + job.options.max_new_tokens;
}

// Whether KVMemory pages `spec` in a quantised pool: dense requests only.
bool Paged(const KVCacheSpec& spec) { return spec.policy == "dense" && spec.bits == 16; }

// The job's tokens from lgpt::Generate with a paged cache of its own over a pool of `bits`-bit
// entries.
std::vector<int64_t> AlonePaged(GPTImpl& model, const Job& job, int bits) {
  std::unique_ptr<PagedKVCache> cache = *PagedKVCache::Create(
      TestPool(model, (Length(job) + 3) / 4, 4, at::kFloat, bits), Length(job));
  absl::StatusOr<std::vector<int64_t>> tokens = Generate(model, *cache, job.prompt, job.options);
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  return tokens.ok() ? *tokens : std::vector<int64_t>();
}

struct Outcome {
  std::vector<RequestResult> results;
  SchedulerStats stats;
};

// The jobs through a scheduler over KVMemory::Create with `bits`-bit entries in `blocks` blocks.
Outcome Serve(GPT model, const std::vector<Job>& jobs, const SchedulerOptions& options,
              int64_t blocks, int bits) {
  KVCacheGeometry geometry;
  geometry.layers = model->CacheLayout();
  KVMemoryOptions memory_options;
  memory_options.pool_bytes = blocks * BlockPool::BytesPerBlock(geometry, 4, bits);
  memory_options.entries_per_block = 4;
  memory_options.prefix_caching = options.prefix_caching;
  memory_options.entry_bits = bits;
  std::unique_ptr<KVMemory> memory = *KVMemory::Create(geometry, memory_options);
  EXPECT_EQ(memory->pool()->entry_bits(), bits);
  const KVMemory& pool = *memory;
  Scheduler scheduler(model, options, std::move(memory));
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (const Job& job : jobs) {
    std::unique_ptr<KVCache> cache = *pool.NewCache(job.spec, geometry, Length(job));
    absl::StatusOr<std::shared_ptr<RequestHandle>> handle =
        scheduler.Submit(job.prompt, job.options, std::move(cache));
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

class QuantisedPoolTest : public ::testing::TestWithParam<int> {};

// A pool far too small for every request at once: preempted dense requests recompute over the
// quantised pool, batched with others, and still give Generate's tokens alone over such a
// pool; budgeted and quantised requests beside them (their own storage, charged to the pool)
// give theirs.
TEST_P(QuantisedPoolTest, BatchedAndPreemptedRequestsEqualGenerateAlone) {
  const int bits = GetParam();
  GPT model = GoldenModel("golden/llama2");
  std::vector<Job> jobs = Jobs(*model, 18, 7);
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (i % 3 != 1) jobs[i].spec = TestSpec("dense", 0, 16);  // most requests paged
    jobs[i].options.max_new_tokens += 10;
    jobs[i].options.prefill_chunk = jobs[i].options.prefill_chunk > 0 ? 5 : 6;
  }
  SchedulerOptions options;
  options.max_running = 8;
  options.prefill_chunk = 6;
  options.prefix_caching = false;
  std::vector<std::vector<int64_t>> expected;
  int64_t paged = 0;
  for (const Job& job : jobs) {
    const bool in_pool = Paged(job.spec);
    paged += in_pool;
    expected.push_back(in_pool ? AlonePaged(*model, job, bits) : Alone(*model, job));
  }
  EXPECT_GE(paged, 12);
  const Outcome outcome = Serve(model, jobs, options, 24, bits);
  ASSERT_EQ(outcome.results.size(), jobs.size());
  int64_t sampled = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i, " ", DescribeKVCacheSpec(jobs[i].spec)));
    EXPECT_EQ(outcome.results[i].tokens, expected[i]);
    if (jobs[i].options.sampling.temperature > 0) ++sampled;
  }
  EXPECT_GT(sampled, 0);
  EXPECT_GT(outcome.stats.preemptions, 0);
  EXPECT_GT(outcome.stats.peak_decode_rows, 1);
  EXPECT_EQ(outcome.stats.pool_blocks, 24);
  EXPECT_EQ(outcome.stats.pool_blocks_used, 0);
}

// Prompts sharing a prefix: later requests attach the first one's quantised blocks (copy-on-
// write of a shared last block) and give Generate's tokens alone.
TEST_P(QuantisedPoolTest, SharedPrefixBlocksAreReused) {
  const int bits = GetParam();
  GPT model = GoldenModel("golden/llama2");
  std::vector<Job> jobs = Jobs(*model, 6, 11);
  const std::vector<int64_t> shared = {5, 9, 2, 7, 1, 8, 3, 6, 4, 10, 12, 11};  // 3 blocks
  for (size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].spec = TestSpec("dense", 0, 16);
    std::vector<int64_t> prompt = shared;
    if (i != 1) prompt.insert(prompt.end(), jobs[i].prompt.begin(), jobs[i].prompt.end());
    jobs[i].prompt = prompt;
    jobs[i].options.prefill_chunk = 0;
  }
  SchedulerOptions options;
  options.max_running = 4;
  options.prefill_chunk = 64;
  options.prefix_caching = true;
  std::vector<std::vector<int64_t>> expected;
  for (const Job& job : jobs) expected.push_back(AlonePaged(*model, job, bits));
  const Outcome first = Serve(model, {jobs[0]}, options, 64, bits);
  EXPECT_EQ(first.results[0].tokens, expected[0]);
  const Outcome outcome = Serve(model, jobs, options, 64, bits);
  int64_t hits = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i));
    EXPECT_EQ(outcome.results[i].tokens, expected[i]);
    hits += outcome.results[i].prefix_hit_tokens;
  }
  EXPECT_GT(hits, 0);
  EXPECT_GT(outcome.stats.prefix_hits, 0);
}

INSTANTIATE_TEST_SUITE_P(Bits, QuantisedPoolTest, ::testing::Values(8, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("int", info.param);
                         });

constexpr char kDefaultModel[] = "tools/default_model";

std::shared_ptr<const Engine> LoadEngine(const std::string& kv_pool_dtype) {
  EngineOptions options;
  options.serving.kv_pool_bytes = 16 << 20;
  options.serving.prefill_chunk = 1 << 20;  // whole prompts, as Generate by default
  options.kv_pool_dtype = kv_pool_dtype;
  absl::StatusOr<std::shared_ptr<const Engine>> engine = Engine::Load(kDefaultModel, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *engine : nullptr;
}

// The default model served over an int8 pool: ~3.8x the float32 pool's blocks in the same
// bytes; each request's greedy tokens are Generate's with an int8 paged cache alone; the share
// equal to the float32 pool's and to the quantised policy cache's (int8, no residual: the same
// codes, but a prompt reads its own entries in full precision there) is printed.
TEST(QuantisedPoolEngineTest, DefaultModelOverAnInt8Pool) {
  std::shared_ptr<const Engine> int8 = LoadEngine("int8");
  std::shared_ptr<const Engine> fp32 = LoadEngine("model");
  ASSERT_NE(int8, nullptr);
  ASSERT_NE(fp32, nullptr);
  EXPECT_GT(int8->ServingStats().pool_blocks * 10, fp32->ServingStats().pool_blocks * 35);
  const std::vector<std::string> prompts = {
      "In the beginning God created the heaven and the earth.",
      "And God said, Let there be light:",
      "The LORD is my shepherd; I shall not want.",
      "Blessed are the poor in spirit:",
  };
  RequestOptions options;
  options.max_new_tokens = 32;
  options.sampling = {0.0, 0, 1.0};
  options.stop_at_eos = false;
  std::vector<std::shared_ptr<Request>> over_int8, over_fp32;
  for (const std::string& prompt : prompts) {
    over_int8.push_back(*int8->Submit(prompt, options));
    over_fp32.push_back(*fp32->Submit(prompt, options));
  }
  int64_t equal_fp32 = 0, equal_policy = 0, total = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(prompts[i]);
    absl::StatusOr<Completion> a = over_int8[i]->Wait();
    absl::StatusOr<Completion> b = over_fp32[i]->Wait();
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    Job job;
    job.prompt = *int8->Encode(prompts[i]);
    job.options.max_new_tokens = options.max_new_tokens;
    job.options.sampling = options.sampling;
    EXPECT_EQ(a->tokens, AlonePaged(int8->model(), job, 8));
    job.spec = TestSpec("dense", 0, 8);
    job.spec.residual = 0;
    const std::vector<int64_t> policy = Alone(int8->model(), job);
    ASSERT_EQ(a->tokens.size(), b->tokens.size());
    ASSERT_EQ(a->tokens.size(), policy.size());
    for (size_t t = 0; t < a->tokens.size(); ++t) {
      equal_fp32 += a->tokens[t] == b->tokens[t];
      equal_policy += a->tokens[t] == policy[t];
    }
    total += static_cast<int64_t>(a->tokens.size());
  }
  std::printf(
      "int8 pool: %lld of %lld greedy tokens equal the float32 pool's, %lld the int8 "
      "policy cache's\n",
      static_cast<long long>(equal_fp32), static_cast<long long>(total),
      static_cast<long long>(equal_policy));
}

}  // namespace
}  // namespace lgpt
