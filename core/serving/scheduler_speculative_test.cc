// Speculative decoding in the serving engine (core/serving/scheduler.h): speculative rows verify
// their proposals beside plain rows and prompt chunks in the same steps, and every request
// still equals lgpt::Generate run alone. Greedy speculative requests give plain greedy's tokens
// (the default model and golden families; n-gram, self-draft and noisy-copy draft proposers;
// k = 1..8 side by side; dense, paged (pool), int8 and int4 caches); sampled ones give
// Generate's speculative tokens seed for seed; preemption in a small pool changes no token;
// stops, callbacks and logprobs inside a verified block; the refusals.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/block_pool.h"
#include "cache/kv_cache.h"
#include "cache/kv_cache_factory.h"
#include "cache/paged_kv_cache.h"
#include "core/base/status_field.h"
#include "core/model/checkpoint.h"
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

// A request of these tests: its cache kind (dense, paged, int8, int4, or a budgeted policy),
// its proposer kind (none, ngram, self, other) and options.
struct Case {
  std::vector<int64_t> prompt;
  GenerateOptions options;
  std::string cache = "dense";
  std::string proposer = "none";
};

int64_t Length(const Case& c) {
  return static_cast<int64_t>(c.prompt.size()) + c.options.max_new_tokens;
}

// A batch-1 cache of the case's kind, dense rings with spare slots for its k; paged caches
// over `pool`, the others grown a block at a time when there is one (as KVMemory makes them).
std::unique_ptr<KVCache> CacheOf(GPTImpl& model, const Case& c,
                                 const std::shared_ptr<BlockPool>& pool) {
  if (c.cache == "paged") {
    absl::StatusOr<std::unique_ptr<PagedKVCache>> paged = PagedKVCache::Create(pool, Length(c));
    EXPECT_TRUE(paged.ok()) << paged.status();
    return *std::move(paged);
  }
  KVCacheShape shape;
  shape.batch_size = 1;
  shape.max_sequence_length = Length(c);
  shape.layers = model.CacheLayout();
  shape.dtype = model.dtype();
  shape.device = model.device();
  shape.rollback_slots = c.proposer != "none" ? c.options.speculative.k : 0;
  if (pool != nullptr) shape.growth_step = pool->entries_per_block();
  KVCacheSpec spec = TestSpec("dense", 0, 16);
  if (c.cache == "int8") spec.bits = 8;
  if (c.cache == "int4") spec.bits = 4;
  if (c.cache == "sink" || c.cache == "h2o") spec = TestSpec(c.cache, 8, 16);
  absl::StatusOr<std::unique_ptr<KVCache>> cache = MakeKVCache(spec, shape);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return *std::move(cache);
}

// A fresh proposer of `kind` for `model` (a draft's holds a cache: one per request).
std::shared_ptr<Proposer> NewProposer(const std::string& kind, const GPT& model, const GPT& other,
                                      const SamplingOptions& draft_sampling = {}) {
  if (kind == "none") return nullptr;
  if (kind == "ngram") return *NgramProposer::Create({1, 3});
  DraftModelProposerOptions options;
  options.sampling = draft_sampling;
  return *DraftModelProposer::Create(kind == "self" ? model : other, model->config(), options);
}

// The case run alone through Generate with a fresh proposer of its kind; `plain`: without
// speculation.
std::vector<int64_t> Alone(const GPT& model, const GPT& other, Case c, bool plain) {
  c.options.speculative.proposer =
      plain ? nullptr : NewProposer(c.proposer, model, other, c.options.sampling);
  // A paged case alone: a pool of its own.
  std::shared_ptr<BlockPool> pool =
      c.cache == "paged" ? TestPool(*model, Length(c) / 4 + 4, 4) : nullptr;
  std::unique_ptr<KVCache> cache = CacheOf(*model, c, pool);
  absl::StatusOr<std::vector<int64_t>> tokens = Generate(*model, *cache, c.prompt, c.options);
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  return tokens.ok() ? *tokens : std::vector<int64_t>();
}

struct Served {
  std::vector<RequestResult> results;
  SchedulerStats stats;
};

// Every case submitted to one scheduler (each with a fresh proposer of its kind), in order.
Served Serve(const GPT& model, const GPT& other, std::vector<Case>& cases, SchedulerOptions options,
             const std::shared_ptr<BlockPool>& pool = nullptr) {
  Scheduler scheduler(model, options, std::make_unique<KVMemory>(pool, /*prefix_caching=*/true));
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (Case& c : cases) {
    c.options.prefill_chunk = scheduler.EffectiveChunk(c.options);
    GenerateOptions submitted = c.options;
    submitted.speculative.proposer = NewProposer(c.proposer, model, other, c.options.sampling);
    absl::StatusOr<std::shared_ptr<RequestHandle>> handle =
        scheduler.Submit(c.prompt, submitted, CacheOf(*model, c, pool));
    EXPECT_TRUE(handle.ok()) << handle.status();
    if (handle.ok()) handles.push_back(*handle);
  }
  Served served;
  for (auto& handle : handles) {
    absl::StatusOr<RequestResult> result = handle->Wait();
    EXPECT_TRUE(result.ok()) << result.status();
    served.results.push_back(result.ok() ? *result : RequestResult());
  }
  served.stats = scheduler.Stats();
  return served;
}

// A prompt that repeats itself (prompt lookup finds matches), shifted by `offset`.
std::vector<int64_t> Prompt(int64_t vocab, int64_t offset, int64_t repeats) {
  std::vector<int64_t> prompt;
  for (int64_t repeat = 0; repeat < repeats; ++repeat) {
    for (int64_t i = 0; i < 6; ++i) prompt.push_back((37 * i + 11 + offset) % vocab);
  }
  return prompt;
}

// Greedy requests of every proposer kind and k = 1..8 with plain ones between them, prompts of
// several lengths, all over caches of `cache_kind`.
std::vector<Case> GreedyCases(const GPTImpl& model, const std::string& cache_kind) {
  std::vector<Case> cases;
  const char* kinds[] = {"ngram", "self", "other", "none"};
  for (int64_t i = 0; i < 12; ++i) {
    Case c;
    c.prompt = Prompt(model.config().vocab_size, i, 1 + i % 3);
    c.options.max_new_tokens = 12 + 3 * (i % 4);
    c.options.sampling.temperature = 0;
    c.options.seed = 100 + i;
    c.cache = cache_kind;
    c.proposer = kinds[i % 4];
    c.options.speculative.k = 1 + i % 8;
    cases.push_back(c);
  }
  return cases;
}

struct Family {
  std::string name;
  std::string dir;
};

class SchedulerSpeculativeTest : public ::testing::TestWithParam<Family> {};

TEST_P(SchedulerSpeculativeTest, GreedyRowsEqualPlainGreedy) {
  GPT model = LoadModel(GetParam().dir);
  GPT other = NoisyCopy(*model);
  const bool windowed = model->config().sliding_window_size.has_value();
  for (const std::string cache_kind : {"dense", "paged", "int8", "int4"}) {
    if (windowed && (cache_kind == "int8" || cache_kind == "int4")) continue;  // refused below
    SCOPED_TRACE(cache_kind);
    std::vector<Case> cases = GreedyCases(*model, cache_kind);
    SchedulerOptions options;
    options.max_running = 6;
    options.prefill_chunk = 5;
    options.step_prefill_tokens = 8;
    std::shared_ptr<BlockPool> pool = TestPool(*model, 400, 4);
    const Served served = Serve(model, other, cases, options, pool);
    ASSERT_EQ(served.results.size(), cases.size());
    int64_t verify_steps = 0, proposed = 0, accepted = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      SCOPED_TRACE(absl::StrCat("request ", i, " ", cases[i].proposer,
                                " k=", cases[i].options.speculative.k));
      const RequestResult& result = served.results[i];
      EXPECT_EQ(result.tokens, Alone(model, other, cases[i], /*plain=*/true));
      const GenerateStats& s = result.stats;
      EXPECT_LE(s.accepted_tokens, s.proposed_tokens);
      if (cases[i].proposer == "none") {
        EXPECT_EQ(s.verify_steps, 0);
      } else if (cases[i].proposer != "ngram") {
        EXPECT_GT(s.verify_steps, 0);  // a draft always proposes
      }
      if (cases[i].proposer == "self" && cache_kind != "int8" && cache_kind != "int4") {
        EXPECT_EQ(s.accepted_tokens, s.proposed_tokens);  // the model drafting for itself
      }
      verify_steps += s.verify_steps;
      proposed += s.proposed_tokens;
      accepted += s.accepted_tokens;
    }
    EXPECT_EQ(served.stats.speculative_steps, verify_steps);
    EXPECT_EQ(served.stats.proposed_tokens, proposed);
    EXPECT_EQ(served.stats.accepted_tokens, accepted);
    EXPECT_GT(accepted, 0);
    EXPECT_EQ(served.stats.failed, 0);
    // Speculation left no block behind: every request's memory went back to the pool.
    EXPECT_EQ(served.stats.pool_blocks_used, 0);
  }
}

TEST_P(SchedulerSpeculativeTest, QuantisedWindowsAndEvictingCachesAreRefused) {
  GPT model = LoadModel(GetParam().dir);
  const bool windowed = model->config().sliding_window_size.has_value();
  Scheduler scheduler(model, SchedulerOptions());
  for (const std::string cache_kind : {"sink", "h2o", "int8"}) {
    if (cache_kind == "int8" && !windowed) continue;
    Case c;
    c.prompt = Prompt(model->config().vocab_size, 0, 2);
    c.options.max_new_tokens = 8;
    c.options.speculative.k = 4;
    c.options.speculative.proposer = NewProposer("ngram", model, model);
    c.cache = cache_kind;
    const absl::Status refused =
        scheduler.Submit(c.prompt, c.options, CacheOf(*model, c, nullptr)).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << cache_kind;
    EXPECT_EQ(ErrorField(refused), "GenerateOptions.speculative") << cache_kind;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, SchedulerSpeculativeTest,
                         ::testing::Values(Family{"default_model", "tools/default_model"},
                                           Family{"llama2", "tests/testdata/golden/llama2"},
                                           Family{"pythia", "tests/testdata/golden/pythia"},
                                           Family{"gemma2", "tests/testdata/golden_extra/gemma2"}),
                         [](const ::testing::TestParamInfo<Family>& info) {
                           return info.param.name;
                         });

// Sampled speculative requests (prompt lookup and a sampling draft; temperature, top_k, top_p,
// penalties) draw what Generate with the same proposer and seed draws; plain sampled requests
// beside them what plain Generate draws.
TEST(SchedulerSpeculativeSampling, EqualsSpeculativeGenerateSeedForSeed) {
  GPT model = LoadModel("tools/default_model");
  GPT other = NoisyCopy(*model);
  std::vector<Case> cases;
  const char* kinds[] = {"ngram", "other", "none"};
  for (int64_t i = 0; i < 9; ++i) {
    Case c;
    c.prompt = Prompt(model->config().vocab_size, 3 * i, 2);
    c.options.max_new_tokens = 16;
    c.options.sampling.temperature = 0.7 + 0.1 * (i % 3);
    if (i % 3 == 1) c.options.sampling.top_k = 20;
    if (i % 3 == 2) {
      c.options.sampling.top_p = 0.9;
      c.options.sampling.repetition_penalty = 1.2;
    }
    c.options.seed = 500 + i;
    c.options.speculative.k = 2 + i % 5;
    c.proposer = kinds[i % 3];
    cases.push_back(c);
  }
  SchedulerOptions options;
  options.max_running = 5;
  const Served served = Serve(model, other, cases, options);
  int64_t proposed = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i, " ", cases[i].proposer));
    EXPECT_EQ(served.results[i].tokens, Alone(model, other, cases[i], /*plain=*/false));
    proposed += served.results[i].stats.proposed_tokens;
  }
  EXPECT_GT(proposed, 0);
}

// A pool too small for every request at once: speculative rows propose only into free blocks
// and are preempted like any other, recomputed by plain replay, and no token changes.
TEST(SchedulerSpeculativePool, PreemptionNeverChangesAToken) {
  GPT model = LoadModel("tools/default_model");
  GPT other = NoisyCopy(*model);
  std::vector<Case> cases;
  for (const std::string cache_kind : {"paged", "int8"}) {
    for (Case c : GreedyCases(*model, cache_kind)) {
      c.options.max_new_tokens = 24;
      cases.push_back(c);
    }
  }
  SchedulerOptions options;
  options.max_running = 12;
  std::shared_ptr<BlockPool> pool = TestPool(*model, 40, 4);
  const Served served = Serve(model, other, cases, options, pool);
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i, " ", cases[i].cache, " ", cases[i].proposer));
    EXPECT_EQ(served.results[i].tokens, Alone(model, other, cases[i], /*plain=*/true));
  }
  EXPECT_GT(served.stats.preemptions, 0);
  EXPECT_GT(served.stats.accepted_tokens, 0);
  EXPECT_EQ(served.stats.pool_blocks_used, 0);
}

// Stops inside a verified block end the request where plain decoding ends it: a stop token, an
// on_token that says no, max_new_tokens; on_logprob sees each delivered token once.
TEST(SchedulerSpeculativeStops, EndWhereThePlainRequestEnds) {
  GPT model = LoadModel("tools/default_model");
  Case base;
  base.prompt = Prompt(model->config().vocab_size, 1, 3);
  base.options.max_new_tokens = 20;
  base.options.sampling.temperature = 0;
  base.options.speculative.k = 6;
  base.proposer = "self";
  const std::vector<int64_t> plain = Alone(model, model, base, /*plain=*/true);
  ASSERT_EQ(plain.size(), 20u);

  std::vector<Case> cases;
  Case stop = base;
  stop.options.stop_tokens = {plain[9]};
  cases.push_back(stop);
  Case callback = base;
  cases.push_back(callback);
  Case limit = base;
  limit.options.max_new_tokens = 7;
  cases.push_back(limit);
  Case logprobs = base;
  logprobs.options.top_logprobs = 2;
  cases.push_back(logprobs);

  int64_t seen = 0, logprob_calls = 0;
  cases[1].options.on_token = [&seen](int64_t) { return ++seen < 11; };
  cases[3].options.on_logprob = [&logprob_calls](const TokenLogprob&) { ++logprob_calls; };
  const Served served = Serve(model, model, cases, SchedulerOptions());
  const auto first = [&](size_t n) {
    return std::vector<int64_t>(plain.begin(), plain.begin() + static_cast<int64_t>(n));
  };
  size_t stop_at = 0;
  while (plain[stop_at] != plain[9]) ++stop_at;
  EXPECT_EQ(served.results[0].tokens, first(stop_at + 1));
  EXPECT_EQ(served.results[1].tokens, first(11));
  EXPECT_EQ(served.results[2].tokens, first(7));
  EXPECT_EQ(served.results[3].tokens, plain);
  EXPECT_EQ(logprob_calls, 20);
  for (const RequestResult& result : served.results) EXPECT_GT(result.stats.accepted_tokens, 0);
}

// SchedulerOptions.speculative_max_rows: three choices of one prompt decode together in every
// step, so a limit of two rows stops all speculation and a limit of three allows it; the tokens
// are plain greedy's either way.
TEST(SchedulerSpeculativeLimit, NoStepSpeculatesAboveTheRowLimit) {
  GPT model = LoadModel("tools/default_model");
  Case c;
  c.prompt = Prompt(model->config().vocab_size, 2, 3);
  c.options.max_new_tokens = 16;
  c.options.sampling.temperature = 0;
  c.options.speculative.k = 4;
  c.proposer = "ngram";
  const std::vector<int64_t> plain = Alone(model, model, c, /*plain=*/true);
  for (const int64_t limit : {2, 3}) {
    SchedulerOptions options;
    options.speculative_max_rows = limit;
    Scheduler scheduler(model, options);
    std::vector<GenerateOptions> choices(3, c.options);
    std::vector<std::unique_ptr<KVCache>> caches;
    for (GenerateOptions& choice : choices) {
      choice.speculative.proposer = NewProposer("ngram", model, model);
      caches.push_back(CacheOf(*model, c, nullptr));
    }
    absl::StatusOr<std::vector<std::shared_ptr<RequestHandle>>> handles =
        scheduler.SubmitChoices(c.prompt, choices, std::move(caches));
    ASSERT_TRUE(handles.ok()) << handles.status();
    for (const auto& handle : *handles) EXPECT_EQ(handle->Wait()->tokens, plain) << limit;
    const SchedulerStats stats = scheduler.Stats();
    EXPECT_EQ(stats.forked_choices, 2) << limit;  // the three decode from the same step
    if (limit == 2) {
      EXPECT_EQ(stats.speculative_steps, 0);
    } else {
      EXPECT_GT(stats.speculative_steps, 0);
    }
  }
  SchedulerOptions negative;
  negative.speculative_max_rows = -1;
  EXPECT_EQ(ErrorField(negative.Validate()), "SchedulerOptions.speculative_max_rows");
}

}  // namespace
}  // namespace lgpt
