// GCC 12's AVX-512 intrinsic headers start vectors from _mm512_undefined_*(), which its own
// -Wuninitialized flags inside every caller (GCC bug 105593); the warnings are about the
// header, not this code (the same in gemv.cc).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "core/ops/decode_attention.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/ops/gemv.h"
#include "core/ops/kv_entry.h"
#include "core/ops/score_row.h"
#include "core/ops/simd_avx2.h"
#include "core/ops/simd_avx512.h"

#ifdef LGPT_SIMD_AVX2
#include "core/ops/kv_dequant_avx2.h"
#endif

namespace lgpt {

bool KVRowsContiguous(const at::Tensor& t) {
  return t.dim() == 4 && t.stride(3) == 1 && t.stride(2) == t.size(3);
}

namespace {

constexpr int64_t kMaxSteps = 4;

using Segments = std::vector<KVSegment>;

// Element i of 16-bit or float32 entries as float32 (exact).
template <KVEntryType T>
inline float Widen(const void* data, int64_t i) {
  if constexpr (T == KVEntryType::kFloat32) {
    return static_cast<const float*>(data)[i];
  } else {
    return KVEntryAt(data, T, i);
  }
}

// out_r = inv_r * sum_e w_r[e] v[e] for each of `rows` weight rows, v the segments' values
// in order (e counts across segments), all of entry type T.
template <KVEntryType T>
void WeightedValuesPortable(const float* const* w, const Segments& v, int64_t rows, int64_t hs,
                            const float* inv, float* const* out, float* acc) {
  for (int64_t r = 0; r < rows; ++r) {
    std::fill(acc, acc + hs, 0.0f);
    int64_t e = 0;
    for (const KVSegment& segment : v) {
      for (int64_t i = 0; i < segment.entries; ++i, ++e) {
        const float we = w[r][e];
        if (we == 0.0f) continue;
        for (int64_t j = 0; j < hs; ++j) acc[j] += we * Widen<T>(segment.values, i * hs + j);
      }
    }
    for (int64_t j = 0; j < hs; ++j) out[r][j] = acc[j] * inv[r];
  }
}

// Asks the cache hierarchy for the bytes [p, p + bytes) ahead of use. A request's entries lie in
// blocks of a few KiB each (a pool block's [entries_per_block, hs] of one group), too short for the
// hardware prefetcher to ramp up on before the next block, elsewhere in memory, begins.
void Prefetch(const void* p, int64_t bytes, bool to_l1) {
#ifdef LGPT_SIMD_AVX2
  const char* begin = static_cast<const char*>(p);
  const char* end = begin + bytes;
  for (const char* line = begin; line < end; line += 64) {
    if (to_l1) {
      _mm_prefetch(line, _MM_HINT_T0);
    } else {
      _mm_prefetch(line, _MM_HINT_T1);
    }
  }
#else
  (void)p, (void)bytes, (void)to_l1;
#endif
}

#ifdef LGPT_SIMD_AVX2

// 8 entries' elements [i, i + 8) of `data` (of type T) as float32: bfloat16 widened by a 16-bit
// shift of the zero-extended words, float16 by F16C; exact.
template <KVEntryType T>
__attribute__((target("avx2,fma,f16c"))) inline __m256 Load8(const void* data, int64_t i) {
  if constexpr (T == KVEntryType::kFloat32) {
    return _mm256_loadu_ps(static_cast<const float*>(data) + i);
  } else {
    const __m128i words =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(data) + i));
    if constexpr (T == KVEntryType::kBFloat16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(words), 16));
    } else {
      return _mm256_cvtph_ps(words);
    }
  }
}

// The first `count` (< 8) of them, the other lanes 0 (as a masked load).
template <KVEntryType T>
__attribute__((target("avx2,fma,f16c"))) inline __m256 Load8Tail(const void* data, int64_t i,
                                                                 int64_t count) {
  if constexpr (T == KVEntryType::kFloat32) {
    return _mm256_maskload_ps(static_cast<const float*>(data) + i, simd::TailMask(count));
  } else {
    uint16_t words[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(words, static_cast<const uint16_t*>(data) + i, count * sizeof(uint16_t));
    return Load8<T>(words, 0);
  }
}

// Scores y[m · n_keys + e] = keys[e] · x[m] of M query rows x [M, hs] against key row e of
// type T: GemvBlockAvx2's sums (8 lanes of FMAs along hs, then the horizontal sum, plus a zero
// bias), so 16-bit keys score exactly as their float32 copies do through GemvF32Serial.
template <KVEntryType T, int M>
__attribute__((target("avx2,fma,f16c"))) void ScoresRowAvx2(const void* keys, const float* x,
                                                            float* y, int64_t n_keys, int64_t hs,
                                                            int64_t e) {
  __m256 acc[M];
#pragma GCC unroll 4
  for (int m = 0; m < M; ++m) acc[m] = _mm256_setzero_ps();
  const int64_t k8 = hs & ~int64_t{7};
  for (int64_t i = 0; i < k8; i += 8) {
    const __m256 wv = Load8<T>(keys, e * hs + i);
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) {
      acc[m] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + m * hs + i), acc[m]);
    }
  }
  if (k8 < hs) {
    const __m256i mask = simd::TailMask(hs - k8);
    const __m256 wv = Load8Tail<T>(keys, e * hs + k8, hs - k8);
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) {
      acc[m] = _mm256_fmadd_ps(wv, _mm256_maskload_ps(x + m * hs + k8, mask), acc[m]);
    }
  }
#pragma GCC unroll 4
  for (int m = 0; m < M; ++m) y[m * n_keys + e] = simd::HorizontalSum(acc[m]) + 0.0f;
}

// The scores kernels' row blocking: score(std::integral_constant<int, M>, x_m, y_m, e) for
// every key e of every block of M <= 4 query rows (x_m = x + m·hs, y_m = y + m·n_keys).
template <typename ScoreKey>
void ForQueryRowsAndKeys(int64_t rows, int64_t n_keys, int64_t hs, const float* x, float* y,
                         const ScoreKey& score) {
  for (int64_t m = 0; m < rows; m += 4) {
    const float* xm = x + m * hs;
    float* ym = y + m * n_keys;
    for (int64_t e = 0; e < n_keys; ++e) {
      switch (std::min<int64_t>(4, rows - m)) {
        case 1:
          score(std::integral_constant<int, 1>(), xm, ym, e);
          break;
        case 2:
          score(std::integral_constant<int, 2>(), xm, ym, e);
          break;
        case 3:
          score(std::integral_constant<int, 3>(), xm, ym, e);
          break;
        default:
          score(std::integral_constant<int, 4>(), xm, ym, e);
      }
    }
  }
}

template <KVEntryType T>
void ScoresAvx2(const void* keys, const float* x, float* y, int64_t rows, int64_t n_keys,
                int64_t hs) {
  ForQueryRowsAndKeys(rows, n_keys, hs, x, y, [&](auto m, const float* xm, float* ym, int64_t e) {
    ScoresRowAvx2<T, decltype(m)::value>(keys, xm, ym, n_keys, hs, e);
  });
}

// R weight rows against V vectors (8·V columns from `col`) of every value row: R·V
// accumulators stay in registers while the entries stream by, so each value row is read
// once for all R queries.
template <KVEntryType T, int R, int V>
__attribute__((target("avx2,fma,f16c"))) void WeightedValuesBlockAvx2(const float* const* w,
                                                                      const Segments& v, int64_t hs,
                                                                      int64_t col, const float* inv,
                                                                      float* const* out) {
  // Loops unrolled in full keep acc and values in registers (GCC otherwise leaves the loop
  // over 8 vectors rolled and the arrays on the stack: a load and a store around each FMA,
  // a third of the speed).
  __m256 acc[R][V];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int j = 0; j < V; ++j) acc[r][j] = _mm256_setzero_ps();
  }
  // The accumulators carry across segments: the sums are those of one contiguous pass.
  int64_t e = 0;
  for (const KVSegment& segment : v) {
    int64_t at = col;  // element of entry i, column col
    for (int64_t i = 0; i < segment.entries; ++i, ++e, at += hs) {
      __m256 values[V];
#pragma GCC unroll 8
      for (int j = 0; j < V; ++j) values[j] = Load8<T>(segment.values, at + 8 * j);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256 we = _mm256_broadcast_ss(w[r] + e);
#pragma GCC unroll 8
        for (int j = 0; j < V; ++j) acc[r][j] = _mm256_fmadd_ps(we, values[j], acc[r][j]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m256 scale = _mm256_set1_ps(inv[r]);
#pragma GCC unroll 8
    for (int j = 0; j < V; ++j) {
      _mm256_storeu_ps(out[r] + col + 8 * j, _mm256_mul_ps(acc[r][j], scale));
    }
  }
}

// The weighted values kernels' blocking (hs a multiple of 8): block(std::integral_constant R,
// std::integral_constant V, r, col) for rows r .. r + R - 1 and columns col .. col + 8·V - 1.
// Up to 4 rows share each pass over the values (16 accumulators would spill: 8 at most);
// columns go in chunks of 8·V, then 8.
template <typename Block>
void ForValueBlocks(int64_t rows, int64_t hs, const Block& block) {
  const auto columns = [&](auto rows_a_pass, auto vectors, int64_t r) {
    constexpr int64_t kWidth = 8 * decltype(vectors)::value;
    int64_t col = 0;
    for (; col + kWidth <= hs; col += kWidth) block(rows_a_pass, vectors, r, col);
    for (; col < hs; col += 8) block(rows_a_pass, std::integral_constant<int, 1>(), r, col);
  };
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    columns(std::integral_constant<int, 4>(), std::integral_constant<int, 2>(), r);
  }
  if (rows - r >= 2) {
    columns(std::integral_constant<int, 2>(), std::integral_constant<int, 4>(), r);
    r += 2;
  }
  if (r < rows) columns(std::integral_constant<int, 1>(), std::integral_constant<int, 8>(), r);
}

template <KVEntryType T>
void WeightedValuesAvx2(const float* const* w, const Segments& v, int64_t rows, int64_t hs,
                        const float* inv, float* const* out) {
  ForValueBlocks(rows, hs, [&](auto rows_a_pass, auto vectors, int64_t r, int64_t col) {
    WeightedValuesBlockAvx2<T, decltype(rows_a_pass)::value, decltype(vectors)::value>(
        w + r, v, hs, col, inv + r, out + r);
  });
}

// Quantised entries read in place: ScoresRowAvx2's and WeightedValuesBlockAvx2's arithmetic
// on the channels simd::LoadQuantised8 dequantises (the values a decoded float32 copy holds),
// so the bits are those of the float32 kernels over that copy. Head sizes are multiples of 8.
template <paged::EntryKind K, int M>
__attribute__((target("avx2,fma,f16c"))) void ScoresRowQuantisedAvx2(const KVSegment& segment,
                                                                     const float* x, float* y,
                                                                     int64_t n_keys, int64_t hs,
                                                                     int64_t e) {
  const paged::EntryFormat& f = *segment.quantised;
  const uint8_t* key = static_cast<const uint8_t*>(segment.keys) + e * paged::EntryBytes(f);
  __m256 acc[M];
#pragma GCC unroll 4
  for (int m = 0; m < M; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t i = 0; i < hs; i += 8) {
    const __m256 wv = simd::LoadQuantised8<K>(key, f, i);
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) {
      acc[m] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + m * hs + i), acc[m]);
    }
  }
#pragma GCC unroll 4
  for (int m = 0; m < M; ++m) y[m * n_keys + e] = simd::HorizontalSum(acc[m]) + 0.0f;
}

template <paged::EntryKind K>
void ScoresQuantisedAvx2(const KVSegment& segment, const float* x, float* y, int64_t rows,
                         int64_t hs) {
  const int64_t n_keys = segment.entries;
  ForQueryRowsAndKeys(rows, n_keys, hs, x, y, [&](auto m, const float* xm, float* ym, int64_t e) {
    ScoresRowQuantisedAvx2<K, decltype(m)::value>(segment, xm, ym, n_keys, hs, e);
  });
}

template <paged::EntryKind K, int R, int V>
__attribute__((target("avx2,fma,f16c"))) void WeightedValuesBlockQuantisedAvx2(
    const float* const* w, const Segments& v, int64_t col, const float* inv, float* const* out) {
  __m256 acc[R][V];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int j = 0; j < V; ++j) acc[r][j] = _mm256_setzero_ps();
  }
  int64_t e = 0;
  for (const KVSegment& segment : v) {
    const paged::EntryFormat& f = *segment.quantised;
    const int64_t entry_bytes = paged::EntryBytes(f);
    const uint8_t* entry = static_cast<const uint8_t*>(segment.values);
    for (int64_t i = 0; i < segment.entries; ++i, ++e, entry += entry_bytes) {
      __m256 values[V];
#pragma GCC unroll 8
      for (int j = 0; j < V; ++j) values[j] = simd::LoadQuantised8<K>(entry, f, col + 8 * j);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256 we = _mm256_broadcast_ss(w[r] + e);
#pragma GCC unroll 8
        for (int j = 0; j < V; ++j) acc[r][j] = _mm256_fmadd_ps(we, values[j], acc[r][j]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m256 scale = _mm256_set1_ps(inv[r]);
#pragma GCC unroll 8
    for (int j = 0; j < V; ++j) {
      _mm256_storeu_ps(out[r] + col + 8 * j, _mm256_mul_ps(acc[r][j], scale));
    }
  }
}

template <paged::EntryKind K>
void WeightedValuesQuantisedAvx2(const float* const* w, const Segments& v, int64_t rows, int64_t hs,
                                 const float* inv, float* const* out) {
  ForValueBlocks(rows, hs, [&](auto rows_a_pass, auto vectors, int64_t r, int64_t col) {
    WeightedValuesBlockQuantisedAvx2<K, decltype(rows_a_pass)::value, decltype(vectors)::value>(
        w + r, v, col, inv + r, out + r);
  });
}

// The AVX-512 kernels: the AVX2 kernels' arithmetic, lane for lane, at twice the width. The
// scores pair two keys in a register (lanes 0-7 and 8-15, each holding ScoresRowAvx2's 8
// partial sums of one key) against the query's 8 floats broadcast to both halves; the
// weighted values take 16 columns a vector (columns are independent sums). Everything is
// summed in the AVX2 order, so the results are the AVX2 path's bits (decode_attention_test
// checks it on every entry type), and 16-bit entries still score as their float32 copies.
// decode_attention_benchmark's batched step on a 2-core Xeon (medians of 3): 16-bit entries
// 1.09-1.24x as fast in cache, 1.02-1.12x from memory; float32 entries, bound by their reads,
// 0.97-1.08x.

// Elements [a, a + 8) and [b, b + 8) of `data` (of type T) as float32, in lanes 0-7 and 8-15.
template <KVEntryType T>
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) inline __m512 LoadPair8(
    const void* data, int64_t a, int64_t b) {
  if constexpr (T == KVEntryType::kFloat32) {
    const float* f = static_cast<const float*>(data);
    return _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(f + a))),
                           _mm256_castps_pd(_mm256_loadu_ps(f + b)), 1));
  } else {
    const uint16_t* words = static_cast<const uint16_t*>(data);
    const __m256i both = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(words + a))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(words + b)), 1);
    if constexpr (T == KVEntryType::kBFloat16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(both), 16));
    } else {
      return _mm512_cvtph_ps(both);
    }
  }
}

// The first `count` (< 8) of each, the other lanes 0: Load8Tail's zeros in both halves.
template <KVEntryType T>
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) inline __m512 LoadPair8Tail(
    const void* data, int64_t a, int64_t b, int64_t count) {
  const __mmask8 mask = static_cast<__mmask8>((1u << count) - 1u);
  if constexpr (T == KVEntryType::kFloat32) {
    const float* f = static_cast<const float*>(data);
    return _mm512_castpd_ps(_mm512_insertf64x4(
        _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_maskz_loadu_ps(mask, f + a))),
        _mm256_castps_pd(_mm256_maskz_loadu_ps(mask, f + b)), 1));
  } else {
    const uint16_t* words = static_cast<const uint16_t*>(data);
    const __m256i both =
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_maskz_loadu_epi16(mask, words + a)),
                                _mm_maskz_loadu_epi16(mask, words + b), 1);
    if constexpr (T == KVEntryType::kBFloat16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(both), 16));
    } else {
      return _mm512_cvtph_ps(both);
    }
  }
}

// 8 floats in both halves.
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) inline __m512 Broadcast8(__m256 v) {
  return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(v)));
}

// 16 elements [i, i + 16) of `data` (of type T) as float32 (Load8's widening, twice as wide).
template <KVEntryType T>
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) inline __m512 Load16(
    const void* data, int64_t i) {
  if constexpr (T == KVEntryType::kFloat32) {
    return _mm512_loadu_ps(static_cast<const float*>(data) + i);
  } else {
    const __m256i words = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(data) + i));
    if constexpr (T == KVEntryType::kBFloat16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(words), 16));
    } else {
      return _mm512_cvtph_ps(words);
    }
  }
}

// ScoresRowAvx2<T, M> for the four keys e .. e + 3: keys e, e + 1 share one accumulator per
// query, keys e + 2, e + 3 another; HorizontalSums4 reduces the four in HorizontalSum's order
// and the scores (plus the zero bias) are stored as one vector per query.
template <KVEntryType T, int M>
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"), always_inline)) inline void
ScoresQuadAvx512(const void* keys, const float* x, float* y, int64_t n_keys, int64_t hs,
                 int64_t e) {
  __m512 acc01[M], acc23[M];
#pragma GCC unroll 4
  for (int m = 0; m < M; ++m) acc01[m] = acc23[m] = _mm512_setzero_ps();
  const int64_t k8 = hs & ~int64_t{7};
  const int64_t row = e * hs;  // element 0 of key e
  for (int64_t i = 0; i < k8; i += 8) {
    const __m512 k01 = LoadPair8<T>(keys, row + i, row + hs + i);
    const __m512 k23 = LoadPair8<T>(keys, row + 2 * hs + i, row + 3 * hs + i);
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) {
      const __m512 xv = Broadcast8(_mm256_loadu_ps(x + m * hs + i));
      acc01[m] = _mm512_fmadd_ps(k01, xv, acc01[m]);
      acc23[m] = _mm512_fmadd_ps(k23, xv, acc23[m]);
    }
  }
  if (k8 < hs) {
    const int64_t count = hs - k8;
    const __mmask8 mask = static_cast<__mmask8>((1u << count) - 1u);
    const __m512 k01 = LoadPair8Tail<T>(keys, row + k8, row + hs + k8, count);
    const __m512 k23 = LoadPair8Tail<T>(keys, row + 2 * hs + k8, row + 3 * hs + k8, count);
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) {
      const __m512 xv = Broadcast8(_mm256_maskz_loadu_ps(mask, x + m * hs + k8));
      acc01[m] = _mm512_fmadd_ps(k01, xv, acc01[m]);
      acc23[m] = _mm512_fmadd_ps(k23, xv, acc23[m]);
    }
  }
#pragma GCC unroll 4
  for (int m = 0; m < M; ++m) {
    const __m128 sums = simd::HorizontalSums4(acc01[m], acc23[m]);
    _mm_storeu_ps(y + m * n_keys + e, _mm_add_ps(sums, _mm_setzero_ps()));
  }
}

// The loop over the keys runs inside the AVX-512 function: a call per 4 keys (saved
// registers, address set-up, a vzeroupper) would add about a third to the 8 iterations of
// 12 instructions a quad takes at head size 64.
template <KVEntryType T, int M>
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) void ScoresRowsAvx512(
    const void* keys, const float* x, float* y, int64_t n_keys, int64_t hs) {
  int64_t e = 0;
  for (; e + 4 <= n_keys; e += 4) ScoresQuadAvx512<T, M>(keys, x, y, n_keys, hs, e);
  // The last 1-3 keys one by one (a paged pool's blocks of 16 have none).
  for (; e < n_keys; ++e) ScoresRowAvx2<T, M>(keys, x, y, n_keys, hs, e);
}

// The AVX-512 scores kernels' row blocking: rows_of(std::integral_constant<int, M>, x_m, y_m)
// for every block of M <= 4 query rows (the loop over the keys runs inside).
template <typename RowsOf>
void ForQueryRowBlocks(int64_t rows, int64_t n_keys, int64_t hs, const float* x, float* y,
                       const RowsOf& rows_of) {
  for (int64_t m = 0; m < rows; m += 4) {
    const float* xm = x + m * hs;
    float* ym = y + m * n_keys;
    switch (std::min<int64_t>(4, rows - m)) {
      case 1:
        rows_of(std::integral_constant<int, 1>(), xm, ym);
        break;
      case 2:
        rows_of(std::integral_constant<int, 2>(), xm, ym);
        break;
      case 3:
        rows_of(std::integral_constant<int, 3>(), xm, ym);
        break;
      default:
        rows_of(std::integral_constant<int, 4>(), xm, ym);
    }
  }
}

// ScoresAvx2's scores, to the bit, for any head size.
template <KVEntryType T>
void ScoresAvx512(const void* keys, const float* x, float* y, int64_t rows, int64_t n_keys,
                  int64_t hs) {
  ForQueryRowBlocks(rows, n_keys, hs, x, y, [&](auto m, const float* xm, float* ym) {
    ScoresRowsAvx512<T, decltype(m)::value>(keys, xm, ym, n_keys, hs);
  });
}

// WeightedValuesBlockAvx2 with 16 columns a vector: R rows against V vectors (16·V columns
// from `col`); each column's sum is the same chain of FMAs in entry order.
template <KVEntryType T, int R, int V>
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) void WeightedValuesBlockAvx512(
    const float* const* w, const Segments& v, int64_t hs, int64_t col, const float* inv,
    float* const* out) {
  __m512 acc[R][V];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int j = 0; j < V; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  int64_t e = 0;
  for (const KVSegment& segment : v) {
    int64_t at = col;  // element of entry i, column col
    for (int64_t i = 0; i < segment.entries; ++i, ++e, at += hs) {
      __m512 values[V];
#pragma GCC unroll 8
      for (int j = 0; j < V; ++j) values[j] = Load16<T>(segment.values, at + 16 * j);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512 we = _mm512_set1_ps(w[r][e]);
#pragma GCC unroll 8
        for (int j = 0; j < V; ++j) acc[r][j] = _mm512_fmadd_ps(we, values[j], acc[r][j]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m512 scale = _mm512_set1_ps(inv[r]);
#pragma GCC unroll 8
    for (int j = 0; j < V; ++j) {
      _mm512_storeu_ps(out[r] + col + 16 * j, _mm512_mul_ps(acc[r][j], scale));
    }
  }
}

// Columns [col, hs) of R rows: blocks of 16·V columns while they fit, then blocks half as
// wide, so each pass over the values covers as many columns as the registers allow (hs 64
// with V = 8: one pass of 4 vectors, not four of 1); the last 8 columns (hs % 16 == 8) with
// the AVX2 block. hs must be a multiple of 8.
template <KVEntryType T, int R, int V>
void WeightedValuesColumnsAvx512(const float* const* w, const Segments& v, int64_t hs, int64_t col,
                                 const float* inv, float* const* out) {
  for (; col + 16 * V <= hs; col += 16 * V) {
    WeightedValuesBlockAvx512<T, R, V>(w, v, hs, col, inv, out);
  }
  if constexpr (V > 1) {
    WeightedValuesColumnsAvx512<T, R, V / 2>(w, v, hs, col, inv, out);
  } else if (col < hs) {
    WeightedValuesBlockAvx2<T, R, 1>(w, v, hs, col, inv, out);
  }
}

// Up to 4 rows share each pass over the values: R·V accumulators plus V values within the
// 32 registers.
template <KVEntryType T>
void WeightedValuesAvx512(const float* const* w, const Segments& v, int64_t rows, int64_t hs,
                          const float* inv, float* const* out) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    WeightedValuesColumnsAvx512<T, 4, 4>(w + r, v, hs, 0, inv + r, out + r);
  }
  if (rows - r >= 2) {
    WeightedValuesColumnsAvx512<T, 2, 8>(w + r, v, hs, 0, inv + r, out + r);
    r += 2;
  }
  if (r < rows) WeightedValuesColumnsAvx512<T, 1, 8>(w + r, v, hs, 0, inv + r, out + r);
}

// Quantised entries read in place, at the AVX-512 width: the AVX2 quantised kernels'
// arithmetic lane for lane (each channel float(code) · scale, one rounding, as
// simd::LoadQuantised8 and paged::DecodeEntry compute it; then the float32 kernels' FMAs in
// their order), so the bits are still those of the float32 kernels over a decoded copy. Head
// sizes and groups are multiples of 8 (QuantisedInPlace), so every 8 channels share a scale.

// Sixteen int4 codes (q + 8) from the low 8 bytes of `packed` (channel 2i in the low nibble of
// byte i, 2i + 1 in the high one), as int32 with the offset removed.
__attribute__((target("avx512f,avx512bw,avx512vl,avx2"))) inline __m512i Int4Codes16(
    __m128i packed) {
  const __m128i nibble = _mm_set1_epi8(0x0f);
  const __m128i low = _mm_and_si128(packed, nibble);
  const __m128i high = _mm_and_si128(_mm_srli_epi16(packed, 4), nibble);
  return _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(low, high)), _mm512_set1_epi32(8));
}

// float(codes) · scales, the scales two float16 bit patterns widened exactly (as _cvtsh_ss),
// `low` across lanes 0-7 and `high` across 8-15.
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c"))) inline __m512 ScaleHalves(
    __m512i codes, uint16_t low, uint16_t high) {
  const __m512 scales = _mm512_cvtph_ps(_mm256_set_m128i(
      _mm_set1_epi16(static_cast<int16_t>(high)), _mm_set1_epi16(static_cast<int16_t>(low))));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(codes), scales);
}

// Channels [d, d + 8) of entries a and b dequantised into lanes 0-7 and 8-15.
template <paged::EntryKind K>
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) inline __m512 LoadQuantisedPair8(
    const uint8_t* a, const uint8_t* b, const paged::EntryFormat& f, int64_t d) {
  const int64_t scale_at = paged::CodeBytes(f) + 2 * (d / f.group_size);
  uint16_t scale_a, scale_b;
  std::memcpy(&scale_a, a + scale_at, 2);
  std::memcpy(&scale_b, b + scale_at, 2);
  __m512i codes;
  if constexpr (K == paged::EntryKind::kInt8) {
    int64_t bytes_a, bytes_b;
    std::memcpy(&bytes_a, a + d, 8);
    std::memcpy(&bytes_b, b + d, 8);
    codes = _mm512_cvtepi8_epi32(_mm_set_epi64x(bytes_b, bytes_a));
  } else {
    int32_t packed_a, packed_b;  // four bytes (8 channels) of each
    std::memcpy(&packed_a, a + d / 2, 4);
    std::memcpy(&packed_b, b + d / 2, 4);
    codes = Int4Codes16(_mm_set_epi32(0, 0, packed_b, packed_a));
  }
  return ScaleHalves(codes, scale_a, scale_b);
}

// Channels [d, d + 16) of one entry (two 8-channel halves, each with its group's scale).
template <paged::EntryKind K>
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) inline __m512 LoadQuantised16(
    const uint8_t* entry, const paged::EntryFormat& f, int64_t d) {
  const uint8_t* scale_bytes = entry + paged::CodeBytes(f);
  uint16_t scale_low, scale_high;
  std::memcpy(&scale_low, scale_bytes + 2 * (d / f.group_size), 2);
  std::memcpy(&scale_high, scale_bytes + 2 * ((d + 8) / f.group_size), 2);
  __m512i codes;
  if constexpr (K == paged::EntryKind::kInt8) {
    codes = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(entry + d)));
  } else {
    codes = Int4Codes16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(entry + d / 2)));
  }
  return ScaleHalves(codes, scale_low, scale_high);
}

// ScoresRowQuantisedAvx2<K, M> for keys e .. e + 3 (ScoresQuadAvx512's pairing and sums).
template <paged::EntryKind K, int M>
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"), always_inline)) inline void
ScoresQuadQuantisedAvx512(const uint8_t* keys, int64_t entry_bytes, const paged::EntryFormat& f,
                          const float* x, float* y, int64_t n_keys, int64_t hs, int64_t e) {
  const uint8_t* k0 = keys + e * entry_bytes;
  __m512 acc01[M], acc23[M];
#pragma GCC unroll 4
  for (int m = 0; m < M; ++m) acc01[m] = acc23[m] = _mm512_setzero_ps();
  for (int64_t i = 0; i < hs; i += 8) {
    const __m512 k01 = LoadQuantisedPair8<K>(k0, k0 + entry_bytes, f, i);
    const __m512 k23 = LoadQuantisedPair8<K>(k0 + 2 * entry_bytes, k0 + 3 * entry_bytes, f, i);
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) {
      const __m512 xv = Broadcast8(_mm256_loadu_ps(x + m * hs + i));
      acc01[m] = _mm512_fmadd_ps(k01, xv, acc01[m]);
      acc23[m] = _mm512_fmadd_ps(k23, xv, acc23[m]);
    }
  }
#pragma GCC unroll 4
  for (int m = 0; m < M; ++m) {
    const __m128 sums = simd::HorizontalSums4(acc01[m], acc23[m]);
    _mm_storeu_ps(y + m * n_keys + e, _mm_add_ps(sums, _mm_setzero_ps()));
  }
}

template <paged::EntryKind K, int M>
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) void ScoresRowsQuantisedAvx512(
    const KVSegment& segment, const float* x, float* y, int64_t hs) {
  const paged::EntryFormat& f = *segment.quantised;
  const uint8_t* keys = static_cast<const uint8_t*>(segment.keys);
  const int64_t n_keys = segment.entries, entry_bytes = paged::EntryBytes(f);
  int64_t e = 0;
  for (; e + 4 <= n_keys; e += 4) {
    ScoresQuadQuantisedAvx512<K, M>(keys, entry_bytes, f, x, y, n_keys, hs, e);
  }
  for (; e < n_keys; ++e) ScoresRowQuantisedAvx2<K, M>(segment, x, y, n_keys, hs, e);
}

// ScoresQuantisedAvx2's scores, to the bit.
template <paged::EntryKind K>
void ScoresQuantisedAvx512(const KVSegment& segment, const float* x, float* y, int64_t rows,
                           int64_t hs) {
  ForQueryRowBlocks(rows, segment.entries, hs, x, y, [&](auto m, const float* xm, float* ym) {
    ScoresRowsQuantisedAvx512<K, decltype(m)::value>(segment, xm, ym, hs);
  });
}

// WeightedValuesBlockQuantisedAvx2 with 16 columns a vector (the same chain of FMAs per column).
template <paged::EntryKind K, int R, int V>
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) void
WeightedValuesBlockQuantisedAvx512(const float* const* w, const Segments& v, int64_t col,
                                   const float* inv, float* const* out) {
  __m512 acc[R][V];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int j = 0; j < V; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  int64_t e = 0;
  for (const KVSegment& segment : v) {
    const paged::EntryFormat& f = *segment.quantised;
    const int64_t entry_bytes = paged::EntryBytes(f);
    const uint8_t* entry = static_cast<const uint8_t*>(segment.values);
    for (int64_t i = 0; i < segment.entries; ++i, ++e, entry += entry_bytes) {
      __m512 values[V];
#pragma GCC unroll 8
      for (int j = 0; j < V; ++j) values[j] = LoadQuantised16<K>(entry, f, col + 16 * j);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512 we = _mm512_set1_ps(w[r][e]);
#pragma GCC unroll 8
        for (int j = 0; j < V; ++j) acc[r][j] = _mm512_fmadd_ps(we, values[j], acc[r][j]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m512 scale = _mm512_set1_ps(inv[r]);
#pragma GCC unroll 8
    for (int j = 0; j < V; ++j) {
      _mm512_storeu_ps(out[r] + col + 16 * j, _mm512_mul_ps(acc[r][j], scale));
    }
  }
}

// WeightedValuesColumnsAvx512's blocking for quantised values (the last 8 columns, where
// hs % 16 == 8, with the AVX2 block).
template <paged::EntryKind K, int R, int V>
void WeightedValuesColumnsQuantisedAvx512(const float* const* w, const Segments& v, int64_t hs,
                                          int64_t col, const float* inv, float* const* out) {
  for (; col + 16 * V <= hs; col += 16 * V) {
    WeightedValuesBlockQuantisedAvx512<K, R, V>(w, v, col, inv, out);
  }
  if constexpr (V > 1) {
    WeightedValuesColumnsQuantisedAvx512<K, R, V / 2>(w, v, hs, col, inv, out);
  } else if (col < hs) {
    WeightedValuesBlockQuantisedAvx2<K, R, 1>(w, v, col, inv, out);
  }
}

template <paged::EntryKind K>
void WeightedValuesQuantisedAvx512(const float* const* w, const Segments& v, int64_t rows,
                                   int64_t hs, const float* inv, float* const* out) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    WeightedValuesColumnsQuantisedAvx512<K, 4, 4>(w + r, v, hs, 0, inv + r, out + r);
  }
  if (rows - r >= 2) {
    WeightedValuesColumnsQuantisedAvx512<K, 2, 8>(w + r, v, hs, 0, inv + r, out + r);
    r += 2;
  }
  if (r < rows) WeightedValuesColumnsQuantisedAvx512<K, 1, 8>(w + r, v, hs, 0, inv + r, out + r);
}

// Whether decoding may take the AVX-512 kernels where the CPU has them (tests and benchmarks
// turn them off to compare against the AVX2 ones).
std::atomic<bool> avx512_allowed{true};

bool UseAvx512() { return CpuHasAvx512() && avx512_allowed.load(std::memory_order_relaxed); }

#endif  // LGPT_SIMD_AVX2

// Whether the quantised kernels read `format`'s entries in place (else they are decoded a
// channel at a time, into a buffer for the scores).
bool QuantisedInPlace(const paged::EntryFormat& format) {
#ifdef LGPT_SIMD_AVX2
  return format.group_size % 8 == 0 && BestGemvKernel() != GemvKernel::kPortable && CpuHasF16c();
#else
  return false;
#endif
}

// SegmentScores for quantised keys: in place, or GemvF32Serial over their decoded copy (the
// same bits).
void QuantisedScores(const KVSegment& segment, const float* x, float* y, int64_t rows, int64_t hs,
                     bool avx512) {
  const paged::EntryFormat& f = *segment.quantised;
#ifdef LGPT_SIMD_AVX2
  if (QuantisedInPlace(f) && avx512) {
    if (f.kind == paged::EntryKind::kInt8) {
      return ScoresQuantisedAvx512<paged::EntryKind::kInt8>(segment, x, y, rows, hs);
    }
    return ScoresQuantisedAvx512<paged::EntryKind::kInt4>(segment, x, y, rows, hs);
  }
  if (QuantisedInPlace(f)) {
    if (f.kind == paged::EntryKind::kInt8) {
      return ScoresQuantisedAvx2<paged::EntryKind::kInt8>(segment, x, y, rows, hs);
    }
    return ScoresQuantisedAvx2<paged::EntryKind::kInt4>(segment, x, y, rows, hs);
  }
#endif
  thread_local std::vector<float> decoded;
  decoded.resize(segment.entries * hs);
  const int64_t entry_bytes = paged::EntryBytes(f);
  for (int64_t e = 0; e < segment.entries; ++e) {
    paged::DecodeEntry(static_cast<const uint8_t*>(segment.keys) + e * entry_bytes, f,
                       decoded.data() + e * hs);
  }
  GemvF32Serial(decoded.data(), nullptr, x, y, rows, segment.entries, hs);
}

// WeightedValuesPortable over quantised values, each channel decoded as it is read.
void QuantisedValuesPortable(const float* const* w, const Segments& v, int64_t rows, int64_t hs,
                             const float* inv, float* const* out, float* acc) {
  std::vector<float> value(hs);
  for (int64_t r = 0; r < rows; ++r) {
    std::fill(acc, acc + hs, 0.0f);
    int64_t e = 0;
    for (const KVSegment& segment : v) {
      const int64_t entry_bytes = paged::EntryBytes(*segment.quantised);
      for (int64_t i = 0; i < segment.entries; ++i, ++e) {
        const float we = w[r][e];
        if (we == 0.0f) continue;
        paged::DecodeEntry(static_cast<const uint8_t*>(segment.values) + i * entry_bytes,
                           *segment.quantised, value.data());
        for (int64_t j = 0; j < hs; ++j) acc[j] += we * value[j];
      }
    }
    for (int64_t j = 0; j < hs; ++j) out[r][j] = acc[j] * inv[r];
  }
}

// Scores y [rows, n_keys] (rows n_keys apart) of query rows x [rows, hs] against a segment's
// keys: GemvF32Serial's sums, the same bits for 16-bit keys as for their float32 copies (the
// AVX2 and AVX-512 kernels read them in place; elsewhere they are widened into a buffer first).
// `avx512`: the AVX-512 kernel, for every entry type (the same bits).
void SegmentScores(const KVSegment& segment, const float* x, float* y, int64_t rows, int64_t hs,
                   bool avx512) {
  const int64_t n_keys = segment.entries;
  if (segment.quantised) return QuantisedScores(segment, x, y, rows, hs, avx512);
#ifdef LGPT_SIMD_AVX2
  if (avx512) {
    switch (segment.type) {
      case KVEntryType::kFloat32:
        return ScoresAvx512<KVEntryType::kFloat32>(segment.keys, x, y, rows, n_keys, hs);
      case KVEntryType::kBFloat16:
        return ScoresAvx512<KVEntryType::kBFloat16>(segment.keys, x, y, rows, n_keys, hs);
      case KVEntryType::kFloat16:
        return ScoresAvx512<KVEntryType::kFloat16>(segment.keys, x, y, rows, n_keys, hs);
    }
  }
#endif
  if (segment.type == KVEntryType::kFloat32) {
    GemvF32Serial(static_cast<const float*>(segment.keys), nullptr, x, y, rows, n_keys, hs);
    return;
  }
#ifdef LGPT_SIMD_AVX2
  if (BestGemvKernel() != GemvKernel::kPortable && CpuHasF16c()) {
    if (segment.type == KVEntryType::kBFloat16) {
      return ScoresAvx2<KVEntryType::kBFloat16>(segment.keys, x, y, rows, n_keys, hs);
    }
    return ScoresAvx2<KVEntryType::kFloat16>(segment.keys, x, y, rows, n_keys, hs);
  }
#endif
  thread_local std::vector<float> widened;
  widened.resize(n_keys * hs);
  KVEntriesToFloat(segment.keys, segment.type, n_keys * hs, widened.data());
  GemvF32Serial(widened.data(), nullptr, x, y, rows, n_keys, hs);
}

// The weighted values of the segments (all of one entry type), AVX-512, AVX2 or portable
// (`avx512` only with `avx2`).
void WeightedValues(const float* const* w, const Segments& v, int64_t rows, int64_t hs,
                    const float* inv, float* const* out, float* acc, bool avx2, bool avx512) {
  if (!v.empty() && v[0].quantised) {
#ifdef LGPT_SIMD_AVX2
    // (In place whenever the float32 copy would take the AVX2 or AVX-512 values: their bits.)
    if (avx512 && QuantisedInPlace(*v[0].quantised)) {
      if (v[0].quantised->kind == paged::EntryKind::kInt8) {
        return WeightedValuesQuantisedAvx512<paged::EntryKind::kInt8>(w, v, rows, hs, inv, out);
      }
      return WeightedValuesQuantisedAvx512<paged::EntryKind::kInt4>(w, v, rows, hs, inv, out);
    }
    if (avx2 && QuantisedInPlace(*v[0].quantised)) {
      if (v[0].quantised->kind == paged::EntryKind::kInt8) {
        return WeightedValuesQuantisedAvx2<paged::EntryKind::kInt8>(w, v, rows, hs, inv, out);
      }
      return WeightedValuesQuantisedAvx2<paged::EntryKind::kInt4>(w, v, rows, hs, inv, out);
    }
    if (avx2) {  // groups not a multiple of 8: the float32 kernels over a decoded copy
      thread_local std::vector<float> decoded;
      int64_t total = 0;
      for (const KVSegment& segment : v) total += segment.entries;
      decoded.resize(total * hs);
      Segments copies;
      float* at = decoded.data();
      for (const KVSegment& segment : v) {
        const int64_t entry_bytes = paged::EntryBytes(*segment.quantised);
        for (int64_t i = 0; i < segment.entries; ++i) {
          paged::DecodeEntry(static_cast<const uint8_t*>(segment.values) + i * entry_bytes,
                             *segment.quantised, at + i * hs);
        }
        copies.push_back({nullptr, at, segment.entries});
        at += segment.entries * hs;
      }
      return WeightedValues(w, copies, rows, hs, inv, out, acc, avx2, avx512);
    }
#endif
    return QuantisedValuesPortable(w, v, rows, hs, inv, out, acc);
  }
  const KVEntryType type = v.empty() ? KVEntryType::kFloat32 : v[0].type;
#ifdef LGPT_SIMD_AVX2
  if (avx512) {
    switch (type) {
      case KVEntryType::kFloat32:
        return WeightedValuesAvx512<KVEntryType::kFloat32>(w, v, rows, hs, inv, out);
      case KVEntryType::kBFloat16:
        return WeightedValuesAvx512<KVEntryType::kBFloat16>(w, v, rows, hs, inv, out);
      case KVEntryType::kFloat16:
        return WeightedValuesAvx512<KVEntryType::kFloat16>(w, v, rows, hs, inv, out);
    }
  }
  if (avx2) {
    switch (type) {
      case KVEntryType::kFloat32:
        return WeightedValuesAvx2<KVEntryType::kFloat32>(w, v, rows, hs, inv, out);
      case KVEntryType::kBFloat16:
        return WeightedValuesAvx2<KVEntryType::kBFloat16>(w, v, rows, hs, inv, out);
      case KVEntryType::kFloat16:
        return WeightedValuesAvx2<KVEntryType::kFloat16>(w, v, rows, hs, inv, out);
    }
  }
#endif
  switch (type) {
    case KVEntryType::kFloat32:
      return WeightedValuesPortable<KVEntryType::kFloat32>(w, v, rows, hs, inv, out, acc);
    case KVEntryType::kBFloat16:
      return WeightedValuesPortable<KVEntryType::kBFloat16>(w, v, rows, hs, inv, out, acc);
    case KVEntryType::kFloat16:
      return WeightedValuesPortable<KVEntryType::kFloat16>(w, v, rows, hs, inv, out, acc);
  }
}

// One query's scores s[0, entries) -> unnormalised softmax weights in place (MaskScores,
// then ExpAndSum against the row maximum). Returns their sum. A row with no allowed key gets
// uniform weights (every score equals the maximum), as masked_fill with that value does.
// `avx512` (only with `avx2`): 16 exponentials a step, the AVX2 sum's bits.
float SoftmaxRow(float* s, int64_t entries, int64_t query_pos, const KeyPositionRun& kp,
                 const AttentionParams& params, bool avx2, bool avx512) {
  const float max_score = MaskScores(s, entries, query_pos, kp, params);
#ifdef LGPT_SIMD_AVX2
  if (avx512) return simd::ExpAndSum16(s, entries, max_score);
#endif
  return ExpAndSum(s, entries, max_score, avx2);
}

}  // namespace

bool SetDecodeAttentionAvx512ForTesting(bool allowed) {
#ifdef LGPT_SIMD_AVX2
  return avx512_allowed.exchange(allowed);
#else
  (void)allowed;
  return false;
#endif
}

bool DecodeAttentionApplies(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                            const at::Tensor& query_positions, const at::Tensor& key_positions) {
  for (const at::Tensor* t : {&q, &keys, &values}) {
    if (!t->device().is_cpu() || t->scalar_type() != at::kFloat || t->dim() != 4) return false;
  }
  if (!query_positions.device().is_cpu() || query_positions.scalar_type() != at::kLong ||
      !KeyPositionRun::Readable(key_positions)) {
    return false;
  }
  if (q.size(2) > kMaxSteps || keys.size(2) < 1) return false;
  if (q.requires_grad() || keys.requires_grad() || values.requires_grad()) return false;
  if (keys.size(1) < 1 || q.size(1) % keys.size(1) != 0) return false;
  return KVRowsContiguous(keys) && KVRowsContiguous(values) && keys.sizes() == values.sizes();
}

namespace {

// Where batch row b's entries are: how many, and their key positions per key group.
struct RowKeys {
  std::function<int64_t(int64_t b)> entries;
  std::function<KeyPositionRun(int64_t b, int64_t g)> positions;
};

// Rows that all have `entries` entries at key_positions [B, 1 or G, entries].
RowKeys SameEntries(int64_t entries, const at::Tensor& key_positions) {
  return {
      [entries](int64_t) { return entries; },
      [&key_positions](int64_t b, int64_t g) { return KeyPositionRun::Of(key_positions, b, g); }};
}

// DecodeAttention over any storage: segments(b, g, &out) lists the entries of (batch row b,
// key group g) in order, row_keys says how many (at most max_entries) and at which positions.
// `weights_out` ([B, n_head, T, max_entries]) needs rows of equal lengths.
at::Tensor DecodeAttentionOver(const at::Tensor& q, int64_t groups, int64_t max_entries,
                               const std::function<void(int64_t, int64_t, Segments*)>& segments,
                               const at::Tensor& query_positions, const RowKeys& row_keys,
                               const AttentionParams& params, bool use_avx2, float* weights_out) {
  const int64_t batch = q.size(0), n_head = q.size(1), steps = q.size(2), hs = q.size(3);
  const int64_t q_per_kv = n_head / groups;
  const int64_t rows = q_per_kv * steps;  // queries of one group
  const at::Tensor qc = q.contiguous();
  const at::Tensor qpos = query_positions.contiguous();
  at::Tensor out = at::empty({batch, n_head, steps, hs}, q.options());
  const float* q_data = qc.data_ptr<float>();
  float* out_data = out.data_ptr<float>();
  const int64_t* qp_data = qpos.data_ptr<int64_t>();
#ifdef LGPT_SIMD_AVX2
  // (The 16-bit value kernels widen float16 with F16C, which every AVX2 CPU has.)
  const bool avx2 = use_avx2 && hs % 8 == 0 && CpuHasF16c();
  // The AVX-512 kernels give the AVX2 path's bits: the scores at any head size (the AVX2 sums
  // are taken at every head size), the softmax and the values where the AVX2 ones run (other
  // head sizes keep the portable loops, whose bits differ).
  const bool avx512_scores = use_avx2 && CpuHasF16c() && UseAvx512();
  const bool avx512 = avx2 && avx512_scores;
#else
  const bool avx2 = false, avx512_scores = false, avx512 = false;
#endif

  // One task per (batch row, key group): its keys and values are read once for all of the
  // group's query heads and steps (up to 4 of them per pass over the values).
  const int64_t per_task = 2 * max_entries * hs;
  const int64_t min_tasks = std::max<int64_t>(1, (int64_t{32} << 10) / per_task);
  ParallelForRows(batch * groups, 1, min_tasks, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(rows * max_entries);
    std::vector<float> part;  // one segment's scores [rows, segment entries]
    std::vector<float> acc(hs);
    std::vector<const float*> weight_rows(rows);
    std::vector<float*> out_rows(rows);
    std::vector<float> inv(rows);
    Segments kv;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / groups, g = task % groups;
      kv.clear();
      segments(b, g, &kv);
      const KeyPositionRun kp = row_keys.positions(b, g);
      const int64_t entries = row_keys.entries(b);
      // The group's queries are contiguous in q: heads g·q_per_kv .. (g+1)·q_per_kv - 1.
      const float* qg = q_data + ((b * n_head + g * q_per_kv) * steps) * hs;
      int64_t column = 0;
      for (size_t i = 0; i < kv.size(); ++i) {
        const KVSegment& segment = kv[i];
        const bool whole = kv.size() == 1;
        // While these scores are summed, into L2: the keys two segments ahead (the first
        // segment also asks for the second), and these values for the weighted sum after the
        // softmax. Into L1 the burst waited on full miss buffers (decode_attention_benchmark
        // Rows/16/192/16: 1.6x against no prefetch, 1.25x against next keys into L1).
        const int64_t row_bytes = segment.quantised ? paged::EntryBytes(*segment.quantised)
                                                    : hs * KVEntryBytes(segment.type);
        if (i == 0 && kv.size() > 1) Prefetch(kv[1].keys, kv[1].entries * row_bytes, false);
        if (i + 2 < kv.size()) Prefetch(kv[i + 2].keys, kv[i + 2].entries * row_bytes, false);
        Prefetch(segment.values, segment.entries * row_bytes, false);
        part.resize(rows * segment.entries);
        float* dst = whole ? scores.data() : part.data();
        for (int64_t r = 0; r < rows; r += kGemvMaxRows) {
          const int64_t n = std::min(kGemvMaxRows, rows - r);
          SegmentScores(segment, qg + r * hs, dst + r * segment.entries, n, hs, avx512_scores);
        }
        if (!whole) {
          for (int64_t r = 0; r < rows; ++r) {
            std::copy(dst + r * segment.entries, dst + (r + 1) * segment.entries,
                      scores.data() + r * entries + column);
          }
        }
        column += segment.entries;
      }
      for (int64_t r = 0; r < rows; ++r) {
        float* s = scores.data() + r * entries;
        const int64_t query_pos = qp_data[b * steps + r % steps];
        inv[r] = 1.0f / SoftmaxRow(s, entries, query_pos, kp, params, avx2, avx512);
        weight_rows[r] = s;
        const int64_t row = (b * n_head + g * q_per_kv) * steps + r;  // of [B, n_head, T]
        out_rows[r] = out_data + row * hs;
        if (weights_out != nullptr) {
          float* w = weights_out + row * entries;
          for (int64_t e = 0; e < entries; ++e) w[e] = s[e] * inv[r];
        }
      }
      WeightedValues(weight_rows.data(), kv, rows, hs, inv.data(), out_rows.data(), acc.data(),
                     avx2, avx512);
    }
  });
  return out;
}

bool PositionsApply(const at::Tensor& query_positions, const at::Tensor& key_positions) {
  return query_positions.device().is_cpu() && query_positions.scalar_type() == at::kLong &&
         KeyPositionRun::Readable(key_positions);
}

}  // namespace

at::Tensor DecodeAttentionSegments(const at::Tensor& q, int64_t groups, int64_t entries,
                                   const KVSegmentsOf& segments_of,
                                   const at::Tensor& query_positions,
                                   const at::Tensor& key_positions, const AttentionParams& params,
                                   bool use_avx2, float* weights_out) {
  return DecodeAttentionOver(q, groups, entries, segments_of, query_positions,
                             SameEntries(entries, key_positions), params, use_avx2, weights_out);
}

at::Tensor DecodeAttention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                           const at::Tensor& query_positions, const at::Tensor& key_positions,
                           const AttentionParams& params, bool use_avx2, float* weights_out) {
  const int64_t entries = keys.size(2);
  const float* k_data = keys.data_ptr<float>();  // [B, G, S, hs]
  const float* v_data = values.data_ptr<float>();
  auto segments = [&](int64_t b, int64_t g, Segments* out) {
    out->push_back({k_data + b * keys.stride(0) + g * keys.stride(1),
                    v_data + b * values.stride(0) + g * values.stride(1), entries});
  };
  return DecodeAttentionOver(q, keys.size(1), entries, segments, query_positions,
                             SameEntries(entries, key_positions), params, use_avx2, weights_out);
}

bool DecodeAttentionBlocksApplies(const at::Tensor& q, const std::vector<at::Tensor>& block_keys,
                                  const std::vector<at::Tensor>& block_values, int64_t entries,
                                  const at::Tensor& query_positions,
                                  const at::Tensor& key_positions) {
  if (!q.device().is_cpu() || q.scalar_type() != at::kFloat || q.dim() != 4 || q.size(0) != 1 ||
      q.size(2) > kMaxSteps || q.requires_grad() || entries < 1 || block_keys.empty() ||
      block_keys.size() != block_values.size() || !PositionsApply(query_positions, key_positions)) {
    return false;
  }
  const at::Tensor& first = block_keys[0];
  if (first.dim() != 3 || first.size(0) < 1 || q.size(1) % first.size(0) != 0 ||
      first.size(2) != q.size(3) ||
      static_cast<int64_t>(block_keys.size()) * first.size(1) < entries) {
    return false;
  }
  if (!KVEntryTypeOf(first.scalar_type())) return false;
  for (size_t i = 0; i < block_keys.size(); ++i) {
    for (const at::Tensor* t : {&block_keys[i], &block_values[i]}) {
      if (!t->device().is_cpu() || t->scalar_type() != first.scalar_type() || !t->is_contiguous() ||
          t->sizes() != first.sizes() || t->requires_grad()) {
        return false;
      }
    }
  }
  return true;
}

KVSegmentsOf BlockSegments(std::vector<at::Tensor> block_keys, std::vector<at::Tensor> block_values,
                           int64_t entries, std::optional<paged::EntryFormat> quantised) {
  return [keys = std::move(block_keys), values = std::move(block_values), entries, quantised](
             int64_t, int64_t g, Segments* out) {
    const int64_t entries_per_block = keys[0].size(1);
    // A block's group g starts g · entries_per_block rows in: rows of hs elements, or of
    // entry_bytes bytes for quantised blocks.
    const KVEntryType type =
        quantised ? KVEntryType::kFloat32 : *KVEntryTypeOf(keys[0].scalar_type());
    const int64_t group_bytes = g * entries_per_block * keys[0].size(2) * keys[0].element_size();
    for (size_t i = 0; i < keys.size(); ++i) {
      const int64_t begin = static_cast<int64_t>(i) * entries_per_block;
      if (begin >= entries) break;
      KVSegment segment{static_cast<const char*>(keys[i].data_ptr()) + group_bytes,
                        static_cast<const char*>(values[i].data_ptr()) + group_bytes,
                        std::min(entries_per_block, entries - begin), type};
      segment.quantised = quantised;
      out->push_back(segment);
    }
  };
}

at::Tensor DecodeAttentionBlocks(const at::Tensor& q, const std::vector<at::Tensor>& block_keys,
                                 const std::vector<at::Tensor>& block_values, int64_t entries,
                                 const at::Tensor& query_positions, const at::Tensor& key_positions,
                                 const AttentionParams& params, bool use_avx2) {
  return DecodeAttentionOver(q, block_keys[0].size(0), entries,
                             BlockSegments(block_keys, block_values, entries), query_positions,
                             SameEntries(entries, key_positions), params, use_avx2,
                             /*weights_out=*/nullptr);
}

bool DecodeAttentionRowsApplies(const at::Tensor& q, int64_t groups,
                                const at::Tensor& query_positions) {
  return q.device().is_cpu() && q.scalar_type() == at::kFloat && q.dim() == 4 &&
         !q.requires_grad() && q.size(2) <= kMaxSteps && groups >= 1 && q.size(1) % groups == 0 &&
         query_positions.device().is_cpu() && query_positions.scalar_type() == at::kLong &&
         query_positions.dim() == 2 && query_positions.size(0) == q.size(0) &&
         query_positions.size(1) == q.size(2);
}

at::Tensor DecodeAttentionRows(const at::Tensor& q, int64_t groups,
                               const std::vector<DecodeRow>& rows,
                               const at::Tensor& query_positions, const AttentionParams& params,
                               bool use_avx2) {
  int64_t max_entries = 1;
  for (const DecodeRow& row : rows) max_entries = std::max(max_entries, row.entries);
  const RowKeys row_keys{
      [&rows](int64_t b) { return rows[b].entries; },
      [&rows](int64_t b, int64_t g) { return KeyPositionRun::Of(rows[b].key_positions, 0, g); }};
  auto segments = [&rows](int64_t b, int64_t g, Segments* out) { rows[b].segments(0, g, out); };
  return DecodeAttentionOver(q, groups, max_entries, segments, query_positions, row_keys, params,
                             use_avx2, /*weights_out=*/nullptr);
}

}  // namespace lgpt
