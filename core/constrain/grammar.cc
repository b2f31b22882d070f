#include "core/constrain/grammar.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/constrain/utf8.h"

namespace lgpt {

// Builds a Grammar: rules are declared by name (or generated), and each gets its alternatives
// as sequences of elements.
class GrammarBuilder {
 public:
  using Element = Grammar::Element;
  using Sequence = std::vector<Element>;

  int RuleId(const std::string& name) {
    auto [it, inserted] = ids_.emplace(name, static_cast<int>(names_.size()));
    if (inserted) {
      names_.push_back(name);
      bodies_.emplace_back();
      defined_.push_back(false);
    }
    return it->second;
  }
  // A new rule named after `parent`.
  int NewRule(const std::string& parent) {
    std::string name;
    do {
      name = absl::StrCat(parent, "-", ++generated_);
    } while (ids_.contains(name));
    const int id = RuleId(name);
    defined_[id] = true;
    return id;
  }
  bool defined(int rule) const { return defined_[rule]; }
  void Define(int rule, std::vector<Sequence> alternatives) {
    defined_[rule] = true;
    bodies_[rule] = std::move(alternatives);
  }
  const std::string& name(int rule) const { return names_[rule]; }
  int num_rules() const { return static_cast<int>(names_.size()); }

  Element Bytes(const Grammar::ByteSet& set) {
    const std::string key = set.to_string();
    auto [it, inserted] = set_ids_.emplace(key, static_cast<int32_t>(sets_.size()));
    if (inserted) sets_.push_back(set);
    return Element{Element::kBytes, it->second};
  }
  Element Byte(uint8_t byte) {
    Grammar::ByteSet set;
    set.set(byte);
    return Bytes(set);
  }
  static Element Ref(int rule) { return Element{Element::kRule, rule}; }

  // The code points of `ranges` (normalized) as one element: a byte set when all are ASCII, else
  // a generated rule with one alternative per UTF-8 byte-range sequence.
  Element CodePoints(const std::vector<std::pair<uint32_t, uint32_t>>& ranges,
                     const std::string& parent) {
    std::vector<ByteRangeSequence> sequences;
    for (const auto& [lo, hi] : ranges) Utf8RangeSequences(lo, hi, &sequences);
    Grammar::ByteSet ascii;
    std::vector<Sequence> alternatives;
    for (const ByteRangeSequence& sequence : sequences) {
      if (sequence.size() == 1) {
        for (int b = sequence[0].first; b <= sequence[0].second; ++b) ascii.set(b);
        continue;
      }
      Sequence elements;
      for (const auto& [lo, hi] : sequence) {
        Grammar::ByteSet set;
        for (int b = lo; b <= hi; ++b) set.set(b);
        elements.push_back(Bytes(set));
      }
      alternatives.push_back(std::move(elements));
    }
    if (alternatives.empty()) return Bytes(ascii);
    if (ascii.any()) alternatives.insert(alternatives.begin(), Sequence{Bytes(ascii)});
    const int rule = NewRule(parent);
    Define(rule, std::move(alternatives));
    return Ref(rule);
  }

  // `x` repeated min to max times (max < 0: unbounded), as a sequence.
  Sequence Repeat(Sequence x, int min, int max, const std::string& parent) {
    Element item{Element::kEnd, 0};
    if (x.size() == 1) {
      item = x[0];
    } else {
      item = Ref(NewRule(parent));
      Define(item.arg, {std::move(x)});
    }
    Sequence out(min, item);
    if (max < 0) {  // star ::= item star | ""
      const int star = NewRule(parent);
      Define(star, {{item, Ref(star)}, {}});
      out.push_back(Ref(star));
    } else if (max > min) {  // up_k ::= item up_{k-1} | "", up_1 ::= item | ""
      int previous = NewRule(parent);
      Define(previous, {{item}, {}});
      for (int k = 2; k <= max - min; ++k) {
        const int rule = NewRule(parent);
        Define(rule, {{item, Ref(previous)}, {}});
        previous = rule;
      }
      out.push_back(Ref(previous));
    }
    return out;
  }

  // The first rule that can reach itself without consuming a byte, or -1.
  int LeftRecursiveRule() const {
    const int n = num_rules();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (int r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const Sequence& alternative : bodies_[r]) {
          if (std::all_of(alternative.begin(), alternative.end(), [&](const Element& e) {
                return e.kind == Element::kRule && nullable[e.arg];
              })) {
            nullable[r] = changed = true;
            break;
          }
        }
      }
    }
    std::vector<std::vector<int>> first(n);  // rules a rule can start with
    for (int r = 0; r < n; ++r) {
      for (const Sequence& alternative : bodies_[r]) {
        for (const Element& e : alternative) {
          if (e.kind != Element::kRule) break;
          first[r].push_back(e.arg);
          if (!nullable[e.arg]) break;
        }
      }
    }
    std::vector<int> color(n, 0);  // 0 new, 1 on the path, 2 done
    for (int start = 0; start < n; ++start) {
      if (color[start] != 0) continue;
      std::vector<std::pair<int, size_t>> path = {{start, 0}};
      color[start] = 1;
      while (!path.empty()) {
        auto& [rule, next] = path.back();
        if (next == first[rule].size()) {
          color[rule] = 2;
          path.pop_back();
          continue;
        }
        const int to = first[rule][next++];
        if (color[to] == 1) return to;
        if (color[to] == 0) {
          color[to] = 1;
          path.emplace_back(to, 0);
        }
      }
    }
    return -1;
  }

  std::shared_ptr<const Grammar> Build(int root) {
    auto grammar = std::make_shared<Grammar>();
    grammar->root_ = root;
    grammar->rule_names_ = names_;
    grammar->byte_sets_ = sets_;
    grammar->alternatives_.resize(names_.size());
    for (int r = 0; r < num_rules(); ++r) {
      for (const Sequence& alternative : bodies_[r]) {
        grammar->alternatives_[r].push_back(grammar->num_elements());
        for (const Element& e : alternative) grammar->elements_.push_back(e);
        // A spare kEnd after each alternative lets the matcher look one past a rule reference.
        grammar->elements_.push_back(Element{Element::kEnd, r});
      }
    }
    return grammar;
  }

 private:
  std::vector<std::string> names_;
  std::vector<std::vector<Sequence>> bodies_;
  std::vector<bool> defined_;
  absl::flat_hash_map<std::string, int> ids_;
  std::vector<Grammar::ByteSet> sets_;
  absl::flat_hash_map<std::string, int32_t> set_ids_;
  int generated_ = 0;
};

namespace {

using Element = Grammar::Element;
using Sequence = std::vector<Element>;

constexpr int kMaxRepeat = 100000;
constexpr int kMaxNesting = 256;  // groups in groups: the parser recurses

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

class GbnfParser {
 public:
  explicit GbnfParser(absl::string_view text) : text_(text) {}

  absl::StatusOr<std::shared_ptr<const Grammar>> Parse() {
    SkipSpace();
    while (!AtEnd()) {
      const size_t name_pos = pos_;
      const std::string name = ParseName();
      if (name.empty()) return Error("expected a rule name");
      rule_name_ = name;
      SkipSpace();
      if (text_.substr(pos_, 3) != "::=") return Error("expected ::= after the rule name");
      pos_ += 3;
      const int rule = builder_.RuleId(name);
      if (builder_.defined(rule)) {
        pos_ = name_pos;
        return Error(absl::StrCat("rule ", name, " is defined twice"));
      }
      std::vector<Sequence> alternatives;
      if (!ParseAlternatives(&alternatives)) return error_;
      if (!AtEnd() && Peek() == ')') return Error("unbalanced )");
      builder_.Define(rule, std::move(alternatives));
    }
    rule_name_.clear();
    for (int r = 0; r < builder_.num_rules(); ++r) {
      if (!builder_.defined(r)) {
        pos_ = first_use_.at(r);
        return Error(absl::StrCat("rule ", builder_.name(r), " is used but not defined"));
      }
    }
    if (!defined_root()) return absl::InvalidArgumentError("GBNF grammar has no rule `root`");
    const int left = builder_.LeftRecursiveRule();
    if (left >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GBNF rule ", builder_.name(left),
          " is left-recursive (it can reach itself without consuming input); rewrite it with "
          "repetition"));
    }
    return builder_.Build(builder_.RuleId("root"));
  }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return text_[pos_]; }
  bool defined_root() {
    for (int r = 0; r < builder_.num_rules(); ++r) {
      if (builder_.name(r) == "root") return true;
    }
    return false;
  }

  bool Fail(absl::string_view message) {
    error_ = Error(message);
    return false;
  }

  absl::Status Error(absl::string_view message) {
    int line = 1, column = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    error_ = absl::InvalidArgumentError(absl::StrFormat(
        "GBNF line %d, column %d%s: %s", line, column,
        rule_name_.empty() ? "" : absl::StrCat(" (rule ", rule_name_, ")"), message));
    return error_;
  }

  // Spaces, tabs, newlines and comments.
  void SkipSpace() {
    while (!AtEnd()) {
      const char c = Peek();
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else if (c == '#') {
        while (!AtEnd() && Peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string ParseName() {
    const size_t start = pos_;
    while (!AtEnd() && IsNameChar(Peek())) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  // Whether a `name ::=` starts at pos_ (the next rule).
  bool AtRuleStart() {
    const size_t saved = pos_;
    const bool name = !ParseName().empty();
    SkipSpace();
    const bool result = name && text_.substr(pos_, 3) == "::=";
    pos_ = saved;
    return result;
  }

  bool ParseAlternatives(std::vector<Sequence>* alternatives) {
    for (;;) {
      Sequence sequence;
      if (!ParseSequence(&sequence)) return false;
      alternatives->push_back(std::move(sequence));
      if (AtEnd() || Peek() != '|') return true;
      ++pos_;
    }
  }

  bool ParseSequence(Sequence* out) {
    for (;;) {
      SkipSpace();
      if (AtEnd() || Peek() == '|' || Peek() == ')' || AtRuleStart()) return true;
      Sequence item;
      if (!ParsePrimary(&item)) return false;
      for (;;) {  // postfix operators
        if (AtEnd()) break;
        const char c = Peek();
        int min, max;
        if (c == '*') {
          min = 0, max = -1;
          ++pos_;
        } else if (c == '+') {
          min = 1, max = -1;
          ++pos_;
        } else if (c == '?') {
          min = 0, max = 1;
          ++pos_;
        } else if (c == '{') {
          if (!ParseBraces(&min, &max)) return false;
        } else {
          break;
        }
        item = builder_.Repeat(std::move(item), min, max, rule_name_);
      }
      out->insert(out->end(), item.begin(), item.end());
    }
  }

  bool ParseNumber(int* value) {
    const size_t start = pos_;
    int64_t v = 0;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
      v = v * 10 + (Peek() - '0');
      if (v > kMaxRepeat) {
        return Fail(absl::StrCat("repetition count above ", kMaxRepeat));
      }
      ++pos_;
    }
    if (pos_ == start) {
      return Fail("expected a number");
    }
    *value = static_cast<int>(v);
    return true;
  }

  // {m}, {m,}, {m,n}
  bool ParseBraces(int* min, int* max) {
    const size_t start = pos_;
    ++pos_;
    SkipSpace();
    if (!ParseNumber(min)) return false;
    SkipSpace();
    *max = *min;
    if (!AtEnd() && Peek() == ',') {
      ++pos_;
      SkipSpace();
      *max = -1;
      if (!AtEnd() && Peek() != '}' && !ParseNumber(max)) return false;
      SkipSpace();
    }
    if (AtEnd() || Peek() != '}') {
      return Fail("expected } to close the repetition");
    }
    ++pos_;
    if (*max >= 0 && *max < *min) {
      pos_ = start;
      return Fail(absl::StrCat("repetition {", *min, ",", *max, "} has max < min"));
    }
    return true;
  }

  bool ParsePrimary(Sequence* out) {
    const char c = Peek();
    if (c == '"') {
      ++pos_;
      for (;;) {
        if (AtEnd()) {
          return Fail("unterminated string literal");
        }
        if (Peek() == '"') {
          ++pos_;
          return true;
        }
        uint32_t code_point;
        if (!ParseChar(&code_point)) return false;
        std::string bytes;
        AppendUtf8(code_point, &bytes);
        for (char b : bytes) out->push_back(builder_.Byte(static_cast<uint8_t>(b)));
      }
    }
    if (c == '[') return ParseClass(out);
    if (c == '.') {
      ++pos_;
      out->push_back(builder_.CodePoints({{0, kMaxCodePoint}}, rule_name_));
      return true;
    }
    if (c == '(') {
      if (depth_ >= kMaxNesting) return Fail(absl::StrCat("groups nest deeper than ", kMaxNesting));
      ++pos_;
      std::vector<Sequence> alternatives;
      ++depth_;
      const bool parsed = ParseAlternatives(&alternatives);
      --depth_;
      if (!parsed) return false;
      if (AtEnd() || Peek() != ')') {
        return Fail("expected )");
      }
      ++pos_;
      if (alternatives.size() == 1) {
        out->insert(out->end(), alternatives[0].begin(), alternatives[0].end());
      } else {
        const int rule = builder_.NewRule(rule_name_);
        builder_.Define(rule, std::move(alternatives));
        out->push_back(GrammarBuilder::Ref(rule));
      }
      return true;
    }
    if (IsNameChar(c)) {
      const size_t start = pos_;
      const int rule = builder_.RuleId(ParseName());
      first_use_.emplace(rule, start);
      out->push_back(GrammarBuilder::Ref(rule));
      return true;
    }
    return Fail(absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  bool ParseClass(Sequence* out) {
    ++pos_;  // [
    const bool negated = !AtEnd() && Peek() == '^';
    if (negated) ++pos_;
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    for (;;) {
      if (AtEnd()) {
        return Fail("unterminated character class");
      }
      if (Peek() == ']') {
        ++pos_;
        break;
      }
      uint32_t lo, hi;
      if (!ParseChar(&lo)) return false;
      hi = lo;
      if (pos_ + 1 < text_.size() && Peek() == '-' && text_[pos_ + 1] != ']') {
        ++pos_;
        const size_t at = pos_;
        if (!ParseChar(&hi)) return false;
        if (hi < lo) {
          pos_ = at;
          return Fail("character range is out of order");
        }
      }
      ranges.emplace_back(lo, hi);
    }
    ranges = NormalizeRanges(std::move(ranges));
    if (negated) ranges = ComplementRanges(ranges);
    out->push_back(builder_.CodePoints(ranges, rule_name_));
    return true;
  }

  bool ParseHex(int digits, uint32_t* value) {
    *value = 0;
    for (int i = 0; i < digits; ++i) {
      if (AtEnd()) {
        return Fail("incomplete escape");
      }
      const char c = Peek();
      int d;
      if (c >= '0' && c <= '9') {
        d = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        d = c - 'A' + 10;
      } else {
        return Fail("expected a hexadecimal digit");
      }
      *value = *value * 16 + d;
      ++pos_;
    }
    return true;
  }

  // One character of a literal or class: an escape or a UTF-8 code point.
  bool ParseChar(uint32_t* code_point) {
    const size_t start = pos_;
    if (Peek() != '\\') {
      if (!DecodeUtf8(text_, &pos_, code_point)) {
        return Fail("the grammar is not valid UTF-8");
      }
      return true;
    }
    ++pos_;
    if (AtEnd()) {
      return Fail("incomplete escape");
    }
    const char c = Peek();
    ++pos_;
    switch (c) {
      case 'n':
        *code_point = '\n';
        return true;
      case 'r':
        *code_point = '\r';
        return true;
      case 't':
        *code_point = '\t';
        return true;
      case '"':
      case '\'':
      case '\\':
      case '[':
      case ']':
      case '-':
      case '/':
      case '^':
        *code_point = static_cast<uint8_t>(c);
        return true;
      case 'x':
      case 'u':
      case 'U': {
        if (!ParseHex(c == 'x' ? 2 : c == 'u' ? 4 : 8, code_point)) return false;
        if (*code_point > kMaxCodePoint || (*code_point >= 0xD800 && *code_point <= 0xDFFF)) {
          pos_ = start;
          return Fail("escape is not a Unicode scalar value");
        }
        return true;
      }
      default:
        pos_ = start;
        return Fail(absl::StrCat("unknown escape \\", std::string(1, c)));
    }
  }

  absl::string_view text_;
  size_t pos_ = 0;
  std::string rule_name_;
  GrammarBuilder builder_;
  absl::flat_hash_map<int, size_t> first_use_;  // where each rule is first used
  int depth_ = 0;                               // of nested groups
  absl::Status error_;
};

std::string ByteSetText(const Grammar::ByteSet& set) {
  std::string out = "[";
  for (int b = 0; b < 256;) {
    if (!set.test(b)) {
      ++b;
      continue;
    }
    int e = b;
    while (e + 1 < 256 && set.test(e + 1)) ++e;
    absl::StrAppendFormat(&out, e == b ? "\\x%02X" : "\\x%02X-\\x%02X", b, e);
    b = e + 1;
  }
  return out + "]";
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Grammar>> CompileGbnf(absl::string_view text) {
  return GbnfParser(text).Parse();
}

std::string Grammar::DebugString() const {
  std::string out;
  for (int r = 0; r < num_rules(); ++r) {
    absl::StrAppend(&out, rule_names_[r], " ::=");
    for (size_t a = 0; a < alternatives_[r].size(); ++a) {
      if (a > 0) out += " |";
      for (int32_t p = alternatives_[r][a]; elements_[p].kind != Element::kEnd; ++p) {
        const Element& e = elements_[p];
        absl::StrAppend(
            &out, " ",
            e.kind == Element::kRule ? rule_names_[e.arg] : ByteSetText(byte_sets_[e.arg]));
      }
      if (elements_[alternatives_[r][a]].kind == Element::kEnd) out += " \"\"";
    }
    out += "\n";
  }
  return out;
}

std::string PrefixGbnfRuleNames(absl::string_view text, absl::string_view prefix) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  // Copies up to the unescaped `close` (included).
  auto copy_quoted = [&](char close) {
    out += text[i++];
    while (i < text.size() && text[i] != close) {
      if (text[i] == '\\' && i + 1 < text.size()) out += text[i++];
      out += text[i++];
    }
    if (i < text.size()) out += text[i++];
  };
  while (i < text.size()) {
    const char c = text[i];
    if (c == '"') {
      copy_quoted('"');
    } else if (c == '[') {
      copy_quoted(']');
    } else if (c == '{') {
      copy_quoted('}');
    } else if (c == '#') {
      while (i < text.size() && text[i] != '\n') out += text[i++];
    } else if (IsNameChar(c)) {
      out.append(prefix.data(), prefix.size());
      while (i < text.size() && IsNameChar(text[i])) out += text[i++];
    } else {
      out += text[i++];
    }
  }
  return out;
}

std::string GbnfLiteral(absl::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    const uint8_t b = static_cast<uint8_t>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (b < 0x20 || b == 0x7F) {
      absl::StrAppendFormat(&out, "\\x%02X", b);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string GbnfCharClass(absl::Span<const std::pair<uint32_t, uint32_t>> ranges) {
  std::string out = "[";
  for (auto [lo, hi] :
       NormalizeRanges(std::vector<std::pair<uint32_t, uint32_t>>(ranges.begin(), ranges.end()))) {
    // Surrogates are no characters: an end there moves to the nearest scalar value.
    if (lo >= 0xD800 && lo <= 0xDFFF) lo = 0xE000;
    if (hi >= 0xD800 && hi <= 0xDFFF) hi = 0xD7FF;
    if (hi > kMaxCodePoint) hi = kMaxCodePoint;
    if (lo > hi) continue;
    absl::StrAppendFormat(&out, "\\U%08X", lo);
    if (hi != lo) absl::StrAppendFormat(&out, "-\\U%08X", hi);
  }
  return out + "]";
}

}  // namespace lgpt
