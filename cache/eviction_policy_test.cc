#include "cache/eviction_policy.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

namespace lgpt {
namespace {

EvictionPolicyOptions Options(PolicyKind kind, int64_t budget) {
  EvictionPolicyOptions options;
  options.kind = kind;
  options.budget = budget;
  return options;
}

// Entries at positions 0..n-1 of one (row, group) with the newest at n - 1.
at::Tensor Positions(int64_t n) { return at::arange(n, at::kInt).view({1, 1, n}); }
at::Tensor Newest(int64_t n) { return at::full({1, 1, 1}, n - 1, at::kLong); }

// state [1, 1, n, C] from the score channel and an optional feature channel.
at::Tensor State(std::vector<float> score, std::vector<float> feature = {}) {
  const int64_t n = static_cast<int64_t>(score.size());
  std::vector<at::Tensor> channels{at::tensor(score).view({1, 1, n})};
  if (!feature.empty()) channels.push_back(at::tensor(feature).view({1, 1, n}));
  return at::stack(channels, -1);
}

TEST(EvictionPolicyTest, NamesRoundTrip) {
  for (const std::string& name : PolicyNames()) {
    auto kind = ParsePolicyKind(name);
    ASSERT_TRUE(kind.ok()) << name;
    EXPECT_EQ(PolicyName(*kind), name);
  }
  EXPECT_FALSE(ParsePolicyKind("h2o_vlen").ok());
}

TEST(EvictionPolicyTest, GracePeriodProtectsTheNewestPositions) {
  EvictionPolicyOptions options = Options(PolicyKind::kTova, 8);
  EXPECT_EQ(MakeLayerPlan(options, 8, 0, 100).recent, 0);  // tova: no recent window
  options.grace_period = 3;
  const LayerPlan plan = MakeLayerPlan(options, 8, 0, 100);
  EXPECT_EQ(plan.recent, 3);
  EXPECT_TRUE(plan.scored);
  // The newest three outrank any score, however small theirs.
  const at::Tensor priority = Priority(plan, Positions(6), State({5, 4, 3, 0, 0, 0}), Newest(6));
  for (int64_t i = 3; i < 6; ++i) {
    EXPECT_GT(priority[0][0][i].item<double>(), priority[0][0][0].item<double>());
  }
  // A grace period covering the budget leaves nothing to score: the policy is a window.
  options.grace_period = 8;
  EXPECT_FALSE(MakeLayerPlan(options, 8, 0, 100).scored);
  // h2o's grace period replaces its recent fraction.
  EvictionPolicyOptions h2o = Options(PolicyKind::kH2O, 10);
  EXPECT_EQ(MakeLayerPlan(h2o, 10, 0, 100).recent, 5);
  h2o.grace_period = 2;
  EXPECT_EQ(MakeLayerPlan(h2o, 10, 0, 100).recent, 2);
}

TEST(EvictionPolicyTest, NormalisedScoresDivideByTheQueriesThatSawTheEntry) {
  EvictionPolicyOptions options = Options(PolicyKind::kH2O, 4);
  options.grace_period = 0;
  // Entry 0 collected 3.0 over 6 queries, entry 4 collected 1.2 over 2.
  const at::Tensor state = State({3, 0.5, 0.5, 0.5, 1.2f, 0.1f});
  const LayerPlan plain = MakeLayerPlan(options, 4, 0, 100);
  const at::Tensor p = Priority(plain, Positions(6), state, Newest(6));
  EXPECT_GT(p[0][0][0].item<double>(), p[0][0][4].item<double>());
  options.normalize_scores = true;
  const LayerPlan normalized = MakeLayerPlan(options, 4, 0, 100);
  const at::Tensor q = Priority(normalized, Positions(6), state, Newest(6));
  EXPECT_DOUBLE_EQ(q[0][0][0].item<double>(), 3.0 / 6);
  EXPECT_NEAR(q[0][0][4].item<double>(), 1.2 / 2, 1e-7);
  EXPECT_LT(q[0][0][0].item<double>(), q[0][0][4].item<double>());
}

TEST(EvictionPolicyTest, ValueLengthScoresWeightAttentionByTheValueNorm) {
  const LayerPlan plan = MakeLayerPlan(Options(PolicyKind::kH2OVlen, 2), 2, 0, 100);
  ASSERT_EQ(StateChannels(plan), 2);
  // One head, two queries, three entries of equal attention; entry 1's value is twice as long
  // and entry 2's is zero: per query the weights become 1/3, 2/3, 0.
  const at::Tensor weights = at::full({1, 1, 2, 3}, 1.0f / 3);
  const at::Tensor norms = at::tensor({1.0f, 2.0f, 0.0f}).view({1, 1, 3});
  const at::Tensor scores = StepScores(plan, weights, 1, norms);
  EXPECT_TRUE(at::allclose(scores, at::tensor({2.0f / 3, 4.0f / 3, 0.0f}).view({1, 1, 3})));
  // Plain h2o sums the weights.
  const LayerPlan h2o = MakeLayerPlan(Options(PolicyKind::kH2O, 2), 2, 0, 100);
  EXPECT_TRUE(at::allclose(StepScores(h2o, weights, 1), at::full({1, 1, 3}, 2.0f / 3)));
  // The feature is the value's L2 norm.
  const at::Tensor values = at::tensor({3.0f, 4.0f, 0.0f, 1.0f}).view({1, 1, 2, 2});
  const at::Tensor feature = EntryFeature(plan, values, values, nullptr);
  EXPECT_TRUE(at::allclose(feature, at::tensor({5.0f, 1.0f}).view({1, 1, 2})));
}

TEST(EvictionPolicyTest, QuantisationAwareScoresEvictTheWorstQuantisedAmongEquals) {
  EvictionPolicyOptions options = Options(PolicyKind::kQH2O, 3);
  options.grace_period = 0;
  const LayerPlan plan = MakeLayerPlan(options, 3, 0, 100);
  ASSERT_EQ(StateChannels(plan), 2);
  // Equal scores for entries 0 and 1; entry 1 quantises badly. Entry 2 scores highest.
  const at::Tensor state = State({1, 1, 2, 0}, {0.1f, 0.9f, 0.5f, 0.2f});
  const at::Tensor p = Priority(plan, Positions(4), state, Newest(4));
  EXPECT_GT(p[0][0][0].item<double>(), p[0][0][1].item<double>());
  EXPECT_GT(p[0][0][2].item<double>(), p[0][0][0].item<double>());
  // c = 1: the error no longer counts.
  options.quant_weight = 1.0;
  const at::Tensor only_score =
      Priority(MakeLayerPlan(options, 3, 0, 100), Positions(4), state, Newest(4));
  EXPECT_DOUBLE_EQ(only_score[0][0][0].item<double>(), only_score[0][0][1].item<double>());
  // The feature is the round trip's error over keys and values.
  const at::Tensor k = at::ones({1, 1, 2, 4});
  const at::Tensor feature =
      EntryFeature(plan, k, k, [](const at::Tensor& keys, const at::Tensor& values) {
        return std::make_pair(keys * 0.5, values);  // keys off by 0.5 in each of 4 channels
      });
  EXPECT_TRUE(at::allclose(feature, at::full({1, 1, 2}, 1.0f)));
}

// The host loop's priorities (EvictDecodeOnHost) are Priority's, entry by entry.
TEST(EvictionPolicyTest, EntryPriorityEqualsPriority) {
  at::manual_seed(3);
  const int64_t rows = 3, groups = 2, slots = 40;
  const at::Tensor positions = at::randint(-1, 60, {rows, groups, slots}, at::kInt);
  const at::Tensor state = at::rand({rows, groups, slots, 2});
  const at::Tensor newest = at::tensor({59, 45, 61}, at::kLong).view({rows, 1, 1});
  for (PolicyKind kind : {PolicyKind::kWindow, PolicyKind::kSink, PolicyKind::kH2O,
                          PolicyKind::kTova, PolicyKind::kH2OVlen}) {
    for (int64_t window : {int64_t{0}, int64_t{20}}) {
      for (bool normalize : {false, true}) {
        EvictionPolicyOptions options = Options(kind, 12);
        options.sink_tokens = 3;
        options.normalize_scores = normalize;
        const LayerPlan plan = MakeLayerPlan(options, 12, window, 100);
        ASSERT_TRUE(EntryPriorityApplies(plan));
        const at::Tensor expected = Priority(plan, positions, state, newest);
        for (int64_t b = 0; b < rows; ++b) {
          for (int64_t g = 0; g < groups; ++g) {
            for (int64_t e = 0; e < slots; ++e) {
              const int64_t p = positions[b][g][e].item<int64_t>();
              if (p < 0) continue;
              EXPECT_EQ(EntryPriority(plan, p, state[b][g][e][0].item<double>(),
                                      newest[b][0][0].item<int64_t>()),
                        expected[b][g][e].item<double>())
                  << PolicyName(kind) << " window " << window << " normalize " << normalize;
            }
          }
        }
      }
    }
  }
  EXPECT_FALSE(EntryPriorityApplies(MakeLayerPlan(Options(PolicyKind::kQH2O, 12), 12, 0, 100)));
}

TEST(EvictionPolicyTest, PyramidBudgetsShrinkWithDepth) {
  auto budgets = LayerBudgets("pyramid", 64, 4);
  ASSERT_TRUE(budgets.ok());
  EXPECT_EQ(*budgets, (std::vector<int64_t>{96, 75, 53, 32}));
  EXPECT_EQ(*LayerBudgets("uniform", 64, 3), (std::vector<int64_t>{64, 64, 64}));
  EXPECT_EQ(*LayerBudgets("pyramid", 1, 3), (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(*LayerBudgets("pyramid", 10, 1), (std::vector<int64_t>{10}));
  EXPECT_FALSE(LayerBudgets("pyramids", 10, 2).ok());
}

TEST(EvictionPolicyTest, BadOptionsNameTheirField) {
  EvictionPolicyOptions options = Options(PolicyKind::kH2O, 8);
  options.grace_period = -2;
  EXPECT_NE(ValidateEvictionPolicy(options, "X").message().find("X.grace_period"),
            std::string::npos);
  options = Options(PolicyKind::kQH2O, 8);
  options.quant_weight = 1.5;
  EXPECT_NE(ValidateEvictionPolicy(options, "X").message().find("X.quant_weight"),
            std::string::npos);
  options = Options(PolicyKind::kH2O, 8);
  options.layer_budgets = {4, 0};
  EXPECT_NE(ValidateEvictionPolicy(options, "X").message().find("X.layer_budgets[1]"),
            std::string::npos);
}

}  // namespace
}  // namespace lgpt
