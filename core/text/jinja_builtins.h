// The operators, filters, tests and methods of the Jinja interpreter (core/text/jinja.h), with
// jinja2's and Python's semantics for the values of core/text/jinja_value.h. Errors are
// InvalidArgument without a position; the interpreter adds the template's line and column.
#ifndef LGPT_CORE_TEXT_JINJA_BUILTINS_H_
#define LGPT_CORE_TEXT_JINJA_BUILTINS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/text/jinja_value.h"

namespace lgpt {
namespace jinja {

// Sizes a builtin may build; past them it fails, naming the limit.
struct BuiltinLimits {
  int64_t max_string_bytes = 1 << 22;  // a string value's size (TemplateOptions.max_output_bytes)
  int64_t max_items = 1 << 20;         // a list's length (TemplateOptions.max_iterations)
};

// `obj.name`: a dict's item (a dict's or string's method first, as jinja2), a namespace's
// attribute, else undefined (also of undefined).
Value GetAttribute(const Value& obj, absl::string_view name);
// `obj[key]`: a dict's item, a list's or string's element (negative counts from the end),
// else undefined.
Value GetItem(const Value& obj, const Value& key);
// `obj[start:stop:step]` of a list or string; undefined bounds are absent ones.
absl::StatusOr<Value> Slice(const Value& obj, const Value& start, const Value& stop,
                            const Value& step);
// The items a for loop visits: a list's elements, a dict's keys, a string's characters;
// nothing for undefined.
absl::StatusOr<std::vector<Value>> Iterate(const Value& value);

// Binary operators: + - * / // % ** ~ (not and/or, which short-circuit).
absl::StatusOr<Value> BinaryOp(absl::string_view op, const Value& a, const Value& b,
                               const BuiltinLimits& limits);
// Comparisons: == != < <= > >= in notin.
absl::StatusOr<bool> Compare(absl::string_view op, const Value& a, const Value& b);

// The filter `name` applied to `value` with `args`.
absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& value, CallArgs& args,
                                  const BuiltinLimits& limits);
// The test `name` (`value is name(args)`).
absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& value, CallArgs& args);

// Python's str.strip(chars) family: which = 'l', 'r' or 'b' (both); chars absent: whitespace.
std::string PythonStrip(absl::string_view s, const Value& chars, char which);

}  // namespace jinja
}  // namespace lgpt

#endif  // LGPT_CORE_TEXT_JINJA_BUILTINS_H_
