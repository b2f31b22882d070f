#include "core/text/tokenizer_unicode.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace lgpt {
namespace {

constexpr char kFffd[] = "\xEF\xBF\xBD";

TEST(Utf8Test, DecodesWellFormedAndRejectsIllFormed) {
  const std::string text = "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80";  // a é 中 😀
  EXPECT_EQ(ToCodePoints(text), (std::vector<char32_t>{'a', 0xE9, 0x4E2D, 0x1F600}));
  EXPECT_EQ(ToUtf8(ToCodePoints(text)), text);
  EXPECT_EQ(CountCodePoints(text), 4u);
  for (const std::string bad :
       {"\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xE2\x82", "\x80", "\xFF"}) {
    size_t pos = 0;
    char32_t c;
    EXPECT_FALSE(NextCodePoint(bad, &pos, &c)) << bad;
    EXPECT_EQ(pos, 0u);
  }
  EXPECT_TRUE(CheckUtf8(text, "x").ok());
  const absl::Status status = CheckUtf8("ok\xE2\x82", "the prompt");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("the prompt"), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find("byte 2"), absl::string_view::npos) << status;
}

TEST(Utf8Test, ClassifiesPrefixes) {
  EXPECT_EQ(ClassifyUtf8("abc\xE2\x82\xAC"), Utf8State::kComplete);
  EXPECT_EQ(ClassifyUtf8("abc\xE2\x82"), Utf8State::kIncomplete);
  EXPECT_EQ(ClassifyUtf8("\xF0"), Utf8State::kIncomplete);
  EXPECT_EQ(ClassifyUtf8("\xE2\x82"
                         "A"),
            Utf8State::kInvalid);
  EXPECT_EQ(ClassifyUtf8("\xED\xA0"), Utf8State::kInvalid);  // a surrogate can never finish
  EXPECT_EQ(ClassifyUtf8("\xC1"), Utf8State::kInvalid);
}

std::string Lossy(const std::string& bytes, bool byte_by_byte) {
  Utf8LossyStream stream;
  std::string out;
  if (byte_by_byte) {
    for (char b : bytes) {
      std::string chunk;
      stream.Append(std::string(1, b), &chunk);
      EXPECT_TRUE(CheckUtf8(chunk, "chunk").ok());
      out += chunk;
    }
  } else {
    stream.Append(bytes, &out);
  }
  stream.Finish(&out);
  return out;
}

TEST(Utf8Test, LossyStreamReplacesMaximalSubpartsLikeRust) {
  // Expectations from Python's bytes.decode("utf-8", "replace"), which like Rust's
  // from_utf8_lossy substitutes maximal subparts.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"\xE2\x82"
       "A",
       std::string(kFffd) + "A"},
      {"\xF0\x80", std::string(kFffd) + kFffd},
      {"\xED\xA0\x80", std::string(kFffd) + kFffd + kFffd},
      {"\xF4\x90\x80\x80", std::string(kFffd) + kFffd + kFffd + kFffd},
      {"\xC0\x80", std::string(kFffd) + kFffd},
      {"\xE2\x82", kFffd},
      {"\xF0\x9F\x98", kFffd},
      {"x\xF0\x9F\x98\x80y\xE2\x82\xAC", "x\xF0\x9F\x98\x80y\xE2\x82\xAC"},
  };
  for (const auto& [bytes, want] : cases) {
    EXPECT_EQ(Lossy(bytes, false), want);
    EXPECT_EQ(Lossy(bytes, true), want);
  }
}

TEST(Utf8Test, LossyStreamEmitsCharactersAsSoonAsComplete) {
  Utf8LossyStream stream;
  std::string out;
  stream.Append("\xF0\x9F", &out);
  EXPECT_EQ(out, "");
  stream.Append("\x98\x80\xE2", &out);
  EXPECT_EQ(out, "\xF0\x9F\x98\x80");
  stream.Append("A", &out);  // E2 is cut short by A
  EXPECT_EQ(out, std::string("\xF0\x9F\x98\x80") + kFffd + "A");
}

TEST(CategoriesTest, LettersNumbersWhitespace) {
  for (char32_t c : {U'a', U'Z', U'é', U'中', U'ß', U'Ω', U'ж', U'ـ'})
    EXPECT_TRUE(IsLetter(c)) << c;
  for (char32_t c : {U'1', U' ', U'_', U'\u0301', U'😀', U'!'}) EXPECT_FALSE(IsLetter(c)) << c;
  for (char32_t c : {U'0', U'٣', U'²', U'Ⅻ', U'½'}) EXPECT_TRUE(IsNumber(c)) << c;
  EXPECT_FALSE(IsNumber(U'a'));
  for (char32_t c : {U' ', U'\t', U'\n', U'\r', U'\v', U'\f', U'\u0085', U'\u00A0', U'\u3000',
                     U'\u2028', U'\u202F'}) {
    EXPECT_TRUE(IsWhitespace(c)) << c;
  }
  for (char32_t c : {U'\u200B', U'\uFEFF', U'\x1C', U'a'}) EXPECT_FALSE(IsWhitespace(c)) << c;
  EXPECT_TRUE(IsMark(0x301));
  for (char32_t c : {U'!', U'_', U'«', U'、', U'¿', U'—'}) EXPECT_TRUE(IsPunctuation(c)) << c;
  for (char32_t c : {U'$', U'+', U'a', U' ', U'€'}) EXPECT_FALSE(IsPunctuation(c)) << c;
  EXPECT_TRUE(IsWordChar('_'));
  EXPECT_FALSE(IsWordChar('-'));
}

std::string U8(const std::vector<char32_t>& cps) { return ToUtf8(cps); }

TEST(NfcTest, ComposesAsPythonUnicodedata) {
  // Expectations from Python's unicodedata.normalize("NFC", ...).
  const std::vector<std::pair<std::vector<char32_t>, std::vector<char32_t>>> cases = {
      {{'e', 0x301}, {0xE9}},
      {{'A', 0x30A}, {0xC5}},
      {{0x1100, 0x1161, 0x11A8}, {0xAC01}},  // Hangul L V T
      {{0x212B}, {0xC5}},                    // singleton ANGSTROM SIGN
      {{'a', 0x323, 0x302}, {0x1EAD}},
      {{'a', 0x302, 0x323}, {0x1EAD}},  // reordered by combining class
      {{0x958}, {0x915, 0x93C}},        // composition exclusion
      {{0x1E0B, 0x323}, {0x1E0D, 0x307}},
      {{'q', 0x307, 0x323}, {'q', 0x323, 0x307}},
      {{0xC5, 0x301, 'x'}, {0x1FA, 'x'}},
      {{0x301, 'a'}, {0x301, 'a'}},  // leading non-starter
      {{'p', 'l', 'a', 'i', 'n'}, {'p', 'l', 'a', 'i', 'n'}},
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(NormalizeNfc(U8(in)), U8(want)) << U8(in);
}

}  // namespace
}  // namespace lgpt
