// Context-free grammars for constrained decoding, written in GBNF (llama.cpp's grammar format)
// and compiled to a form over bytes that core/constrain/matcher.h runs against token byte
// strings.
//
//   # A comment runs to the end of the line.
//   root   ::= "{" ws pair ("," ws pair)* "}"
//   pair   ::= name ws ":" ws [0-9]+
//   name   ::= "\"" [^"\\]* "\""
//   ws     ::= [ \t\n]{0,4}
//
// A rule is `name ::= alternatives`; it ends where the next `name ::=` begins (newlines are
// plain whitespace). Names are letters, digits, '-' and '_'. Elements: string literals "...",
// character classes [a-z] and negated ones [^"\\], `.` (any character), rule names, groups
// ( ... ), alternation |, and the repetitions *, +, ?, {m}, {m,}, {m,n}. Escapes in literals and
// classes: \n \r \t \" \' \\ \[ \] \- \/, \xNN, \uNNNN and \UNNNNNNNN (code points, not raw
// bytes). The grammar text must be UTF-8; `root` is the start rule.
//
// Characters are Unicode code points (surrogates excluded), compiled to their UTF-8 byte
// sequences, so a token that ends inside a multi-byte character is matched byte by byte.
// Left-recursive grammars (a rule that can reach itself without consuming a byte, as
// `a ::= a "x" | "y"` or `("a"?)*`) are refused.
//
// A compiled Grammar is immutable and may be shared by any number of threads and matchers.
#ifndef LGPT_CORE_CONSTRAIN_GRAMMAR_H_
#define LGPT_CORE_CONSTRAIN_GRAMMAR_H_

#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace lgpt {

class Grammar {
 public:
  // One element of an alternative. Each alternative is stored in elements() as its elements
  // followed by a kEnd; a position in the grammar is an index into elements().
  struct Element {
    enum Kind : uint8_t { kEnd, kBytes, kRule };
    Kind kind;
    int32_t arg;  // kBytes: index of byte_set(); kRule: the rule; kEnd: the rule it ends
  };
  using ByteSet = std::bitset<256>;

  int root() const { return root_; }
  int num_rules() const { return static_cast<int>(rule_names_.size()); }
  // Generated rules (groups, repetitions, classes) are named after the rule they occur in.
  const std::string& rule_name(int rule) const { return rule_names_[rule]; }
  // The positions where the rule's alternatives start.
  absl::Span<const int32_t> alternatives(int rule) const { return alternatives_[rule]; }
  const Element& element(int32_t position) const { return elements_[position]; }
  int32_t num_elements() const { return static_cast<int32_t>(elements_.size()); }
  const ByteSet& byte_set(int32_t index) const { return byte_sets_[index]; }

  // A readable dump over bytes, one rule a line (for tests and debugging).
  std::string DebugString() const;

 private:
  friend class GrammarBuilder;
  int root_ = 0;
  std::vector<std::string> rule_names_;
  std::vector<std::vector<int32_t>> alternatives_;
  std::vector<Element> elements_;
  std::vector<ByteSet> byte_sets_;
};

// Parses and compiles GBNF text. InvalidArgument for malformed text, naming the line and column
// and the rule being defined ("line 3, column 14 (rule value): expected ..."), for a rule used
// but not defined, defined twice, a missing `root`, and left recursion (naming the rule).
absl::StatusOr<std::shared_ptr<const Grammar>> CompileGbnf(absl::string_view text);

// GBNF `text` with every rule name (defined or used) prefixed by `prefix`, string literals,
// character classes, repetition counts and comments untouched: grammars written separately
// (one JSON schema per tool) combined into one without their rule names clashing.
std::string PrefixGbnfRuleNames(absl::string_view text, absl::string_view prefix);

// `text` as a GBNF string literal, quotes included, that matches exactly its bytes; `text`
// must be UTF-8 (for compilers that write GBNF: json_schema, regex).
std::string GbnfLiteral(absl::string_view text);

// A GBNF character class, brackets included, matching the code points of the inclusive ranges
// (which need not be sorted); `[]` when there are none, which matches nothing.
std::string GbnfCharClass(absl::Span<const std::pair<uint32_t, uint32_t>> ranges);

}  // namespace lgpt

#endif  // LGPT_CORE_CONSTRAIN_GRAMMAR_H_
