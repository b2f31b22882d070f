// Regular expressions (the common subset of RE2 / Python syntax) compiled to GBNF, for
// guided_regex and JSON schema "pattern".
//
// Supported: literals and escaped metacharacters, \d \D \w \W \s \S (ASCII, as RE2), \n \r \t
// \f \v \0, \xNN, \x{N...}, \uNNNN, character classes with ranges and negation ([a-z\d_],
// [^"]), `.` (any character but \n, as RE2), groups ( ), (?: ), (?P<name> ) and (?<name> ),
// alternation |, the repetitions * + ? {m} {m,} {m,n} (lazy forms such as *? are the same
// language), and the anchors ^ at the start and $ at the end, also of top-level alternatives
// (the match is always the whole text). Refused with InvalidArgument naming the field and the
// offset: backreferences, lookaround, flags such as (?i), \b \B \A \z, anchors elsewhere, POSIX
// classes [[:alpha:]], possessive repetitions, and an unbounded repetition of something that can
// match the empty string (as (a?)*: write a* instead).
#ifndef LGPT_CORE_CONSTRAIN_REGEX_H_
#define LGPT_CORE_CONSTRAIN_REGEX_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/constrain/grammar.h"

namespace lgpt {

// How the matched text is written.
enum class RegexText {
  kRaw,         // the text itself
  kJsonString,  // the body of a JSON string: '"', '\\' and control characters as JSON escapes
};

// A GBNF expression (to use inside a rule) for the texts the whole `pattern` matches. Errors are
// InvalidArgument naming `field_path` (the request field the pattern came from) and the offset.
absl::StatusOr<std::string> RegexToGbnf(absl::string_view pattern, absl::string_view field_path,
                                        RegexText text = RegexText::kRaw);

// A grammar whose sentences are the texts the whole `pattern` matches.
absl::StatusOr<std::shared_ptr<const Grammar>> CompileRegex(absl::string_view pattern,
                                                            absl::string_view field_path);

}  // namespace lgpt

#endif  // LGPT_CORE_CONSTRAIN_REGEX_H_
