// GCC 12's AVX-512 intrinsic headers start vectors from _mm512_undefined_*(), which its own
// -Wuninitialized flags inside every caller; the warnings are about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "core/ops/block_quant.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include "absl/strings/str_cat.h"
#include "core/ops/gemv.h"
#include "core/ops/simd_avx2.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LGPT_BLOCK_QUANT_X86 1
#endif

namespace lgpt {
namespace {

constexpr int64_t kHalfBlock = kQuantBlock / 2;
// Blocks whose largest magnitude is below this quantise to zeros (their inverse scale would
// overflow to infinity).
constexpr float kTinyScale = 1e-30f;

// Everything a kernel reads; pointers stay valid for the whole call.
struct GemvArgs {
  const void* w;        // weight values: int8 [N, K] or packed nibbles [N, K / 2]
  const float* ws;      // weight scales [N, blocks]
  const int8_t* xq;     // activation values [rows, K]
  const float* xs;      // activation scales [rows, blocks]
  const float* xsum;    // activation scale * block sum [rows, blocks]
  const float* bias;    // [N] or null
  float* y;             // [rows, N]
  int64_t n_out, k, blocks;
};

// ---------------------------------------------------------------------------------------
// Portable kernels: exact int32 block sums, float32 accumulation in block order.

void Q8Portable(const GemvArgs& a, int64_t rows, int64_t begin, int64_t end) {
  const int8_t* w = static_cast<const int8_t*>(a.w);
  for (int64_t n = begin; n < end; ++n) {
    for (int64_t m = 0; m < rows; ++m) {
      float acc = 0;
      for (int64_t b = 0; b < a.blocks; ++b) {
        const int8_t* wb = w + n * a.k + b * kQuantBlock;
        const int8_t* xb = a.xq + m * a.k + b * kQuantBlock;
        int32_t dot = 0;
        for (int64_t j = 0; j < kQuantBlock; ++j) dot += int32_t{wb[j]} * int32_t{xb[j]};
        acc += static_cast<float>(dot) * (a.ws[n * a.blocks + b] * a.xs[m * a.blocks + b]);
      }
      a.y[m * a.n_out + n] = acc + (a.bias != nullptr ? a.bias[n] : 0.0f);
    }
  }
}

void Q4Portable(const GemvArgs& a, int64_t rows, int64_t begin, int64_t end) {
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  for (int64_t n = begin; n < end; ++n) {
    for (int64_t m = 0; m < rows; ++m) {
      float acc = 0;
      for (int64_t b = 0; b < a.blocks; ++b) {
        const uint8_t* wb = w + n * (a.k / 2) + b * kHalfBlock;
        const int8_t* xb = a.xq + m * a.k + b * kQuantBlock;
        int32_t dot = 0;
        for (int64_t j = 0; j < kHalfBlock; ++j) {
          dot += (int32_t{wb[j] & 15} - 8) * int32_t{xb[j]};
          dot += (int32_t{wb[j] >> 4} - 8) * int32_t{xb[j + kHalfBlock]};
        }
        acc += static_cast<float>(dot) * (a.ws[n * a.blocks + b] * a.xs[m * a.blocks + b]);
      }
      a.y[m * a.n_out + n] = acc + (a.bias != nullptr ? a.bias[n] : 0.0f);
    }
  }
}

#ifdef LGPT_BLOCK_QUANT_X86

#define LGPT_AVX2 __attribute__((target("avx2,fma")))
#define LGPT_AVX512VNNI __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vnni")))

// ---------------------------------------------------------------------------------------
// AVX2: per block and row, maddubs (u8 x s8 -> pairs of int16) and madd (-> 8 int32 lanes).

// sum_b ws[b] * xsum[b] with 8 lanes (the q4 offset correction).
LGPT_AVX2 inline float OffsetDotAvx2(const float* ws, const float* xsum, int64_t blocks) {
  __m256 acc = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= blocks; b += 8) {
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(ws + b), _mm256_loadu_ps(xsum + b), acc);
  }
  float tail = 0;
  for (; b < blocks; ++b) tail += ws[b] * xsum[b];
  return simd::HorizontalSum(acc) + tail;
}

// The 32 nibbles of a q4 block as bytes 0..15 in order of the elements.
LGPT_AVX2 inline __m256i UnpackQ4(const uint8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i low_mask = _mm_set1_epi8(15);
  const __m128i low = _mm_and_si128(raw, low_mask);
  const __m128i high = _mm_and_si128(_mm_srli_epi16(raw, 4), low_mask);
  return _mm256_inserti128_si256(_mm256_castsi128_si256(low), high, 1);
}

// R weight rows against M activation rows. kQ4 selects the format: q8 weights are signed
// (sign moved onto x so maddubs sees |w|), q4 weights are q + 8 in [0, 15] (fed to maddubs
// as they are; the + 8 is removed once per output with OffsetDotAvx2).
template <bool kQ4, int M, int R>
LGPT_AVX2 void BlockAvx2(const GemvArgs& a, int64_t n) {
  __m256 acc[R][M];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) acc[r][m] = _mm256_setzero_ps();
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < a.blocks; ++b) {
    __m256i xv[M];
    __m256 dx[M];
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) {
      xv[m] = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(a.xq + m * a.k + b * kQuantBlock));
      dx[m] = _mm256_broadcast_ss(a.xs + m * a.blocks + b);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 dw = _mm256_broadcast_ss(a.ws + (n + r) * a.blocks + b);
      __m256i wu;
      __m256i wsigned = _mm256_setzero_si256();
      if constexpr (kQ4) {
        wu = UnpackQ4(static_cast<const uint8_t*>(a.w) + (n + r) * (a.k / 2) + b * kHalfBlock);
      } else {
        wsigned = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
            static_cast<const int8_t*>(a.w) + (n + r) * a.k + b * kQuantBlock));
        wu = _mm256_sign_epi8(wsigned, wsigned);
      }
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m) {
        const __m256i xs = kQ4 ? xv[m] : _mm256_sign_epi8(xv[m], wsigned);
        const __m256i pairs = _mm256_maddubs_epi16(wu, xs);
        const __m256 sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
        acc[r][m] = _mm256_fmadd_ps(sums, _mm256_mul_ps(dw, dx[m]), acc[r][m]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const float bias = a.bias != nullptr ? a.bias[n + r] : 0.0f;
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) {
      float sum = simd::HorizontalSum(acc[r][m]);
      if constexpr (kQ4) {
        sum -= 8.0f * OffsetDotAvx2(a.ws + (n + r) * a.blocks, a.xsum + m * a.blocks, a.blocks);
      }
      a.y[m * a.n_out + n + r] = sum + bias;
    }
  }
}

// ---------------------------------------------------------------------------------------
// AVX-512 VNNI: one dpbusd (u8 x s8, four products per int32 lane) covers two blocks: lanes
// 0..7 the first, 8..15 the second. An odd last block runs with the second half zero.

// Lanes 0..7 = p[0], lanes 8..15 = p[1] (p[1] taken as 0 with `single`); with `halves`,
// lanes 0..3 and 8..11 = p[0], 4..7 and 12..15 = p[1] (the interleaved q4 pair layout).
LGPT_AVX512VNNI inline __m512 PairScales(const float* p, bool single, bool halves = false) {
  const __m512i index =
      halves ? _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0)
             : _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m128 pair = single ? _mm_load_ss(p)
                             : _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(p)));
  return _mm512_permutexvar_ps(index, _mm512_zextps128_ps512(pair));
}

// Two q4 blocks (32 bytes) as [low 0, low 1, high 0, high 1] nibbles (128-bit lanes): one
// broadcast load, one shift of the upper half, one mask. The activations of a pair are laid
// out to match (InterleavePairs).
LGPT_AVX512VNNI inline __m512i UnpackQ4PairInterleaved(const uint8_t* p) {
  const __m512i raw = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512i shifts = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0);
  return _mm512_and_si512(_mm512_srlv_epi64(raw, shifts), _mm512_set1_epi8(15));
}

// Two q4 blocks (32 bytes, or 16 with `single`) as [low 0, high 0, low 1, high 1] nibbles.
LGPT_AVX512VNNI inline __m512i UnpackQ4Pair(const uint8_t* p, bool single) {
  const __m256i raw =
      single ? _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))
             : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i low_mask = _mm256_set1_epi8(15);
  const __m256i low = _mm256_and_si256(raw, low_mask);
  const __m256i high = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low_mask);
  const __m512i halves = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
  return _mm512_shuffle_i64x2(halves, halves, _MM_SHUFFLE(3, 1, 2, 0));
}

// One step of BlockVnni over blocks b and b + 1 (b alone with kSingle: plain loads for the
// pairs, masked ones only for an odd last block).
template <bool kQ4, bool kSingle, int M, int R>
LGPT_AVX512VNNI inline void StepVnni(const GemvArgs& a, int64_t n, int64_t b,
                                     __m512 (&acc)[R][M]) {
  const __m512i zero = _mm512_setzero_si512();
  constexpr __mmask64 kFirstBlock = 0xFFFFFFFFu;
  __m512i xv[M];
  __m512 dx[M];
#pragma GCC unroll 4
  for (int m = 0; m < M; ++m) {
    const int8_t* x = a.xq + m * a.k + b * kQuantBlock;
    xv[m] = kSingle ? _mm512_maskz_loadu_epi8(kFirstBlock, x) : _mm512_loadu_si512(x);
    dx[m] = PairScales(a.xs + m * a.blocks + b, kSingle, kQ4 && !kSingle);
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m512 dw = PairScales(a.ws + (n + r) * a.blocks + b, kSingle, kQ4 && !kSingle);
    __m512i wu;
    __mmask64 negative = 0;
    if constexpr (kQ4) {
      const uint8_t* wp = static_cast<const uint8_t*>(a.w) + (n + r) * (a.k / 2) + b * kHalfBlock;
      wu = kSingle ? UnpackQ4Pair(wp, true) : UnpackQ4PairInterleaved(wp);
    } else {
      const int8_t* wp = static_cast<const int8_t*>(a.w) + (n + r) * a.k + b * kQuantBlock;
      const __m512i w = kSingle ? _mm512_maskz_loadu_epi8(kFirstBlock, wp) : _mm512_loadu_si512(wp);
      wu = _mm512_abs_epi8(w);
      negative = _mm512_movepi8_mask(w);
    }
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) {
      // q8: x negated where w < 0, so |w| (unsigned) times it is w x; x is never -128.
      const __m512i xs = kQ4 ? xv[m] : _mm512_mask_sub_epi8(xv[m], negative, zero, xv[m]);
      const __m512 sums = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, wu, xs));
      acc[r][m] = _mm512_fmadd_ps(sums, _mm512_mul_ps(dw, dx[m]), acc[r][m]);
    }
  }
}

template <bool kQ4, int M, int R>
LGPT_AVX512VNNI void BlockVnni(const GemvArgs& a, int64_t n) {
  __m512 acc[R][M];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
  }
  int64_t b = 0;
  for (; b + 2 <= a.blocks; b += 2) StepVnni<kQ4, false, M, R>(a, n, b, acc);
  if (b < a.blocks) StepVnni<kQ4, true, M, R>(a, n, b, acc);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const float bias = a.bias != nullptr ? a.bias[n + r] : 0.0f;
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) {
      float sum = _mm512_reduce_add_ps(acc[r][m]);
      if constexpr (kQ4) {
        sum -= 8.0f * OffsetDotAvx2(a.ws + (n + r) * a.blocks, a.xsum + m * a.blocks, a.blocks);
      }
      a.y[m * a.n_out + n + r] = sum + bias;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Row grouping shared by both SIMD kernels: R weight rows per step for M activation rows
// (R * M <= 8 accumulators), groups of four activation rows beyond four. Every output is
// computed by the same instruction sequence whatever M and R are.

template <QuantKernel kKernel, bool kQ4, int M, int R>
void Block(const GemvArgs& a, int64_t n) {
  if constexpr (kKernel == QuantKernel::kAvx512Vnni) {
    BlockVnni<kQ4, M, R>(a, n);
  } else {
    BlockAvx2<kQ4, M, R>(a, n);
  }
}

template <QuantKernel kKernel, bool kQ4, int M>
void RangeSimd(const GemvArgs& a, int64_t begin, int64_t end) {
  constexpr int R = M == 1 ? 4 : (M == 2 ? 2 : 1);
  int64_t n = begin;
  for (; n + R <= end; n += R) Block<kKernel, kQ4, M, R>(a, n);
  for (; n < end; ++n) Block<kKernel, kQ4, M, 1>(a, n);
}

template <QuantKernel kKernel, bool kQ4>
void GemvSimd(const GemvArgs& a, int64_t rows, int64_t begin, int64_t end) {
  if (rows > 4) {
    // Per pair of weight rows (in L1 after the first group) every group of four activation
    // rows: each weight byte still comes from memory once.
    for (int64_t n = begin; n < end; n += 2) {
      const int64_t stop = std::min<int64_t>(n + 2, end);
      for (int64_t m = 0; m < rows; m += 4) {
        GemvArgs group = a;
        group.xq += m * a.k;
        group.xs += m * a.blocks;
        group.xsum += m * a.blocks;
        group.y += m * a.n_out;
        GemvSimd<kKernel, kQ4>(group, std::min<int64_t>(4, rows - m), n, stop);
      }
    }
    return;
  }
  switch (rows) {
    case 1:
      return RangeSimd<kKernel, kQ4, 1>(a, begin, end);
    case 2:
      return RangeSimd<kKernel, kQ4, 2>(a, begin, end);
    case 3:
      return RangeSimd<kKernel, kQ4, 3>(a, begin, end);
    default:
      return RangeSimd<kKernel, kQ4, 4>(a, begin, end);
  }
}

#endif  // LGPT_BLOCK_QUANT_X86

void GemvRange(QuantKernel kernel, bool q4, const GemvArgs& a, int64_t rows, int64_t begin,
               int64_t end) {
#ifdef LGPT_BLOCK_QUANT_X86
  switch (kernel) {
    case QuantKernel::kAvx512Vnni:
      return q4 ? GemvSimd<QuantKernel::kAvx512Vnni, true>(a, rows, begin, end)
                : GemvSimd<QuantKernel::kAvx512Vnni, false>(a, rows, begin, end);
    case QuantKernel::kAvx2:
      return q4 ? GemvSimd<QuantKernel::kAvx2, true>(a, rows, begin, end)
                : GemvSimd<QuantKernel::kAvx2, false>(a, rows, begin, end);
    case QuantKernel::kPortable:
      break;
  }
#endif
  if (q4) return Q4Portable(a, rows, begin, end);
  Q8Portable(a, rows, begin, end);
}

// Rounds |v| < 2^22 to the nearest integer, ties to even, as the default rounding mode and
// _mm256_cvtps_epi32 do: adding and subtracting 1.5 * 2^23 leaves no fraction bits. (A
// std::nearbyint call per element would cost more than the whole quantisation.)
inline int RoundToInt(float v) {
  constexpr float kMagic = 12582912.0f;
  return static_cast<int>((v + kMagic) - kMagic);
}

// QuantizeRows's portable loop over `blocks` consecutive 32-blocks.
void QuantizeBlocksOfRow(const float* x, int64_t blocks, int8_t* values, float* scales,
                         float* sums) {
  for (int64_t i = 0; i < blocks; ++i) {
    const float* block = x + i * kQuantBlock;
    float amax = 0;
    for (int64_t j = 0; j < kQuantBlock; ++j) amax = std::max(amax, std::fabs(block[j]));
    const float inverse = amax > kTinyScale ? 127.0f / amax : 0.0f;
    int8_t* q = values + i * kQuantBlock;
    int32_t sum = 0;
    for (int64_t j = 0; j < kQuantBlock; ++j) {
      q[j] = static_cast<int8_t>(std::clamp(RoundToInt(block[j] * inverse), -127, 127));
      sum += q[j];
    }
    scales[i] = amax / 127.0f;
    sums[i] = scales[i] * static_cast<float>(sum);
  }
}

#ifdef LGPT_BLOCK_QUANT_X86
// The same with AVX2, bit for bit: max is exact in any order, the product x * inverse is the
// same float operation, and _mm256_cvtps_epi32 rounds ties to even like RoundToInt.
LGPT_AVX2 void QuantizeBlocksOfRowAvx2(const float* x, int64_t blocks, int8_t* values,
                                       float* scales, float* sums) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t i = 0; i < blocks; ++i) {
    const float* block = x + i * kQuantBlock;
    __m256 v[4];
    __m256 m = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(block + 8 * j);
      m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[j]));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float amax = _mm_cvtss_f32(h);
    const __m256 inverse = _mm256_set1_ps(amax > kTinyScale ? 127.0f / amax : 0.0f);
    __m256i q[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], inverse));
    const __m256i sum32 =
        _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum32), _mm256_extracti128_si256(sum32, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    // Packing interleaves 4-byte groups across the two 128-bit lanes; `order` undoes it.
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                             _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(values + i * kQuantBlock),
                        _mm256_permutevar8x32_epi32(bytes, order));
    scales[i] = amax / 127.0f;
    sums[i] = scales[i] * static_cast<float>(_mm_cvtsi128_si32(s));
  }
}
#endif  // LGPT_BLOCK_QUANT_X86

// Reorders each row's full pairs of 32-blocks from [a0..a31, b0..b31] to [a0..a15, b0..b15,
// a16..a31, b16..b31], the order UnpackQ4PairInterleaved yields the weights in; an odd last
// block stays as it is. O(rows * K) bytes, once per call.
void InterleavePairs(int64_t rows, int64_t k, std::vector<int8_t>* values) {
  const int64_t pairs = k / (2 * kQuantBlock);
  int8_t tmp[2 * kQuantBlock];
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t p = 0; p < pairs; ++p) {
      int8_t* pair = values->data() + m * k + p * 2 * kQuantBlock;
      std::memcpy(tmp, pair, sizeof(tmp));
      std::memcpy(pair + 0 * kHalfBlock, tmp + 0 * kHalfBlock, kHalfBlock);  // a0..15
      std::memcpy(pair + 1 * kHalfBlock, tmp + 2 * kHalfBlock, kHalfBlock);  // b0..15
      std::memcpy(pair + 2 * kHalfBlock, tmp + 1 * kHalfBlock, kHalfBlock);  // a16..31
      std::memcpy(pair + 3 * kHalfBlock, tmp + 3 * kHalfBlock, kHalfBlock);  // b16..31
    }
  }
}

}  // namespace

const char* BlockFormatName(BlockFormat format) {
  switch (format) {
    case BlockFormat::kQ8_0:
      return "q8_0";
    case BlockFormat::kQ4_0:
      return "q4_0";
  }
  return "?";
}

int64_t BlockQuantWeight::bytes() const {
  if (!defined()) return 0;
  return values.numel() * static_cast<int64_t>(values.element_size()) +
         scales.numel() * static_cast<int64_t>(scales.element_size());
}

absl::StatusOr<BlockQuantWeight> QuantizeBlocks(const at::Tensor& weight, BlockFormat format) {
  if (!weight.defined() || weight.dim() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(BlockFormatName(format), " quantisation needs a 2-D weight"));
  }
  const int64_t n = weight.size(0), k = weight.size(1);
  if (k % kQuantBlock != 0 || k == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        BlockFormatName(format), " quantisation needs in_features to be a positive multiple of ",
        kQuantBlock, ", got ", k));
  }
  at::NoGradGuard no_grad;
  const int64_t blocks = k / kQuantBlock;
  const at::Tensor w = weight.detach().to(at::kCPU, at::kFloat).contiguous();
  const float* src = w.data_ptr<float>();
  BlockQuantWeight out;
  out.format = format;
  out.out_features = n;
  out.in_features = k;
  out.scales = at::empty({n, blocks}, at::kFloat);
  float* scales = out.scales.data_ptr<float>();
  const bool q4 = format == BlockFormat::kQ4_0;
  out.values = q4 ? at::empty({n, k / 2}, at::kByte) : at::empty({n, k}, at::kChar);
  uint8_t* packed = q4 ? out.values.data_ptr<uint8_t>() : nullptr;
  int8_t* values = q4 ? nullptr : out.values.data_ptr<int8_t>();
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      for (int64_t b = 0; b < blocks; ++b) {
        const float* block = src + row * k + b * kQuantBlock;
        // The element of largest magnitude (the first of equals).
        float extreme = 0;
        for (int64_t j = 0; j < kQuantBlock; ++j) {
          if (std::fabs(block[j]) > std::fabs(extreme)) extreme = block[j];
        }
        // q8: amax -> 127. q4: the extreme maps to -8 when negative, else to 7, so it is
        // represented exactly and all 16 levels are in reach. An all-zero block: scale 0.
        const float scale = q4 ? (extreme < 0 ? -extreme / 8.0f : extreme / 7.0f)
                               : std::fabs(extreme) / 127.0f;
        const float inverse = scale > kTinyScale ? 1.0f / scale : 0.0f;
        scales[row * blocks + b] = scale;
        if (q4) {
          uint8_t* out_block = packed + row * (k / 2) + b * kHalfBlock;
          for (int64_t j = 0; j < kHalfBlock; ++j) {
            const int low = std::clamp(RoundToInt(block[j] * inverse), -8, 7) + 8;
            const int high = std::clamp(RoundToInt(block[j + kHalfBlock] * inverse), -8, 7) + 8;
            out_block[j] = static_cast<uint8_t>(low | (high << 4));
          }
        } else {
          int8_t* out_block = values + row * k + b * kQuantBlock;
          for (int64_t j = 0; j < kQuantBlock; ++j) {
            out_block[j] = static_cast<int8_t>(std::clamp(RoundToInt(block[j] * inverse), -127, 127));
          }
        }
      }
    }
  });
  return out;
}

namespace {

// values: int8 [R, K] or packed uint8 [R, K / 2]; scales [R, K / 32] -> float32 [R, K].
at::Tensor Dequantize(const at::Tensor& values, const at::Tensor& scales, BlockFormat format,
                      int64_t k) {
  const int64_t rows = scales.size(0), blocks = k / kQuantBlock;
  at::Tensor q;  // [R, blocks, 32]
  if (format == BlockFormat::kQ4_0) {
    const at::Tensor packed = values.view({rows, blocks, kHalfBlock});
    q = at::cat({at::bitwise_and(packed, 15), at::bitwise_right_shift(packed, 4)}, -1)
            .to(at::kFloat) - 8;
  } else {
    q = values.view({rows, blocks, kQuantBlock}).to(at::kFloat);
  }
  return (q * scales.unsqueeze(-1)).view({rows, k});
}

}  // namespace

at::Tensor DequantizeBlockRows(const BlockQuantWeight& weight, const at::Tensor& rows) {
  TORCH_CHECK(weight.defined(), "DequantizeBlockRows: undefined weight");
  const at::Tensor index = rows.to(at::kCPU, at::kLong).contiguous().view({-1});
  return Dequantize(weight.values.index_select(0, index), weight.scales.index_select(0, index),
                    weight.format, weight.in_features);
}

at::Tensor DequantizeBlocks(const BlockQuantWeight& weight) {
  TORCH_CHECK(weight.defined(), "DequantizeBlocks: undefined weight");
  return Dequantize(weight.values, weight.scales, weight.format, weight.in_features);
}

const char* QuantKernelName(QuantKernel kernel) {
  switch (kernel) {
    case QuantKernel::kPortable:
      return "portable";
    case QuantKernel::kAvx2:
      return "avx2";
    case QuantKernel::kAvx512Vnni:
      return "avx512vnni";
  }
  return "?";
}

bool QuantKernelAvailable(QuantKernel kernel) {
  switch (kernel) {
    case QuantKernel::kPortable:
      return true;
    case QuantKernel::kAvx2:
      return CpuHasAvx2Fma();
    case QuantKernel::kAvx512Vnni:
#ifdef LGPT_BLOCK_QUANT_X86
      {
        static const bool has = CpuHasAvx2Fma() && __builtin_cpu_supports("avx512f") &&
                                __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vnni");
        return has;
      }
#else
      return false;
#endif
  }
  return false;
}

QuantKernel BestQuantKernel() {
  static const QuantKernel best = [] {
    QuantKernel kernel = QuantKernel::kPortable;
    for (QuantKernel k : {QuantKernel::kAvx2, QuantKernel::kAvx512Vnni}) {
      if (QuantKernelAvailable(k)) kernel = k;
    }
    if (const char* forced = std::getenv("LGPT_QUANT_KERNEL")) {
      for (QuantKernel k :
           {QuantKernel::kPortable, QuantKernel::kAvx2, QuantKernel::kAvx512Vnni}) {
        if (std::string(forced) == QuantKernelName(k) && QuantKernelAvailable(k)) kernel = k;
      }
    }
    return kernel;
  }();
  return best;
}

void QuantizeRows(const float* x, int64_t rows, int64_t k, QuantizedRows* out,
                  QuantKernel kernel) {
  const int64_t blocks = rows * (k / kQuantBlock);
  out->values.resize(rows * k);
  out->scales.resize(blocks);
  out->sums.resize(blocks);
#ifdef LGPT_BLOCK_QUANT_X86
  if (kernel != QuantKernel::kPortable && QuantKernelAvailable(QuantKernel::kAvx2)) {
    return QuantizeBlocksOfRowAvx2(x, blocks, out->values.data(), out->scales.data(),
                                   out->sums.data());
  }
#endif
  QuantizeBlocksOfRow(x, blocks, out->values.data(), out->scales.data(), out->sums.data());
}

void BlockQuantGemv(const BlockQuantWeight& weight, const float* bias, const float* x, float* y,
                    int64_t rows, QuantKernel kernel) {
  TORCH_CHECK(weight.defined() && weight.in_features % kQuantBlock == 0,
              "BlockQuantGemv: bad weight");
  TORCH_CHECK(QuantKernelAvailable(kernel), "BlockQuantGemv: kernel ",
              QuantKernelName(kernel), " is not available on this CPU");
  const int64_t n_out = weight.out_features, k = weight.in_features;
  // Reused across calls of this thread: no allocation per decoding step.
  thread_local QuantizedRows xq;
  QuantizeRows(x, rows, k, &xq, kernel);
  const bool q4 = weight.format == BlockFormat::kQ4_0;
  if (q4 && kernel == QuantKernel::kAvx512Vnni) InterleavePairs(rows, k, &xq.values);
  GemvArgs args;
  args.w = weight.values.data_ptr();
  args.ws = weight.scales.data_ptr<float>();
  args.xq = xq.values.data();
  args.xs = xq.scales.data();
  args.xsum = xq.sums.data();
  args.bias = bias;
  args.y = y;
  args.n_out = n_out;
  args.k = k;
  args.blocks = k / kQuantBlock;
  // ~64 KiB of weight bytes per thread at least, as the float kernel.
  const int64_t row_bytes = q4 ? k / 2 : k;
  const int64_t min_rows =
      std::max<int64_t>(16, (int64_t{64} << 10) / std::max<int64_t>(row_bytes, 1));
  ParallelForRows(n_out, 8, min_rows, [&](int64_t begin, int64_t end) {
    GemvRange(kernel, q4, args, rows, begin, end);
  });
}

}  // namespace lgpt
