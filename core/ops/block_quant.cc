// GCC 12's AVX-512 intrinsic headers start vectors from _mm512_undefined_*(), which its own
// -Wuninitialized flags inside every caller; the warnings are about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "core/ops/block_quant.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/ops/block_quant_layout.h"
#include "core/ops/gemv.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define LGPT_BLOCK_QUANT_X86 1
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define LGPT_BLOCK_QUANT_AMX 1
#endif

namespace lgpt {
namespace {

// The tile layout, its constants and the portable arithmetic are block_quant_layout.h's,
// shared with the CUDA GEMV and its twin.
using block_quant::kChunkBytes;
using block_quant::kGroup;
using block_quant::kLaneBytes;
using block_quant::kQ4Offset;
using block_quant::kQ4TileBytes;
using block_quant::kQ8Offset;
using block_quant::kQ8TileBytes;
using block_quant::kTinyScale;
using block_quant::RoundToInt;
static_assert(block_quant::kBlock == kQuantBlock && block_quant::kGroup == kQuantRowGroup);
static_assert(kChunkBytes == kGroup * kLaneBytes);
// Where the AMX kernel takes over from VNNI (AmxDispatch).
std::atomic<int64_t> amx_min_rows{AmxDispatch().min_rows};
std::atomic<int64_t> amx_q4_min_outputs{AmxDispatch().q4_min_outputs};

// AMX-TILE and AMX-INT8 (CPUID leaf 7: EDX bits 24 and 25), and the kernel's permission
// to use the tile state: Linux gives it per process on request (arch_prctl
// ARCH_REQ_XCOMP_PERM for XTILEDATA), once.
bool CpuHasAmxInt8() {
#ifdef LGPT_BLOCK_QUANT_AMX
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  if ((edx & (1u << 24)) == 0 || (edx & (1u << 25)) == 0) return false;
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

int64_t TileBytes(BlockFormat format) {
  return format == BlockFormat::kQ4_0 ? kQ4TileBytes : kQ8TileBytes;
}

// Everything a kernel reads; pointers stay valid for the whole call.
struct GemvArgs {
  const uint8_t* w;     // tiles [groups, blocks, tile bytes]
  const uint16_t* ws;   // weight scales, IEEE half [groups, blocks, 16]
  const int8_t* xq;     // activation values [rows, K]
  const float* xs;      // activation scales [rows, blocks]
  const int32_t* xsum;  // activation block sums [rows, blocks]
  const float* bias;    // [N] or null
  float* y;             // [rows, N]
  int64_t n_out, k, blocks;

  const uint8_t* Tile(int64_t group, int64_t b, int64_t tile_bytes) const {
    return w + (group * blocks + b) * tile_bytes;
  }
  const uint16_t* Scales(int64_t group, int64_t b) const {
    return ws + (group * blocks + b) * kGroup;
  }
};

// ---------------------------------------------------------------------------------------
// Portable kernel: exact int32 block sums; per block acc = fma(dot, ws * xs, acc), the
// same float operations, in the same order, as the SIMD kernels: every kernel gives the same
// bits.

void GemvPortable(bool q4, const GemvArgs& a, int64_t rows, int64_t group_begin,
                  int64_t group_end) {
  const int64_t tile_bytes = q4 ? kQ4TileBytes : kQ8TileBytes;
  for (int64_t g = group_begin; g < group_end; ++g) {
    for (int64_t lane = 0; lane < kGroup && g * kGroup + lane < a.n_out; ++lane) {
      const int64_t n = g * kGroup + lane;
      for (int64_t m = 0; m < rows; ++m) {
        float acc = 0;
        for (int64_t b = 0; b < a.blocks; ++b) {
          const uint8_t* tile = a.Tile(g, b, tile_bytes);
          const int8_t* xb = a.xq + m * a.k + b * kQuantBlock;
          const int32_t dot = block_quant::BlockDot(tile, q4, lane, xb);
          acc =
              block_quant::AccumulateBlock(acc, dot, a.Scales(g, b)[lane], a.xs[m * a.blocks + b]);
        }
        a.y[m * a.n_out + n] = acc + (a.bias != nullptr ? a.bias[n] : 0.0f);
      }
    }
  }
}

#ifdef LGPT_BLOCK_QUANT_X86

#define LGPT_AVX2 __attribute__((target("avx2,fma,f16c")))
#define LGPT_AVX512VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vnni")))

inline int32_t LoadLane(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// ---------------------------------------------------------------------------------------
// AVX-512 VNNI. A chunk load holds 4 consecutive weights of each of the 16 rows of a group
// (one int32 lane per row); the matching 4 activations are broadcast to every lane, so one
// dpbusd advances 16 rows by 4 elements and a block ends with the 16 rows' exact dot
// products in one register: no horizontal sums, no per-row shuffles. RG groups and M
// activation rows per pass (RG * M independent dpbusd chains hide the latency; each weight
// load serves M rows, each activation broadcast RG groups).

template <bool kQ4, int M, int RG>
LGPT_AVX512VNNI void TileVnni(const GemvArgs& a, int64_t g) {
  constexpr int64_t kTileBytes = kQ4 ? kQ4TileBytes : kQ8TileBytes;
  constexpr int kOffset = kQ4 ? kQ4Offset : kQ8Offset;
  __m512 acc[RG][M];
#pragma GCC unroll 4
  for (int r = 0; r < RG; ++r) {
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
  }
  const __m512i low_nibbles = _mm512_set1_epi8(15);
  for (int64_t b = 0; b < a.blocks; ++b) {
    const int8_t* xb[M];
    __m512i dot[RG][M];
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) {
      xb[m] = a.xq + m * a.k + b * kQuantBlock;
      const __m512i start = _mm512_set1_epi32(-kOffset * a.xsum[m * a.blocks + b]);
#pragma GCC unroll 4
      for (int r = 0; r < RG; ++r) dot[r][m] = start;
    }
    const uint8_t* tile[RG];
#pragma GCC unroll 4
    for (int r = 0; r < RG; ++r) tile[r] = a.Tile(g + r, b, kTileBytes);
    if constexpr (kQ4) {
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {  // 8 elements per pair of chunks
        __m512i x_low[M], x_high[M];
#pragma GCC unroll 4
        for (int m = 0; m < M; ++m) {
          x_low[m] = _mm512_set1_epi32(LoadLane(xb[m] + 8 * p));
          x_high[m] = _mm512_set1_epi32(LoadLane(xb[m] + 8 * p + 4));
        }
#pragma GCC unroll 4
        for (int r = 0; r < RG; ++r) {
          const __m512i raw = _mm512_loadu_si512(tile[r] + p * kChunkBytes);
          const __m512i low = _mm512_and_si512(raw, low_nibbles);
          const __m512i high = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low_nibbles);
#pragma GCC unroll 4
          for (int m = 0; m < M; ++m) {
            dot[r][m] = _mm512_dpbusd_epi32(dot[r][m], low, x_low[m]);
            dot[r][m] = _mm512_dpbusd_epi32(dot[r][m], high, x_high[m]);
          }
        }
      }
    } else {
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        __m512i xv[M];
#pragma GCC unroll 4
        for (int m = 0; m < M; ++m) xv[m] = _mm512_set1_epi32(LoadLane(xb[m] + 4 * c));
#pragma GCC unroll 4
        for (int r = 0; r < RG; ++r) {
          const __m512i w = _mm512_loadu_si512(tile[r] + c * kChunkBytes);
#pragma GCC unroll 4
          for (int m = 0; m < M; ++m) dot[r][m] = _mm512_dpbusd_epi32(dot[r][m], w, xv[m]);
        }
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RG; ++r) {
      const __m512 scales =
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.Scales(g + r, b))));
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m) {
        const __m512 step = _mm512_mul_ps(scales, _mm512_set1_ps(a.xs[m * a.blocks + b]));
        acc[r][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][m]), step, acc[r][m]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < RG; ++r) {
    const int64_t n = (g + r) * kGroup;
    const int64_t valid = std::min<int64_t>(kGroup, a.n_out - n);
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
    const __m512 bias =
        a.bias != nullptr ? _mm512_maskz_loadu_ps(mask, a.bias + n) : _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) {
      _mm512_mask_storeu_ps(a.y + m * a.n_out + n, mask, _mm512_add_ps(acc[r][m], bias));
    }
  }
}

// ---------------------------------------------------------------------------------------
// AVX2: the same tiles, each chunk as two halves of 8 rows. maddubs (u8 x s8 -> int16
// pairs) would saturate on q8's stored bytes (up to 255 x 127 x 2), so q8 turns them back
// into signed weights and moves their sign onto x (|w| x +-x <= 127 x 127 x 2); q4's stored
// nibbles (<= 15) go in as they are, their offset removed like VNNI's.

template <bool kQ4, int M>
LGPT_AVX2 void TileAvx2(const GemvArgs& a, int64_t g) {
  constexpr int64_t kTileBytes = kQ4 ? kQ4TileBytes : kQ8TileBytes;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i low_nibbles = _mm256_set1_epi8(15);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const int64_t n = g * kGroup;
  const int64_t valid = std::min<int64_t>(kGroup, a.n_out - n);
  // One half of the group (8 rows) over every block, then the other: a half's M accumulators
  // and M dot products stay in registers (both halves at once spilled them, and GCC hoisted
  // the x broadcasts the halves share onto the stack). Each output gets the same operations
  // in the same order either way.
#pragma GCC unroll 1
  for (int h = 0; h < 2; ++h) {
    __m256 acc[M];
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < a.blocks; ++b) {
      const uint8_t* tile = a.Tile(g, b, kTileBytes) + h * 32;
      const int8_t* xb = a.xq + b * kQuantBlock;
      __m256i dot[M];
      if constexpr (kQ4) {
        // int16 pair sums of the block's 8 chunks (each within 2 x 15 x 128, eight of them
        // within 30720), widened once: the int32 sums of widening every chunk's.
        __m256i pairs[M];
#pragma GCC unroll 4
        for (int m = 0; m < M; ++m) pairs[m] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int p = 0; p < 4; ++p) {  // chunks 2p (low nibbles) and 2p + 1 (high)
          const __m256i raw =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + p * kChunkBytes));
          const __m256i low = _mm256_and_si256(raw, low_nibbles);
          const __m256i high = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low_nibbles);
#pragma GCC unroll 4
          for (int m = 0; m < M; ++m) {
            const int8_t* xm = xb + m * a.k + 8 * p;
            pairs[m] = _mm256_add_epi16(pairs[m],
                                        _mm256_maddubs_epi16(low, _mm256_set1_epi32(LoadLane(xm))));
            pairs[m] = _mm256_add_epi16(
                pairs[m], _mm256_maddubs_epi16(high, _mm256_set1_epi32(LoadLane(xm + 4))));
            asm("" : "+x"(pairs[m]));  // (as for q8 below)
          }
        }
#pragma GCC unroll 4
        for (int m = 0; m < M; ++m) {
          dot[m] = _mm256_add_epi32(_mm256_set1_epi32(-kQ4Offset * a.xsum[m * a.blocks + b]),
                                    _mm256_madd_epi16(pairs[m], ones));
        }
      } else {
#pragma GCC unroll 4
        for (int m = 0; m < M; ++m) dot[m] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) {
          const __m256i raw =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + c * kChunkBytes));
          const __m256i w_signed = _mm256_xor_si256(raw, flip);
          const __m256i w = _mm256_sign_epi8(w_signed, w_signed);
#pragma GCC unroll 4
          for (int m = 0; m < M; ++m) {
            const __m256i xv =
                _mm256_sign_epi8(_mm256_set1_epi32(LoadLane(xb + m * a.k + 4 * c)), w_signed);
            dot[m] = _mm256_add_epi32(dot[m], _mm256_madd_epi16(_mm256_maddubs_epi16(w, xv), ones));
            // Keeps the chain a chain: GCC otherwise reassociates these exact int32 adds into
            // a tree over all 32 products of the block and parks them on the stack.
            asm("" : "+x"(dot[m]));
          }
        }
      }
      const __m256 s = _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.Scales(g, b) + 8 * h)));
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m) {
        const __m256 step = _mm256_mul_ps(s, _mm256_set1_ps(a.xs[m * a.blocks + b]));
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[m]), step, acc[m]);
      }
    }
    const int64_t first = n + 8 * h;
    const int64_t count = std::clamp<int64_t>(valid - 8 * h, 0, 8);
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) {
      alignas(32) float out[8];
      _mm256_store_ps(out, acc[m]);
      for (int64_t i = 0; i < count; ++i) {
        a.y[m * a.n_out + first + i] = out[i] + (a.bias != nullptr ? a.bias[first + i] : 0.0f);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Tiling over groups and activation rows, shared by both SIMD kernels: up to four rows per
// pass (the weights of a group, in L1 after the first pass, serve every pass), VNNI with
// several groups per pass where few rows leave dpbusd chains idle.

template <bool kQ4, int M>
void GroupsVnni(const GemvArgs& a, int64_t begin, int64_t end) {
  constexpr int RG = M == 1 ? 4 : 2;
  int64_t g = begin;
  for (; g + RG <= end; g += RG) TileVnni<kQ4, M, RG>(a, g);
  for (; g < end; ++g) TileVnni<kQ4, M, 1>(a, g);
}

template <bool kQ4, int M>
void GroupsAvx2(const GemvArgs& a, int64_t begin, int64_t end) {
  for (int64_t g = begin; g < end; ++g) TileAvx2<kQ4, M>(a, g);
}

template <bool kQ4, int M>
void Groups(QuantKernel kernel, const GemvArgs& a, int64_t begin, int64_t end) {
  if (kernel == QuantKernel::kAvx512Vnni) return GroupsVnni<kQ4, M>(a, begin, end);
  GroupsAvx2<kQ4, M>(a, begin, end);
}

template <bool kQ4>
void GemvSimd(QuantKernel kernel, const GemvArgs& a, int64_t rows, int64_t begin, int64_t end) {
  if (rows > 4) {
    // Per pair of groups (their tiles stay in L1/L2), every group of four activation rows.
    for (int64_t g = begin; g < end; g += 2) {
      const int64_t stop = std::min<int64_t>(g + 2, end);
      for (int64_t m = 0; m < rows; m += 4) {
        GemvArgs part = a;
        part.xq += m * a.k;
        part.xs += m * a.blocks;
        part.xsum += m * a.blocks;
        part.y += m * a.n_out;
        GemvSimd<kQ4>(kernel, part, std::min<int64_t>(4, rows - m), g, stop);
      }
    }
    return;
  }
  switch (rows) {
    case 1:
      return Groups<kQ4, 1>(kernel, a, begin, end);
    case 2:
      return Groups<kQ4, 2>(kernel, a, begin, end);
    case 3:
      return Groups<kQ4, 3>(kernel, a, begin, end);
    default:
      return Groups<kQ4, 4>(kernel, a, begin, end);
  }
}

#endif  // LGPT_BLOCK_QUANT_X86

#ifdef LGPT_BLOCK_QUANT_AMX

#define LGPT_AMX \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vnni,amx-tile,amx-int8")))

// ---------------------------------------------------------------------------------------
// AMX-INT8. A stored tile is already what tdpbsud takes as its second operand: 8 rows of
// 64 bytes, each 4 consecutive elements of each of the group's 16 weight rows (q4 tiles
// are unpacked to that first, low nibbles of a chunk pair then its high ones). One tdpbsud
// of the block's M activation rows (M x 32 signed bytes) against it gives the M x 16 exact
// int32 sums of the block; they are stored to L1 and scaled exactly as the VNNI kernel
// scales its dot products (the same float operations in the same order), so every row's
// result is bit for bit the other kernels', whatever the batch.

// Tile registers, two sets (C the block's sums, A its activations, B its weights) so that one
// block's products run while the previous block's are scaled. Literal numbers: GCC's tile
// intrinsics paste them into the instructions' register names.
#define LGPT_AMX_TILE_C0 0
#define LGPT_AMX_TILE_A0 1
#define LGPT_AMX_TILE_B0 2
#define LGPT_AMX_TILE_C1 3
#define LGPT_AMX_TILE_A1 4
#define LGPT_AMX_TILE_B1 5
// Activation rows per tile (the most a tile register holds).
constexpr int kAmxRows = 16;
// Row groups per pass over the activation rows (their tiles stay in L1/L2 between passes).
constexpr int64_t kAmxGroupsPerPass = 8;

struct alignas(64) AmxTileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

LGPT_AMX void ConfigureAmx(int m) {
  AmxTileConfig config;
  for (int set = 0; set < 2; ++set) {
    const int c = set * 3, a = c + 1, b = c + 2;
    config.rows[c] = static_cast<uint8_t>(m);
    config.bytes_per_row[c] = kGroup * sizeof(int32_t);
    config.rows[a] = static_cast<uint8_t>(m);
    config.bytes_per_row[a] = kQuantBlock;
    config.rows[b] = kQuantBlock / kLaneBytes;
    config.bytes_per_row[b] = kChunkBytes;
  }
  _tile_loadconfig(&config);
}

// A q4 group's tiles as tdpbsud reads bytes: per block 8 rows of 64 bytes, the low nibbles of
// each chunk pair then its high ones. All blocks at once, before the first tile load (a tile
// load right after the stores that wrote its bytes would wait for them to reach L1).
LGPT_AMX void UnpackQ4Group(const GemvArgs& a, int64_t g, uint8_t* out) {
  const __m512i low_nibbles = _mm512_set1_epi8(15);
  for (int64_t b = 0; b < a.blocks; ++b) {
    const uint8_t* tile = a.Tile(g, b, kQ4TileBytes);
    uint8_t* unpacked = out + b * kQ8TileBytes;
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      const __m512i raw = _mm512_loadu_si512(tile + p * kChunkBytes);
      _mm512_store_si512(unpacked + 2 * p * kChunkBytes, _mm512_and_si512(raw, low_nibbles));
      _mm512_store_si512(unpacked + (2 * p + 1) * kChunkBytes,
                         _mm512_and_si512(_mm512_srli_epi16(raw, 4), low_nibbles));
    }
  }
}

// Block b's exact int32 sums [M, 16] into `sums`, through tile set kSet; q4 weights from the
// group's unpacked tiles.
template <bool kQ4, int kSet>
LGPT_AMX inline void AmxBlockSums(const GemvArgs& a, int64_t g, int64_t b, const uint8_t* unpacked,
                                  int32_t* sums) {
  const uint8_t* tile = kQ4 ? unpacked + b * kQ8TileBytes : a.Tile(g, b, kQ8TileBytes);
  const int8_t* x = a.xq + b * kQuantBlock;
  constexpr int kSumsStride = kGroup * sizeof(int32_t);
  if constexpr (kSet == 0) {
    _tile_loadd(LGPT_AMX_TILE_A0, x, a.k);
    _tile_loadd(LGPT_AMX_TILE_B0, tile, kChunkBytes);
    _tile_zero(LGPT_AMX_TILE_C0);
    _tile_dpbsud(LGPT_AMX_TILE_C0, LGPT_AMX_TILE_A0, LGPT_AMX_TILE_B0);
    _tile_stored(LGPT_AMX_TILE_C0, sums, kSumsStride);
  } else {
    _tile_loadd(LGPT_AMX_TILE_A1, x, a.k);
    _tile_loadd(LGPT_AMX_TILE_B1, tile, kChunkBytes);
    _tile_zero(LGPT_AMX_TILE_C1);
    _tile_dpbsud(LGPT_AMX_TILE_C1, LGPT_AMX_TILE_A1, LGPT_AMX_TILE_B1);
    _tile_stored(LGPT_AMX_TILE_C1, sums, kSumsStride);
  }
}

template <bool kQ4, int M>
LGPT_AMX void TileAmx(const GemvArgs& a, int64_t g) {
  constexpr int kOffset = kQ4 ? kQ4Offset : kQ8Offset;
  alignas(64) int32_t sums[2][M][kGroup];
  // q4: the group's unpacked tiles, reused by every call of this thread.
  thread_local std::vector<uint8_t> unpacked_storage;
  const uint8_t* unpacked = nullptr;
  if constexpr (kQ4) {
    // 64 bytes of slack to align the start to a cache line (aligned vector stores).
    unpacked_storage.resize(static_cast<size_t>(a.blocks * kQ8TileBytes + 64));
    uint8_t* aligned = unpacked_storage.data() +
                       (64 - reinterpret_cast<uintptr_t>(unpacked_storage.data()) % 64) % 64;
    UnpackQ4Group(a, g, aligned);
    unpacked = aligned;
  }
  __m512 acc[M];
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
  AmxBlockSums<kQ4, 0>(a, g, 0, unpacked, sums[0][0]);
  for (int64_t b = 0; b < a.blocks; ++b) {
    const int set = static_cast<int>(b & 1);
    // The next block's products first: the tile unit works while this block is scaled.
    if (b + 1 < a.blocks) {
      if (set == 0) {
        AmxBlockSums<kQ4, 1>(a, g, b + 1, unpacked, sums[1][0]);
      } else {
        AmxBlockSums<kQ4, 0>(a, g, b + 1, unpacked, sums[0][0]);
      }
    }
    const __m512 scales =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.Scales(g, b))));
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
      const __m512i dot = _mm512_add_epi32(_mm512_set1_epi32(-kOffset * a.xsum[m * a.blocks + b]),
                                           _mm512_load_si512(sums[set][m]));
      const __m512 step = _mm512_mul_ps(scales, _mm512_set1_ps(a.xs[m * a.blocks + b]));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), step, acc[m]);
    }
  }
  const int64_t n = g * kGroup;
  const int64_t valid = std::min<int64_t>(kGroup, a.n_out - n);
  const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
  const __m512 bias =
      a.bias != nullptr ? _mm512_maskz_loadu_ps(mask, a.bias + n) : _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m) {
    _mm512_mask_storeu_ps(a.y + m * a.n_out + n, mask, _mm512_add_ps(acc[m], bias));
  }
}

template <bool kQ4, int M>
void GroupsAmx(const GemvArgs& a, int64_t begin, int64_t end) {
  for (int64_t g = begin; g < end; ++g) TileAmx<kQ4, M>(a, g);
}

template <bool kQ4, int... Ms>
void GroupsAmxFor(int m, const GemvArgs& a, int64_t begin, int64_t end,
                  std::integer_sequence<int, Ms...>) {
  ((m == Ms + 1 ? GroupsAmx<kQ4, Ms + 1>(a, begin, end) : void()), ...);
}

// Per pass of up to kAmxGroupsPerPass groups, every tile of up to 16 activation rows (the
// tile configuration changes only for a last, shorter one).
template <bool kQ4>
LGPT_AMX void GemvAmx(const GemvArgs& a, int64_t rows, int64_t begin, int64_t end) {
  int configured = 0;
  for (int64_t g = begin; g < end; g += kAmxGroupsPerPass) {
    const int64_t stop = std::min<int64_t>(g + kAmxGroupsPerPass, end);
    for (int64_t m = 0; m < rows; m += kAmxRows) {
      const int tile_rows = static_cast<int>(std::min<int64_t>(kAmxRows, rows - m));
      if (tile_rows != configured) {
        ConfigureAmx(tile_rows);
        configured = tile_rows;
      }
      GemvArgs part = a;
      part.xq += m * a.k;
      part.xs += m * a.blocks;
      part.xsum += m * a.blocks;
      part.y += m * a.n_out;
      GroupsAmxFor<kQ4>(tile_rows, part, g, stop, std::make_integer_sequence<int, kAmxRows>());
    }
  }
  _tile_release();
}

#endif  // LGPT_BLOCK_QUANT_AMX

void GemvRange(QuantKernel kernel, bool q4, const GemvArgs& a, int64_t rows, int64_t begin,
               int64_t end) {
#ifdef LGPT_BLOCK_QUANT_AMX
  if (kernel == QuantKernel::kAmx) {
    // Where tiles do not pay, VNNI (which every AMX CPU has) gives the same bits faster.
    if (rows >= amx_min_rows.load(std::memory_order_relaxed) &&
        (!q4 || a.n_out >= amx_q4_min_outputs.load(std::memory_order_relaxed))) {
      return q4 ? GemvAmx<true>(a, rows, begin, end) : GemvAmx<false>(a, rows, begin, end);
    }
    kernel = QuantKernel::kAvx512Vnni;
  }
#endif
#ifdef LGPT_BLOCK_QUANT_X86
  if (kernel != QuantKernel::kPortable) {
    return q4 ? GemvSimd<true>(kernel, a, rows, begin, end)
              : GemvSimd<false>(kernel, a, rows, begin, end);
  }
#endif
  GemvPortable(q4, a, rows, begin, end);
}

// QuantizeRows's portable loop over `blocks` consecutive 32-blocks.
void QuantizeBlocksOfRow(const float* x, int64_t blocks, int8_t* values, float* scales,
                         int32_t* sums) {
  for (int64_t i = 0; i < blocks; ++i) {
    scales[i] = block_quant::QuantizeActivationBlock(x + i * kQuantBlock, values + i * kQuantBlock,
                                                     &sums[i]);
  }
}

#ifdef LGPT_BLOCK_QUANT_X86
// The same with AVX2, bit for bit: max is exact in any order, the product x * inverse is the
// same float operation, and _mm256_cvtps_epi32 rounds ties to even like RoundToInt.
LGPT_AVX2 void QuantizeBlocksOfRowAvx2(const float* x, int64_t blocks, int8_t* values,
                                       float* scales, int32_t* sums) {
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
    const __m256i bytes =
        _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(values + i * kQuantBlock),
                        _mm256_permutevar8x32_epi32(bytes, order));
    scales[i] = amax / 127.0f;
    sums[i] = _mm_cvtsi128_si32(s);
  }
}
#endif  // LGPT_BLOCK_QUANT_X86

// The smallest IEEE half >= v (v >= 0 and at most the largest half): a scale rounded up,
// so no element of its block lands beyond the top level.
at::Half HalfAtLeast(float v) {
  at::Half h(v);
  if (static_cast<float>(h) < v)
    h = at::Half(static_cast<uint16_t>(h.x + 1), at::Half::from_bits());
  return h;
}

// The index of the first element that is not finite or exceeds `limit` in magnitude; -1
// when there is none. One parallel pass without temporaries.
int64_t FirstWeightBeyond(const float* w, int64_t count, float limit) {
  return at::parallel_reduce(
      0, count, int64_t{1} << 16, int64_t{-1},
      [&](int64_t begin, int64_t end, int64_t found) {
        if (found >= 0) return found;
        for (int64_t i = begin; i < end; ++i) {
          if (!(std::fabs(w[i]) <= limit)) return i;  // NaN fails the comparison too
        }
        return int64_t{-1};
      },
      [](int64_t a, int64_t b) { return a < 0 ? b : (b < 0 ? a : std::min(a, b)); });
}

// Quantises one block of a weight row: q[e] in [-127, 127] (q8) or [-8, 7] (q4); returns
// the scale, stored as a half (the elements are quantised with the stored value, so halving
// the scale's bytes costs no accuracy beyond its rounding up by at most 2^-11). q4: the
// element of largest magnitude maps to -8 when negative, else to 7, so it is represented to
// the scale's rounding and all 16 levels are in reach. An all-zero block: scale 0.
at::Half QuantizeWeightBlock(const float* block, bool q4, int* q) {
  float extreme = 0;  // the element of largest magnitude (the first of equals)
  for (int64_t j = 0; j < kQuantBlock; ++j) {
    if (std::fabs(block[j]) > std::fabs(extreme)) extreme = block[j];
  }
  const at::Half scale = HalfAtLeast(q4 ? (extreme < 0 ? -extreme / 8.0f : extreme / 7.0f)
                                        : std::fabs(extreme) / 127.0f);
  const float inverse = static_cast<float>(scale) > 0 ? 1.0f / static_cast<float>(scale) : 0.0f;
  for (int64_t j = 0; j < kQuantBlock; ++j) {
    q[j] = q4 ? std::clamp(RoundToInt(block[j] * inverse), -8, 7)
              : std::clamp(RoundToInt(block[j] * inverse), -127, 127);
  }
  return scale;
}

// The bytes of rows as [R, blocks, chunks, 4] (q8: element 4c + j at [c, j]; q4: elements
// 8p + j and 8p + 4 + j in the low and high nibble of [p, j]) with their scales [R, blocks]
// -> float32 [R, K].
at::Tensor DecodeRows(const at::Tensor& bytes, const at::Tensor& scales, BlockFormat format) {
  const int64_t rows = bytes.size(0), blocks = bytes.size(1);
  at::Tensor q;  // [R, blocks, 32]
  if (format == BlockFormat::kQ4_0) {
    const at::Tensor packed = bytes.unsqueeze(3);  // [R, blocks, pair, 1, 4]
    q = at::cat({at::bitwise_and(packed, 15), at::bitwise_right_shift(packed, 4)}, 3)
            .reshape({rows, blocks, kQuantBlock})
            .to(at::kFloat) -
        kQ4Offset;
  } else {
    q = bytes.reshape({rows, blocks, kQuantBlock}).to(at::kFloat) - kQ8Offset;
  }
  return (q * scales.to(at::kFloat).unsqueeze(-1)).reshape({rows, blocks * kQuantBlock});
}

// DequantizeBlockRows for the few token ids of a decode step: a loop over the requested rows'
// bytes instead of a dozen LibTorch operations. Same values: q and the half scale meet in one
// float product either way.
at::Tensor DecodeFewRows(const BlockQuantWeight& weight, const at::Tensor& index) {
  const int64_t rows = index.numel(), k = weight.in_features, blocks = k / kQuantBlock;
  const int64_t tile_bytes = TileBytes(weight.format);
  const bool q4 = weight.format == BlockFormat::kQ4_0;
  at::Tensor out = at::empty({rows, k}, at::kFloat);
  const int64_t* ids = index.data_ptr<int64_t>();
  const uint8_t* values = weight.values.data_ptr<uint8_t>();
  const at::Half* scales = weight.scales.data_ptr<at::Half>();
  float* y = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = ids[r];
    TORCH_CHECK(row >= 0 && row < weight.out_features, "row ", row, " outside [0, ",
                weight.out_features, ")");
    const int64_t group = row / kGroup, lane = row % kGroup;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* tile = values + (group * blocks + b) * tile_bytes + lane * kLaneBytes;
      const float scale = static_cast<float>(scales[(group * blocks + b) * kGroup + lane]);
      float* dst = y + r * k + b * kQuantBlock;
      for (int64_t e = 0; e < kQuantBlock; ++e) {
        int q;
        if (q4) {
          const uint8_t byte = tile[(e / 8) * kChunkBytes + (e % 4)];
          q = ((e % 8) < 4 ? (byte & 15) : (byte >> 4)) - kQ4Offset;
        } else {
          q = tile[(e / 4) * kChunkBytes + (e % 4)] - kQ8Offset;
        }
        dst[e] = static_cast<float>(q) * scale;
      }
    }
  }
  return out;
}

// Tiles [groups, blocks, tile bytes] as [groups, blocks, chunks, 16 lanes, 4].
at::Tensor LaneView(const BlockQuantWeight& weight) {
  const int64_t chunks = TileBytes(weight.format) / kChunkBytes;
  return weight.values.view(
      {weight.values.size(0), weight.values.size(1), chunks, kGroup, kLaneBytes});
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
  const int64_t blocks = k / kQuantBlock, groups = (n + kGroup - 1) / kGroup;
  const bool q4 = format == BlockFormat::kQ4_0;
  const int64_t tile_bytes = TileBytes(format);
  const at::Tensor w = weight.detach().to(at::kCPU, at::kFloat).contiguous();
  const float* src = w.data_ptr<float>();
  // Half scales reach 65504: weights up to 127 (q8) or 7 (q4) times that.
  const float limit = 65504.0f * (q4 ? 7.0f : 127.0f);
  const int64_t at_index = FirstWeightBeyond(src, n * k, limit);
  if (at_index >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        BlockFormatName(format), " quantisation: weight [", at_index / k, ", ", at_index % k,
        "] is ", src[at_index], " (must be finite with magnitude <= ", limit, ")"));
  }
  BlockQuantWeight out;
  out.format = format;
  out.out_features = n;
  out.in_features = k;
  // Padding rows: the stored zero and scale 0.
  out.scales = at::zeros({groups, blocks, kGroup}, at::kHalf);
  out.values = at::full({groups, blocks, tile_bytes}, q4 ? kQ4Offset * 17 : kQ8Offset, at::kByte);
  at::Half* scales = out.scales.data_ptr<at::Half>();
  uint8_t* tiles = out.values.data_ptr<uint8_t>();
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    int q[kQuantBlock];
    for (int64_t g = begin; g < end; ++g) {
      for (int64_t lane = 0; lane < kGroup && g * kGroup + lane < n; ++lane) {
        const float* row = src + (g * kGroup + lane) * k;
        for (int64_t b = 0; b < blocks; ++b) {
          scales[(g * blocks + b) * kGroup + lane] =
              QuantizeWeightBlock(row + b * kQuantBlock, q4, q);
          uint8_t* tile = tiles + (g * blocks + b) * tile_bytes;
          for (int64_t e = 0; e < kQuantBlock; ++e) {
            if (q4) {
              bool high;
              uint8_t& byte = tile[block_quant::Q4ByteInTile(lane, e, &high)];
              const int stored = q[e] + kQ4Offset;
              byte = high ? (byte & 15) | (stored << 4) : (byte & 0xF0) | stored;
            } else {
              tile[block_quant::Q8ByteInTile(lane, e)] = static_cast<uint8_t>(q[e] + kQ8Offset);
            }
          }
        }
      }
    }
  });
  return out;
}

absl::Status CheckBlockQuantWeight(const BlockQuantWeight& w) {
  const int64_t n = w.out_features, k = w.in_features;
  if (n <= 0 || k <= 0 || k % kQuantBlock != 0) {
    return absl::InvalidArgumentError(absl::StrCat("quantised weight shape [", n, ", ", k,
                                                   "] needs positive sizes, K a multiple of 32"));
  }
  const int64_t groups = (n + kGroup - 1) / kGroup, blocks = k / kQuantBlock;
  const std::vector<int64_t> values_shape = {groups, blocks, TileBytes(w.format)};
  const std::vector<int64_t> scales_shape = {groups, blocks, kGroup};
  const auto ok = [](const at::Tensor& t, at::ScalarType dtype, const std::vector<int64_t>& shape) {
    return t.defined() && t.scalar_type() == dtype && t.sizes() == at::IntArrayRef(shape) &&
           t.is_contiguous();
  };
  if (!ok(w.values, at::kByte, values_shape) || !ok(w.scales, at::kHalf, scales_shape) ||
      w.values.device() != w.scales.device()) {
    return absl::InvalidArgumentError(
        absl::StrCat(BlockFormatName(w.format), " weight [", n, ", ", k, "] must be uint8 values [",
                     absl::StrJoin(values_shape, ", "), "] and float16 scales [",
                     absl::StrJoin(scales_shape, ", "), "], contiguous, on one device"));
  }
  return absl::OkStatus();
}

at::Tensor DequantizeBlockRows(const BlockQuantWeight& weight, const at::Tensor& rows) {
  TORCH_CHECK(weight.defined(), "DequantizeBlockRows: undefined weight");
  using at::indexing::Slice;
  // The index lives where the weight does (a CUDA table is read on its device).
  const at::Tensor index = rows.to(weight.values.device(), at::kLong).contiguous().view({-1});
  if (index.numel() <= 16 && index.device().is_cpu()) return DecodeFewRows(weight, index);
  const at::Tensor groups = at::floor_divide(index, kGroup);
  const at::Tensor lanes = index - groups * kGroup;
  // Only the requested rows' bytes are read: [R, blocks, chunks, 4] and [R, blocks].
  return DecodeRows(LaneView(weight).index({groups, Slice(), Slice(), lanes}),
                    weight.scales.index({groups, Slice(), lanes}), weight.format);
}

at::Tensor DequantizeBlocks(const BlockQuantWeight& weight) {
  TORCH_CHECK(weight.defined(), "DequantizeBlocks: undefined weight");
  const int64_t n = weight.out_features, padded = weight.values.size(0) * kGroup;
  const int64_t blocks = weight.in_features / kQuantBlock;
  const at::Tensor bytes = LaneView(weight).permute({0, 3, 1, 2, 4});  // [groups, 16, ...]
  const at::Tensor scales = weight.scales.permute({0, 2, 1}).reshape({padded, blocks});
  return DecodeRows(bytes.reshape({padded, blocks, bytes.size(3), kLaneBytes}).narrow(0, 0, n),
                    scales.narrow(0, 0, n), weight.format);
}

const char* QuantKernelName(QuantKernel kernel) {
  switch (kernel) {
    case QuantKernel::kPortable:
      return "portable";
    case QuantKernel::kAvx2:
      return "avx2";
    case QuantKernel::kAvx512Vnni:
      return "avx512vnni";
    case QuantKernel::kAmx:
      return "amx";
  }
  return "?";
}

bool QuantKernelAvailable(QuantKernel kernel) {
  switch (kernel) {
    case QuantKernel::kPortable:
      return true;
    case QuantKernel::kAvx2:
      return CpuHasAvx2Fma();  // every AVX2 CPU also has F16C (half scales)
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
    case QuantKernel::kAmx: {
      static const bool has = QuantKernelAvailable(QuantKernel::kAvx512Vnni) && CpuHasAmxInt8();
      return has;
    }
  }
  return false;
}

AmxDispatch SetAmxDispatchForTesting(AmxDispatch dispatch) {
  AmxDispatch previous;
  previous.min_rows = amx_min_rows.exchange(dispatch.min_rows);
  previous.q4_min_outputs = amx_q4_min_outputs.exchange(dispatch.q4_min_outputs);
  return previous;
}

QuantKernel BestQuantKernel() {
  static const QuantKernel best = [] {
    QuantKernel kernel = QuantKernel::kPortable;
    for (QuantKernel k : {QuantKernel::kAvx2, QuantKernel::kAvx512Vnni, QuantKernel::kAmx}) {
      if (QuantKernelAvailable(k)) kernel = k;
    }
    if (const char* forced = std::getenv("LGPT_QUANT_KERNEL")) {
      for (QuantKernel k : {QuantKernel::kPortable, QuantKernel::kAvx2, QuantKernel::kAvx512Vnni,
                            QuantKernel::kAmx}) {
        if (std::string(forced) == QuantKernelName(k) && QuantKernelAvailable(k)) kernel = k;
      }
    }
    return kernel;
  }();
  return best;
}

void QuantizeRows(const float* x, int64_t rows, int64_t k, QuantizedRows* out, QuantKernel kernel) {
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
  TORCH_CHECK(weight.values.device().is_cpu(), "BlockQuantGemv: the weight is on ",
              weight.values.device().str(), ", not the CPU (BlockQuantGemvByParts serves devices)");
  TORCH_CHECK(QuantKernelAvailable(kernel), "BlockQuantGemv: kernel ", QuantKernelName(kernel),
              " is not available on this CPU");
  const int64_t k = weight.in_features;
  // Reused across calls of this thread: no allocation per decoding step.
  thread_local QuantizedRows xq;
  QuantizeRows(x, rows, k, &xq, kernel);
  const bool q4 = weight.format == BlockFormat::kQ4_0;
  GemvArgs args;
  args.w = weight.values.data_ptr<uint8_t>();
  args.ws = reinterpret_cast<const uint16_t*>(weight.scales.data_ptr<at::Half>());
  args.xq = xq.values.data();
  args.xs = xq.scales.data();
  args.xsum = xq.sums.data();
  args.bias = bias;
  args.y = y;
  args.n_out = weight.out_features;
  args.k = k;
  args.blocks = k / kQuantBlock;
  // ~64 KiB of weight bytes per thread at least, as the float kernel.
  const int64_t group_bytes = args.blocks * TileBytes(weight.format);
  const int64_t min_groups = std::max<int64_t>(1, (int64_t{64} << 10) / group_bytes);
  ParallelForRows(weight.values.size(0), 4, min_groups, [&](int64_t begin, int64_t end) {
    GemvRange(kernel, q4, args, rows, begin, end);
  });
}

}  // namespace lgpt
