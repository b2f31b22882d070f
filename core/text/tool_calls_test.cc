// Tool calls in generated text, per format: one and several calls, text around them, string
// arguments, malformed JSON (no call, the text kept), the format picked from each family's
// template, and the forced-call prefix parsing back as a call.
#include "core/text/tool_calls.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace lgpt {
namespace {

std::string Template(const std::string& name) {
  std::ifstream in("core/text/testdata/chat_templates/templates/" + name + ".jinja");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

TEST(ToolCallsTest, FormatFromTemplate) {
  EXPECT_EQ(ToolCallFormatForTemplate(Template("qwen2_5")), ToolCallFormat::kHermes);
  EXPECT_EQ(ToolCallFormatForTemplate(Template("hermes_tool_use")), ToolCallFormat::kHermes);
  EXPECT_EQ(ToolCallFormatForTemplate(Template("falcon3")), ToolCallFormat::kHermes);
  EXPECT_EQ(ToolCallFormatForTemplate(Template("llama3_1")), ToolCallFormat::kLlama3);
  EXPECT_EQ(ToolCallFormatForTemplate(Template("llama3_2")), ToolCallFormat::kLlama3);
  EXPECT_EQ(ToolCallFormatForTemplate(Template("mistral_v3_tools")), ToolCallFormat::kMistral);
  EXPECT_EQ(ToolCallFormatForTemplate(Template("llama3")), ToolCallFormat::kGeneric);
  EXPECT_EQ(ToolCallFormatForTemplate(Template("phi3")), ToolCallFormat::kGeneric);
  EXPECT_EQ(ToolCallFormatName(ToolCallFormat::kMistral), "mistral");
}

TEST(ToolCallsTest, HermesOneAndSeveral) {
  ParsedToolCalls one = ParseToolCalls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"unit\": \"celsius\"}}\n</tool_call>",
      ToolCallFormat::kHermes);
  EXPECT_EQ(one.content, "Let me check.");
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(one.calls[0].name, "get_weather");
  EXPECT_EQ(one.calls[0].arguments, "{\"city\":\"Paris\",\"unit\":\"celsius\"}");

  ParsedToolCalls two = ParseToolCalls(
      "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"b\", "
      "\"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>",
      ToolCallFormat::kHermes);
  EXPECT_EQ(two.content, "");
  ASSERT_EQ(two.calls.size(), 2u);
  EXPECT_EQ(two.calls[1].name, "b");
  EXPECT_EQ(two.calls[1].arguments, "{\"x\":1}");
}

TEST(ToolCallsTest, HermesListInOneBlockAndUnclosedBlock) {
  ParsedToolCalls falcon = ParseToolCalls(
      "<tool_call>\n[{\"name\": \"a\", \"arguments\": {\"k\": \"é\"}}, {\"name\": \"b\", "
      "\"arguments\": {}}]\n</tool_call>",
      ToolCallFormat::kHermes);
  ASSERT_EQ(falcon.calls.size(), 2u);
  EXPECT_EQ(falcon.calls[0].arguments, "{\"k\":\"é\"}");
  ParsedToolCalls unclosed = ParseToolCalls(
      "<tool_call>{\"name\": \"a\", \"arguments\": {\"z\": [1, 2]}}", ToolCallFormat::kHermes);
  ASSERT_EQ(unclosed.calls.size(), 1u);
  EXPECT_EQ(unclosed.calls[0].arguments, "{\"z\":[1,2]}");
}

TEST(ToolCallsTest, HermesMalformedKeepsText) {
  const std::string text =
      "Sure <tool_call>{\"name\": \"a\", \"arguments\": {\"x\": }</tool_call> done";
  ParsedToolCalls parsed = ParseToolCalls(text, ToolCallFormat::kHermes);
  EXPECT_TRUE(parsed.calls.empty());
  EXPECT_EQ(parsed.content, text);
  ParsedToolCalls no_name =
      ParseToolCalls("<tool_call>{\"arguments\": {}}</tool_call>", ToolCallFormat::kHermes);
  EXPECT_TRUE(no_name.calls.empty());
  EXPECT_EQ(no_name.content, "<tool_call>{\"arguments\": {}}</tool_call>");
  ParsedToolCalls mixed = ParseToolCalls(
      "<tool_call>{bad}</tool_call><tool_call>{\"name\": \"ok\", \"arguments\": {}}</tool_call>",
      ToolCallFormat::kHermes);
  ASSERT_EQ(mixed.calls.size(), 1u);
  EXPECT_EQ(mixed.content, "<tool_call>{bad}</tool_call>");
}

TEST(ToolCallsTest, Llama3JsonAndPythonTag) {
  ParsedToolCalls plain =
      ParseToolCalls("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
                     ToolCallFormat::kLlama3);
  ASSERT_EQ(plain.calls.size(), 1u);
  EXPECT_EQ(plain.calls[0].arguments, "{\"city\":\"Paris\"}");
  EXPECT_EQ(plain.content, "");
  ParsedToolCalls tagged = ParseToolCalls(
      "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": "
      "{\"q\": \"}\"}}",
      ToolCallFormat::kLlama3);
  ASSERT_EQ(tagged.calls.size(), 2u);
  EXPECT_EQ(tagged.calls[1].arguments, "{\"q\":\"}\"}");
  ParsedToolCalls text = ParseToolCalls("The answer is 4.", ToolCallFormat::kLlama3);
  EXPECT_TRUE(text.calls.empty());
  EXPECT_EQ(text.content, "The answer is 4.");
  ParsedToolCalls malformed =
      ParseToolCalls("{\"name\": \"a\", \"parameters\": {\"x\": 1}", ToolCallFormat::kLlama3);
  EXPECT_TRUE(malformed.calls.empty());
  EXPECT_EQ(malformed.content, "{\"name\": \"a\", \"parameters\": {\"x\": 1}");
  ParsedToolCalls not_a_call =
      ParseToolCalls("Here: {\"city\": \"Paris\"}", ToolCallFormat::kLlama3);
  EXPECT_TRUE(not_a_call.calls.empty());
}

TEST(ToolCallsTest, MistralListAndNewerForm) {
  ParsedToolCalls list = ParseToolCalls(
      "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": "
      "\"abc123xyz\"}, {\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}]",
      ToolCallFormat::kMistral);
  ASSERT_EQ(list.calls.size(), 2u);
  EXPECT_EQ(list.calls[0].id, "abc123xyz");
  EXPECT_EQ(list.calls[1].arguments, "{\"query\":\"x\"}");
  EXPECT_EQ(list.content, "");
  ParsedToolCalls newer = ParseToolCalls(
      "Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}[TOOL_CALLS]search[CALL_ID]"
      "id0000001[ARGS]{}",
      ToolCallFormat::kMistral);
  ASSERT_EQ(newer.calls.size(), 2u);
  EXPECT_EQ(newer.content, "Checking.");
  EXPECT_EQ(newer.calls[0].name, "get_weather");
  EXPECT_EQ(newer.calls[1].id, "id0000001");
  ParsedToolCalls malformed =
      ParseToolCalls("[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {]", ToolCallFormat::kMistral);
  EXPECT_TRUE(malformed.calls.empty());
  EXPECT_EQ(malformed.content, "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {]");
  EXPECT_TRUE(ParseToolCalls("No calls here.", ToolCallFormat::kMistral).calls.empty());
}

TEST(ToolCallsTest, GenericBareObject) {
  ParsedToolCalls parsed =
      ParseToolCalls("I will call it: {\"name\": \"lookup\", \"arguments\": {\"id\": 7}}",
                     ToolCallFormat::kGeneric);
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].name, "lookup");
  EXPECT_EQ(parsed.content, "I will call it:");
  ParsedToolCalls string_arguments =
      ParseToolCalls("{\"name\": \"f\", \"arguments\": \"not json\"}", ToolCallFormat::kGeneric);
  EXPECT_TRUE(string_arguments.calls.empty());
}

TEST(ToolCallsTest, ForcedPrefixParsesBack) {
  for (ToolCallFormat format : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3,
                                ToolCallFormat::kMistral, ToolCallFormat::kGeneric}) {
    SCOPED_TRACE(std::string(ToolCallFormatName(format)));
    ForcedToolCall forced = ForcedToolCallText(format, "get_\"weather\"");
    ParsedToolCalls parsed =
        ParseToolCalls(forced.prefix + "{\"city\": \"Paris\"}" + forced.suffix, format);
    ASSERT_EQ(parsed.calls.size(), 1u);
    EXPECT_EQ(parsed.calls[0].name, "get_\"weather\"");
    EXPECT_EQ(parsed.calls[0].arguments, "{\"city\":\"Paris\"}");
    EXPECT_EQ(parsed.content, "");
  }
  EXPECT_EQ(ForcedToolCallText(ToolCallFormat::kHermes, "f").prefix,
            "<tool_call>\n{\"name\": \"f\", \"arguments\": ");
}

}  // namespace
}  // namespace lgpt
