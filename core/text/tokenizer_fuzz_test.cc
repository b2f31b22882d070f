// Hostile tokenizer files: structure-aware mutations of tokenizer.json, pathological
// SentencePiece models (huge pieces, huge user-defined symbols) and deep nesting. Every case
// must load or fail with a status, and encode in time linear in the text. CI also runs this
// test under AddressSanitizer (./lgpt test: targets tagged "asan").
#include <sys/stat.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/text/tokenizer.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int64_t>;

constexpr char kData[] = "core/text/testdata";

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

std::string TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  static int counter = 0;
  const std::string dir = absl::StrCat(base != nullptr ? base : "/tmp", "/fuzz", ++counter);
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

// A directory holding one tokenizer file with the given contents.
std::string DirWith(const std::string& name, const std::string& contents) {
  const std::string dir = TempDir();
  WriteFile(dir + "/" + name, contents);
  return dir;
}

// Protocol buffer pieces for appending a SentencePiece to a ModelProto (field 1, repeated:
// appended records become the last ids).
std::string Varint(uint64_t value) {
  std::string out;
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
  return out;
}

std::string PieceRecord(const std::string& piece, float score, int type) {
  std::string inner = "\x0A" + Varint(piece.size()) + piece;
  char bytes[4];
  std::memcpy(bytes, &score, 4);
  inner += "\x15" + std::string(bytes, 4);
  inner += "\x18" + Varint(type);
  return "\x0A" + Varint(inner.size()) + inner;
}

constexpr int kNormal = 1;
constexpr int kUserDefined = 4;

// Encodes every text of a small set and decodes random ids; only statuses may come back.
void Exercise(const Tokenizer& t, std::mt19937& rng) {
  for (const std::string text :
       {"Hello world", " leading space", "Café naïve", "日本語 😀", "a\tb\nc", ""}) {
    absl::StatusOr<Ids> ids = t.Encode(text, false);
    if (!ids.ok()) continue;
    (void)t.Decode(*ids);
    StreamingDecoder stream(t);
    for (int64_t id : *ids) (void)stream.Push(id);
    (void)stream.Flush();
  }
  Ids random(16);
  for (int64_t& id : random) id = static_cast<int64_t>(rng() % (t.vocab_size() + 8));
  (void)t.Decode(random);
}

TEST(HostileSentencePieceTest, HugeUserDefinedPieceEncodesInLinearTime) {
  const std::string piece(200000, 'q');
  for (const std::string model : {"spm_bpe", "spm_unigram"}) {
    const std::string original = ReadFile(absl::StrCat(kData, "/", model, "/tokenizer.model"));
    const std::string dir =
        DirWith("tokenizer.model", original + PieceRecord(piece, 0.0f, kUserDefined));
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(dir);
    ASSERT_TRUE(t.ok()) << model << ": " << t.status();
    const int64_t user_id = (*t)->vocab_size() - 1;
    // A 21 KB prompt of the piece's own character: every position starts a long partial match
    // (quadratic scans took minutes here).
    absl::StatusOr<Ids> ids = (*t)->Encode(std::string(21000, 'q'), false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_FALSE(ids->empty());
    for (int64_t id : *ids) EXPECT_NE(id, user_id);
    // The whole symbol in a text is one token.
    ids = (*t)->Encode("x " + piece + " y", false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_NE(std::find(ids->begin(), ids->end(), user_id), ids->end()) << model;
  }
}

TEST(HostileSentencePieceTest, HugeNormalPieceLoadsInLinearMemory) {
  // Storing every prefix of a 160,000-character piece took 11.9 GB.
  const std::string piece(160000, 'z');
  const std::string original = ReadFile(absl::StrCat(kData, "/spm_unigram/tokenizer.model"));
  const std::string dir = DirWith("tokenizer.model", original + PieceRecord(piece, -1.0f, kNormal));
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(dir);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::StatusOr<Ids> ids = (*t)->Encode(std::string(5000, 'z') + " and more", false);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_FALSE(ids->empty());
}

std::string Nested(const std::string& list_key, const std::string& leaf, int depth) {
  std::string text;
  for (int i = 0; i < depth; ++i)
    absl::StrAppend(&text, R"({"type":"Sequence",")", list_key, R"(":[)");
  text += leaf;
  for (int i = 0; i < depth; ++i) text += "]}";
  return text;
}

TEST(HostileHfTokenizerTest, DeeplyNestedSequencesAreAnError) {
  json base = json::parse(ReadFile(absl::StrCat(kData, "/gpt2/tokenizer.json")));
  struct Case {
    const char* component;
    const char* list_key;
    const char* leaf;
  };
  for (const Case& c : {Case{"decoder", "decoders", R"({"type":"ByteLevel"})"},
                        Case{"normalizer", "normalizers", R"({"type":"NFC"})"},
                        Case{"pre_tokenizer", "pretokenizers",
                             R"({"type":"ByteLevel","add_prefix_space":false})"}}) {
    for (const int depth : {3, 300000}) {
      base[c.component] = nullptr;
      std::string text = base.dump();
      const std::string key = absl::StrCat("\"", c.component, "\":null");
      const size_t at = text.find(key);
      ASSERT_NE(at, std::string::npos) << key;
      text.replace(at, key.size(),
                   absl::StrCat("\"", c.component, "\":", Nested(c.list_key, c.leaf, depth)));
      absl::StatusOr<std::unique_ptr<Tokenizer>> t =
          Tokenizer::Load(DirWith("tokenizer.json", text));
      if (depth == 3) {
        EXPECT_TRUE(t.ok()) << c.component << ": " << t.status();
      } else {
        ASSERT_FALSE(t.ok()) << c.component;
        EXPECT_NE(t.status().message().find("nested"), std::string::npos) << t.status();
      }
    }
  }
}

// Replaces a random node of the tree with a value of a random kind.
void MutateJson(json& root, std::mt19937& rng) {
  json* node = &root;
  for (int depth = 0; depth < 6; ++depth) {
    if (node->is_object() && !node->empty()) {
      auto it = node->begin();
      std::advance(it, rng() % node->size());
      node = &it.value();
    } else if (node->is_array() && !node->empty()) {
      node = &(*node)[rng() % node->size()];
    } else {
      break;
    }
    if (rng() % 3 == 0) break;
  }
  switch (rng() % 9) {
    case 0:
      *node = nullptr;
      break;
    case 1:
      *node = -1;
      break;
    case 2:
      *node = int64_t{1} << 40;
      break;
    case 3:
      *node = "\xff\xfe not utf-8";
      break;
    case 4:
      *node = json::array({1, "x", nullptr});
      break;
    case 5:
      *node = json::object({{"type", "Sequence"}});
      break;
    case 6:
      *node = 1e308;
      break;
    case 7:
      *node = std::string(100000, '(');
      break;
    default:
      if (node->is_object() && !node->empty()) node->erase(node->begin());
      break;
  }
}

TEST(HostileHfTokenizerTest, StructureMutationsNeverCrash) {
  std::mt19937 rng(17);
  for (const std::string name : {"gpt2", "spm_gemma_hf", "spm_bpe_hf"}) {
    const json original = json::parse(ReadFile(absl::StrCat(kData, "/", name, "/tokenizer.json")));
    int loaded = 0;
    for (int round = 0; round < 120; ++round) {
      json mutated = original;
      for (int m = 1 + rng() % 3; m > 0; --m) MutateJson(mutated, rng);
      // Invalid UTF-8 in a string cannot be dumped by the library; such rounds are skipped.
      std::string text;
      try {
        text = mutated.dump();
      } catch (const json::exception&) {
        continue;
      }
      absl::StatusOr<std::unique_ptr<Tokenizer>> t =
          Tokenizer::Load(DirWith("tokenizer.json", text));
      if (!t.ok()) {
        EXPECT_NE(t.status().message().find("tokenizer.json"), std::string::npos) << t.status();
        continue;
      }
      ++loaded;
      Exercise(**t, rng);
    }
    EXPECT_GT(loaded, 0) << name;
  }
}

TEST(HostileHfTokenizerTest, TokenizerFitsVocabularyNamesTheFile) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(absl::StrCat(kData, "/gpt2"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE((*t)->CheckFitsVocabulary(50257).ok());
  const absl::Status small = (*t)->CheckFitsVocabulary(4096);
  EXPECT_EQ(small.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(small.message().find("tokenizer.json"), std::string::npos) << small;
  EXPECT_NE(small.message().find("4096"), std::string::npos) << small;
}

}  // namespace
}  // namespace lgpt
