#include "core/text/tokenizer_unicode.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <unordered_map>

#include "absl/strings/str_cat.h"

namespace lgpt {
namespace {

struct CodePointRange {
  char32_t first;
  char32_t last;
};

struct CombiningClassRange {
  char32_t first;
  char32_t last;
  uint8_t combining_class;
};

// `second` is 0 for singleton decompositions; `composable` marks primary composites.
struct Decomposition {
  char32_t code_point;
  char32_t first;
  char32_t second;
  bool composable;
};

#include "core/text/tokenizer_unicode_data.inc"

template <size_t N>
bool InRanges(const CodePointRange (&ranges)[N], char32_t c) {
  const CodePointRange* end = ranges + N;
  const CodePointRange* it = std::upper_bound(
      ranges, end, c, [](char32_t value, const CodePointRange& r) { return value < r.first; });
  return it != ranges && c <= std::prev(it)->last;
}

enum class Sequence { kValid, kTruncated, kInvalid };

// Looks at the UTF-8 sequence starting at `p` (n >= 1 bytes available). kValid: `*length`
// bytes form a character. kTruncated: the n bytes are a proper prefix of some character.
// kInvalid: the first `*length` bytes are a maximal ill-formed subpart (Unicode's
// "substitution of maximal subparts", which Rust's from_utf8_lossy follows).
Sequence ScanSequence(const unsigned char* p, size_t n, size_t* length) {
  const unsigned char b0 = p[0];
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
  if (b0 < 0x80) {
    *length = 1;
    return Sequence::kValid;
  } else if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    *length = 1;
    return Sequence::kInvalid;
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= n) {
      *length = n;
      return Sequence::kTruncated;
    }
    const unsigned char b = p[i];
    const bool ok = i == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) {
      *length = i;
      return Sequence::kInvalid;
    }
  }
  *length = need;
  return Sequence::kValid;
}

char32_t DecodeValid(const unsigned char* p, size_t length) {
  switch (length) {
    case 1:
      return p[0];
    case 2:
      return ((p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    case 3:
      return ((p[0] & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    default:
      return ((p[0] & 0x07) << 18) | ((p[1] & 0x3F) << 12) | ((p[2] & 0x3F) << 6) | (p[3] & 0x3F);
  }
}

uint8_t CombiningClass(char32_t c) {
  if (c < 0x300) return 0;
  constexpr size_t n = std::size(kCombiningClassRanges);
  const CombiningClassRange* end = kCombiningClassRanges + n;
  const CombiningClassRange* it = std::upper_bound(
      kCombiningClassRanges, end, c,
      [](char32_t value, const CombiningClassRange& r) { return value < r.first; });
  if (it == kCombiningClassRanges) return 0;
  --it;
  return c <= it->last ? it->combining_class : 0;
}

const Decomposition* FindDecomposition(char32_t c) {
  constexpr size_t n = std::size(kDecompositions);
  const Decomposition* end = kDecompositions + n;
  const Decomposition* it =
      std::lower_bound(kDecompositions, end, c,
                       [](const Decomposition& d, char32_t value) { return d.code_point < value; });
  return it != end && it->code_point == c ? it : nullptr;
}

constexpr char32_t kHangulSBase = 0xAC00, kHangulLBase = 0x1100, kHangulVBase = 0x1161,
                   kHangulTBase = 0x11A7;
constexpr int kHangulLCount = 19, kHangulVCount = 21, kHangulTCount = 28;
constexpr int kHangulNCount = kHangulVCount * kHangulTCount;
constexpr int kHangulSCount = kHangulLCount * kHangulNCount;

void Decompose(char32_t c, std::vector<char32_t>* out) {
  if (c >= kHangulSBase && c < kHangulSBase + kHangulSCount) {
    const int s = c - kHangulSBase;
    out->push_back(kHangulLBase + s / kHangulNCount);
    out->push_back(kHangulVBase + (s % kHangulNCount) / kHangulTCount);
    if (s % kHangulTCount != 0) out->push_back(kHangulTBase + s % kHangulTCount);
    return;
  }
  const Decomposition* d = FindDecomposition(c);
  if (d == nullptr) {
    out->push_back(c);
    return;
  }
  Decompose(d->first, out);
  if (d->second != 0) Decompose(d->second, out);
}

// Primary composite of (first, second), or 0.
char32_t Compose(char32_t first, char32_t second) {
  if (first >= kHangulLBase && first < kHangulLBase + kHangulLCount && second >= kHangulVBase &&
      second < kHangulVBase + kHangulVCount) {
    return kHangulSBase +
           ((first - kHangulLBase) * kHangulVCount + (second - kHangulVBase)) * kHangulTCount;
  }
  if (first >= kHangulSBase && first < kHangulSBase + kHangulSCount &&
      (first - kHangulSBase) % kHangulTCount == 0 && second > kHangulTBase &&
      second < kHangulTBase + kHangulTCount) {
    return first + (second - kHangulTBase);
  }
  static const auto* pairs = [] {
    auto* map = new std::unordered_map<uint64_t, char32_t>();
    for (const Decomposition& d : kDecompositions) {
      if (d.composable) (*map)[(uint64_t{d.first} << 32) | d.second] = d.code_point;
    }
    return map;
  }();
  auto it = pairs->find((uint64_t{first} << 32) | second);
  return it == pairs->end() ? 0 : it->second;
}

}  // namespace

bool NextCodePoint(absl::string_view text, size_t* pos, char32_t* code_point) {
  if (*pos >= text.size()) return false;
  const auto* p = reinterpret_cast<const unsigned char*>(text.data()) + *pos;
  size_t length;
  if (ScanSequence(p, text.size() - *pos, &length) != Sequence::kValid) return false;
  *code_point = DecodeValid(p, length);
  *pos += length;
  return true;
}

absl::Status CheckUtf8(absl::string_view text, absl::string_view what) {
  size_t pos = 0;
  char32_t c;
  while (pos < text.size()) {
    if (!NextCodePoint(text, &pos, &c)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " is not valid UTF-8 (bad byte sequence at byte ", pos, ")"));
    }
  }
  return absl::OkStatus();
}

std::vector<char32_t> ToCodePoints(absl::string_view text) {
  std::vector<char32_t> out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    char32_t c;
    if (NextCodePoint(text, &pos, &c)) {
      out.push_back(c);
    } else {
      out.push_back(kReplacementCharacter);
      ++pos;
    }
  }
  return out;
}

void AppendUtf8(char32_t c, std::string* out) {
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

std::string ToUtf8(const std::vector<char32_t>& code_points) {
  std::string out;
  out.reserve(code_points.size());
  for (char32_t c : code_points) AppendUtf8(c, &out);
  return out;
}

size_t CountCodePoints(absl::string_view text) {
  size_t n = 0;
  for (char ch : text) {
    if ((static_cast<unsigned char>(ch) & 0xC0) != 0x80) ++n;
  }
  return n;
}

bool IsLetter(char32_t c) {
  if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
  return InRanges(kLetterRanges, c);
}

bool IsNumber(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return InRanges(kNumberRanges, c);
}

bool IsMark(char32_t c) { return c >= 0x300 && InRanges(kMarkRanges, c); }

bool IsPunctuation(char32_t c) { return InRanges(kPunctuationRanges, c); }

bool IsWhitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool IsWordChar(char32_t c) {
  // Alphabetic, marks, digits, connector punctuation (Pc) and the joiners.
  return IsLetter(c) || IsNumber(c) || IsMark(c) || c == '_' || c == 0x203F || c == 0x2040 ||
         c == 0x2054 || c == 0xFE33 || c == 0xFE34 || (c >= 0xFE4D && c <= 0xFE4F) || c == 0xFF3F ||
         c == 0x200C || c == 0x200D;
}

std::string NormalizeNfc(absl::string_view text) {
  // Below U+0300 (lead bytes under 0xCC) every string is already in NFC.
  bool quick = true;
  for (char ch : text) {
    if (static_cast<unsigned char>(ch) >= 0xCC) {
      quick = false;
      break;
    }
  }
  if (quick) return std::string(text);

  std::vector<char32_t> chars;
  chars.reserve(text.size());
  for (char32_t c : ToCodePoints(text)) Decompose(c, &chars);

  // Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < chars.size();) {
    if (CombiningClass(chars[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < chars.size() && CombiningClass(chars[j]) != 0) ++j;
    std::stable_sort(chars.begin() + i, chars.begin() + j,
                     [](char32_t a, char32_t b) { return CombiningClass(a) < CombiningClass(b); });
    i = j;
  }

  // Canonical composition (UAX #15).
  if (chars.empty()) return std::string();
  std::vector<char32_t> out;
  out.reserve(chars.size());
  out.push_back(chars[0]);
  size_t starter = 0;
  int last_class = CombiningClass(chars[0]);
  if (last_class != 0) last_class = 256;  // no starter yet: nothing may compose
  for (size_t i = 1; i < chars.size(); ++i) {
    const char32_t c = chars[i];
    const int c_class = CombiningClass(c);
    const char32_t composite = last_class == 256 ? 0 : Compose(out[starter], c);
    if (composite != 0 && (last_class < c_class || last_class == 0)) {
      out[starter] = composite;
      continue;
    }
    if (c_class == 0) starter = out.size();
    last_class = c_class;
    out.push_back(c);
  }
  return ToUtf8(out);
}

Utf8State ClassifyUtf8(absl::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t length;
    switch (ScanSequence(p + pos, bytes.size() - pos, &length)) {
      case Sequence::kValid:
        pos += length;
        break;
      case Sequence::kTruncated:
        return Utf8State::kIncomplete;
      case Sequence::kInvalid:
        return Utf8State::kInvalid;
    }
  }
  return Utf8State::kComplete;
}

void Utf8LossyStream::Append(absl::string_view bytes, std::string* out) {
  pending_.append(bytes.data(), bytes.size());
  Drain(/*at_end=*/false, out);
}

void Utf8LossyStream::Finish(std::string* out) { Drain(/*at_end=*/true, out); }

void Utf8LossyStream::Drain(bool at_end, std::string* out) {
  const auto* p = reinterpret_cast<const unsigned char*>(pending_.data());
  size_t pos = 0;
  while (pos < pending_.size()) {
    size_t length;
    const Sequence s = ScanSequence(p + pos, pending_.size() - pos, &length);
    if (s == Sequence::kValid) {
      out->append(pending_, pos, length);
    } else if (s == Sequence::kInvalid || at_end) {
      AppendUtf8(kReplacementCharacter, out);
    } else {
      break;  // a character cut short: wait for its remaining bytes
    }
    pos += length;
  }
  pending_.erase(0, pos);
}

}  // namespace lgpt
