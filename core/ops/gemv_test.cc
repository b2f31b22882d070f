#include "core/ops/gemv.h"

#include <tuple>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>


namespace lgpt {
namespace {

// |a - b| <= atol + rtol |b|, with atol scaled to the size of the dot products.
void ExpectClose(const at::Tensor& actual, const at::Tensor& expected, int64_t k) {
  ASSERT_EQ(actual.sizes(), expected.sizes());
  const double atol = 1e-5 * std::sqrt(static_cast<double>(k));
  EXPECT_TRUE(at::allclose(actual, expected, /*rtol=*/1e-5, atol))
      << "max abs diff " << (actual - expected).abs().max().item<float>();
}

class GemvShapes : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, bool>> {};

TEST_P(GemvShapes, EqualsLinear) {
  const auto [rows, n_out, k, with_bias] = GetParam();
  at::manual_seed(rows * 1000 + n_out + k);
  const at::Tensor w = at::randn({n_out, k});
  const at::Tensor b = with_bias ? at::randn({n_out}) : at::Tensor();
  const at::Tensor x = at::randn({rows, k});
  const at::Tensor expected = at::linear(x, w, b);
  for (const bool avx2 : {false, true}) {
    if (avx2 && !CpuHasAvx2Fma()) continue;
    at::Tensor y = at::empty({rows, n_out});
    GemvF32(w.data_ptr<float>(), with_bias ? b.data_ptr<float>() : nullptr, x.data_ptr<float>(),
            y.data_ptr<float>(), rows, n_out, k, avx2);
    SCOPED_TRACE(avx2 ? "avx2" : "portable");
    ExpectClose(y, expected, k);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemvShapes,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 9, 32),
                                            ::testing::Values(1, 7, 9, 33, 768, 1031),
                                            ::testing::Values(1, 5, 8, 13, 64, 771),
                                            ::testing::Bool()));

// A batched decoding step gives each row the bits it gets alone.
TEST(GemvF32, ARowsResultDoesNotDependOnTheOtherRows) {
  at::manual_seed(5);
  const int64_t n_out = 67, k = 131;
  const at::Tensor w = at::randn({n_out, k});
  const at::Tensor b = at::randn({n_out});
  for (const int64_t rows : {2, 4, 7, 16, 32}) {
    const at::Tensor x = at::randn({rows, k});
    at::Tensor all = at::empty({rows, n_out});
    GemvF32(w.data_ptr<float>(), b.data_ptr<float>(), x.data_ptr<float>(), all.data_ptr<float>(),
            rows, n_out, k);
    for (int64_t m = 0; m < rows; ++m) {
      const at::Tensor row = x.narrow(0, m, 1).contiguous();
      at::Tensor alone = at::empty({1, n_out});
      GemvF32(w.data_ptr<float>(), b.data_ptr<float>(), row.data_ptr<float>(),
              alone.data_ptr<float>(), 1, n_out, k);
      EXPECT_TRUE(at::equal(all.narrow(0, m, 1), alone)) << "rows " << rows << " row " << m;
    }
  }
}

TEST(GemvLinear, KeepsLeadingDimensions) {
  at::manual_seed(1);
  const at::Tensor w = at::randn({96, 40});
  const at::Tensor b = at::randn({96});
  const at::Tensor x = at::randn({1, 3, 40});
  at::NoGradGuard no_grad;
  ASSERT_TRUE(GemvApplies(x, w, b));
  ExpectClose(GemvLinear(x, w, b), at::linear(x, w, b), 40);
  // A non-contiguous x (a column slice).
  const at::Tensor wide = at::randn({2, 80});
  const at::Tensor sliced = wide.narrow(1, 20, 40);
  ASSERT_TRUE(GemvApplies(sliced, w, b));
  ExpectClose(GemvLinear(sliced, w, b), at::linear(sliced, w, b), 40);
}

TEST(GemvApplies, OnlyForFewRowsFloatCpuWithoutGrad) {
  const at::Tensor w = at::randn({8, 16});
  EXPECT_TRUE(GemvApplies(at::randn({1, 1, 16}), w, at::Tensor()));
  EXPECT_FALSE(GemvApplies(at::randn({1, kGemvMaxRows + 1, 16}), w, at::Tensor()));
  EXPECT_FALSE(GemvApplies(at::randn({1, 16}, at::kDouble), w.to(at::kDouble), at::Tensor()));
  EXPECT_FALSE(GemvApplies(at::randn({1, 15}), w, at::Tensor()));
  EXPECT_FALSE(
      GemvApplies(at::randn({1, 16}), w.t().contiguous().t().narrow(0, 0, 8).t(), at::Tensor()));
  const at::Tensor trained = at::randn({8, 16}).requires_grad_();
  EXPECT_FALSE(GemvApplies(at::randn({1, 16}), trained, at::Tensor()));
  at::NoGradGuard no_grad;
  EXPECT_TRUE(GemvApplies(at::randn({1, 16}), trained, at::Tensor()));
}

}  // namespace
}  // namespace lgpt
