#include "core/io/crc32.h"

#include <zlib.h>

#include <cstddef>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace lgpt {
namespace crc32_internal {

uint32_t Crc32Portable(const void* data, size_t size, uint32_t crc) {
  if (size == 0) return crc;  // crc32_z(crc, nullptr, 0) would return 0, not crc.
  return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), size));
}

bool HasClmul() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return has;
#else
  return false;
#endif
}

}  // namespace crc32_internal

namespace {

#if defined(__x86_64__)
// Compiled for PCLMULQDQ and SSE4.1 whatever the build's -m flags; only called after
// HasClmul() said the CPU has them.
#define LGPT_CLMUL __attribute__((target("pclmul,sse4.1")))

LGPT_CLMUL inline __m128i Load(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// Moves the 128 bits of `x` forward over the distance whose constants `k` holds, as a value
// to xor into the block there (CRC is linear: the remainder does not change).
LGPT_CLMUL inline __m128i Fold(__m128i x, __m128i k) {
  return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

// The CRC register after `size` bytes (at least 64, a multiple of 16) from register `reg`
// (the pre-inverted CRC), by folding with carry-less multiplication: Gopal et al., "Fast CRC
// Computation for Generic Polynomials Using PCLMULQDQ Instruction" (Intel, 2009), in the
// bit-reflected domain. Four independent 128-bit lanes keep the multiplier busy; they are
// folded into one at the end, and 128 bits are reduced to 32 by Barrett reduction.
LGPT_CLMUL uint32_t FoldClmul(const uint8_t* p, size_t size, uint32_t reg) {
  // Powers of x modulo the zip polynomial 0x04C11DB7, bit-reflected as the paper gives them
  // (and as Linux's crc32-pclmul uses them): fold over 512 bits, over 128 bits, 64 -> 32 bits,
  // and Barrett's mu and P.
  const __m128i by_512 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
  const __m128i by_128 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
  const __m128i by_64 = _mm_set_epi64x(0, 0x0163cd6124);
  const __m128i barrett = _mm_set_epi64x(0x01f7011641, 0x01db710641);
  const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);

  __m128i a = _mm_xor_si128(Load(p), _mm_cvtsi32_si128(static_cast<int>(reg)));
  __m128i b = Load(p + 16), c = Load(p + 32), d = Load(p + 48);
  p += 64;
  size -= 64;
  for (; size >= 64; p += 64, size -= 64) {
    a = _mm_xor_si128(Fold(a, by_512), Load(p));
    b = _mm_xor_si128(Fold(b, by_512), Load(p + 16));
    c = _mm_xor_si128(Fold(c, by_512), Load(p + 32));
    d = _mm_xor_si128(Fold(d, by_512), Load(p + 48));
  }
  a = _mm_xor_si128(Fold(a, by_128), b);
  a = _mm_xor_si128(Fold(a, by_128), c);
  a = _mm_xor_si128(Fold(a, by_128), d);
  for (; size >= 16; p += 16, size -= 16) a = _mm_xor_si128(Fold(a, by_128), Load(p));

  // 128 -> 96 -> 64 bits.
  a = _mm_xor_si128(_mm_srli_si128(a, 8), _mm_clmulepi64_si128(a, by_128, 0x10));
  a = _mm_xor_si128(_mm_srli_si128(a, 4),
                    _mm_clmulepi64_si128(_mm_and_si128(a, low32), by_64, 0x00));
  // Barrett: q = floor(a / P) from mu, then a - q * P (xor) leaves the remainder in bits 32..63.
  __m128i q = _mm_clmulepi64_si128(_mm_and_si128(a, low32), barrett, 0x10);
  q = _mm_clmulepi64_si128(_mm_and_si128(q, low32), barrett, 0x00);
  return static_cast<uint32_t>(_mm_extract_epi32(_mm_xor_si128(a, q), 1));
}
#endif  // defined(__x86_64__)

}  // namespace

uint32_t Crc32(const void* data, size_t size, uint32_t crc) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
#if defined(__x86_64__)
  if (size >= 64 && crc32_internal::HasClmul()) {
    const size_t folded = size & ~size_t{15};
    crc = ~FoldClmul(p, folded, ~crc);
    p += folded;
    size -= folded;
  }
#endif
  return crc32_internal::Crc32Portable(p, size, crc);
}

uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t size_b) {
  return static_cast<uint32_t>(crc32_combine(crc_a, crc_b, static_cast<z_off_t>(size_b)));
}

}  // namespace lgpt
