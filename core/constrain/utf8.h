// UTF-8 helpers of the constrained-decoding compilers: decoding one code point, encoding one,
// and code point ranges as sequences of byte ranges (what a byte-level automaton matches).
#ifndef LGPT_CORE_CONSTRAIN_UTF8_H_
#define LGPT_CORE_CONSTRAIN_UTF8_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace lgpt {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// Decodes the code point at text[*pos] and advances *pos past it; false (and *pos unchanged)
// for an ill-formed sequence, a surrogate, an overlong form or the end of the text.
bool DecodeUtf8(absl::string_view text, size_t* pos, uint32_t* code_point);

// Appends the UTF-8 bytes of a code point (<= kMaxCodePoint, not a surrogate).
void AppendUtf8(uint32_t code_point, std::string* out);

// Inclusive byte ranges, one per byte of a character.
using ByteRangeSequence = std::vector<std::pair<uint8_t, uint8_t>>;

// The UTF-8 encodings of the code points in [lo, hi] (surrogates left out) as a union of
// byte-range sequences: a string of bytes is the encoding of such a code point exactly when it
// matches one of the sequences. Appends to *out.
void Utf8RangeSequences(uint32_t lo, uint32_t hi, std::vector<ByteRangeSequence>* out);

// Sorted, merged (touching ranges joined) copy of inclusive code point ranges.
std::vector<std::pair<uint32_t, uint32_t>> NormalizeRanges(
    std::vector<std::pair<uint32_t, uint32_t>> ranges);

// The code points of [0, kMaxCodePoint] outside the (normalized) ranges.
std::vector<std::pair<uint32_t, uint32_t>> ComplementRanges(
    const std::vector<std::pair<uint32_t, uint32_t>>& ranges);

}  // namespace lgpt

#endif  // LGPT_CORE_CONSTRAIN_UTF8_H_
