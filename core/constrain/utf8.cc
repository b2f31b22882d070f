#include "core/constrain/utf8.h"

#include <algorithm>

namespace lgpt {

bool DecodeUtf8(absl::string_view text, size_t* pos, uint32_t* code_point) {
  size_t i = *pos;
  if (i >= text.size()) return false;
  const uint8_t lead = static_cast<uint8_t>(text[i]);
  int length;
  uint32_t value;
  if (lead < 0x80) {
    length = 1;
    value = lead;
  } else if ((lead & 0xE0) == 0xC0) {
    length = 2;
    value = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3;
    value = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4;
    value = lead & 0x07;
  } else {
    return false;
  }
  if (i + length > text.size()) return false;
  for (int k = 1; k < length; ++k) {
    const uint8_t byte = static_cast<uint8_t>(text[i + k]);
    if ((byte & 0xC0) != 0x80) return false;
    value = (value << 6) | (byte & 0x3F);
  }
  static constexpr uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (value < kSmallest[length] || value > kMaxCodePoint) return false;
  if (value >= 0xD800 && value <= 0xDFFF) return false;
  *pos = i + length;
  *code_point = value;
  return true;
}

void AppendUtf8(uint32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

namespace {

// [lo, hi] holds code points of one encoded length and no surrogate.
void SameLengthSequences(uint32_t lo, uint32_t hi, std::vector<ByteRangeSequence>* out) {
  std::string a, b;
  AppendUtf8(lo, &a);
  AppendUtf8(hi, &b);
  const int length = static_cast<int>(a.size());
  // Split until every byte position but the first spans its whole continuation range where the
  // positions before it differ: then the set is a product of byte ranges.
  for (int k = 1; k < length; ++k) {
    const uint32_t mask = (1u << (6 * k)) - 1;  // the low k continuation bytes
    if ((lo & ~mask) != (hi & ~mask)) {
      if ((lo & mask) != 0) {
        SameLengthSequences(lo, lo | mask, out);
        SameLengthSequences((lo | mask) + 1, hi, out);
        return;
      }
      if ((hi & mask) != mask) {
        SameLengthSequences(lo, (hi & ~mask) - 1, out);
        SameLengthSequences(hi & ~mask, hi, out);
        return;
      }
    }
  }
  ByteRangeSequence sequence;
  for (int k = 0; k < length; ++k) {
    sequence.emplace_back(static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k]));
  }
  out->push_back(std::move(sequence));
}

}  // namespace

void Utf8RangeSequences(uint32_t lo, uint32_t hi, std::vector<ByteRangeSequence>* out) {
  static constexpr std::pair<uint32_t, uint32_t> kPieces[] = {
      {0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF}, {0x10000, kMaxCodePoint}};
  hi = std::min(hi, kMaxCodePoint);
  for (const auto& [piece_lo, piece_hi] : kPieces) {
    const uint32_t a = std::max(lo, piece_lo), b = std::min(hi, piece_hi);
    if (a <= b) SameLengthSequences(a, b, out);
  }
}

std::vector<std::pair<uint32_t, uint32_t>> NormalizeRanges(
    std::vector<std::pair<uint32_t, uint32_t>> ranges) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (const auto& [lo, hi] : ranges) {
    if (lo > hi) continue;
    if (!merged.empty() && lo <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, hi);
    } else {
      merged.emplace_back(lo, hi);
    }
  }
  return merged;
}

std::vector<std::pair<uint32_t, uint32_t>> ComplementRanges(
    const std::vector<std::pair<uint32_t, uint32_t>>& ranges) {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : NormalizeRanges(ranges)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
    if (hi >= kMaxCodePoint) return out;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

}  // namespace lgpt
