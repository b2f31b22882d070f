// Speculative decoding in Generate against plain Generate: greedy output token for token (the
// default model and nine golden families; n-gram, self-draft and noisy-copy draft proposers; k
// = 1..8; dense, paged, int8 and int4 caches), penalties, biases, constraints, logprobs, stop
// tokens and a continued session composing, the cache left as plain decoding leaves it, and the
// refusals (caches that evict, a k past a ring's spare slots, bad options).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <limits>
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
#include "core/speculative/draft_model_proposer.h"
#include "core/speculative/ngram_proposer.h"
#include "core/speculative/speculative_spec.h"
#include "gtest/gtest.h"
#include "tests/serving_test_util.h"
#include "tests/test_models.h"

namespace lgpt {
namespace {

constexpr int64_t kNewTokens = 32;

// A batch-1 cache of `kind` (dense, paged, int8, int4, or a budgeted policy) for `length`
// positions of `model`, dense rings with spare slots for speculation of k tokens.
std::unique_ptr<KVCache> CacheOf(GPTImpl& model, const std::string& kind, int64_t length,
                                 int64_t k) {
  KVCacheShape shape;
  shape.batch_size = 1;
  shape.max_sequence_length = length;
  shape.layers = model.CacheLayout();
  shape.dtype = model.dtype();
  shape.device = model.device();
  shape.rollback_slots = k;
  if (kind == "paged") {
    BlockPoolOptions options;
    options.entries_per_block = 4;
    options.num_blocks = length / 4 + 4;
    absl::StatusOr<std::shared_ptr<BlockPool>> pool = BlockPool::Create(shape, options);
    EXPECT_TRUE(pool.ok()) << pool.status();
    absl::StatusOr<std::unique_ptr<PagedKVCache>> cache = PagedKVCache::Create(*pool, length);
    EXPECT_TRUE(cache.ok()) << cache.status();
    return *std::move(cache);
  }
  KVCacheSpec spec = TestSpec("dense", 0, 16);
  if (kind == "int8") spec.bits = 8;
  if (kind == "int4") spec.bits = 4;
  if (kind == "h2o" || kind == "window" || kind == "sink" || kind == "tova") {
    spec = TestSpec(kind, 8, 16);
  }
  absl::StatusOr<std::unique_ptr<KVCache>> cache = MakeKVCache(spec, shape);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return *std::move(cache);
}

// A prompt that repeats itself, so prompt lookup finds matches.
std::vector<int64_t> Prompt(int64_t vocab) {
  std::vector<int64_t> prompt;
  for (int repeat = 0; repeat < 3; ++repeat) {
    for (int64_t i = 0; i < 6; ++i) prompt.push_back((37 * i + 11) % vocab);
  }
  return prompt;
}

struct Outcome {
  std::vector<int64_t> tokens;
  GenerateStats stats;
};

Outcome GenerateWith(GPTImpl& model, const std::string& cache_kind,
                     const std::vector<int64_t>& prompt, GenerateOptions options) {
  const int64_t k = options.speculative.proposer ? options.speculative.k : 0;
  std::unique_ptr<KVCache> cache =
      CacheOf(model, cache_kind, static_cast<int64_t>(prompt.size()) + options.max_new_tokens, k);
  Outcome run;
  absl::StatusOr<std::vector<int64_t>> tokens =
      Generate(model, *cache, prompt, options, &run.stats);
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  if (tokens.ok()) run.tokens = *tokens;
  return run;
}

GenerateOptions Greedy() {
  GenerateOptions options;
  options.max_new_tokens = kNewTokens;
  options.sampling.temperature = 0;
  return options;
}

// The model of a case: the default model or a checkpoint under tests/testdata.
struct Family {
  std::string name;
  std::string dir;
  // Whether its greedy stream repeats itself within kNewTokens, so that prompt lookup finds
  // matches (falcon's golden checkpoint does not).
  bool repeats = true;
};

class SpeculativeGreedyTest : public ::testing::TestWithParam<Family> {};

TEST_P(SpeculativeGreedyTest, EqualsPlainGreedyTokenForToken) {
  const Family& family = GetParam();
  GPT model = LoadModel(family.dir);
  GPT other = NoisyCopy(*model);
  const std::vector<int64_t> prompt = Prompt(model->config().vocab_size);
  const bool windowed = model->config().sliding_window_size.has_value();
  for (const std::string cache_kind : {"dense", "paged", "int8", "int4"}) {
    const Outcome plain = GenerateWith(*model, cache_kind, prompt, Greedy());
    ASSERT_EQ(plain.tokens.size(), kNewTokens) << cache_kind;
    for (const std::string proposer_kind : {"ngram", "self", "other"}) {
      int64_t accepted = 0;
      for (int64_t k = 1; k <= 8; ++k) {
        const std::string where =
            absl::StrCat(family.name, " ", cache_kind, " ", proposer_kind, " k=", k);
        GenerateOptions options = Greedy();
        options.speculative.k = k;
        if (proposer_kind == "ngram") {
          options.speculative.proposer = *NgramProposer::Create({1, 3});
        } else {
          options.speculative.proposer =
              *DraftModelProposer::Create(proposer_kind == "self" ? model : other, model->config(),
                                          DraftModelProposerOptions());
        }
        if (windowed && (cache_kind == "int8" || cache_kind == "int4")) {
          // Quantised storage of a windowed layer drops entries its window no longer sees.
          std::unique_ptr<KVCache> cache = CacheOf(*model, cache_kind, 64, k);
          const absl::Status refused = Generate(*model, *cache, prompt, options).status();
          EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << where;
          EXPECT_EQ(ErrorField(refused), "GenerateOptions.speculative") << where;
          continue;
        }
        const Outcome speculative = GenerateWith(*model, cache_kind, prompt, options);
        EXPECT_EQ(speculative.tokens, plain.tokens) << where;
        EXPECT_GT(speculative.stats.verify_steps, 0) << where;
        EXPECT_LE(speculative.stats.accepted_tokens, speculative.stats.proposed_tokens) << where;
        accepted += speculative.stats.accepted_tokens;
        if (proposer_kind == "self" && (cache_kind == "dense" || cache_kind == "paged")) {
          // The model drafting for itself proposes what it then chooses (the draft's own cache
          // is dense: over a quantised one the model's choices differ a little).
          EXPECT_EQ(speculative.stats.acceptance_rate(), 1.0) << where;
        }
      }
      // Proposals were accepted, not only rejected: a noisy copy of the model agrees often,
      // and a greedy stream repeats itself, which prompt lookup catches.
      const bool refused = windowed && (cache_kind == "int8" || cache_kind == "int4");
      if (!refused && (proposer_kind != "ngram" || (cache_kind == "dense" && family.repeats))) {
        EXPECT_GT(accepted, 0) << family.name << " " << cache_kind << " " << proposer_kind;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Families, SpeculativeGreedyTest,
    ::testing::Values(Family{"default_model", "tools/default_model"},
                      Family{"llama2", "tests/testdata/golden/llama2"},
                      Family{"pythia", "tests/testdata/golden/pythia"},
                      Family{"llama3_gqa", "tests/testdata/golden/llama3_gqa"},
                      Family{"gemma2", "tests/testdata/golden_extra/gemma2"},
                      Family{"mixtral", "tests/testdata/golden_extra/mixtral"},
                      Family{"falcon", "tests/testdata/golden_extra/falcon", /*repeats=*/false},
                      Family{"phi2", "tests/testdata/golden_extra/phi2"},
                      Family{"qwen3", "tests/testdata/golden_extra/qwen3"},
                      Family{"olmo2", "tests/testdata/golden_extra/olmo2"}),
    [](const ::testing::TestParamInfo<Family>& info) { return info.param.name; });

// Allows a token only when it is congruent to the number of tokens taken so far, modulo 3: a
// state that changes with every accepted token.
class ModuloConstraint : public TokenConstraint {
 public:
  void BanDisallowed(float* row, int64_t vocab) override {
    for (int64_t id = 0; id < vocab; ++id) {
      if (id % 3 != taken_ % 3) row[id] = -std::numeric_limits<float>::infinity();
    }
  }
  absl::Status Accept(int64_t token) override {
    if (token % 3 != taken_ % 3) return absl::InvalidArgumentError("token not allowed");
    ++taken_;
    return absl::OkStatus();
  }
  std::unique_ptr<TokenConstraint> Clone() const override {
    return std::make_unique<ModuloConstraint>(*this);
  }

 private:
  int64_t taken_ = 0;
};

TEST(SpeculativeGenerateTest, PenaltiesBiasesConstraintsAndLogprobsCompose) {
  GPT model = LoadModel("tests/testdata/golden/llama2");
  const std::vector<int64_t> prompt = Prompt(model->config().vocab_size);
  for (const bool constrained : {false, true}) {
    GenerateOptions options = Greedy();
    options.sampling.repetition_penalty = 1.3;
    options.sampling.presence_penalty = 0.4;
    options.sampling.frequency_penalty = 0.2;
    options.sampling.logit_bias = {{5, 2.0}, {9, -1.5}};
    options.top_logprobs = 3;
    std::vector<TokenLogprob> plain_logprobs, speculative_logprobs;
    options.on_logprob = [&](const TokenLogprob& l) { plain_logprobs.push_back(l); };
    if (constrained) options.constraint = std::make_shared<ModuloConstraint>();
    const Outcome plain = GenerateWith(*model, "dense", prompt, options);
    options.on_logprob = [&](const TokenLogprob& l) { speculative_logprobs.push_back(l); };
    if (constrained) options.constraint = std::make_shared<ModuloConstraint>();
    options.speculative.proposer = *DraftModelProposer::Create(model, model->config());
    options.speculative.k = 5;
    const Outcome speculative = GenerateWith(*model, "dense", prompt, options);
    EXPECT_EQ(speculative.tokens, plain.tokens) << constrained;
    // The draft knows no penalties: the model rejects some of its proposals.
    EXPECT_LT(speculative.stats.acceptance_rate(), 1.0) << constrained;
    ASSERT_EQ(speculative_logprobs.size(), plain_logprobs.size());
    for (size_t i = 0; i < plain_logprobs.size(); ++i) {
      EXPECT_EQ(speculative_logprobs[i].token, plain_logprobs[i].token);
      EXPECT_NEAR(speculative_logprobs[i].logprob, plain_logprobs[i].logprob, 1e-4);
      ASSERT_EQ(speculative_logprobs[i].top.size(), 3u);
      for (size_t j = 0; j < 3; ++j) {
        EXPECT_EQ(speculative_logprobs[i].top[j].first, plain_logprobs[i].top[j].first);
      }
    }
  }
}

// Stops inside a verified block (a stop token, on_token's false) leave the cache as plain
// decoding does: a session's next turn continues both alike.
TEST(SpeculativeGenerateTest, StopsMidBlockAndTheNextTurnContinuesAlike) {
  GPT model = LoadModel("tools/default_model");
  const std::vector<int64_t> prompt = Prompt(model->config().vocab_size);
  const Outcome reference = GenerateWith(*model, "dense", prompt, Greedy());
  for (const std::string cache_kind : {"dense", "paged", "int8"}) {
    for (const int64_t stop_at : {int64_t{5}, int64_t{12}}) {
      std::vector<std::unique_ptr<KVCache>> caches;
      std::vector<std::vector<int64_t>> replies, second_turns;
      for (const bool speculate : {false, true}) {
        caches.push_back(CacheOf(*model, cache_kind, 128, 8));
        KVCache& cache = *caches.back();
        GenerateOptions first = Greedy();
        first.stop_tokens = {reference.tokens[stop_at]};
        int64_t seen = 0;
        first.on_token = [&seen](int64_t) { return ++seen < 20; };
        std::shared_ptr<Proposer> proposer;
        if (speculate) {
          proposer = *DraftModelProposer::Create(model, model->config());
          first.speculative.proposer = proposer;
          first.speculative.k = 8;
        }
        absl::StatusOr<std::vector<int64_t>> reply = Generate(*model, cache, prompt, first);
        ASSERT_TRUE(reply.ok()) << reply.status();
        replies.push_back(*reply);
        // The next turn: the reply's last token (never fed) and a message.
        std::vector<int64_t> next = {reply->back(), 3, 1, 4, 1, 5};
        GenerateOptions second = Greedy();
        second.max_new_tokens = 16;
        second.start_position = static_cast<int64_t>(prompt.size() + reply->size()) - 1;
        if (speculate) {
          second.speculative.proposer = proposer;
          second.speculative.k = 8;
          second.speculative.history = prompt;
          second.speculative.history.insert(second.speculative.history.end(), reply->begin(),
                                            reply->end() - 1);
        }
        absl::StatusOr<std::vector<int64_t>> tokens = Generate(*model, cache, next, second);
        ASSERT_TRUE(tokens.ok()) << tokens.status();
        second_turns.push_back(*tokens);
      }
      EXPECT_EQ(replies[1], replies[0]) << cache_kind << " stop at " << stop_at;
      EXPECT_EQ(second_turns[1], second_turns[0]) << cache_kind << " stop at " << stop_at;
    }
  }
}

TEST(SpeculativeGenerateTest, CachesThatEvictAreRefusedSayingWhy) {
  GPT model = LoadModel("tests/testdata/golden/llama2");
  const std::vector<int64_t> prompt = Prompt(model->config().vocab_size);
  GenerateOptions options = Greedy();
  options.speculative.proposer = *NgramProposer::Create({1, 3});
  for (const std::string kind : {"h2o", "window", "sink", "tova"}) {
    std::unique_ptr<KVCache> cache = CacheOf(*model, kind, 64, 4);
    const absl::Status status = Generate(*model, *cache, prompt, options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << kind;
    EXPECT_EQ(ErrorField(status), "GenerateOptions.speculative") << kind;
    EXPECT_NE(status.message().find("cannot come back"), std::string::npos) << status;
  }
}

TEST(SpeculativeGenerateTest, BadSpeculationIsRefusedNamingTheField) {
  GPT model = LoadModel("tests/testdata/golden_extra/gemma2");  // sliding windows
  const std::vector<int64_t> prompt = Prompt(model->config().vocab_size);
  GenerateOptions options = Greedy();
  options.speculative.proposer = *NgramProposer::Create({1, 3});
  options.speculative.k = 4;
  // A ring with 1 spare slot forgets at most 2 entries of a step.
  std::unique_ptr<KVCache> cache = CacheOf(*model, "dense", 64, 1);
  absl::Status status = Generate(*model, *cache, prompt, options).status();
  EXPECT_EQ(ErrorField(status), "GenerateOptions.speculative.k") << status;
  options.speculative.k = 0;
  status = Generate(*model, *CacheOf(*model, "dense", 64, 4), prompt, options).status();
  EXPECT_EQ(ErrorField(status), "GenerateOptions.speculative.k") << status;
  options.speculative.k = 2;
  options.speculative.history = {1, 2};  // the cache holds nothing before the prompt
  status = Generate(*model, *CacheOf(*model, "dense", 64, 4), prompt, options).status();
  EXPECT_EQ(ErrorField(status), "GenerateOptions.speculative.history") << status;

  // The proposers' and the spec's own checks.
  EXPECT_EQ(ErrorField(NgramProposer::Create({0, 3}).status()), "NgramProposerOptions.min_n");
  EXPECT_EQ(ErrorField(NgramProposer::Create({3, 2}).status()), "NgramProposerOptions.max_n");
  GPT other_vocabulary = RandomModel("pythia-14m", 3);  // 96 tokens, not 250
  EXPECT_EQ(ErrorField(DraftModelProposer::Create(other_vocabulary, model->config()).status()),
            "DraftModelProposer.draft");
  SpeculativeSpec spec;
  spec.method = "medusa";
  EXPECT_EQ(ErrorField(ValidateSpeculativeSpec(spec)), "SpeculativeSpec.method");
  spec.method = "ngram";
  spec.num_speculative_tokens = 0;
  EXPECT_EQ(ErrorField(ValidateSpeculativeSpec(spec)), "SpeculativeSpec.num_speculative_tokens");
  spec.num_speculative_tokens = 4;
  spec.prompt_lookup_min = 5;
  EXPECT_EQ(ErrorField(ValidateSpeculativeSpec(spec)), "SpeculativeSpec.prompt_lookup_max");
  spec = SpeculativeSpec();
  spec.method = "draft";
  EXPECT_EQ(ErrorField(MakeProposer(spec, model->config(), nullptr, {}, 1).status()),
            "SpeculativeSpec.method");
}

}  // namespace
}  // namespace lgpt
