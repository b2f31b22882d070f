// Small AVX2/FMA building blocks shared by the CPU decode kernels (core/gemv, core/quantize,
// attention/decode_attention). Every function carries its own target attribute, so callers
// compile without -mavx2 and pick these paths at run time after CpuHasAvx2Fma() (core/ops/gemv.h);
// on other architectures the header defines nothing and LGPT_SIMD_AVX2 stays undefined.
#ifndef LGPT_CORE_OPS_SIMD_AVX2_H_
#define LGPT_CORE_OPS_SIMD_AVX2_H_

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <cstdint>

#define LGPT_SIMD_AVX2 1

namespace lgpt {
namespace simd {

// Sum of the 8 lanes.
__attribute__((target("avx2,fma"))) inline float HorizontalSum(__m256 v) {
  const __m128 low = _mm256_castps256_ps128(v);
  const __m128 high = _mm256_extractf128_ps(v, 1);
  __m128 sum = _mm_add_ps(low, high);
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

// Mask selecting the first `count` (0..8) lanes, for loads and stores of a tail.
__attribute__((target("avx2,fma"))) inline __m256i TailMask(int64_t count) {
  alignas(32) static const int32_t kLanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                 0,  0,  0,  0,  0,  0,  0,  0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kLanes + 8 - count));
}

// exp(x) lane-wise, within 2 ulp of std::exp over the float range: x = n ln2 + r with
// |r| <= ln2/2 (ln2 split in two for an exact reduction), a degree-6 polynomial for e^r,
// and 2^n added to the exponent bits. Below -87.33 (where expf leaves the normal range) the
// result is exactly 0, so masked scores of the lowest float contribute nothing; above
// ln(FLT_MAX) it is +inf; NaN stays NaN.
__attribute__((target("avx2,fma"))) inline __m256 Exp(__m256 x_in) {
  const __m256 kMax = _mm256_set1_ps(88.72283935546875f);
  const __m256 kMin = _mm256_set1_ps(-87.3365478515625f);
  const __m256 underflow = _mm256_cmp_ps(x_in, kMin, _CMP_LT_OQ);
  const __m256 overflow = _mm256_cmp_ps(x_in, kMax, _CMP_GT_OQ);
  const __m256 nan = _mm256_cmp_ps(x_in, x_in, _CMP_UNORD_Q);
  // min/max return their second operand for NaN: clamped lanes are patched below.
  const __m256 x = _mm256_max_ps(_mm256_min_ps(x_in, kMax), kMin);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  // Cephes' expf minimax coefficients for e^r = 1 + r + r^2 p(r).
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n: n in [-126, 128]; build it in two halves so n = 128 (x near the top) stays finite.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256 scale_a =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  const __m256 scale_b = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
  __m256 result = _mm256_mul_ps(_mm256_mul_ps(p, scale_a), scale_b);
  result = _mm256_andnot_ps(underflow, result);
  result = _mm256_blendv_ps(result, _mm256_set1_ps(__builtin_inff()), overflow);
  return _mm256_blendv_ps(result, x_in, nan);
}

// s[e] = exp(s[e] - max_score) in place for e < entries; returns their sum. Scores of the
// lowest float (masked) become exactly 0. The softmax step of the attention kernels.
__attribute__((target("avx2,fma"))) inline float ExpAndSum(float* s, int64_t entries,
                                                           float max_score) {
  const __m256 max_v = _mm256_set1_ps(max_score);
  __m256 total = _mm256_setzero_ps();
  int64_t e = 0;
  for (; e + 8 <= entries; e += 8) {
    const __m256 x = Exp(_mm256_sub_ps(_mm256_loadu_ps(s + e), max_v));
    _mm256_storeu_ps(s + e, x);
    total = _mm256_add_ps(total, x);
  }
  if (e < entries) {
    const __m256i mask = TailMask(entries - e);
    const __m256 x = Exp(_mm256_sub_ps(_mm256_maskload_ps(s + e, mask), max_v));
    _mm256_maskstore_ps(s + e, mask, x);
    total = _mm256_add_ps(total, _mm256_and_ps(x, _mm256_castsi256_ps(mask)));
  }
  return HorizontalSum(total);
}

}  // namespace simd
}  // namespace lgpt

#endif  // x86

#endif  // LGPT_CORE_OPS_SIMD_AVX2_H_
