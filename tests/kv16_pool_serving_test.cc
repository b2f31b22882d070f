// Serving over a pool of 16-bit KV entries for a float32 model (KVMemoryOptions.entry_dtype,
// EngineOptions.kv_pool_dtype): every request's tokens equal lgpt::Generate's alone with a
// paged cache over a pool of the same dtype (batched rows read the blocks as a batch-1 step
// does), greedy and sampled, through preemption and prefix reuse; on the default model the
// engine's greedy tokens over a bfloat16 pool are those of Generate over one, and are compared
// with the float32 pool's (the agreement is printed, not asserted equal).
#include <ATen/ATen.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/block_pool.h"
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

// The job's tokens from lgpt::Generate with a paged cache of its own over a pool of `dtype`.
std::vector<int64_t> AlonePaged(GPTImpl& model, const Job& job, at::ScalarType dtype) {
  std::unique_ptr<PagedKVCache> cache =
      *PagedKVCache::Create(TestPool(model, (Length(job) + 3) / 4, 4, dtype), Length(job));
  absl::StatusOr<std::vector<int64_t>> tokens = Generate(model, *cache, job.prompt, job.options);
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  return tokens.ok() ? *tokens : std::vector<int64_t>();
}

struct Outcome {
  std::vector<RequestResult> results;
  SchedulerStats stats;
};

// The jobs through a scheduler over KVMemory::Create with entries of `dtype` (dense requests
// paged in its pool, the others charged to it).
Outcome Serve(GPT model, const std::vector<Job>& jobs, const SchedulerOptions& options,
              int64_t pool_bytes, at::ScalarType dtype) {
  KVCacheGeometry geometry;
  geometry.layers = model->CacheLayout();
  KVMemoryOptions memory_options;
  memory_options.pool_bytes = pool_bytes;
  memory_options.entries_per_block = 4;
  memory_options.prefix_caching = options.prefix_caching;
  memory_options.entry_dtype = dtype;
  std::unique_ptr<KVMemory> memory = *KVMemory::Create(geometry, memory_options);
  EXPECT_EQ(memory->pool()->dtype(), dtype);
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

// Bytes of `blocks` blocks of 4 entries of `dtype` for `model`.
int64_t PoolBytes(GPTImpl& model, at::ScalarType dtype, int64_t blocks) {
  KVCacheGeometry geometry;
  geometry.layers = model.CacheLayout();
  geometry.dtype = dtype;
  return blocks * BlockPool::BytesPerBlock(geometry, 4);
}

class SixteenBitPoolTest : public ::testing::TestWithParam<at::ScalarType> {};

// A pool far too small for every request at once: preempted dense requests recompute over the
// 16-bit pool, batched with others, and still give Generate's tokens alone over such a pool;
// budgeted and quantised requests beside them (their own float32 storage, charged to the
// pool) give theirs.
TEST_P(SixteenBitPoolTest, BatchedAndPreemptedRequestsEqualGenerateAlone) {
  const at::ScalarType dtype = GetParam();
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
  for (const Job& job : jobs) {
    expected.push_back(job.spec.policy == "dense" && job.spec.bits == 16
                           ? AlonePaged(*model, job, dtype)
                           : Alone(*model, job));
  }
  const Outcome outcome = Serve(model, jobs, options, PoolBytes(*model, dtype, 16), dtype);
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
  EXPECT_EQ(outcome.stats.pool_blocks, 16);
  EXPECT_EQ(outcome.stats.pool_blocks_used, 0);
}

// Prompts sharing a prefix: later requests attach the first one's 16-bit blocks (copy-on-write
// of a shared last block) and give Generate's tokens alone.
TEST_P(SixteenBitPoolTest, SharedPrefixBlocksAreReused) {
  const at::ScalarType dtype = GetParam();
  GPT model = GoldenModel("golden/llama2");
  std::vector<Job> jobs = Jobs(*model, 6, 11);
  const std::vector<int64_t> shared = {5, 9, 2, 7, 1, 8, 3, 6, 4, 10, 12, 11};  // 3 blocks
  for (size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].spec = TestSpec("dense", 0, 16);
    std::vector<int64_t> prompt = shared;
    // Job 1's prompt is the shared blocks alone: its last block is copied before it is written.
    if (i != 1) prompt.insert(prompt.end(), jobs[i].prompt.begin(), jobs[i].prompt.end());
    jobs[i].prompt = prompt;
    jobs[i].options.prefill_chunk = 0;
  }
  SchedulerOptions options;
  options.max_running = 4;
  options.prefill_chunk = 64;
  options.prefix_caching = true;
  std::vector<std::vector<int64_t>> expected;
  for (const Job& job : jobs) expected.push_back(AlonePaged(*model, job, dtype));
  // The first request alone first, so that the others find its blocks published.
  const Outcome first = Serve(model, {jobs[0]}, options, PoolBytes(*model, dtype, 64), dtype);
  EXPECT_EQ(first.results[0].tokens, expected[0]);
  const Outcome outcome = Serve(model, jobs, options, PoolBytes(*model, dtype, 64), dtype);
  int64_t hits = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i));
    EXPECT_EQ(outcome.results[i].tokens, expected[i]);
    hits += outcome.results[i].prefix_hit_tokens;
  }
  EXPECT_GT(hits, 0);
  EXPECT_GT(outcome.stats.prefix_hits, 0);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SixteenBitPoolTest, ::testing::Values(at::kBFloat16, at::kHalf),
                         [](const ::testing::TestParamInfo<at::ScalarType>& info) {
                           return std::string(info.param == at::kBFloat16 ? "bfloat16" : "float16");
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

// The default model served over a bfloat16 pool: twice the float32 pool's blocks in the same
// bytes; each request's greedy tokens are Generate's with a bfloat16 paged cache alone, and
// mostly the float32 pool's (the share of equal tokens is printed).
TEST(SixteenBitPoolEngineTest, DefaultModelOverABfloat16Pool) {
  std::shared_ptr<const Engine> bf16 = LoadEngine("bfloat16");
  std::shared_ptr<const Engine> fp32 = LoadEngine("model");
  ASSERT_NE(bf16, nullptr);
  ASSERT_NE(fp32, nullptr);
  const std::vector<std::string> prompts = {
      "In the beginning God created the heaven and the earth.",
      "And God said, Let there be light:",
      "The LORD is my shepherd; I shall not want.",
      "And it came to pass in those days,",
      "Blessed are the poor in spirit:",
      "For God so loved the world,",
  };
  RequestOptions options;
  options.max_new_tokens = 32;
  options.sampling = {0.0, 0, 1.0};
  options.stop_at_eos = false;
  std::vector<std::shared_ptr<Request>> over_bf16, over_fp32;
  for (const std::string& prompt : prompts) {
    over_bf16.push_back(*bf16->Submit(prompt, options));
    over_fp32.push_back(*fp32->Submit(prompt, options));
  }
  int64_t equal = 0, total = 0, equal_requests = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(prompts[i]);
    absl::StatusOr<Completion> a = over_bf16[i]->Wait();
    absl::StatusOr<Completion> b = over_fp32[i]->Wait();
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    // Generate alone with a bfloat16 paged cache.
    const std::vector<int64_t> ids = *bf16->Encode(prompts[i]);
    Job job;
    job.prompt = ids;
    job.options.max_new_tokens = options.max_new_tokens;
    job.options.sampling = options.sampling;
    const std::vector<int64_t> alone = AlonePaged(bf16->model(), job, at::kBFloat16);
    EXPECT_EQ(a->tokens, alone);
    ASSERT_EQ(a->tokens.size(), b->tokens.size());
    bool same = true;
    for (size_t t = 0; t < a->tokens.size(); ++t) {
      same = same && a->tokens[t] == b->tokens[t];
      equal += same ? 1 : 0;  // tokens before the first difference
    }
    total += static_cast<int64_t>(a->tokens.size());
    equal_requests += a->tokens == b->tokens ? 1 : 0;
  }
  std::printf(
      "bfloat16 pool vs float32 pool, greedy: %lld of %lld tokens before the first "
      "difference, %lld of %zu requests identical\n",
      static_cast<long long>(equal), static_cast<long long>(total),
      static_cast<long long>(equal_requests), prompts.size());
  EXPECT_GT(equal, 0);
  const SchedulerStats a = bf16->ServingStats(), b = fp32->ServingStats();
  EXPECT_EQ(a.pool_blocks, 2 * b.pool_blocks);
  EXPECT_EQ(2 * a.pool_block_bytes, b.pool_block_bytes);
  // A bad name is refused at load, naming the field.
  EngineOptions bad;
  bad.kv_pool_dtype = "int8";
  const absl::Status refused = Engine::Load(kDefaultModel, bad).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("EngineOptions.kv_pool_dtype"), std::string::npos) << refused;
}

}  // namespace
}  // namespace lgpt
