// GCC 12's AVX-512 intrinsic headers trip its own -Wuninitialized (GCC bug 105593; gemv.cc).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "core/ops/simd_avx512.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/ops/gemv.h"
#include "core/ops/simd_avx2.h"

namespace lgpt {
namespace {

#ifdef LGPT_SIMD_AVX2

uint32_t Bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}

__attribute__((target("avx2,fma"))) std::vector<float> ExpAvx2(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); i += 8) {
    _mm256_storeu_ps(y.data() + i, simd::Exp(_mm256_loadu_ps(x.data() + i)));
  }
  return y;
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) std::vector<float> ExpAvx512(
    const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); i += 16) {
    _mm512_storeu_ps(y.data() + i, simd::Exp(_mm512_loadu_ps(x.data() + i)));
  }
  return y;
}

// The 16-lane Exp is the 8-lane one, bit for bit, over the float range and its edges.
TEST(SimdAvx512, ExpHasTheAvx2Bits) {
  if (!CpuHasAvx512()) GTEST_SKIP() << "no AVX-512";
  std::vector<float> x = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          88.72283935546875f,
                          88.7228394f,
                          89.0f,
                          -87.3365478515625f,
                          -87.3365555f,
                          -103.0f,
                          std::numeric_limits<float>::lowest(),
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> wide(-100.0f, 100.0f), narrow(-1.0f, 1.0f);
  for (int i = 0; i < 1 << 16; ++i) x.push_back(i % 2 == 0 ? wide(rng) : narrow(rng));
  while (x.size() % 16 != 0) x.push_back(0.5f);
  const std::vector<float> expected = ExpAvx2(x), actual = ExpAvx512(x);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(Bits(actual[i]), Bits(expected[i])) << "exp(" << x[i] << ")";
  }
}

// ExpAndSum16 writes the AVX2 loop's exponentials and returns its sum, to the bit, for every
// tail length (sums of many terms show any change of association).
TEST(SimdAvx512, ExpAndSumHasTheAvx2Bits) {
  if (!CpuHasAvx512()) GTEST_SKIP() << "no AVX-512";
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t entries = 1; entries <= 100; ++entries) {
    std::vector<float> scores(entries);
    for (float& s : scores) s = normal(rng);
    scores[entries / 2] = std::numeric_limits<float>::lowest();  // a masked key
    const float max_score = 4.0f;
    std::vector<float> avx2 = scores, avx512 = scores;
    const float expected = simd::ExpAndSum(avx2.data(), entries, max_score);
    const float actual = simd::ExpAndSum16(avx512.data(), entries, max_score);
    ASSERT_EQ(Bits(actual), Bits(expected)) << "entries " << entries;
    for (int64_t e = 0; e < entries; ++e) {
      ASSERT_EQ(Bits(avx512[e]), Bits(avx2[e])) << "entries " << entries << " e " << e;
    }
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) std::vector<float> Sums4(
    const float* a, const float* b) {
  std::vector<float> sums(4);
  _mm_storeu_ps(sums.data(), simd::HorizontalSums4(_mm512_loadu_ps(a), _mm512_loadu_ps(b)));
  return sums;
}

__attribute__((target("avx2,fma"))) float Sum8(const float* x) {
  return simd::HorizontalSum(_mm256_loadu_ps(x));
}

// HorizontalSums4 is HorizontalSum of each 8-lane half (values of mixed magnitudes, where
// another order of additions rounds differently).
TEST(SimdAvx512, HorizontalSums4HasTheAvx2Bits) {
  if (!CpuHasAvx512()) GTEST_SKIP() << "no AVX-512";
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (int trial = 0; trial < 1000; ++trial) {
    std::vector<float> v(32);
    for (int i = 0; i < 32; ++i) v[i] = unit(rng) * std::ldexp(1.0f, i * 7 % 30 - 10);
    const std::vector<float> sums = Sums4(v.data(), v.data() + 16);
    for (int h = 0; h < 4; ++h) {
      ASSERT_EQ(Bits(sums[h]), Bits(Sum8(v.data() + 8 * h))) << "trial " << trial << " half " << h;
    }
  }
}

#endif  // LGPT_SIMD_AVX2

}  // namespace
}  // namespace lgpt
