#include "core/ops/quantize.h"

#include <algorithm>
#include <memory>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/GradMode.h>

#include "absl/strings/str_cat.h"
#include "core/ops/gemv.h"
#include "core/ops/simd_avx2.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LGPT_QUANTIZE_X86 1
#endif

namespace lgpt {
namespace {

// Portable loop, in the same order as the AVX2 kernel up to the 8-lane split.
void Int8GemvPortable(const int8_t* w, const float* scales, int64_t group, int64_t groups,
                      const float* bias, const float* x, float* y, int64_t rows, int64_t n_out,
                      int64_t k, int64_t begin, int64_t end) {
  for (int64_t n = begin; n < end; ++n) {
    const int8_t* wn = w + n * k;
    for (int64_t m = 0; m < rows; ++m) {
      const float* xm = x + m * k;
      float sum = 0;
      for (int64_t g = 0; g < groups; ++g) {
        float partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t i = g * group; i < (g + 1) * group; ++i) {
          partial[i & 7] += static_cast<float>(wn[i]) * xm[i];
        }
        const float group_sum = ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
                                ((partial[4] + partial[5]) + (partial[6] + partial[7]));
        sum += group_sum * scales[n * groups + g];
      }
      if (bias != nullptr) sum += bias[n];
      y[m * n_out + n] = sum;
    }
  }
}

#ifdef LGPT_QUANTIZE_X86

__attribute__((target("avx2,fma"))) inline __m256 LoadInt8(const int8_t* p) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}

// R weight rows against M rows of x; per group, a float32 partial sum that its scale then
// multiplies into the row's accumulator. `group` is a multiple of 8 except for per-channel
// scales (groups == 1), whose k % 8 tail is added in scalar code.
template <int M, int R>
__attribute__((target("avx2,fma"))) void Int8BlockAvx2(const int8_t* w, const float* scales,
                                                       int64_t group, int64_t groups,
                                                       const float* bias, const float* x, float* y,
                                                       int64_t n_out, int64_t k, int64_t n) {
  __m256 acc[R][M];
  float tail[R][M];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) {
      acc[r][m] = _mm256_setzero_ps();
      tail[r][m] = 0;
    }
  }
  const int8_t* wn = w + n * k;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t start = g * group;
    const int64_t stop8 = start + (group & ~int64_t{7});
    __m256 part[R][M];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m) part[r][m] = _mm256_setzero_ps();
    }
    for (int64_t i = start; i < stop8; i += 8) {
      __m256 xv[M];
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m) xv[m] = _mm256_loadu_ps(x + m * k + i);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256 wv = LoadInt8(wn + r * k + i);
#pragma GCC unroll 4
        for (int m = 0; m < M; ++m) part[r][m] = _mm256_fmadd_ps(wv, xv[m], part[r][m]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const float s = scales[(n + r) * groups + g];
      const __m256 sv = _mm256_set1_ps(s);
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m) {
        acc[r][m] = _mm256_fmadd_ps(part[r][m], sv, acc[r][m]);
        for (int64_t i = stop8; i < start + group; ++i) {
          tail[r][m] += static_cast<float>(wn[r * k + i]) * x[m * k + i] * s;
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const float b = bias != nullptr ? bias[n + r] : 0.0f;
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) {
      y[m * n_out + n + r] = simd::HorizontalSum(acc[r][m]) + tail[r][m] + b;
    }
  }
}

template <int M>
void Int8RangeAvx2(const int8_t* w, const float* scales, int64_t group, int64_t groups,
                   const float* bias, const float* x, float* y, int64_t n_out, int64_t k,
                   int64_t begin, int64_t end) {
  // At least four independent FMA chains (the FMA latency) with at most 8 accumulators.
  constexpr int R = M == 1 ? 4 : (M == 2 ? 2 : 1);
  int64_t n = begin;
  for (; n + R <= end; n += R) {
    Int8BlockAvx2<M, R>(w, scales, group, groups, bias, x, y, n_out, k, n);
  }
  for (; n < end; ++n) Int8BlockAvx2<M, 1>(w, scales, group, groups, bias, x, y, n_out, k, n);
}

void Int8Avx2(const int8_t* w, const float* scales, int64_t group, int64_t groups,
              const float* bias, const float* x, float* y, int64_t rows, int64_t n_out, int64_t k,
              int64_t begin, int64_t end) {
  if (rows > 4) {
    // Groups of four x rows per pair of weight rows (in L1 after the first group): each
    // weight byte comes from memory once, and a row's sums do not depend on the batch.
    for (int64_t n = begin; n < end; n += 2) {
      const int64_t stop = std::min<int64_t>(n + 2, end);
      for (int64_t m = 0; m < rows; m += 4) {
        Int8Avx2(w, scales, group, groups, bias, x + m * k, y + m * n_out,
                 std::min<int64_t>(4, rows - m), n_out, k, n, stop);
      }
    }
    return;
  }
  switch (rows) {
    case 1:
      return Int8RangeAvx2<1>(w, scales, group, groups, bias, x, y, n_out, k, begin, end);
    case 2:
      return Int8RangeAvx2<2>(w, scales, group, groups, bias, x, y, n_out, k, begin, end);
    case 3:
      return Int8RangeAvx2<3>(w, scales, group, groups, bias, x, y, n_out, k, begin, end);
    default:
      return Int8RangeAvx2<4>(w, scales, group, groups, bias, x, y, n_out, k, begin, end);
  }
}

#endif  // LGPT_QUANTIZE_X86

}  // namespace

Int8Weight QuantizeInt8(const at::Tensor& weight, int64_t group_size) {
  const int64_t n = weight.size(0), k = weight.size(1);
  const int64_t group = group_size > 0 ? group_size : k;
  TORCH_CHECK(k % group == 0, "group size ", group, " does not divide ", k);
  TORCH_CHECK(group == k || group % 8 == 0, "group size ", group, " is not a multiple of 8");
  at::NoGradGuard no_grad;
  const at::Tensor grouped =
      weight.detach().to(at::kCPU, at::kFloat).reshape({n, k / group, group});
  // Symmetric: the largest magnitude of a group maps to 127; an all-zero group gets scale 1.
  at::Tensor scales = grouped.abs().amax(-1) / 127.0f;
  scales = at::where(scales > 0, scales, at::ones_like(scales));
  const at::Tensor values =
      at::round(grouped / scales.unsqueeze(-1)).clamp_(-127, 127).to(at::kChar).reshape({n, k});
  return Int8Weight{values.contiguous(), scales.contiguous(), group};
}

at::Tensor DequantizeInt8(const Int8Weight& weight) {
  const int64_t n = weight.values.size(0), k = weight.values.size(1);
  const at::Tensor grouped =
      weight.values.to(at::kFloat).view({n, k / weight.group_size, weight.group_size});
  return (grouped * weight.scales.unsqueeze(-1)).view({n, k});
}

void Int8Gemv(const Int8Weight& weight, const float* bias, const float* x, float* y, int64_t rows,
              bool use_avx2) {
  const int64_t n_out = weight.values.size(0), k = weight.values.size(1);
  const int64_t group = weight.group_size, groups = k / group;
  const int8_t* w = weight.values.data_ptr<int8_t>();
  const float* scales = weight.scales.data_ptr<float>();
  // Same bytes per thread as the float kernel's threshold: ~64 KiB.
  const int64_t min_rows = std::max<int64_t>(16, (int64_t{64} << 10) / std::max<int64_t>(k, 1));
  ParallelForRows(n_out, 8, min_rows, [&](int64_t begin, int64_t end) {
#ifdef LGPT_QUANTIZE_X86
    if (use_avx2) return Int8Avx2(w, scales, group, groups, bias, x, y, rows, n_out, k, begin, end);
#endif
    Int8GemvPortable(w, scales, group, groups, bias, x, y, rows, n_out, k, begin, end);
  });
}

}  // namespace lgpt
