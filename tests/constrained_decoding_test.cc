// Constrained decoding end to end over the test tokenizers: a vocabulary built from
// Tokenizer::VocabularyBytes, random walks of a GrammarMatcher, and Tokenizer::Decode of the
// chosen ids, which must be exactly the bytes the grammar matched (byte-fallback tokens that
// end inside a character included).
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/constrain/grammar.h"
#include "core/constrain/json_schema.h"
#include "core/constrain/matcher.h"
#include "core/text/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace lgpt {
namespace {

struct Walk {
  std::vector<int64_t> ids;  // without the final EOS
  std::string bytes;
  bool ended = false;
};

Walk RandomWalk(GrammarMatcher matcher, std::mt19937_64* rng, int max_tokens) {
  const TokenVocabulary& v = matcher.vocabulary();
  Walk walk;
  for (int step = 0; step < max_tokens && !matcher.IsComplete(); ++step) {
    const std::vector<bool> mask = matcher.NextTokenMask();
    std::vector<int64_t> allowed;
    for (int64_t id = 0; id < v.size(); ++id) {
      if (mask[id]) allowed.push_back(id);
    }
    if (allowed.empty()) {
      ADD_FAILURE() << "nothing allowed after " << walk.bytes;
      return walk;
    }
    int64_t id = allowed[(*rng)() % allowed.size()];
    if (matcher.CanEnd() && (*rng)() % 4 == 0) id = v.eos_ids()[0];
    EXPECT_TRUE(matcher.AcceptToken(id).ok());
    if (v.is_eos(id)) break;
    walk.ids.push_back(id);
    walk.bytes += v.token_bytes(id);
  }
  walk.ended = matcher.CanEnd() || matcher.IsComplete();
  return walk;
}

std::shared_ptr<const TokenVocabulary> VocabularyOf(const Tokenizer& tokenizer) {
  return TokenVocabulary::Create(tokenizer.VocabularyBytes(), {*tokenizer.eos_id()}).value();
}

constexpr const char* kTokenizers[] = {"gpt2", "spm_bpe", "spm_unigram", "spm_gemma_hf"};

TEST(ConstrainedDecodingTest, JsonWalksDecodeToValidJson) {
  const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(R"({
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12},
                   "n": {"type": "integer", "minimum": -5, "maximum": 5},
                   "tags": {"type": "array", "items": {"enum": ["a", "b c"]}, "maxItems": 3}},
    "required": ["name", "n"]})");
  std::shared_ptr<const Grammar> grammar = CompileJsonSchema(schema, "schema").value();
  for (const char* name : kTokenizers) {
    SCOPED_TRACE(name);
    std::unique_ptr<Tokenizer> tokenizer =
        Tokenizer::Load(std::string("core/text/testdata/") + name).value();
    GrammarMatcher matcher(grammar, VocabularyOf(*tokenizer));
    std::mt19937_64 rng(17);
    int ended = 0;
    for (int i = 0; i < 20; ++i) {
      const Walk walk = RandomWalk(matcher.Fork(), &rng, 400);
      if (!walk.ended) continue;
      ++ended;
      EXPECT_EQ(tokenizer->Decode(walk.ids).value(), walk.bytes);
      const nlohmann::json value = nlohmann::json::parse(walk.bytes, nullptr, false);
      ASSERT_TRUE(value.is_object()) << walk.bytes;
      EXPECT_LE(value["n"].get<int>(), 5);
      EXPECT_GE(value["n"].get<int>(), -5);
    }
    EXPECT_GT(ended, 10);
  }
}

// Characters a small vocabulary only has as byte-fallback pieces: tokens end inside them.
TEST(ConstrainedDecodingTest, CharactersSplitAcrossTokens) {
  const std::string text = "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80 ok \xE6\x97\xA5";
  std::shared_ptr<const Grammar> grammar = CompileGbnf("root ::= " + GbnfLiteral(text)).value();
  // spm_unigram has no byte fallback: it cannot write these characters.
  for (const char* name : {"gpt2", "spm_bpe", "spm_gemma_hf"}) {
    SCOPED_TRACE(name);
    std::unique_ptr<Tokenizer> tokenizer =
        Tokenizer::Load(std::string("core/text/testdata/") + name).value();
    std::mt19937_64 rng(5);
    for (int i = 0; i < 10; ++i) {
      const Walk walk = RandomWalk(GrammarMatcher(grammar, VocabularyOf(*tokenizer)), &rng, 100);
      ASSERT_TRUE(walk.ended);
      EXPECT_EQ(walk.bytes, text);
      EXPECT_EQ(tokenizer->Decode(walk.ids).value(), text);
    }
  }
}

}  // namespace
}  // namespace lgpt
