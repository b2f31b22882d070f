// Sampled speculative decoding keeps the model's distribution (Leviathan et al. 2023; Chen et
// al. 2023): on a model of 8 tokens, the tokens Generate samples with a proposer (a fixed
// point-mass guess, a greedy draft, a sampling draft whose q differs from p) against those it
// samples without, by chi-square over thousands of seeds: each position's marginal and the
// joint of two positions, under plain temperature sampling (also against the model's exact
// probabilities) and with top_k, top_p, penalties and logit_bias applied position by position.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/kv_cache.h"
#include "core/config/config.h"
#include "core/config/config_presets.h"
#include "core/model/generate.h"
#include "core/model/gpt.h"
#include "core/speculative/draft_model_proposer.h"
#include "gtest/gtest.h"
#include "tests/test_models.h"

namespace lgpt {
namespace {

constexpr int64_t kVocab = 8;
constexpr int64_t kNewTokens = 4;
constexpr int kSamples = 4000;
const std::vector<int64_t> kPrompt = {1, 2, 3};

// A 2-layer model over 8 tokens; its logits scaled up so that its distributions are far from
// uniform and two seeds give clearly different ones.
GPT TinyModel(uint64_t seed) {
  Config config = *PresetFromName("Llama-3.2-1B");
  config.n_layer = 2;
  config.n_head = 4;
  config.n_query_groups = 2;
  config.head_size = 8;
  config.n_embd = 16;
  config.intermediate_size = 32;
  config.vocab_size = kVocab;
  config.padded_vocab_size = kVocab;
  config.block_size = 32;
  EXPECT_TRUE(config.Finalize().ok());
  GPT model = *GPTImpl::Create(config);
  RandomizeWeights(*model, seed);
  at::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    if (item.key().find("lm_head") != std::string::npos) item.value().mul_(4);
  }
  model->eval();
  return model;
}

// The model of `seed` with noise on its matrices: a draft whose distributions are near the
// target's but not equal.
GPT NoisyCopy(uint64_t seed, uint64_t noise_seed) {
  GPT model = TinyModel(seed);
  at::manual_seed(noise_seed);
  at::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    if (item.value().dim() >= 2) item.value().add_(at::randn_like(item.value()) * 0.1);
  }
  return model;
}

// Proposes the same guesses every step, as a look-up would: point masses, often wrong.
class FixedProposer : public Proposer {
 public:
  absl::StatusOr<Proposal> Propose(absl::Span<const int64_t> context, int64_t k) override {
    Proposal proposal;
    for (int64_t i = 0; i < k; ++i) proposal.tokens.push_back(i % 2 == 0 ? 3 : 5);
    return proposal;
  }
  std::string DebugName() const override { return "fixed"; }
};

using ProposerFor = std::function<std::shared_ptr<Proposer>(uint64_t seed)>;

// The new tokens of `kSamples` runs with seeds 1000, 1001, ...
std::vector<std::vector<int64_t>> Samples(GPTImpl& model, const SamplingOptions& sampling,
                                          const ProposerFor& proposer, int64_t* proposed,
                                          int64_t* accepted) {
  std::vector<std::vector<int64_t>> samples;
  for (int i = 0; i < kSamples; ++i) {
    GenerateOptions options;
    options.max_new_tokens = kNewTokens;
    options.sampling = sampling;
    options.seed = 1000 + i;
    if (proposer) {
      options.speculative.proposer = proposer(5000 + i);
      options.speculative.k = 3;
    }
    std::unique_ptr<DenseKVCache> cache = *model.NewDenseCache(1, 16);
    GenerateStats stats;
    absl::StatusOr<std::vector<int64_t>> tokens = Generate(model, *cache, kPrompt, options, &stats);
    EXPECT_TRUE(tokens.ok()) << tokens.status();
    if (!tokens.ok()) break;
    samples.push_back(*tokens);
    if (proposed != nullptr) *proposed += stats.proposed_tokens;
    if (accepted != nullptr) *accepted += stats.accepted_tokens;
  }
  return samples;
}

// Counts of a statistic of each sample (a position's token, or a pair of positions').
using Statistic = std::function<int64_t(const std::vector<int64_t>&)>;
std::map<int64_t, double> Counts(const std::vector<std::vector<int64_t>>& samples,
                                 const Statistic& statistic) {
  std::map<int64_t, double> counts;
  for (const std::vector<int64_t>& sample : samples) counts[statistic(sample)] += 1;
  return counts;
}

// The chi-square value above which a statistic of `df` degrees of freedom lies with
// probability 1e-4 (Wilson-Hilferty).
double Critical(int64_t df) {
  const double z = 3.719, d = static_cast<double>(df);
  return d * std::pow(1 - 2 / (9 * d) + z * std::sqrt(2 / (9 * d)), 3);
}

// Two samples of equal size from one distribution? Cells seen fewer than 10 times in both are
// pooled into one. Returns statistic - critical value (> 0: the samples differ).
double TwoSampleExcess(const std::map<int64_t, double>& a, const std::map<int64_t, double>& b) {
  std::map<int64_t, std::pair<double, double>> cells;
  for (const auto& [key, count] : a) cells[key].first += count;
  for (const auto& [key, count] : b) cells[key].second += count;
  std::pair<double, double> pooled = {0, 0};
  double statistic = 0;
  int64_t df = -1;
  const auto add = [&](double x, double y) {
    statistic += (x - y) * (x - y) / (x + y);
    ++df;
  };
  for (const auto& [key, counts] : cells) {
    if (counts.first + counts.second < 20) {
      pooled.first += counts.first;
      pooled.second += counts.second;
    } else {
      add(counts.first, counts.second);
    }
  }
  if (pooled.first + pooled.second > 0) add(pooled.first, pooled.second);
  return df < 1 ? 0 : statistic - Critical(df);
}

std::vector<std::pair<std::string, Statistic>> Statistics() {
  std::vector<std::pair<std::string, Statistic>> statistics;
  for (int64_t i = 0; i < kNewTokens; ++i) {
    statistics.emplace_back(absl::StrCat("token ", i),
                            [i](const std::vector<int64_t>& s) { return s[i]; });
  }
  statistics.emplace_back("tokens 1 and 2 together",
                          [](const std::vector<int64_t>& s) { return s[1] * kVocab + s[2]; });
  return statistics;
}

struct Case {
  std::string name;
  SamplingOptions sampling;
};

std::vector<Case> Cases() {
  std::vector<Case> cases(3);
  cases[0].name = "temperature 1";
  cases[0].sampling.temperature = 1.0;
  cases[1].name = "top_k 5, temperature 0.7, repetition_penalty 1.3";
  cases[1].sampling.temperature = 0.7;
  cases[1].sampling.top_k = 5;
  cases[1].sampling.repetition_penalty = 1.3;
  cases[2].name = "top_p 0.9, min_p 0.05, presence_penalty 0.5, logit_bias";
  cases[2].sampling.temperature = 1.2;
  cases[2].sampling.top_p = 0.9;
  cases[2].sampling.min_p = 0.05;
  cases[2].sampling.presence_penalty = 0.5;
  cases[2].sampling.logit_bias = {{2, 1.5}};
  return cases;
}

TEST(SpeculativeSamplingTest, SpeculationKeepsTheModelsDistribution) {
  GPT target = TinyModel(1);
  GPT draft = NoisyCopy(1, 2);
  for (const Case& c : Cases()) {
    const std::vector<std::vector<int64_t>> plain =
        Samples(*target, c.sampling, nullptr, nullptr, nullptr);
    const std::vector<std::pair<std::string, ProposerFor>> proposers = {
        {"fixed guesses", [](uint64_t) { return std::make_shared<FixedProposer>(); }},
        {"greedy draft",
         [&](uint64_t seed) {
           DraftModelProposerOptions options;
           options.seed = seed;
           return std::shared_ptr<Proposer>(
               *DraftModelProposer::Create(draft, target->config(), options));
         }},
        {"sampling draft", [&](uint64_t seed) {
           DraftModelProposerOptions options;
           options.seed = seed;
           options.sampling.temperature = 1.0;
           return std::shared_ptr<Proposer>(
               *DraftModelProposer::Create(draft, target->config(), options));
         }}};
    for (const auto& [proposer_name, proposer] : proposers) {
      int64_t proposed = 0, accepted = 0;
      const std::vector<std::vector<int64_t>> speculative =
          Samples(*target, c.sampling, proposer, &proposed, &accepted);
      ASSERT_EQ(speculative.size(), plain.size());
      // Some proposals were taken and some were not: both branches of the rule ran.
      std::printf("%s, %s: %lld of %lld proposals accepted\n", c.name.c_str(),
                  proposer_name.c_str(), static_cast<long long>(accepted),
                  static_cast<long long>(proposed));
      EXPECT_GT(accepted, proposer_name == "fixed guesses" ? 0 : proposed / 10)
          << c.name << ", " << proposer_name;
      EXPECT_LT(accepted, proposed) << c.name << ", " << proposer_name;
      for (const auto& [statistic_name, statistic] : Statistics()) {
        EXPECT_LT(TwoSampleExcess(Counts(speculative, statistic), Counts(plain, statistic)), 0)
            << c.name << ", " << proposer_name << ", " << statistic_name;
      }
    }
  }
}

// The reference above is Generate's own sampling: here the speculative samples of plain
// temperature sampling meet the model's exact probabilities, from full forward passes.
TEST(SpeculativeSamplingTest, MatchesTheModelsExactProbabilities) {
  GPT target = TinyModel(1);
  GPT draft = TinyModel(2);  // far from the target: most proposals rejected
  SamplingOptions sampling;
  sampling.temperature = 1.0;
  const std::vector<std::vector<int64_t>> speculative = Samples(
      *target, sampling,
      [&](uint64_t seed) {
        DraftModelProposerOptions options;
        options.seed = seed;
        options.sampling.temperature = 1.0;
        return std::shared_ptr<Proposer>(
            *DraftModelProposer::Create(draft, target->config(), options));
      },
      nullptr, nullptr);
  // P(t0, t1) = p(t0 | prompt) p(t1 | prompt, t0), every continuation in one batch.
  at::NoGradGuard no_grad;
  at::Tensor ids = at::empty({kVocab, 4}, at::kLong);  // [V, prompt + 1]
  for (int64_t t = 0; t < kVocab; ++t) {
    for (int64_t i = 0; i < 3; ++i) ids[t][i] = kPrompt[i];
    ids[t][3] = t;
  }
  const at::Tensor probabilities = target->Forward(ids)->softmax(-1).to(at::kDouble);  // [V, 4, V]
  const at::Tensor first = probabilities[0][2];                                        // [V]
  const at::Tensor joint = first.unsqueeze(1) * probabilities.select(1, 3);            // [V, V]
  double statistic = 0;
  std::map<int64_t, double> observed =
      Counts(speculative, [](const std::vector<int64_t>& s) { return s[0] * kVocab + s[1]; });
  int64_t cells = 0;
  double pooled_expected = 0, pooled_observed = 0;
  for (int64_t cell = 0; cell < kVocab * kVocab; ++cell) {
    const double expected = joint[cell / kVocab][cell % kVocab].item<double>() * kSamples;
    const double seen = observed.count(cell) ? observed[cell] : 0;
    if (expected < 5) {
      pooled_expected += expected;
      pooled_observed += seen;
      continue;
    }
    statistic += (seen - expected) * (seen - expected) / expected;
    ++cells;
  }
  if (pooled_expected > 0) {
    statistic +=
        (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
    ++cells;
  }
  EXPECT_LT(statistic, Critical(cells - 1)) << cells << " cells";
}

}  // namespace
}  // namespace lgpt
