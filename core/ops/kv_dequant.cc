#include "core/ops/kv_dequant.h"

#include "core/ops/gemv.h"

#if defined(__x86_64__) || defined(_M_X64)
#include "core/ops/kv_dequant_avx2.h"
#define LGPT_DEQUANT_X86 1
#endif

namespace lgpt {
namespace {

#ifdef LGPT_DEQUANT_X86
// One entry, 8 channels at a time.
template <paged::EntryKind K>
__attribute__((target("avx2,fma,f16c"))) void DecodeEntryAvx2(const uint8_t* entry,
                                                              const paged::EntryFormat& f,
                                                              float* out) {
  for (int64_t d = 0; d < f.head_size; d += 8) {
    _mm256_storeu_ps(out + d, simd::LoadQuantised8<K>(entry, f, d));
  }
}
#endif

}  // namespace

void DecodeQuantisedEntries(const uint8_t* entries, int64_t count, int64_t stride,
                            const paged::EntryFormat& format, float* out, bool use_avx2) {
  const int64_t hs = format.head_size;
#ifdef LGPT_DEQUANT_X86
  if (use_avx2 && format.group_size % 8 == 0 && CpuHasAvx2Fma() && CpuHasF16c()) {
    for (int64_t e = 0; e < count; ++e) {
      if (format.kind == paged::EntryKind::kInt8) {
        DecodeEntryAvx2<paged::EntryKind::kInt8>(entries + e * stride, format, out + e * hs);
      } else {
        DecodeEntryAvx2<paged::EntryKind::kInt4>(entries + e * stride, format, out + e * hs);
      }
    }
    return;
  }
#endif
  for (int64_t e = 0; e < count; ++e)
    paged::DecodeEntry(entries + e * stride, format, out + e * hs);
}

}  // namespace lgpt
