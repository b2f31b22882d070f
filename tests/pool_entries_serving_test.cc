// Serving over a pool whose KV entries are narrower than a float32 model's: bfloat16 / float16
// entries (KVMemoryOptions.entry_dtype) and int8 / int4 codes with float16 scales inside the
// blocks (KVMemoryOptions.entry_bits), as EngineOptions.kv_pool_dtype asks. Every paged
// request's tokens equal lgpt::Generate's alone with a paged cache over a pool of the same
// entries (batched rows read the blocks as a batch-1 step does), greedy and sampled, through
// preemption and prefix reuse; requests whose caches keep storage of their own beside the pool
// give theirs; h2o and tova requests keep their budget's slots in pool blocks of those entries
// (cache/scored_paged_kv_cache.h) and equal Generate alone with such a cache. On the default model
// the engine's greedy tokens over a bfloat16 / int8 / int4 pool are Generate's over one, and are
// compared with the float32 pool's (the agreement is printed, not asserted equal).
#include <ATen/ATen.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/block_pool.h"
#include "cache/paged_kv_cache.h"
#include "cache/scored_paged_kv_cache.h"
#include "core/model/generate.h"
#include "core/model/gpt.h"
#include "core/serving/kv_memory.h"
#include "core/serving/scheduler.h"
#include "gtest/gtest.h"
#include "lgpt.h"
#include "tests/serving_test_util.h"

namespace lgpt {
namespace {

// A pool's entries: `kv_pool_dtype`'s name, and what KVPoolEntriesFor makes of it.
struct Entries {
  std::string name;
  at::ScalarType dtype;
  int bits;
};

int64_t Length(const Job& job) {
  return static_cast<int64_t>(job.prompt.size()) + job.options.max_new_tokens;
}

// The paged cache KVMemory gives `spec` (dense, or a sink or window ring), if any.
std::optional<PagedEviction> Paged(GPTImpl& model, const KVCacheSpec& spec) {
  KVCacheGeometry geometry;
  geometry.layers = model.CacheLayout();
  return *PagedEvictionFor(spec, geometry);
}

// The job's tokens from lgpt::Generate with a paged cache of its own over a pool of `entries`,
// keeping what the job's spec keeps.
std::vector<int64_t> AlonePaged(GPTImpl& model, const Job& job, const Entries& entries) {
  std::unique_ptr<PagedKVCache> cache =
      *PagedKVCache::Create(TestPool(model, (Length(job) + 3) / 4, 4, entries.dtype, entries.bits),
                            Length(job), Paged(model, job.spec).value());
  absl::StatusOr<std::vector<int64_t>> tokens = Generate(model, *cache, job.prompt, job.options);
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  return tokens.ok() ? *tokens : std::vector<int64_t>();
}

// The job's tokens from lgpt::Generate with a ScoredPagedKVCache of its own (h2o / tova as
// KVMemory keeps them) over a pool of `entries`.
std::vector<int64_t> AloneScored(GPTImpl& model, const Job& job, const Entries& entries) {
  const std::shared_ptr<BlockPool> pool =
      TestPool(model, (Length(job) + 3) / 4, 4, entries.dtype, entries.bits);
  KVCacheGeometry geometry;
  geometry.layers = model.CacheLayout();
  geometry.dtype = model.dtype();
  absl::StatusOr<std::optional<EvictionPolicyOptions>> policy =
      ScoredPagedPolicyFor(job.spec, geometry);
  EXPECT_TRUE(policy.ok() && policy->has_value()) << DescribeKVCacheSpec(job.spec);
  if (!policy.ok() || !policy->has_value()) return {};
  ScoredPagedKVCacheOptions options;
  options.pool = pool;
  options.max_sequence_length = Length(job);
  options.policy = **policy;
  std::unique_ptr<ScoredPagedKVCache> cache = *ScoredPagedKVCache::Create(options);
  absl::StatusOr<std::vector<int64_t>> tokens = Generate(model, *cache, job.prompt, job.options);
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  return tokens.ok() ? *tokens : std::vector<int64_t>();
}

struct Outcome {
  std::vector<RequestResult> results;
  SchedulerStats stats;
  int64_t scored_paged = 0;  // requests whose caches were ScoredPagedKVCaches
};

// The jobs through a scheduler over KVMemory::Create with `blocks` blocks of 4 `entries` (dense
// requests paged in its pool, the others charged to it).
Outcome Serve(GPT model, const std::vector<Job>& jobs, const SchedulerOptions& options,
              int64_t blocks, const Entries& entries) {
  KVCacheGeometry geometry;
  geometry.layers = model->CacheLayout();
  geometry.dtype = model->dtype();
  KVMemoryOptions memory_options;
  memory_options.entries_per_block = 4;
  memory_options.prefix_caching = options.prefix_caching;
  memory_options.entry_dtype = entries.dtype;
  memory_options.entry_bits = entries.bits;
  KVCacheGeometry pool_geometry = geometry;
  pool_geometry.dtype = entries.dtype;
  memory_options.pool_bytes = blocks * BlockPool::BytesPerBlock(pool_geometry, 4, entries.bits);
  std::unique_ptr<KVMemory> memory = *KVMemory::Create(geometry, memory_options);
  EXPECT_EQ(memory->pool()->entry_bits(), entries.bits);
  const KVMemory& pool = *memory;
  Scheduler scheduler(model, options, std::move(memory));
  std::vector<std::shared_ptr<RequestHandle>> handles;
  int64_t scored_paged = 0;
  for (const Job& job : jobs) {
    std::unique_ptr<KVCache> cache = *pool.NewCache(job.spec, geometry, Length(job));
    if (dynamic_cast<ScoredPagedKVCache*>(cache.get()) != nullptr) ++scored_paged;
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
  outcome.scored_paged = scored_paged;
  return outcome;
}

class PoolEntriesTest : public ::testing::TestWithParam<Entries> {};

// A pool far too small for every request at once: preempted dense requests recompute over the
// pool, batched with others, and still give Generate's tokens alone over such a pool, as window
// requests do (a ring of blocks of the pool); scoring and quantised requests beside them (their
// own storage, charged to the pool) give theirs.
TEST_P(PoolEntriesTest, BatchedAndPreemptedRequestsEqualGenerateAlone) {
  const Entries entries = GetParam();
  GPT model = GoldenModel("golden/llama2");
  std::vector<Job> jobs = Jobs(*model, 18, 7);
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (i % 3 != 1) jobs[i].spec = TestSpec("dense", 0, 16);  // most requests paged
    if (i == 10) jobs[i].spec = TestSpec("sink", 8, 16);      // and a sink ring
    jobs[i].options.max_new_tokens += 10;
    jobs[i].options.prefill_chunk = jobs[i].options.prefill_chunk > 0 ? 5 : 6;
  }
  SchedulerOptions options;
  options.max_running = 8;
  options.prefill_chunk = 6;
  options.prefix_caching = false;
  std::vector<std::vector<int64_t>> expected;
  for (const Job& job : jobs) {
    expected.push_back(Paged(*model, job.spec) ? AlonePaged(*model, job, entries)
                                               : Alone(*model, job));
  }
  // (16 int4 blocks are fewer bytes than one of these jobs' int8 policy caches needs.)
  const int64_t blocks = entries.bits == 4 ? 24 : 16;
  const Outcome outcome = Serve(model, jobs, options, blocks, entries);
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
  EXPECT_EQ(outcome.stats.pool_blocks, blocks);
  EXPECT_EQ(outcome.stats.pool_blocks_used, 0);
}

// h2o, h2o-vlen and tova requests (budget 8, so most of them evict) batched with dense ones in a
// pool too small for all at once: each keeps its slots in blocks of the pool's entries, is
// preempted and recomputed like the others (its prompt in the same chunks, its tokens replayed),
// and gives Generate's tokens alone with a ScoredPagedKVCache over such a pool; every block
// comes back.
// (16 requests, 12 of them h2o / h2o-vlen / tova, in 14 blocks of 4 `entries`.)
void ExpectScoringRequestsEqualGenerateAlone(GPT model, const Entries& entries) {
  std::vector<Job> jobs = Jobs(*model, 16, 13);
  int64_t scoring = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const char* policy = i % 4 == 1   ? "dense"
                         : i % 2 == 0 ? "h2o"
                         : i % 8 == 3 ? "h2o-vlen"
                                      : "tova";
    jobs[i].spec = TestSpec(policy, i % 4 == 1 ? 0 : 8, 16);
    jobs[i].options.max_new_tokens += 12;
    jobs[i].options.prefill_chunk = i % 3 == 0 ? 4 : 7;
    scoring += i % 4 == 1 ? 0 : 1;
  }
  SchedulerOptions options;
  options.max_running = 8;
  options.prefill_chunk = 7;
  options.prefix_caching = false;
  std::vector<std::vector<int64_t>> expected;
  int64_t evicting = 0;
  for (const Job& job : jobs) {
    const bool scored = job.spec.policy != "dense";
    expected.push_back(scored ? AloneScored(*model, job, entries)
                              : AlonePaged(*model, job, entries));
    evicting += scored && Length(job) > job.spec.budget + 1 ? 1 : 0;
  }
  EXPECT_GT(evicting, scoring / 2) << "most scoring requests outgrow their budget";
  const int64_t blocks = 14;
  const Outcome outcome = Serve(model, jobs, options, blocks, entries);
  ASSERT_EQ(outcome.results.size(), jobs.size());
  EXPECT_EQ(outcome.scored_paged, scoring);
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i, " ", DescribeKVCacheSpec(jobs[i].spec)));
    EXPECT_EQ(outcome.results[i].tokens, expected[i]);
  }
  EXPECT_GT(outcome.stats.preemptions, 0);
  EXPECT_GT(outcome.stats.peak_decode_rows, 1);
  EXPECT_EQ(outcome.stats.pool_blocks, blocks);
  EXPECT_EQ(outcome.stats.pool_blocks_used, 0);
}

TEST_P(PoolEntriesTest, ScoringRequestsInPoolSlotsEqualGenerateAlone) {
  ExpectScoringRequestsEqualGenerateAlone(GoldenModel("golden/llama2"), GetParam());
}

// Whether ATen's `dtype` projections give each row the bits it gets alone, whatever the batch
// (lgpt's own float32 GEMV does; ATen's bfloat16 GEMM may pick another kernel per batch size).
bool AtenLinearRowsAreBatchInvariant(at::ScalarType dtype) {
  at::manual_seed(5);
  const at::Tensor w = at::randn({96, 64}).to(dtype);
  for (const int64_t rows : {2, 3, 5, 8, 13, 16}) {
    const at::Tensor x = at::randn({rows, 64}).to(dtype);
    const at::Tensor y = at::linear(x, w);  // [rows, 96]
    for (int64_t r = 0; r < rows; ++r) {
      if (!at::equal(y[r], at::linear(x.narrow(0, r, 1), w)[0])) return false;
    }
  }
  return true;
}

// A bfloat16 model's h2o and tova requests (the dtype of most released checkpoints) are paged
// in a pool of its own entries too: ScoredPagedKVCache widens them to float32 on their way in,
// exactly (float16 models: //cache:scored_paged_kv_cache_test, where this LibTorch has the ops).
// Batched rows equal rows alone only where ATen's bfloat16 projections are batch-invariant.
TEST(PoolEntriesModelDtypeTest, BFloat16ModelScoringRequestsEqualGenerateAlone) {
  if (!AtenLinearRowsAreBatchInvariant(at::kBFloat16)) {
    GTEST_SKIP() << "this LibTorch's bfloat16 linear gives a row other bits in a batch than "
                    "alone: batched requests are not comparable to the bit";
  }
  GPT model = GoldenModel("golden/llama2");
  model->To(at::kCPU, at::kBFloat16);
  ExpectScoringRequestsEqualGenerateAlone(model, Entries{"bfloat16", at::kBFloat16, 16});
}

// Prompts sharing a prefix: later requests attach the first one's blocks (copy-on-write of a
// shared last block) and give Generate's tokens alone (quantised entries are read as stored,
// so a prefix hit changes nothing).
TEST_P(PoolEntriesTest, SharedPrefixBlocksAreReused) {
  const Entries entries = GetParam();
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
  for (const Job& job : jobs) expected.push_back(AlonePaged(*model, job, entries));
  // The first request alone first, so that the others find its blocks published.
  const Outcome first = Serve(model, {jobs[0]}, options, 64, entries);
  EXPECT_EQ(first.results[0].tokens, expected[0]);
  const Outcome outcome = Serve(model, jobs, options, 64, entries);
  int64_t hits = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i));
    EXPECT_EQ(outcome.results[i].tokens, expected[i]);
    hits += outcome.results[i].prefix_hit_tokens;
  }
  EXPECT_GT(hits, 0);
  EXPECT_GT(outcome.stats.prefix_hits, 0);
}

const Entries kBfloat16{"bfloat16", at::kBFloat16, 16};
const Entries kFloat16{"float16", at::kHalf, 16};
const Entries kInt8{"int8", at::kFloat, 8};
const Entries kInt4{"int4", at::kFloat, 4};

std::string EntriesName(const ::testing::TestParamInfo<Entries>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(Entries, PoolEntriesTest,
                         ::testing::Values(kBfloat16, kFloat16, kInt8, kInt4), EntriesName);

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

class PoolEntriesEngineTest : public ::testing::TestWithParam<Entries> {};

// The default model served over a pool of narrower entries: more blocks in the same bytes (2x
// for 16-bit entries, ~3.8x int8, ~7.1x int4 at head size 32); each request's greedy tokens are
// Generate's with such a paged cache alone, and mostly the float32 pool's (the share of equal
// tokens is printed).
TEST_P(PoolEntriesEngineTest, DefaultModelOverThePool) {
  const Entries entries = GetParam();
  std::shared_ptr<const Engine> narrow = LoadEngine(entries.name);
  std::shared_ptr<const Engine> fp32 = LoadEngine("model");
  ASSERT_NE(narrow, nullptr);
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
  std::vector<std::shared_ptr<Request>> over_narrow, over_fp32;
  for (const std::string& prompt : prompts) {
    over_narrow.push_back(*narrow->Submit(prompt, options));
    over_fp32.push_back(*fp32->Submit(prompt, options));
  }
  int64_t equal = 0, total = 0, equal_requests = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(prompts[i]);
    absl::StatusOr<Completion> a = over_narrow[i]->Wait();
    absl::StatusOr<Completion> b = over_fp32[i]->Wait();
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    Job job;
    job.prompt = *narrow->Encode(prompts[i]);
    job.options.max_new_tokens = options.max_new_tokens;
    job.options.sampling = options.sampling;
    EXPECT_EQ(a->tokens, AlonePaged(narrow->model(), job, entries));
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
      "%s pool vs float32 pool, greedy: %lld of %lld tokens before the first difference, %lld "
      "of %zu requests identical\n",
      entries.name.c_str(), static_cast<long long>(equal), static_cast<long long>(total),
      static_cast<long long>(equal_requests), prompts.size());
  EXPECT_GT(equal, 0);
  const SchedulerStats a = narrow->ServingStats(), b = fp32->ServingStats();
  const double ratio = static_cast<double>(b.pool_block_bytes) / a.pool_block_bytes;
  EXPECT_GE(ratio, entries.bits == 16 ? 2.0 : 3.5);
  EXPECT_EQ(a.pool_blocks, b.pool_blocks * b.pool_block_bytes / a.pool_block_bytes);
}

INSTANTIATE_TEST_SUITE_P(Entries, PoolEntriesEngineTest, ::testing::Values(kBfloat16, kInt8, kInt4),
                         EntriesName);

// A bad name is refused at load, naming the field.
TEST(PoolEntriesEngineErrors, BadNamesAreRefusedAtLoad) {
  EngineOptions bad;
  bad.kv_pool_dtype = "int2";
  const absl::Status refused = Engine::Load(kDefaultModel, bad).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("EngineOptions.kv_pool_dtype"), std::string::npos) << refused;
}

}  // namespace
}  // namespace lgpt
