// What a request asks of each token beyond temperature, top-k and top-p, through Engine on the
// embedded default model, Generate (batch 1) and Submit (the scheduler) alike:
// - log-probabilities equal the log-softmax of an uncached forward pass over the whole text
//   (within 1e-4), and a greedy token is the most likely one;
// - penalties and biases give the tokens of a reference decoding loop written here from their
//   definitions (OpenAI's presence/frequency, vLLM's repetition, logit_bias);
// - n choices (SubmitChoices) equal n requests submitted alone with seeds seed + i, and share
//   the prompt's blocks through the pool, or fork by copy (budgeted, quantised, and dense
//   caches without a pool): the prompt is prefilled once, tokens and logprobs equal;
// - a constraint holds on every token of every choice; bad values name their field.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/base/status_field.h"
#include "lgpt.h"

namespace lgpt {
namespace {

constexpr char kDefaultModel[] = "tools/default_model";
constexpr char kPrompt[] =
    "In the beginning God created the heaven and the earth. And the earth was without form, "
    "and void; and darkness was upon the face of the deep. And the Spirit of God moved upon the "
    "face of the waters.";

std::shared_ptr<const Engine> LoadEngine(int64_t pool_bytes = 0) {
  EngineOptions options;
  options.serving.kv_pool_bytes = pool_bytes;
  absl::StatusOr<std::shared_ptr<const Engine>> engine = Engine::Load(kDefaultModel, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *engine : nullptr;
}

std::vector<int64_t> PromptIds(const Engine& engine) {
  absl::StatusOr<std::vector<int64_t>> ids = engine.Encode(kPrompt);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int64_t>{};
}

// Logits [T, V] of an uncached forward pass over `ids`.
at::Tensor FullLogits(const Engine& engine, const std::vector<int64_t>& ids) {
  at::NoGradGuard no_grad;
  absl::StatusOr<at::Tensor> logits =
      engine.model().Forward(at::tensor(ids, at::kLong).unsqueeze(0));
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits->squeeze(0).to(at::kDouble);
}

absl::StatusOr<Completion> Submitted(const Engine& engine, const std::vector<int64_t>& prompt,
                                     const RequestOptions& options) {
  absl::StatusOr<std::shared_ptr<Request>> request = engine.Submit(prompt, options);
  if (!request.ok()) return request.status();
  return (*request)->Wait();
}

TEST(EngineSamplingTest, LogprobsAreTheFullForwardsLogSoftmax) {
  std::shared_ptr<const Engine> engine = LoadEngine();
  ASSERT_NE(engine, nullptr);
  const std::vector<int64_t> prompt = PromptIds(*engine);
  RequestOptions options;
  options.max_new_tokens = 12;
  options.stop_at_eos = false;
  options.top_logprobs = 4;
  for (const bool greedy : {true, false}) {
    options.sampling = greedy ? SamplingOptions{0, 0, 1} : SamplingOptions{1.0, 20, 0.9};
    absl::StatusOr<Completion> alone = engine->Generate(prompt, options);
    absl::StatusOr<Completion> served = Submitted(*engine, prompt, options);
    ASSERT_TRUE(alone.ok()) << alone.status();
    ASSERT_TRUE(served.ok()) << served.status();
    ASSERT_EQ(alone->tokens, served->tokens);
    ASSERT_EQ(served->logprobs.size(), served->tokens.size());
    std::vector<int64_t> ids = prompt;
    ids.insert(ids.end(), served->tokens.begin(), served->tokens.end());
    const at::Tensor expected = at::log_softmax(FullLogits(*engine, ids), -1);  // [T, V]
    for (size_t i = 0; i < served->tokens.size(); ++i) {
      const at::Tensor step = expected[static_cast<int64_t>(prompt.size() + i) - 1];
      const TokenLogprob& got = served->logprobs[i];
      EXPECT_EQ(got.token, served->tokens[i]);
      EXPECT_NEAR(got.logprob, step[got.token].item<double>(), 1e-4) << "token " << i;
      EXPECT_NEAR(alone->logprobs[i].logprob, got.logprob, 1e-4);
      ASSERT_EQ(got.top.size(), 4u);
      const auto [values, order] = at::topk(step, 4);
      for (int64_t k = 0; k < 4; ++k) {
        EXPECT_NEAR(got.top[k].second, values[k].item<double>(), 1e-4);
      }
      if (greedy) {
        EXPECT_EQ(got.top[0].first, got.token);
        EXPECT_DOUBLE_EQ(got.top[0].second, got.logprob);
      }
    }
  }
}

// Greedy decoding with the penalties as their definitions read, over uncached forward passes.
std::vector<int64_t> ReferencePenalisedGreedy(const Engine& engine, std::vector<int64_t> ids,
                                              const SamplingOptions& s, int64_t new_tokens) {
  const size_t prompt_length = ids.size();
  for (int64_t step = 0; step < new_tokens; ++step) {
    at::Tensor row = FullLogits(engine, ids)[static_cast<int64_t>(ids.size()) - 1].clone();
    for (const auto& [token, bias] : s.logit_bias) row[token] += bias;
    const std::set<int64_t> seen(ids.begin(), ids.end());
    for (const int64_t token : seen) {
      const double x = row[token].item<double>();
      row[token] = x > 0 ? x / s.repetition_penalty : x * s.repetition_penalty;
    }
    std::map<int64_t, int> counts;
    for (size_t i = prompt_length; i < ids.size(); ++i) ++counts[ids[i]];
    for (const auto& [token, count] : counts) {
      row[token] -= count * s.frequency_penalty + s.presence_penalty;
    }
    ids.push_back(row.argmax().item<int64_t>());
  }
  return std::vector<int64_t>(ids.begin() + static_cast<int64_t>(prompt_length), ids.end());
}

TEST(EngineSamplingTest, PenaltiesAndBiasesFollowTheirDefinitions) {
  std::shared_ptr<const Engine> engine = LoadEngine();
  ASSERT_NE(engine, nullptr);
  const std::vector<int64_t> prompt = PromptIds(*engine);
  RequestOptions plain;
  plain.max_new_tokens = 16;
  plain.stop_at_eos = false;
  plain.sampling = {0, 0, 1};
  absl::StatusOr<Completion> unpenalised = engine->Generate(prompt, plain);
  ASSERT_TRUE(unpenalised.ok()) << unpenalised.status();

  RequestOptions options = plain;
  options.sampling.frequency_penalty = 0.8;
  options.sampling.presence_penalty = 0.4;
  options.sampling.repetition_penalty = 1.3;
  // Ban the plain run's first token, push another.
  options.sampling.logit_bias = {{unpenalised->tokens[0], -100.0}, {prompt[3], 2.5}};
  const std::vector<int64_t> expected =
      ReferencePenalisedGreedy(*engine, prompt, options.sampling, options.max_new_tokens);
  EXPECT_NE(expected, unpenalised->tokens);  // the penalties matter here
  absl::StatusOr<Completion> alone = engine->Generate(prompt, options);
  absl::StatusOr<Completion> served = Submitted(*engine, prompt, options);
  ASSERT_TRUE(alone.ok()) << alone.status();
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(alone->tokens, expected);
  EXPECT_EQ(served->tokens, expected);
}

TEST(EngineSamplingTest, ChoicesEqualRequestsAloneAndShareThePrompt) {
  std::shared_ptr<const Engine> engine = LoadEngine(8 << 20);
  ASSERT_NE(engine, nullptr);
  const std::vector<int64_t> prompt = PromptIds(*engine);
  ASSERT_GE(prompt.size(), 2 * 16u);  // two full blocks to share
  RequestOptions options;
  options.max_new_tokens = 10;
  options.stop_at_eos = false;
  options.sampling = {0.9, 40, 0.95};
  options.sampling.frequency_penalty = 0.3;
  options.seed = 77;
  std::vector<int64_t> indices;
  absl::StatusOr<std::vector<std::shared_ptr<Request>>> choices = engine->SubmitChoices(
      prompt, options, 4, [&indices](int64_t i, RequestOptions&) { indices.push_back(i); });
  ASSERT_TRUE(choices.ok()) << choices.status();
  EXPECT_EQ(indices, (std::vector<int64_t>{0, 1, 2, 3}));
  std::set<std::vector<int64_t>> distinct;
  int64_t shared = 0;
  for (size_t i = 0; i < choices->size(); ++i) {
    absl::StatusOr<Completion> choice = (*choices)[i]->Wait();
    ASSERT_TRUE(choice.ok()) << choice.status();
    shared += (*choices)[i]->prefix_hit_tokens();
    RequestOptions alone_options = options;
    alone_options.seed = options.seed + i;
    absl::StatusOr<Completion> alone = Submitted(*engine, prompt, alone_options);
    ASSERT_TRUE(alone.ok()) << alone.status();
    EXPECT_EQ(choice->tokens, alone->tokens) << "choice " << i;
    distinct.insert(choice->tokens);
  }
  EXPECT_GT(distinct.size(), 1u);  // the seeds differ
  EXPECT_GT(shared, 0);            // later choices took the prompt's blocks
  const absl::Status none = engine->SubmitChoices(prompt, options, 0).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorField(none), "SubmitChoices.n");
}

// Budgeted and quantised caches (and dense ones without a pool) fork by copy: the prompt is
// prefilled once, and every choice equals the same choice submitted alone, tokens and
// logprobs, greedy and sampled; a sink cache with cache positions goes on past the context.
class ForkedChoicesTest : public ::testing::TestWithParam<bool> {};

TEST_P(ForkedChoicesTest, EqualEachChoiceAloneAndPrefillThePromptOnce) {
  const bool with_pool = GetParam();
  std::shared_ptr<const Engine> engine = LoadEngine(with_pool ? 8 << 20 : 0);
  ASSERT_NE(engine, nullptr);
  const std::vector<int64_t> prompt = PromptIds(*engine);
  const auto spec = [](const std::string& policy, int64_t budget, int bits) {
    KVCacheSpec s;
    s.policy = policy;
    s.budget = budget;
    s.bits = bits;
    return s;
  };
  KVCacheSpec shifting = spec("sink", 24, 16);
  shifting.positions = "cache";
  std::vector<KVCacheSpec> specs = {
      spec("window", 24, 16), spec("sink", 24, 16), shifting,
      spec("h2o", 24, 16),    spec("tova", 24, 16), spec("dense", 0, 8),
      spec("dense", 0, 4),    spec("h2o", 24, 8),   spec("window", 20, 4)};
  if (!with_pool) specs.push_back(spec("dense", 0, 16));  // outside a pool dense caches fork too
  for (size_t s = 0; s < specs.size(); ++s) {
    SCOPED_TRACE(DescribeKVCacheSpec(specs[s]));
    RequestOptions options;
    options.kv_cache = specs[s];
    const bool long_stream = UsesCachePositions(specs[s]);
    // Past the 256-token context: the sink cache shifts its entries after the fork.
    options.max_new_tokens = long_stream ? 240 : 12;
    options.stop_at_eos = false;
    options.top_logprobs = 2;
    options.sampling = s % 3 == 0 ? SamplingOptions{0, 0, 1} : SamplingOptions{0.9, 40, 0.95};
    options.sampling.frequency_penalty = 0.3;
    options.prefill_chunk = s % 2 == 0 ? 16 : 0;  // chunks: the last one's eviction pending
    options.seed = 11 + s;
    const int64_t n = long_stream ? 2 : 3;
    const SchedulerStats before = engine->ServingStats();
    absl::StatusOr<std::vector<std::shared_ptr<Request>>> choices =
        engine->SubmitChoices(prompt, options, n);
    ASSERT_TRUE(choices.ok()) << choices.status();
    std::vector<Completion> completions;
    for (int64_t i = 0; i < n; ++i) {
      absl::StatusOr<Completion> choice = (*choices)[i]->Wait();
      ASSERT_TRUE(choice.ok()) << choice.status();
      EXPECT_EQ((*choices)[i]->forked_tokens(), i == 0 ? 0 : static_cast<int64_t>(prompt.size()));
      completions.push_back(*choice);
    }
    const SchedulerStats after = engine->ServingStats();
    EXPECT_EQ(after.prefill_tokens - before.prefill_tokens, static_cast<int64_t>(prompt.size()));
    EXPECT_EQ(after.forked_choices - before.forked_choices, n - 1);
    std::set<std::vector<int64_t>> distinct;
    for (int64_t i = 0; i < n; ++i) {
      RequestOptions alone_options = options;
      alone_options.seed = options.seed + i;
      absl::StatusOr<Completion> alone = Submitted(*engine, prompt, alone_options);
      ASSERT_TRUE(alone.ok()) << alone.status();
      const Completion& choice = completions[i];
      EXPECT_EQ(choice.tokens, alone->tokens) << "choice " << i;
      ASSERT_EQ(choice.logprobs.size(), alone->logprobs.size());
      for (size_t t = 0; t < choice.logprobs.size(); ++t) {
        EXPECT_EQ(choice.logprobs[t].token, alone->logprobs[t].token);
        EXPECT_EQ(choice.logprobs[t].logprob, alone->logprobs[t].logprob)
            << "choice " << i << " token " << t;
        EXPECT_EQ(choice.logprobs[t].top, alone->logprobs[t].top);
      }
      if (long_stream) {
        EXPECT_GT(choice.stats.position_shift, 0);
      }
      distinct.insert(choice.tokens);
    }
    if (options.sampling.temperature > 0) {
      EXPECT_GT(distinct.size(), 1u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Pool, ForkedChoicesTest, ::testing::Bool());

// A choice whose per_choice changes what shapes its cache (its prefill chunk) reads the prompt
// itself; the others still fork.
TEST(EngineSamplingTest, AChoiceOfOtherChunksPrefillsOnItsOwn) {
  std::shared_ptr<const Engine> engine = LoadEngine();
  ASSERT_NE(engine, nullptr);
  const std::vector<int64_t> prompt = PromptIds(*engine);
  RequestOptions options;
  options.kv_cache.policy = "h2o";
  options.kv_cache.budget = 24;
  options.max_new_tokens = 8;
  options.stop_at_eos = false;
  options.prefill_chunk = 16;
  options.seed = 5;
  const SchedulerStats before = engine->ServingStats();
  absl::StatusOr<std::vector<std::shared_ptr<Request>>> choices =
      engine->SubmitChoices(prompt, options, 3, [](int64_t i, RequestOptions& choice) {
        if (i == 1) choice.prefill_chunk = 8;
      });
  ASSERT_TRUE(choices.ok()) << choices.status();
  for (int64_t i = 0; i < 3; ++i) {
    absl::StatusOr<Completion> choice = (*choices)[i]->Wait();
    ASSERT_TRUE(choice.ok()) << choice.status();
    RequestOptions alone_options = options;
    alone_options.seed = options.seed + i;
    if (i == 1) alone_options.prefill_chunk = 8;
    absl::StatusOr<Completion> alone = Submitted(*engine, prompt, alone_options);
    ASSERT_TRUE(alone.ok()) << alone.status();
    EXPECT_EQ(choice->tokens, alone->tokens) << "choice " << i;
  }
  EXPECT_EQ((*choices)[1]->forked_tokens(), 0);
  EXPECT_EQ((*choices)[2]->forked_tokens(), static_cast<int64_t>(prompt.size()));
  const SchedulerStats after = engine->ServingStats();
  EXPECT_EQ(after.forked_choices - before.forked_choices, 1);
}

// Allows a fixed set of ids.
class OnlyThese : public TokenConstraint {
 public:
  explicit OnlyThese(std::set<int64_t> allowed) : allowed_(std::move(allowed)) {}
  void BanDisallowed(float* row, int64_t vocab) override {
    for (int64_t v = 0; v < vocab; ++v) {
      if (allowed_.count(v) == 0) row[v] = -std::numeric_limits<float>::infinity();
    }
  }
  absl::Status Accept(int64_t token) override {
    return allowed_.count(token) ? absl::OkStatus() : absl::InvalidArgumentError("not allowed");
  }
  std::unique_ptr<TokenConstraint> Clone() const override {
    return std::make_unique<OnlyThese>(*this);
  }

 private:
  std::set<int64_t> allowed_;
};

TEST(EngineSamplingTest, AConstraintHoldsOnEveryChoice) {
  std::shared_ptr<const Engine> engine = LoadEngine(8 << 20);
  ASSERT_NE(engine, nullptr);
  const std::vector<int64_t> prompt = PromptIds(*engine);
  const std::set<int64_t> allowed = {prompt[1], prompt[2], prompt[5], prompt[8]};
  RequestOptions options;
  options.max_new_tokens = 12;
  options.stop_at_eos = false;
  options.sampling = {1.0, 0, 1};
  options.constraint = std::make_shared<OnlyThese>(allowed);
  absl::StatusOr<std::vector<std::shared_ptr<Request>>> choices =
      engine->SubmitChoices(prompt, options, 3);
  ASSERT_TRUE(choices.ok()) << choices.status();
  for (const std::shared_ptr<Request>& request : *choices) {
    absl::StatusOr<Completion> choice = request->Wait();
    ASSERT_TRUE(choice.ok()) << choice.status();
    ASSERT_EQ(choice->tokens.size(), 12u);
    for (const int64_t token : choice->tokens) EXPECT_EQ(allowed.count(token), 1u) << token;
  }
  absl::StatusOr<Completion> alone = engine->Generate(prompt, options);
  ASSERT_TRUE(alone.ok()) << alone.status();
  for (const int64_t token : alone->tokens) EXPECT_EQ(allowed.count(token), 1u) << token;
}

TEST(EngineSamplingTest, BadValuesNameTheirField) {
  std::shared_ptr<const Engine> engine = LoadEngine();
  ASSERT_NE(engine, nullptr);
  const std::vector<int64_t> prompt = PromptIds(*engine);
  RequestOptions options;
  options.max_new_tokens = 8;
  options.sampling.logit_bias = {{engine->config().PaddedVocabSize(), 1.0}};
  absl::Status status = engine->Generate(prompt, options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorField(status), "SamplingOptions.logit_bias");
  EXPECT_EQ(ErrorField(Submitted(*engine, prompt, options).status()), "SamplingOptions.logit_bias");
  options.sampling.logit_bias.clear();
  options.top_logprobs = -2;
  EXPECT_EQ(ErrorField(engine->Generate(prompt, options).status()), "RequestOptions.top_logprobs");
  options.top_logprobs = -1;
  options.sampling.min_p = -0.1;
  EXPECT_EQ(ErrorField(Submitted(*engine, prompt, options).status()), "SamplingOptions.min_p");
}

}  // namespace
}  // namespace lgpt
