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

ChatRenderer::ChatRenderer(std::optional<ChatTemplate> chat_template, PromptStyle style)
    : chat_template_(std::move(chat_template)), style_(std::move(style)) {
  if (chat_template_) tool_format_ = ToolCallFormatForTemplate(chat_template_->source(true));
}

absl::StatusOr<std::string> ChatRenderer::Render(const std::vector<ChatMessage>& messages,
                                                 const nlohmann::ordered_json& message_json,
                                                 const nlohmann::ordered_json& tools) const {
  if (chat_template_) {
    absl::StatusOr<std::string> text =
        chat_template_->Render(message_json, tools, /*add_generation_prompt=*/true);
    if (!text.ok() && !ErrorField(text.status())) {
      // The template's own raise_exception: about the conversation it was given.
      return InvalidFieldError("messages", text.status().message());
    }
    return text;
  }
  // A prompt style has no layout for tool results or an assistant's calls: refused (tool
  // results first), not dropped.
  const auto has_calls = [&message_json](size_t i) {
    return i < message_json.size() && message_json[i].contains("tool_calls") &&
           !message_json[i]["tool_calls"].is_null() && !message_json[i]["tool_calls"].empty();
  };
  for (const bool calls : {false, true}) {
    for (size_t i = 0; i < messages.size(); ++i) {
      if (calls ? !has_calls(i) : messages[i].role != "tool") continue;
      const std::string field = absl::StrCat("messages[", i, "].", calls ? "tool_calls" : "role");
      return InvalidFieldError(field, absl::StrCat("'", field,
                                                   "' needs the checkpoint's chat template "
                                                   "(tokenizer_config.json's chat_template); "
                                                   "this one has a prompt style"));
    }
  }
  return ChatPromptText(style_, messages);
}

}  // namespace lgpt
