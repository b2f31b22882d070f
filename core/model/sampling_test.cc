#include "core/model/sampling.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/device.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

TEST(SamplingTest, GreedyWhenTemperatureOrTopPIsZero) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const at::Tensor logits = at::tensor({0.1f, 3.0f, 0.2f, 2.9f}).view({1, 4});
  EXPECT_EQ(SampleNext(logits, {0.0, 0, 1.0}, gen).value().item<int64_t>(), 1);
  EXPECT_EQ(SampleNext(logits, {1.0, 0, 0.0}, gen).value().item<int64_t>(), 1);
}

// Greedy float32 logits are read on the host: the same tokens as argmax (the first of tied
// maxima, -inf entries, strided rows, bfloat16 through the tensor path), NaN still an error.
TEST(SamplingTest, GreedyOnTheHostEqualsArgmax) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
  at::manual_seed(4);
  at::Tensor logits = at::randn({5, 300});
  logits[1].fill_(2.0f);                                     // all tied: token 0
  logits[2].fill_(-std::numeric_limits<float>::infinity());  // one finite entry
  logits[2][7] = -3.0f;
  logits[3][10] = 50.0f;  // tied maxima: the first
  logits[3][200] = 50.0f;
  const at::Tensor expected = logits.argmax(-1);
  EXPECT_TRUE(at::equal(SampleNext(logits, {0.0, 0, 1.0}, gen).value(), expected));
  const at::Tensor wide = at::randn({5, 600});
  const at::Tensor strided = wide.narrow(1, 0, 300);  // rows 600 floats apart
  EXPECT_TRUE(at::equal(SampleNext(strided, {0.0, 0, 1.0}, gen).value(), strided.argmax(-1)));
  const at::Tensor bf16 = logits.to(at::kBFloat16);
  EXPECT_TRUE(
      at::equal(SampleNext(bf16, {0.0, 0, 1.0}, gen).value(), bf16.to(at::kFloat).argmax(-1)));
  logits[4][3] = std::nanf("");
  EXPECT_EQ(SampleNext(logits, {0.0, 0, 1.0}, gen).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(SamplingTest, TopKOneIsGreedyAtAnyTemperature) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const at::Tensor logits = at::randn({3, 50});
  const at::Tensor sampled = SampleNext(logits, {5.0, 1, 1.0}, gen).value();
  EXPECT_TRUE(at::equal(sampled, logits.argmax(-1)));
}

TEST(SamplingTest, TopKAndTopPOnlyDrawAllowedTokens) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor logits = at::tensor({5.0f, 4.9f, 0.0f, -1.0f, 4.8f}).view({1, 5});
  for (int i = 0; i < 200; ++i) {
    const int64_t k = SampleNext(logits, {1.0, 2, 1.0}, gen).value().item<int64_t>();
    EXPECT_TRUE(k == 0 || k == 1) << k;
    // top_p 0.5 keeps only the two most likely (0.37 + 0.34 > 0.5).
    const int64_t p = SampleNext(logits, {1.0, 0, 0.5}, gen).value().item<int64_t>();
    EXPECT_TRUE(p == 0 || p == 1) << p;
  }
}

TEST(SamplingTest, SameSeedSameDraws) {
  const at::Tensor logits = at::randn({2, 100});
  at::Generator a = at::make_generator<at::CPUGeneratorImpl>(42);
  at::Generator b = at::make_generator<at::CPUGeneratorImpl>(42);
  for (int i = 0; i < 20; ++i) {
    EXPECT_TRUE(at::equal(SampleNext(logits, {0.9, 40, 0.9}, a).value(),
                          SampleNext(logits, {0.9, 40, 0.9}, b).value()));
  }
}

// A device's rows are drawn there: SampleNext on CUDA chooses what ChooseRows' CPU twin chooses
// for the keys the same seed gives (RowSamplingFor), with every option; greedy rows are each
// row's first largest logit.
TEST(SamplingTest, CudaRowsDrawAsTheTwinForTheSameSeed) {
  if (!CudaAvailable()) GTEST_SKIP() << "skipped: no CUDA device";
  const c10::Device cuda(c10::kCUDA, 0);
  at::manual_seed(11);
  const at::Tensor logits = at::randn({3, 1000}) * 3;  // [B, V]
  for (const SamplingOptions& options : {SamplingOptions{0.8}, SamplingOptions{1.0, 50},
                                         SamplingOptions{0.7, 0, 0.9}, SamplingOptions{0.0}}) {
    at::Generator for_twin = at::make_generator<at::CPUGeneratorImpl>(42);
    at::Generator for_cuda = at::make_generator<at::CPUGeneratorImpl>(42);
    for (int step = 0; step < 5; ++step) {
      std::vector<RowSampling> rows;
      for (int b = 0; b < 3; ++b) rows.push_back(RowSamplingFor(options, for_twin));
      std::vector<int64_t> expected;
      for (const absl::StatusOr<int64_t>& choice : ChooseRows(logits, rows)) {
        expected.push_back(*choice);
      }
      const absl::StatusOr<at::Tensor> drawn = SampleNext(logits.to(cuda), options, for_cuda);
      ASSERT_TRUE(drawn.ok()) << drawn.status();
      EXPECT_TRUE(at::equal(drawn->cpu(), at::tensor(expected, at::kLong))) << "step " << step;
    }
  }
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(1);
  const absl::StatusOr<at::Tensor> greedy =
      SampleNext(logits.to(cuda).to(at::kBFloat16), SamplingOptions{0.0}, generator);
  ASSERT_TRUE(greedy.ok());
  EXPECT_TRUE(at::equal(greedy->cpu(), logits.to(at::kBFloat16).to(at::kFloat).argmax(-1)));
}

// Choices of a batch in one transfer: each row's token, and an error for the rows that cannot be
// sampled only.
TEST(SamplingTest, ChooseRowsMarksOnlyTheUnusableRows) {
  at::manual_seed(12);
  at::Tensor logits = at::randn({5, 300});  // [B, V]
  logits[1][7] = 100;
  logits[1][9] = 100;  // a tie: the lower id
  logits[2][3] = std::numeric_limits<float>::quiet_NaN();
  logits[3].fill_(-std::numeric_limits<float>::infinity());
  logits[4][0] = std::numeric_limits<float>::infinity();
  std::vector<RowSampling> rows(5);
  rows[0] = RowSampling{0.9, 0, 0.9, 0, 77};
  const std::vector<absl::StatusOr<int64_t>> choices = ChooseRows(logits, rows);
  ASSERT_EQ(choices.size(), 5u);
  ASSERT_TRUE(choices[0].ok());
  EXPECT_EQ(*choices[0], (*ChooseRows(logits.narrow(0, 0, 1), {rows[0]})[0]));
  ASSERT_TRUE(choices[1].ok());
  EXPECT_EQ(*choices[1], 7);
  for (int row : {2, 3, 4}) {
    EXPECT_EQ(choices[row].status().code(), absl::StatusCode::kFailedPrecondition) << row;
    EXPECT_NE(choices[row].status().message().find(absl::StrCat("row ", row)), std::string::npos);
  }
  // Greedy rows: SampleNext's tokens, other dtypes too; an error stopping the draw: every row's.
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(1);
  const at::Tensor usable = logits.narrow(0, 1, 1);
  EXPECT_EQ(*ChooseRows(usable.to(at::kBFloat16), {RowSampling{}})[0],
            SampleNext(usable, SamplingOptions{0.0}, generator)->item<int64_t>());
  const std::vector<absl::StatusOr<int64_t>> refused = ChooseRows(logits, {RowSampling{}});
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].status().code(), absl::StatusCode::kInvalidArgument);
}

// RowSamplingFor draws one key from the generator for options that sample (the same keys for
// the same seed), none for greedy ones.
TEST(SamplingTest, RowSamplingForDrawsAKeyOnlyWhenSampling) {
  at::Generator a = at::make_generator<at::CPUGeneratorImpl>(5);
  at::Generator b = at::make_generator<at::CPUGeneratorImpl>(5);
  const SamplingOptions sampled{0.7, 20, 0.9, 0.05};
  const RowSampling first = RowSamplingFor(sampled, a);
  EXPECT_EQ(first.temperature, 0.7);
  EXPECT_EQ(first.top_k, 20);
  EXPECT_EQ(first.top_p, 0.9);
  EXPECT_EQ(first.min_p, 0.05);
  const RowSampling greedy = RowSamplingFor(SamplingOptions{0.0}, a);
  EXPECT_EQ(greedy.temperature, 0.0);
  EXPECT_EQ(greedy.key, 0u);
  const RowSampling second = RowSamplingFor(sampled, a);
  EXPECT_NE(second.key, first.key);
  EXPECT_EQ(RowSamplingFor(sampled, b).key, first.key);
  EXPECT_EQ(RowSamplingFor(sampled, b).key, second.key);  // the greedy row drew nothing
}

// The device sampler draws from the tokens the CPU sampler can draw (SamplingProbabilities'
// support): top_k, min_p and top_p mean the same on every device, ties included.
TEST(SamplingTest, DeviceDrawsKeepTheCpuSamplersTokens) {
  at::manual_seed(13);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(6);
  for (const bool ties : {false, true}) {
    for (const float scale : {1.0f, 4.0f}) {
      at::Tensor row = at::randn({2000}) * scale;  // [V]
      if (ties) row = row.to(at::kBFloat16).to(at::kFloat);
      for (const SamplingOptions& options :
           {SamplingOptions{1.0}, SamplingOptions{0.7, 0, 0.9}, SamplingOptions{1.2, 50},
            SamplingOptions{0.9, 100, 0.8}, SamplingOptions{1.0, 0, 1.0, 0.05},
            SamplingOptions{0.5, 0, 0.6, 0.01}, SamplingOptions{1.0, 1500, 0.97}}) {
        const absl::StatusOr<std::vector<double>> probabilities =
            SamplingProbabilities(row.data_ptr<float>(), row.numel(), options);
        ASSERT_TRUE(probabilities.ok());
        std::vector<int64_t> support;
        for (size_t i = 0; i < probabilities->size(); ++i) {
          if ((*probabilities)[i] > 0) support.push_back(static_cast<int64_t>(i));
        }
        const absl::StatusOr<std::vector<int64_t>> kept =
            KeptTokens(row, RowSamplingFor(options, generator));
        ASSERT_TRUE(kept.ok()) << kept.status();
        EXPECT_EQ(*kept, support) << "ties " << ties << " scale " << scale << " T "
                                  << options.temperature << " top_k " << options.top_k << " top_p "
                                  << options.top_p << " min_p " << options.min_p;
      }
    }
  }
}

// Empirical frequencies over many draws match softmax(logits / T): a sampler that ignored its
// temperature or its generator would fail here.
TEST(SamplingTest, DrawsFollowTheTemperedDistribution) {
  const at::Tensor logits = at::tensor({1.0f, 0.0f, -1.0f, 2.0f}).view({1, 4});
  constexpr int kDraws = 20000;
  for (const double temperature : {0.5, 1.0, 3.0}) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11);
    std::vector<int> counts(4, 0);
    for (int i = 0; i < kDraws; ++i)
      ++counts[SampleNext(logits, {temperature, 0, 1.0}, gen).value().item<int64_t>()];
    const at::Tensor expected = at::softmax(logits.to(at::kDouble) / temperature, -1).flatten();
    for (int v = 0; v < 4; ++v) {
      const double p = expected[v].item<double>();
      const double sigma = std::sqrt(p * (1 - p) / kDraws);
      EXPECT_NEAR(counts[v] / static_cast<double>(kDraws), p, 5 * sigma + 1e-9)
          << "token " << v << " at temperature " << temperature;
    }
  }
}

// With top_k (and top_p) the draws follow softmax(logits / T) renormalised over the tokens
// kept: the k most likely, then those top_p keeps. Both ways of drawing: on the host (float32
// rows of unit stride) and through tensor operations (a strided row: every second element of a
// longer one).
TEST(SamplingTest, TopKDrawsFollowTheDistributionOverTheKeptTokens) {
  const at::Tensor contiguous = at::tensor({1.0f, 0.0f, -1.0f, 2.0f, 0.5f, -3.0f}).view({1, 6});
  const at::Tensor strided =
      at::stack({contiguous, at::zeros_like(contiguous)}, -1).view({1, 12}).slice(1, 0, 12, 2);
  ASSERT_EQ(strided.stride(1), 2);
  ASSERT_TRUE(at::equal(strided, contiguous));
  constexpr int kDraws = 20000;
  struct Case {
    SamplingOptions options;
    std::vector<int> kept;
  };
  for (const at::Tensor& logits : {contiguous, strided})
    for (const Case& c : {Case{{0.7, 3, 1.0}, {0, 3, 4}}, Case{{1.5, 4, 1.0}, {0, 1, 3, 4}},
                          Case{{1.0, 4, 0.8}, {0, 3, 4}}, Case{{1.2, 0, 0.9}, {0, 1, 3, 4}}}) {
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(17);
      std::vector<int> counts(6, 0);
      for (int i = 0; i < kDraws; ++i)
        ++counts[SampleNext(logits, c.options, gen).value().item<int64_t>()];
      at::Tensor kept_logits = at::full({6}, -std::numeric_limits<double>::infinity(), at::kDouble);
      for (const int v : c.kept)
        kept_logits[v] = logits[0][v].item<double>() / c.options.temperature;
      const at::Tensor expected = at::softmax(kept_logits, -1);
      for (int v = 0; v < 6; ++v) {
        const double p = expected[v].item<double>();
        const double sigma = std::sqrt(p * (1 - p) / kDraws);
        EXPECT_NEAR(counts[v] / static_cast<double>(kDraws), p, 5 * sigma + 1e-9)
            << "token " << v << " top_k " << c.options.top_k << " top_p " << c.options.top_p
            << " stride " << logits.stride(1);
      }
    }
}

// Many tied values around the k-th largest: the tokens drawn are exactly the k most likely,
// ties going to the lower index (a large temperature makes every kept token likely).
TEST(SamplingTest, TopKKeepsExactlyTheKMostLikelyTokens) {
  at::manual_seed(3);
  const int64_t vocab = 4096, k = 50;
  const at::Tensor logits = at::randint(0, 60, {1, vocab}).to(at::kFloat);
  std::vector<int64_t> order(vocab);
  std::iota(order.begin(), order.end(), int64_t{0});
  const float* values = logits.data_ptr<float>();
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return values[a] > values[b]; });
  const std::set<int64_t> expected(order.begin(), order.begin() + k);
  ASSERT_EQ(values[order[k - 1]], values[order[k]]);  // the boundary is a tie
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(4);
  std::set<int64_t> drawn;
  for (int i = 0; i < 4000; ++i) {
    drawn.insert(SampleNext(logits, {1e3, k, 1.0}, gen).value().item<int64_t>());
  }
  EXPECT_EQ(drawn, expected);
}

// As LibTorch's own sampling operations: no generator means the default one (reseeded here, so
// the same draws follow the same seed).
TEST(SamplingTest, AnUndefinedGeneratorDrawsFromTheDefaultOne) {
  const at::Tensor logits = at::zeros({1, 1000});
  std::vector<int64_t> first, second;
  for (std::vector<int64_t>* draws : {&first, &second}) {
    at::manual_seed(9);
    at::Generator none;
    for (int i = 0; i < 20; ++i) {
      absl::StatusOr<at::Tensor> token = SampleNext(logits, {1.0, 0, 1.0}, none);
      ASSERT_TRUE(token.ok()) << token.status();
      draws->push_back(token->item<int64_t>());
    }
  }
  EXPECT_EQ(first, second);
  EXPECT_GT(std::set<int64_t>(first.begin(), first.end()).size(), 10u);
}

TEST(SamplingTest, DifferentSeedsDrawDifferentSequences) {
  const at::Tensor logits = at::zeros({1, 1000});
  at::Generator a = at::make_generator<at::CPUGeneratorImpl>(1);
  at::Generator b = at::make_generator<at::CPUGeneratorImpl>(2);
  int same = 0;
  for (int i = 0; i < 50; ++i) {
    same += SampleNext(logits, {1.0, 0, 1.0}, a).value().item<int64_t>() ==
            SampleNext(logits, {1.0, 0, 1.0}, b).value().item<int64_t>();
  }
  EXPECT_LT(same, 5);
}

TEST(SamplingTest, ExtremeTemperaturesStayFinite) {
  const at::Tensor logits = at::tensor({0.5f, 3.0f, -2.0f, 2.9f}).view({1, 4});
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  for (const double tiny : {1e-300, 1e-40, 1e-12}) {
    for (int i = 0; i < 20; ++i) {
      EXPECT_EQ(SampleNext(logits, {tiny, 0, 1.0}, gen).value().item<int64_t>(), 1) << tiny;
      EXPECT_EQ(SampleNext(logits, {tiny, 0, 0.9}, gen).value().item<int64_t>(), 1) << tiny;
    }
  }
  std::vector<int> seen(4, 0);  // A huge temperature is (nearly) uniform.
  for (int i = 0; i < 400; ++i)
    ++seen[SampleNext(logits, {1e300, 0, 1.0}, gen).value().item<int64_t>()];
  for (int v = 0; v < 4; ++v) EXPECT_GT(seen[v], 50) << v;
}

TEST(SamplingTest, NonFiniteLogitsAreAnError) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const float inf = std::numeric_limits<float>::infinity();
  for (const float bad : {NAN, inf}) {
    const at::Tensor logits = at::tensor({0.5f, bad, 1.0f, 0.0f, 0.0f, 2.0f}).view({2, 3});
    for (const SamplingOptions& options :
         {SamplingOptions{0.0, 0, 1.0}, SamplingOptions{1.0, 2, 0.9}}) {
      const absl::StatusOr<at::Tensor> next = SampleNext(logits, options, gen);
      ASSERT_FALSE(next.ok());
      EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_NE(next.status().message().find("row 0"), std::string::npos) << next.status();
    }
  }
  // Rows that are not unit-stride take the tensor check: the same answers.
  for (const float bad : {NAN, inf}) {
    const at::Tensor strided = at::tensor({0.0f, 0.5f, 0.0f, bad, 2.0f, 1.0f}).view({3, 2}).t();
    ASSERT_NE(strided.stride(1), 1);
    const absl::StatusOr<at::Tensor> next = SampleNext(strided, {1.0, 2, 0.9}, gen);
    ASSERT_FALSE(next.ok());
    EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(next.status().message().find("row 1"), std::string::npos) << next.status();
  }
  const at::Tensor all_masked = at::full({1, 3}, -inf);
  EXPECT_FALSE(SampleNext(all_masked, {1.0, 0, 1.0}, gen).ok());
  EXPECT_FALSE(SampleNext(all_masked.t().contiguous().t().expand({2, 3}), {1.0, 0, 1.0}, gen).ok());
  // -inf next to finite entries is a masked token, not an error.
  const at::Tensor masked = at::tensor({-inf, 1.0f, -inf}).view({1, 3});
  EXPECT_EQ(SampleNext(masked, {1.0, 0, 1.0}, gen).value().item<int64_t>(), 1);
}

// Speculative decoding's p: SampleNext's draws follow SamplingProbabilities (top_k, min_p, top_p
// and temperature together), zero where a filter drops a token; DrawIndex follows its weights.
TEST(SamplingTest, SamplingProbabilitiesAreWhatSampleNextDrawsFrom) {
  at::manual_seed(11);
  const at::Tensor logits = at::randn({1, 12}) * 2;  // [1, V]
  SamplingOptions options;
  options.temperature = 0.8;
  options.top_k = 9;
  options.top_p = 0.9;
  options.min_p = 0.02;
  const std::vector<double> p =
      SamplingProbabilities(logits.data_ptr<float>(), 12, options).value();
  ASSERT_EQ(p.size(), 12u);
  EXPECT_NEAR(std::accumulate(p.begin(), p.end(), 0.0), 1.0, 1e-12);
  EXPECT_GE(std::count(p.begin(), p.end(), 0.0), 3);  // at least top_k's drops
  constexpr int kDraws = 40000;
  std::vector<double> drawn(12, 0), indexed(12, 0);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  for (int i = 0; i < kDraws; ++i) {
    drawn[SampleNext(logits, options, gen).value().item<int64_t>()] += 1;
    indexed[DrawIndex(p, gen)] += 1;
  }
  for (int64_t v = 0; v < 12; ++v) {
    if (p[v] == 0) {
      EXPECT_EQ(drawn[v], 0) << v;
      EXPECT_EQ(indexed[v], 0) << v;
      continue;
    }
    const double sd = std::sqrt(kDraws * p[v] * (1 - p[v]));
    EXPECT_NEAR(drawn[v], kDraws * p[v], 5 * sd + 1) << v;
    EXPECT_NEAR(indexed[v], kDraws * p[v], 5 * sd + 1) << v;
  }
  EXPECT_FALSE(SamplingProbabilities(logits.data_ptr<float>(), 12, {0.0, 0, 1.0}).ok());
  const float broken[] = {1.0f, std::nanf("")};
  EXPECT_EQ(SamplingProbabilities(broken, 2, options).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(SamplingTest, RejectsImpossibleOptions) {
  EXPECT_FALSE(ValidateSampling({-1.0, 0, 1.0}).ok());
  EXPECT_FALSE(ValidateSampling({1.0, -3, 1.0}).ok());
  EXPECT_FALSE(ValidateSampling({1.0, 0, 1.5}).ok());
  EXPECT_FALSE(ValidateSampling({NAN, 0, 1.0}).ok());
  EXPECT_TRUE(ValidateSampling({0.8, 50, 0.9}).ok());
}

}  // namespace
}  // namespace lgpt
