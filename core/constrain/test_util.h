// Helpers of the constrained-decoding tests: synthetic token vocabularies, whole-text
// acceptance, and random walks that sample a grammar's sentences token by token.
#ifndef LGPT_CORE_CONSTRAIN_TEST_UTIL_H_
#define LGPT_CORE_CONSTRAIN_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/constrain/grammar.h"
#include "core/constrain/matcher.h"

namespace lgpt {

// All 256 single bytes, then random strings of 2 to 4 bytes drawn from `alphabet` (some of
// them cut out of multi-byte UTF-8 characters) up to `size` tokens, then one EOS token (no
// bytes) whose id is size() - 1.
std::vector<std::string> SyntheticTokenBytes(uint64_t seed, int size, absl::string_view alphabet);
std::shared_ptr<const TokenVocabulary> SyntheticVocabulary(uint64_t seed, int size,
                                                           absl::string_view alphabet);

// GPT-2's vocabulary (core/text/testdata/gpt2/tokenizer.json, read directly: the byte-level
// alphabet mapped back to bytes), <|endoftext|> as EOS.
std::shared_ptr<const TokenVocabulary> Gpt2Vocabulary();

// Whether the grammar derives exactly `text`.
bool GrammarAccepts(const std::shared_ptr<const Grammar>& grammar, absl::string_view text);

// Walks `matcher`, choosing uniformly among the allowed tokens (with probability
// `prefer_eos`, EOS when it is allowed), until EOS or IsComplete(); the bytes written, or
// nullopt after `max_tokens` tokens. A mask with no token allowed fails the test.
std::optional<std::string> RandomWalk(GrammarMatcher matcher, std::mt19937_64* rng, int max_tokens,
                                      double prefer_eos = 0.2);

}  // namespace lgpt

#endif  // LGPT_CORE_CONSTRAIN_TEST_UTIL_H_
