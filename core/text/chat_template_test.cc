// Chat templates against Python's jinja2 with Hugging Face's settings: every family's template
// (testdata/chat_templates/templates) with every conversation, byte for byte
// (testdata/chat_templates/goldens.json, written by make_goldens.py), including the templates'
// raise_exception() messages; loading from tokenizer_config.json in its three shapes.
#include "core/text/chat_template.h"

#include <gtest/gtest.h>

#include <ctime>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "core/base/status_field.h"
#include "core/text/jinja.h"
#include "nlohmann/json.hpp"

namespace lgpt {
namespace {

using OrderedJson = nlohmann::ordered_json;

const char kDir[] = "core/text/testdata/chat_templates/";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

OrderedJson ReadJson(const std::string& path) { return OrderedJson::parse(ReadFile(path)); }

// make_goldens.py's clock: 2024-09-26 12:00 local time.
std::time_t FixedNow() {
  std::tm tm{};
  tm.tm_year = 2024 - 1900;
  tm.tm_mon = 8;
  tm.tm_mday = 26;
  tm.tm_hour = 12;
  tm.tm_isdst = -1;
  return std::mktime(&tm);
}

jinja::TemplateOptions GoldenOptions() {
  jinja::TemplateOptions options;
  options.clock = FixedNow;
  return options;
}

std::optional<std::string> Token(const OrderedJson& tokens, const char* key) {
  if (!tokens.contains(key)) return std::nullopt;
  return tokens[key].get<std::string>();
}

TEST(ChatTemplateTest, EveryFamilyMatchesJinja2) {
  const OrderedJson templates = ReadJson(std::string(kDir) + "templates.json");
  const OrderedJson data = ReadJson(std::string(kDir) + "conversations.json");
  const OrderedJson goldens = ReadJson(std::string(kDir) + "goldens.json");
  std::map<std::string, OrderedJson> conversations;
  for (const auto& c : data["conversations"]) conversations[c["name"]] = c;
  ASSERT_GT(goldens.size(), 400u);
  std::map<std::string, int> passed;
  std::set<std::string> failed;
  for (const auto& golden : goldens) {
    const std::string name = golden["template"];
    const OrderedJson& conversation = conversations.at(golden["conversation"]);
    const std::string label = name + " / " + golden["conversation"].get<std::string>() +
                              (golden["add_generation_prompt"].get<bool>() ? " +gen" : "");
    SCOPED_TRACE(label);
    const OrderedJson& tokens = templates[name];
    auto chat = ChatTemplate::FromSource(
        ReadFile(std::string(kDir) + "templates/" + name + ".jinja"), Token(tokens, "bos_token"),
        Token(tokens, "eos_token"), std::nullopt, GoldenOptions());
    ASSERT_TRUE(chat.ok()) << chat.status();
    OrderedJson tools = conversation.value("tools", false) ? data["tools"] : OrderedJson();
    auto rendered =
        chat->Render(conversation["messages"], tools, golden["add_generation_prompt"].get<bool>(),
                     conversation.value("extra", OrderedJson::object()));
    if (golden.contains("output")) {
      ASSERT_TRUE(rendered.ok()) << rendered.status();
      EXPECT_EQ(*rendered, golden["output"].get<std::string>());
      if (*rendered != golden["output"].get<std::string>()) failed.insert(label);
    } else if (golden["raised"].get<bool>()) {
      ASSERT_FALSE(rendered.ok()) << *rendered;
      EXPECT_EQ(rendered.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_TRUE(jinja::IsRaisedByTemplate(rendered.status())) << rendered.status();
      EXPECT_EQ(rendered.status().message(), golden["error"].get<std::string>());
    } else {
      EXPECT_FALSE(rendered.ok()) << "jinja2 failed with " << golden["error"] << ", got\n"
                                  << *rendered;
    }
    ++passed[name];
  }
  EXPECT_TRUE(failed.empty());
  EXPECT_EQ(passed.size(), templates.size());
}

TEST(ChatTemplateTest, LoadsStringTemplateAndAddedTokens) {
  auto chat = ChatTemplate::Load(std::string(kDir) + "checkpoints/llama3_1", GoldenOptions());
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->bos_token(), "<|begin_of_text|>");
  EXPECT_EQ(chat->eos_token(), "<|eot_id|>");
  EXPECT_EQ(chat->source(true), ReadFile(std::string(kDir) + "templates/llama3_1.jinja"));
  OrderedJson messages = OrderedJson::parse(R"([{"role": "user", "content": "Hi"}])");
  auto text = chat->Render(messages, nullptr, true);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
            "Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|"
            "end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateTest, PrefersToolUseTemplateWhenToolsAreGiven) {
  auto chat = ChatTemplate::Load(std::string(kDir) + "checkpoints/hermes");
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->source(false), ReadFile(std::string(kDir) + "templates/chatml_default.jinja"));
  EXPECT_EQ(chat->source(true), ReadFile(std::string(kDir) + "templates/hermes_tool_use.jinja"));
  OrderedJson messages = OrderedJson::parse(R"([{"role": "user", "content": "Hi"}])");
  auto plain = chat->Render(messages, nullptr, false);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(*plain, "<|im_start|>user\nHi<|im_end|>\n");
  OrderedJson tools = ReadJson(std::string(kDir) + "conversations.json")["tools"];
  auto with_tools = chat->Render(messages, tools, true);
  ASSERT_TRUE(with_tools.ok()) << with_tools.status();
  EXPECT_NE(with_tools->find("<tools> {\"type\": \"function\""), std::string::npos);
}

TEST(ChatTemplateTest, LoadsChatTemplateJinjaBesideTheConfig) {
  auto chat = ChatTemplate::Load(std::string(kDir) + "checkpoints/jinja_file");
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->source(false), ReadFile(std::string(kDir) + "templates/qwen2_5.jinja"));
  EXPECT_FALSE(chat->bos_token().has_value());
}

TEST(ChatTemplateTest, MissingTemplateIsNotFound) {
  auto chat = ChatTemplate::Load(std::string(kDir) + "checkpoints/no_template");
  EXPECT_EQ(chat.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ChatTemplate::Load("/nonexistent").status().code(), absl::StatusCode::kNotFound);
}

TEST(ChatTemplateTest, MalformedConfigNamesTheField) {
  auto list = ChatTemplate::FromTokenizerConfig(
      OrderedJson::parse(R"({"chat_template": [{"name": "default", "template": 3}]})"));
  EXPECT_EQ(list.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorField(list.status()), "chat_template[0]");
  auto no_default = ChatTemplate::FromTokenizerConfig(
      OrderedJson::parse(R"({"chat_template": [{"name": "tool_use", "template": "x"}]})"));
  EXPECT_EQ(ErrorField(no_default.status()), "chat_template");
  auto bos = ChatTemplate::FromTokenizerConfig(
      OrderedJson::parse(R"({"chat_template": "x", "bos_token": 5})"));
  EXPECT_EQ(ErrorField(bos.status()), "bos_token");
  auto syntax = ChatTemplate::FromSource("{% for m in messages %}{{ m }");
  EXPECT_EQ(ErrorField(syntax.status()), "chat_template");
  EXPECT_NE(syntax.status().message().find("chat_template:1:"), std::string::npos)
      << syntax.status();
}

TEST(ChatTemplateTest, RenderChecksItsInputs) {
  auto chat = ChatTemplate::FromSource("{{ messages|length }}");
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(ErrorField(chat->Render(OrderedJson::object(), nullptr, false).status()), "messages");
  EXPECT_EQ(ErrorField(chat->Render(OrderedJson::array(), OrderedJson("x"), false).status()),
            "tools");
  EXPECT_EQ(
      ErrorField(chat->Render(OrderedJson::array(), nullptr, false, OrderedJson::array()).status()),
      "extra");
  OrderedJson deep = OrderedJson::array();
  for (int i = 0; i < 300; ++i) deep = OrderedJson::array({deep});
  OrderedJson messages = OrderedJson::array({{{"role", "user"}, {"content", deep}}});
  EXPECT_EQ(ErrorField(chat->Render(messages, nullptr, false).status()), "messages");
}

TEST(ChatTemplateTest, ExtraVariablesWinOverTokensAndPlainJsonWorks) {
  auto chat = ChatTemplate::FromSource("{{ bos_token }}|{{ date_string }}|{{ tools is none }}",
                                       std::string("<s>"), std::string("</s>"));
  ASSERT_TRUE(chat.ok());
  nlohmann::json extra = {{"bos_token", "<B>"}, {"date_string", "today"}};
  auto text = chat->Render(nlohmann::json::array(), nlohmann::json(), false, extra);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "<B>|today|True");
}

TEST(ChatTemplateTest, StringArgumentsBecomeObjects) {
  auto chat = ChatTemplate::FromSource(
      "{% for c in messages[0].tool_calls %}{{ c.function.arguments|tojson }};{% endfor %}");
  ASSERT_TRUE(chat.ok());
  OrderedJson messages = OrderedJson::parse(R"([{"role": "assistant", "tool_calls": [
      {"function": {"name": "f", "arguments": "{\"b\": 1, \"a\": [true]}"}},
      {"function": {"name": "g", "arguments": "not json"}},
      {"function": {"name": "h", "arguments": {"z": null}}}]}])");
  auto text = chat->Render(messages, nullptr, false);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "{\"b\": 1, \"a\": [true]};\"not json\";{\"z\": null};");
}

}  // namespace
}  // namespace lgpt
