#include "core/ops/attention.h"

#include <cmath>

#include <ATen/ATen.h>

#include "gtest/gtest.h"

namespace lgpt {
namespace {

// The textbook computation: keys repeated per head, an explicit loop-built mask.
at::Tensor Reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& q_pos, const at::Tensor& k_pos,
                     const AttentionParams& params) {
  const int64_t n_head = q.size(1), groups = k.size(1);
  const at::Tensor keys = k.repeat_interleave(n_head / groups, 1);
  const at::Tensor values = v.repeat_interleave(n_head / groups, 1);
  at::Tensor scores = at::matmul(q, keys.transpose(-1, -2)) * params.scale;
  if (params.softcap) scores = at::tanh(scores / *params.softcap) * *params.softcap;
  at::Tensor mask = at::zeros_like(scores);
  for (int64_t b = 0; b < q.size(0); ++b) {
    for (int64_t t = 0; t < q.size(2); ++t) {
      for (int64_t s = 0; s < k.size(2); ++s) {
        const int64_t qp = q_pos[b][t].item<int64_t>();
        const int64_t kp = k_pos[b][0][s].item<int64_t>();
        bool ok = kp >= 0 && kp <= qp;
        if (params.sliding_window > 0) ok = ok && kp > qp - params.sliding_window;
        if (!ok) mask.select(0, b).select(1, t).select(1, s).fill_(-INFINITY);
      }
    }
  }
  return at::matmul(at::softmax(scores + mask, -1), values);
}

struct Case {
  int64_t n_head, groups;
  int64_t window;
  bool softcap;
};

class AttentionKernelTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionKernelTest, MatchesReference) {
  const Case c = GetParam();
  at::manual_seed(7);
  const int64_t batch = 2, steps = 3, entries = 9, head_size = 8;
  const at::Tensor q = at::randn({batch, c.n_head, steps, head_size});
  const at::Tensor k = at::randn({batch, c.groups, entries, head_size});
  const at::Tensor v = at::randn({batch, c.groups, entries, head_size});
  // Slots in scrambled order with one empty slot, as a ring buffer holds them.
  const at::Tensor k_pos = at::tensor({3, 4, 5, 0, 1, 2, -1, 6, 7}, at::kLong)
                               .view({1, 1, entries})
                               .expand({batch, 1, entries});
  const at::Tensor q_pos = at::tensor({5, 6, 7}, at::kLong).view({1, steps}).expand({batch, steps});
  AttentionParams params;
  params.scale = 1 / std::sqrt(8.0);
  params.sliding_window = c.window;
  if (c.softcap) params.softcap = 2.0;
  const at::Tensor got = AttendByPositions(q, k, v, q_pos, k_pos, params);
  const at::Tensor want = Reference(q, k, v, q_pos, k_pos, params);
  EXPECT_LT((got - want).abs().max().item<double>(), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Variants, AttentionKernelTest,
                         ::testing::Values(Case{4, 4, 0, false}, Case{4, 2, 0, false},
                                           Case{4, 1, 0, false}, Case{4, 2, 3, false},
                                           Case{4, 1, 2, true}, Case{6, 3, 0, true}));

TEST(AttentionMaskTest, WindowAndCausality) {
  const at::Tensor q_pos = at::tensor({4}, at::kLong).view({1, 1});
  const at::Tensor k_pos = at::arange(-1, 7, at::kLong).view({1, 1, 8});
  const at::Tensor mask = AttentionMask(q_pos, k_pos, 3).reshape({-1});
  // Keys -1..6: allowed exactly 2, 3, 4.
  EXPECT_TRUE(at::equal(mask, at::tensor({0, 0, 0, 1, 1, 1, 0, 0}, at::kLong).to(at::kBool)));
}

TEST(AttentionKernelTest, WeightsSumToOneAndFollowTheMask) {
  const at::Tensor q = at::randn({1, 2, 2, 4});
  const at::Tensor k = at::randn({1, 1, 4, 4});
  const at::Tensor q_pos = at::tensor({2, 3}, at::kLong).view({1, 2});
  const at::Tensor k_pos = at::arange(4, at::kLong).view({1, 1, 4});
  at::Tensor weights;
  AttendByPositions(q, k, k, q_pos, k_pos, AttentionParams{}, &weights);
  ASSERT_EQ(weights.sizes(), (std::vector<int64_t>{1, 2, 2, 4}));
  EXPECT_LT((weights.sum(-1) - 1).abs().max().item<double>(), 1e-6);
  EXPECT_EQ(weights.select(2, 0).select(-1, 3).abs().max().item<double>(), 0.0);
}

// The scalar rule (the decode-step kernel's) and the tensor rule agree on every pair, empty
// slots, windows and per-group positions included.
TEST(AttentionMaskTest, ScalarAndTensorRulesAgree) {
  at::manual_seed(11);
  const at::Tensor query_positions = at::randint(0, 40, {3, 5}, at::kLong);
  const at::Tensor key_positions = at::randint(-3, 45, {3, 2, 17}, at::kLong);
  for (const int64_t window : {0, 1, 4, 100}) {
    const at::Tensor mask = AttentionMask(query_positions, key_positions, window);
    ASSERT_EQ(mask.sizes(), (at::IntArrayRef{3, 2, 5, 17}));
    int64_t allowed = 0;
    for (int64_t b = 0; b < 3; ++b) {
      for (int64_t g = 0; g < 2; ++g) {
        for (int64_t t = 0; t < 5; ++t) {
          for (int64_t s = 0; s < 17; ++s) {
            const bool expected = KeyAllowed(query_positions[b][t].item<int64_t>(),
                                             key_positions[b][g][s].item<int64_t>(), window);
            ASSERT_EQ(mask[b][g][t][s].item<bool>(), expected)
                << "window " << window << " at " << b << g << t << s;
            allowed += expected;
          }
        }
      }
    }
    EXPECT_GT(allowed, 0);
  }
  EXPECT_FALSE(KeyAllowed(5, -1, 0));
  EXPECT_FALSE(KeyAllowed(5, 6, 0));
  EXPECT_TRUE(KeyAllowed(5, 5, 1));
  EXPECT_FALSE(KeyAllowed(5, 4, 1));
}

}  // namespace
}  // namespace lgpt
