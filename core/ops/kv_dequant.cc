#include "core/ops/kv_dequant.h"

#include "core/ops/gemv.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define LGPT_DEQUANT_X86 1
#endif

namespace lgpt {
namespace {

#ifdef LGPT_DEQUANT_X86
// One entry: per group, the scale broadcast, then 8 channels at a time (int8: sign-extended
// bytes; int4: the low and high nibbles of 4 bytes interleaved, less 8).
__attribute__((target("avx2,fma,f16c"))) void DecodeEntryAvx2(const uint8_t* entry,
                                                              const paged::EntryFormat& f,
                                                              float* out) {
  const uint8_t* scales = entry + paged::CodeBytes(f);
  const bool int8 = f.kind == paged::EntryKind::kInt8;
  const __m128i low_nibbles = _mm_set1_epi8(0x0f);
  const __m256i eight = _mm256_set1_epi32(8);
  for (int64_t begin = 0; begin < f.head_size; begin += f.group_size) {
    const __m256 scale = _mm256_set1_ps(
        paged::HalfToFloat(paged::LoadAligned<uint16_t>(scales + 2 * (begin / f.group_size))));
    for (int64_t d = begin; d < begin + f.group_size; d += 8) {
      __m256i codes;
      if (int8) {
        codes = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(entry + d)));
      } else {
        int32_t packed;
        __builtin_memcpy(&packed, entry + d / 2, sizeof(packed));
        const __m128i bytes = _mm_cvtsi32_si128(packed);
        const __m128i low = _mm_and_si128(bytes, low_nibbles);
        const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), low_nibbles);
        codes = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_unpacklo_epi8(low, high)), eight);
      }
      _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_cvtepi32_ps(codes), scale));
    }
  }
}
#endif

}  // namespace

void DecodeQuantisedEntries(const uint8_t* entries, int64_t count, int64_t stride,
                            const paged::EntryFormat& format, float* out, bool use_avx2) {
  const int64_t hs = format.head_size;
#ifdef LGPT_DEQUANT_X86
  if (use_avx2 && format.group_size % 8 == 0 && CpuHasAvx2Fma()) {
    for (int64_t e = 0; e < count; ++e) DecodeEntryAvx2(entries + e * stride, format, out + e * hs);
    return;
  }
#endif
  for (int64_t e = 0; e < count; ++e)
    paged::DecodeEntry(entries + e * stride, format, out + e * hs);
}

}  // namespace lgpt
