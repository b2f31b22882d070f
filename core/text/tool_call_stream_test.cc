// The streamed reply equals the parsed one: for replies of every format (with and without
// calls, malformed calls, text around them, whitespace) split into random pieces, the content
// Feed sends plus Finish's content is ParseToolCalls' content, the calls are its calls, the
// content before a call goes out before the end, and no call text is ever sent.
#include "core/text/tool_call_stream.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace lgpt {
namespace {

struct Streamed {
  std::string sent;  // what Feed returned, concatenated
  ParsedToolCalls rest;
};

Streamed StreamInPieces(const std::string& text, ToolCallFormat format, uint32_t seed) {
  std::mt19937 random(seed);
  ToolCallStream stream(format);
  Streamed out;
  size_t p = 0;
  while (p < text.size()) {
    const size_t length = std::min<size_t>(text.size() - p, 1 + random() % 6);
    out.sent += stream.Feed(text.substr(p, length));
    p += length;
  }
  out.rest = stream.Finish();
  return out;
}

void ExpectSameAsParsed(const std::string& text, ToolCallFormat format) {
  const ParsedToolCalls parsed = ParseToolCalls(text, format);
  for (uint32_t seed = 0; seed < 20; ++seed) {
    SCOPED_TRACE(testing::Message()
                 << ToolCallFormatName(format) << " seed " << seed << ": " << text);
    const Streamed streamed = StreamInPieces(text, format, seed);
    EXPECT_EQ(streamed.sent + streamed.rest.content, parsed.content);
    ASSERT_EQ(streamed.rest.calls.size(), parsed.calls.size());
    for (size_t i = 0; i < parsed.calls.size(); ++i) {
      EXPECT_EQ(streamed.rest.calls[i].name, parsed.calls[i].name);
      EXPECT_EQ(streamed.rest.calls[i].arguments, parsed.calls[i].arguments);
      EXPECT_EQ(streamed.rest.calls[i].id, parsed.calls[i].id);
    }
    for (const char* marker : {"<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "\"name\""}) {
      EXPECT_EQ(streamed.sent.find(marker), std::string::npos) << marker;
    }
  }
}

TEST(ToolCallStreamTest, EveryFormatEqualsTheParse) {
  const std::string hermes_call =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call>";
  const std::vector<std::pair<ToolCallFormat, std::vector<std::string>>> cases = {
      {ToolCallFormat::kHermes,
       {"Plain text, no call at all.", "  leading and trailing space  \n",
        "Let me check.\n" + hermes_call, hermes_call + "\n" + hermes_call,
        "Before " + hermes_call + " between " + hermes_call + " after.",
        "Broken <tool_call>{\"name\": \"x\", \"arguments\": {</tool_call> text",
        "Looks like a <tool but is not", "ends with a partial marker <tool_c",
        "<tool_call>[{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": "
        "{\"k\": 1}}]</tool_call>",
        "unterminated <tool_call>{\"name\": \"a\", \"arguments\": {}}"}},
      {ToolCallFormat::kLlama3,
       {"No call here.", "{\"name\": \"f\", \"parameters\": {\"x\": 1}}",
        "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\", \"parameters\": "
        "{\"y\": \"z\"}}",
        "Code: { not json } and more", "Sure: {\"name\": \"f\", \"parameters\": {}} done",
        "<|python_ta"}},
      {ToolCallFormat::kMistral,
       {"Just words [TOOL and more", "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}]",
        "Text first [TOOL_CALLS]get[CALL_ID]abc123[ARGS]{\"q\": \"w\"}",
        "[TOOL_CALLS][{\"name\": broken"}},
      {ToolCallFormat::kGeneric,
       {"Hello world", "{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}}",
        "  Answer: {\"name\": \"f\", \"arguments\": {}}  ", "braces { that } are not calls"}},
  };
  for (const auto& [format, texts] : cases) {
    for (const std::string& text : texts) ExpectSameAsParsed(text, format);
  }
}

TEST(ToolCallStreamTest, ContentBeforeACallGoesOutBeforeTheEnd) {
  ToolCallStream stream(ToolCallFormat::kHermes);
  EXPECT_EQ(stream.Feed("Let me "), "Let me");  // the space waits for what follows
  EXPECT_EQ(stream.Feed("check.\n<tool"), " check.");
  EXPECT_FALSE(stream.holding());
  EXPECT_EQ(stream.Feed("_call>{\"name\": \"f\", \"arguments\": {}}"), "");
  EXPECT_TRUE(stream.holding());
  EXPECT_EQ(stream.Feed("</tool_call> More text."), "");
  const ParsedToolCalls rest = stream.Finish();
  ASSERT_EQ(rest.calls.size(), 1u);
  EXPECT_EQ(rest.calls[0].name, "f");
  EXPECT_EQ(rest.calls[0].arguments, "{}");
  EXPECT_EQ(rest.content, "\n More text.");  // the parse keeps the text around the call
}

TEST(ToolCallStreamTest, TextWithoutCallsStreamsWhole) {
  ToolCallStream stream(ToolCallFormat::kHermes);
  std::string sent;
  for (const char* piece : {"  The", " answer", " is", " 42", ".\n"}) sent += stream.Feed(piece);
  EXPECT_EQ(sent, "The answer is 42.");
  const ParsedToolCalls rest = stream.Finish();
  EXPECT_TRUE(rest.calls.empty());
  EXPECT_EQ(rest.content, "");
}

}  // namespace
}  // namespace lgpt
