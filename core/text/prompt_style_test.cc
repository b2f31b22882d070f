// Prompt styles against LitGPT's own strings (testdata/prompt_styles/golden.json, written by
// make_golden.py running LitGPT's prompts.py), plus the multi-turn and lookup contracts.
#include "core/text/prompt_style.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace lgpt {
namespace {

nlohmann::json Golden() {
  std::ifstream in("core/text/testdata/prompt_styles/golden.json");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return nlohmann::json::parse(buffer.str());
}

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(PromptStyleTest, ApplyMatchesLitGptByteForByte) {
  const nlohmann::json golden = Golden();
  ASSERT_GT(golden["apply"].size(), 200u);
  for (const auto& c : golden["apply"]) {
    absl::StatusOr<PromptStyle> style = PromptStyleFromName(c["style"].get<std::string>());
    ASSERT_TRUE(style.ok()) << style.status();
    const std::string input = c.value("input", "");
    const std::string sys = c.value("sys_prompt", "");
    EXPECT_EQ(style->Apply(c["prompt"].get<std::string>(), input, sys),
              c["text"].get<std::string>())
        << c.dump();
  }
}

TEST(PromptStyleTest, ClassNamesMatchLitGptRegistry) {
  const nlohmann::json golden = Golden();
  for (const auto& [name, class_name] : golden["classes"].items()) {
    absl::StatusOr<PromptStyle> style = PromptStyleFromName(name);
    ASSERT_TRUE(style.ok()) << style.status();
    EXPECT_EQ(style->class_name(), class_name.get<std::string>());
    EXPECT_EQ(PromptStyleFromClassPath("litgpt.prompts." + style->class_name())->name(), name);
  }
}

TEST(PromptStyleTest, ModelNamePatternsMatchLitGpt) {
  for (const auto& c : Golden()["model_names"]) {
    EXPECT_EQ(PromptStyleForModelName(c["model_name"].get<std::string>()).class_name(),
              c["class"].get<std::string>())
        << c["model_name"];
  }
}

TEST(PromptStyleTest, ListConversationsMatchLitGpt) {
  for (const auto& c : Golden()["chat"]) {
    std::vector<ChatMessage> messages;
    for (const auto& m : c["turns"]) {
      messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    const PromptStyle style = *PromptStyleFromName(c["style"].get<std::string>());
    absl::StatusOr<std::string> text = style.ApplyChat(messages);
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(*text, c["text"].get<std::string>()) << c.dump();
  }
}

TEST(PromptStyleTest, IncrementalTurnExtendsTheConversation) {
  for (const std::string& name : PromptStyleNames()) {
    const PromptStyle style = *PromptStyleFromName(name);
    if (!style.SupportsChat()) continue;
    std::vector<ChatMessage> messages = {{"system", "Be brief."}, {"user", "Hi"}};
    const std::string first = *style.ApplyChat(messages);
    // The first turn is the single-turn layout.
    EXPECT_EQ(first, style.Apply("Hi", "", "Be brief.")) << name;
    messages.push_back({"assistant", "Hello!"});
    messages.push_back({"user", "And then?"});
    const std::string second = *style.ApplyChat(messages);
    EXPECT_EQ(second, first + "Hello!" + *style.ContinueChat("And then?")) << name;
    messages.push_back({"assistant", "Amen."});
    messages.push_back({"user", "Bye"});
    EXPECT_EQ(*style.ApplyChat(messages), second + "Amen." + *style.ContinueChat("Bye")) << name;
  }
  for (const char* name : {"llama2", "llama3", "qwen2.5", "gemma", "phi-3", "codellama",
                           "tinyllama", "stablelm-zephyr"}) {
    EXPECT_TRUE(PromptStyleFromName(name)->SupportsChat()) << name;
  }
}

TEST(PromptStyleTest, ChatShapesAreChecked) {
  const PromptStyle llama3 = *PromptStyleFromName("llama3");
  EXPECT_EQ(llama3.ApplyChat({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(llama3.ApplyChat({{"user", "a"}, {"user", "b"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(llama3.ApplyChat({{"user", "a"}, {"assistant", "b"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(llama3.ApplyChat({{"user", "a"}, {"tool", "b"}, {"user", "c"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(llama3.ApplyChat({{"user", "a"}, {"system", "b"}, {"user", "c"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  const PromptStyle alpaca = *PromptStyleFromName("alpaca");
  EXPECT_EQ(alpaca.ApplyChat({{"user", "a"}}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(alpaca.ContinueChat("a").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(PromptStyleTest, UnknownNamesAreErrors) {
  absl::StatusOr<PromptStyle> style = PromptStyleFromName("alpacca");
  EXPECT_EQ(style.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(style.status().message().find("alpacca"), std::string::npos);
  EXPECT_NE(style.status().message().find("alpaca"), std::string::npos);  // lists known ones
  EXPECT_EQ(PromptStyleFromClassPath("litgpt.prompts.Nope").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(PromptStyleFromClassPath("my.module.Custom").status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST(PromptStyleTest, StopTokens) {
  const std::map<std::string, int64_t> vocab = {{"<|eot_id|>", 9}, {"User", 5}, {":", 6}};
  const TokenLookup lookup = [&](absl::string_view token) -> std::optional<int64_t> {
    auto it = vocab.find(std::string(token));
    if (it == vocab.end()) return std::nullopt;
    return it->second;
  };
  using Ids = std::vector<std::vector<int64_t>>;
  EXPECT_EQ(PromptStyleFromName("llama3")->StopTokenIds(2, lookup), (Ids{{2}, {9}}));
  EXPECT_EQ(PromptStyleFromName("falcon")->StopTokenIds(2, lookup), (Ids{{2}, {5, 6}, {193, 5}}));
  // Tokens the tokenizer lacks leave their sequence out.
  EXPECT_EQ(PromptStyleFromName("qwen3")->StopTokenIds(2, lookup), (Ids{{2}}));
  EXPECT_EQ(PromptStyleFromName("alpaca")->StopTokenIds(std::nullopt, lookup), Ids{});
}

TEST(PromptStyleTest, ForCheckpoint) {
  Config config;
  config.name = "Llama-3.2-1B-Instruct";
  const std::string dir = TempDir("prompt_style_ckpt");
  EXPECT_EQ(PromptStyleForCheckpoint(dir, config)->name(), "llama3");
  WriteFile(dir + "/prompt_style.yaml", PromptStyleFromName("alpaca")->ToYaml());
  EXPECT_EQ(PromptStyleFromName("alpaca")->ToYaml(), "class_path: litgpt.prompts.Alpaca\n");
  EXPECT_EQ(PromptStyleForCheckpoint(dir, config)->name(), "alpaca");
  WriteFile(dir + "/prompt_style.yaml", "class_path: [unclosed\n");
  absl::StatusOr<PromptStyle> bad = PromptStyleForCheckpoint(dir, config);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("prompt_style.yaml"), std::string::npos);
  WriteFile(dir + "/prompt_style.yaml", "class_path: litgpt.prompts.Unknown\n");
  EXPECT_EQ(PromptStyleForCheckpoint(dir, config).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace lgpt
