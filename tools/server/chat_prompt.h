// A chat conversation (OpenAI's messages) as the text a checkpoint's prompt style expects.
// Chat styles use their multi-turn layout (PromptStyle::ApplyChat); the others frame each user
// turn with Apply and join the turns as `./lgpt chat` does, so a conversation sent again with
// its replies reads as the same text the chat tool would have fed the model.
#ifndef LGPT_TOOLS_SERVER_CHAT_PROMPT_H_
#define LGPT_TOOLS_SERVER_CHAT_PROMPT_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/text/chat_template.h"
#include "core/text/prompt_style.h"
#include "core/text/tool_calls.h"
#include "nlohmann/json.hpp"

namespace lgpt {

// An optional leading system message, then user and assistant messages alternating, starting
// and ending with a user message; InvalidArgument naming `messages` otherwise.
absl::StatusOr<std::string> ChatPromptText(const PromptStyle& style,
                                           const std::vector<ChatMessage>& messages);

// A chat request's prompt text: through the checkpoint's Hugging Face chat template when it has
// one (messages with tool calls and tool results, tools offered), else through its LitGPT
// prompt style (ChatPromptText: system, user and assistant turns only).
class ChatRenderer {
 public:
  ChatRenderer(std::optional<ChatTemplate> chat_template, PromptStyle style);

  // `messages` as parsed and `message_json` as given; `tools` null or an array. Errors name
  // the field (a tool message without a template: its role).
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     const nlohmann::ordered_json& message_json,
                                     const nlohmann::ordered_json& tools) const;
  // Whether the text carries its own special tokens (a template's bos_token): encode it
  // without adding BOS, as transformers' apply_chat_template does.
  bool has_template() const { return chat_template_.has_value(); }
  // The format the model writes tool calls in (its template's; kGeneric without one).
  ToolCallFormat tool_format() const { return tool_format_; }
  const PromptStyle& style() const { return style_; }

 private:
  std::optional<ChatTemplate> chat_template_;
  PromptStyle style_;
  ToolCallFormat tool_format_ = ToolCallFormat::kGeneric;
};

}  // namespace lgpt

#endif  // LGPT_TOOLS_SERVER_CHAT_PROMPT_H_
