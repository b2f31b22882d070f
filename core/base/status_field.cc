#include "core/base/status_field.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace lgpt {
namespace {

absl::Cord EncodeFields(const FieldRef& field, const std::vector<FieldRef>& others) {
  std::string text;
  auto add = [&text](const FieldRef& f) {
    if (!text.empty()) text += '\n';
    text += f.path;
    if (!f.written.empty()) absl::StrAppend(&text, "\t", f.written);
  };
  add(field);
  for (const FieldRef& other : others) add(other);
  return absl::Cord(text);
}

// Characters of a name: a mention must not be part of a longer one.
bool IsNameChar(char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Where a value ends: whitespace and the punctuation that closes a clause or a list.
bool EndsValue(char c) {
  return absl::ascii_isspace(static_cast<unsigned char>(c)) || c == ',' || c == ';' || c == ')' ||
         c == ']' || c == '\'' || c == '"';
}

// The value a mention assigns after `end` ("=cache", " = false"): its length in the message
// (separator included) and the value; {0, nullopt} when it assigns none.
std::pair<size_t, std::optional<absl::string_view>> ValueAfter(absl::string_view message,
                                                               size_t end) {
  absl::string_view rest = message.substr(end);
  size_t separator = 0;
  if (absl::StartsWith(rest, "=")) {
    separator = 1;
  } else if (absl::StartsWith(rest, " = ")) {
    separator = 3;
  } else {
    return {0, std::nullopt};
  }
  size_t length = 0;
  while (separator + length < rest.size() && !EndsValue(rest[separator + length])) ++length;
  // A sentence's full stop or colon closes the clause, not the value.
  while (length > 0 && (rest[separator + length - 1] == '.' || rest[separator + length - 1] == ':'))
    --length;
  if (length == 0) return {0, std::nullopt};
  return {separator + length, rest.substr(separator, length)};
}

// The value a field's written form names after its path ("EngineOptions.dtype float32",
// "KVCacheSpec.positions=cache"); nullopt when it names none.
std::optional<absl::string_view> WrittenValue(const FieldRef& field) {
  absl::string_view written = field.written;
  if (!absl::ConsumePrefix(&written, field.path)) return std::nullopt;
  if (!absl::ConsumePrefix(&written, " = ") && !absl::ConsumePrefix(&written, "=") &&
      !absl::ConsumePrefix(&written, " ")) {
    return std::nullopt;
  }
  if (written.empty()) return std::nullopt;
  return written;
}

// Whether `text` stands alone at [at, at + text.size()) of `message`.
bool StandsAlone(absl::string_view message, size_t at, size_t size) {
  if (at > 0 && (IsNameChar(message[at - 1]) || message[at - 1] == '.')) return false;
  const size_t end = at + size;
  if (end < message.size()) {
    if (IsNameChar(message[end])) return false;
    // "A.b" inside "A.b.c".
    if (message[end] == '.' && end + 1 < message.size() && IsNameChar(message[end + 1])) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::Status FieldError(absl::StatusCode code, const FieldRef& field, absl::string_view message,
                        const std::vector<FieldRef>& others) {
  return WithFields(absl::Status(code, message), field, others);
}

absl::Status InvalidFieldError(const FieldRef& field, absl::string_view message,
                               const std::vector<FieldRef>& others) {
  return FieldError(absl::StatusCode::kInvalidArgument, field, message, others);
}

absl::Status WithFields(absl::Status status, const FieldRef& field,
                        const std::vector<FieldRef>& others) {
  if (!status.ok()) status.SetPayload(kFieldPayloadUrl, EncodeFields(field, others));
  return status;
}

std::vector<FieldRef> ErrorFields(const absl::Status& status) {
  std::vector<FieldRef> fields;
  const auto payload = status.GetPayload(kFieldPayloadUrl);  // an absl::optional<absl::Cord>
  if (!payload) return fields;
  for (absl::string_view line : absl::StrSplit(std::string(*payload), '\n', absl::SkipEmpty())) {
    const std::pair<absl::string_view, absl::string_view> parts =
        absl::StrSplit(line, absl::MaxSplits('\t', 1));
    fields.emplace_back(parts.first, parts.second);
  }
  return fields;
}

std::optional<std::string> ErrorField(const absl::Status& status) {
  std::vector<FieldRef> fields = ErrorFields(status);
  if (fields.empty()) return std::nullopt;
  return std::move(fields.front().path);
}

absl::Status WithMessage(const absl::Status& status, absl::string_view message) {
  if (status.ok()) return status;
  absl::Status renewed(status.code(), message);
  status.ForEachPayload([&renewed](absl::string_view url, const absl::Cord& payload) {
    renewed.SetPayload(url, payload);
  });
  return renewed;
}

std::string RenderFields(absl::string_view message, absl::Span<const FieldRef> fields,
                         const FieldTerm& term) {
  // The longest text first where one field's text begins another's.
  std::vector<const FieldRef*> order;
  for (const FieldRef& field : fields) {
    if (!field.text().empty()) order.push_back(&field);
  }
  std::stable_sort(order.begin(), order.end(), [](const FieldRef* a, const FieldRef* b) {
    return a->text().size() > b->text().size();
  });
  std::string out;
  size_t i = 0;
  while (i < message.size()) {
    const FieldRef* found = nullptr;
    for (const FieldRef* field : order) {
      const absl::string_view text = field->text();
      if (message.substr(i, text.size()) == text && StandsAlone(message, i, text.size())) {
        found = field;
        break;
      }
    }
    if (found == nullptr) {
      out += message[i++];
      continue;
    }
    const size_t name_end = i + found->text().size();
    const std::optional<absl::string_view> written_value = WrittenValue(*found);
    const auto [value_size, value] =
        written_value ? std::make_pair(size_t{0}, written_value) : ValueAfter(message, name_end);
    FieldMention mention;
    mention.path = found->path;
    mention.value = value;
    mention.text = message.substr(i, name_end + value_size - i);
    const std::optional<std::string> replacement = term ? term(mention) : std::nullopt;
    out += replacement ? *replacement : std::string(mention.text);
    i = name_end + value_size;
  }
  return out;
}

std::string MessageInTerms(const absl::Status& status, const FieldTerm& term) {
  return RenderFields(status.message(), ErrorFields(status), term);
}

absl::Status RenameField(const absl::Status& status, absl::string_view from, absl::string_view to) {
  std::vector<FieldRef> fields = ErrorFields(status);
  std::vector<FieldRef> renamed;
  bool found = false;
  for (const FieldRef& field : fields) {
    if (field.path != from) continue;
    found = true;
    renamed.push_back(field);
  }
  if (!found) return status;
  // Each mention keeps its value as written ("LoadOptions.verify_checksums = false").
  const std::string message =
      RenderFields(status.message(), renamed,
                   [&to, &renamed](const FieldMention& mention) -> std::optional<std::string> {
                     for (const FieldRef& field : renamed) {
                       if (absl::StartsWith(mention.text, field.text())) {
                         return absl::StrCat(to, mention.text.substr(field.text().size()));
                       }
                     }
                     return std::nullopt;
                   });
  for (FieldRef& field : fields) {
    if (field.path == from) field = FieldRef(to);
  }
  const FieldRef at_fault = fields.front();
  fields.erase(fields.begin());
  return WithFields(WithMessage(status, message), at_fault, fields);
}

}  // namespace lgpt
