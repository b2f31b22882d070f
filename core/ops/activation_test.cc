#include "core/ops/activation.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/ops/gemv.h"

namespace lgpt {
namespace {

at::Tensor Reference(const at::Tensor& gate, const at::Tensor& up) {
  return at::silu(gate.to(at::kDouble)) * up.to(at::kDouble);
}

TEST(SiluMulInPlace, EqualsSiluTimesUpWithinRounding) {
  if (!CpuHasAvx2Fma()) GTEST_SKIP() << "no AVX2/FMA: the caller's LibTorch path runs";
  at::manual_seed(1);
  // Sizes with and without a partial last vector, below and above the parallel threshold.
  for (int64_t n : {1, 7, 8, 13, 2816, 3 * 2816 + 5, 256 * 2816}) {
    at::Tensor gate = at::randn({n}) * 6;
    const at::Tensor up = at::randn({n});
    const at::Tensor expected = Reference(gate, up);
    ASSERT_TRUE(SiluMulInPlace(gate, up));
    const at::Tensor error = (gate.to(at::kDouble) - expected).abs();
    // silu·up in float32: a few roundings of the result's magnitude.
    const at::Tensor bound = expected.abs() * 4e-7 + 1e-30;
    EXPECT_TRUE(at::all(error <= bound).item<bool>())
        << "n=" << n << " max error " << error.max().item<double>();
  }
}

TEST(SiluMulInPlace, ARowHasTheSameBitsInAnyBatch) {
  if (!CpuHasAvx2Fma()) GTEST_SKIP() << "no AVX2/FMA";
  const at::Tensor gate = at::randn({16, 2819}), up = at::randn({16, 2819});
  at::Tensor all = gate.clone();
  ASSERT_TRUE(SiluMulInPlace(all, up));
  for (int64_t r : {0, 5, 15}) {
    at::Tensor one = gate[r].clone();
    ASSERT_TRUE(SiluMulInPlace(one, up[r].contiguous()));
    EXPECT_TRUE(at::equal(one, all[r])) << "row " << r;
  }
}

TEST(SiluMulInPlace, ExtremesAndNan) {
  if (!CpuHasAvx2Fma()) GTEST_SKIP() << "no AVX2/FMA";
  const float inf = std::numeric_limits<float>::infinity();
  at::Tensor gate = at::tensor({-200.0f, -88.0f, 0.0f, 30.0f, 200.0f, inf, NAN, 1.0f});
  const at::Tensor up = at::ones({8});
  ASSERT_TRUE(SiluMulInPlace(gate, up));
  const float* g = gate.data_ptr<float>();
  EXPECT_EQ(g[0], 0.0f);  // -200 / (1 + inf)
  EXPECT_NEAR(g[1], -88.0f * std::exp(-88.0f), 1e-37);
  EXPECT_EQ(g[2], 0.0f);
  EXPECT_FLOAT_EQ(g[3], 30.0f);
  EXPECT_EQ(g[4], 200.0f);
  EXPECT_EQ(g[5], inf);
  EXPECT_TRUE(std::isnan(g[6]));
  EXPECT_FLOAT_EQ(g[7], 1.0f / (1.0f + std::exp(-1.0f)));
}

TEST(SiluMulInPlace, DeclinesWhatItDoesNotCover) {
  at::Tensor gate = at::randn({4, 8});
  const at::Tensor before = gate.clone();
  EXPECT_FALSE(SiluMulInPlace(gate, at::randn({4, 9})));               // shapes differ
  EXPECT_FALSE(SiluMulInPlace(gate, at::randn({8, 4}).t()));           // not contiguous
  EXPECT_FALSE(SiluMulInPlace(gate, at::randn({4, 8}, at::kDouble)));  // not float32
  at::Tensor doubles = gate.to(at::kDouble);
  EXPECT_FALSE(SiluMulInPlace(doubles, at::randn({4, 8}, at::kDouble)));
  at::Tensor tracked = at::randn({4, 8}).requires_grad_();
  EXPECT_FALSE(SiluMulInPlace(tracked, at::randn({4, 8})));  // autograd
  EXPECT_TRUE(at::equal(gate, before));
}

}  // namespace
}  // namespace lgpt
