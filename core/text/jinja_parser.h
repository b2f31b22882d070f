// Jinja template source to a syntax tree (core/text/jinja_ast.h), lexed as Python's jinja2
// lexes it with Hugging Face's settings: newlines normalised to \n and one trailing newline
// dropped; `{%-`/`-%}` (and `{{-`, `{#-`, ...) strip the whitespace beside a tag; with
// trim_blocks the newline after a block or comment tag is dropped and with lstrip_blocks the
// spaces and tabs before one on its line (`{%+` and `+%}` opt out).
//
// Errors are InvalidArgument and start "NAME:LINE:COLUMN: " (NAME is Options::name).
#ifndef LGPT_CORE_TEXT_JINJA_PARSER_H_
#define LGPT_CORE_TEXT_JINJA_PARSER_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/text/jinja_ast.h"

namespace lgpt {
namespace jinja {

struct ParseOptions {
  std::string name = "template";  // how error messages name the source
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  int max_nesting = 128;  // of blocks and of expressions; deeper is an error
};

absl::StatusOr<Body> ParseTemplate(absl::string_view source, const ParseOptions& options = {});

}  // namespace jinja
}  // namespace lgpt

#endif  // LGPT_CORE_TEXT_JINJA_PARSER_H_
