#include "core/text/tokenizer.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/text/tokenizer_spm_reference.h"
#include "core/text/tokenizer_unicode.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int64_t>;

constexpr char kData[] = "core/text/testdata";

std::string Dir(const std::string& name) { return absl::StrCat(kData, "/", name); }

std::unique_ptr<Tokenizer> Load(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(dir);
  EXPECT_TRUE(t.ok()) << dir << ": " << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << text;
  ASSERT_TRUE(file.good()) << path;
}

// A fresh directory under the test's temporary directory.
std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  static int counter = 0;
  const std::string parent = absl::StrCat(base != nullptr ? base : "/tmp", "/t", ++counter);
  ::mkdir(parent.c_str(), 0755);
  const std::string dir = absl::StrCat(parent, "/", name);
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

// Pushes ids one at a time; every chunk must be well-formed UTF-8. Returns the concatenation.
std::string Stream(const Tokenizer& t, const Ids& ids) {
  StreamingDecoder decoder(t);
  std::string text;
  for (int64_t id : ids) {
    absl::StatusOr<std::string> chunk = decoder.Push(id);
    EXPECT_TRUE(chunk.ok()) << chunk.status();
    if (!chunk.ok()) return text;
    EXPECT_TRUE(CheckUtf8(*chunk, "chunk").ok()) << *chunk;
    text += *chunk;
  }
  const std::string last = decoder.Flush();
  EXPECT_TRUE(CheckUtf8(last, "chunk").ok()) << last;
  return text + last;
}

const std::vector<std::string>& Texts() {
  static const auto* texts = new std::vector<std::string>{
      "Hello world",
      "In the beginning God created the heaven and the earth.",
      " leading space",
      "   three leading spaces and trailing   ",
      "ten          spaces, tabs\t\tand\nnew\n\nlines\r\n",
      "Numbers 1234567890 and 3.14159",
      "I'm sure they're here; we've seen it, you'll see.",
      "Café au lait, naïve résumé; Straße und Größe",
      "Ελληνικά και Русский язык",
      "日本語の文章と中文句子，한국어 문장입니다.",
      "emoji 😀 🎉 and unseen ones 🤖👍🏽🇫🇷",
      "unseen scripts: العربية עברית हिन्दी ქართული",
      "x",
      "😀",
      "🤖",
      "",
  };
  return *texts;
}

// ---------------------------------------------------------------------------------------------
// GPT-2: byte-level BPE against the reference encoder.

TEST(Gpt2Test, Properties) {
  auto t = Load(Dir("gpt2"));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->backend(), "huggingface");
  EXPECT_EQ(t->vocab_size(), 50257);
  EXPECT_EQ(t->bos_id(), 50256);  // from generation_config.json
  EXPECT_EQ(t->eos_id(), 50256);
  EXPECT_FALSE(t->use_bos());
  EXPECT_FALSE(t->apply_decoding_fix());
  EXPECT_EQ(t->model_name(), "gpt2");
}

// Ids from the JavaScript port of OpenAI's encoder (make_gpt2_cases.js): non-ASCII text,
// emoji, leading spaces, long runs of whitespace, newlines, digits and contractions.
TEST(Gpt2Test, MatchesReferenceEncoder) {
  auto t = Load(Dir("gpt2"));
  ASSERT_NE(t, nullptr);
  const json cases = json::parse(ReadFile(Dir("gpt2_cases.json")), nullptr, false);
  ASSERT_TRUE(cases.is_array());
  ASSERT_GT(cases.size(), 20u);
  for (const json& c : cases) {
    const std::string text = c["text"].get<std::string>();
    const Ids want = c["ids"].get<Ids>();
    absl::StatusOr<Ids> ids = t->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, want) << json(text).dump();
    EXPECT_EQ(*t->Decode(want), text);
  }
  EXPECT_EQ(*t->Encode("Hello world"), (Ids{15496, 995}));
  EXPECT_EQ(*t->Encode(" Hello"), (Ids{18435}));
}

TEST(Gpt2Test, SpecialTokensAndLitGptBosEosRules) {
  auto t = Load(Dir("gpt2"));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(*t->TokenToId("<|endoftext|>"), 50256);
  EXPECT_EQ(t->TokenToId("no such token").status().code(), absl::StatusCode::kNotFound);
  // The input is split on added tokens first.
  EXPECT_EQ(*t->Encode("Hello<|endoftext|>world"), (Ids{15496, 50256, 6894}));
  // Hugging Face's decode skips special tokens.
  EXPECT_EQ(*t->Decode({15496, 50256, 6894}), "Helloworld");
  EXPECT_EQ(*t->Encode("Hello", /*bos=*/true), (Ids{50256, 15496}));
  EXPECT_EQ(*t->Encode("Hello", std::nullopt, /*eos=*/true), (Ids{15496, 50256}));
  // Without bos, a leading BOS (here <|endoftext|>) is dropped, as LitGPT does.
  EXPECT_EQ(*t->Encode("<|endoftext|>Hi"), (Ids{17250}));
  EXPECT_EQ(*t->Encode("<|endoftext|>Hi", true), (Ids{50256, 17250}));
  EXPECT_EQ(*t->Encode("Hi<|endoftext|>", std::nullopt, true), (Ids{17250, 50256}));
  EXPECT_EQ(*t->Encode(""), Ids{});
  // BOS and EOS are the same token here: the EOS check sees the BOS already last.
  EXPECT_EQ(*t->Encode("", true, true), (Ids{50256}));
}

TEST(Gpt2Test, ErrorsAreStatuses) {
  auto t = Load(Dir("gpt2"));
  ASSERT_NE(t, nullptr);
  absl::StatusOr<Ids> bad = t->Encode("ok \xFF\xFE");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("UTF-8"), absl::string_view::npos) << bad.status();
  for (int64_t id : {int64_t{50257}, int64_t{-1}, int64_t{1} << 40}) {
    absl::StatusOr<std::string> text = t->Decode({15496, id});
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << id;
    EXPECT_NE(text.status().message().find(absl::StrCat(id)), absl::string_view::npos);
    StreamingDecoder decoder(*t);
    EXPECT_FALSE(decoder.Push(id).ok());
    EXPECT_EQ(*decoder.Push(15496), "Hello");  // the stream goes on
  }
}

TEST(Gpt2Test, PartialCharacters) {
  auto t = Load(Dir("gpt2"));
  ASSERT_NE(t, nullptr);
  const Ids robot = {8582, 97, 244};  // 🤖: F0 9F A4 96 in three byte-level tokens
  ASSERT_EQ(*t->Encode("🤖"), robot);
  EXPECT_EQ(*t->Decode({8582}), "\xEF\xBF\xBD");  // like from_utf8_lossy
  StreamingDecoder decoder(*t);
  EXPECT_EQ(*decoder.Push(8582), "");
  EXPECT_EQ(*decoder.Push(97), "");
  EXPECT_EQ(*decoder.Push(244), "🤖");
  EXPECT_EQ(decoder.Flush(), "");
  // A character cut short at the end becomes U+FFFD at Flush, as in the full decode.
  EXPECT_EQ(*decoder.Push(8582), "");
  EXPECT_EQ(decoder.Flush(), "\xEF\xBF\xBD");
}

// ---------------------------------------------------------------------------------------------
// Streaming.

const std::vector<std::string>& AllDirs() {
  static const auto* dirs = new std::vector<std::string>{
      "gpt2", "spm_bpe", "spm_bpe_hf", "spm_bpe_meta", "spm_gemma", "spm_gemma_hf", "spm_unigram"};
  return *dirs;
}

TEST(StreamingTest, ChunksConcatenateToDecode) {
  for (const std::string& name : AllDirs()) {
    auto t = Load(Dir(name));
    ASSERT_NE(t, nullptr);
    for (const std::string& text : Texts()) {
      for (bool bos : {false, true}) {
        const Ids ids = *t->Encode(text, bos, /*eos=*/bos);
        const std::string decoded = *t->Decode(ids);
        EXPECT_EQ(Stream(*t, ids), decoded) << name << " " << text;
        // Byte-level BPE and byte fallback with identity normalization are lossless, except
        // that a Metaspace pre-tokenizer adds no "▁" before a leading space, which the
        // decoder's Strip then removes (as in Hugging Face).
        const bool leading_space = !text.empty() && text[0] == ' ';
        if (name != "spm_unigram" && !(name == "spm_bpe_meta" && leading_space)) {
          EXPECT_EQ(decoded, text) << name;
        }
      }
    }
  }
}

TEST(StreamingTest, RandomIdsConcatenateToDecode) {
  std::mt19937 rng(7);
  for (const std::string& name : AllDirs()) {
    auto t = Load(Dir(name));
    ASSERT_NE(t, nullptr);
    const int64_t n = t->vocab_size();
    // Byte tokens: GPT-2's 256 byte-level tokens are ids 0..255; SentencePiece's byte
    // fallback pieces follow <unk>, <s>, </s>.
    const int64_t byte_base = name == "gpt2" ? 0 : 3;
    for (int round = 0; round < 300; ++round) {
      Ids ids(1 + rng() % 12);
      for (int64_t& id : ids) {
        id = rng() % 3 == 0 ? static_cast<int64_t>(rng() % n) : byte_base + rng() % 256;
        if (id >= n) id = 0;
      }
      absl::StatusOr<std::string> decoded = t->Decode(ids);
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      EXPECT_EQ(Stream(*t, ids), *decoded) << name << " round " << round;
    }
  }
}

TEST(StreamingTest, ByteFallbackCharacterAcrossTokens) {
  // SentencePiece emits a character as soon as its last byte piece arrives.
  auto sp = Load(Dir("spm_bpe"));
  ASSERT_NE(sp, nullptr);
  const Ids robot = *sp->Encode("🤖");  // ▁ <0xF0> <0x9F> <0xA4> <0x96>
  ASSERT_EQ(robot.size(), 5u);
  StreamingDecoder decoder(*sp);
  std::vector<std::string> chunks;
  for (int64_t id : robot) chunks.push_back(*decoder.Push(id));
  EXPECT_EQ(chunks, (std::vector<std::string>{"", "", "", "", "🤖"}));
  EXPECT_EQ(decoder.Flush(), "");

  // Hugging Face's ByteFallback decoder turns an ill-formed run into one U+FFFD per byte,
  // so a run is held until it ends.
  auto hf = Load(Dir("spm_bpe_hf"));
  ASSERT_NE(hf, nullptr);
  ASSERT_EQ(*hf->Encode("🤖", false), robot);
  StreamingDecoder hf_decoder(*hf);
  std::string text;
  for (int64_t id : robot) text += *hf_decoder.Push(id);
  EXPECT_EQ(text, "");
  EXPECT_EQ(hf_decoder.Flush(), "🤖");
  EXPECT_EQ(*hf->Decode({robot[1], robot[2]}), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(*sp->Decode({robot[1], robot[2]}), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

// Priming with a prompt makes the chunks continue its text exactly.
TEST(StreamingTest, PrimedWithContext) {
  for (const std::string& name : AllDirs()) {
    auto t = Load(Dir(name));
    ASSERT_NE(t, nullptr);
    for (const std::string& text : Texts()) {
      const Ids ids = *t->Encode(text, true);
      for (size_t split = 0; split <= ids.size(); ++split) {
        const Ids context(ids.begin(), ids.begin() + split);
        StreamingDecoder decoder(*t);
        absl::StatusOr<std::string> decoded = decoder.Prime(context);
        ASSERT_TRUE(decoded.ok()) << decoded.status();
        for (size_t i = split; i < ids.size(); ++i) *decoded += *decoder.Push(ids[i]);
        *decoded += decoder.Flush();
        if (ids.size() >= 2) {
          EXPECT_EQ(*decoded, *t->Decode(ids)) << name << " " << split;
        }
      }
    }
  }
  auto sp = Load(Dir("spm_bpe"));
  ASSERT_NE(sp, nullptr);
  StreamingDecoder decoder(*sp);
  EXPECT_EQ(*decoder.Prime(*sp->Encode("Hello", true)), "Hello");
  EXPECT_EQ(*decoder.Push(*sp->TokenToId("\xE2\x96\x81wor")), " wor");  // not "wor"
  EXPECT_FALSE(decoder.Prime({5, 100000}).ok());
}

// LitGPT decodes a single token of a LlamaTokenizer behind a dummy token so that its leading
// space survives; a stream of one token matches that.
TEST(StreamingTest, SingleTokenDecodingFix) {
  auto hf = Load(Dir("spm_bpe_hf"));
  ASSERT_NE(hf, nullptr);
  EXPECT_TRUE(hf->apply_decoding_fix());
  const int64_t the = *hf->TokenToId("\xE2\x96\x81the");
  EXPECT_EQ(*hf->Decode({the}), " the");
  EXPECT_EQ(*hf->Decode({the, the}), "the the");
  EXPECT_EQ(Stream(*hf, {the}), " the");
  EXPECT_EQ(Stream(*hf, {the, the}), "the the");
  StreamingDecoder decoder(*hf);
  EXPECT_EQ(*decoder.Push(the), "");  // held: alone it would keep its space
  EXPECT_EQ(*decoder.Push(the), "the the");
  EXPECT_EQ(decoder.Flush(), "");

  auto sp = Load(Dir("spm_bpe"));  // no tokenizer_config.json: no fix
  ASSERT_NE(sp, nullptr);
  EXPECT_FALSE(sp->apply_decoding_fix());
  EXPECT_EQ(*sp->Decode({the}), "the");
}

// ---------------------------------------------------------------------------------------------
// SentencePiece.

// TokenBytes, for constrained decoding: over an encoding the bytes concatenate to the decode
// (with the leading space that the decode's first token loses), byte-fallback pieces are their
// bytes, special tokens have none, and a token whose bytes are whole characters without a
// leading space decodes alone to them.
TEST(TokenBytesTest, ConcatenateToDecode) {
  const std::vector<std::string> texts = {
      "Hello world",         "  two  spaces ",   "na\u00efve caf\u00e9 \u65e5\u672c\u8a9e",
      "emoji \U0001F600 ok", "line\nbreak\ttab", "{\"a\": [1, 2.5], \"b\": null}",
      "\u0416\u0417 \u00df"};
  for (const char* name : {"gpt2", "spm_bpe", "spm_unigram", "spm_gemma", "spm_bpe_hf",
                           "spm_gemma_hf", "spm_bpe_meta"}) {
    SCOPED_TRACE(name);
    auto t = Load(Dir(name));
    ASSERT_NE(t, nullptr);
    for (const std::string& text : texts) {
      const Ids ids = t->Encode(text, /*bos=*/false).value();
      std::string bytes;
      for (int64_t id : ids) bytes += t->TokenBytes(id).value_or("");
      const std::string decoded = t->Decode(ids).value();
      EXPECT_TRUE(bytes == decoded || bytes == " " + decoded)
          << "bytes \"" << bytes << "\" decode \"" << decoded << "\"";
    }
    for (std::optional<int64_t> special : {t->bos_id(), t->eos_id()}) {
      if (special) {
        EXPECT_FALSE(t->TokenBytes(*special).has_value()) << *special;
      }
    }
    EXPECT_FALSE(t->TokenBytes(-1).has_value());
    const std::vector<std::string> vocabulary = t->VocabularyBytes();
    EXPECT_GE(static_cast<int64_t>(vocabulary.size()), t->vocab_size());
    int checked = 0;
    for (int64_t id = 0; id < static_cast<int64_t>(vocabulary.size()); ++id) {
      const std::string& b = vocabulary[id];
      EXPECT_EQ(b, t->TokenBytes(id).value_or(""));
      if (b.empty() || b[0] == ' ' || ClassifyUtf8(b) != Utf8State::kComplete) continue;
      EXPECT_EQ(t->Decode({id}).value(), b) << id;
      ++checked;
    }
    EXPECT_GT(checked, 100);
  }
  // A byte-fallback piece is its byte.
  auto sp = Load(Dir("spm_bpe"));
  const int64_t e2 = sp->TokenToId("<0xE2>").value();
  EXPECT_EQ(sp->TokenBytes(e2), std::string("\xE2"));
  auto hf = Load(Dir("spm_bpe_hf"));
  EXPECT_EQ(hf->TokenBytes(hf->TokenToId("<0xE2>").value()), std::string("\xE2"));
}

TEST(SentencePieceTest, Properties) {
  auto t = Load(Dir("spm_bpe"));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->backend(), "sentencepiece");
  EXPECT_EQ(t->vocab_size(), 1000);
  EXPECT_EQ(t->bos_id(), 1);
  EXPECT_EQ(t->eos_id(), 2);
  EXPECT_FALSE(t->use_bos());  // no tokenizer_config.json
  EXPECT_EQ(*t->Encode("the", true, true), (Ids{1, *t->TokenToId("\xE2\x96\x81the"), 2}));
  EXPECT_EQ(*t->TokenToId("no such piece"), 0);  // SentencePiece answers <unk>
}

std::vector<std::string> SentencePieceTexts() {
  std::vector<std::string> texts = Texts();
  for (const char* text :
       {"  two leading, two  inner and two trailing  ", "\t tab and\nnewline \r\n",
        "fullwidth \xEF\xBD\x88\xEF\xBD\x85\xEF\xBD\x8C\xEF\xBD\x8C\xEF\xBD\x8F",
        "ligature \xEF\xAC\x81 circled \xE2\x91\xA0 tm \xE2\x84\xA2 "
        "\xE3\x8D\xBF",
        "ideographic\xE3\x80\x80space and no\xC2\xA0"
        "break and zero\xE2\x80\x8Bwidth",
        "control \x01\x02 chars \x7F", "e\xCC\x81 A\xCC\x8A combining",
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model",
        "<start_of<end_of_turn><end_of_turn>x", "<s> </s> <unk> <0x41>", "\xEF\xBF\xBD replacement",
        "   ", " ", "\n"}) {
    texts.push_back(text);
  }
  // Random strings over pieces that exercise spaces, user-defined symbols, unknown characters
  // and normalization.
  const std::vector<std::string> alphabet = {" ",
                                             "  ",
                                             "a",
                                             "the",
                                             "LORD",
                                             "God",
                                             "\n",
                                             "\t",
                                             ",",
                                             ".",
                                             "0",
                                             "42",
                                             "\xC3\xA9",
                                             "\xE4\xB8\xAD",
                                             "\xF0\x9F\x98\x80",
                                             "\xF0\x9F\xA4\x96",
                                             "<start_of_turn>",
                                             "<end_of_turn>",
                                             "<start",
                                             "\xEF\xBD\x88",
                                             "\xE2\x91\xA0",
                                             "\xE3\x80\x80",
                                             "\xD9\xA3",
                                             "_",
                                             "\xE2\x96\x81"};
  std::mt19937 rng(5);
  for (int i = 0; i < 300; ++i) {
    std::string text;
    for (int n = 1 + rng() % 12; n > 0; --n) text += alphabet[rng() % alphabet.size()];
    texts.push_back(text);
  }
  return texts;
}

// lgpt's native SentencePiece encodes, and its incremental decoding decodes, exactly as the
// library does.
TEST(SentencePieceTest, MatchesLibrary) {
  std::mt19937 rng(11);
  for (const std::string name : {"spm_bpe", "spm_gemma", "spm_unigram"}) {
    std::string error;
    auto reference = SentencePieceReference::Load(Dir(name) + "/tokenizer.model", &error);
    ASSERT_NE(reference, nullptr) << error;
    auto t = Load(Dir(name));
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->vocab_size(), reference->size());
    EXPECT_EQ(t->bos_id(), reference->bos_id());
    EXPECT_EQ(t->eos_id(), reference->eos_id());
    auto check_decode = [&](const std::vector<int>& ids) {
      std::string want;
      ASSERT_TRUE(reference->Decode(ids, &want, &error)) << error;
      EXPECT_EQ(*t->Decode(Ids(ids.begin(), ids.end())), want) << name;
    };
    int mismatches = 0;
    for (const std::string& text : SentencePieceTexts()) {
      std::vector<int> ids;
      ASSERT_TRUE(reference->Encode(text, &ids, &error)) << error;
      const Ids got = *t->Encode(text);
      if (got != Ids(ids.begin(), ids.end()) && ++mismatches <= 5) {
        ADD_FAILURE() << name << " encodes " << json(text).dump() << " differently";
      }
      check_decode(ids);
    }
    EXPECT_EQ(mismatches, 0) << name;
    for (int round = 0; round < 500; ++round) {
      std::vector<int> ids(1 + rng() % 10);
      for (int& id : ids) {
        const int r = rng() % 4;
        id = r == 0 ? rng() % 5 : r == 1 ? 3 + rng() % 256 : rng() % reference->size();
      }
      check_decode(ids);
    }
  }
}

// The tokenizer.json conversions (as transformers' LlamaConverter / GemmaConverter make them)
// encode and decode like the SentencePiece models they came from.
TEST(SentencePieceTest, HuggingFaceJsonMatchesSentencePiece) {
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"spm_bpe", "spm_bpe_hf"}, {"spm_bpe", "spm_bpe_meta"}, {"spm_gemma", "spm_gemma_hf"}};
  std::vector<std::string> texts = Texts();
  texts.push_back("<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n");
  texts.push_back("a_b <0x41>");
  for (const auto& [sp_name, hf_name] : pairs) {
    auto sp = Load(Dir(sp_name));
    auto hf = Load(Dir(hf_name));
    ASSERT_NE(sp, nullptr);
    ASSERT_NE(hf, nullptr);
    EXPECT_EQ(hf->backend(), "huggingface");
    EXPECT_EQ(hf->vocab_size(), sp->vocab_size());
    EXPECT_EQ(hf->bos_id(), sp->bos_id());
    EXPECT_EQ(hf->eos_id(), sp->eos_id());
    EXPECT_TRUE(hf->use_bos());  // add_bos_token
    for (const std::string& text : texts) {
      // The Metaspace pre-tokenizer prepends no "▁" to text that starts with a space.
      if (hf_name == "spm_bpe_meta" && !text.empty() && text[0] == ' ') continue;
      const Ids ids = *sp->Encode(text, false);
      EXPECT_EQ(*hf->Encode(text, false), ids) << hf_name << " " << text;
      EXPECT_EQ(*hf->Decode(ids), *sp->Decode(ids)) << hf_name << " " << text;
      if (!text.empty()) {
        EXPECT_EQ(*hf->Encode(text), *sp->Encode(text, true)) << hf_name << " " << text;
      }
    }
  }
}

TEST(SentencePieceTest, UnigramNormalizesAndHasUnknowns) {
  auto t = Load(Dir("spm_unigram"));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(*t->Encode("\xEF\xBD\x88\xEF\xBD\x85\xEF\xBD\x8C\xEF\xBD\x8C\xEF\xBD\x8F"),
            *t->Encode("hello"));  // fullwidth letters, nmt_nfkc
  const Ids ids = *t->Encode("a🤖b");
  EXPECT_NE(std::find(ids.begin(), ids.end(), 0), ids.end());          // <unk>
  EXPECT_NE(t->Decode(ids)->find("\xE2\x81\x87"), std::string::npos);  // " ⁇ "
}

// ---------------------------------------------------------------------------------------------
// How LitGPT picks files and BOS/EOS.

std::string Gpt2Json() {
  static const auto* text = new std::string(ReadFile(Dir("gpt2/tokenizer.json")));
  return *text;
}

TEST(ConfigTest, TokenizerJsonTakesPrecedence) {
  const std::string dir = TempDir("both");
  WriteFile(dir + "/tokenizer.model", ReadFile(Dir("spm_bpe/tokenizer.model")));
  WriteFile(dir + "/tokenizer.json", ReadFile(Dir("spm_bpe_hf/tokenizer.json")));
  auto t = Load(dir);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->backend(), "huggingface");
  // Neither config file: no BOS/EOS ids in the Hugging Face case.
  EXPECT_EQ(t->bos_id(), std::nullopt);
  EXPECT_EQ(t->Encode("x", true).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(t->Encode("x", false, true).status().code(), absl::StatusCode::kFailedPrecondition);
}

bool UseBos(const std::string& name, const std::string& config) {
  const std::string dir = TempDir(name);
  WriteFile(dir + "/tokenizer.json", Gpt2Json());
  if (!config.empty()) WriteFile(dir + "/tokenizer_config.json", config);
  auto t = Load(dir);
  return t != nullptr && t->use_bos();
}

TEST(ConfigTest, UseBosAsLitGptDecides) {
  EXPECT_FALSE(UseBos("Meta-Llama-3-8B", ""));  // needs tokenizer_config.json
  EXPECT_TRUE(UseBos("Meta-Llama-3-8B", "{}"));
  EXPECT_TRUE(UseBos("Llama-3.2-1B-Instruct", R"({"add_bos_token": false})"));
  EXPECT_TRUE(UseBos("SmolLM2-135M-Instruct", "{}"));
  EXPECT_FALSE(UseBos("SmolLM2-135M", "{}"));
  EXPECT_FALSE(UseBos("other", "{}"));
  EXPECT_TRUE(UseBos("other", R"({"add_bos_token": true})"));
  EXPECT_FALSE(UseBos("other", R"({"add_bos_token": false, "tokenizer_class": "LlamaTokenizer"})"));
  EXPECT_TRUE(UseBos("other", R"({"tokenizer_class": "LlamaTokenizer"})"));
  EXPECT_FALSE(UseBos("other", R"({"tokenizer_class": "LlamaTokenizerFast"})"));
}

TEST(ConfigTest, BosEosFromConfigFiles) {
  const std::string dir = TempDir("ids");
  WriteFile(dir + "/tokenizer.json", Gpt2Json());
  // tokenizer_config.json wins; its tokens may be {"content": ...}.
  WriteFile(dir + "/tokenizer_config.json",
            R"({"bos_token": {"content": "Hello", "lstrip": false}, "eos_token": null})");
  // Trailing and missing commas are repaired as LitGPT's fix_and_load_json does.
  WriteFile(dir + "/generation_config.json",
            "{\n  \"bos_token_id\": 7\n  \"eos_token_id\": [50256, 13],\n}\n");
  auto t = Load(dir);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->bos_id(), 15496);
  EXPECT_EQ(t->eos_id(), 50256);  // the first of a list

  WriteFile(dir + "/tokenizer_config.json", R"({"bos_token": "not a token"})");
  absl::Status status = Tokenizer::Load(dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("tokenizer_config.json"), absl::string_view::npos) << status;

  WriteFile(dir + "/tokenizer_config.json", "{");
  status = Tokenizer::Load(dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("tokenizer_config.json"), absl::string_view::npos) << status;

  WriteFile(dir + "/tokenizer_config.json", "{}");
  WriteFile(dir + "/generation_config.json", "{\"bos_token_id\": }");
  status = Tokenizer::Load(dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("generation_config.json"), absl::string_view::npos) << status;

  // Negative ids (and unsigned ones that would wrap) are not token ids.
  for (const char* entry : {R"("eos_token_id": -2)", R"("bos_token_id": [-1, 3])",
                            R"("eos_token_id": 18446744073709551615)"}) {
    WriteFile(dir + "/generation_config.json", absl::StrCat("{", entry, "}"));
    status = Tokenizer::Load(dir).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << entry;
    EXPECT_NE(status.message().find("is not a token id"), absl::string_view::npos) << status;
  }
}

TEST(ConfigTest, MissingAndBrokenFiles) {
  absl::Status status = Tokenizer::Load("/nonexistent/dir").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(status.message().find("/nonexistent/dir"), absl::string_view::npos);

  const std::string empty = TempDir("empty");
  status = Tokenizer::Load(empty).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(status.message().find("tokenizer.json or tokenizer.model"), absl::string_view::npos);

  EXPECT_FALSE(Tokenizer::Load(Dir("gpt2/tokenizer.json")).ok());  // not a directory

  const std::string dir = TempDir("broken");
  for (const std::string& text :
       {std::string("{\"model\": "), Gpt2Json().substr(0, 1000), std::string("[1, 2]"),
        std::string(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})"),
        std::string(R"({"model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}})"),
        std::string(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [1]}})"),
        std::string(R"({"model": {"type": "BPE", "vocab": {"a": -5}, "merges": []}})"),
        std::string(R"({"model": {"type": "BPE", "vocab": {}, "merges": []},
                       "added_tokens": [{"content": 5}]})")}) {
    WriteFile(dir + "/tokenizer.json", text);
    status = Tokenizer::Load(dir).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << text.substr(0, 80);
    EXPECT_NE(status.message().find("tokenizer.json"), absl::string_view::npos) << status;
  }

  const std::string sp = TempDir("broken_sp");
  WriteFile(sp + "/tokenizer.model", "this is not a protobuf");
  status = Tokenizer::Load(sp).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("tokenizer.model"), absl::string_view::npos) << status;
  WriteFile(sp + "/tokenizer.model", ReadFile(Dir("spm_bpe/tokenizer.model")).substr(0, 5000));
  EXPECT_FALSE(Tokenizer::Load(sp).ok());
}

// Writes a tokenizer.json derived from GPT-2's with some top-level entries replaced.
std::string WithGpt2(const std::string& name, const json& changes) {
  json j = json::parse(Gpt2Json());
  for (auto it = changes.begin(); it != changes.end(); ++it) j[it.key()] = it.value();
  const std::string dir = TempDir(name);
  WriteFile(dir + "/tokenizer.json", j.dump());
  return dir;
}

TEST(ConfigTest, UnsupportedComponentsAreNamed) {
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"normalizer", {{"type", "Lowercase"}}}}, "Lowercase"},
      {{{"pre_tokenizer", {{"type", "Whitespace"}}}}, "Whitespace"},
      {{{"pre_tokenizer",
         {{"type", "Split"}, {"pattern", {{"Regex", "\\d+"}}}, {"behavior", "Isolated"}}}},
       "\\d+"},
      {{{"decoder", {{"type", "WordPiece"}}}}, "WordPiece"},
      {{{"post_processor", {{"type", "Mystery"}}}}, "Mystery"},
      {{{"model", {{"type", "WordPiece"}, {"vocab", json::object()}}}}, "WordPiece"},
  };
  for (const auto& [changes, name] : cases) {
    const absl::Status status = Tokenizer::Load(WithGpt2("unsupported", changes)).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << changes.dump();
    EXPECT_NE(status.message().find(name), absl::string_view::npos) << status;
  }
}

// Truncated and bit-flipped tokenizer files load cleanly or fail with a status; what loads
// encodes and decodes without crashing.
TEST(ConfigTest, MutatedFilesNeverCrash) {
  std::mt19937 rng(3);
  for (const std::string file : {"spm_bpe/tokenizer.model", "spm_unigram/tokenizer.model",
                                 "spm_gemma/tokenizer.model", "spm_gemma_hf/tokenizer.json"}) {
    const std::string original = ReadFile(Dir(file));
    const std::string name = file.substr(file.find('/') + 1);
    const std::string dir = TempDir("mutated");
    int loaded = 0;
    for (int round = 0; round < 150; ++round) {
      std::string bytes = original;
      if (round % 3 == 0) {
        bytes.resize(rng() % bytes.size());
      } else {
        for (int flips = 1 + rng() % 8; flips > 0; --flips) {
          bytes[rng() % bytes.size()] ^= static_cast<char>(1 << (rng() % 8));
        }
      }
      WriteFile(dir + "/" + name, bytes);
      absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(dir);
      if (!t.ok()) {
        EXPECT_NE(t.status().message().find(name), absl::string_view::npos) << t.status();
        continue;
      }
      ++loaded;
      for (const std::string& text : Texts()) {
        absl::StatusOr<Ids> ids = (*t)->Encode(text, false);
        if (ids.ok()) (void)Stream(**t, *ids);
      }
      Ids random(20);
      for (int64_t& id : random) id = rng() % ((*t)->vocab_size() + 10);
      (void)(*t)->Decode(random);
    }
    EXPECT_GT(loaded, 0) << file;  // bit flips in piece text still load
  }
}

TEST(ConfigTest, NulAndControlCharacters) {
  const std::string text("a\0b\x01c\x7F", 6);
  for (const std::string& name : AllDirs()) {
    auto t = Load(Dir(name));
    ASSERT_NE(t, nullptr);
    absl::StatusOr<Ids> ids = t->Encode(text, false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    if (name == "gpt2" || name == "spm_bpe") {
      EXPECT_EQ(*t->Decode(*ids), text) << name;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Llama 3 / Qwen2 layouts (their regex Split before a ByteLevel without regex), built on
// GPT-2's vocabulary.

json Llama3Layout(const std::string& pattern) {
  json layout = json::parse(R"({
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "PATTERN"}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
    ]},
    "added_tokens": [
      {"id": 50257, "content": "<|begin_of_text|>", "special": true, "normalized": false},
      {"id": 50258, "content": "<|end_of_text|>", "special": true, "normalized": false}
    ],
    "post_processor": {"type": "Sequence", "processors": [
      {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                  {"Sequence": {"id": "A", "type_id": 0}}],
       "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [50257],
                                                "tokens": ["<|begin_of_text|>"]}}}
    ]},
    "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                "use_regex": true}
  })");
  layout["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = pattern;
  return layout;
}

TEST(HfLayoutTest, Llama3) {
  const std::string dir = WithGpt2(
      "Meta-Llama-3-8B",
      Llama3Layout("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                   "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"));
  WriteFile(dir + "/tokenizer_config.json",
            R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                "tokenizer_class": "PreTrainedTokenizerFast"})");
  auto t = Load(dir);
  auto gpt2 = Load(Dir("gpt2"));
  ASSERT_NE(t, nullptr);
  ASSERT_NE(gpt2, nullptr);
  EXPECT_TRUE(t->use_bos());  // by the directory name
  EXPECT_EQ(t->bos_id(), 50257);
  EXPECT_EQ(t->eos_id(), 50258);
  EXPECT_EQ(t->vocab_size(), 50257);
  EXPECT_EQ(*t->Encode("Hello world"), (Ids{50257, 15496, 995}));
  // Digits in groups of up to three: "1234567" -> "123" "456" "7".
  Ids want = {50257};
  for (const char* piece : {"123", "456", "7"}) want.push_back(*gpt2->TokenToId(piece));
  EXPECT_EQ(*t->Encode("1234567"), want);
  EXPECT_NE(*gpt2->Encode("1234567", true), want);
  // Line breaks stay together ("\n\n" is one piece, GPT-2's pattern makes two).
  EXPECT_EQ(*t->Encode("a\n\nb", false), (Ids{64, 628, 65}));
  EXPECT_EQ(*gpt2->Encode("a\n\nb"), (Ids{64, 198, 198, 65}));
  // The post-processor adds a BOS before the text's own, and LitGPT keeps both.
  EXPECT_EQ(*t->Encode("<|begin_of_text|>Hi"), (Ids{50257, 50257, 17250}));
  EXPECT_EQ(*t->Encode("<|begin_of_text|>Hi", false), (Ids{50257, 17250}));
  EXPECT_EQ(*t->Encode("Hi", std::nullopt, true), (Ids{50257, 17250, 50258}));
  EXPECT_EQ(*t->Decode({50257, 17250, 50258}), "Hi");
  for (const std::string& text : Texts()) {
    const Ids ids = *t->Encode(text);
    EXPECT_EQ(*t->Decode(ids), text);
    EXPECT_EQ(Stream(*t, ids), text);
  }
}

TEST(HfLayoutTest, Qwen2WithNfc) {
  json changes = Llama3Layout(
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+");
  changes["normalizer"] = {{"type", "NFC"}};
  changes["post_processor"] = nullptr;
  auto t = Load(WithGpt2("Qwen2.5-7B", changes));
  auto gpt2 = Load(Dir("gpt2"));
  ASSERT_NE(t, nullptr);
  EXPECT_FALSE(t->use_bos());
  EXPECT_EQ(*t->Encode("123"),
            (Ids{*gpt2->TokenToId("1"), *gpt2->TokenToId("2"), *gpt2->TokenToId("3")}));
  EXPECT_EQ(*t->Encode("caf"
                       "e\xCC\x81"),
            *t->Encode("caf\xC3\xA9"));
  EXPECT_EQ(*t->Encode("caf"
                       "e\xCC\x81"),
            *gpt2->Encode("caf\xC3\xA9"));
}

TEST(HfLayoutTest, AddedTokenOptions) {
  auto with_token = [](const json& token) {
    json added = json::parse(Gpt2Json())["added_tokens"];
    added.push_back(token);
    return Load(WithGpt2("added", {{"added_tokens", added}}));
  };
  auto plain = with_token({{"id", 50257}, {"content", "<mask>"}, {"special", true}});
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(*plain->Encode("Hello <mask>!"), (Ids{15496, 220, 50257, 0}));
  auto lstrip =
      with_token({{"id", 50257}, {"content", "<mask>"}, {"special", true}, {"lstrip", true}});
  ASSERT_NE(lstrip, nullptr);
  EXPECT_EQ(*lstrip->Encode("Hello <mask>!"), (Ids{15496, 50257, 0}));
  auto rstrip =
      with_token({{"id", 50257}, {"content", "<mask>"}, {"special", true}, {"rstrip", true}});
  EXPECT_EQ(*rstrip->Encode("<mask>  Hi"), (Ids{50257, 17250}));
  // A non-special added token that is also in the vocabulary keeps its id and decodes.
  auto word = with_token({{"id", 9246}, {"content", "cat"}, {"single_word", true}});
  ASSERT_NE(word, nullptr);
  EXPECT_EQ(*word->Encode("a cat"), (Ids{64, 220, 9246}));
  EXPECT_EQ(*word->Encode("concat"), (Ids{1102, 9246}));  // not a single word: plain BPE
  EXPECT_EQ(*word->Decode({64, 220, 9246}), "a cat");
}

TEST(HfLayoutTest, IgnoreMergesAndPrefixSpace) {
  json j = json::parse(Gpt2Json());
  j["model"]["vocab"]["qzxv"] = 50257;  // reachable by no merge
  j["model"]["ignore_merges"] = true;
  j["pre_tokenizer"]["add_prefix_space"] = true;
  const std::string dir = TempDir("ignore_merges");
  WriteFile(dir + "/tokenizer.json", j.dump());
  auto t = Load(dir);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(*t->Encode("Hello world"), (Ids{18435, 995}));  // " Hello": prefix space added
  EXPECT_EQ(*t->Encode(" Hello"), (Ids{18435}));            // not added twice
  j["pre_tokenizer"]["add_prefix_space"] = false;
  WriteFile(dir + "/tokenizer.json", j.dump());
  t = Load(dir);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(*t->Encode("qzxv"), (Ids{50257}));
  j["model"]["ignore_merges"] = false;
  WriteFile(dir + "/tokenizer.json", j.dump());
  t = Load(dir);
  ASSERT_NE(t, nullptr);
  EXPECT_GT(t->Encode("qzxv")->size(), 1u);
}

Ids IdsOf(const Tokenizer& t, const std::vector<std::string>& tokens) {
  Ids ids;
  for (const std::string& token : tokens) ids.push_back(*t.TokenToId(token));
  return ids;
}

TEST(HfLayoutTest, SmolLm2DigitsThenByteLevel) {
  const json layout = json::parse(R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Digits", "individual_digits": true},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
  ]}})");
  auto t = Load(WithGpt2("SmolLM2-135M", layout));
  ASSERT_NE(t, nullptr);
  // "abc " | 1 | 2 | 3, then the GPT-2 regex: "abc" " ".
  EXPECT_EQ(*t->Encode("abc 123"), IdsOf(*t, {"abc", "\xC4\xA0", "1", "2", "3"}));
  EXPECT_EQ(*t->Decode(*t->Encode("abc 123")), "abc 123");
}

TEST(HfLayoutTest, FalconPunctuationDigitsAndThreeDigitSplit) {
  const json layout = json::parse(R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Punctuation", "behavior": "Contiguous"},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
      {"type": "Digits", "individual_digits": false},
      {"type": "Split", "pattern": {"Regex": "[0-9][0-9][0-9]"}, "behavior": "Isolated",
       "invert": false}
  ]}})");
  auto t = Load(WithGpt2("falcon-7b", layout));
  ASSERT_NE(t, nullptr);
  // Hello | , | " world" | !! | " 12345" -> byte level -> digits: "Ġ" "12345" -> "123" "45".
  EXPECT_EQ(*t->Encode("Hello, world!! 12345"),
            IdsOf(*t, {"Hello", ",", "\xC4\xA0world", "!!", "\xC4\xA0", "123", "45"}));
}

TEST(HfLayoutTest, SplitBehaviors) {
  auto layout = [](const std::string& behavior) {
    json layout = json::parse(R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": " "}, "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}
    ]}})");
    layout["pre_tokenizer"]["pretokenizers"][0]["behavior"] = behavior;
    return WithGpt2("split", layout);
  };
  auto with_behavior = [&](const std::string& behavior) { return Load(layout(behavior)); };
  const std::string text = "a b  c";
  auto removed = with_behavior("Removed");
  ASSERT_NE(removed, nullptr);
  EXPECT_EQ(*removed->Encode(text), IdsOf(*removed, {"a", "b", "c"}));
  auto isolated = with_behavior("Isolated");
  ASSERT_NE(isolated, nullptr);
  const std::string space = "\xC4\xA0";  // the byte-level space
  EXPECT_EQ(*isolated->Encode(text), IdsOf(*isolated, {"a", space, "b", space, space, "c"}));
  auto next = with_behavior("MergedWithNext");
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(*next->Encode(text), IdsOf(*next, {"a", space + "b", space, space + "c"}));
  auto contiguous = with_behavior("Contiguous");
  ASSERT_NE(contiguous, nullptr);
  // "  " is one word here but has no token of its own.
  EXPECT_EQ(*contiguous->Encode(text), IdsOf(*contiguous, {"a", space, "b", space, space, "c"}));
  EXPECT_EQ(Tokenizer::Load(layout("Sideways")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HfLayoutTest, MetaspaceDecoderAndTruncation) {
  json j = json::parse(ReadFile(Dir("spm_bpe_hf/tokenizer.json")));
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders",
                   {{{"type", "ByteFallback"}},
                    {{"type", "Metaspace"},
                     {"replacement", "\xE2\x96\x81"},
                     {"prepend_scheme", "always"},
                     {"split", true}}}}};
  j["truncation"] = {{"max_length", 4}, {"direction", "Right"}, {"strategy", "LongestFirst"}};
  const std::string dir = TempDir("metaspace");
  WriteFile(dir + "/tokenizer.json", j.dump());
  WriteFile(dir + "/tokenizer_config.json", ReadFile(Dir("spm_bpe_hf/tokenizer_config.json")));
  auto t = Load(dir);
  auto sp = Load(Dir("spm_bpe"));
  ASSERT_NE(t, nullptr);
  const Ids ids = *sp->Encode("Hello world and more");
  EXPECT_EQ(*t->Decode(ids), "Hello world and more");
  EXPECT_EQ(Stream(*t, ids), "Hello world and more");
  // BOS plus three tokens.
  const Ids truncated = *t->Encode("Hello world and more", true);
  EXPECT_EQ(truncated, (Ids{1, ids[0], ids[1], ids[2]}));
}

}  // namespace
}  // namespace lgpt
