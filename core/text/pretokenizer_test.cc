#include "core/text/pretokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace lgpt {
namespace {

std::vector<std::string> Split(PretokenizerPattern pattern, const std::string& text) {
  std::vector<std::string> out;
  for (absl::string_view piece : SplitByPattern(pattern, text)) out.emplace_back(piece);
  return out;
}

using V = std::vector<std::string>;
constexpr auto kGpt2 = PretokenizerPattern::kGpt2;
constexpr auto kLlama3 = PretokenizerPattern::kLlama3;
constexpr auto kQwen2 = PretokenizerPattern::kQwen2;

// Expectations derived by reading the patterns (alternatives are tried left to right, each
// greedy, and `\s+(?!\S)` leaves the last space of a run to the word after it).
TEST(PretokenizerTest, Digits) {
  EXPECT_EQ(Split(kGpt2, "1234567"), V({"1234567"}));
  EXPECT_EQ(Split(kLlama3, "1234567"), V({"123", "456", "7"}));
  EXPECT_EQ(Split(kQwen2, "123"), V({"1", "2", "3"}));
  EXPECT_EQ(Split(kGpt2, "a 12"), V({"a", " 12"}));
  EXPECT_EQ(Split(kLlama3, "a 12"), V({"a", " ", "12"}));  // no optional space before digits
}

TEST(PretokenizerTest, Contractions) {
  EXPECT_EQ(Split(kGpt2, "I'm they're"), V({"I", "'m", " they", "'re"}));
  EXPECT_EQ(Split(kGpt2, "I'M"), V({"I", "'", "M"}));  // case-sensitive
  EXPECT_EQ(Split(kLlama3, "I'M WE'LL"), V({"I", "'M", " WE", "'LL"}));
  EXPECT_EQ(Split(kGpt2, "'x"), V({"'", "x"}));
  EXPECT_EQ(Split(kLlama3, "'x"), V({"'x"}));  // [^\r\n\p{L}\p{N}]?\p{L}+
}

TEST(PretokenizerTest, Whitespace) {
  EXPECT_EQ(Split(kGpt2, "Hello   world"), V({"Hello", "  ", " world"}));
  EXPECT_EQ(Split(kGpt2, "end  "), V({"end", "  "}));
  EXPECT_EQ(Split(kGpt2, "a\tb"), V({"a", "\t", "b"}));
  EXPECT_EQ(Split(kLlama3, "a\tb"), V({"a", "\tb"}));
  EXPECT_EQ(Split(kGpt2, "a\n\nb"), V({"a", "\n", "\n", "b"}));
  EXPECT_EQ(Split(kLlama3, "a\n\nb"), V({"a", "\n\n", "b"}));
  EXPECT_EQ(Split(kLlama3, "  \n  word"), V({"  \n", " ", " word"}));
}

TEST(PretokenizerTest, Punctuation) {
  EXPECT_EQ(Split(kGpt2, "!!abc"), V({"!!", "abc"}));
  EXPECT_EQ(Split(kLlama3, "!abc"), V({"!abc"}));
  EXPECT_EQ(Split(kLlama3, "!!abc"), V({"!!", "abc"}));
  EXPECT_EQ(Split(kLlama3, "x ...\n\ny"), V({"x", " ...\n\n", "y"}));
}

TEST(PretokenizerTest, RecognizesPatterns) {
  for (PretokenizerPattern p : {kGpt2, kLlama3, kQwen2}) {
    EXPECT_EQ(PatternFromRegex(PatternRegex(p)), p);
  }
  EXPECT_EQ(PatternFromRegex("\\s+"), std::nullopt);
}

// Splits computed by Python's `regex` module (make_pretokenizer_cases.py) for crafted and
// random strings.
TEST(PretokenizerTest, MatchesPythonRegex) {
  std::ifstream file("core/text/testdata/pretokenizer_cases.json");
  ASSERT_TRUE(file.good());
  std::stringstream text;
  text << file.rdbuf();
  const nlohmann::json cases = nlohmann::json::parse(text.str(), nullptr, false);
  ASSERT_FALSE(cases.is_discarded());
  ASSERT_GT(cases.size(), 1000u);
  int failures = 0;
  for (const auto& c : cases) {
    const std::string name = c["pattern"].get<std::string>();
    const PretokenizerPattern p = name == "gpt2" ? kGpt2 : name == "llama3" ? kLlama3 : kQwen2;
    const std::string input = c["text"].get<std::string>();
    const V want = c["pieces"].get<V>();
    const V got = Split(p, input);
    if (got != want && ++failures <= 10) {
      ADD_FAILURE() << name << " " << nlohmann::json(input).dump() << "\n  got  "
                    << nlohmann::json(got).dump() << "\n  want " << nlohmann::json(want).dump();
    }
  }
  EXPECT_EQ(failures, 0);
}

}  // namespace
}  // namespace lgpt
