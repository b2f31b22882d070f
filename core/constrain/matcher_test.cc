#include "core/constrain/matcher.h"

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/constrain/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<const Grammar> Compile(absl::string_view text) { return CompileGbnf(text).value(); }

std::shared_ptr<const TokenVocabulary> Vocabulary(std::vector<std::string> tokens,
                                                  std::vector<int64_t> eos) {
  return TokenVocabulary::Create(std::move(tokens), std::move(eos)).value();
}

TEST(TokenVocabularyTest, TrieIsPreorderWithSubtreeEnds) {
  auto v = Vocabulary({"ab", "a", "", "b", "abc", "ab", "ba"}, {2});
  // Nodes: a(1) b(2) c(3) b(1) a(2).
  ASSERT_EQ(v->num_nodes(), 5);
  EXPECT_EQ(v->node(0).byte, 'a');
  EXPECT_EQ(v->node(0).subtree_end, 3);
  EXPECT_THAT(v->node_tokens(0), ::testing::ElementsAre(1));
  EXPECT_THAT(v->node_tokens(1), ::testing::ElementsAre(0, 5));
  EXPECT_THAT(v->node_tokens(2), ::testing::ElementsAre(4));
  EXPECT_THAT(v->subtree_tokens(0), ::testing::ElementsAre(1, 0, 5, 4));
  EXPECT_THAT(v->subtree_tokens(3), ::testing::ElementsAre(3, 6));
  EXPECT_EQ(v->subtree_bytes(0), std::bitset<256>().set('a').set('b').set('c'));
  EXPECT_EQ(v->subtree_bytes(3), std::bitset<256>().set('a').set('b'));
  EXPECT_EQ(v->node(4).depth, 2);
  EXPECT_EQ(v->subtree_height(0), 3);
  EXPECT_EQ(v->subtree_height(2), 1);
  EXPECT_EQ(v->max_depth(), 3);
  EXPECT_TRUE(v->is_eos(2));
  EXPECT_FALSE(v->is_eos(0));
  auto bad = TokenVocabulary::Create({"a"}, {3});
  EXPECT_THAT(bad.status().message(), HasSubstr("eos_ids"));
}

TEST(GrammarMatcherTest, MaskAcceptEndAndComplete) {
  auto v = Vocabulary({"a", "b", "ab", "abc", "c", "", "<special>"}, {5});
  std::vector<std::string> bytes = {"a", "b", "ab", "abc", "c", "", ""};
  v = Vocabulary(bytes, {5});
  GrammarMatcher m(Compile(R"(root ::= "a" "b"* "c"?)"), v);
  EXPECT_EQ(m.NextTokenMask(), (std::vector<bool>{1, 0, 1, 1, 0, 0, 0}));
  EXPECT_FALSE(m.CanEnd());
  EXPECT_FALSE(m.AcceptToken(5).ok());  // EOS too early
  EXPECT_FALSE(m.AcceptToken(6).ok());  // no bytes
  EXPECT_THAT(m.AcceptToken(1).message(), HasSubstr("token 1 (\"b\") is not allowed"));
  ASSERT_TRUE(m.AcceptToken(2).ok());
  EXPECT_TRUE(m.CanEnd());
  EXPECT_FALSE(m.IsComplete());
  EXPECT_EQ(m.NextTokenMask(), (std::vector<bool>{0, 1, 0, 0, 1, 1, 0}));
  GrammarMatcher fork = m.Fork();
  ASSERT_TRUE(fork.AcceptToken(4).ok());
  EXPECT_TRUE(fork.IsComplete());
  EXPECT_EQ(fork.NextTokenMask(), (std::vector<bool>{0, 0, 0, 0, 0, 1, 0}));
  EXPECT_FALSE(m.IsComplete());  // the original is unchanged
  ASSERT_TRUE(m.AcceptToken(5).ok());
  EXPECT_TRUE(m.IsComplete());
  EXPECT_FALSE(m.AcceptToken(1).ok());
  EXPECT_EQ(m.NextTokenMask(), std::vector<bool>(7, false));
}

// An EOS token that has bytes is the end, never text.
TEST(GrammarMatcherTest, EosWithBytesIsOnlyTheEnd) {
  auto v = Vocabulary({"a", "</s>", "<"}, {1});
  GrammarMatcher m(Compile(R"(root ::= "a" [</s>]*)"), v);
  EXPECT_EQ(m.NextTokenMask(), (std::vector<bool>{1, 0, 0}));
  EXPECT_FALSE(m.AcceptToken(1).ok());
  ASSERT_TRUE(m.AcceptToken(0).ok());
  EXPECT_EQ(m.NextTokenMask(), (std::vector<bool>{0, 1, 1}));
  ASSERT_TRUE(m.AcceptToken(1).ok());
  EXPECT_TRUE(m.terminated());
}

TEST(GrammarMatcherTest, PaddedAndShortBitmasks) {
  std::vector<std::string> bytes(40, "x");
  bytes[35] = "y";
  auto v = Vocabulary(bytes, {});
  GrammarMatcher m(Compile(R"(root ::= "y")"), v);
  std::vector<uint32_t> padded(4, 0xFFFFFFFFu);
  m.FillNextTokenMask(absl::MakeSpan(padded));
  EXPECT_EQ(padded, (std::vector<uint32_t>{0, 1u << 3, 0, 0}));
  std::vector<uint32_t> shorter(1, 0xFFFFFFFFu);
  m.FillNextTokenMask(absl::MakeSpan(shorter));
  EXPECT_EQ(shorter[0], 0u);
}

// A token may end inside a UTF-8 character; the next one completes it.
TEST(GrammarMatcherTest, TokensSplitMultiByteCharacters) {
  auto v = Vocabulary({"\xE2", "\x82\xAC", "\xE2\x82", "\xAC", "\xC3", "\xA9x", "\"", ""}, {7});
  GrammarMatcher m(Compile(R"(root ::= "\"" [^"a-z]* "\"")"), v);
  ASSERT_TRUE(m.AcceptToken(6).ok());
  EXPECT_EQ(m.NextTokenMask(), (std::vector<bool>{1, 0, 1, 0, 1, 0, 1, 0}));
  ASSERT_TRUE(m.AcceptToken(0).ok());  // first byte of €
  // E2 82 AC is €; E2 AC is the start of another character (U+2B00 to U+2B3F).
  EXPECT_EQ(m.NextTokenMask(), (std::vector<bool>{0, 1, 0, 1, 0, 0, 0, 0}));
  ASSERT_TRUE(m.AcceptToken(1).ok());
  ASSERT_TRUE(m.AcceptToken(2).ok());
  EXPECT_FALSE(m.CanEnd());
  EXPECT_EQ(m.NextTokenMask(), (std::vector<bool>{0, 0, 0, 1, 0, 0, 0, 0}));
  ASSERT_TRUE(m.AcceptToken(3).ok());
  ASSERT_TRUE(m.AcceptToken(4).ok());
  EXPECT_FALSE(m.AcceptToken(5).ok());  // é then x: x is in a-z
  EXPECT_FALSE(m.AcceptToken(6).ok());  // "\xC3" then '"' is ill-formed
  EXPECT_TRUE(m.AcceptBytes("\xA9\"").ok());
  EXPECT_TRUE(m.CanEnd());
}

// The mask equals trying every token on a copy of the matcher, in random states of random walks.
TEST(GrammarMatcherTest, MaskEqualsBruteForce) {
  const char* grammars[] = {
      R"(root ::= "{" ws (pair ("," ws pair)*)? "}"
pair ::= "\"" [a-z\u00e9]{1,3} "\"" ws ":" ws ([0-9]+ | "true" | root) ws
ws ::= " "?)",
      R"(root ::= ("ab" | "a" "bc"* | [^a-c])+ "." )",
      R"(root ::= x{2,5} y
x ::= "\xe9" | "\u20ac" | "z"
y ::= "" | "!" y)",
  };
  for (const char* text : grammars) {
    auto grammar = Compile(text);
    auto v = SyntheticVocabulary(1, 600, "{}\":, ab.cz!0123e\xC3\xA9\xE2\x82\xAC");
    std::mt19937_64 rng(42);
    for (int walk = 0; walk < 20; ++walk) {
      GrammarMatcher m(grammar, v);
      for (int step = 0; step < 30 && !m.IsComplete(); ++step) {
        const std::vector<bool> mask = m.NextTokenMask();
        std::vector<int64_t> allowed;
        for (int64_t id = 0; id < v->size(); ++id) {
          GrammarMatcher copy = m;
          const bool ok = copy.AcceptToken(id).ok();
          ASSERT_EQ(mask[id], ok) << text << " token " << id;
          if (ok) allowed.push_back(id);
        }
        ASSERT_FALSE(allowed.empty());
        ASSERT_TRUE(m.AcceptToken(allowed[rng() % allowed.size()]).ok());
      }
    }
  }
}

TEST(GrammarMatcherTest, RandomWalksProduceSentences) {
  auto grammar = Compile(R"(root ::= "[" (item ("," item)*)? "]"
item ::= [0-9]+ | "\"" [^"]* "\"" | root)");
  auto v = SyntheticVocabulary(3, 2000, "[],0123\"ab \xE4\xB8\xAD");
  std::mt19937_64 rng(5);
  int finished = 0;
  for (int walk = 0; walk < 50; ++walk) {
    std::optional<std::string> text = RandomWalk(GrammarMatcher(grammar, v), &rng, 400);
    if (!text) continue;
    ++finished;
    EXPECT_TRUE(GrammarAccepts(grammar, *text)) << *text;
  }
  EXPECT_GT(finished, 25);
}

// Forks share the memo tables; on different threads each walks as it would alone.
TEST(GrammarMatcherTest, ForksOnThreads) {
  auto grammar = Compile(R"(root ::= "[" (item ("," item)*)? "]"
item ::= [0-9]{1,3} | "\"" [^"]* "\"" | root)");
  auto v = SyntheticVocabulary(8, 3000, "[],0123\"ab \xE4\xB8\xAD");
  GrammarMatcher shared(grammar, v);
  std::vector<std::thread> threads;
  std::vector<int> finished(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int walk = 0; walk < 20; ++walk) {
        std::optional<std::string> text = RandomWalk(shared.Fork(), &rng, 300);
        if (text && GrammarAccepts(grammar, *text)) ++finished[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) EXPECT_GT(finished[t], 10) << t;
}

}  // namespace
}  // namespace lgpt
