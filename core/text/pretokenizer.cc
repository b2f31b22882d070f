#include "core/text/pretokenizer.h"

#include <cstddef>

#include "core/text/tokenizer_unicode.h"

namespace lgpt {
namespace {

constexpr absl::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr absl::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr absl::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

enum class Class { kLetter, kNumber, kSpace, kOther };

// The text as code points with their classes and byte offsets (offsets[n] == text.size()).
struct Chars {
  explicit Chars(absl::string_view text) {
    size_t pos = 0;
    while (pos < text.size()) {
      offsets.push_back(pos);
      char32_t c;
      if (!NextCodePoint(text, &pos, &c)) {  // callers validate; be safe anyway
        c = kReplacementCharacter;
        ++pos;
      }
      cps.push_back(c);
      classes.push_back(IsLetter(c)       ? Class::kLetter
                        : IsNumber(c)     ? Class::kNumber
                        : IsWhitespace(c) ? Class::kSpace
                                          : Class::kOther);
    }
    offsets.push_back(text.size());
  }
  size_t size() const { return cps.size(); }
  std::vector<char32_t> cps;
  std::vector<Class> classes;
  std::vector<size_t> offsets;
};

// Length (in code points) of a contraction 's 't 're 've 'm 'll 'd at i, or 0.
size_t Contraction(const Chars& t, size_t i, bool ignore_case) {
  const size_t n = t.size();
  if (t.cps[i] != '\'' || i + 1 >= n) return 0;
  auto is = [&](size_t k, char lower) {
    if (k >= n) return false;
    const char32_t c = t.cps[k];
    if (c == static_cast<char32_t>(lower)) return true;
    if (!ignore_case) return false;
    if (c == static_cast<char32_t>(lower - 'a' + 'A')) return true;
    return lower == 's' && c == 0x17F;  // LATIN SMALL LETTER LONG S case-folds to s
  };
  if (is(i + 1, 's') || is(i + 1, 't') || is(i + 1, 'm') || is(i + 1, 'd')) return 2;
  if ((is(i + 1, 'r') || is(i + 1, 'v')) && is(i + 2, 'e')) return 3;
  if (is(i + 1, 'l') && is(i + 2, 'l')) return 3;
  return 0;
}

size_t RunOf(const Chars& t, size_t i, Class c) {
  while (i < t.size() && t.classes[i] == c) ++i;
  return i;
}

// \s+(?!\S) then \s+ at a whitespace character i: the run up to its end when it ends the
// text, else all but its last character (which goes with what follows), else the single one.
size_t WhitespaceTail(const Chars& t, size_t i) {
  const size_t end = RunOf(t, i, Class::kSpace);
  if (end == t.size()) return end;
  if (end - i >= 2) return end - 1;
  return end;
}

// One match of the GPT-2 pattern at i; returns its end.
size_t MatchGpt2(const Chars& t, size_t i) {
  if (size_t len = Contraction(t, i, /*ignore_case=*/false)) return i + len;
  size_t j = i;
  if (t.cps[j] == ' ' && j + 1 < t.size() && t.classes[j + 1] != Class::kSpace) ++j;
  switch (t.classes[j]) {
    case Class::kLetter:
    case Class::kNumber:
    case Class::kOther:
      return RunOf(t, j, t.classes[j]);
    case Class::kSpace:
      break;
  }
  return WhitespaceTail(t, i);
}

// One match of the Llama 3 / Qwen2 pattern at i; returns its end.
size_t MatchLlama3(const Chars& t, size_t i, size_t max_digits) {
  const size_t n = t.size();
  if (size_t len = Contraction(t, i, /*ignore_case=*/true)) return i + len;
  const char32_t c = t.cps[i];
  const Class cls = t.classes[i];
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (cls == Class::kLetter) return RunOf(t, i, Class::kLetter);
  if (cls != Class::kNumber && c != '\r' && c != '\n' && i + 1 < n &&
      t.classes[i + 1] == Class::kLetter) {
    return RunOf(t, i + 1, Class::kLetter);
  }
  // \p{N}{1,3} or \p{N}
  if (cls == Class::kNumber) {
    size_t j = i;
    while (j < n && j - i < max_digits && t.classes[j] == Class::kNumber) ++j;
    return j;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  size_t j = i;
  if (c == ' ' && j + 1 < n && t.classes[j + 1] == Class::kOther) ++j;
  if (t.classes[j] == Class::kOther) {
    j = RunOf(t, j, Class::kOther);
    while (j < n && (t.cps[j] == '\r' || t.cps[j] == '\n')) ++j;
    return j;
  }
  // \s*[\r\n]+ : through the last line break of the whitespace run.
  const size_t end = RunOf(t, i, Class::kSpace);
  for (size_t k = end; k > i; --k) {
    if (t.cps[k - 1] == '\r' || t.cps[k - 1] == '\n') return k;
  }
  return WhitespaceTail(t, i);
}

}  // namespace

absl::string_view PatternRegex(PretokenizerPattern pattern) {
  switch (pattern) {
    case PretokenizerPattern::kGpt2:
      return kGpt2Regex;
    case PretokenizerPattern::kLlama3:
      return kLlama3Regex;
    case PretokenizerPattern::kQwen2:
      return kQwen2Regex;
  }
  return {};
}

std::optional<PretokenizerPattern> PatternFromRegex(absl::string_view regex) {
  for (PretokenizerPattern p :
       {PretokenizerPattern::kGpt2, PretokenizerPattern::kLlama3, PretokenizerPattern::kQwen2}) {
    if (regex == PatternRegex(p)) return p;
  }
  return std::nullopt;
}

std::vector<absl::string_view> SplitByPattern(PretokenizerPattern pattern, absl::string_view text) {
  const Chars t(text);
  std::vector<absl::string_view> pieces;
  size_t i = 0;
  while (i < t.size()) {
    size_t end;
    switch (pattern) {
      case PretokenizerPattern::kGpt2:
        end = MatchGpt2(t, i);
        break;
      case PretokenizerPattern::kLlama3:
        end = MatchLlama3(t, i, 3);
        break;
      case PretokenizerPattern::kQwen2:
      default:
        end = MatchLlama3(t, i, 1);
        break;
    }
    pieces.push_back(text.substr(t.offsets[i], t.offsets[end] - t.offsets[i]));
    i = end;
  }
  return pieces;
}

}  // namespace lgpt
