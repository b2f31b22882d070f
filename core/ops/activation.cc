#include "core/ops/activation.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cstdint>

#include "core/ops/gemv.h"
#include "core/ops/simd_avx2.h"

namespace lgpt {
namespace {

// Elements per thread below which one thread runs the whole product (a fork costs more).
constexpr int64_t kMinElementsPerThread = int64_t{1} << 15;

#ifdef LGPT_SIMD_AVX2
__attribute__((target("avx2,fma"))) inline __m256 SiluMul8(__m256 g, __m256 u) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = simd::Exp(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
}

__attribute__((target("avx2,fma"))) void SiluMulRange(float* gate, const float* up, int64_t begin,
                                                      int64_t end) {
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    _mm256_storeu_ps(gate + i, SiluMul8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  }
  if (i < end) {  // the tail as a whole vector: the same arithmetic as the full ones
    const __m256i mask = simd::TailMask(end - i);
    const __m256 g = _mm256_maskload_ps(gate + i, mask);
    const __m256 u = _mm256_maskload_ps(up + i, mask);
    _mm256_maskstore_ps(gate + i, mask, SiluMul8(g, u));
  }
}
#endif

}  // namespace

bool SiluMulInPlace(at::Tensor& gate, const at::Tensor& up) {
#ifdef LGPT_SIMD_AVX2
  if (!CpuHasAvx2Fma() || !gate.device().is_cpu() || !up.device().is_cpu() ||
      gate.scalar_type() != at::kFloat || up.scalar_type() != at::kFloat ||
      !gate.sizes().equals(up.sizes()) || !gate.is_contiguous() || !up.is_contiguous()) {
    return false;
  }
  if (c10::GradMode::is_enabled() && (gate.requires_grad() || up.requires_grad())) return false;
  float* g = gate.data_ptr<float>();
  const float* u = up.data_ptr<float>();
  const int64_t n = gate.numel();
  // Blocks of 8 elements: a thread's range never splits a vector, though no result would
  // change if it did.
  ParallelForRows(n, 8, kMinElementsPerThread,
                  [&](int64_t begin, int64_t end) { SiluMulRange(g, u, begin, end); });
  return true;
#else
  (void)gate;
  (void)up;
  return false;
#endif
}

}  // namespace lgpt
