// AVX-512 twins of simd_avx2.h's building blocks for the CPU decode kernels, with the same bits:
// every lane runs the AVX2 function's operations in the same order, and sums keep the AVX2
// association (8 lanes, then HorizontalSum's tree), so a kernel built on these gives what its
// AVX2 version gives, only with half the instructions. Each function carries its own target
// attribute; callers pick them at run time after CpuHasAvx512() (core/ops/gemv.h). Defined
// where LGPT_SIMD_AVX2 is (x86).
#ifndef LGPT_CORE_OPS_SIMD_AVX512_H_
#define LGPT_CORE_OPS_SIMD_AVX512_H_

#include "core/ops/simd_avx2.h"

#ifdef LGPT_SIMD_AVX2

// GCC 12's AVX-512 intrinsic headers start vectors from _mm512_undefined_*(), which its own
// -Wuninitialized flags inside every caller (GCC bug 105593; see gemv.cc). This covers the
// definitions here; the warning is issued where they are inlined, so a .cc file using them
// ignores it at its top as well.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstdint>

namespace lgpt {
namespace simd {

// Mask of the first `count` (0..16) lanes.
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) inline __mmask16 TailMask16(
    int64_t count) {
  return static_cast<__mmask16>((1u << count) - 1u);
}

// Exp (simd_avx2.h) on 16 lanes: the same operations, so each lane gets the same bits.
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) inline __m512 Exp(__m512 x_in) {
  const __m512 kMax = _mm512_set1_ps(88.72283935546875f);
  const __m512 kMin = _mm512_set1_ps(-87.3365478515625f);
  const __mmask16 underflow = _mm512_cmp_ps_mask(x_in, kMin, _CMP_LT_OQ);
  const __mmask16 overflow = _mm512_cmp_ps_mask(x_in, kMax, _CMP_GT_OQ);
  const __mmask16 nan = _mm512_cmp_ps_mask(x_in, x_in, _CMP_UNORD_Q);
  const __m512 x = _mm512_max_ps(_mm512_min_ps(x_in, kMax), kMin);
  // roundscale with scale 0 rounds to an integer as _mm256_round_ps does.
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 r2 = _mm512_mul_ps(r, r);
  p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i ni = _mm512_cvtps_epi32(n);
  const __m512i half = _mm512_srai_epi32(ni, 1);
  const __m512 scale_a =
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(half, _mm512_set1_epi32(127)), 23));
  const __m512 scale_b = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(ni, half), _mm512_set1_epi32(127)), 23));
  __m512 result = _mm512_mul_ps(_mm512_mul_ps(p, scale_a), scale_b);
  result = _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflow), result);
  result = _mm512_mask_blend_ps(overflow, result, _mm512_set1_ps(__builtin_inff()));
  return _mm512_mask_blend_ps(nan, result, x_in);
}

// The low and high 8 lanes.
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) inline __m256 Low8(__m512 v) {
  return _mm512_castps512_ps256(v);
}
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) inline __m256 High8(__m512 v) {
  return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

// simd::ExpAndSum (simd_avx2.h) with 16 lanes of Exp a step, to the bit: the total keeps
// 8 lanes, fed the low then the high half of each 16, so every lane adds the same values in
// the same order as the AVX2 loop (its 8 at a time, then a masked tail of +0 lanes); a 16-lane
// sum would reassociate the total and change the softmax's bits.
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) inline float ExpAndSum16(
    float* s, int64_t entries, float max_score) {
  const __m512 max_v = _mm512_set1_ps(max_score);
  __m256 total = _mm256_setzero_ps();
  int64_t e = 0;
  for (; e + 16 <= entries; e += 16) {
    const __m512 x = Exp(_mm512_sub_ps(_mm512_loadu_ps(s + e), max_v));
    _mm512_storeu_ps(s + e, x);
    total = _mm256_add_ps(total, Low8(x));
    total = _mm256_add_ps(total, High8(x));
  }
  if (e < entries) {
    const __mmask16 mask = TailMask16(entries - e);
    const __m512 x =
        _mm512_maskz_mov_ps(mask, Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, s + e), max_v)));
    _mm512_mask_storeu_ps(s + e, mask, x);
    total = _mm256_add_ps(total, Low8(x));
    if (entries - e > 8) total = _mm256_add_ps(total, High8(x));
  }
  return HorizontalSum(total);
}

// HorizontalSum (simd_avx2.h) of each half of a and of b, to the bit: lanes 0, 1, 2, 3 of the
// result are the sums of a's lanes 0-7, a's 8-15, b's 0-7, b's 8-15 (HorizontalSum's tree,
// four at once, in 128-bit quarters).
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) inline __m128 HorizontalSums4(
    __m512 a, __m512 b) {
  // Quarters [a0, a2, b0, b2] + [a1, a3, b1, b3]: each half's low 4 lanes plus its high 4.
  const __m512 low = _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0));
  const __m512 high = _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1));
  __m512 sum = _mm512_add_ps(low, high);
  // In each quarter: lanes 0, 1 += lanes 2, 3 (movehl), then lane 0 += lane 1 (movehdup).
  sum = _mm512_add_ps(
      sum, _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(sum), _mm512_castps_pd(sum))));
  sum = _mm512_add_ps(sum, _mm512_movehdup_ps(sum));
  const __m512i firsts = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(firsts, sum));
}

}  // namespace simd
}  // namespace lgpt

#pragma GCC diagnostic pop

#endif  // LGPT_SIMD_AVX2

#endif  // LGPT_CORE_OPS_SIMD_AVX512_H_
