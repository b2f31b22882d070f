#include "core/ops/gemv.h"

#include <cmath>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>


namespace lgpt {
namespace {

// The kernels this CPU runs.
std::vector<GemvKernel> Kernels() {
  std::vector<GemvKernel> kernels = {GemvKernel::kPortable};
  if (CpuHasAvx2Fma()) kernels.push_back(GemvKernel::kAvx2);
  if (BestGemvKernel() == GemvKernel::kAvx512) kernels.push_back(GemvKernel::kAvx512);
  return kernels;
}

const char* Name(GemvKernel kernel) {
  switch (kernel) {
    case GemvKernel::kPortable:
      return "portable";
    case GemvKernel::kAvx2:
      return "avx2";
    case GemvKernel::kAvx512:
      return "avx512";
  }
  return "?";
}

at::Tensor RunGemv(const at::Tensor& w, const at::Tensor& b, const at::Tensor& x, GemvKernel kernel) {
  at::Tensor y = at::empty({x.size(0), w.size(0)});  // [rows, n_out]
  GemvF32(w.data_ptr<float>(), b.defined() ? b.data_ptr<float>() : nullptr, x.data_ptr<float>(),
          y.data_ptr<float>(), x.size(0), w.size(0), w.size(1), kernel);
  return y;
}

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
  for (const GemvKernel kernel : Kernels()) {
    SCOPED_TRACE(Name(kernel));
    ExpectClose(RunGemv(w, b, x, kernel), expected, k);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemvShapes,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 9, 16, 32),
                                            ::testing::Values(1, 6, 7, 9, 33, 768, 1031),
                                            ::testing::Values(1, 5, 8, 13, 64, 771),
                                            ::testing::Bool()));

// A batched decoding step gives each row the bits it gets alone, with every kernel (the
// AVX-512 one in all its row-pair and weight-row block shapes, tails of k included).
TEST(GemvF32, ARowsResultDoesNotDependOnTheOtherRows) {
  at::manual_seed(5);
  for (const int64_t k : {131, 64, 8}) {
    const int64_t n_out = 67;
    const at::Tensor w = at::randn({n_out, k});
    const at::Tensor b = at::randn({n_out});
    for (const GemvKernel kernel : Kernels()) {
      for (const int64_t rows : {2, 3, 4, 5, 7, 8, 9, 16, 17, 32}) {
        const at::Tensor x = at::randn({rows, k});
        const at::Tensor all = RunGemv(w, b, x, kernel);
        for (int64_t m = 0; m < rows; ++m) {
          const at::Tensor alone = RunGemv(w, b, x.narrow(0, m, 1).contiguous(), kernel);
          EXPECT_TRUE(at::equal(all.narrow(0, m, 1), alone))
              << Name(kernel) << " k " << k << " rows " << rows << " row " << m;
        }
      }
    }
  }
}

// Past kGemvMaxRows (prefill chunks, in slices): equal to at::linear, and each row's bits
// those it gets alone.
TEST(GemvF32, PrefillRowsEqualLinearAndRowsAlone) {
  at::manual_seed(11);
  // Past 256 rows: slices of kGemvMaxRows rows in tiles of 256 rows (the AVX-512 path).
  const int64_t n_out = 67, k = 131, rows = 9 * kGemvMaxRows + 5;
  const at::Tensor w = at::randn({n_out, k});
  const at::Tensor b = at::randn({n_out});
  const at::Tensor x = at::randn({rows, k});
  for (const GemvKernel kernel : Kernels()) {
    SCOPED_TRACE(Name(kernel));
    const at::Tensor all = RunGemv(w, b, x, kernel);
    ExpectClose(all, at::linear(x, w, b), k);
    for (const int64_t m : {int64_t{0}, kGemvMaxRows, int64_t{255}, int64_t{256}, rows - 1}) {
      EXPECT_TRUE(at::equal(all.narrow(0, m, 1), RunGemv(w, b, x.narrow(0, m, 1).contiguous(),
                                                          kernel)))
          << "row " << m;
    }
  }
}

// The AVX-512 kernel sums every product in the AVX2 kernel's order: equal bits, so results do
// not depend on which of the two the CPU has.
TEST(GemvF32, Avx512EqualsAvx2BitForBit) {
  if (BestGemvKernel() != GemvKernel::kAvx512) GTEST_SKIP() << "no AVX-512F/DQ on this CPU";
  at::manual_seed(9);
  for (const int64_t k : {1, 5, 8, 13, 64, 771, 1024}) {
    for (const int64_t n_out : {1, 5, 6, 7, 13, 24, 25, 67, 1031}) {
      const at::Tensor w = at::randn({n_out, k});
      const at::Tensor b = at::randn({n_out});
      for (const int64_t rows : {1, 2, 3, 5, 8, 11, 16, 32, 75}) {
        const at::Tensor x = at::randn({rows, k});
        for (const bool with_bias : {false, true}) {
          const at::Tensor bias = with_bias ? b : at::Tensor();
          EXPECT_TRUE(at::equal(RunGemv(w, bias, x, GemvKernel::kAvx512),
                                RunGemv(w, bias, x, GemvKernel::kAvx2)))
              << "k " << k << " n_out " << n_out << " rows " << rows << " bias " << with_bias;
        }
      }
    }
  }
}

// GemvF32Serial (the attention kernels' scores) equals the parallel GemvF32.
TEST(GemvF32Serial, EqualsGemvF32) {
  at::manual_seed(3);
  const at::Tensor w = at::randn({300, 64});
  for (const int64_t rows : {1, 4, 7, 32}) {
    const at::Tensor x = at::randn({rows, 64});
    at::Tensor y = at::empty({rows, 300});
    GemvF32Serial(w.data_ptr<float>(), nullptr, x.data_ptr<float>(), y.data_ptr<float>(), rows,
                  300, 64);
    EXPECT_TRUE(at::equal(y, RunGemv(w, at::Tensor(), x, BestGemvKernel()))) << "rows " << rows;
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
  // Prefill chunks too where the AVX-512 kernel runs (it beats BLAS there).
  EXPECT_EQ(GemvApplies(at::randn({1, kGemvMaxRows + 1, 16}), w, at::Tensor()),
            BestGemvKernel() == GemvKernel::kAvx512);
  EXPECT_FALSE(GemvApplies(at::randn({1, 4097, 16}), w, at::Tensor()));
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
