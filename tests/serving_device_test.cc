// The serving engine on the test device (LGPT_DEVICE, core/base/device.h): the model, every
// request's cache and the KV block pool live there, and what the CPU suites check of the
// scheduler (scheduler_test, scheduler_pool_test, scheduler_fork_test,
// scheduler_speculative_test, scheduler_soak_test) is checked on that device: batched requests
// with caches of every kind, a device pool with preemption, prefix reuse, churn, speculative rows
// and n choices. CI runs it on the CPU (both toolchains); the GPU check (tools/gpu/pack.sh) with
// LGPT_DEVICE=cuda. There batched matrix products (cuBLAS) round differently from a batch-1
// step's, so a served request is compared with Generate alone on the same device by what the
// model computed rather than bit for bit:
//   - every token equal, and the chosen token's log-probability within the device's tolerance
//     where the served request reported it, up to the end or to the first token that differs;
//   - a greedy request may differ only at a near tie: Generate alone's two most likely tokens
//     there include the served one, within the tolerance of the chosen one (after that the
//     two streams read different contexts, and the comparison stops);
//   - a sampled request may not differ at all (float32 only: a draw changes only when the
//     rounding moves a cumulative probability across its uniform number).
// On a device other than the CPU, greedy requests are also served on the CPU and compared with
// the same rule (CUDA == CPU through the whole serving stack: paged pool, kernels, sampling).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/block_pool.h"
#include "cache/kv_cache_factory.h"
#include "core/base/device.h"
#include "core/base/dtype_support.h"
#include "core/model/generate.h"
#include "core/model/gpt.h"
#include "core/serving/kv_memory.h"
#include "core/serving/scheduler.h"
#include "core/speculative/draft_model_proposer.h"
#include "core/speculative/ngram_proposer.h"
#include "gtest/gtest.h"
#include "tests/serving_test_util.h"

namespace lgpt {
namespace {

// What a generation produced: its tokens, and each token's log-probabilities when asked.
struct Trace {
  std::vector<int64_t> tokens;
  std::vector<TokenLogprob> logprobs;
  int64_t preemptions = 0;
  int64_t prefix_hit_tokens = 0;
};

// Log-probability differences a batched step may show against a batch-1 step: rounding of
// float32 products, or of a 16-bit model's activations.
double Tolerance(c10::ScalarType dtype) { return dtype == c10::kFloat ? 2e-4 : 0.15; }

int64_t Length(const Job& job) {
  return static_cast<int64_t>(job.prompt.size()) + job.options.max_new_tokens;
}

// `model` (a fresh CPU copy from its loader) on the test device in `dtype`.
GPT OnTestDevice(GPT model, c10::ScalarType dtype) {
  model->To(DefaultDevice(), dtype);
  return model;
}

KVCacheGeometry GeometryOf(const GPTImpl& model) {
  KVCacheGeometry geometry;
  geometry.layers = model.CacheLayout();
  geometry.dtype = model.dtype();
  geometry.device = model.device();
  return geometry;
}

// A pool of `blocks` blocks of `entries_per_block` entries on the model's device: entries of
// `entries.dtype` (Undefined: the model's), or int8 / int4 codes.
std::shared_ptr<BlockPool> DevicePool(const GPTImpl& model, int64_t blocks,
                                      int64_t entries_per_block, const KVPoolEntries& entries) {
  KVCacheGeometry geometry = GeometryOf(model);
  if (entries.dtype != c10::ScalarType::Undefined) geometry.dtype = entries.dtype;
  BlockPoolOptions options;
  options.entries_per_block = entries_per_block;
  options.num_blocks = blocks;
  options.entry_bits = entries.bits;
  absl::StatusOr<std::shared_ptr<BlockPool>> pool = BlockPool::Create(geometry, options);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? *pool : nullptr;
}

// The batch-1 cache `memory` gives the job (no pool: the spec's own cache on the device);
// `rollback_slots` for speculative decoding.
std::unique_ptr<KVCache> CacheFor(const KVMemory& memory, const GPTImpl& model, const Job& job,
                                  int64_t rollback_slots = 0) {
  absl::StatusOr<std::unique_ptr<KVCache>> cache =
      memory.NewCache(job.spec, GeometryOf(model), Length(job), rollback_slots);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return cache.ok() ? *std::move(cache) : nullptr;
}

// Options that report each token's log-probabilities (with `top` most likely tokens) into
// `trace`.
GenerateOptions Reporting(GenerateOptions options, int64_t top, Trace* trace) {
  options.top_logprobs = top;
  options.on_logprob = [trace](const TokenLogprob& logprob) { trace->logprobs.push_back(logprob); };
  return options;
}

// Whether the served job reports its tokens' log-probabilities (rows whose tokens leave the
// device's sampler): every other one.
bool Reports(size_t job_index) { return job_index % 2 == 1; }

// The job alone through lgpt::Generate with a cache `memory` gives it. Greedy jobs report their
// two most likely tokens a step; a sampled one reports as the served job does, so that both draw
// through the same path.
Trace Alone(GPTImpl& model, const KVMemory& memory, const Job& job, bool served_reports) {
  Trace trace;
  const bool greedy = job.options.sampling.temperature == 0;
  const GenerateOptions options = greedy           ? Reporting(job.options, 2, &trace)
                                  : served_reports ? Reporting(job.options, 0, &trace)
                                                   : job.options;
  std::unique_ptr<KVCache> cache = CacheFor(memory, model, job);
  absl::StatusOr<std::vector<int64_t>> tokens = Generate(model, *cache, job.prompt, options);
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  if (tokens.ok()) trace.tokens = *tokens;
  return trace;
}

// The comparison of the file's comment: `served` against `alone`, where `alone` reported its
// two most likely tokens for greedy jobs. Returns whether the streams differ somewhere.
bool ExpectSameGeneration(const Job& job, const Trace& alone, const Trace& served,
                          double tolerance) {
  const bool greedy = job.options.sampling.temperature == 0;
  const size_t common = std::min(alone.tokens.size(), served.tokens.size());
  for (size_t i = 0; i < common; ++i) {
    if (i < served.logprobs.size() && i < alone.logprobs.size()) {
      EXPECT_NEAR(served.logprobs[i].logprob, alone.logprobs[i].logprob, tolerance)
          << "token " << i;
    }
    if (alone.tokens[i] == served.tokens[i]) continue;
    if (!greedy || i >= alone.logprobs.size()) {
      ADD_FAILURE() << "token " << i << ": " << served.tokens[i] << " served, " << alone.tokens[i]
                    << " alone";
      return true;
    }
    const TokenLogprob& step = alone.logprobs[i];
    bool near_tie = false;
    for (const auto& [id, logprob] : step.top) {
      near_tie |= id == served.tokens[i] && logprob >= step.logprob - tolerance;
    }
    EXPECT_TRUE(near_tie) << "token " << i << ": " << served.tokens[i] << " served, not within "
                          << tolerance << " of alone's " << alone.tokens[i] << " (logprob "
                          << step.logprob << ")";
    return true;
  }
  EXPECT_EQ(served.tokens.size(), alone.tokens.size());
  return false;
}

struct Served {
  std::vector<Trace> traces;
  SchedulerStats stats;
};

// Waits for every request (a null handle: one Submit refused) and fills served->traces[i] from
// request i's result (traces kept for the log-probabilities they already hold), then the
// scheduler's statistics.
void Collect(const std::vector<std::shared_ptr<RequestHandle>>& handles, const Scheduler& scheduler,
             Served* served) {
  served->traces.resize(handles.size());
  for (size_t i = 0; i < handles.size(); ++i) {
    if (handles[i] == nullptr) continue;
    absl::StatusOr<RequestResult> result = handles[i]->Wait();
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) continue;
    served->traces[i].tokens = result->tokens;
    served->traces[i].preemptions = result->preemptions;
    served->traces[i].prefix_hit_tokens = result->prefix_hit_tokens;
  }
  served->stats = scheduler.Stats();
}

// The jobs submitted at once to a scheduler over `memory`, each with a cache it gives, some
// reporting their chosen tokens' log-probabilities (Reports).
Served Serve(GPT model, const std::vector<Job>& jobs, SchedulerOptions options,
             std::unique_ptr<KVMemory> memory) {
  Served served;
  served.traces.resize(jobs.size());
  Scheduler scheduler(model, options, std::move(memory));
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const GenerateOptions request =
        Reports(i) ? Reporting(jobs[i].options, 0, &served.traces[i]) : jobs[i].options;
    absl::StatusOr<std::shared_ptr<RequestHandle>> handle =
        scheduler.Submit(jobs[i].prompt, request, CacheFor(scheduler.memory(), *model, jobs[i]));
    EXPECT_TRUE(handle.ok()) << handle.status();
    handles.push_back(handle.ok() ? *handle : nullptr);
  }
  Collect(handles, scheduler, &served);
  return served;
}

// Compares every served job with its run alone; prints how many streams met a near tie.
void ExpectEveryRequestAsAlone(GPTImpl& model, const KVMemory& alone_memory,
                               const std::vector<Job>& jobs, const Served& served) {
  ASSERT_EQ(served.traces.size(), jobs.size());
  int differing = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i, " ", DescribeKVCacheSpec(jobs[i].spec)));
    differing += ExpectSameGeneration(jobs[i], Alone(model, alone_memory, jobs[i], Reports(i)),
                                      served.traces[i], Tolerance(model.dtype()));
  }
  std::printf("%s %s: %zu requests, %d differ from Generate alone at a near tie\n",
              model.device().str().c_str(), c10::toString(model.dtype()), jobs.size(), differing);
}

// The jobs with greedy decoding only (16-bit models: a draw may move with the rounding).
std::vector<Job> Greedy(std::vector<Job> jobs) {
  for (Job& job : jobs) job.options.sampling = {0.0, 0, 1.0};
  return jobs;
}

struct ModelCase {
  std::string name;  // a golden checkpoint, or a preset shrunk with random weights
  bool golden;
  c10::ScalarType dtype;
};

void PrintTo(const ModelCase& model_case, std::ostream* os) {
  *os << model_case.name << " " << c10::toString(model_case.dtype);
}

std::string CaseName(const ::testing::TestParamInfo<ModelCase>& info) {
  std::string name = absl::StrCat(info.param.name, "_", c10::toString(info.param.dtype));
  for (char& c : name) {
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

GPT CpuModel(const ModelCase& model_case) {
  return model_case.golden ? GoldenModel(model_case.name) : RandomModel(model_case.name, 3);
}

class ServingOnDeviceTest : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override {
    if (!MultipliesMatrices(DefaultDevice(), GetParam().dtype)) {
      GTEST_SKIP() << "skipped: this LibTorch has no " << c10::toString(GetParam().dtype)
                   << " matrix products on " << DefaultDevice().str();
    }
    at::NoGradGuard no_grad;
    model_ = OnTestDevice(CpuModel(GetParam()), GetParam().dtype);
    std::printf("serving on %s\n", model_->device().str().c_str());
  }
  at::NoGradGuard no_grad_;
  GPT model_;
};

// Caches of their own (dense, window, sink, h2o, quantised dense, int4 tova) on the device,
// greedy and sampled requests batched in the same steps, whole and chunked prompts.
TEST_P(ServingOnDeviceTest, EveryRequestAsAlone) {
  std::vector<Job> jobs = Jobs(*model_, 14, 7);
  if (model_->dtype() != c10::kFloat) jobs = Greedy(jobs);
  SchedulerOptions options;
  options.max_running = 6;
  options.prefill_chunk = 6;
  for (Job& job : jobs) job.options.prefill_chunk = job.options.prefill_chunk ? 5 : 6;
  const KVMemory no_pool(nullptr, false);
  const Served served = Serve(model_, jobs, options, std::make_unique<KVMemory>(nullptr, false));
  ExpectEveryRequestAsAlone(*model_, no_pool, jobs, served);
  EXPECT_GT(served.stats.decode_rows, served.stats.decode_passes);  // steps were batched
  EXPECT_EQ(served.stats.completed, static_cast<int64_t>(jobs.size()));

  if (model_->device().is_cpu()) return;
  // CUDA == CPU for the greedy requests, served on the CPU.
  GPT cpu = CpuModel(GetParam());
  cpu->To(c10::Device(c10::kCPU), GetParam().dtype);
  const std::vector<Job> greedy = Greedy(jobs);
  const Served on_cpu = Serve(cpu, greedy, options, std::make_unique<KVMemory>(nullptr, false));
  const Served on_device =
      Serve(model_, greedy, options, std::make_unique<KVMemory>(nullptr, false));
  for (size_t i = 0; i < greedy.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i, " on the CPU and on ", model_->device().str()));
    const Trace cpu_alone = Alone(*cpu, no_pool, greedy[i], Reports(i));
    ExpectSameGeneration(greedy[i], cpu_alone, on_device.traces[i], Tolerance(cpu->dtype()));
    EXPECT_EQ(on_cpu.traces[i].tokens, cpu_alone.tokens);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ServingOnDeviceTest,
                         ::testing::Values(ModelCase{"golden/llama2", true, c10::kFloat},
                                           ModelCase{"golden/llama2", true, c10::kBFloat16},
                                           ModelCase{"golden/llama2", true, c10::kHalf},
                                           // sliding windows and soft-capping
                                           ModelCase{"Gemma-2-2b", false, c10::kFloat},
                                           // one query group (MQA)
                                           ModelCase{"falcon-7b", false, c10::kFloat},
                                           // experts (MoE)
                                           ModelCase{"Mixtral-8x7B-v0.1", false, c10::kFloat}),
                         CaseName);

std::string EntriesName(const KVPoolEntries& entries) {
  if (entries.bits != 16) return absl::StrCat("int", entries.bits);
  return entries.dtype == c10::ScalarType::Undefined ? "model" : c10::toString(entries.dtype);
}

class PoolOnDeviceTest : public ::testing::TestWithParam<KVPoolEntries> {};

// A pool on the device too small for every request at once: paged dense, sink and window rings,
// h2o / tova slots in the pool's entries beside (16-bit pools) a quantised cache charged to it;
// requests are
// preempted and recomputed, each equals Generate alone with the cache KVMemory gives it over a
// pool of the same entries, and every block is free at the end.
TEST_P(PoolOnDeviceTest, PreemptedRequestsAsAlone) {
  at::NoGradGuard no_grad;
  GPT model = OnTestDevice(GoldenModel("golden/llama2"), c10::kFloat);
  std::vector<Job> jobs = Jobs(*model, 18, 5);
  const std::vector<KVCacheSpec> specs = {
      TestSpec("dense", 0, 16), TestSpec("sink", 8, 16),     TestSpec("dense", 0, 16),
      TestSpec("h2o", 8, 16),   TestSpec("window", 8, 16),   TestSpec("tova", 8, 16),
      TestSpec("dense", 0, 8),  TestSpec("h2o-vlen", 8, 16), TestSpec("dense", 0, 16)};
  const bool quantised_pool = GetParam().bits != 16;
  for (size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].spec = specs[i % specs.size()];
    // An int8 / int4 pool's 14 blocks are fewer bytes than a cache of its own would take.
    if (quantised_pool && jobs[i].spec.bits != 16) jobs[i].spec.bits = 16;
    jobs[i].options.max_new_tokens += 10;
    jobs[i].options.prefill_chunk = jobs[i].options.prefill_chunk ? 5 : 6;
  }
  SchedulerOptions options;
  options.max_running = 8;
  options.prefill_chunk = 6;
  // 14 blocks of 4 entries hold the longest request (19 + 24 tokens) alone, far from all.
  const std::shared_ptr<BlockPool> pool = DevicePool(*model, 14, 4, GetParam());
  ASSERT_NE(pool, nullptr);
  const Served served = Serve(model, jobs, options, std::make_unique<KVMemory>(pool, true));
  const KVMemory alone(DevicePool(*model, 64, 4, GetParam()), false);
  ExpectEveryRequestAsAlone(*model, alone, jobs, served);
  int64_t preempted = 0;
  for (const Trace& trace : served.traces) preempted += trace.preemptions;
  EXPECT_GT(served.stats.preemptions, 0);
  EXPECT_EQ(served.stats.preemptions, preempted);
  EXPECT_EQ(served.stats.completed, static_cast<int64_t>(jobs.size()));
  EXPECT_EQ(served.stats.pool_blocks_used, 0);
  EXPECT_EQ(pool->free_blocks(), pool->num_blocks());
}

std::string EntriesCaseName(const ::testing::TestParamInfo<KVPoolEntries>& info) {
  return EntriesName(info.param);
}

INSTANTIATE_TEST_SUITE_P(Entries, PoolOnDeviceTest,
                         ::testing::Values(KVPoolEntries{c10::ScalarType::Undefined, 16},
                                           KVPoolEntries{c10::kBFloat16, 16},
                                           KVPoolEntries{c10::ScalarType::Undefined, 8},
                                           KVPoolEntries{c10::ScalarType::Undefined, 4}),
                         EntriesCaseName);

// Requests sharing a 24-token prompt prefix in a device pool: the first computes it, the later
// ones take its blocks (the last one a prompt that is exactly the cached blocks: copy-on-write of
// its last block), and each equals Generate alone with a fresh prefill.
TEST(PrefixOnDeviceTest, SharedPrefixIsComputedOnce) {
  at::NoGradGuard no_grad;
  GPT model = OnTestDevice(GoldenModel("golden/llama2"), c10::kFloat);
  const int64_t vocab = model->config().PaddedVocabSize();
  at::manual_seed(9);
  const at::Tensor shared = at::randint(0, vocab, {24}, at::kLong);
  std::vector<Job> jobs;
  for (int i = 0; i < 6; ++i) {
    Job job;
    job.prompt.assign(shared.data_ptr<int64_t>(), shared.data_ptr<int64_t>() + 24);
    for (int j = 0; j < (i == 5 ? 0 : i + 1); ++j) job.prompt.push_back((7 * i + 3 * j) % vocab);
    job.options.max_new_tokens = 8;
    job.options.sampling = i % 2 ? SamplingOptions{0.9, 10, 1.0} : SamplingOptions{0.0, 0, 1.0};
    job.options.seed = 40 + i;
    job.options.prefill_chunk = 8;
    job.spec = TestSpec("dense", 0, 16);
    jobs.push_back(job);
  }
  const KVPoolEntries model_entries;
  const std::shared_ptr<BlockPool> pool = DevicePool(*model, 64, 4, model_entries);
  ASSERT_NE(pool, nullptr);
  const auto prefixes = std::make_shared<PrefixCache>(pool);
  SchedulerOptions options;
  options.prefill_chunk = 8;
  const Served first = Serve(model, {jobs[0]}, options, std::make_unique<KVMemory>(pool, prefixes));
  const std::vector<Job> later(jobs.begin() + 1, jobs.end());
  const Served rest = Serve(model, later, options, std::make_unique<KVMemory>(pool, prefixes));
  const KVMemory alone(DevicePool(*model, 64, 4, model_entries), false);
  ExpectEveryRequestAsAlone(*model, alone, {jobs[0]}, first);
  ExpectEveryRequestAsAlone(*model, alone, later, rest);
  EXPECT_EQ(first.traces[0].prefix_hit_tokens, 0);
  for (size_t i = 0; i < later.size(); ++i) {
    EXPECT_EQ(rest.traces[i].prefix_hit_tokens, later[i].prompt.size() == 24 ? 23 : 24)
        << "request " << i + 1;
  }
  EXPECT_EQ(rest.stats.prefix_hits, static_cast<int64_t>(later.size()));
  EXPECT_EQ(pool->free_blocks(), pool->num_blocks());
}

// Churn on a device pool: requests of every cache kind, some cancelled by the caller, some
// stopping themselves (on_token returns false), some preempted; every one ends, none fails, and
// the pool is entirely free afterwards.
TEST(ChurnOnDeviceTest, EveryRequestEndsAndThePoolEmpties) {
  at::NoGradGuard no_grad;
  GPT model = OnTestDevice(GoldenModel("golden/llama2"), c10::kFloat);
  const std::shared_ptr<BlockPool> pool = DevicePool(*model, 24, 4, KVPoolEntries{});
  ASSERT_NE(pool, nullptr);
  SchedulerOptions options;
  options.max_running = 10;
  options.prefill_chunk = 5;
  Scheduler scheduler(model, options, std::make_unique<KVMemory>(pool, true));
  std::vector<Job> jobs = Jobs(*model, 60, 23);
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].spec.policy = i % 4 == 0 ? "dense" : jobs[i].spec.policy;
    if (jobs[i].spec.policy == "dense") jobs[i].spec.budget = 0;
    if (i % 5 == 1) {
      const int64_t stop_after = 1 + static_cast<int64_t>(i % 4);
      auto seen = std::make_shared<int64_t>(0);
      jobs[i].options.on_token = [seen, stop_after](int64_t) { return ++*seen < stop_after; };
    }
    absl::StatusOr<std::shared_ptr<RequestHandle>> handle = scheduler.Submit(
        jobs[i].prompt, jobs[i].options, CacheFor(scheduler.memory(), *model, jobs[i]));
    ASSERT_TRUE(handle.ok()) << handle.status();
    if (i % 7 == 3) (*handle)->Cancel();
    handles.push_back(*handle);
  }
  int64_t cancelled = 0;
  for (const auto& handle : handles) {
    absl::StatusOr<RequestResult> result = handle->Wait();
    ASSERT_TRUE(result.ok()) << result.status();
    cancelled += result->cancelled;
  }
  const SchedulerStats stats = scheduler.Stats();
  EXPECT_EQ(stats.failed, 0);
  EXPECT_EQ(stats.completed + stats.cancelled, static_cast<int64_t>(jobs.size()));
  EXPECT_EQ(stats.cancelled, cancelled);
  EXPECT_GT(cancelled, 0);
  EXPECT_EQ(stats.pool_blocks_used, 0);
  EXPECT_EQ(pool->free_blocks(), pool->num_blocks());
}

// Speculative decoding on the device: an n-gram proposer and a draft model (a noisy copy of the
// model, on the device too) verify blocks of up to 4 tokens for requests paged in a device pool
// and with int8 caches of their own; greedy tokens as plain Generate's alone (the rule above).
TEST(SpeculativeOnDeviceTest, GreedyTokensAsPlainDecoding) {
  at::NoGradGuard no_grad;
  GPT cpu_model = GoldenModel("golden/llama2");
  GPT draft = OnTestDevice(NoisyCopy(*cpu_model), c10::kFloat);
  GPT model = OnTestDevice(cpu_model, c10::kFloat);
  constexpr int64_t kBlock = 4;
  std::vector<Job> jobs = Greedy(Jobs(*model, 12, 41));
  const std::shared_ptr<BlockPool> pool = DevicePool(*model, 96, 4, KVPoolEntries{});
  ASSERT_NE(pool, nullptr);
  SchedulerOptions options;
  options.max_running = 8;
  options.prefill_chunk = 6;
  Scheduler scheduler(model, options, std::make_unique<KVMemory>(pool, true));
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (size_t i = 0; i < jobs.size(); ++i) {
    Job& job = jobs[i];
    job.spec = TestSpec("dense", 0, i % 3 == 2 ? 8 : 16);
    job.options.prefill_chunk = job.options.prefill_chunk ? 5 : 6;
    GenerateOptions request = job.options;
    request.speculative.k = kBlock;
    if (i % 2 == 0) {
      request.speculative.proposer = *NgramProposer::Create({1, 3});
    } else {
      request.speculative.proposer = *DraftModelProposer::Create(draft, model->config());
    }
    absl::StatusOr<std::shared_ptr<RequestHandle>> handle =
        scheduler.Submit(job.prompt, request, CacheFor(scheduler.memory(), *model, job, kBlock));
    ASSERT_TRUE(handle.ok()) << handle.status();
    handles.push_back(*handle);
  }
  Served served;
  Collect(handles, scheduler, &served);
  const KVMemory alone(DevicePool(*model, 64, 4, KVPoolEntries{}), false);
  ExpectEveryRequestAsAlone(*model, alone, jobs, served);
  EXPECT_GT(served.stats.speculative_steps, 0);
  EXPECT_GT(served.stats.accepted_tokens, 0);
  EXPECT_EQ(pool->free_blocks(), pool->num_blocks());
}

// n choices of one prompt on the device (Scheduler::SubmitChoices): paged choices share the
// prompt's blocks in a device pool, window, h2o and int8 caches fork by copy on the device; each
// choice (greedy or sampled with its own seed) as its own run alone.
TEST(ChoicesOnDeviceTest, EachChoiceAsItsOwnRunAlone) {
  at::NoGradGuard no_grad;
  GPT model = OnTestDevice(GoldenModel("golden/llama2"), c10::kFloat);
  const std::shared_ptr<BlockPool> pool = DevicePool(*model, 64, 4, KVPoolEntries{});
  ASSERT_NE(pool, nullptr);
  SchedulerOptions options;
  options.prefill_chunk = 6;
  Scheduler scheduler(model, options, std::make_unique<KVMemory>(pool, true));
  const std::vector<KVCacheSpec> specs = {TestSpec("dense", 0, 16), TestSpec("window", 8, 16),
                                          TestSpec("h2o", 8, 16), TestSpec("dense", 0, 8)};
  std::vector<Job> jobs = Jobs(*model, static_cast<int>(specs.size()), 53);
  std::vector<Job> choices;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (size_t i = 0; i < specs.size(); ++i) {
    std::vector<GenerateOptions> group;
    std::vector<std::unique_ptr<KVCache>> caches;
    for (int c = 0; c < 3; ++c) {
      Job choice = jobs[i];
      choice.spec = specs[i];
      choice.options.max_new_tokens = 8;
      choice.options.prefill_chunk = 6;
      choice.options.seed = 50 + 3 * i + c;
      choice.options.sampling =
          c == 0 ? SamplingOptions{0.0, 0, 1.0} : SamplingOptions{0.9, 12, 1.0};
      caches.push_back(CacheFor(scheduler.memory(), *model, choice));
      group.push_back(choice.options);
      choices.push_back(choice);
    }
    absl::StatusOr<std::vector<std::shared_ptr<RequestHandle>>> submitted =
        scheduler.SubmitChoices(jobs[i].prompt, std::move(group), std::move(caches));
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    handles.insert(handles.end(), submitted->begin(), submitted->end());
  }
  Served served;
  Collect(handles, scheduler, &served);
  // Alone with the served options (no log-probabilities reported by any choice).
  const KVMemory alone(DevicePool(*model, 64, 4, KVPoolEntries{}), false);
  ASSERT_EQ(served.traces.size(), choices.size());
  for (size_t i = 0; i < choices.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("choice ", i, " ", DescribeKVCacheSpec(choices[i].spec)));
    ExpectSameGeneration(choices[i], Alone(*model, alone, choices[i], false), served.traces[i],
                         Tolerance(model->dtype()));
  }
  EXPECT_GT(served.stats.forked_choices, 0);
  EXPECT_EQ(pool->free_blocks(), pool->num_blocks());
}

}  // namespace

// gtest's name for a pool's entries in messages (found by argument-dependent lookup in lgpt).
void PrintTo(const KVPoolEntries& entries, std::ostream* os) { *os << EntriesName(entries); }

}  // namespace lgpt
