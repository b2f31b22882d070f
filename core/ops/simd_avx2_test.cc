#include "core/ops/simd_avx2.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/ops/gemv.h"

namespace lgpt {
namespace {

#ifdef LGPT_SIMD_AVX2

// Distance in units in the last place between two finite floats of the same sign.
int64_t UlpDistance(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::abs(static_cast<int64_t>(ia) - static_cast<int64_t>(ib));
}

__attribute__((target("avx2,fma"))) std::vector<float> ExpOf(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); i += 8) {
    _mm256_storeu_ps(y.data() + i, simd::Exp(_mm256_loadu_ps(x.data() + i)));
  }
  return y;
}

__attribute__((target("avx2,fma"))) float SumOf(const float* x) {
  return simd::HorizontalSum(_mm256_loadu_ps(x));
}

__attribute__((target("avx2,fma"))) float MaskedSum(const float* x, int64_t count) {
  return simd::HorizontalSum(_mm256_maskload_ps(x, simd::TailMask(count)));
}

TEST(SimdAvx2, ExpWithinTwoUlpOverTheNormalRange) {
  ASSERT_TRUE(CpuHasAvx2Fma()) << "this x86 CPU lacks AVX2/FMA, which the kernels under test need";
  // Four million evenly spaced values over the range where expf is normal, plus tiny ones.
  std::vector<float> x;
  constexpr int64_t kSteps = 1 << 22;
  for (int64_t i = 0; i < kSteps; ++i) x.push_back(-87.3f + 176.0f * i / kSteps);
  for (int k = 1; k < 60; ++k) {
    x.push_back(std::ldexp(1.0f, -k));
    x.push_back(-std::ldexp(1.0f, -k));
  }
  while (x.size() % 8 != 0) x.push_back(0.5f);
  const std::vector<float> y = ExpOf(x);
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = std::exp(x[i]);
    ASSERT_LE(UlpDistance(y[i], want), 2) << "exp(" << x[i] << ") = " << y[i] << ", want " << want;
  }
}

TEST(SimdAvx2, ExpEdges) {
  ASSERT_TRUE(CpuHasAvx2Fma()) << "this x86 CPU lacks AVX2/FMA, which the kernels under test need";
  const float inf = std::numeric_limits<float>::infinity();
  const float lowest = std::numeric_limits<float>::lowest();
  const std::vector<float> x = {0.0f, -inf, lowest, -100.0f, 89.0f, inf,
                                std::numeric_limits<float>::quiet_NaN(), 88.7f};
  const std::vector<float> y = ExpOf(x);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], 0.0f);  // masked attention scores contribute exactly nothing
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_EQ(y[3], 0.0f);
  EXPECT_EQ(y[4], inf);
  EXPECT_EQ(y[5], inf);
  EXPECT_TRUE(std::isnan(y[6]));
  EXPECT_TRUE(std::isfinite(y[7]));
  EXPECT_LE(UlpDistance(y[7], std::exp(88.7f)), 2);
}

TEST(SimdAvx2, HorizontalSumAndTailMask) {
  ASSERT_TRUE(CpuHasAvx2Fma()) << "this x86 CPU lacks AVX2/FMA, which the kernels under test need";
  const float x[8] = {1, 2, 4, 8, 16, 32, 64, 128};
  EXPECT_EQ(SumOf(x), 255.0f);
  for (int64_t count = 0; count <= 8; ++count) {
    EXPECT_EQ(MaskedSum(x, count), static_cast<float>((1 << count) - 1)) << count;
  }
}

#else

TEST(SimdAvx2, NotX86) { EXPECT_FALSE(CpuHasAvx2Fma()); }

#endif

}  // namespace
}  // namespace lgpt
