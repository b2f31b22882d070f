#include "core/constrain/regex.h"

#include <random>
#include <string>
#include <vector>

#include "core/base/status_field.h"
#include "core/constrain/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "re2/re2.h"

namespace lgpt {
namespace {

using ::testing::HasSubstr;

constexpr const char* kPatterns[] = {
    "abc",
    "a|b|cd",
    "^(ab)*c?$",
    "[a-c]+x{2,3}",
    R"(\d{3}-\d{4})",
    R"([A-Z][a-z]*(?: [A-Z][a-z]*){0,2})",
    R"(\w+@\w+\.(com|org))",
    R"([^a-c\d]{1,4}\.)",
    R"((?P<year>\d{4})-(?P<m>0[1-9]|1[0-2]))",
    R"(.{2,})",
    R"(\s*\S+\s*)",
    R"([\x41-\x43é€]+\x{e9}?)",
    R"(a{2}b{0,}c{1,}?)",
    R"(\[\]\(\)\{\}\*\+\?\.\\\|\^\$)",
    R"((a|)b)",
    R"(x\D\W)",
    R"([-a]b[a-])",
    R"(a{,2})",  // a literal brace, as RE2
    R"(^a$|^b+$)",
    R"(((^ab|c)$))",
};

// Characters the pattern tests draw from.
constexpr absl::string_view kAlphabet = "abcdxyzABC019-@.é€ \n{},[]()*+?\\|^$_MO";

std::string RandomString(std::mt19937_64* rng) {
  static const std::vector<std::string>* const pieces = [] {
    auto* out = new std::vector<std::string>;
    for (size_t i = 0; i < kAlphabet.size();) {
      size_t length = 1;
      const uint8_t b = static_cast<uint8_t>(kAlphabet[i]);
      if (b >= 0xE0)
        length = 3;
      else if (b >= 0xC0)
        length = 2;
      out->push_back(std::string(kAlphabet.substr(i, length)));
      i += length;
    }
    return out;
  }();
  std::string s;
  const int length = static_cast<int>((*rng)() % 8);
  for (int i = 0; i < length; ++i) s += (*pieces)[(*rng)() % pieces->size()];
  return s;
}

TEST(RegexTest, AgreesWithRe2) {
  auto vocabulary = SyntheticVocabulary(11, 3000, kAlphabet);
  for (const char* pattern : kPatterns) {
    SCOPED_TRACE(pattern);
    absl::StatusOr<std::shared_ptr<const Grammar>> grammar = CompileRegex(pattern, "guided_regex");
    ASSERT_TRUE(grammar.ok()) << grammar.status();
    RE2 re(pattern);
    ASSERT_TRUE(re.ok()) << re.error();
    std::mt19937_64 rng(1);
    // Sentences of the grammar match the regex.
    int sampled = 0;
    for (int walk = 0; walk < 60; ++walk) {
      std::optional<std::string> text =
          RandomWalk(GrammarMatcher(*grammar, vocabulary), &rng, 60, 0.3);
      if (!text) continue;
      ++sampled;
      EXPECT_TRUE(RE2::FullMatch(*text, re)) << "\"" << *text << "\"";
    }
    EXPECT_GT(sampled, 30);
    // On random strings, both agree.
    for (int i = 0; i < 3000; ++i) {
      const std::string s = RandomString(&rng);
      EXPECT_EQ(GrammarAccepts(*grammar, s), RE2::FullMatch(s, re)) << "\"" << s << "\"";
    }
  }
}

TEST(RegexTest, JsonStringBodyEscapes) {
  auto vocabulary = SyntheticVocabulary(12, 3000, "ab\"\\\n\tnut0-9");
  for (const char* pattern : {R"([^a]{0,6})", R"(("|\\|\n|a|.)+)", R"(.*)", R"([\x00-\x22]*)"}) {
    SCOPED_TRACE(pattern);
    absl::StatusOr<std::string> body = RegexToGbnf(pattern, "pattern", RegexText::kJsonString);
    ASSERT_TRUE(body.ok()) << body.status();
    auto grammar = CompileGbnf("root ::= \"\\\"\" " + *body + " \"\\\"\"");
    ASSERT_TRUE(grammar.ok()) << grammar.status();
    RE2 re(pattern);
    std::mt19937_64 rng(2);
    int sampled = 0;
    for (int walk = 0; walk < 60; ++walk) {
      std::optional<std::string> text =
          RandomWalk(GrammarMatcher(*grammar, vocabulary), &rng, 60, 0.3);
      if (!text) continue;
      ++sampled;
      const nlohmann::json parsed = nlohmann::json::parse(*text, nullptr, false);
      ASSERT_TRUE(parsed.is_string()) << *text;
      EXPECT_TRUE(RE2::FullMatch(parsed.get<std::string>(), re)) << *text;
    }
    EXPECT_GT(sampled, 30);
  }
}

TEST(RegexTest, RefusalsNameTheFieldAndOffset) {
  const auto error = [](absl::string_view pattern) {
    absl::StatusOr<std::shared_ptr<const Grammar>> grammar = CompileRegex(pattern, "guided_regex");
    EXPECT_FALSE(grammar.ok()) << pattern;
    EXPECT_EQ(grammar.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ErrorField(grammar.status()), "guided_regex");
    return std::string(grammar.status().message());
  };
  EXPECT_THAT(error("ab(c"), HasSubstr("guided_regex: regex \"ab(c\" at offset 2: unbalanced ("));
  EXPECT_THAT(error("abc)"), HasSubstr("at offset 3: unbalanced )"));
  EXPECT_THAT(error(R"((a)\1)"), HasSubstr("at offset 3: the escape \\1 is not supported"));
  EXPECT_THAT(error("a(?=b)"), HasSubstr("at offset 1: lookaround"));
  EXPECT_THAT(error("(?i)a"), HasSubstr("not supported"));
  EXPECT_THAT(error(R"(\bword)"), HasSubstr("\\b is not supported"));
  EXPECT_THAT(error("a^b"), HasSubstr("at offset 1: ^ is supported only at the start"));
  EXPECT_THAT(error("a$b"), HasSubstr("at offset 1: $ is supported only at the end"));
  EXPECT_THAT(error("(a$|b)c"), HasSubstr("at offset 2: $ is supported only at the end"));
  EXPECT_THAT(error("x(^a)"), HasSubstr("at offset 2: ^ is supported only at the start"));
  EXPECT_THAT(error("*a"), HasSubstr("nothing to repeat"));
  EXPECT_THAT(error("(a?)*"), HasSubstr("at offset 4: an unbounded repetition"));
  EXPECT_THAT(error("[z-a]"), HasSubstr("bad character range"));
  EXPECT_THAT(error("[abc"), HasSubstr("at offset 0: unterminated character class"));
  EXPECT_THAT(error("[[:alpha:]]"), HasSubstr("POSIX"));
  EXPECT_THAT(error("a{3,2}"), HasSubstr("max < min"));
  EXPECT_THAT(error("a*+"), HasSubstr("possessive"));
  EXPECT_THAT(error(R"(\x4)"), HasSubstr("malformed hexadecimal escape"));
  EXPECT_THAT(error(std::string(100, '(') + "a" + std::string(100, ')')),
              HasSubstr("groups nest deeper than 64"));
}

// Random patterns of the supported subset agree with RE2, both ways.
std::string RandomPattern(std::mt19937_64* rng, int depth) {
  const auto pick = [&](int n) { return static_cast<int>((*rng)() % n); };
  std::string out;
  const int items = 1 + pick(3);
  for (int i = 0; i < items; ++i) {
    std::string atom;
    switch (pick(depth > 2 ? 6 : 8)) {
      case 0:
        atom = std::string(1, "abc-"[pick(4)]);
        break;
      case 1:
        atom = std::vector<std::string>{"[a-c]", "[^ab]", "[\\d.]", "[é-ë]", "[^\\w]"}[pick(5)];
        break;
      case 2:
        atom = std::vector<std::string>{"\\d", "\\w", "\\s", "\\S", "\\.", "."}[pick(6)];
        break;
      case 3:
        atom = "é";
        break;
      case 4:
      case 5:
        atom = std::string(1, "ab"[pick(2)]);
        break;
      default: {
        std::string group = RandomPattern(rng, depth + 1);
        if (pick(2)) group += "|" + RandomPattern(rng, depth + 1);
        atom = (pick(2) ? "(?:" : "(") + group + ")";
      }
    }
    const int quantifier = pick(8);
    if (quantifier == 0) atom += "?";
    if (quantifier == 1) atom += "{1,2}";
    if (quantifier == 2) atom += "{2}";
    // Unbounded repetitions only of what cannot match the empty text.
    if (quantifier == 3 && atom[0] != '(') atom += "*";
    if (quantifier == 4 && atom[0] != '(') atom += "+";
    out += atom;
  }
  return out;
}

TEST(RegexTest, RandomPatternsAgreeWithRe2) {
  auto vocabulary = SyntheticVocabulary(13, 2000, "abc-9._ \xC3\xA9\xC3\xAB");
  std::mt19937_64 rng(77);
  for (int trial = 0; trial < 150; ++trial) {
    const std::string pattern = RandomPattern(&rng, 0);
    SCOPED_TRACE(pattern);
    RE2 re(pattern);
    ASSERT_TRUE(re.ok()) << re.error();
    absl::StatusOr<std::shared_ptr<const Grammar>> grammar = CompileRegex(pattern, "p");
    ASSERT_TRUE(grammar.ok()) << grammar.status();
    for (int walk = 0; walk < 10; ++walk) {
      std::optional<std::string> text =
          RandomWalk(GrammarMatcher(*grammar, vocabulary), &rng, 40, 0.3);
      if (text) {
        EXPECT_TRUE(RE2::FullMatch(*text, re)) << "\"" << *text << "\"";
      }
    }
    for (int i = 0; i < 300; ++i) {
      std::string s;
      const int length = static_cast<int>(rng() % 6);
      for (int k = 0; k < length; ++k) {
        s += std::vector<std::string>{"a", "b", "c", "-", "9", ".", " ", "é", "ë", "_"}[rng() % 10];
      }
      EXPECT_EQ(GrammarAccepts(*grammar, s), RE2::FullMatch(s, re)) << "\"" << s << "\"";
    }
  }
}

// Nested groups up to the limit compile.
TEST(RegexTest, NestingUpToTheLimit) {
  const std::string pattern = std::string(64, '(') + "a|b" + std::string(64, ')') + "+";
  absl::StatusOr<std::shared_ptr<const Grammar>> grammar = CompileRegex(pattern, "p");
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  EXPECT_TRUE(GrammarAccepts(*grammar, "abba"));
  EXPECT_FALSE(GrammarAccepts(*grammar, "abc"));
}

// Mutated patterns compile or fail with InvalidArgument; never crash (run under ASan too).
TEST(RegexTest, MutatedPatternsNeverCrash) {
  const std::string base = R"(^(?:[a-c\d]+|x{2,3}\.(?P<n>\w*))?[^"\\]$)";
  const std::string alphabet = "()[]{}|*+?.^$\\:-,023abPn<>\xC3\xA9";
  std::mt19937 rng(4);
  for (int trial = 0; trial < 3000; ++trial) {
    std::string pattern = base;
    for (int edit = 0; edit < 1 + static_cast<int>(rng() % 3); ++edit) {
      const size_t at = rng() % pattern.size();
      const char c = alphabet[rng() % alphabet.size()];
      if (rng() % 2) {
        pattern.insert(pattern.begin() + at, c);
      } else {
        pattern[at] = c;
      }
    }
    for (RegexText text : {RegexText::kRaw, RegexText::kJsonString}) {
      absl::StatusOr<std::string> gbnf = RegexToGbnf(pattern, "p", text);
      if (!gbnf.ok()) {
        EXPECT_EQ(gbnf.status().code(), absl::StatusCode::kInvalidArgument) << pattern;
        continue;
      }
      // What the regex compiler writes is always valid GBNF.
      EXPECT_TRUE(CompileGbnf("root ::= " + *gbnf).ok()) << pattern << "\n" << *gbnf;
    }
  }
}

}  // namespace
}  // namespace lgpt
