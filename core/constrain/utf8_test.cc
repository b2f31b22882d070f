#include "core/constrain/utf8.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace lgpt {
namespace {

bool Matches(const ByteRangeSequence& sequence, const std::string& bytes) {
  if (sequence.size() != bytes.size()) return false;
  for (size_t k = 0; k < bytes.size(); ++k) {
    const uint8_t b = static_cast<uint8_t>(bytes[k]);
    if (b < sequence[k].first || b > sequence[k].second) return false;
  }
  return true;
}

TEST(Utf8Test, DecodeRoundTripsAndRefusesIllFormed) {
  for (uint32_t c :
       {0u, 0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xD7FFu, 0xE000u, 0xFFFFu, 0x10000u, 0x10FFFFu}) {
    std::string bytes;
    AppendUtf8(c, &bytes);
    size_t pos = 0;
    uint32_t decoded = 0;
    ASSERT_TRUE(DecodeUtf8(bytes, &pos, &decoded)) << c;
    EXPECT_EQ(decoded, c);
    EXPECT_EQ(pos, bytes.size());
  }
  for (const char* bad :
       {"\x80", "\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xE2\x82", "\xFF"}) {
    size_t pos = 0;
    uint32_t c;
    EXPECT_FALSE(DecodeUtf8(bad, &pos, &c)) << bad;
    EXPECT_EQ(pos, 0u);
  }
}

// A code point is in [lo, hi] exactly when its encoding matches one of the sequences.
TEST(Utf8Test, RangeSequencesMatchExactlyTheRange) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    uint32_t a = rng() % 0x110000, b = rng() % 0x110000;
    if (trial % 2 == 0) b = a + rng() % 3000;
    if (a > b) std::swap(a, b);
    std::vector<ByteRangeSequence> sequences;
    Utf8RangeSequences(a, b, &sequences);
    for (int probe = 0; probe < 200; ++probe) {
      uint32_t c = probe % 2 ? a + rng() % (b - a + 1) : rng() % 0x110000;
      if (probe % 7 == 0) c = a > 0 ? a - 1 : b + 1;
      if (c >= 0xD800 && c <= 0xDFFF) continue;
      if (c > kMaxCodePoint) continue;
      std::string bytes;
      AppendUtf8(c, &bytes);
      bool matched = false;
      for (const ByteRangeSequence& s : sequences) matched = matched || Matches(s, bytes);
      EXPECT_EQ(matched, c >= a && c <= b) << std::hex << c << " in " << a << "-" << b;
    }
  }
}

TEST(Utf8Test, ComplementAndNormalize) {
  EXPECT_EQ(NormalizeRanges({{5, 9}, {1, 3}, {4, 4}, {20, 30}, {25, 26}}),
            (std::vector<std::pair<uint32_t, uint32_t>>{{1, 9}, {20, 30}}));
  EXPECT_EQ(ComplementRanges({{0, 9}, {20, 30}}),
            (std::vector<std::pair<uint32_t, uint32_t>>{{10, 19}, {31, kMaxCodePoint}}));
  EXPECT_TRUE(ComplementRanges({{0, kMaxCodePoint}}).empty());
}

}  // namespace
}  // namespace lgpt
