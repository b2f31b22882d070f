#include "core/ops/row_sampler.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "core/base/device.h"
#include "core/ops/row_sampler_layout.h"

namespace lgpt {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Random123's known answers for Philox-4x32-10 (its kat_vectors file).
TEST(RowSamplerLayoutTest, PhiloxMatchesTheKnownAnswers) {
  struct Case {
    uint32_t counter[4];
    uint32_t k0, k1;
    uint32_t expected[4];
  };
  const Case cases[] = {
      {{0, 0, 0, 0}, 0, 0, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       0xffffffffu,
       0xffffffffu,
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       0xa4093822u,
       0x299f31d0u,
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Case& c : cases) {
    uint32_t out[4];
    row_sampler::Philox4x32(c.counter, c.k0, c.k1, out);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(out[w], c.expected[w]) << "word " << w;
  }
}

// Our log and exp (the same bits on host and device) against the library's, in double.
TEST(RowSamplerLayoutTest, LogAndExpAreAccurate) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> exponent(-40.0f, 40.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::exp2(exponent(rng));
    const double exact = std::log(static_cast<double>(x));
    EXPECT_NEAR(row_sampler::LogPositive(x), exact, 2e-7 * std::max(1.0, std::fabs(exact)))
        << "log " << x;
  }
  for (const float x : {1.0f, 0.5f, 2.0f, 1.41421354f, 1.41421366f, 0.99999994f, 1.00000012f,
                        1.17549435e-38f, 3.4028235e38f}) {
    const double exact = std::log(static_cast<double>(x));
    EXPECT_NEAR(row_sampler::LogPositive(x), exact, 2e-7 * std::max(1e-7, std::fabs(exact)))
        << "log " << x;
  }
  EXPECT_EQ(row_sampler::LogPositive(1.0f), 0.0f);
  std::uniform_real_distribution<float> negative(-87.0f, 0.0f);
  for (int i = 0; i < 200000; ++i) {
    const float t = negative(rng);
    const double exact = std::exp(static_cast<double>(t));
    EXPECT_NEAR(row_sampler::ExpNonPositive(t), exact, 1e-6 * exact) << "exp " << t;
  }
  EXPECT_EQ(row_sampler::ExpNonPositive(0.0f), 1.0f);
  EXPECT_EQ(row_sampler::ExpNonPositive(-88.0f), 0.0f);
  EXPECT_EQ(row_sampler::ExpNonPositive(-kInf), 0.0f);
  EXPECT_EQ(row_sampler::Mass(0.0f), uint64_t{1} << row_sampler::kMassBits);
}

// Rank keys order tokens by logit, then the lower index first.
TEST(RowSamplerLayoutTest, RankKeysOrderByLogitThenIndex) {
  const std::vector<float> values = {-kInf, -3e38f, -1.0f, -1e-30f, -0.0f,
                                     0.0f,  1e-30f, 1.0f,  3e38f,   kInf};
  for (size_t a = 0; a + 1 < values.size(); ++a) {
    if (values[a] == values[a + 1]) continue;  // -0 == +0
    EXPECT_LT(row_sampler::RankKey(values[a], 0), row_sampler::RankKey(values[a + 1], 0))
        << values[a] << " < " << values[a + 1];
  }
  EXPECT_GT(row_sampler::RankKey(1.0f, 3), row_sampler::RankKey(1.0f, 4));
}

// The tokens the CPU's sampler can draw, written out plainly in float64 (core/model/sampling.h's
// rule): top_k largest (ties: lower index), then min_p on exp((x - max) / T), then top_p on the
// mass of the more likely candidates.
std::vector<int64_t> ExpectedKept(const std::vector<float>& x, const RowSampling& o) {
  const int64_t vocab = static_cast<int64_t>(x.size());
  std::vector<int64_t> order(x.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return x[a] > x[b]; });
  if (o.temperature <= 0 || o.top_p <= 0) return {order[0]};
  if (o.top_k > 0 && o.top_k < vocab) order.resize(static_cast<size_t>(o.top_k));
  std::vector<int64_t> candidates;
  std::vector<double> weights;
  for (const int64_t i : order) {
    const double w = std::exp((static_cast<double>(x[i]) - x[order[0]]) / o.temperature);
    if (w < o.min_p) continue;
    candidates.push_back(i);
    weights.push_back(w);
  }
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<int64_t> kept;
  double head = 0;
  for (size_t j = 0; j < candidates.size(); ++j) {
    if (o.top_p < 1 && head >= o.top_p * total) break;
    kept.push_back(candidates[j]);
    head += weights[j];
  }
  std::sort(kept.begin(), kept.end());
  return kept;
}

std::vector<RowSampling> OptionsToTry() {
  return {{1.0, 0, 1.0, 0.0},   {0.7, 0, 0.9, 0.0},     {1.3, 40, 1.0, 0.0}, {0.8, 40, 0.8, 0.0},
          {1.0, 0, 1.0, 0.05},  {0.6, 100, 0.95, 0.01}, {2.0, 1, 1.0, 0.0},  {0.5, 0, 0.3, 0.0},
          {1.0, 999, 0.5, 0.0}, {1.0, 5000, 0.99, 0.2}};
}

TEST(RowSamplerTest, KeptTokensFollowTheCpuSamplersRule) {
  at::manual_seed(5);
  for (const float scale : {0.5f, 3.0f, 12.0f}) {
    const at::Tensor row = at::randn({1000}) * scale;  // [V]
    const std::vector<float> x(row.data_ptr<float>(), row.data_ptr<float>() + row.numel());
    for (const RowSampling& options : OptionsToTry()) {
      const absl::StatusOr<std::vector<int64_t>> kept = KeptTokens(row, options);
      ASSERT_TRUE(kept.ok()) << kept.status();
      EXPECT_EQ(*kept, ExpectedKept(x, options))
          << "scale " << scale << " T " << options.temperature << " top_k " << options.top_k
          << " top_p " << options.top_p << " min_p " << options.min_p;
    }
  }
}

// Tied logits: top_k and top_p keep whole tokens, the lower indices first, as the CPU does.
TEST(RowSamplerTest, TiesKeepTheLowerIndices) {
  const at::Tensor row = at::zeros({10});  // [V], every token alike
  EXPECT_EQ(*KeptTokens(row, {1.0, 3}), (std::vector<int64_t>{0, 1, 2}));
  // Each weighs a tenth: tokens 0, 1, 2 have less than a quarter above them, token 3 has 0.3.
  EXPECT_EQ(*KeptTokens(row, {1.0, 0, 0.25}), (std::vector<int64_t>{0, 1, 2}));
  at::Tensor bf16_like = at::randn({4000}).to(at::kBFloat16).to(at::kFloat);  // many ties
  const std::vector<float> x(bf16_like.data_ptr<float>(),
                             bf16_like.data_ptr<float>() + bf16_like.numel());
  for (const RowSampling& options : OptionsToTry()) {
    EXPECT_EQ(*KeptTokens(bf16_like, options), ExpectedKept(x, options))
        << "top_k " << options.top_k << " top_p " << options.top_p;
  }
}

TEST(RowSamplerTest, GreedyRowsTakeTheFirstLargestLogit) {
  at::Tensor logits = at::randn({4, 50});  // [B, V]
  logits[1][7] = 100;
  logits[1][9] = 100;
  logits[3].fill_(-kInf);
  logits[3][20] = -5;
  const std::vector<RowSampling> rows = {{0.0}, {0.0}, {1.0, 0, 0.0}, {1e-300}};
  const absl::StatusOr<std::vector<int64_t>> tokens = SampleRows(logits, rows);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ((*tokens)[0], logits[0].argmax().item<int64_t>());
  EXPECT_EQ((*tokens)[1], 7);
  EXPECT_EQ((*tokens)[2], logits[2].argmax().item<int64_t>());
  EXPECT_EQ((*tokens)[3], 20);  // a temperature below float's range is greedy
}

TEST(RowSamplerTest, UnusableRowsAreMarkedAlone) {
  at::Tensor logits = at::randn({5, 30});  // [B, V]
  logits[1][3] = std::numeric_limits<float>::quiet_NaN();
  logits[2][0] = kInf;
  logits[3].fill_(-kInf);
  const std::vector<RowSampling> rows(5, RowSampling{0.9, 0, 0.9, 0, 17});
  const absl::StatusOr<std::vector<int64_t>> tokens = SampleRows(logits, rows);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  for (int b : {1, 2, 3}) EXPECT_EQ((*tokens)[b], kUnusableRow) << "row " << b;
  for (int b : {0, 4}) {
    EXPECT_GE((*tokens)[b], 0);
    EXPECT_LT((*tokens)[b], 30);
  }
  EXPECT_TRUE(KeptTokens(logits[1], rows[1])->empty());
}

// Draws over many keys follow the kept tokens' softmax at the temperature (5 standard
// deviations), and never leave the kept set.
TEST(RowSamplerTest, DrawsFollowTheDistribution) {
  const std::vector<float> x = {2.0f, 1.5f, 1.5f, 0.2f, -1.0f, -kInf, 0.9f, -3.0f};
  const at::Tensor row = at::tensor(x);  // [V]
  constexpr int kDraws = 20000;
  for (const RowSampling& base : {RowSampling{0.7}, RowSampling{1.0, 4}, RowSampling{1.5, 0, 0.8},
                                  RowSampling{1.0, 0, 1, 0.1}}) {
    const std::vector<int64_t> kept = ExpectedKept(x, base);
    std::vector<double> probability(x.size(), 0.0);
    double total = 0;
    for (const int64_t i : kept) total += std::exp((x[i] - 2.0) / base.temperature);
    for (const int64_t i : kept) probability[i] = std::exp((x[i] - 2.0) / base.temperature) / total;
    const at::Tensor logits = row.unsqueeze(0).expand({kDraws, -1});  // [draws, V]
    std::vector<RowSampling> rows(kDraws, base);
    for (int d = 0; d < kDraws; ++d) rows[d].key = 0x9e3779b97f4a7c15ull * (d + 1);
    const absl::StatusOr<std::vector<int64_t>> tokens = SampleRows(logits, rows);
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    std::vector<int> counts(x.size(), 0);
    for (const int64_t t : *tokens) ++counts[t];
    for (size_t i = 0; i < x.size(); ++i) {
      const double p = probability[i], frequency = static_cast<double>(counts[i]) / kDraws;
      if (p == 0) {
        EXPECT_EQ(counts[i], 0) << "token " << i << " is not kept";
        continue;
      }
      EXPECT_NEAR(frequency, p, 5 * std::sqrt(p * (1 - p) / kDraws) + 1e-9)
          << "token " << i << " T " << base.temperature << " top_k " << base.top_k;
    }
  }
}

// A row's token depends on its logits, options and key alone: alone, in a batch, reordered.
TEST(RowSamplerTest, TheDrawDependsOnTheRowAndKeyAlone) {
  at::manual_seed(8);
  const at::Tensor logits = at::randn({6, 700}) * 2;  // [B, V]
  std::vector<RowSampling> rows;
  for (int b = 0; b < 6; ++b) rows.push_back({0.9, b % 2 == 0 ? 0 : 30, 0.95, 0, 1000u + b});
  const std::vector<int64_t> together = *SampleRows(logits, rows);
  for (int b = 0; b < 6; ++b) {
    EXPECT_EQ((*SampleRows(logits.slice(0, b, b + 1), {rows[b]}))[0], together[b]) << b;
  }
  const at::Tensor reversed = logits.flip({0});
  std::vector<RowSampling> reversed_rows(rows.rbegin(), rows.rend());
  const std::vector<int64_t> backwards = *SampleRows(reversed, reversed_rows);
  for (int b = 0; b < 6; ++b) EXPECT_EQ(backwards[5 - b], together[b]) << b;
  // Other keys draw other tokens (a flat row: 700 tokens, 64 keys, not all alike).
  std::vector<RowSampling> keyed(64, RowSampling{1.0});
  for (int k = 0; k < 64; ++k) keyed[k].key = k;
  const std::vector<int64_t> varied = *SampleRows(at::zeros({1, 700}).expand({64, -1}), keyed);
  EXPECT_GT(std::set<int64_t>(varied.begin(), varied.end()).size(), 40u);
}

TEST(RowSamplerTest, ArgumentErrorsNameTheArgument) {
  const at::Tensor logits = at::randn({2, 10});
  const std::vector<RowSampling> two(2, RowSampling{1.0});
  const auto message = [](const absl::StatusOr<std::vector<int64_t>>& r) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  EXPECT_NE(message(SampleRows(logits.to(at::kDouble), two)).find("logits"), std::string::npos);
  EXPECT_NE(message(SampleRows(logits[0], two)).find("logits"), std::string::npos);
  EXPECT_NE(message(SampleRows(at::randn({2, 0}), two)).find("logits"), std::string::npos);
  EXPECT_NE(message(SampleRows(logits, {RowSampling{1.0}})).find("rows"), std::string::npos);
  EXPECT_NE(message(SampleRows(logits, {RowSampling{1.0}, RowSampling{-1.0}}))
                .find("rows[1].temperature"),
            std::string::npos);
  EXPECT_NE(
      message(SampleRows(logits, {RowSampling{1.0, -2}, RowSampling{1.0}})).find("rows[0].top_k"),
      std::string::npos);
  EXPECT_NE(message(SampleRows(logits, {RowSampling{1.0, 0, 1.5}, RowSampling{1.0}}))
                .find("rows[0].top_p"),
            std::string::npos);
  EXPECT_NE(message(SampleRows(logits, {RowSampling{1.0, 0, 1, 2}, RowSampling{1.0}}))
                .find("rows[0].min_p"),
            std::string::npos);
  // Strided rows are read as they are.
  const at::Tensor wide = at::randn({10, 2}).t();  // [2, 10], stride 1 between rows
  EXPECT_TRUE(SampleRows(wide, two).ok());
}

// On a GPU: the kernel chooses the twin's token for every row, over shapes and options that
// reach every branch (ties, -inf, a vocabulary of one, large vocabularies, strided rows).
TEST(RowSamplerTest, CudaKernelMatchesTheTwin) {
  if (!CudaAvailable()) GTEST_SKIP() << "skipped: no CUDA device";
  ASSERT_TRUE(RowSamplerHasCudaKernel());
  const c10::Device cuda(c10::kCUDA, 0);
  at::manual_seed(21);
  std::mt19937_64 keys(9);
  for (const int64_t vocab : {1, 7, 513, 32000, 151936}) {
    for (const bool ties : {false, true}) {
      at::Tensor logits = at::randn({24, vocab}) * 4;  // [B, V]
      if (ties) logits = logits.to(at::kBFloat16).to(at::kFloat);
      if (vocab > 7) logits.slice(1, 0, vocab / 7).fill_(-kInf);
      std::vector<RowSampling> rows;
      for (int b = 0; b < 24; ++b) {
        RowSampling r = OptionsToTry()[b % 10];
        if (b >= 20) r.temperature = 0;  // greedy rows in the batch
        r.key = keys();
        rows.push_back(r);
      }
      const absl::StatusOr<std::vector<int64_t>> expected = SampleRows(logits, rows);
      const absl::StatusOr<std::vector<int64_t>> drawn = SampleRows(logits.to(cuda), rows);
      ASSERT_TRUE(expected.ok() && drawn.ok()) << drawn.status();
      EXPECT_EQ(*drawn, *expected) << "vocab " << vocab << " ties " << ties;
    }
  }
  at::Tensor broken = at::randn({2, 100});
  broken[1][4] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<int64_t> marked =
      *SampleRows(broken.to(cuda), {RowSampling{1.0, 0, 1, 0, 3}, RowSampling{1.0}});
  EXPECT_EQ(marked[1], kUnusableRow);
  EXPECT_GE(marked[0], 0);
}

}  // namespace
}  // namespace lgpt
