#include "core/constrain/grammar.h"

#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/constrain/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<const Grammar> Compile(absl::string_view text) {
  absl::StatusOr<std::shared_ptr<const Grammar>> grammar = CompileGbnf(text);
  EXPECT_TRUE(grammar.ok()) << grammar.status();
  return grammar.ok() ? *grammar : nullptr;
}

std::string ErrorOf(absl::string_view text) {
  absl::StatusOr<std::shared_ptr<const Grammar>> grammar = CompileGbnf(text);
  EXPECT_FALSE(grammar.ok()) << text;
  EXPECT_EQ(grammar.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(grammar.status().message());
}

TEST(GrammarTest, LiteralsAlternationAndSequences) {
  auto g = Compile(R"(root ::= "ab" | "c" d
d ::= "x" "y")");
  EXPECT_TRUE(GrammarAccepts(g, "ab"));
  EXPECT_TRUE(GrammarAccepts(g, "cxy"));
  EXPECT_FALSE(GrammarAccepts(g, "a"));
  EXPECT_FALSE(GrammarAccepts(g, "abc"));
  EXPECT_FALSE(GrammarAccepts(g, "cx"));
  EXPECT_FALSE(GrammarAccepts(g, ""));
}

TEST(GrammarTest, Escapes) {
  auto g = Compile(R"(root ::= "\n\t\"\\\x41\u00e9\U0001F600" [\]\-\[])");
  EXPECT_TRUE(GrammarAccepts(g, "\n\t\"\\A\xC3\xA9\xF0\x9F\x98\x80]"));
  EXPECT_TRUE(GrammarAccepts(g, "\n\t\"\\A\xC3\xA9\xF0\x9F\x98\x80-"));
  EXPECT_TRUE(GrammarAccepts(g, "\n\t\"\\A\xC3\xA9\xF0\x9F\x98\x80["));
  EXPECT_FALSE(GrammarAccepts(g, "\n\t\"\\A\xC3\xA9\xF0\x9F\x98\x80x"));
}

TEST(GrammarTest, ClassesAndDot) {
  auto g = Compile(R"(root ::= [a-c0-9] [^"\\] .)");
  EXPECT_TRUE(GrammarAccepts(g, "a\xC3\xA9z"));
  EXPECT_TRUE(GrammarAccepts(g, "9x\xF0\x9F\x98\x80"));
  EXPECT_TRUE(GrammarAccepts(g, "0\xE4\xB8\xAD\n"));
  EXPECT_FALSE(GrammarAccepts(g, "d!!"));
  EXPECT_FALSE(GrammarAccepts(g, "a\"x"));
  EXPECT_FALSE(GrammarAccepts(g, "a\\x"));
  EXPECT_FALSE(GrammarAccepts(g, "ab\xC3"));          // a character cut short
  EXPECT_FALSE(GrammarAccepts(g, "ab\xED\xA0\x80"));  // a surrogate is no character
  EXPECT_FALSE(GrammarAccepts(g, "ab\xC0\x80"));      // overlong
}

TEST(GrammarTest, NonAsciiRanges) {
  auto g = Compile(R"(root ::= [à-ÿ一-龥]+)");
  EXPECT_TRUE(GrammarAccepts(g, "\xC3\xA0\xC3\xBF\xE4\xB8\x80"));
  EXPECT_FALSE(GrammarAccepts(g, "\xC3\x9F"));  // ß is below à
  EXPECT_FALSE(GrammarAccepts(g, "a"));
}

TEST(GrammarTest, Repetitions) {
  auto g = Compile(R"(
# counts
root ::= "a"* "b"+ "c"? ("d" "e"){2} "f"{1,} "g"{0,2} x
x ::= "h"{1,3}
)");
  EXPECT_TRUE(GrammarAccepts(g, "bdedefh"));
  EXPECT_TRUE(GrammarAccepts(g, "aaabbcdedeffffgghhh"));
  EXPECT_FALSE(GrammarAccepts(g, "dedefh"));        // b+ needs one
  EXPECT_FALSE(GrammarAccepts(g, "bdefh"));         // {2}
  EXPECT_FALSE(GrammarAccepts(g, "bdedeh"));        // f{1,}
  EXPECT_FALSE(GrammarAccepts(g, "bdedefggghhh"));  // g{0,2}
  EXPECT_FALSE(GrammarAccepts(g, "bdedefhhhh"));    // h{1,3}
  EXPECT_FALSE(GrammarAccepts(g, "bccdedefh"));     // c?
}

TEST(GrammarTest, RecursionAndMultilineRules) {
  auto g = Compile(R"(root ::= value
value ::= "[" ws ( value ("," ws value)* )? "]" ws
  | "1" ws   # a leaf
ws ::= " "?)");
  EXPECT_TRUE(GrammarAccepts(g, "[1,[],[[1 ], 1]]"));
  EXPECT_TRUE(GrammarAccepts(g, "1"));
  EXPECT_FALSE(GrammarAccepts(g, "[1,]"));
  EXPECT_FALSE(GrammarAccepts(g, "[[1]"));
}

TEST(GrammarTest, ErrorsNamePositionAndRule) {
  EXPECT_THAT(ErrorOf("root ::= \"a\"\nvalue ::= \"b\" @"),
              HasSubstr("line 2, column 15 (rule value)"));
  EXPECT_THAT(ErrorOf("root ::= \"abc"), HasSubstr("unterminated string literal"));
  EXPECT_THAT(ErrorOf("root ::= [a-"), HasSubstr("line 1, column 13 (rule root)"));
  EXPECT_THAT(ErrorOf("root ::= [z-a]"), HasSubstr("out of order"));
  EXPECT_THAT(ErrorOf("root ::= \"\\q\""),
              HasSubstr("line 1, column 11 (rule root): unknown escape \\q"));
  EXPECT_THAT(ErrorOf("root ::= ( \"a\""), HasSubstr("expected )"));
  EXPECT_THAT(ErrorOf("root ::= \"a\" )"), HasSubstr("unbalanced )"));
  EXPECT_THAT(ErrorOf("root ::= \"a\"{3,1}"), HasSubstr("max < min"));
  EXPECT_THAT(ErrorOf("root := \"a\""), HasSubstr("expected ::="));
  EXPECT_THAT(ErrorOf("root ::= x\n\nfoo ::= \"a\" y"),
              HasSubstr("line 1, column 10: rule x is used but not defined"));
  EXPECT_THAT(ErrorOf("root ::= \"a\"\nroot ::= \"b\""),
              HasSubstr("line 2, column 1 (rule root): rule root is defined twice"));
  EXPECT_THAT(ErrorOf("value ::= \"a\""), HasSubstr("no rule `root`"));
  EXPECT_THAT(ErrorOf("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\""),
              HasSubstr("rule expr is left-recursive"));
  EXPECT_THAT(ErrorOf("root ::= (\"a\"?)*"), HasSubstr("left-recursive"));
  EXPECT_THAT(ErrorOf("root ::= \"\\uD800\""), HasSubstr("not a Unicode scalar value"));
}

TEST(GrammarTest, LiteralAndClassWritersRoundTrip) {
  const std::string text = "a\"b\\c\n\x01\xC3\xA9";
  auto g = Compile("root ::= " + GbnfLiteral(text) + " " +
                   GbnfCharClass({{'x', 'z'}, {0xD000, 0xE100}, {'a', 'a'}}));
  EXPECT_TRUE(GrammarAccepts(g, text + "y"));
  EXPECT_TRUE(GrammarAccepts(g, text + "a"));
  EXPECT_TRUE(GrammarAccepts(g, text + "\xED\x80\x80"));  // U+D000
  EXPECT_FALSE(GrammarAccepts(g, text + "b"));
  EXPECT_FALSE(GrammarAccepts(g, text + "\xED\xA0\x80"));  // a surrogate
  auto nothing = Compile("root ::= \"a\" | " + GbnfCharClass({}));
  EXPECT_TRUE(GrammarAccepts(nothing, "a"));
}

TEST(GrammarTest, DeepNestingIsRefusedAndLongChainsWork) {
  EXPECT_THAT(ErrorOf("root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')')),
              HasSubstr("groups nest deeper than 256"));
  // A chain of 20000 rules, each the next one's only element: the matcher expands it without
  // recursion.
  std::string text = "root ::= r0\n";
  for (int i = 0; i < 20000; ++i) absl::StrAppend(&text, "r", i, " ::= r", i + 1, " | \"x\"\n");
  text += "r20000 ::= \"y\"\n";
  auto g = Compile(text);
  EXPECT_TRUE(GrammarAccepts(g, "y"));
  EXPECT_TRUE(GrammarAccepts(g, "x"));
  EXPECT_FALSE(GrammarAccepts(g, "xy"));
}

// Mutated grammars compile or fail with InvalidArgument; never crash (run under ASan too).
TEST(GrammarTest, MutatedGrammarsNeverCrash) {
  const std::string base = R"(root ::= "{" ws (pair ("," ws pair)*)? "}" # c
pair ::= "\"" [a-z\u00e9-\u00ff]{1,3} "\"" ws ":" ws ([0-9]+ | "t" | root | .) ws
ws ::= [ \t\n]{0,2})";
  const std::string alphabet = "()[]{}|*+?.\"\\:=-^#,0123 \nrootxuU\xC3\xA9";
  std::mt19937 rng(3);
  int compiled = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text = base;
    for (int edit = 0; edit < 1 + static_cast<int>(rng() % 3); ++edit) {
      const size_t at = rng() % text.size();
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0:
          text.insert(text.begin() + at, c);
          break;
        case 1:
          text.erase(at, 1);
          break;
        default:
          text[at] = c;
      }
    }
    absl::StatusOr<std::shared_ptr<const Grammar>> g = CompileGbnf(text);
    if (!g.ok()) {
      EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << text;
      continue;
    }
    ++compiled;
    GrammarAccepts(*g, R"({"ab": 12, "c":{}})");
  }
  EXPECT_GT(compiled, 100);
}

TEST(GrammarTest, PrefixedRuleNamesLeaveLiteralsClassesAndCountsAlone) {
  const std::string text =
      "root ::= item (\",\" item){0,3} # root and item\nitem ::= [a-z-]+ \"root\\\" item\"\n";
  const std::string prefixed = PrefixGbnfRuleNames(text, "t0-");
  EXPECT_EQ(prefixed,
            "t0-root ::= t0-item (\",\" t0-item){0,3} # root and item\n"
            "t0-item ::= [a-z-]+ \"root\\\" item\"\n");
  // Still a grammar, now under a new root.
  absl::StatusOr<std::shared_ptr<const Grammar>> grammar =
      CompileGbnf(absl::StrCat("root ::= \"<\" t0-root \">\"\n", prefixed));
  EXPECT_TRUE(grammar.ok()) << grammar.status();
}

}  // namespace
}  // namespace lgpt
