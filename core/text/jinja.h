// A Jinja2 interpreter for Hugging Face chat templates: the subset of the language the chat
// templates of the supported model families use, with the settings transformers renders them
// with (an immutable sandbox, trim_blocks and lstrip_blocks, loop controls, Hugging Face's
// `tojson`, `raise_exception` and `strftime_now`). core/text/chat_template.h applies it to a
// checkpoint's template; chat_template_test checks 24 templates against Python's jinja2 byte
// for byte.
//
//   ASSIGN_OR_RETURN(jinja::Template t, jinja::Template::Parse("{{ x ~ '!' }}"));
//   jinja::ValueDict context;
//   context.Set("x", jinja::Value("hi"));
//   ASSIGN_OR_RETURN(std::string text, t.Render(context));  // "hi!"
//
// Supported:
//   - {{ }}, {% %}, {# #}; whitespace control {%- -%} {{- -}} {#- -#}, {%+ and +%}; trim_blocks
//     and lstrip_blocks as jinja2 applies them; \r\n as \n, one trailing newline dropped.
//   - if/elif/else; for (unpacking `for k, v in`, `for x in y if cond`, else, loop.index,
//     index0, revindex, revindex0, first, last, length, previtem, nextitem, cycle()), break,
//     continue; set (`a, b = ...`, `ns.x = ...` on a namespace(), `{% set x %}...{% endset %}`);
//     macro with defaults and keyword arguments, recursive calls; filter blocks;
//     {% generation %} (Hugging Face's assistant-mask extension: the body renders in place).
//   - Expressions: literals (strings with Python escapes, ints, floats, true/false/none in
//     either case, lists, tuples as lists, dicts), attribute and subscript access, slices with
//     steps, calls with keyword arguments, + - * / // % ** ~, comparisons (chained), in, not in,
//     and/or/not (returning operands, as Python), `a if c else b` (else optional), tests with
//     `is` / `is not` (defined, undefined, none, boolean, true, false, integer, float, number,
//     string, mapping, iterable, sequence, callable, even, odd, divisibleby, equalto/eq/==,
//     ne, lt, le, gt, ge, in, lower, upper, sameas).
//   - Filters: trim, length/count, tojson(indent) (json.dumps with ensure_ascii=False, keys in
//     insertion order), upper, lower, capitalize, title, default/d (boolean), items, join
//     (attribute), first, last, string, int, float, list, map (attribute=, default= or a filter
//     name), select, reject, selectattr, rejectattr, replace, safe, escape/e, round (method),
//     abs, reverse, sort (reverse, case_sensitive, attribute), unique, indent, sum, min, max,
//     wordcount.
//   - Methods: strings' strip, lstrip, rstrip, split, splitlines, startswith, endswith (also a
//     tuple), upper, lower, title, capitalize, replace, find, count, join, isdigit, isalpha,
//     isspace; dicts' items, keys, values, get.
//   - Globals: range, namespace, dict, raise_exception, strftime_now.
//   - Undefined values print empty, iterate as nothing, have length 0; an attribute or item of
//     an undefined value is undefined (jinja2's plain Undefined would raise: lgpt is lenient
//     there, as chat templates probe optional fields).
// Refused (a syntax error naming line:column): include, import, extends, block, call, raw,
// with, autoescape, recursive loops, line statements, custom delimiters. Not provided:
// Markup/autoescaping, str.format and `%` string formatting, loop.changed, caller(),
// varargs/kwargs in macros, dict keys other than strings, integers beyond 64 bits, case
// mapping beyond Latin, Greek and Cyrillic.
//
// Rendering is bounded: the output size (and any one string), the loop iterations (and any
// list), the macro call depth and the nesting depth have limits (TemplateOptions); a template
// past one fails with ResourceExhausted naming it (an lgpt.dev/field payload, see
// core/base/status_field.h). A syntax or runtime error is InvalidArgument and starts
// "NAME:LINE:COLUMN: "; `raise_exception(message)` fails with InvalidArgument and the
// template's message alone (IsRaisedByTemplate tells it apart).
#ifndef LGPT_CORE_TEXT_JINJA_H_
#define LGPT_CORE_TEXT_JINJA_H_

#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/text/jinja_ast.h"
#include "core/text/jinja_value.h"

namespace lgpt {
namespace jinja {

struct TemplateOptions {
  std::string name = "template";  // how error messages name the template
  bool trim_blocks = true;        // Hugging Face's settings
  bool lstrip_blocks = true;
  int64_t max_output_bytes = int64_t{4} << 20;  // the output and any one string value
  int64_t max_iterations = 1'000'000;           // loop iterations in all, and list sizes
  int max_call_depth = 64;                      // macro calls inside macro calls
  // Blocks and expressions nested in the source; rendering nests at most 8x as deep
  // (blocks, expressions and macro calls together).
  int max_nesting = 128;
  // strftime_now's clock (local time, as Python's datetime.now()); null: the system clock.
  std::function<std::time_t()> clock;
};

// The payload type URL that marks the status of a template's raise_exception().
inline constexpr absl::string_view kRaisedPayloadUrl = "lgpt.dev/jinja-raise";

// Whether `status` is a template's raise_exception(message) (its message is the template's).
bool IsRaisedByTemplate(const absl::Status& status);

class Template {
 public:
  static absl::StatusOr<Template> Parse(absl::string_view source,
                                        const TemplateOptions& options = {});

  // Renders with `context`'s variables; the globals range, namespace, dict, raise_exception
  // and strftime_now are there unless the context names them too.
  absl::StatusOr<std::string> Render(const ValueDict& context) const;

  const TemplateOptions& options() const { return options_; }

 private:
  Template(std::shared_ptr<const Body> body, TemplateOptions options)
      : body_(std::move(body)), options_(std::move(options)) {}

  std::shared_ptr<const Body> body_;
  TemplateOptions options_;
};

}  // namespace jinja
}  // namespace lgpt

#endif  // LGPT_CORE_TEXT_JINJA_H_
