// Quantised KV pool entries (core/ops/paged_attention_layout.h: int8 / int4 codes, then a
// float16 scale per group of channels) decoded to float32 rows on the CPU, for the attention
// kernels that read float32: AVX2 with run-time dispatch where the groups are whole multiples of
// 8 channels, paged::DecodeEntry's loops elsewhere. Bit for bit paged::DecodeEntry (an exact
// integer-to-float conversion and one multiplication a channel either way).
#ifndef LGPT_CORE_OPS_KV_DEQUANT_H_
#define LGPT_CORE_OPS_KV_DEQUANT_H_

#include <cstdint>

#include "core/ops/paged_attention_layout.h"

namespace lgpt {

// out[e * head_size + d] = channel d of entry e, for `count` entries of `format` (int8 or int4)
// starting at `entries`, one every `stride` bytes. `use_avx2` false forces the portable loops
// (tests).
void DecodeQuantisedEntries(const uint8_t* entries, int64_t count, int64_t stride,
                            const paged::EntryFormat& format, float* out, bool use_avx2 = true);

}  // namespace lgpt

#endif  // LGPT_CORE_OPS_KV_DEQUANT_H_
