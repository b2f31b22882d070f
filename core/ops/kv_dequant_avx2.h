// Eight channels of a quantised KV entry (core/ops/paged_attention_layout.h: int8 / int4 codes,
// then a float16 scale per group) dequantised in an AVX2 register: float(code) · scale, the
// exact integer conversion and one rounding, as paged::DecodeEntry computes each channel. Shared
// by the row decoder (kv_dequant.cc) and the decode attention kernels that read quantised pool
// blocks in place (decode_attention.cc), so both give the same bits. Include only where the
// x86 intrinsics are available (LGPT_SIMD_AVX2).
#ifndef LGPT_CORE_OPS_KV_DEQUANT_AVX2_H_
#define LGPT_CORE_OPS_KV_DEQUANT_AVX2_H_

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/ops/paged_attention_layout.h"

namespace lgpt {
namespace simd {

// Channels [d, d + 8) of `entry` (d a multiple of 8; the group size a multiple of 8, so the
// eight share one scale).
template <paged::EntryKind K>
__attribute__((target("avx2,fma,f16c"))) inline __m256 LoadQuantised8(const uint8_t* entry,
                                                                      const paged::EntryFormat& f,
                                                                      int64_t d) {
  uint16_t scale_bits;
  std::memcpy(&scale_bits, entry + paged::CodeBytes(f) + 2 * (d / f.group_size), 2);
  const __m256 scale = _mm256_set1_ps(_cvtsh_ss(scale_bits));
  __m256i codes;
  if constexpr (K == paged::EntryKind::kInt8) {
    codes = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(entry + d)));
  } else {
    // Four bytes: channel 2i in the low nibble of byte i, 2i + 1 in the high one, each q + 8.
    int32_t packed;
    std::memcpy(&packed, entry + d / 2, sizeof(packed));
    const __m128i bytes = _mm_cvtsi32_si128(packed);
    const __m128i nibble = _mm_set1_epi8(0x0f);
    const __m128i low = _mm_and_si128(bytes, nibble);
    const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
    codes =
        _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_unpacklo_epi8(low, high)), _mm256_set1_epi32(8));
  }
  return _mm256_mul_ps(_mm256_cvtepi32_ps(codes), scale);
}

}  // namespace simd
}  // namespace lgpt

#endif  // LGPT_CORE_OPS_KV_DEQUANT_AVX2_H_
