#include "tools/server/chat_prompt.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_field.h"

namespace lgpt {
namespace {

// The shape every style accepts: [system] user (assistant user)*.
absl::Status CheckShape(const std::vector<ChatMessage>& messages) {
  const size_t first = !messages.empty() && messages[0].role == "system" ? 1 : 0;
  if (first == messages.size()) {
    return InvalidFieldError("messages", "'messages' holds no user message");
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const char* expected = (i - first) % 2 == 0 ? "user" : "assistant";
    if (messages[i].role != expected) {
      const std::string field = absl::StrCat("messages[", i, "].role");
      return InvalidFieldError(
          field, absl::StrCat(
                     "'", field, "' must be ", expected,
                     ": after an optional system message, user and assistant messages alternate"));
    }
  }
  if (messages.back().role != "user") {
    return InvalidFieldError(absl::StrCat("messages[", messages.size() - 1, "].role"),
                             "the last of 'messages' must be a user message");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ChatPromptText(const PromptStyle& style,
                                           const std::vector<ChatMessage>& messages) {
  if (absl::Status shape = CheckShape(messages); !shape.ok()) return shape;
  if (style.SupportsChat()) {
    absl::StatusOr<std::string> text = style.ApplyChat(messages);
    if (!text.ok()) {
      return InvalidFieldError("messages", absl::StrCat("'messages': ", text.status().message()));
    }
    return text;
  }
  const bool system = messages[0].role == "system";
  const size_t first = system ? 1 : 0;
  std::string text = style.Apply(messages[first].content, "", system ? messages[0].content : "");
  for (size_t i = first + 1; i + 1 < messages.size(); i += 2) {
    absl::StrAppend(&text, messages[i].content, "\n\n", style.Apply(messages[i + 1].content));
  }
  return text;
}

}  // namespace lgpt
