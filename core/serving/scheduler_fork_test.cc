// The n choices of one prompt (Scheduler::SubmitChoices) over caches that fork by copy
// (budgeted, quantised, and dense ones without a pool): the prompt is prefilled once, every
// choice's tokens equal lgpt::Generate's with its own seed and cache (greedy and sampled), the
// copies are charged to the pool and given back; a leader cancelled or preempted before its
// prompt is done leaves the lead to the next choice, a cancelled choice leaves the others alone,
// and choices preempted through a small pool recompute without changing a token.
#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <set>
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

std::vector<int64_t> Prompt(GPTImpl& model, int64_t length, uint64_t seed) {
  at::manual_seed(seed);
  const at::Tensor ids =
      at::randint(0, model.config().PaddedVocabSize(), {length}, at::kLong).contiguous();
  return std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + length);
}

// n choices of one job: choice i is the job with seed + i.
struct Group {
  Job job;
  int64_t n = 3;
  std::vector<std::shared_ptr<RequestHandle>> handles;
};

Job ChoiceJob(const Job& job, int64_t i) {
  Job choice = job;
  choice.options.seed = job.options.seed + static_cast<uint64_t>(i);
  return choice;
}

int64_t Length(const Job& job) {
  return static_cast<int64_t>(job.prompt.size()) + job.options.max_new_tokens;
}

// The job's cache as the engine makes it: own storage grown a pool block at a time.
std::unique_ptr<KVCache> CacheOf(GPTImpl& model, const Job& job, int64_t growth_step) {
  return BatchOneCache(model, job.spec, Length(job), growth_step);
}

absl::StatusOr<std::vector<std::shared_ptr<RequestHandle>>> SubmitGroup(Scheduler& scheduler,
                                                                        GPTImpl& model,
                                                                        const Job& job, int64_t n,
                                                                        int64_t growth_step) {
  std::vector<GenerateOptions> options;
  std::vector<std::unique_ptr<KVCache>> caches;
  for (int64_t i = 0; i < n; ++i) {
    const Job choice = ChoiceJob(job, i);
    options.push_back(choice.options);
    caches.push_back(CacheOf(model, choice, growth_step));
  }
  return scheduler.SubmitChoices(job.prompt, std::move(options), std::move(caches));
}

// Budgeted and quantised caches of every policy (the golden model's 128-token context).
std::vector<KVCacheSpec> ForkingSpecs() {
  KVCacheSpec shifting = TestSpec("sink", 8, 16);
  shifting.positions = "cache";
  return {TestSpec("window", 8, 16), TestSpec("sink", 8, 16), shifting,
          TestSpec("h2o", 8, 16),    TestSpec("tova", 8, 4),  TestSpec("dense", 0, 8),
          TestSpec("dense", 0, 4),   TestSpec("h2o", 8, 8),   TestSpec("h2o-vlen", 8, 16),
          TestSpec("qh2o", 8, 4),    TestSpec("window", 6, 8)};
}

class ForkTest : public ::testing::TestWithParam<bool> {};

TEST_P(ForkTest, ChoicesPrefillThePromptOnceAndEqualEachAlone) {
  const bool with_pool = GetParam();
  GPT model = GoldenModel("golden/llama2");
  std::vector<KVCacheSpec> specs = ForkingSpecs();
  // Without a pool, dense caches fork too (with one, they share prefix blocks instead).
  if (!with_pool) specs.push_back(TestSpec("dense", 0, 16));
  std::vector<Group> groups;
  for (size_t s = 0; s < specs.size(); ++s) {
    Group group;
    group.job.spec = specs[s];
    group.job.prompt = Prompt(*model, 9 + static_cast<int64_t>(s), 40 + s);
    group.job.options.max_new_tokens = 8 + static_cast<int64_t>(s % 3);
    group.job.options.seed = 500 + s;
    // Sampled, and greedy for every third; prompts in chunks of 4 (the last chunk's eviction
    // still pending when the copy is taken) or whole.
    group.job.options.sampling =
        s % 3 == 0 ? SamplingOptions{0.0, 0, 1.0} : SamplingOptions{1.0, 20, 1.0};
    group.job.options.prefill_chunk = s % 2 == 0 ? 4 : 0;
    groups.push_back(group);
  }
  SchedulerOptions options;
  options.max_running = 64;
  std::shared_ptr<BlockPool> pool = with_pool ? TestPool(*model, 2048, 4) : nullptr;
  Scheduler scheduler(model, options, pool);
  const int64_t growth_step = with_pool ? 4 : 0;
  for (Group& group : groups) {
    absl::StatusOr<std::vector<std::shared_ptr<RequestHandle>>> handles =
        SubmitGroup(scheduler, *model, group.job, group.n, growth_step);
    ASSERT_TRUE(handles.ok()) << handles.status();
    group.handles = *handles;
  }
  int64_t prompt_tokens = 0, forks = 0;
  for (Group& group : groups) {
    const int64_t prompt = static_cast<int64_t>(group.job.prompt.size());
    prompt_tokens += prompt;
    forks += group.n - 1;
    std::set<std::vector<int64_t>> distinct;
    for (int64_t i = 0; i < group.n; ++i) {
      SCOPED_TRACE(absl::StrCat(DescribeKVCacheSpec(group.job.spec), " choice ", i));
      absl::StatusOr<RequestResult> result = group.handles[i]->Wait();
      ASSERT_TRUE(result.ok()) << result.status();
      Job alone = ChoiceJob(group.job, i);
      alone.options.prefill_chunk = scheduler.EffectiveChunk(alone.options);
      EXPECT_EQ(result->tokens, Alone(*model, alone));
      EXPECT_EQ(result->forked_tokens, i == 0 ? 0 : prompt);
      distinct.insert(result->tokens);
    }
    if (group.job.options.sampling.temperature > 0) {
      EXPECT_GT(distinct.size(), 1u) << DescribeKVCacheSpec(group.job.spec);
    }
  }
  const SchedulerStats stats = scheduler.Stats();
  // Each prompt was read once: by its first choice.
  EXPECT_EQ(stats.prefill_tokens, prompt_tokens);
  EXPECT_EQ(stats.forked_choices, forks);
  EXPECT_EQ(stats.forked_tokens, prompt_tokens * 2);  // n = 3
  EXPECT_EQ(stats.completed, static_cast<int64_t>(groups.size()) * 3);
  EXPECT_EQ(scheduler.memory().charged_blocks(), 0);
  if (pool != nullptr) {
    EXPECT_EQ(pool->free_blocks(), pool->num_blocks());
  }
}

INSTANTIATE_TEST_SUITE_P(Pool, ForkTest, ::testing::Bool());

// A leader cancelled in the middle of its prompt: the next choice reads the prompt and leads;
// the one after it forks. A choice cancelled in the queue ends alone.
TEST(ChoicesTest, ALeaderCancelledBeforeItsPromptIsDoneLeavesTheLeadToTheNext) {
  GPT model = GoldenModel("golden/llama2");
  SchedulerOptions options;
  options.max_running = 8;
  Scheduler scheduler(model, options);
  Job group;
  group.spec = TestSpec("h2o", 6, 8);
  group.prompt = Prompt(*model, 12, 3);
  group.options.max_new_tokens = 7;
  group.options.sampling = {1.0, 20, 1.0};
  group.options.seed = 90;
  group.options.prefill_chunk = 4;  // three steps of prompt
  std::vector<std::shared_ptr<RequestHandle>> choices;
  // A running request whose callbacks act between steps: after its first token the choices
  // come, after its second (the leader's first chunk done) the leader is cancelled.
  Job runner;
  runner.spec = TestSpec("dense", 0, 16);
  runner.prompt = Prompt(*model, 5, 4);
  runner.options.max_new_tokens = 10;
  runner.options.sampling = {0.0, 0, 1.0};
  GenerateOptions runner_options = runner.options;
  int64_t tokens = 0;
  runner_options.on_token = [&](int64_t) {
    ++tokens;
    if (tokens == 1) {
      absl::StatusOr<std::vector<std::shared_ptr<RequestHandle>>> handles =
          SubmitGroup(scheduler, *model, group, 4, 0);
      EXPECT_TRUE(handles.ok()) << handles.status();
      if (handles.ok()) choices = *handles;
      if (choices.size() == 4) choices[3]->Cancel();
    } else if (tokens == 2 && !choices.empty()) {
      choices[0]->Cancel();
    }
    return true;
  };
  absl::StatusOr<std::shared_ptr<RequestHandle>> handle =
      scheduler.Submit(runner.prompt, runner_options, CacheOf(*model, runner, 0));
  ASSERT_TRUE(handle.ok()) << handle.status();
  ASSERT_TRUE((*handle)->Wait().ok());
  ASSERT_EQ(choices.size(), 4u);
  std::vector<RequestResult> results;
  for (auto& choice : choices) {
    absl::StatusOr<RequestResult> result = choice->Wait();
    ASSERT_TRUE(result.ok()) << result.status();
    results.push_back(*result);
  }
  EXPECT_TRUE(results[0].cancelled);
  EXPECT_TRUE(results[0].tokens.empty());
  EXPECT_TRUE(results[3].cancelled);
  EXPECT_TRUE(results[3].tokens.empty());
  for (int64_t i : {1, 2}) {
    EXPECT_FALSE(results[i].cancelled);
    EXPECT_EQ(results[i].tokens, Alone(*model, ChoiceJob(group, i))) << "choice " << i;
  }
  EXPECT_EQ(results[1].forked_tokens, 0);  // it read the prompt
  EXPECT_EQ(results[2].forked_tokens, 12);
  const SchedulerStats stats = scheduler.Stats();
  EXPECT_EQ(stats.forked_choices, 1);
  // The runner's prompt, the leader's first chunk, the whole prompt once more.
  EXPECT_EQ(stats.prefill_tokens, 5 + 4 + 12);
}

// A charged cache whose bound the test can raise for one step (the others' reservations then
// decide who is preempted); everything else is the inner cache's.
class SpikingCache : public KVCache, public KVStorageBound {
 public:
  SpikingCache(std::unique_ptr<KVCache> inner, int64_t max_bytes)
      : inner_(std::move(inner)), max_bytes_(max_bytes) {}
  void Spike(int64_t bytes) { spike_ = bytes; }

  absl::StatusOr<KVView> Update(int64_t layer, const KVStep& step, const at::Tensor& keys,
                                const at::Tensor& values) override {
    return inner_->Update(layer, step, keys, values);
  }
  absl::Status CheckStep(const KVStep& step, int64_t batch_size) const override {
    return inner_->CheckStep(step, batch_size);
  }
  void Reset() override { inner_->Reset(); }
  void Release() override { inner_->Release(); }
  int64_t AllocatedBytes() const override { return inner_->AllocatedBytes(); }
  int64_t IndexBytes() const override { return inner_->IndexBytes(); }
  int64_t max_sequence_length() const override { return inner_->max_sequence_length(); }
  int64_t batch_size() const override { return inner_->batch_size(); }
  int64_t num_layers() const override { return inner_->num_layers(); }
  absl::StatusOr<at::Tensor> UpdateAndAttend(int64_t layer, const KVStep& step, const at::Tensor& q,
                                             const at::Tensor& keys, const at::Tensor& values,
                                             const AttentionParams& params) override {
    return inner_->UpdateAndAttend(layer, step, q, keys, values, params);
  }
  KVAttentionScorer* attention_scorer() override { return inner_->attention_scorer(); }
  const KVStorageBound* storage_bound() const override { return this; }
  int64_t MaxBytes() const override { return max_bytes_; }
  int64_t BytesAfterStep(int64_t tokens) const override {
    return spike_ > 0 ? spike_ : inner_->storage_bound()->BytesAfterStep(tokens);
  }
  std::string DebugName() const override { return "spiking " + inner_->DebugName(); }

 private:
  std::unique_ptr<KVCache> inner_;
  int64_t max_bytes_;
  int64_t spike_ = 0;
};

// A leader preempted in the middle of its prompt: the next choice takes the lead and reads the
// prompt, the other waits for it, and the old leader, admitted again, forks from the new one.
TEST(ChoicesTest, ALeaderPreemptedBeforeItsPromptIsDoneLeavesTheLeadToTheNext) {
  GPT model = GoldenModel("golden/llama2");
  Job group;
  group.spec = TestSpec("dense", 0, 8);  // int8 entries: its bytes grow with the prompt
  group.prompt = Prompt(*model, 24, 8);
  group.options.max_new_tokens = 6;
  group.options.sampling = {1.0, 20, 1.0};
  group.options.seed = 60;
  group.options.prefill_chunk = 4;  // six steps of prompt
  std::shared_ptr<BlockPool> pool = TestPool(*model, 64, 1);
  const int64_t pool_bytes = pool->num_blocks() * pool->BytesPerBlock();
  // What a choice's first chunk reserves, and what the leader holds after five chunks.
  const int64_t first_chunk = CacheOf(*model, group, 1)->storage_bound()->BytesAfterStep(4);
  std::unique_ptr<KVCache> probe = CacheOf(*model, group, 1);
  GenerateOptions prefill = group.options;
  prefill.max_new_tokens = 0;
  ASSERT_TRUE(Generate(*model, *probe,
                       std::vector<int64_t>(group.prompt.begin(), group.prompt.begin() + 20),
                       prefill)
                  .ok());
  const int64_t leader_bytes = probe->AllocatedBytes() + probe->IndexBytes();
  ASSERT_GT(leader_bytes, first_chunk + 2 * pool->BytesPerBlock());

  SchedulerOptions options;
  options.max_running = 8;
  Scheduler scheduler(model, options, pool);
  // An older request whose bound the test raises for one step: to the whole pool but the new
  // leader's first chunk, so that its reservation preempts the newest request holding memory
  // (the leader; the waiting choices hold none) and the next choice's first chunk still fits.
  Job runner;
  runner.spec = TestSpec("dense", 0, 8);
  runner.prompt = Prompt(*model, 5, 9);
  runner.options.max_new_tokens = 12;
  runner.options.sampling = {0.0, 0, 1.0};
  auto spiking = std::make_unique<SpikingCache>(CacheOf(*model, runner, 1), pool_bytes);
  SpikingCache* runner_cache = spiking.get();
  std::vector<std::shared_ptr<RequestHandle>> choices;
  int64_t tokens = 0;
  GenerateOptions runner_options = runner.options;
  runner_options.on_token = [&](int64_t) {
    ++tokens;
    if (tokens == 1) {
      absl::StatusOr<std::vector<std::shared_ptr<RequestHandle>>> handles =
          SubmitGroup(scheduler, *model, group, 3, 1);
      EXPECT_TRUE(handles.ok()) << handles.status();
      if (handles.ok()) choices = *handles;
    }
    // Tokens 2..6 come with the leader's chunks 1..5; the spike lasts the next step.
    runner_cache->Spike(tokens == 6 ? pool_bytes - first_chunk : 0);
    return true;
  };
  absl::StatusOr<std::shared_ptr<RequestHandle>> handle =
      scheduler.Submit(runner.prompt, runner_options, std::move(spiking));
  ASSERT_TRUE(handle.ok()) << handle.status();
  absl::StatusOr<RequestResult> ran = (*handle)->Wait();
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_EQ(ran->tokens, Alone(*model, runner));
  EXPECT_EQ(ran->preemptions, 0);
  ASSERT_EQ(choices.size(), 3u);
  std::vector<RequestResult> results;
  for (int64_t i = 0; i < 3; ++i) {
    absl::StatusOr<RequestResult> result = choices[i]->Wait();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->tokens, Alone(*model, ChoiceJob(group, i))) << "choice " << i;
    results.push_back(*result);
  }
  EXPECT_EQ(results[0].preemptions, 1);
  EXPECT_EQ(results[0].forked_tokens, 24);  // admitted again, it forked from the new leader
  EXPECT_EQ(results[1].preemptions, 0);
  EXPECT_EQ(results[1].forked_tokens, 0);  // the new leader
  EXPECT_EQ(results[2].forked_tokens, 24);
  const SchedulerStats stats = scheduler.Stats();
  EXPECT_EQ(stats.preemptions, 1);
  EXPECT_EQ(stats.forked_choices, 2);
  // The runner's prompt, the leader's five chunks, the whole prompt once more.
  EXPECT_EQ(stats.prefill_tokens, 5 + 20 + 24);
  EXPECT_EQ(scheduler.memory().charged_blocks(), 0);
  EXPECT_EQ(pool->free_blocks(), pool->num_blocks());
}

// Through a pool with room for about two caches: leaders and forks are preempted, recompute,
// and no token changes; every byte is given back. Charged caches are admitted by their bound
// (they never outgrow what admission counted), so the preemptions come from paged requests
// between the groups, admitted on their first chunk, whose growth takes the memory of the
// requests admitted after them.
TEST(ChoicesTest, PreemptedChoicesRecomputeWithoutChangingAToken) {
  GPT model = GoldenModel("golden/llama2");
  const std::vector<KVCacheSpec> specs = {TestSpec("sink", 8, 4), TestSpec("h2o", 8, 8),
                                          TestSpec("tova", 8, 16)};
  std::vector<Group> groups;
  int64_t most_bytes = 0;
  for (size_t s = 0; s < 6; ++s) {
    Group group;
    group.job.spec = specs[s % specs.size()];
    group.job.prompt = Prompt(*model, 10 + static_cast<int64_t>(s), 70 + s);
    group.job.options.max_new_tokens = 12;
    group.job.options.seed = 300 + s;
    group.job.options.sampling =
        s % 2 == 0 ? SamplingOptions{1.0, 20, 1.0} : SamplingOptions{0.0, 0, 1.0};
    group.job.options.prefill_chunk = 4;
    const std::unique_ptr<KVCache> probe = CacheOf(*model, group.job, 1);
    most_bytes = std::max(most_bytes, probe->storage_bound()->MaxBytes());
    groups.push_back(group);
  }
  // Blocks of one entry: a budget in bytes of about two and a half caches.
  std::shared_ptr<BlockPool> pool = TestPool(*model, 1, 1);
  pool = TestPool(*model, 5 * most_bytes / 2 / pool->BytesPerBlock() + 1, 1);
  SchedulerOptions options;
  options.max_running = 16;
  Scheduler scheduler(model, options, pool);
  std::vector<Job> paged_jobs;
  std::vector<std::shared_ptr<RequestHandle>> paged_handles;
  for (size_t s = 0; s < groups.size(); ++s) {
    Group& group = groups[s];
    absl::StatusOr<std::vector<std::shared_ptr<RequestHandle>>> handles =
        SubmitGroup(scheduler, *model, group.job, group.n, 1);
    ASSERT_TRUE(handles.ok()) << handles.status();
    group.handles = *handles;
    if (s % 2 == 1) continue;
    Job paged;
    paged.spec = TestSpec("dense", 0, 16);
    paged.prompt = Prompt(*model, 5, 90 + s);
    paged.options.max_new_tokens = 12;
    paged.options.sampling = SamplingOptions{0.0, 0, 1.0};
    paged.options.prefill_chunk = 4;
    absl::StatusOr<std::unique_ptr<PagedKVCache>> cache = PagedKVCache::Create(pool, Length(paged));
    ASSERT_TRUE(cache.ok()) << cache.status();
    absl::StatusOr<std::shared_ptr<RequestHandle>> handle =
        scheduler.Submit(paged.prompt, paged.options, *std::move(cache));
    ASSERT_TRUE(handle.ok()) << handle.status();
    paged_jobs.push_back(paged);
    paged_handles.push_back(*handle);
  }
  int64_t preemptions = 0;
  for (Group& group : groups) {
    for (int64_t i = 0; i < group.n; ++i) {
      SCOPED_TRACE(absl::StrCat(DescribeKVCacheSpec(group.job.spec), " choice ", i));
      absl::StatusOr<RequestResult> result = group.handles[i]->Wait();
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->tokens, Alone(*model, ChoiceJob(group.job, i)));
      preemptions += result->preemptions;
    }
  }
  int64_t charged_preemptions = preemptions;
  for (size_t i = 0; i < paged_jobs.size(); ++i) {
    absl::StatusOr<RequestResult> result = paged_handles[i]->Wait();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->tokens, Alone(*model, paged_jobs[i])) << "paged request " << i;
    preemptions += result->preemptions;
  }
  const SchedulerStats stats = scheduler.Stats();
  EXPECT_GT(charged_preemptions, 0);
  EXPECT_EQ(stats.preemptions, preemptions);
  EXPECT_GT(stats.forked_choices, 0);
  EXPECT_EQ(stats.completed, 18 + static_cast<int64_t>(paged_jobs.size()));
  EXPECT_EQ(scheduler.memory().charged_blocks(), 0);
  EXPECT_EQ(pool->free_blocks(), pool->num_blocks());
}

TEST(ChoicesTest, SubmitChoicesChecksAllOrNone) {
  GPT model = GoldenModel("golden/llama2");
  SchedulerOptions options;
  options.max_waiting = 2;
  Scheduler scheduler(model, options);
  Job job;
  job.spec = TestSpec("window", 8, 16);
  job.prompt = Prompt(*model, 6, 5);
  job.options.max_new_tokens = 4;
  const absl::Status none = scheduler.SubmitChoices(job.prompt, {}, {}).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument) << none;
  // Three do not fit a queue of two: none is queued.
  const absl::Status full = SubmitGroup(scheduler, *model, job, 3, 0).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_EQ(scheduler.Stats().submitted, 0);
  // A bad choice refuses the lot.
  std::vector<GenerateOptions> choices(2, job.options);
  choices[1].sampling.top_p = 2.0;
  std::vector<std::unique_ptr<KVCache>> caches;
  caches.push_back(CacheOf(*model, job, 0));
  caches.push_back(CacheOf(*model, job, 0));
  EXPECT_FALSE(scheduler.SubmitChoices(job.prompt, choices, std::move(caches)).ok());
  EXPECT_EQ(scheduler.Stats().submitted, 0);
  absl::StatusOr<std::vector<std::shared_ptr<RequestHandle>>> two =
      SubmitGroup(scheduler, *model, job, 2, 0);
  ASSERT_TRUE(two.ok()) << two.status();
  for (auto& handle : *two) EXPECT_TRUE(handle->Wait().ok());
}

}  // namespace
}  // namespace lgpt
