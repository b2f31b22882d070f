// The regex pre-tokenizers of byte-level BPE tokenizers (GPT-2, Llama 3, Qwen2), written as
// hand-made scanners over code points. The patterns need a negative lookahead (\s+(?!\S)),
// which RE2 lacks; a scanner that follows the backtracking semantics of each alternative is
// short, fast and has no dependency. Each scanner is checked against Python's `regex` module
// on crafted and random strings (core/text/testdata/pretokenizer_cases.json).
#ifndef LGPT_CORE_TEXT_PRETOKENIZER_H_
#define LGPT_CORE_TEXT_PRETOKENIZER_H_

#include <optional>
#include <vector>

#include "absl/strings/string_view.h"

namespace lgpt {

enum class PretokenizerPattern {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kGpt2,
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
  // \s*[\r\n]+|\s+(?!\S)|\s+
  kLlama3,
  // As kLlama3 with \p{N} (one digit per piece) in place of \p{N}{1,3}.
  kQwen2,
};

// The regex source of `pattern`, exactly as tokenizer.json files spell it.
absl::string_view PatternRegex(PretokenizerPattern pattern);

// The pattern whose regex source is `regex`, if it is one of the known ones.
std::optional<PretokenizerPattern> PatternFromRegex(absl::string_view regex);

// Splits well-formed UTF-8 into the consecutive matches of `pattern` (these patterns match
// every character, so the pieces cover `text`). Pieces point into `text`.
std::vector<absl::string_view> SplitByPattern(PretokenizerPattern pattern, absl::string_view text);

}  // namespace lgpt

#endif  // LGPT_CORE_TEXT_PRETOKENIZER_H_
