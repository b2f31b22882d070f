#include "core/text/tokenizer_hf.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "core/base/status_macros.h"
#include "core/text/pretokenizer.h"
#include "core/text/tokenizer_unicode.h"

namespace lgpt {
namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// JSON access that reports wrong types as errors instead of throwing.

class JsonReader {
 public:
  explicit JsonReader(absl::string_view source) : source_(source) {}

  absl::Status Error(absl::string_view where, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", where, ": ", what));
  }
  absl::Status Unimplemented(absl::string_view where, absl::string_view what) const {
    return absl::UnimplementedError(
        absl::StrCat(source_, ": ", where, ": ", what, " is not supported by lgpt's tokenizer"));
  }

  static const json* Find(const json& object, const char* key) {
    if (!object.is_object()) return nullptr;
    auto it = object.find(key);
    return it == object.end() ? nullptr : &*it;
  }

  // Missing or null leaves `*out` as it is.
  absl::Status Bool(const json& object, const char* key, absl::string_view where, bool* out) const {
    const json* v = Find(object, key);
    if (v == nullptr || v->is_null()) return absl::OkStatus();
    if (!v->is_boolean()) return Error(where, absl::StrCat("'", key, "' is not a boolean"));
    *out = v->get<bool>();
    return absl::OkStatus();
  }

  absl::Status String(const json& object, const char* key, absl::string_view where,
                      std::optional<std::string>* out) const {
    const json* v = Find(object, key);
    if (v == nullptr || v->is_null()) return absl::OkStatus();
    if (!v->is_string()) return Error(where, absl::StrCat("'", key, "' is not a string"));
    *out = v->get<std::string>();
    return absl::OkStatus();
  }

  absl::Status RequiredString(const json& object, const char* key, absl::string_view where,
                              std::string* out) const {
    std::optional<std::string> value;
    RETURN_IF_ERROR(String(object, key, where, &value));
    if (!value) return Error(where, absl::StrCat("'", key, "' is missing"));
    *out = *std::move(value);
    return absl::OkStatus();
  }

  absl::Status Int(const json& object, const char* key, absl::string_view where,
                   std::optional<int64_t>* out) const {
    const json* v = Find(object, key);
    if (v == nullptr || v->is_null()) return absl::OkStatus();
    if (!v->is_number_integer()) {
      return Error(where, absl::StrCat("'", key, "' is not an integer"));
    }
    *out = v->get<int64_t>();
    return absl::OkStatus();
  }

  // A single character (decoders' Strip content, Metaspace replacement).
  absl::Status Char(const json& object, const char* key, absl::string_view where,
                    std::string* out) const {
    RETURN_IF_ERROR(RequiredString(object, key, where, out));
    if (CountCodePoints(*out) != 1) {
      return Error(where, absl::StrCat("'", key, "' is not a single character"));
    }
    return absl::OkStatus();
  }

  absl::string_view source() const { return source_; }

 private:
  std::string source_;
};

std::string TypeOf(const json& component) {
  const json* t = JsonReader::Find(component, "type");
  return t != nullptr && t->is_string() ? t->get<std::string>() : std::string("(no type)");
}

// Real tokenizers nest Sequences one or two deep; the bound keeps a hostile file from
// overflowing the stack.
constexpr int kMaxSequenceDepth = 32;

// Flattens nested {"type": "Sequence", <key>: [...]} into its leaves.
absl::Status Flatten(const json& component, const char* list_key, const JsonReader& r,
                     absl::string_view where, std::vector<const json*>* out, int depth = 0) {
  if (depth > kMaxSequenceDepth) {
    return r.Error(where, absl::StrCat("Sequences nested more than ", kMaxSequenceDepth, " deep"));
  }
  if (component.is_null()) return absl::OkStatus();
  if (!component.is_object()) return r.Error(where, "is not an object");
  if (TypeOf(component) != "Sequence") {
    out->push_back(&component);
    return absl::OkStatus();
  }
  const json* list = JsonReader::Find(component, list_key);
  if (list == nullptr || !list->is_array()) {
    return r.Error(where, absl::StrCat("Sequence without a '", list_key, "' list"));
  }
  for (const json& item : *list) {
    RETURN_IF_ERROR(Flatten(item, list_key, r, where, out, depth + 1));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Byte-level alphabet (GPT-2's bytes_to_unicode).

struct ByteAlphabet {
  ByteAlphabet() {
    byte_of_char.fill(-1);
    std::vector<bool> direct(256, false);
    for (int b = '!'; b <= '~'; ++b) direct[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t c = direct[b] ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      AppendUtf8(c, &char_of_byte[b]);
      byte_of_char[c] = b;
    }
  }
  std::array<std::string, 256> char_of_byte;
  std::array<int, 324> byte_of_char;  // -1 for characters outside the alphabet (max U+0143)
};

const ByteAlphabet& Bytes() {
  static const ByteAlphabet* alphabet = new ByteAlphabet();
  return *alphabet;
}

std::string ByteLevelMap(absl::string_view text) {
  const ByteAlphabet& a = Bytes();
  std::string out;
  out.reserve(text.size() * 2);
  for (char ch : text) out += a.char_of_byte[static_cast<unsigned char>(ch)];
  return out;
}

// The token's bytes when every character is in the byte alphabet, else its UTF-8 as it is
// (as the ByteLevel decoder does, e.g. for added tokens).
std::string ByteLevelUnmap(absl::string_view token) {
  const ByteAlphabet& a = Bytes();
  std::string out;
  out.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    char32_t c;
    if (!NextCodePoint(token, &pos, &c) || c >= a.byte_of_char.size() || a.byte_of_char[c] < 0) {
      return std::string(token);
    }
    out.push_back(static_cast<char>(a.byte_of_char[c]));
  }
  return out;
}

// "<0xAB>" -> 0xAB, else -1 (the ByteFallback decoder's test: six bytes, "<0x" ... ">").
int ParseByteToken(absl::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  int value = 0;
  for (char ch : token.substr(3, 2)) {
    int digit;
    if (ch >= '0' && ch <= '9') {
      digit = ch - '0';
    } else if (ch >= 'a' && ch <= 'f') {
      digit = ch - 'a' + 10;
    } else if (ch >= 'A' && ch <= 'F') {
      digit = ch - 'A' + 10;
    } else {
      return -1;
    }
    value = value * 16 + digit;
  }
  return value;
}

// ---------------------------------------------------------------------------------------------
// Components.

struct AddedToken {
  std::string content;
  std::string pattern;  // what is matched in text: the content, normalized when `normalized`
  int64_t id = 0;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// Leftmost-longest search over a set of added tokens (what the `tokenizers` crate's
// Aho-Corasick automaton with MatchKind::LeftmostLongest finds).
class AddedTokenMatcher {
 public:
  void Add(const AddedToken* token) {
    if (token->pattern.empty()) return;
    auto& bucket = by_first_byte_[static_cast<unsigned char>(token->pattern[0])];
    for (const AddedToken* t : bucket) {
      if (t->pattern == token->pattern) return;
    }
    bucket.push_back(token);
    std::stable_sort(bucket.begin(), bucket.end(), [](const AddedToken* a, const AddedToken* b) {
      return a->pattern.size() > b->pattern.size();
    });
    empty_ = false;
  }

  bool empty() const { return empty_; }

  const AddedToken* Find(absl::string_view text, size_t from, size_t* start) const {
    for (size_t p = from; p < text.size(); ++p) {
      for (const AddedToken* t : by_first_byte_[static_cast<unsigned char>(text[p])]) {
        if (text.compare(p, t->pattern.size(), t->pattern) == 0) {
          *start = p;
          return t;
        }
      }
    }
    return nullptr;
  }

 private:
  std::array<std::vector<const AddedToken*>, 256> by_first_byte_;
  bool empty_ = true;
};

struct NormalizerStep {
  enum class Kind { kPrepend, kReplace, kNfc, kStrip, kByteLevel } kind;
  std::string a;  // Prepend: prefix; Replace: pattern
  std::string b;  // Replace: content
  bool left = false, right = false;
};

enum class PrependScheme { kAlways, kFirst, kNever };

// How a pre-tokenizer treats the matches of its pattern (SplitDelimiterBehavior).
enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

std::optional<Behavior> ParseBehavior(absl::string_view name) {
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  return std::nullopt;
}

struct PreTokenizerStep {
  enum class Kind {
    kByteLevel,
    kSplit,         // one of the big regexes (core/text/pretokenizer.h)
    kSplitDigits3,  // the regex [0-9][0-9][0-9] (Falcon)
    kSplitLiteral,  // a String pattern
    kDigits,
    kPunctuation,
    kMetaspace,
  } kind;
  bool add_prefix_space = false;                             // ByteLevel
  bool use_regex = true;                                     // ByteLevel
  PretokenizerPattern pattern = PretokenizerPattern::kGpt2;  // Split
  std::string literal;                                       // Split with a String pattern
  Behavior behavior = Behavior::kIsolated;  // Split, Punctuation; Digits: Isolated/Contiguous
  std::string replacement;                  // Metaspace
  PrependScheme prepend = PrependScheme::kAlways;
  bool split = true;
};

// A piece of text that a pattern matched or did not, as the crate's Pattern::find_matches
// reports them: a character predicate matches each character alone, and unmatched text
// between matches is one piece.
struct Match {
  size_t begin, end;
  bool matched;
};

std::vector<Match> MatchChars(absl::string_view text, const std::function<bool(char32_t)>& pred) {
  std::vector<Match> out;
  size_t pos = 0, run = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    char32_t c;
    if (!NextCodePoint(text, &pos, &c)) {
      c = kReplacementCharacter;
      pos = start + 1;
    }
    if (pred(c)) {
      if (run < start) out.push_back({run, start, false});
      out.push_back({start, pos, true});
      run = pos;
    }
  }
  if (run < text.size()) out.push_back({run, text.size(), false});
  return out;
}

std::vector<Match> MatchLiteral(absl::string_view text, absl::string_view literal) {
  std::vector<Match> out;
  size_t run = 0, pos = 0;
  while (!literal.empty() && (pos = text.find(literal, pos)) != absl::string_view::npos) {
    if (run < pos) out.push_back({run, pos, false});
    out.push_back({pos, pos + literal.size(), true});
    pos += literal.size();
    run = pos;
  }
  if (run < text.size()) out.push_back({run, text.size(), false});
  return out;
}

// Matches of [0-9][0-9][0-9], leftmost first, not overlapping.
std::vector<Match> MatchThreeDigits(absl::string_view text) {
  std::vector<Match> out;
  auto digit = [&](size_t i) { return i < text.size() && text[i] >= '0' && text[i] <= '9'; };
  size_t run = 0, pos = 0;
  while (pos < text.size()) {
    if (digit(pos) && digit(pos + 1) && digit(pos + 2)) {
      if (run < pos) out.push_back({run, pos, false});
      out.push_back({pos, pos + 3, true});
      pos += 3;
      run = pos;
    } else {
      ++pos;
    }
  }
  if (run < text.size()) out.push_back({run, text.size(), false});
  return out;
}

// NormalizedString::split: the pieces `matches` give under `behavior`, as [begin, end).
std::vector<std::pair<size_t, size_t>> ApplyBehavior(const std::vector<Match>& matches,
                                                     Behavior behavior) {
  std::vector<std::pair<size_t, size_t>> out;
  switch (behavior) {
    case Behavior::kIsolated:
      for (const Match& m : matches) out.push_back({m.begin, m.end});
      break;
    case Behavior::kRemoved:
      for (const Match& m : matches) {
        if (!m.matched) out.push_back({m.begin, m.end});
      }
      break;
    case Behavior::kContiguous: {
      bool previous = false;
      for (const Match& m : matches) {
        if (!out.empty() && m.matched == previous) {
          out.back().second = m.end;
        } else {
          out.push_back({m.begin, m.end});
        }
        previous = m.matched;
      }
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool previous = false;
      for (const Match& m : matches) {
        if (m.matched && !previous && !out.empty()) {
          out.back().second = m.end;
        } else {
          out.push_back({m.begin, m.end});
        }
        previous = m.matched;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous = false;
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->matched && !previous && !out.empty()) {
          out.back().first = it->begin;
        } else {
          out.push_back({it->begin, it->end});
        }
        previous = it->matched;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
  }
  return out;
}

struct DecoderStep {
  enum class Kind { kReplace, kByteFallback, kMetaspace, kStrip } kind;
  std::string from, to;     // Replace; Metaspace: from = replacement
  bool strip_first = true;  // Metaspace: prepend_scheme != never
  char32_t content = ' ';   // Strip
  size_t start = 0, stop = 0;
};

struct StripSpec {
  char32_t content = ' ';
  size_t start = 0, stop = 0;
};

std::string StripToken(absl::string_view token, const StripSpec& spec) {
  std::vector<char32_t> chars = ToCodePoints(token);
  size_t start_cut = 0;
  for (size_t i = 0; i < chars.size() && i < spec.start; ++i) {
    if (chars[i] != spec.content) break;
    start_cut = i + 1;
  }
  size_t stop_cut = chars.size();
  for (size_t i = 0; i < spec.stop && i < chars.size(); ++i) {
    const size_t index = chars.size() - i - 1;
    if (chars[index] != spec.content) break;
    stop_cut = index;
  }
  if (stop_cut < start_cut) stop_cut = start_cut;
  return ToUtf8(std::vector<char32_t>(chars.begin() + start_cut, chars.begin() + stop_cut));
}

struct Word {
  std::string text;
  bool at_start;  // begins at offset 0 of the original input (Metaspace's "first")
};

// ---------------------------------------------------------------------------------------------
// BPE model.

class BpeModel {
 public:
  absl::Status Parse(const json& model, const JsonReader& r);

  absl::Status Tokenize(absl::string_view word, std::vector<int64_t>* out) const;

  std::optional<int64_t> TokenToId(absl::string_view token) const {
    auto it = vocab_.find(token);
    if (it == vocab_.end()) return std::nullopt;
    return it->second;
  }
  const std::string* IdToToken(int64_t id) const {
    if (id < 0 || id >= static_cast<int64_t>(vocab_r_.size()) || !present_[id]) return nullptr;
    return &vocab_r_[id];
  }
  int64_t size() const { return static_cast<int64_t>(vocab_.size()); }
  int64_t id_limit() const { return static_cast<int64_t>(vocab_r_.size()); }

 private:
  struct MergeValue {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t Key(int64_t a, int64_t b) {
    return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b);
  }
  void MergeAll(std::vector<int64_t>* ids, std::vector<size_t>* lens) const;

  absl::flat_hash_map<std::string, int64_t> vocab_;
  std::vector<std::string> vocab_r_;
  std::vector<bool> present_;
  absl::flat_hash_map<uint64_t, MergeValue> merges_;
  std::optional<std::string> unk_token_;
  std::optional<int64_t> unk_id_;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::array<int64_t, 256> byte_ids_;
};

constexpr int64_t kMaxTokenId = (int64_t{1} << 31) - 1;

absl::Status BpeModel::Parse(const json& model, const JsonReader& r) {
  const std::string where = "model";
  std::optional<std::string> prefix, suffix;
  RETURN_IF_ERROR(r.String(model, "continuing_subword_prefix", where, &prefix));
  RETURN_IF_ERROR(r.String(model, "end_of_word_suffix", where, &suffix));
  if (prefix && !prefix->empty()) return r.Unimplemented(where, "continuing_subword_prefix");
  if (suffix && !suffix->empty()) return r.Unimplemented(where, "end_of_word_suffix");
  if (const json* dropout = JsonReader::Find(model, "dropout");
      dropout != nullptr && !dropout->is_null()) {
    if (!dropout->is_number()) return r.Error(where, "'dropout' is not a number");
    if (dropout->get<double>() != 0.0) return r.Unimplemented(where, "BPE dropout");
  }
  RETURN_IF_ERROR(r.String(model, "unk_token", where, &unk_token_));
  RETURN_IF_ERROR(r.Bool(model, "byte_fallback", where, &byte_fallback_));
  RETURN_IF_ERROR(r.Bool(model, "fuse_unk", where, &fuse_unk_));
  RETURN_IF_ERROR(r.Bool(model, "ignore_merges", where, &ignore_merges_));

  const json* vocab = JsonReader::Find(model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) return r.Error(where, "'vocab' is not an object");
  vocab_.reserve(vocab->size());
  int64_t max_id = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer()) {
      return r.Error("model.vocab", absl::StrCat("the id of '", it.key(), "' is not an integer"));
    }
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id > kMaxTokenId) {
      return r.Error("model.vocab",
                     absl::StrCat("'", it.key(), "' has id ", id, ", outside [0, 2^31)"));
    }
    vocab_[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  if (max_id >= 16 * static_cast<int64_t>(vocab_.size()) + (1 << 20)) {
    return r.Error("model.vocab", absl::StrCat("ids are implausibly sparse (largest ", max_id,
                                               " for ", vocab_.size(), " tokens)"));
  }
  vocab_r_.assign(max_id + 1, std::string());
  present_.assign(max_id + 1, false);
  for (const auto& [token, id] : vocab_) {
    vocab_r_[id] = token;
    present_[id] = true;
  }
  if (unk_token_) {
    auto it = vocab_.find(*unk_token_);
    if (it != vocab_.end()) unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(absl::StrFormat("<0x%02X>", b));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }

  const json* merges = JsonReader::Find(model, "merges");
  if (merges == nullptr || !merges->is_array()) {
    return r.Error(where, "'merges' is not a list");
  }
  merges_.reserve(merges->size());
  int32_t rank = 0;
  for (const json& merge : *merges) {
    std::string a, b;
    if (merge.is_string()) {  // legacy "a b"
      const std::string line = merge.get<std::string>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return r.Error("model.merges",
                       absl::StrCat("merge ", rank + 1, " '", line, "' is not two tokens"));
      }
      a = line.substr(0, space);
      b = line.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      a = merge[0].get<std::string>();
      b = merge[1].get<std::string>();
    } else {
      return r.Error("model.merges", absl::StrCat("merge ", rank + 1, " is not a pair"));
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b), ic = vocab_.find(a + b);
    for (const auto& [it, token] : {std::pair(ia, &a), std::pair(ib, &b)}) {
      if (it == vocab_.end()) {
        return r.Error("model.merges", absl::StrCat("merge ", rank + 1, " uses '", *token,
                                                    "', which is not in the vocabulary"));
      }
    }
    if (ic == vocab_.end()) {
      return r.Error("model.merges", absl::StrCat("merge ", rank + 1, " makes '", a, b,
                                                  "', which is not in the vocabulary"));
    }
    merges_[Key(ia->second, ib->second)] = {rank, static_cast<int32_t>(ic->second)};
    ++rank;
  }
  return absl::OkStatus();
}

absl::Status BpeModel::Tokenize(absl::string_view word, std::vector<int64_t>* out) const {
  if (word.empty()) return absl::OkStatus();
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out->push_back(it->second);
      return absl::OkStatus();
    }
  }
  std::vector<int64_t> ids;
  std::vector<size_t> lens;
  // The pending unknown token (id, bytes); a plain pair and flag rather than std::optional,
  // which GCC 12 reports as maybe-uninitialized here.
  bool has_unk = false;
  std::pair<int64_t, size_t> unk{0, 0};
  auto add = [&](int64_t id, size_t len) {
    ids.push_back(id);
    lens.push_back(len);
  };
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t start = pos;
    char32_t c;
    if (!NextCodePoint(word, &pos, &c)) pos = start + 1;
    const absl::string_view s = word.substr(start, pos - start);
    if (auto it = vocab_.find(s); it != vocab_.end()) {
      if (has_unk) {
        add(unk.first, unk.second);
        has_unk = false;
      }
      add(it->second, s.size());
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char ch : s) all = all && byte_ids_[static_cast<unsigned char>(ch)] >= 0;
      if (all) {
        // Like the `tokenizers` crate, a pending unknown token is not flushed here.
        for (char ch : s) add(byte_ids_[static_cast<unsigned char>(ch)], 1);
        continue;
      }
    }
    if (unk_token_) {
      if (!unk_id_) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.json: unk_token '", *unk_token_, "' is not in the vocabulary"));
      }
      if (has_unk && fuse_unk_) {
        unk.second += s.size();
      } else {
        if (has_unk) add(unk.first, unk.second);
        unk = {*unk_id_, s.size()};
        has_unk = true;
      }
    }
    // Without an unk_token an unknown character is dropped, as the `tokenizers` crate does.
  }
  if (has_unk) add(unk.first, unk.second);
  MergeAll(&ids, &lens);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (lens[i] > 0) out->push_back(ids[i]);
  }
  return absl::OkStatus();
}

// The `tokenizers` crate's Word::merge_all: repeatedly merge the pair of lowest rank,
// leftmost first, skipping queue entries made stale by earlier merges.
void BpeModel::MergeAll(std::vector<int64_t>* ids, std::vector<size_t>* lens) const {
  const int n = static_cast<int>(ids->size());
  if (n < 2 || merges_.empty()) return;
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Merge {
    int32_t rank;
    int pos;
    int32_t new_id;
  };
  auto later = [](const Merge& a, const Merge& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::priority_queue<Merge, std::vector<Merge>, decltype(later)> queue(later);
  for (int i = 0; i + 1 < n; ++i) {
    auto it = merges_.find(Key((*ids)[i], (*ids)[i + 1]));
    if (it != merges_.end()) queue.push({it->second.rank, i, it->second.new_id});
  }
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    if ((*lens)[top.pos] == 0 || next[top.pos] == -1) continue;
    const int right = next[top.pos];
    auto it = merges_.find(Key((*ids)[top.pos], (*ids)[right]));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    (*ids)[top.pos] = top.new_id;
    (*lens)[top.pos] += (*lens)[right];
    next[top.pos] = next[right];
    (*lens)[right] = 0;
    if (next[right] >= 0) prev[next[right]] = top.pos;
    if (prev[top.pos] >= 0) {
      auto m = merges_.find(Key((*ids)[prev[top.pos]], (*ids)[top.pos]));
      if (m != merges_.end()) queue.push({m->second.rank, prev[top.pos], m->second.new_id});
    }
    if (next[top.pos] >= 0) {
      auto m = merges_.find(Key((*ids)[top.pos], (*ids)[next[top.pos]]));
      if (m != merges_.end()) queue.push({m->second.rank, top.pos, m->second.new_id});
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The tokenizer.

class HfTokenizer : public TokenizerBackend {
 public:
  absl::Status Parse(const json& root, const JsonReader& r);

  absl::StatusOr<std::vector<int64_t>> Encode(absl::string_view text) const override;
  int64_t vocab_size() const override { return model_.size(); }
  int64_t id_limit() const override {
    int64_t limit = model_.id_limit();
    for (const auto& [id, token] : added_by_id_) limit = std::max(limit, id + 1);
    return limit;
  }
  std::optional<int64_t> TokenToId(absl::string_view token) const override {
    auto it = added_by_content_.find(token);
    if (it != added_by_content_.end()) return it->second;
    return model_.TokenToId(token);
  }
  std::unique_ptr<IncrementalDecoder> NewDecoder() const override;
  std::optional<std::string> TokenBytes(int64_t id) const override;
  absl::string_view name() const override { return "huggingface"; }

  // The token string decode starts from (added tokens first), or nullptr.
  const std::string* IdToToken(int64_t id) const {
    auto it = added_by_id_.find(id);
    if (it != added_by_id_.end()) return &it->second->pattern;
    return model_.IdToToken(id);
  }
  bool IsSpecial(const std::string& token) const { return special_.contains(token); }

  enum class DecoderKind { kJoinWithSpace, kByteLevel, kChain };
  DecoderKind decoder_kind() const { return decoder_kind_; }
  const std::vector<DecoderStep>& decoder_steps() const { return decoder_steps_; }
  bool fused() const { return fused_; }
  const std::optional<StripSpec>& fused_strip() const { return fused_strip_; }

 private:
  struct Segment {
    std::string text;
    bool at_start;
    const AddedToken* added;  // non-null for an added token
  };

  absl::Status ParseNormalizer(const json& root, const JsonReader& r);
  absl::Status ParsePreTokenizer(const json& root, const JsonReader& r);
  absl::Status ParsePostProcessor(const json& root, const JsonReader& r);
  absl::Status ParseDecoder(const json& root, const JsonReader& r);
  absl::Status ParseAddedTokens(const json& root, const JsonReader& r);
  absl::Status ParseTruncationAndPadding(const json& root, const JsonReader& r);

  std::string Normalize(std::string text) const;
  void SplitOnAdded(absl::string_view text, bool at_start, const AddedTokenMatcher& matcher,
                    std::vector<Segment>* out) const;
  std::vector<Word> PreTokenize(Word word) const;

  std::vector<NormalizerStep> normalizer_;
  std::vector<PreTokenizerStep> pre_tokenizer_;
  BpeModel model_;

  std::vector<std::unique_ptr<AddedToken>> added_;
  absl::flat_hash_map<std::string, int64_t> added_by_content_;
  absl::flat_hash_map<int64_t, const AddedToken*> added_by_id_;
  absl::flat_hash_set<std::string> special_;
  AddedTokenMatcher raw_matcher_, normalized_matcher_;

  std::vector<int64_t> prefix_ids_, suffix_ids_;  // post-processor
  std::optional<size_t> truncate_to_;
  bool truncate_left_ = false;
  bool pad_ = false;
  std::optional<size_t> pad_fixed_;
  size_t pad_multiple_ = 0;
  int64_t pad_id_ = 0;
  bool pad_left_ = false;

  DecoderKind decoder_kind_ = DecoderKind::kJoinWithSpace;
  std::vector<DecoderStep> decoder_steps_;
  bool fused_ = false;
  std::optional<StripSpec> fused_strip_;
};

absl::Status HfTokenizer::Parse(const json& root, const JsonReader& r) {
  if (!root.is_object()) return r.Error("top level", "is not a JSON object");
  const json* model = JsonReader::Find(root, "model");
  if (model == nullptr || !model->is_object()) return r.Error("model", "is missing");
  const std::string type = TypeOf(*model);
  if (type != "BPE") return r.Unimplemented("model", absl::StrCat("model type ", type));
  RETURN_IF_ERROR(model_.Parse(*model, r));
  RETURN_IF_ERROR(ParseNormalizer(root, r));
  RETURN_IF_ERROR(ParsePreTokenizer(root, r));
  RETURN_IF_ERROR(ParseAddedTokens(root, r));
  RETURN_IF_ERROR(ParsePostProcessor(root, r));
  RETURN_IF_ERROR(ParseTruncationAndPadding(root, r));
  RETURN_IF_ERROR(ParseDecoder(root, r));
  return absl::OkStatus();
}

absl::Status HfTokenizer::ParseNormalizer(const json& root, const JsonReader& r) {
  const json* normalizer = JsonReader::Find(root, "normalizer");
  if (normalizer == nullptr) return absl::OkStatus();
  std::vector<const json*> steps;
  RETURN_IF_ERROR(Flatten(*normalizer, "normalizers", r, "normalizer", &steps));
  for (const json* step : steps) {
    const std::string type = TypeOf(*step);
    NormalizerStep s;
    if (type == "Prepend") {
      s.kind = NormalizerStep::Kind::kPrepend;
      RETURN_IF_ERROR(r.RequiredString(*step, "prepend", "normalizer Prepend", &s.a));
    } else if (type == "Replace") {
      s.kind = NormalizerStep::Kind::kReplace;
      const json* pattern = JsonReader::Find(*step, "pattern");
      std::optional<std::string> literal;
      if (pattern != nullptr) RETURN_IF_ERROR(r.String(*pattern, "String", "normalizer", &literal));
      if (!literal) return r.Unimplemented("normalizer Replace", "a pattern other than String");
      s.a = *literal;
      RETURN_IF_ERROR(r.RequiredString(*step, "content", "normalizer Replace", &s.b));
      if (s.a.empty()) continue;
    } else if (type == "NFC") {
      s.kind = NormalizerStep::Kind::kNfc;
    } else if (type == "Strip") {
      s.kind = NormalizerStep::Kind::kStrip;
      RETURN_IF_ERROR(r.Bool(*step, "strip_left", "normalizer Strip", &s.left));
      RETURN_IF_ERROR(r.Bool(*step, "strip_right", "normalizer Strip", &s.right));
    } else if (type == "ByteLevel") {
      s.kind = NormalizerStep::Kind::kByteLevel;
    } else {
      return r.Unimplemented("normalizer", absl::StrCat("normalizer type ", type));
    }
    normalizer_.push_back(std::move(s));
  }
  return absl::OkStatus();
}

absl::Status ParsePrependScheme(const json& step, const JsonReader& r, absl::string_view where,
                                PrependScheme* scheme) {
  std::optional<std::string> name;
  RETURN_IF_ERROR(r.String(step, "prepend_scheme", where, &name));
  *scheme = PrependScheme::kAlways;  // the crate's default
  if (name) {
    if (*name == "always") {
      *scheme = PrependScheme::kAlways;
    } else if (*name == "first") {
      *scheme = PrependScheme::kFirst;
    } else if (*name == "never") {
      *scheme = PrependScheme::kNever;
    } else {
      return r.Error(where, absl::StrCat("unknown prepend_scheme '", *name, "'"));
    }
  }
  bool add_prefix_space = true;
  RETURN_IF_ERROR(r.Bool(step, "add_prefix_space", where, &add_prefix_space));
  if (!add_prefix_space) {
    if (name && *scheme != PrependScheme::kNever) {
      return r.Error(where, "add_prefix_space does not match declared prepend_scheme");
    }
    *scheme = PrependScheme::kNever;
  }
  return absl::OkStatus();
}

absl::Status HfTokenizer::ParsePreTokenizer(const json& root, const JsonReader& r) {
  const json* pre = JsonReader::Find(root, "pre_tokenizer");
  if (pre == nullptr) return absl::OkStatus();
  std::vector<const json*> steps;
  RETURN_IF_ERROR(Flatten(*pre, "pretokenizers", r, "pre_tokenizer", &steps));
  for (const json* step : steps) {
    const std::string type = TypeOf(*step);
    PreTokenizerStep s;
    if (type == "ByteLevel") {
      s.kind = PreTokenizerStep::Kind::kByteLevel;
      s.add_prefix_space = true;
      RETURN_IF_ERROR(
          r.Bool(*step, "add_prefix_space", "pre_tokenizer ByteLevel", &s.add_prefix_space));
      RETURN_IF_ERROR(r.Bool(*step, "use_regex", "pre_tokenizer ByteLevel", &s.use_regex));
    } else if (type == "Split") {
      const json* pattern = JsonReader::Find(*step, "pattern");
      std::optional<std::string> regex, literal;
      if (pattern != nullptr) {
        RETURN_IF_ERROR(r.String(*pattern, "Regex", "pre_tokenizer Split", &regex));
        RETURN_IF_ERROR(r.String(*pattern, "String", "pre_tokenizer Split", &literal));
      }
      std::optional<std::string> behavior_name;
      RETURN_IF_ERROR(r.String(*step, "behavior", "pre_tokenizer Split", &behavior_name));
      std::optional<Behavior> behavior = ParseBehavior(behavior_name.value_or("Isolated"));
      if (!behavior) {
        return r.Error("pre_tokenizer Split",
                       absl::StrCat("unknown behavior '", *behavior_name, "'"));
      }
      s.behavior = *behavior;
      bool invert = false;
      RETURN_IF_ERROR(r.Bool(*step, "invert", "pre_tokenizer Split", &invert));
      if (invert) return r.Unimplemented("pre_tokenizer Split", "invert");
      std::optional<PretokenizerPattern> known;
      if (regex) known = PatternFromRegex(*regex);
      if (known) {
        // These patterns match everything, so only Isolated keeps the text.
        if (s.behavior != Behavior::kIsolated) {
          return r.Unimplemented("pre_tokenizer Split",
                                 absl::StrCat("behavior ", *behavior_name, " with this regex"));
        }
        s.kind = PreTokenizerStep::Kind::kSplit;
        s.pattern = *known;
      } else if (regex && *regex == "[0-9][0-9][0-9]") {
        s.kind = PreTokenizerStep::Kind::kSplitDigits3;
      } else if (literal) {
        s.kind = PreTokenizerStep::Kind::kSplitLiteral;
        s.literal = *literal;
      } else if (regex) {
        return r.Unimplemented(
            "pre_tokenizer Split",
            absl::StrCat("the regex '", *regex,
                         "' (known: the GPT-2, Llama 3 and Qwen2 patterns, [0-9][0-9][0-9])"));
      } else {
        return r.Error("pre_tokenizer Split", "no pattern");
      }
    } else if (type == "Digits") {
      s.kind = PreTokenizerStep::Kind::kDigits;
      bool individual = false;
      RETURN_IF_ERROR(r.Bool(*step, "individual_digits", "pre_tokenizer Digits", &individual));
      s.behavior = individual ? Behavior::kIsolated : Behavior::kContiguous;
    } else if (type == "Punctuation") {
      s.kind = PreTokenizerStep::Kind::kPunctuation;
      std::optional<std::string> behavior_name;
      RETURN_IF_ERROR(r.String(*step, "behavior", "pre_tokenizer Punctuation", &behavior_name));
      std::optional<Behavior> behavior = ParseBehavior(behavior_name.value_or("Isolated"));
      if (!behavior) {
        return r.Error("pre_tokenizer Punctuation",
                       absl::StrCat("unknown behavior '", *behavior_name, "'"));
      }
      s.behavior = *behavior;
    } else if (type == "Metaspace") {
      s.kind = PreTokenizerStep::Kind::kMetaspace;
      RETURN_IF_ERROR(r.Char(*step, "replacement", "pre_tokenizer Metaspace", &s.replacement));
      RETURN_IF_ERROR(ParsePrependScheme(*step, r, "pre_tokenizer Metaspace", &s.prepend));
      RETURN_IF_ERROR(r.Bool(*step, "split", "pre_tokenizer Metaspace", &s.split));
    } else {
      return r.Unimplemented("pre_tokenizer", absl::StrCat("pre-tokenizer type ", type));
    }
    pre_tokenizer_.push_back(std::move(s));
  }
  return absl::OkStatus();
}

absl::Status HfTokenizer::ParseAddedTokens(const json& root, const JsonReader& r) {
  const json* list = JsonReader::Find(root, "added_tokens");
  if (list == nullptr || list->is_null()) return absl::OkStatus();
  if (!list->is_array()) return r.Error("added_tokens", "is not a list");
  // Ids as the crate's AddedVocabulary::add_tokens assigns them: the vocabulary's id when the
  // content is a known token, otherwise the next free id after the model's vocabulary.
  int64_t next_id = model_.size();
  for (size_t i = 0; i < list->size(); ++i) {
    const json& item = (*list)[i];
    const std::string where = absl::StrCat("added_tokens[", i, "]");
    auto token = std::make_unique<AddedToken>();
    RETURN_IF_ERROR(r.RequiredString(item, "content", where, &token->content));
    RETURN_IF_ERROR(r.Bool(item, "single_word", where, &token->single_word));
    RETURN_IF_ERROR(r.Bool(item, "lstrip", where, &token->lstrip));
    RETURN_IF_ERROR(r.Bool(item, "rstrip", where, &token->rstrip));
    RETURN_IF_ERROR(r.Bool(item, "normalized", where, &token->normalized));
    RETURN_IF_ERROR(r.Bool(item, "special", where, &token->special));
    if (token->content.empty()) continue;
    if (std::optional<int64_t> id = TokenToId(token->content)) {
      token->id = *id;
    } else {
      token->id = next_id++;
    }
    next_id = std::max(next_id, token->id + 1);
    token->pattern = token->normalized ? Normalize(token->content) : token->content;
    added_by_content_[token->content] = token->id;
    if (token->special) special_.insert(token->content);
    added_by_id_[token->id] = token.get();
    added_.push_back(std::move(token));
  }
  for (const auto& token : added_) {
    if (added_by_id_[token->id] != token.get()) continue;  // replaced by a later entry
    (token->normalized ? normalized_matcher_ : raw_matcher_).Add(token.get());
  }
  return absl::OkStatus();
}

absl::Status HfTokenizer::ParsePostProcessor(const json& root, const JsonReader& r) {
  const json* post = JsonReader::Find(root, "post_processor");
  if (post == nullptr) return absl::OkStatus();
  std::vector<const json*> steps;
  RETURN_IF_ERROR(Flatten(*post, "processors", r, "post_processor", &steps));
  for (const json* step : steps) {
    const std::string type = TypeOf(*step);
    std::vector<int64_t> prefix, suffix;
    if (type == "ByteLevel") {
      continue;
    } else if (type == "TemplateProcessing") {
      const json* single = JsonReader::Find(*step, "single");
      const json* specials = JsonReader::Find(*step, "special_tokens");
      if (single == nullptr || !single->is_array()) {
        return r.Error("post_processor", "TemplateProcessing without a 'single' list");
      }
      bool seen_sequence = false;
      for (const json& piece : *single) {
        if (const json* seq = JsonReader::Find(piece, "Sequence")) {
          std::optional<std::string> id;
          RETURN_IF_ERROR(r.String(*seq, "id", "post_processor", &id));
          if (seen_sequence || id.value_or("A") != "A") {
            return r.Unimplemented("post_processor", "a single template other than one 'A'");
          }
          seen_sequence = true;
        } else if (const json* special = JsonReader::Find(piece, "SpecialToken")) {
          std::string name;
          RETURN_IF_ERROR(r.RequiredString(*special, "id", "post_processor", &name));
          const json* entry =
              specials == nullptr ? nullptr : JsonReader::Find(*specials, name.c_str());
          const json* ids = entry == nullptr ? nullptr : JsonReader::Find(*entry, "ids");
          if (ids == nullptr || !ids->is_array()) {
            return r.Error("post_processor", absl::StrCat("special token '", name, "' has no ids"));
          }
          for (const json& id : *ids) {
            if (!id.is_number_integer()) {
              return r.Error("post_processor",
                             absl::StrCat("an id of '", name, "' is not an integer"));
            }
            (seen_sequence ? suffix : prefix).push_back(id.get<int64_t>());
          }
        } else {
          return r.Error("post_processor", "template piece is neither Sequence nor SpecialToken");
        }
      }
      if (!seen_sequence) return r.Unimplemented("post_processor", "a template without 'A'");
    } else if (type == "BertProcessing" || type == "RobertaProcessing") {
      for (const char* key : {"cls", "sep"}) {
        const json* pair = JsonReader::Find(*step, key);
        if (pair == nullptr || !pair->is_array() || pair->size() != 2 ||
            !(*pair)[1].is_number_integer()) {
          return r.Error("post_processor", absl::StrCat(type, " '", key, "' is not [token, id]"));
        }
        (std::string(key) == "cls" ? prefix : suffix).push_back((*pair)[1].get<int64_t>());
      }
    } else {
      return r.Unimplemented("post_processor", absl::StrCat("post-processor type ", type));
    }
    prefix.insert(prefix.end(), prefix_ids_.begin(), prefix_ids_.end());
    prefix_ids_ = std::move(prefix);
    suffix_ids_.insert(suffix_ids_.end(), suffix.begin(), suffix.end());
  }
  return absl::OkStatus();
}

absl::Status HfTokenizer::ParseTruncationAndPadding(const json& root, const JsonReader& r) {
  if (const json* t = JsonReader::Find(root, "truncation"); t != nullptr && !t->is_null()) {
    std::optional<int64_t> max_length;
    RETURN_IF_ERROR(r.Int(*t, "max_length", "truncation", &max_length));
    if (!max_length || *max_length < 0) return r.Error("truncation", "bad 'max_length'");
    truncate_to_ = static_cast<size_t>(*max_length);
    std::optional<std::string> direction;
    RETURN_IF_ERROR(r.String(*t, "direction", "truncation", &direction));
    truncate_left_ = direction.value_or("Right") == "Left";
  }
  if (const json* p = JsonReader::Find(root, "padding"); p != nullptr && !p->is_null()) {
    pad_ = true;
    const json* strategy = JsonReader::Find(*p, "strategy");
    if (strategy != nullptr && strategy->is_object()) {
      std::optional<int64_t> fixed;
      RETURN_IF_ERROR(r.Int(*strategy, "Fixed", "padding.strategy", &fixed));
      if (!fixed || *fixed < 0) return r.Unimplemented("padding", "this padding strategy");
      pad_fixed_ = static_cast<size_t>(*fixed);
    }
    std::optional<int64_t> multiple, pad_id;
    RETURN_IF_ERROR(r.Int(*p, "pad_to_multiple_of", "padding", &multiple));
    RETURN_IF_ERROR(r.Int(*p, "pad_id", "padding", &pad_id));
    pad_multiple_ = multiple && *multiple > 0 ? static_cast<size_t>(*multiple) : 0;
    pad_id_ = pad_id.value_or(0);
    std::optional<std::string> direction;
    RETURN_IF_ERROR(r.String(*p, "direction", "padding", &direction));
    pad_left_ = direction.value_or("Right") == "Left";
  }
  return absl::OkStatus();
}

absl::Status HfTokenizer::ParseDecoder(const json& root, const JsonReader& r) {
  const json* decoder = JsonReader::Find(root, "decoder");
  std::vector<const json*> steps;
  if (decoder != nullptr) RETURN_IF_ERROR(Flatten(*decoder, "decoders", r, "decoder", &steps));
  if (steps.empty()) {
    decoder_kind_ = DecoderKind::kJoinWithSpace;
    return absl::OkStatus();
  }
  if (steps.size() == 1 && TypeOf(*steps[0]) == "ByteLevel") {
    decoder_kind_ = DecoderKind::kByteLevel;
    return absl::OkStatus();
  }
  decoder_kind_ = DecoderKind::kChain;
  bool byte_fallback = false;
  for (const json* step : steps) {
    const std::string type = TypeOf(*step);
    if (fused_) {
      if (type == "Fuse") continue;
      if (type != "Strip" || fused_strip_) {
        return r.Unimplemented("decoder", absl::StrCat(type, " after Fuse"));
      }
      std::string content;
      std::optional<int64_t> start, stop;
      RETURN_IF_ERROR(r.Char(*step, "content", "decoder Strip", &content));
      RETURN_IF_ERROR(r.Int(*step, "start", "decoder Strip", &start));
      RETURN_IF_ERROR(r.Int(*step, "stop", "decoder Strip", &stop));
      StripSpec spec;
      spec.content = ToCodePoints(content)[0];
      spec.start = static_cast<size_t>(std::max<int64_t>(0, start.value_or(0)));
      spec.stop = static_cast<size_t>(std::max<int64_t>(0, stop.value_or(0)));
      fused_strip_ = spec;
      continue;
    }
    DecoderStep s;
    if (type == "Fuse") {
      fused_ = true;
      continue;
    } else if (type == "Replace") {
      s.kind = DecoderStep::Kind::kReplace;
      const json* pattern = JsonReader::Find(*step, "pattern");
      std::optional<std::string> literal;
      if (pattern != nullptr) RETURN_IF_ERROR(r.String(*pattern, "String", "decoder", &literal));
      if (!literal) return r.Unimplemented("decoder Replace", "a pattern other than String");
      s.from = *literal;
      RETURN_IF_ERROR(r.RequiredString(*step, "content", "decoder Replace", &s.to));
      if (s.from.empty()) continue;
    } else if (type == "ByteFallback") {
      if (byte_fallback) return r.Unimplemented("decoder", "two ByteFallback decoders");
      byte_fallback = true;
      s.kind = DecoderStep::Kind::kByteFallback;
    } else if (type == "Metaspace") {
      s.kind = DecoderStep::Kind::kMetaspace;
      RETURN_IF_ERROR(r.Char(*step, "replacement", "decoder Metaspace", &s.from));
      PrependScheme scheme;
      RETURN_IF_ERROR(ParsePrependScheme(*step, r, "decoder Metaspace", &scheme));
      s.strip_first = scheme != PrependScheme::kNever;
    } else if (type == "Strip") {
      s.kind = DecoderStep::Kind::kStrip;
      std::string content;
      std::optional<int64_t> start, stop;
      RETURN_IF_ERROR(r.Char(*step, "content", "decoder Strip", &content));
      RETURN_IF_ERROR(r.Int(*step, "start", "decoder Strip", &start));
      RETURN_IF_ERROR(r.Int(*step, "stop", "decoder Strip", &stop));
      s.content = ToCodePoints(content)[0];
      s.start = static_cast<size_t>(std::max<int64_t>(0, start.value_or(0)));
      s.stop = static_cast<size_t>(std::max<int64_t>(0, stop.value_or(0)));
    } else {
      return r.Unimplemented(
          "decoder", absl::StrCat("decoder type ", type, steps.size() > 1 ? " in a Sequence" : ""));
    }
    decoder_steps_.push_back(std::move(s));
  }
  return absl::OkStatus();
}

std::string HfTokenizer::Normalize(std::string text) const {
  for (const NormalizerStep& step : normalizer_) {
    switch (step.kind) {
      case NormalizerStep::Kind::kPrepend:
        if (!text.empty()) text = step.a + text;
        break;
      case NormalizerStep::Kind::kReplace:
        text = absl::StrReplaceAll(text, {{step.a, step.b}});
        break;
      case NormalizerStep::Kind::kNfc:
        text = NormalizeNfc(text);
        break;
      case NormalizerStep::Kind::kStrip: {
        std::vector<char32_t> chars = ToCodePoints(text);
        size_t begin = 0, end = chars.size();
        if (step.left) {
          while (begin < end && IsWhitespace(chars[begin])) ++begin;
        }
        if (step.right) {
          while (end > begin && IsWhitespace(chars[end - 1])) --end;
        }
        text = ToUtf8(std::vector<char32_t>(chars.begin() + begin, chars.begin() + end));
        break;
      }
      case NormalizerStep::Kind::kByteLevel:
        text = ByteLevelMap(text);
        break;
    }
  }
  return text;
}

// Start of the whitespace run that ends `text` (the crate's `\s*$`).
size_t TrailingSpaceStart(absl::string_view text) {
  std::vector<char32_t> chars = ToCodePoints(text);
  size_t bytes = text.size();
  for (size_t i = chars.size(); i > 0 && IsWhitespace(chars[i - 1]); --i) {
    std::string utf8;
    AppendUtf8(chars[i - 1], &utf8);
    bytes -= utf8.size();
  }
  return bytes;
}

// End of the whitespace run that starts `text` (the crate's `^\s*`).
size_t LeadingSpaceEnd(absl::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t next = pos;
    char32_t c;
    if (!NextCodePoint(text, &next, &c) || !IsWhitespace(c)) break;
    pos = next;
  }
  return pos;
}

bool EndsWithWordChar(absl::string_view text) {
  std::vector<char32_t> chars = ToCodePoints(text);
  return !chars.empty() && IsWordChar(chars.back());
}

bool StartsWithWordChar(absl::string_view text) {
  size_t pos = 0;
  char32_t c;
  return NextCodePoint(text, &pos, &c) && IsWordChar(c);
}

// AddedVocabulary::find_matches.
void HfTokenizer::SplitOnAdded(absl::string_view text, bool at_start,
                               const AddedTokenMatcher& matcher, std::vector<Segment>* out) const {
  auto push_text = [&](size_t begin, size_t end) {
    if (end > begin) {
      out->push_back(
          {std::string(text.substr(begin, end - begin)), at_start && begin == 0, nullptr});
    }
  };
  if (matcher.empty()) {
    push_text(0, text.size());
    return;
  }
  size_t search = 0, done = 0;
  while (search < text.size()) {
    size_t start;
    const AddedToken* token = matcher.Find(text, search, &start);
    if (token == nullptr) break;
    size_t stop = start + token->pattern.size();
    search = stop;
    if (token->single_word) {
      const bool start_space = start == 0 || !EndsWithWordChar(text.substr(0, start));
      const bool stop_space = stop == text.size() || !StartsWithWordChar(text.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (token->lstrip) start = std::max(TrailingSpaceStart(text.substr(0, start)), done);
    if (token->rstrip) stop += LeadingSpaceEnd(text.substr(stop));
    start = std::max(start, done);
    push_text(done, start);
    out->push_back({std::string(text.substr(start, stop - start)), false, token});
    done = stop;
  }
  push_text(done, text.size());
}

std::vector<Word> HfTokenizer::PreTokenize(Word word) const {
  std::vector<Word> words;
  words.push_back(std::move(word));
  for (const PreTokenizerStep& step : pre_tokenizer_) {
    std::vector<Word> next;
    for (Word& w : words) {
      switch (step.kind) {
        case PreTokenizerStep::Kind::kByteLevel: {
          if (step.add_prefix_space && (w.text.empty() || w.text[0] != ' ')) {
            w.text.insert(0, " ");
          }
          if (step.use_regex) {
            bool first = true;
            for (absl::string_view piece : SplitByPattern(PretokenizerPattern::kGpt2, w.text)) {
              next.push_back({std::string(piece), w.at_start && first});
              first = false;
            }
          } else {
            next.push_back(std::move(w));
          }
          break;
        }
        case PreTokenizerStep::Kind::kSplit: {
          bool first = true;
          for (absl::string_view piece : SplitByPattern(step.pattern, w.text)) {
            next.push_back({std::string(piece), w.at_start && first});
            first = false;
          }
          break;
        }
        case PreTokenizerStep::Kind::kSplitDigits3:
        case PreTokenizerStep::Kind::kSplitLiteral:
        case PreTokenizerStep::Kind::kDigits:
        case PreTokenizerStep::Kind::kPunctuation: {
          std::vector<Match> matches;
          if (step.kind == PreTokenizerStep::Kind::kSplitDigits3) {
            matches = MatchThreeDigits(w.text);
          } else if (step.kind == PreTokenizerStep::Kind::kSplitLiteral) {
            matches = MatchLiteral(w.text, step.literal);
          } else if (step.kind == PreTokenizerStep::Kind::kDigits) {
            matches = MatchChars(w.text, IsNumber);  // Rust's char::is_numeric
          } else {
            // char::is_ascii_punctuation || the P* categories.
            matches = MatchChars(w.text, [](char32_t c) {
              return (c < 0x80 && c > 0x20 && c != 0x7F && !IsLetter(c) && !IsNumber(c)) ||
                     IsPunctuation(c);
            });
          }
          for (const auto& [begin, end] : ApplyBehavior(matches, step.behavior)) {
            next.push_back({w.text.substr(begin, end - begin), w.at_start && begin == 0});
          }
          break;
        }
        case PreTokenizerStep::Kind::kMetaspace: {
          std::string text = absl::StrReplaceAll(w.text, {{" ", step.replacement}});
          const bool starts =
              absl::string_view(text).substr(0, step.replacement.size()) == step.replacement;
          if (!starts && (step.prepend == PrependScheme::kAlways ||
                          (step.prepend == PrependScheme::kFirst && w.at_start))) {
            text.insert(0, step.replacement);
          }
          if (!step.split) {
            next.push_back({std::move(text), w.at_start});
            break;
          }
          // MergedWithNext: each replacement character starts a new piece.
          size_t begin = 0;
          size_t pos = 0;
          bool first = true;
          while (pos < text.size()) {
            const size_t found = text.find(step.replacement, pos);
            if (found == std::string::npos) break;
            if (found > begin) {
              next.push_back({text.substr(begin, found - begin), w.at_start && first});
              first = false;
              begin = found;
            }
            pos = found + step.replacement.size();
          }
          if (begin < text.size()) next.push_back({text.substr(begin), w.at_start && first});
          break;
        }
      }
    }
    // Empty pieces are dropped between steps, as PreTokenizedString::split does.
    words.clear();
    for (Word& w : next) {
      if (!w.text.empty()) words.push_back(std::move(w));
    }
    if (step.kind == PreTokenizerStep::Kind::kByteLevel) {
      for (Word& w : words) w.text = ByteLevelMap(w.text);
    }
  }
  return words;
}

absl::StatusOr<std::vector<int64_t>> HfTokenizer::Encode(absl::string_view text) const {
  std::vector<Segment> raw;
  SplitOnAdded(text, /*at_start=*/true, raw_matcher_, &raw);
  std::vector<Segment> segments;
  for (Segment& s : raw) {
    if (s.added != nullptr) {
      segments.push_back(std::move(s));
    } else {
      SplitOnAdded(Normalize(std::move(s.text)), s.at_start, normalized_matcher_, &segments);
    }
  }
  std::vector<int64_t> ids;
  for (Segment& s : segments) {
    if (s.added != nullptr) {
      ids.push_back(s.added->id);
      continue;
    }
    for (const Word& w : PreTokenize({std::move(s.text), s.at_start})) {
      RETURN_IF_ERROR(model_.Tokenize(w.text, &ids));
    }
  }
  if (truncate_to_) {
    const size_t added = prefix_ids_.size() + suffix_ids_.size();
    const size_t limit = *truncate_to_ > added ? *truncate_to_ - added : 0;
    if (ids.size() > limit) {
      if (truncate_left_) {
        ids.erase(ids.begin(), ids.end() - limit);
      } else {
        ids.resize(limit);
      }
    }
  }
  std::vector<int64_t> result = prefix_ids_;
  result.insert(result.end(), ids.begin(), ids.end());
  result.insert(result.end(), suffix_ids_.begin(), suffix_ids_.end());
  if (pad_) {
    size_t target = pad_fixed_.value_or(result.size());
    if (pad_multiple_ > 0 && target % pad_multiple_ != 0) {
      target += pad_multiple_ - target % pad_multiple_;
    }
    if (result.size() < target) {
      result.insert(pad_left_ ? result.begin() : result.end(), target - result.size(), pad_id_);
    }
  }
  return result;
}

// ---------------------------------------------------------------------------------------------
// Decoding.

class HfDecoder : public IncrementalDecoder {
 public:
  explicit HfDecoder(const HfTokenizer& t) : t_(t), counts_(t.decoder_steps().size(), 0) {}

  absl::Status Push(int64_t id, std::string* out) override {
    const std::string* token = t_.IdToToken(id);
    if (token == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is not in the vocabulary"));
    }
    if (t_.IsSpecial(*token)) return absl::OkStatus();  // skip_special_tokens=True
    switch (t_.decoder_kind()) {
      case HfTokenizer::DecoderKind::kJoinWithSpace:
        if (!first_) out->push_back(' ');
        first_ = false;
        out->append(*token);
        break;
      case HfTokenizer::DecoderKind::kByteLevel:
        utf8_.Append(ByteLevelUnmap(*token), out);
        break;
      case HfTokenizer::DecoderKind::kChain:
        Feed(0, *token, out);
        break;
    }
    return absl::OkStatus();
  }

  void Finish(std::string* out) override {
    switch (t_.decoder_kind()) {
      case HfTokenizer::DecoderKind::kJoinWithSpace:
        break;
      case HfTokenizer::DecoderKind::kByteLevel:
        utf8_.Finish(out);
        break;
      case HfTokenizer::DecoderKind::kChain:
        for (size_t i = 0; i < t_.decoder_steps().size(); ++i) {
          if (t_.decoder_steps()[i].kind == DecoderStep::Kind::kByteFallback) FlushRun(i, out);
        }
        trailing_.clear();  // the fused Strip's `stop` characters
        break;
    }
  }

 private:
  // Runs `token` through decoder steps [stage, end) and into the output.
  void Feed(size_t stage, std::string token, std::string* out) {
    const std::vector<DecoderStep>& steps = t_.decoder_steps();
    for (; stage < steps.size(); ++stage) {
      const DecoderStep& s = steps[stage];
      switch (s.kind) {
        case DecoderStep::Kind::kReplace:
          token = absl::StrReplaceAll(token, {{s.from, s.to}});
          break;
        case DecoderStep::Kind::kStrip:
          token = StripToken(token, {s.content, s.start, s.stop});
          break;
        case DecoderStep::Kind::kMetaspace: {
          const bool first = counts_[stage]++ == 0;
          const char32_t replacement = ToCodePoints(s.from)[0];
          std::string replaced;
          for (char32_t c : ToCodePoints(token)) {
            if (c == replacement) {
              if (!(first && s.strip_first)) replaced.push_back(' ');
            } else {
              AppendUtf8(c, &replaced);
            }
          }
          token = std::move(replaced);
          break;
        }
        case DecoderStep::Kind::kByteFallback: {
          const int byte = ParseByteToken(token);
          if (byte >= 0) {
            AddByte(stage, static_cast<char>(byte), out);
            return;
          }
          FlushRun(stage, out);
          break;
        }
      }
    }
    Sink(token, out);
  }

  // The ByteFallback decoder turns a run of byte tokens into its text when the whole run is
  // well-formed UTF-8 and into one U+FFFD per byte otherwise, so a run is held back until it
  // ends unless it is already ill-formed.
  void AddByte(size_t stage, char byte, std::string* out) {
    if (run_invalid_) {
      Feed(stage + 1, "\xEF\xBF\xBD", out);
      return;
    }
    run_.push_back(byte);
    if (ClassifyUtf8(run_) == Utf8State::kInvalid) {
      run_invalid_ = true;
      const size_t n = run_.size();
      run_.clear();
      for (size_t i = 0; i < n; ++i) Feed(stage + 1, "\xEF\xBF\xBD", out);
    }
  }

  void FlushRun(size_t stage, std::string* out) {
    if (run_invalid_) {
      run_invalid_ = false;
      return;
    }
    if (run_.empty()) return;
    std::string run = std::move(run_);
    run_.clear();
    if (ClassifyUtf8(run) == Utf8State::kComplete) {
      Feed(stage + 1, std::move(run), out);
    } else {
      for (size_t i = 0; i < run.size(); ++i) Feed(stage + 1, "\xEF\xBF\xBD", out);
    }
  }

  // After the steps: without Fuse tokens are simply joined; with Fuse they form one string
  // that a final Strip trims at both ends.
  void Sink(const std::string& token, std::string* out) {
    if (!t_.fused() || !t_.fused_strip()) {
      out->append(token);
      return;
    }
    const StripSpec& strip = *t_.fused_strip();
    for (char32_t c : ToCodePoints(token)) {
      if (leading_ && c == strip.content && stripped_ < strip.start) {
        ++stripped_;
        continue;
      }
      leading_ = false;
      if (strip.stop == 0) {
        AppendUtf8(c, out);
      } else if (c == strip.content) {
        trailing_.push_back(c);
        if (trailing_.size() > strip.stop) {
          AppendUtf8(trailing_.front(), out);
          trailing_.erase(trailing_.begin());
        }
      } else {
        for (char32_t held : trailing_) AppendUtf8(held, out);
        trailing_.clear();
        AppendUtf8(c, out);
      }
    }
  }

  const HfTokenizer& t_;
  bool first_ = true;
  Utf8LossyStream utf8_;
  std::vector<size_t> counts_;
  std::string run_;
  bool run_invalid_ = false;
  bool leading_ = true;
  size_t stripped_ = 0;
  std::vector<char32_t> trailing_;
};

std::unique_ptr<IncrementalDecoder> HfTokenizer::NewDecoder() const {
  return std::make_unique<HfDecoder>(*this);
}

// HfDecoder's steps for one token that is not the first: a byte token stops at ByteFallback as
// its byte; Metaspace turns every replacement character into a space; the Strip after Fuse only
// trims the ends of the whole text, so it is left out.
std::optional<std::string> HfTokenizer::TokenBytes(int64_t id) const {
  const std::string* token = IdToToken(id);
  if (token == nullptr || IsSpecial(*token)) return std::nullopt;
  switch (decoder_kind_) {
    case DecoderKind::kJoinWithSpace:
      return absl::StrCat(" ", *token);
    case DecoderKind::kByteLevel:
      return ByteLevelUnmap(*token);
    case DecoderKind::kChain:
      break;
  }
  std::string text = *token;
  for (const DecoderStep& s : decoder_steps_) {
    switch (s.kind) {
      case DecoderStep::Kind::kReplace:
        text = absl::StrReplaceAll(text, {{s.from, s.to}});
        break;
      case DecoderStep::Kind::kStrip:
        text = StripToken(text, {s.content, s.start, s.stop});
        break;
      case DecoderStep::Kind::kMetaspace: {
        const char32_t replacement = ToCodePoints(s.from)[0];
        std::string replaced;
        for (char32_t c : ToCodePoints(text)) AppendUtf8(c == replacement ? U' ' : c, &replaced);
        text = std::move(replaced);
        break;
      }
      case DecoderStep::Kind::kByteFallback: {
        const int byte = ParseByteToken(text);
        if (byte >= 0) return std::string(1, static_cast<char>(byte));
        break;
      }
    }
  }
  return text;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenizerBackend>> ParseHfTokenizer(absl::string_view json_text,
                                                                   absl::string_view source) {
  const json root = json::parse(json_text.begin(), json_text.end(), nullptr,
                                /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  }
  auto tokenizer = std::make_unique<HfTokenizer>();
  RETURN_IF_ERROR(tokenizer->Parse(root, JsonReader(source)));
  return std::unique_ptr<TokenizerBackend>(std::move(tokenizer));
}

absl::StatusOr<std::unique_ptr<TokenizerBackend>> LoadHfTokenizer(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return ParseHfTokenizer(text.str(), path);
}

}  // namespace lgpt
