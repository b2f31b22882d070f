// Errors as data: an absl::Status names the option fields it is about in a payload, so each
// boundary (a tool's flags, the HTTP server's request fields) words them in its own terms, and
// the server fills OpenAI's `param`, without reading field names back out of messages.
//
// The library writes its messages with its own field paths ("KVCacheSpec.budget must be >= 1
// for policy h2o, got 0"), so a plain library user reads a correct message. The payload (type
// URL lgpt.dev/field) lists the field at fault and then any other field the message names. A
// boundary re-renders only those mentions:
//
//   absl::Status status =
//       InvalidFieldError("KVCacheSpec.budget", "KVCacheSpec.budget must be >= 1");
//   ErrorField(status);                  // "KVCacheSpec.budget"
//   MessageInTerms(status, flag_term);   // "--kv_budget must be >= 1", where flag_term maps
//                                        // KVCacheSpec.budget to --kv_budget
//
// A mention may assign a value, "KVCacheSpec.positions=cache" or
// "EngineOptions.verify_checksums = false": the term sees it, and renders the whole mention
// ("--kv_positions=cache"). Text that is not a mention of a payload field is never touched.
#ifndef LGPT_CORE_BASE_STATUS_FIELD_H_
#define LGPT_CORE_BASE_STATUS_FIELD_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace lgpt {

// The type URL of the payload: one field a line, the field at fault first; a line is the
// field's path, or the path, a tab and how the message writes the field.
inline constexpr absl::string_view kFieldPayloadUrl = "lgpt.dev/field";

// A field an error names: its path in the library ("KVCacheSpec.budget",
// "SchedulerOptions.kv_pool_bytes", "RequestOptions.max_new_tokens") and, where the message
// writes it otherwise, how: the request options' messages say "max_new_tokens"; a mention
// written as the path, a space and a value ("EngineOptions.dtype float32") names that value.
struct FieldRef {
  // Implicit: a path alone is the common case ("KVCacheSpec.budget").
  FieldRef(const char* path) : path(path) {}         // NOLINT(runtime/explicit)
  FieldRef(const std::string& path) : path(path) {}  // NOLINT(runtime/explicit)
  FieldRef(absl::string_view path) : path(path) {}   // NOLINT(runtime/explicit)
  FieldRef(absl::string_view path, absl::string_view written)
      : path(path), written(written == path ? "" : written) {}

  // How the message writes the field.
  absl::string_view text() const { return written.empty() ? path : written; }

  std::string path;
  std::string written;  // empty: the path itself

  friend bool operator==(const FieldRef& a, const FieldRef& b) {
    return a.path == b.path && a.text() == b.text();
  }
};

// A status of `code` with `message`, whose payload names `field` as the one at fault and
// `others` as further fields the message names.
absl::Status FieldError(absl::StatusCode code, const FieldRef& field, absl::string_view message,
                        const std::vector<FieldRef>& others = {});
absl::Status InvalidFieldError(const FieldRef& field, absl::string_view message,
                               const std::vector<FieldRef>& others = {});

// `status` with a field payload naming `field` (and `others`), replacing any it had. OK stays
// OK.
absl::Status WithFields(absl::Status status, const FieldRef& field,
                        const std::vector<FieldRef>& others = {});

// The path of the field at fault; nullopt when the status names none.
std::optional<std::string> ErrorField(const absl::Status& status);
// Every field the status names, the one at fault first; empty when none.
std::vector<FieldRef> ErrorFields(const absl::Status& status);

// `status` with `message` instead of its own: the same code and payloads (a field payload
// keeps naming the mentions the new message repeats).
absl::Status WithMessage(const absl::Status& status, absl::string_view message);

// One mention of a field in a message.
struct FieldMention {
  absl::string_view path;  // the field's library path
  // "cache" in "KVCacheSpec.positions=cache", "false" in "X.verify = false", "float32" in a
  // field written "EngineOptions.dtype float32"; nullopt: none.
  std::optional<absl::string_view> value;
  absl::string_view text;  // the mention as written, value included
};

// A boundary's words for a mention: the whole mention's replacement (value included), or
// nullopt to leave it as the library wrote it.
using FieldTerm = std::function<std::optional<std::string>(const FieldMention&)>;

// `message` with each mention of `fields` rendered by `term`. A mention is the field's text
// standing alone: not inside a longer name ("KVCacheSpec.budget" is not mentioned by
// "KVCacheSpec.budget_rule"), optionally followed by a value as "=value" or " = value".
std::string RenderFields(absl::string_view message, absl::Span<const FieldRef> fields,
                         const FieldTerm& term);

// The status's message with the fields of its payload rendered by `term`; the message as it is
// when the status names no field.
std::string MessageInTerms(const absl::Status& status, const FieldTerm& term);

// `status` with the field `from` renamed `to`, in its payload and where its message mentions
// it: a layer that passed its own option down under another name ("LoadOptions.verify_checksums"
// for EngineOptions.verify_checksums) names its own. Unchanged when the payload lacks `from`.
absl::Status RenameField(const absl::Status& status, absl::string_view from, absl::string_view to);

}  // namespace lgpt

#endif  // LGPT_CORE_BASE_STATUS_FIELD_H_
