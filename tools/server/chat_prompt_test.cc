// Chat messages into the prompt style's text, for chat layouts and plain styles.
#include "tools/server/chat_prompt.h"

#include <gtest/gtest.h>

namespace lgpt {
namespace {

TEST(ChatPromptTest, ChatStylesUseTheirMultiTurnLayout) {
  const PromptStyle style = *PromptStyleFromName("llama3");
  ASSERT_TRUE(style.SupportsChat());
  const std::vector<ChatMessage> messages = {
      {"system", "S"}, {"user", "a"}, {"assistant", "b"}, {"user", "c"}};
  EXPECT_EQ(*ChatPromptText(style, messages), *style.ApplyChat(messages));
  // One user message is Apply of it, as generate frames a prompt.
  EXPECT_EQ(*ChatPromptText(style, {{"user", "hello"}}), style.Apply("hello"));
}

TEST(ChatPromptTest, PlainStylesJoinTurnsAsTheChatTool) {
  const PromptStyle style = *PromptStyleFromName("alpaca");
  ASSERT_FALSE(style.SupportsChat());
  EXPECT_EQ(*ChatPromptText(style, {{"user", "a"}}), style.Apply("a"));
  EXPECT_EQ(
      *ChatPromptText(style, {{"system", "S"}, {"user", "a"}, {"assistant", "b"}, {"user", "c"}}),
      style.Apply("a", "", "S") + "b\n\n" + style.Apply("c"));
}

TEST(ChatPromptTest, ShapesOtherThanAlternatingTurnsAreRefused) {
  const PromptStyle style = *PromptStyleFromName("default");
  for (const std::vector<ChatMessage>& messages :
       std::vector<std::vector<ChatMessage>>{{{"system", "S"}},
                                             {{"assistant", "a"}, {"user", "b"}},
                                             {{"user", "a"}, {"user", "b"}},
                                             {{"user", "a"}, {"assistant", "b"}},
                                             {{"user", "a"}, {"system", "b"}, {"user", "c"}}}) {
    const absl::StatusOr<std::string> text = ChatPromptText(style, messages);
    ASSERT_FALSE(text.ok());
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(text.status().message().find("messages"), absl::string_view::npos) << text.status();
  }
}

}  // namespace
}  // namespace lgpt
