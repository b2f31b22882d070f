#include "core/ops/kv_dequant.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/ops/paged_attention_layout.h"

namespace lgpt {
namespace {

using paged::EntryFormat;
using paged::EntryKind;

// Both paths equal paged::DecodeEntry to the bit, over strided entries of every code (the
// extremes of int8 and int4 included), scales small, large and zero, for several groupings.
TEST(KVDequantTest, EveryPathIsDecodeEntryBitForBit) {
  std::mt19937 random(4);
  std::uniform_int_distribution<int> byte(0, 255);
  for (const EntryFormat format :
       {EntryFormat{EntryKind::kInt8, 64, 32}, EntryFormat{EntryKind::kInt4, 64, 32},
        EntryFormat{EntryKind::kInt8, 128, 8}, EntryFormat{EntryKind::kInt4, 96, 16},
        EntryFormat{EntryKind::kInt8, 12, 6}, EntryFormat{EntryKind::kInt4, 10, 2}}) {
    const int64_t entry_bytes = paged::EntryBytes(format), stride = entry_bytes + 6, count = 37;
    std::vector<uint8_t> entries(static_cast<size_t>(count * stride));
    for (uint8_t& b : entries) b = static_cast<uint8_t>(byte(random));
    const uint16_t scales[] = {0x3c00, 0x0001, 0x7bff, 0x0000, 0x2e66, 0xb800};  // 1, tiny, max, 0
    for (int64_t e = 0; e < count; ++e) {
      uint8_t* entry = entries.data() + e * stride;
      if (e == 0)
        std::memset(entry, format.kind == EntryKind::kInt8 ? 0x80 : 0x00, paged::CodeBytes(format));
      if (e == 1)
        std::memset(entry, format.kind == EntryKind::kInt8 ? 0x7f : 0xff, paged::CodeBytes(format));
      for (int64_t g = 0; g < format.head_size / format.group_size; ++g) {
        paged::StoreAligned<uint16_t>(entry + paged::CodeBytes(format) + 2 * g,
                                      scales[(e + g) % 6]);
      }
    }
    std::vector<float> expected(static_cast<size_t>(count * format.head_size));
    for (int64_t e = 0; e < count; ++e) {
      paged::DecodeEntry(entries.data() + e * stride, format,
                         expected.data() + e * format.head_size);
    }
    for (const bool avx2 : {false, true}) {
      std::vector<float> out(expected.size(), -1.0f);
      DecodeQuantisedEntries(entries.data(), count, stride, format, out.data(), avx2);
      EXPECT_EQ(std::memcmp(out.data(), expected.data(), out.size() * sizeof(float)), 0)
          << static_cast<int>(format.kind) << " head " << format.head_size << " group "
          << format.group_size << (avx2 ? " avx2" : " portable");
    }
  }
}

}  // namespace
}  // namespace lgpt
