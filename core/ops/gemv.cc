// GCC 12's AVX-512 intrinsic headers start vectors from _mm512_undefined_*(), which its own
// -Wuninitialized flags inside every caller (GCC bug 105593); the warnings are about the
// header, not this code (the same in block_quant.cc).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "core/ops/gemv.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "core/base/row_pool.h"
#include "core/ops/simd_avx2.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LGPT_GEMV_X86 1
#endif

namespace lgpt {
namespace {

// Portable loop: 8 partial sums per product keep the compiler's vectoriser (SSE2) busy
// without -ffast-math.
void GemvPortable(const float* w, const float* bias, const float* x, float* y, int64_t rows,
                  int64_t n_out, int64_t k, int64_t begin, int64_t end) {
  for (int64_t n = begin; n < end; ++n) {
    const float* wn = w + n * k;
    for (int64_t m = 0; m < rows; ++m) {
      const float* xm = x + m * k;
      float partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t i = 0;
      for (; i + 8 <= k; i += 8) {
        for (int j = 0; j < 8; ++j) partial[j] += wn[i + j] * xm[i + j];
      }
      for (; i < k; ++i) partial[i & 7] += wn[i] * xm[i];
      float sum = ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
                  ((partial[4] + partial[5]) + (partial[6] + partial[7]));
      if (bias != nullptr) sum += bias[n];
      y[m * n_out + n] = sum;
    }
  }
}

#ifdef LGPT_GEMV_X86

#define LGPT_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) inline

// Eight floats at p: all of them, or those `mask` selects (a row's tail; the rest read 0).
template <bool kMasked>
LGPT_AVX2_INLINE __m256 LoadAvx2(const float* p, __m256i mask) {
  if constexpr (kMasked) return _mm256_maskload_ps(p, mask);
  return _mm256_loadu_ps(p);
}

// One step of 8 elements from i: acc[r][m] += w[r] * x[m] lane by lane. Up to four x rows are
// held while the R weight vectors stream past them; with more (12 accumulators) the held x
// rows would spill, so the weights are held and the x rows stream. Either way every
// accumulator gets the same FMA.
template <int M, int R, bool kMasked>
LGPT_AVX2_INLINE void FmaStepAvx2(const float* wn, const float* x, int64_t k, int64_t i,
                                  __m256i mask, __m256 (&acc)[R][M]) {
  if constexpr (M <= 4) {
    __m256 xv[M];
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) xv[m] = LoadAvx2<kMasked>(x + m * k + i, mask);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 wv = LoadAvx2<kMasked>(wn + r * k + i, mask);
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m) acc[r][m] = _mm256_fmadd_ps(wv, xv[m], acc[r][m]);
    }
  } else {
    __m256 wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wv[r] = LoadAvx2<kMasked>(wn + r * k + i, mask);
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
      const __m256 xv = LoadAvx2<kMasked>(x + m * k + i, mask);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][m] = _mm256_fmadd_ps(wv[r], xv, acc[r][m]);
    }
  }
}

// R weight rows at once against M rows of x: R * M accumulators, each summing its products
// lane by lane in order of k, then across its lanes: the same bits whatever M and R.
template <int M, int R>
__attribute__((target("avx2,fma"))) void GemvBlockAvx2(const float* w, const float* bias,
                                                       const float* x, float* y, int64_t n_out,
                                                       int64_t k, int64_t n) {
  __m256 acc[R][M];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) acc[r][m] = _mm256_setzero_ps();
  }
  const float* wn = w + n * k;
  const int64_t k8 = k & ~int64_t{7};
  const __m256i all = _mm256_set1_epi32(-1);
  for (int64_t i = 0; i < k8; i += 8) FmaStepAvx2<M, R, false>(wn, x, k, i, all, acc);
  if (k8 < k) FmaStepAvx2<M, R, true>(wn, x, k, k8, simd::TailMask(k - k8), acc);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const float b = bias != nullptr ? bias[n + r] : 0.0f;
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) y[m * n_out + n + r] = simd::HorizontalSum(acc[r][m]) + b;
  }
}

template <int M>
void GemvRangeAvx2(const float* w, const float* bias, const float* x, float* y, int64_t n_out,
                   int64_t k, int64_t begin, int64_t end) {
  // Four weight rows at a time for one x row; two for more (R * M <= 12 accumulators).
  constexpr int R = M == 1 ? 4 : 2;
  int64_t n = begin;
  for (; n + R <= end; n += R) GemvBlockAvx2<M, R>(w, bias, x, y, n_out, k, n);
  for (; n < end; ++n) GemvBlockAvx2<M, 1>(w, bias, x, y, n_out, k, n);
}

// Rows of x per group of the many-rows path: 6 x rows against 2 weight rows is 12
// accumulators, the most AVX2's 16 registers hold beside the operands.
constexpr int64_t kAvx2GroupRows = 6;

// Up to kAvx2GroupRows rows of x.
void GemvGroupAvx2(const float* w, const float* bias, const float* x, float* y, int64_t rows,
                   int64_t n_out, int64_t k, int64_t begin, int64_t end) {
  switch (rows) {
    case 1:
      return GemvRangeAvx2<1>(w, bias, x, y, n_out, k, begin, end);
    case 2:
      return GemvRangeAvx2<2>(w, bias, x, y, n_out, k, begin, end);
    case 3:
      return GemvRangeAvx2<3>(w, bias, x, y, n_out, k, begin, end);
    case 4:
      return GemvRangeAvx2<4>(w, bias, x, y, n_out, k, begin, end);
    case 5:
      return GemvRangeAvx2<5>(w, bias, x, y, n_out, k, begin, end);
    default:
      return GemvRangeAvx2<6>(w, bias, x, y, n_out, k, begin, end);
  }
}

// More rows of x than one group: a band of weight rows (~128 KiB, in L2 after the first group)
// passes every group of x rows (in L1 while the band streams past it). Each weight byte comes
// from memory once; a group's x is read once per band, not once per pair of weight rows (16
// rows of x at k = 768 are 48 KiB: re-read from L2 per pair, the L2's bandwidth bound the FMAs).
// Every dot product is summed in the same order as with one row, so a row's result does not
// depend on the batch.
void GemvManyRowsAvx2(const float* w, const float* bias, const float* x, float* y, int64_t rows,
                      int64_t n_out, int64_t k, int64_t begin, int64_t end) {
  const int64_t band = std::max<int64_t>(2, ((int64_t{128} << 10) / (4 * k)) & ~int64_t{1});
  for (int64_t n = begin; n < end; n += band) {
    const int64_t stop = std::min(n + band, end);
    for (int64_t m = 0; m < rows; m += kAvx2GroupRows) {
      GemvGroupAvx2(w, bias, x + m * k, y + m * n_out, std::min(kAvx2GroupRows, rows - m), n_out, k,
                    n, stop);
    }
  }
}

void GemvAvx2(const float* w, const float* bias, const float* x, float* y, int64_t rows,
              int64_t n_out, int64_t k, int64_t begin, int64_t end) {
  if (rows > kAvx2GroupRows) return GemvManyRowsAvx2(w, bias, x, y, rows, n_out, k, begin, end);
  GemvGroupAvx2(w, bias, x, y, rows, n_out, k, begin, end);
}

// AVX-512 for two or more rows of x, bit for bit the AVX2 kernel's results. Each zmm
// accumulator holds the 8-lane AVX2 accumulators of two x rows for one weight row (lanes 0-7
// row 2p, 8-15 row 2p+1), fed by the weight row's 8 floats broadcast to both halves: every lane
// gets the FMAs of GemvBlockAvx2 in the same order, at twice the width and with 32 registers
// for a larger block (why: at 16 rows a step the AVX2 kernel is bound by FMA throughput).

// x rows in the layout the kernel loads: chunk c (8 floats of k, the last zero-padded) of pair
// p (rows 2p and 2p+1, an odd last row paired with zeros) at packed[(c * pairs + p) * 16].
void PackRowPairs(const float* x, int64_t rows, int64_t k, float* packed) {
  // Row by row (x read in order), 8 floats a copy: the calling thread packs before the fork,
  // so this runs serially (a 256-row prefill chunk packs megabytes per product).
  const int64_t pairs = (rows + 1) / 2, chunks = (k + 7) / 8, full = k / 8;
  const int64_t stride = pairs * 16;  // floats from one chunk of a pair to the next
  for (int64_t m = 0; m < 2 * pairs; ++m) {
    float* dst = packed + (m / 2) * 16 + (m % 2) * 8;  // chunk 0 of row m
    if (m >= rows) {                                   // an odd last row's partner
      for (int64_t c = 0; c < chunks; ++c) std::fill_n(dst + c * stride, 8, 0.0f);
      continue;
    }
    const float* src = x + m * k;
    for (int64_t c = 0; c < full; ++c)
      std::memcpy(dst + c * stride, src + c * 8, 8 * sizeof(float));
    if (full < chunks) {
      float* tail = dst + full * stride;
      const int64_t left = k - full * 8;
      std::copy_n(src + full * 8, left, tail);
      std::fill_n(tail + left, 8 - left, 0.0f);
    }
  }
}

// Weight rows n..n+C-1 against row pairs p0..p0+P-1: C * P accumulators, per 8 floats of k
// C weight loads and P x loads for C * P FMAs of 16 lanes.
template <int P, int C>
__attribute__((target("avx512f,avx512dq,avx2,fma"))) void GemvBlockAvx512(
    const float* w, const float* bias, const float* packed, int64_t pairs, int64_t rows, float* y,
    int64_t n_out, int64_t k, int64_t n, int64_t p0) {
  __m512 acc[C][P];
#pragma GCC unroll 8
  for (int r = 0; r < C; ++r) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  }
  const float* wn = w + n * k;
  const float* xc = packed + p0 * 16;  // chunk 0 of pair p0
  const int64_t k8 = k & ~int64_t{7};
  // The next block's C rows (contiguous after these) are prefetched at the rate these are read:
  // a row of 1024 floats is one page, too short for the hardware prefetcher to ramp up on.
  // The block after next is prefetched into L2 as well: with several groups of row pairs
  // only the first pass over a block reads memory, and a single block of lead leaves memory
  // idle during the others (GemvFromMemory at 16 rows: ~30% faster with it).
  const char* next = reinterpret_cast<const char*>(wn + C * k);
  const char* after_next = reinterpret_cast<const char*>(wn + 2 * C * k);
  for (int64_t i = 0; i < k8; i += 8, xc += pairs * 16, next += C * 32, after_next += C * 32) {
#pragma GCC unroll 8
    for (int line = 0; line < C * 32; line += 64) {
      _mm_prefetch(next + line, _MM_HINT_T0);
      _mm_prefetch(after_next + line, _MM_HINT_T1);
    }
    __m512 xv[P];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) xv[p] = _mm512_loadu_ps(xc + p * 16);
#pragma GCC unroll 8
    for (int r = 0; r < C; ++r) {
      const __m512 wv = _mm512_broadcast_f32x8(_mm256_loadu_ps(wn + r * k + i));
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(wv, xv[p], acc[r][p]);
    }
  }
  if (k8 < k) {  // the AVX2 kernel's masked tail: zeros beyond k in x and w
    const __m256i mask = simd::TailMask(k - k8);
    __m512 xv[P];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) xv[p] = _mm512_loadu_ps(xc + p * 16);
#pragma GCC unroll 8
    for (int r = 0; r < C; ++r) {
      const __m512 wv = _mm512_broadcast_f32x8(_mm256_maskload_ps(wn + r * k + k8, mask));
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(wv, xv[p], acc[r][p]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < C; ++r) {
    const float b = bias != nullptr ? bias[n + r] : 0.0f;
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const int64_t m = 2 * (p0 + p);
      y[m * n_out + n + r] = simd::HorizontalSum(_mm512_castps512_ps256(acc[r][p])) + b;
      if (m + 1 < rows) {
        y[(m + 1) * n_out + n + r] = simd::HorizontalSum(_mm512_extractf32x8_ps(acc[r][p], 1)) + b;
      }
    }
  }
}

// Weight rows per block and row pairs per block: 6 x 4 = 24 accumulators, 4 x vectors and
// a weight vector of the 32 registers.
constexpr int64_t kAvx512BlockRows = 6;
constexpr int64_t kAvx512BlockPairs = 4;

template <int P>
void GemvPairsAvx512(const float* w, const float* bias, const float* packed, int64_t pairs,
                     int64_t rows, float* y, int64_t n_out, int64_t k, int64_t n, int64_t c,
                     int64_t p0) {
  static_assert(kAvx512BlockRows == 6, "the switch covers 1..kAvx512BlockRows");
  switch (c) {
    case 1:
      return GemvBlockAvx512<P, 1>(w, bias, packed, pairs, rows, y, n_out, k, n, p0);
    case 2:
      return GemvBlockAvx512<P, 2>(w, bias, packed, pairs, rows, y, n_out, k, n, p0);
    case 3:
      return GemvBlockAvx512<P, 3>(w, bias, packed, pairs, rows, y, n_out, k, n, p0);
    case 4:
      return GemvBlockAvx512<P, 4>(w, bias, packed, pairs, rows, y, n_out, k, n, p0);
    case 5:
      return GemvBlockAvx512<P, 5>(w, bias, packed, pairs, rows, y, n_out, k, n, p0);
    default:
      return GemvBlockAvx512<P, 6>(w, bias, packed, pairs, rows, y, n_out, k, n, p0);
  }
}

// Weight rows [begin, end) against all rows of x (packed by PackRowPairs): for each block of
// weight rows (in L1 after the first group), every group of up to four row pairs.
void GemvAvx512(const float* w, const float* bias, const float* packed, int64_t rows, float* y,
                int64_t n_out, int64_t k, int64_t begin, int64_t end) {
  const int64_t pairs = (rows + 1) / 2;
  for (int64_t n = begin; n < end; n += kAvx512BlockRows) {
    const int64_t c = std::min(kAvx512BlockRows, end - n);
    for (int64_t p0 = 0; p0 < pairs; p0 += kAvx512BlockPairs) {
      switch (std::min(kAvx512BlockPairs, pairs - p0)) {
        case 1:
          GemvPairsAvx512<1>(w, bias, packed, pairs, rows, y, n_out, k, n, c, p0);
          break;
        case 2:
          GemvPairsAvx512<2>(w, bias, packed, pairs, rows, y, n_out, k, n, c, p0);
          break;
        case 3:
          GemvPairsAvx512<3>(w, bias, packed, pairs, rows, y, n_out, k, n, c, p0);
          break;
        default:
          GemvPairsAvx512<4>(w, bias, packed, pairs, rows, y, n_out, k, n, c, p0);
      }
    }
  }
}

// PackRowPairs into a buffer reused by the calling thread (decoding calls this per projection).
const float* PackedRows(const float* x, int64_t rows, int64_t k) {
  thread_local std::vector<float> buffer;
  const size_t size = static_cast<size_t>((rows + 1) / 2 * ((k + 7) / 8) * 16);
  if (buffer.size() < size) buffer.resize(size);
  PackRowPairs(x, rows, k, buffer.data());
  return buffer.data();
}

// Rows of x per tile of GemvSlicesAvx512: the packed tile stays in L3 (1-3 MiB at k = 1024-2816)
// while every band of weights streams it. A 2048-row tile streamed 8-23 MiB from memory per
// band (gemv_benchmark, 2048 x 1024 x 2816: 55 GFLOP/s against 130-180 at 256 rows).
constexpr int64_t kGemvTileRows = 256;
static_assert(kGemvTileRows % kGemvMaxRows == 0, "tiles are whole slices");

// A tile of at most kGemvTileRows rows of a prefill chunk: x in slices of kGemvMaxRows rows
// (each packed once), one fork; each thread takes bands of weight rows small enough to stay in
// L2 and runs every slice over a band before the next, so a weight byte comes from memory or
// L3 once per tile rather than once per slice. Every row's sums are those of GemvAvx512 on its
// slice: the bits do not depend on the number of rows.
void GemvTileAvx512(const float* w, const float* bias, const float* x, float* y, int64_t rows,
                    int64_t n_out, int64_t k, int64_t min_rows) {
  const int64_t slices = (rows + kGemvMaxRows - 1) / kGemvMaxRows;
  const int64_t slice_floats = kGemvMaxRows / 2 * ((k + 7) / 8) * 16;
  thread_local std::vector<float> buffer;
  if (buffer.size() < static_cast<size_t>(slices * slice_floats)) {
    buffer.resize(static_cast<size_t>(slices * slice_floats));
  }
  for (int64_t s = 0; s < slices; ++s) {
    PackRowPairs(x + s * kGemvMaxRows * k, std::min(kGemvMaxRows, rows - s * kGemvMaxRows), k,
                 buffer.data() + s * slice_floats);
  }
  const float* packed = buffer.data();
  // Weight rows of a band: about 256 KiB of them, whole blocks. Every band streams all slices
  // of x again, so a band of one block at large k (128 KiB at k = 2816) read 2.9 MiB of x from
  // L3 per 66 KiB of weights; 256 KiB beside a 32-row slice of x still fits a 1 MiB L2
  // (gemv_benchmark, 256 x 1024 x 2816: 147-156 -> 162-170 GFLOP/s).
  const int64_t band =
      std::max<int64_t>(1, (int64_t{256} << 10) / (4 * k * kAvx512BlockRows)) * kAvx512BlockRows;
  ParallelForRows(n_out, 4 * kAvx512BlockRows, min_rows, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; b += band) {
      const int64_t stop = std::min(b + band, end);
      for (int64_t s = 0; s < slices; ++s) {
        const int64_t m = s * kGemvMaxRows;
        GemvAvx512(w, bias, packed + s * slice_floats, std::min(kGemvMaxRows, rows - m),
                   y + m * n_out, n_out, k, b, stop);
      }
    }
  });
}

// Prefill chunks: tile by tile (the weights are read once per tile of kGemvTileRows rows).
void GemvSlicesAvx512(const float* w, const float* bias, const float* x, float* y, int64_t rows,
                      int64_t n_out, int64_t k, int64_t min_rows) {
  for (int64_t m = 0; m < rows; m += kGemvTileRows) {
    GemvTileAvx512(w, bias, x + m * k, y + m * n_out, std::min(kGemvTileRows, rows - m), n_out, k,
                   min_rows);
  }
}

#endif  // LGPT_GEMV_X86

// Rows up to which GemvApplies with the AVX-512 kernel (in slices of kGemvMaxRows).
constexpr int64_t kGemvMaxRowsAvx512 = 4096;

bool RequiresGrad(const at::Tensor& t) { return t.defined() && t.requires_grad(); }

}  // namespace

bool CpuHasAvx2Fma() {
#ifdef LGPT_GEMV_X86
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

bool CpuHasF16c() {
#ifdef LGPT_GEMV_X86
  static const bool has = __builtin_cpu_supports("f16c");
  return has;
#else
  return false;
#endif
}

bool CpuHasAvx512() {
#ifdef LGPT_GEMV_X86
  // libgcc's checks include the OS's support (XCR0) for the AVX-512 register state.
  static const bool has = CpuHasAvx2Fma() && __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return has;
#else
  return false;
#endif
}

void ParallelForRows(int64_t n, int64_t align, int64_t min_rows_per_thread,
                     const std::function<void(int64_t, int64_t)>& fn) {
  const int threads = at::get_num_threads();
  const int64_t blocks = (n + align - 1) / align;
  const int64_t min_blocks = std::max<int64_t>(1, min_rows_per_thread / align);
  if (threads <= 1 || blocks < 2 * min_blocks) return fn(0, n);
  // About 8 chunks per thread: small enough to rebalance, large enough to stream.
  const int64_t per_chunk = std::max(min_blocks, blocks / (8 * threads));
  const int64_t chunks = (blocks + per_chunk - 1) / per_chunk;
  RowPool::Get().Run(threads, chunks, [&](int64_t c) {
    const int64_t begin = c * per_chunk * align;
    fn(begin, std::min(begin + per_chunk * align, n));
  });
}

GemvKernel BestGemvKernel() {
#ifdef LGPT_GEMV_X86
  static const GemvKernel best =
      !CpuHasAvx2Fma() ? GemvKernel::kPortable
      : __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")
          ? GemvKernel::kAvx512
          : GemvKernel::kAvx2;
  return best;
#else
  return GemvKernel::kPortable;
#endif
}

void GemvF32(const float* w, const float* bias, const float* x, float* y, int64_t rows,
             int64_t n_out, int64_t k, GemvKernel kernel) {
  // Below ~64 KiB of weights per thread the fork costs more than it saves.
  const int64_t min_rows = std::max<int64_t>(16, (int64_t{16} << 10) / std::max<int64_t>(k, 1));
#ifdef LGPT_GEMV_X86
  // One row is bound by memory bandwidth, which the AVX2 kernel already reaches.
  if (kernel == GemvKernel::kAvx512 && rows > kGemvMaxRows) {
    return GemvSlicesAvx512(w, bias, x, y, rows, n_out, k, min_rows);
  }
  if (kernel == GemvKernel::kAvx512 && rows >= 2) {
    const float* packed = PackedRows(x, rows, k);
    // Chunks of whole blocks (24 = 4 blocks of 6), so only the last chunk has a partial one.
    return ParallelForRows(n_out, 4 * kAvx512BlockRows, min_rows, [&](int64_t begin, int64_t end) {
      GemvAvx512(w, bias, packed, rows, y, n_out, k, begin, end);
    });
  }
#endif
  ParallelForRows(n_out, 8, min_rows, [&](int64_t begin, int64_t end) {
#ifdef LGPT_GEMV_X86
    if (kernel != GemvKernel::kPortable) return GemvAvx2(w, bias, x, y, rows, n_out, k, begin, end);
#endif
    GemvPortable(w, bias, x, y, rows, n_out, k, begin, end);
  });
}

void GemvF32(const float* w, const float* bias, const float* x, float* y, int64_t rows,
             int64_t n_out, int64_t k, bool use_avx2) {
  GemvF32(w, bias, x, y, rows, n_out, k, use_avx2 ? BestGemvKernel() : GemvKernel::kPortable);
}

void GemvF32Serial(const float* w, const float* bias, const float* x, float* y, int64_t rows,
                   int64_t n_out, int64_t k) {
#ifdef LGPT_GEMV_X86
  const GemvKernel kernel = BestGemvKernel();
  if (kernel == GemvKernel::kAvx512 && rows >= 2) {
    return GemvAvx512(w, bias, PackedRows(x, rows, k), rows, y, n_out, k, 0, n_out);
  }
  if (kernel != GemvKernel::kPortable) return GemvAvx2(w, bias, x, y, rows, n_out, k, 0, n_out);
#endif
  GemvPortable(w, bias, x, y, rows, n_out, k, 0, n_out);
}

bool GemvApplies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!x.defined() || !weight.defined() || x.dim() < 1 || weight.dim() != 2) return false;
  if (!x.device().is_cpu() || !weight.device().is_cpu()) return false;
  if (x.scalar_type() != at::kFloat || weight.scalar_type() != at::kFloat) return false;
  if (x.size(-1) != weight.size(1) || !weight.is_contiguous()) return false;
  if (bias.defined() && (bias.scalar_type() != at::kFloat || !bias.device().is_cpu() ||
                         bias.dim() != 1 || bias.size(0) != weight.size(0))) {
    return false;
  }
  // With AVX-512 the kernel also beats BLAS's GEMM (Debian's OpenBLAS picks its AVX2 kernels on
  // Zen 4) on prefill chunks.
  const int64_t max_rows =
      BestGemvKernel() == GemvKernel::kAvx512 ? kGemvMaxRowsAvx512 : kGemvMaxRows;
  if (x.numel() == 0 || x.numel() / x.size(-1) > max_rows) return false;
  if (c10::GradMode::is_enabled() &&
      (RequiresGrad(x) || RequiresGrad(weight) || RequiresGrad(bias))) {
    return false;
  }
  return true;
}

at::Tensor GemvLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const int64_t k = weight.size(1), n_out = weight.size(0);
  const at::Tensor xc = x.contiguous();
  const int64_t rows = xc.numel() / k;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = n_out;
  at::Tensor y = at::empty(shape, x.options());
  const at::Tensor b = bias.defined() ? bias.contiguous() : bias;
  GemvF32(weight.data_ptr<float>(), b.defined() ? b.data_ptr<float>() : nullptr,
          xc.data_ptr<float>(), y.data_ptr<float>(), rows, n_out, k);
  return y;
}

}  // namespace lgpt
