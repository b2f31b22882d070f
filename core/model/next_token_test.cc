// NextTokenChooser against references written here: OpenAI's and vLLM's penalty definitions,
// log_softmax for the reported log-probabilities, min_p's rule over many draws, a constraint's
// mask and its errors.
#include "core/model/next_token.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>

#include "core/base/device.h"

namespace lgpt {
namespace {

at::Tensor RandomLogits(int64_t vocab, uint64_t seed) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn({1, vocab}, generator, at::kFloat) * 3;
}

// The penalties as their definitions read, in double precision over a copy.
std::vector<double> ReferencePenalties(std::vector<double> row, const SamplingOptions& options,
                                       const std::vector<int64_t>& prompt,
                                       const std::vector<int64_t>& output) {
  for (const auto& [token, bias] : options.logit_bias) row[token] += bias;
  std::set<int64_t> seen(prompt.begin(), prompt.end());
  seen.insert(output.begin(), output.end());
  for (const int64_t token : seen) {
    row[token] = row[token] > 0 ? row[token] / options.repetition_penalty
                                : row[token] * options.repetition_penalty;
  }
  std::map<int64_t, int> counts;
  for (const int64_t token : output) ++counts[token];
  for (const auto& [token, count] : counts) {
    row[token] -= count * options.frequency_penalty + options.presence_penalty;
  }
  return row;
}

TEST(NextTokenTest, PenaltiesFollowTheirDefinitions) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t vocab = 50;
    SamplingOptions options;
    options.presence_penalty = std::uniform_real_distribution<double>(-2, 2)(rng);
    options.frequency_penalty = std::uniform_real_distribution<double>(-2, 2)(rng);
    options.repetition_penalty = std::uniform_real_distribution<double>(0.5, 2)(rng);
    options.logit_bias = {{3, 5.5}, {int64_t(rng() % vocab), -7.0}};
    std::vector<int64_t> prompt, output;
    for (int i = 0; i < 12; ++i) prompt.push_back(rng() % vocab);
    for (int i = 0; i < 20; ++i) output.push_back(rng() % 15);  // repeats
    TokenPenalties penalties(options, prompt);
    for (const int64_t token : output) penalties.Observe(token);
    at::Tensor logits = RandomLogits(vocab, trial);
    std::vector<double> row(logits.data_ptr<float>(), logits.data_ptr<float>() + vocab);
    const std::vector<double> expected = ReferencePenalties(row, options, prompt, output);
    penalties.Apply(logits.data_ptr<float>(), vocab);
    for (int64_t v = 0; v < vocab; ++v) {
      EXPECT_NEAR(logits.data_ptr<float>()[v], expected[v], 1e-4)
          << "trial " << trial << " id " << v;
    }
  }
}

TEST(NextTokenTest, PenaltiesChangeTheGreedyChoiceAsTheyShould) {
  // Token 2 is best; after being generated, a large presence penalty moves greedy to token 1.
  at::Tensor logits = at::tensor({0.0f, 4.0f, 5.0f, 1.0f}).reshape({1, 4});
  SamplingOptions options;
  options.presence_penalty = 2;
  NextTokenChooser chooser(options, {});
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(1);
  EXPECT_EQ(*chooser.Choose(logits.clone(), generator), 2);
  EXPECT_EQ(*chooser.Choose(logits.clone(), generator), 1);  // 5 - 2 < 4
}

TEST(NextTokenTest, LogprobsAreTheModelsBeforeAnyAdjustment) {
  for (uint64_t seed = 0; seed < 5; ++seed) {
    const at::Tensor logits = RandomLogits(300, seed);
    const at::Tensor expected = at::log_softmax(logits.to(at::kDouble), -1).squeeze(0);
    SamplingOptions options;
    options.logit_bias = {{11, 50.0}};  // forces token 11, leaves the reported logprobs alone
    NextTokenChooser chooser(options, {}, nullptr, /*top_logprobs=*/5);
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
    TokenLogprob logprob;
    absl::StatusOr<int64_t> token = chooser.Choose(logits.clone(), generator, &logprob);
    ASSERT_TRUE(token.ok()) << token.status();
    EXPECT_EQ(*token, 11);
    EXPECT_EQ(logprob.token, 11);
    EXPECT_NEAR(logprob.logprob, expected[11].item<double>(), 1e-5);
    const auto [values, ids] = at::topk(expected, 5);
    ASSERT_EQ(logprob.top.size(), 5u);
    for (int64_t i = 0; i < 5; ++i) {
      EXPECT_EQ(logprob.top[i].first, ids[i].item<int64_t>());
      EXPECT_NEAR(logprob.top[i].second, values[i].item<double>(), 1e-5);
    }
  }
}

TEST(NextTokenTest, GreedyTokenIsTheTopLogprob) {
  const at::Tensor logits = RandomLogits(1000, 3);
  NextTokenChooser chooser(SamplingOptions{}, {}, nullptr, 3);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(3);
  TokenLogprob logprob;
  const int64_t token = *chooser.Choose(logits, generator, &logprob);
  EXPECT_EQ(token, logits.argmax(-1).item<int64_t>());
  EXPECT_EQ(logprob.top[0].first, token);
  EXPECT_DOUBLE_EQ(logprob.top[0].second, logprob.logprob);
}

TEST(NextTokenTest, LogprobsOfOtherDtypesAreReadAsFloat) {
  const at::Tensor logits = RandomLogits(64, 9).to(at::kBFloat16);
  NextTokenChooser chooser(SamplingOptions{}, {}, nullptr, 0);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(3);
  TokenLogprob logprob;
  const int64_t token = *chooser.Choose(logits, generator, &logprob);
  const at::Tensor expected = at::log_softmax(logits.to(at::kDouble), -1).squeeze(0);
  EXPECT_NEAR(logprob.logprob, expected[token].item<double>(), 1e-5);
  EXPECT_TRUE(logprob.top.empty());
}

TEST(NextTokenTest, MinPDropsUnlikelyTokensOnEveryPath) {
  // Probabilities at temperature 1: ids 0..3 ~ [0.5, 0.3, 0.15, 0.05]: min_p 0.4 keeps 0 and 1
  // (0.3 >= 0.4 * 0.5), drops 2 and 3.
  const std::vector<double> p = {0.5, 0.3, 0.15, 0.05};
  std::vector<float> log_p;
  for (double x : p) log_p.push_back(static_cast<float>(std::log(x)));
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble}) {  // host and tensor paths
    SamplingOptions options;
    options.temperature = 1;
    options.min_p = 0.4;
    NextTokenChooser chooser(options, {});
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(5);
    std::map<int64_t, int> counts;
    for (int i = 0; i < 2000; ++i) {
      const at::Tensor logits = at::tensor(log_p).reshape({1, 4}).to(dtype);
      ++counts[*chooser.Choose(logits, generator)];
    }
    EXPECT_EQ(counts[2] + counts[3], 0) << "dtype " << dtype;
    EXPECT_NEAR(counts[0] / 2000.0, 0.5 / 0.8, 0.05) << "dtype " << dtype;
  }
}

// Allows even ids only; counts what it was told.
class EvenOnly : public TokenConstraint {
 public:
  void BanDisallowed(float* row, int64_t vocab) override {
    for (int64_t v = 1; v < vocab; v += 2) row[v] = -std::numeric_limits<float>::infinity();
  }
  absl::Status Accept(int64_t token) override {
    ++accepted;
    return token % 2 == 0 ? absl::OkStatus() : absl::InvalidArgumentError("odd");
  }
  std::unique_ptr<TokenConstraint> Clone() const override {
    return std::make_unique<EvenOnly>(*this);
  }
  int accepted = 0;
};

TEST(NextTokenTest, TheConstraintMasksEveryDraw) {
  auto constraint = std::make_shared<EvenOnly>();
  SamplingOptions options;
  options.temperature = 2;
  NextTokenChooser chooser(options, {}, constraint, 0);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(5);
  for (int i = 0; i < 200; ++i) {
    TokenLogprob logprob;
    const at::Tensor logits = RandomLogits(33, i);
    absl::StatusOr<int64_t> token = chooser.Choose(logits, generator, &logprob);
    ASSERT_TRUE(token.ok()) << token.status();
    EXPECT_EQ(*token % 2, 0);
    // Reported from the unmasked logits.
    EXPECT_NEAR(logprob.logprob,
                at::log_softmax(RandomLogits(33, i).to(at::kDouble), -1)[0][*token].item<double>(),
                1e-5);
  }
  EXPECT_EQ(constraint->accepted, 200);
}

TEST(NextTokenTest, AConstraintThatBansEverythingIsAnError) {
  auto constraint = std::make_shared<EvenOnly>();
  NextTokenChooser chooser(SamplingOptions{}, {}, constraint);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor logits = at::full({1, 2}, -std::numeric_limits<float>::infinity());
  logits[0][1] = 1.0f;  // only the odd token is finite: masked, nothing is left
  absl::StatusOr<int64_t> token = chooser.Choose(logits, generator);
  EXPECT_EQ(token.status().code(), absl::StatusCode::kFailedPrecondition);
}

// Rows whose choice needs their logits and options alone can be chosen elsewhere (ChooseRows)
// and taken: the same token, and the same state after it, as Choose (greedy rows anywhere;
// sampled ones on a device, where Choose draws as ChooseRows does); rows with adjustments or
// logprobs cannot.
TEST(NextTokenTest, RowsFromLogitsAloneCanBeTakenAsChosen) {
  SamplingOptions greedy;
  NextTokenChooser plain(greedy, {});
  EXPECT_TRUE(plain.ChoosesFromLogitsAlone());
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(1);
  const at::Tensor logits = at::randn({1, 50});
  const absl::StatusOr<int64_t> chosen = plain.Choose(logits, generator);
  ASSERT_TRUE(chosen.ok());
  const std::vector<absl::StatusOr<int64_t>> together =
      ChooseRows(logits, {RowSamplingFor(greedy, generator)});
  NextTokenChooser other(greedy, {});
  EXPECT_EQ(*other.Take(together[0]), *chosen);
  EXPECT_EQ(other.Take(absl::FailedPreconditionError("broken")).status().code(),
            absl::StatusCode::kFailedPrecondition);

  SamplingOptions penalised = greedy;
  penalised.frequency_penalty = 0.5;
  EXPECT_FALSE(NextTokenChooser(penalised, {}).ChoosesFromLogitsAlone());
  EXPECT_FALSE(NextTokenChooser(greedy, {}, nullptr, /*top_logprobs=*/0).ChoosesFromLogitsAlone());
  SamplingOptions sampled = greedy;
  sampled.temperature = 0.7;
  sampled.top_p = 0.9;
  EXPECT_TRUE(NextTokenChooser(sampled, {}).ChoosesFromLogitsAlone());

  if (!CudaAvailable()) GTEST_SKIP() << "skipped (the sampled rows on CUDA): no CUDA device";
  const at::Tensor on_cuda = (at::randn({1, 3000}) * 3).to(c10::Device(c10::kCUDA, 0));
  at::Generator for_choose = at::make_generator<at::CPUGeneratorImpl>(9);
  at::Generator for_rows = at::make_generator<at::CPUGeneratorImpl>(9);
  NextTokenChooser alone(sampled, {});
  for (int step = 0; step < 8; ++step) {
    const absl::StatusOr<int64_t> token = alone.Choose(on_cuda, for_choose);
    const std::vector<absl::StatusOr<int64_t>> rows =
        ChooseRows(on_cuda, {RowSamplingFor(sampled, for_rows)});
    ASSERT_TRUE(token.ok() && rows[0].ok());
    EXPECT_EQ(*token, *rows[0]) << "step " << step;
  }
}

TEST(NextTokenTest, ValidationNamesTheFields) {
  SamplingOptions options;
  options.min_p = 1.5;
  EXPECT_NE(ValidateSampling(options).message().find("min_p"), std::string::npos);
  options = {};
  options.frequency_penalty = 3;
  EXPECT_NE(ValidateSampling(options).message().find("frequency_penalty"), std::string::npos);
  options = {};
  options.repetition_penalty = 0;
  EXPECT_NE(ValidateSampling(options).message().find("repetition_penalty"), std::string::npos);
  options = {};
  options.logit_bias = {{1, 101.0}};
  EXPECT_NE(ValidateSampling(options).message().find("logit_bias"), std::string::npos);
  options.logit_bias = {{-1, 1.0}};
  EXPECT_FALSE(ValidateSampling(options).ok());
  options.logit_bias = {{1, 100.0}};
  EXPECT_TRUE(ValidateSampling(options).ok());
}

}  // namespace
}  // namespace lgpt
