#include "core/constrain/test_util.h"

#include <fstream>
#include <map>
#include <utility>

#include "core/constrain/utf8.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace lgpt {

std::vector<std::string> SyntheticTokenBytes(uint64_t seed, int size, absl::string_view alphabet) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
  static constexpr absl::string_view kWide[] = {"\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80",
                                                "\xE4\xB8\xAD"};  // é € 😀 中
  while (static_cast<int>(tokens.size()) < size - 1) {
    std::string token;
    const int length = 2 + static_cast<int>(rng() % 3);
    if (rng() % 8 == 0) {  // a piece of a wide character, maybe with ASCII around it
      const absl::string_view wide = kWide[rng() % 4];
      std::string text = std::string(1, alphabet[rng() % alphabet.size()]) + std::string(wide) +
                         std::string(1, alphabet[rng() % alphabet.size()]);
      const size_t start = rng() % text.size();
      token = text.substr(start, length);
    } else {
      for (int k = 0; k < length; ++k) token += alphabet[rng() % alphabet.size()];
    }
    tokens.push_back(std::move(token));
  }
  tokens.push_back("");  // EOS
  return tokens;
}

std::shared_ptr<const TokenVocabulary> SyntheticVocabulary(uint64_t seed, int size,
                                                           absl::string_view alphabet) {
  std::vector<std::string> tokens = SyntheticTokenBytes(seed, size, alphabet);
  const int64_t eos = static_cast<int64_t>(tokens.size()) - 1;
  return TokenVocabulary::Create(std::move(tokens), {eos}).value();
}

std::shared_ptr<const TokenVocabulary> Gpt2Vocabulary() {
  std::ifstream file("core/text/testdata/gpt2/tokenizer.json");
  EXPECT_TRUE(file.good());
  const nlohmann::json json = nlohmann::json::parse(file);
  // GPT-2's byte-to-character table: printable bytes stand for themselves, the others for
  // U+0100 and up, in byte order.
  std::map<uint32_t, char> byte_of;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    byte_of[printable ? b : next++] = static_cast<char>(b);
  }
  std::vector<std::string> tokens(json["model"]["vocab"].size() + 1);
  for (const auto& [piece, id] : json["model"]["vocab"].items()) {
    std::string bytes;
    size_t pos = 0;
    uint32_t c;
    while (DecodeUtf8(piece, &pos, &c)) bytes += byte_of.at(c);
    EXPECT_EQ(pos, piece.size());
    tokens.at(id.get<int64_t>()) = bytes;
  }
  const int64_t eos = json["added_tokens"][0]["id"].get<int64_t>();
  tokens.at(eos) = "";
  return TokenVocabulary::Create(std::move(tokens), {eos}).value();
}

bool GrammarAccepts(const std::shared_ptr<const Grammar>& grammar, absl::string_view text) {
  static const auto* const bytes = [] {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
    return new std::shared_ptr<const TokenVocabulary>(
        TokenVocabulary::Create(std::move(tokens), {}).value());
  }();
  GrammarMatcher matcher(grammar, *bytes);
  return matcher.AcceptBytes(text).ok() && matcher.CanEnd();
}

std::optional<std::string> RandomWalk(GrammarMatcher matcher, std::mt19937_64* rng, int max_tokens,
                                      double prefer_eos) {
  const TokenVocabulary& v = matcher.vocabulary();
  std::string text;
  std::vector<int64_t> allowed;
  for (int step = 0; step < max_tokens; ++step) {
    if (matcher.IsComplete()) return text;
    const std::vector<bool> mask = matcher.NextTokenMask();
    allowed.clear();
    for (int64_t id = 0; id < v.size(); ++id) {
      if (mask[id]) allowed.push_back(id);
    }
    if (allowed.empty()) {
      ADD_FAILURE() << "no token allowed after \"" << text << "\"";
      return std::nullopt;
    }
    int64_t id = allowed[(*rng)() % allowed.size()];
    if (matcher.CanEnd() && std::uniform_real_distribution<double>(0, 1)(*rng) < prefer_eos) {
      for (int64_t eos : v.eos_ids()) {
        if (mask[eos]) id = eos;
      }
    }
    const absl::Status status = matcher.AcceptToken(id);
    if (!status.ok()) {
      ADD_FAILURE() << "masked token refused: " << status;
      return std::nullopt;
    }
    if (v.is_eos(id)) return text;
    text += v.token_bytes(id);
  }
  return std::nullopt;
}

}  // namespace lgpt
