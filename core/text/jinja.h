// A Jinja2 interpreter for Hugging Face chat templates: the subset of the language the chat
// templates of the supported model families use, with the settings transformers renders them
// with (an immutable sandbox, trim_blocks and lstrip_blocks, loop controls, Hugging Face's
// `tojson`, `raise_exception` and `strftime_now`). See core/text/README.md for the subset
// supported and refused.
//
//   ASSIGN_OR_RETURN(jinja::Template t, jinja::Template::Parse("{{ x ~ '!' }}"));
//   jinja::ValueDict context;
//   context.Set("x", jinja::Value("hi"));
//   ASSIGN_OR_RETURN(std::string text, t.Render(context));  // "hi!"
//
// Rendering is bounded: the output size, the loop iterations and the macro call depth have
// limits (TemplateOptions), and a template past one fails naming it. A syntax or runtime error
// is InvalidArgument and starts "NAME:LINE:COLUMN: "; `raise_exception(message)` fails with
// InvalidArgument and the template's message alone.
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
