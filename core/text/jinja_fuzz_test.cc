// Hostile templates: every family's chat template with random bytes deleted, inserted or
// swapped must parse or fail cleanly and, where it parses, render or fail cleanly, within the
// limits. CI also runs it under AddressSanitizer (targets tagged "asan").
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/text/jinja.h"
#include "core/text/jinja_value.h"
#include "nlohmann/json.hpp"

namespace lgpt {
namespace jinja {
namespace {

const char kDir[] = "core/text/testdata/chat_templates/";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

TEST(JinjaFuzzTest, MutatedTemplatesFailCleanly) {
  const auto templates =
      nlohmann::ordered_json::parse(ReadFile(std::string(kDir) + "templates.json"));
  const auto data =
      nlohmann::ordered_json::parse(ReadFile(std::string(kDir) + "conversations.json"));
  ValueDict context;
  context.Set("messages", Value::FromJson(data["conversations"][6]["messages"]));
  context.Set("tools", Value::FromJson(data["tools"]));
  context.Set("add_generation_prompt", Value(true));
  context.Set("bos_token", Value("<s>"));
  context.Set("eos_token", Value("</s>"));
  TemplateOptions options;
  options.max_output_bytes = 1 << 16;
  options.max_iterations = 10000;
  const std::string alphabet = "{}%#-+()[]'\"|.,:=~*/ \nabcx0129";
  std::mt19937 rng(1234);
  int parsed = 0, rendered = 0;
  for (auto it = templates.begin(); it != templates.end(); ++it) {
    const std::string source = ReadFile(std::string(kDir) + "templates/" + it.key() + ".jinja");
    for (int round = 0; round < 150; ++round) {
      std::string mutated = source;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits && !mutated.empty(); ++e) {
        size_t at = rng() % mutated.size();
        switch (rng() % 3) {
          case 0:
            mutated.erase(at, 1 + rng() % 3);
            break;
          case 1:
            mutated.insert(at, 1, alphabet[rng() % alphabet.size()]);
            break;
          default:
            mutated[at] = static_cast<char>(rng() % 256);
        }
      }
      auto t = Template::Parse(mutated, options);
      if (!t.ok()) {
        EXPECT_FALSE(t.status().message().empty());
        continue;
      }
      ++parsed;
      auto text = t->Render(context);
      if (text.ok()) {
        ++rendered;
        EXPECT_LE(text->size(), static_cast<size_t>(options.max_output_bytes));
      }
    }
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(rendered, 0);
}

TEST(JinjaFuzzTest, RandomBytesFailCleanly) {
  std::mt19937 rng(99);
  const std::string pieces[] = {"{{",     "}}",   "{%", "%}",   "{#",    "#}",     "-",    "+",
                                "if ",    "for ", "x",  " in ", "(",     ")",      "[",    "]",
                                "'",      "\"",   "|",  ".",    "endif", "endfor", "set ", "=",
                                "macro ", "\n",   " ",  "1",    "~",     "not "};
  for (int round = 0; round < 3000; ++round) {
    std::string source;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) source += pieces[rng() % (sizeof(pieces) / sizeof(pieces[0]))];
    auto t = Template::Parse(source);
    if (t.ok()) (void)t->Render({});
  }
}

}  // namespace
}  // namespace jinja
}  // namespace lgpt
