#include "core/constrain/regex.h"

#include <algorithm>
#include <cctype>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "core/constrain/utf8.h"

namespace lgpt {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

// Groups in groups (the parser recurses); each becomes up to three nested GBNF groups.
constexpr int kMaxNesting = 64;

// A piece of the pattern as GBNF, and whether it matches the empty text.
struct Fragment {
  std::string gbnf;
  bool nullable = false;
};

const Ranges& DigitRanges() {
  static const Ranges* const ranges = new Ranges{{'0', '9'}};
  return *ranges;
}
const Ranges& WordRanges() {
  static const Ranges* const ranges = new Ranges{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return *ranges;
}
const Ranges& SpaceRanges() {  // RE2's \s
  static const Ranges* const ranges = new Ranges{{'\t', '\n'}, {'\f', '\r'}, {' ', ' '}};
  return *ranges;
}

void Append(const Ranges& from, Ranges* to) { to->insert(to->end(), from.begin(), from.end()); }

class RegexParser {
 public:
  RegexParser(absl::string_view pattern, absl::string_view field, RegexText text)
      : pattern_(pattern), field_(field), text_(text) {}

  absl::StatusOr<std::string> Parse() {
    Fragment f;
    RETURN_IF_ERROR(ParseAlternation(&f));
    if (!AtEnd()) return Error(Peek() == ')' ? "unbalanced )" : "unexpected character");
    return f.gbnf;
  }

 private:
  bool AtEnd() const { return pos_ >= pattern_.size(); }
  char Peek() const { return pattern_[pos_]; }

  absl::Status Error(absl::string_view message) const {
    return InvalidFieldError(
        field_, absl::StrCat(field_, ": regex \"", pattern_, "\" at offset ", pos_, ": ", message));
  }

  absl::Status ParseAlternation(Fragment* out) {
    std::vector<Fragment> alternatives(1);
    RETURN_IF_ERROR(ParseSequence(&alternatives.back()));
    while (!AtEnd() && Peek() == '|') {
      ++pos_;
      alternatives.emplace_back();
      RETURN_IF_ERROR(ParseSequence(&alternatives.back()));
    }
    if (alternatives.size() == 1) {
      *out = std::move(alternatives[0]);
      return absl::OkStatus();
    }
    out->gbnf = "(";
    out->nullable = false;
    for (size_t i = 0; i < alternatives.size(); ++i) {
      absl::StrAppend(&out->gbnf, i > 0 ? " | " : "", alternatives[i].gbnf);
      out->nullable = out->nullable || alternatives[i].nullable;
    }
    out->gbnf += ")";
    return absl::OkStatus();
  }

  absl::Status ParseSequence(Fragment* out) {
    out->gbnf = "(";
    out->nullable = true;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      // Anchors where they mean the whole text's ends: ^ before anything (groups may open
      // first), $ after everything (groups may close after it), or either at the edge of a
      // top-level alternative.
      if (Peek() == '^' || Peek() == '$') {
        const bool start = Peek() == '^';
        const absl::string_view before = pattern_.substr(0, pos_);
        const absl::string_view after = pattern_.substr(pos_ + 1);
        const bool edge = start ? before.find_first_not_of('(') == absl::string_view::npos ||
                                      (depth_ == 0 && before.back() == '|')
                                : after.find_first_not_of(')') == absl::string_view::npos ||
                                      (depth_ == 0 && after.front() == '|');
        if (!edge) {
          return Error(start ? "^ is supported only at the start of the pattern"
                             : "$ is supported only at the end of the pattern");
        }
        ++pos_;
        continue;
      }
      Fragment item;
      RETURN_IF_ERROR(ParseAtom(&item));
      RETURN_IF_ERROR(ParseQuantifiers(&item));
      absl::StrAppend(&out->gbnf, " ", item.gbnf);
      out->nullable = out->nullable && item.nullable;
    }
    out->gbnf += " )";
    return absl::OkStatus();
  }

  // Reads {m}, {m,} or {m,n} at pos_; false (pos_ unchanged) when it is not one, and then the
  // brace is a literal, as in RE2.
  bool ReadBraces(int* min, int* max) {
    size_t p = pos_ + 1;
    const auto number = [&](int* value) {
      const size_t start = p;
      int64_t v = 0;
      while (p < pattern_.size() && pattern_[p] >= '0' && pattern_[p] <= '9') {
        v = std::min<int64_t>(v * 10 + (pattern_[p] - '0'), 1 << 20);
        ++p;
      }
      *value = static_cast<int>(v);
      return p > start;
    };
    if (!number(min)) return false;
    *max = *min;
    if (p < pattern_.size() && pattern_[p] == ',') {
      ++p;
      *max = -1;
      if (p < pattern_.size() && pattern_[p] != '}' && !number(max)) return false;
    }
    if (p >= pattern_.size() || pattern_[p] != '}') return false;
    pos_ = p + 1;
    return true;
  }

  absl::Status ParseQuantifiers(Fragment* item) {
    while (!AtEnd()) {
      const size_t at = pos_;
      int min, max;
      const char c = Peek();
      if (c == '*' || c == '+' || c == '?') {
        ++pos_;
        min = c == '+' ? 1 : 0;
        max = c == '?' ? 1 : -1;
      } else if (c == '{' && ReadBraces(&min, &max)) {
        if (max >= 0 && max < min) {
          pos_ = at;
          return Error("repetition has max < min");
        }
        if (max > 1000 || min > 1000) {
          pos_ = at;
          return Error("repetition count above 1000");
        }
      } else {
        return absl::OkStatus();
      }
      if (!AtEnd() && Peek() == '?') ++pos_;  // lazy: the same language
      if (!AtEnd() && Peek() == '+') return Error("possessive repetitions are not supported");
      if (max < 0 && item->nullable) {
        pos_ = at;
        return Error(
            "an unbounded repetition of something that can match the empty text is not "
            "supported");
      }
      const std::string& g = item->gbnf;
      if (max < 0) {
        item->gbnf = min == 0   ? absl::StrCat("(", g, ")*")
                     : min == 1 ? absl::StrCat("(", g, ")+")
                                : absl::StrFormat("(%s){%d,}", g, min);
      } else {
        item->gbnf = absl::StrFormat("(%s){%d,%d}", g, min, max);
      }
      item->nullable = item->nullable || min == 0;
    }
    return absl::OkStatus();
  }

  // The GBNF for one character of the text.
  std::string Literal(uint32_t c) const {
    std::string bytes;
    if (text_ == RegexText::kJsonString && (c < 0x20 || c == '"' || c == '\\')) {
      switch (c) {
        case '"':
          bytes = "\\\"";
          break;
        case '\\':
          bytes = "\\\\";
          break;
        case '\n':
          bytes = "\\n";
          break;
        case '\r':
          bytes = "\\r";
          break;
        case '\t':
          bytes = "\\t";
          break;
        default:
          bytes = absl::StrFormat("\\u%04x", c);
      }
    } else {
      AppendUtf8(c, &bytes);
    }
    return GbnfLiteral(bytes);
  }

  // The GBNF for any one character of `ranges`.
  std::string Class(Ranges ranges) const {
    ranges = NormalizeRanges(std::move(ranges));
    if (text_ == RegexText::kRaw) return GbnfCharClass(ranges);
    // In a JSON string, '"', '\\' and control characters are written as escapes.
    static const Ranges* const kSpecial = new Ranges{{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
    Ranges plain;
    std::string out = "(";
    int escapes = 0;
    for (const auto& [lo, hi] : ranges) {
      uint32_t next = lo;
      for (const auto& [special_lo, special_hi] : *kSpecial) {
        if (special_hi < next || special_lo > hi) continue;
        if (special_lo > next) plain.emplace_back(next, special_lo - 1);
        for (uint32_t c = std::max(next, special_lo); c <= std::min(hi, special_hi); ++c) {
          absl::StrAppend(&out, escapes++ > 0 ? " | " : "", Literal(c));
        }
        next = special_hi + 1;
      }
      if (next <= hi) plain.emplace_back(next, hi);
    }
    return absl::StrCat(out, escapes > 0 ? " | " : "", GbnfCharClass(plain), ")");
  }

  // An escape after the backslash: a set of characters into *ranges.
  absl::Status ParseEscape(Ranges* ranges, bool in_class) {
    const size_t start = pos_ - 1;
    if (AtEnd()) return Error("trailing backslash");
    const char c = Peek();
    ++pos_;
    const auto one = [&](uint32_t value) {
      ranges->emplace_back(value, value);
      return absl::OkStatus();
    };
    switch (c) {
      case 'd':
        Append(DigitRanges(), ranges);
        return absl::OkStatus();
      case 'w':
        Append(WordRanges(), ranges);
        return absl::OkStatus();
      case 's':
        Append(SpaceRanges(), ranges);
        return absl::OkStatus();
      case 'D':
        Append(ComplementRanges(DigitRanges()), ranges);
        return absl::OkStatus();
      case 'W':
        Append(ComplementRanges(WordRanges()), ranges);
        return absl::OkStatus();
      case 'S':
        Append(ComplementRanges(SpaceRanges()), ranges);
        return absl::OkStatus();
      case 'n':
        return one('\n');
      case 'r':
        return one('\r');
      case 't':
        return one('\t');
      case 'f':
        return one('\f');
      case 'v':
        return one('\v');
      case '0':
        return one(0);
      case 'x':
      case 'u': {
        uint32_t value = 0;
        const bool braced = c == 'x' && !AtEnd() && Peek() == '{';
        if (braced) ++pos_;
        int digits = 0;
        while (!AtEnd() && isxdigit(static_cast<unsigned char>(Peek())) &&
               (braced || digits < (c == 'x' ? 2 : 4))) {
          const char h = Peek();
          value = value * 16 + (h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
          ++pos_;
          if (++digits > 8) break;
        }
        if (braced) {
          if (AtEnd() || Peek() != '}') return Error("expected } after \\x{");
          ++pos_;
        }
        if (digits == 0 || (!braced && digits != (c == 'x' ? 2 : 4)) || value > kMaxCodePoint ||
            (value >= 0xD800 && value <= 0xDFFF)) {
          pos_ = start;
          return Error("malformed hexadecimal escape");
        }
        return one(value);
      }
      default:
        break;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '1' && c <= '9')) {
      pos_ = start;
      return Error(absl::StrCat("the escape \\", std::string(1, c), " is not supported",
                                in_class ? " in a class" : ""));
    }
    pos_ = start + 1;
    uint32_t value;
    if (!DecodeUtf8(pattern_, &pos_, &value)) return Error("the pattern is not valid UTF-8");
    return one(value);
  }

  absl::Status ParseClass(Fragment* out) {
    const size_t start = pos_;
    ++pos_;  // [
    const bool negated = !AtEnd() && Peek() == '^';
    if (negated) ++pos_;
    Ranges ranges;
    bool first = true;
    for (;;) {
      if (AtEnd()) {
        pos_ = start;
        return Error("unterminated character class");
      }
      if (Peek() == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      if (pattern_.substr(pos_, 2) == "[:") return Error("POSIX classes are not supported");
      Ranges item;
      uint32_t lo;
      if (Peek() == '\\') {
        ++pos_;
        RETURN_IF_ERROR(ParseEscape(&item, true));
      } else if (!DecodeUtf8(pattern_, &pos_, &lo)) {
        return Error("the pattern is not valid UTF-8");
      } else {
        item.emplace_back(lo, lo);
      }
      if (item.size() == 1 && item[0].first == item[0].second && pos_ + 1 < pattern_.size() &&
          Peek() == '-' && pattern_[pos_ + 1] != ']') {
        ++pos_;
        Ranges end;
        const size_t at = pos_;
        if (Peek() == '\\') {
          ++pos_;
          RETURN_IF_ERROR(ParseEscape(&end, true));
        } else if (!DecodeUtf8(pattern_, &pos_, &lo)) {
          return Error("the pattern is not valid UTF-8");
        } else {
          end.emplace_back(lo, lo);
        }
        if (end.size() != 1 || end[0].first != end[0].second || end[0].first < item[0].first) {
          pos_ = at;
          return Error("bad character range");
        }
        item[0].second = end[0].first;
      }
      Append(item, &ranges);
    }
    if (negated) ranges = ComplementRanges(NormalizeRanges(std::move(ranges)));
    out->gbnf = Class(std::move(ranges));
    out->nullable = false;
    return absl::OkStatus();
  }

  absl::Status ParseAtom(Fragment* out) {
    const char c = Peek();
    switch (c) {
      case '(': {
        const size_t start = pos_;
        ++pos_;
        if (!AtEnd() && Peek() == '?') {
          if (pattern_.substr(pos_, 2) == "?:") {
            pos_ += 2;
          } else if (pattern_.substr(pos_, 3) == "?P<" ||
                     (pattern_.substr(pos_, 2) == "?<" && pattern_.substr(pos_, 3) != "?<=" &&
                      pattern_.substr(pos_, 3) != "?<!")) {
            while (!AtEnd() && Peek() != '>') ++pos_;
            if (AtEnd()) return Error("unterminated group name");
            ++pos_;
          } else {
            pos_ = start;
            return Error("lookaround, flags and other (? groups are not supported");
          }
        }
        if (depth_ >= kMaxNesting) {
          pos_ = start;
          return Error(absl::StrCat("groups nest deeper than ", kMaxNesting));
        }
        ++depth_;
        const absl::Status parsed = ParseAlternation(out);
        --depth_;
        RETURN_IF_ERROR(parsed);
        if (AtEnd() || Peek() != ')') {
          pos_ = start;
          return Error("unbalanced (");
        }
        ++pos_;
        return absl::OkStatus();
      }
      case '[':
        return ParseClass(out);
      case '.':
        ++pos_;
        out->gbnf = Class(ComplementRanges({{'\n', '\n'}}));
        out->nullable = false;
        return absl::OkStatus();
      case '*':
      case '+':
      case '?':
        return Error("nothing to repeat");
      case '\\': {
        ++pos_;
        Ranges ranges;
        RETURN_IF_ERROR(ParseEscape(&ranges, false));
        out->gbnf = ranges.size() == 1 && ranges[0].first == ranges[0].second
                        ? Literal(ranges[0].first)
                        : Class(std::move(ranges));
        out->nullable = false;
        return absl::OkStatus();
      }
      default: {
        uint32_t value;
        if (!DecodeUtf8(pattern_, &pos_, &value)) return Error("the pattern is not valid UTF-8");
        out->gbnf = Literal(value);
        out->nullable = false;
        return absl::OkStatus();
      }
    }
  }

  absl::string_view pattern_;
  absl::string_view field_;
  RegexText text_;
  size_t pos_ = 0;
  int depth_ = 0;  // of nested groups
};

}  // namespace

absl::StatusOr<std::string> RegexToGbnf(absl::string_view pattern, absl::string_view field_path,
                                        RegexText text) {
  return RegexParser(pattern, field_path, text).Parse();
}

absl::StatusOr<std::shared_ptr<const Grammar>> CompileRegex(absl::string_view pattern,
                                                            absl::string_view field_path) {
  ASSIGN_OR_RETURN(std::string expression, RegexToGbnf(pattern, field_path));
  absl::StatusOr<std::shared_ptr<const Grammar>> grammar =
      CompileGbnf(absl::StrCat("root ::= ", expression));
  if (!grammar.ok()) {  // a bug of RegexToGbnf rather than of the pattern
    return InvalidFieldError(field_path, absl::StrCat(field_path, ": regex \"", pattern,
                                                      "\": ", grammar.status().message()));
  }
  return grammar;
}

}  // namespace lgpt
