// A chat conversation (OpenAI's messages) as the text a checkpoint's prompt style expects.
// Chat styles use their multi-turn layout (PromptStyle::ApplyChat); the others frame each user
// turn with Apply and join the turns as `./lgpt chat` does, so a conversation sent again with
// its replies reads as the same text the chat tool would have fed the model.
#ifndef LGPT_TOOLS_SERVER_CHAT_PROMPT_H_
#define LGPT_TOOLS_SERVER_CHAT_PROMPT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/text/prompt_style.h"

namespace lgpt {

// An optional leading system message, then user and assistant messages alternating, starting
// and ending with a user message; InvalidArgument naming `messages` otherwise.
absl::StatusOr<std::string> ChatPromptText(const PromptStyle& style,
                                           const std::vector<ChatMessage>& messages);

}  // namespace lgpt

#endif  // LGPT_TOOLS_SERVER_CHAT_PROMPT_H_
