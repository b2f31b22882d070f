#include "core/text/sentencepiece_tokenizer.h"

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <fstream>
#include <functional>
#include <queue>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace lgpt {
namespace {

constexpr absl::string_view kSpaceSymbol = "\xE2\x96\x81";  // U+2581
constexpr absl::string_view kReplacementChar = "\xEF\xBF\xBD";

// A minimal protobuf wire-format reader for the few ModelProto fields needed (Debian ships no
// generated classes for it).
class WireReader {
 public:
  explicit WireReader(absl::string_view data) : data_(data) {}

  // Advances to the next field; false at the end or on malformed input (then ok() is false).
  bool Next(uint32_t* field, uint32_t* wire_type) {
    if (pos_ >= data_.size()) return false;
    uint64_t key;
    if (!Varint(&key)) return false;
    *field = static_cast<uint32_t>(key >> 3);
    *wire_type = static_cast<uint32_t>(key & 7);
    return true;
  }
  bool Varint(uint64_t* value) {
    *value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= data_.size()) return Fail();
      const uint8_t b = static_cast<uint8_t>(data_[pos_++]);
      *value |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return Fail();
  }
  bool Fixed32(uint32_t* value) {
    if (data_.size() - pos_ < 4) return Fail();
    std::memcpy(value, data_.data() + pos_, 4);
    pos_ += 4;
    return true;
  }
  bool Bytes(absl::string_view* value) {
    uint64_t length;
    if (!Varint(&length) || length > data_.size() - pos_) return Fail();
    *value = data_.substr(pos_, length);
    pos_ += length;
    return true;
  }
  bool Skip(uint32_t wire_type) {
    uint64_t ignored;
    absl::string_view bytes;
    switch (wire_type) {
      case 0:
        return Varint(&ignored);
      case 1:
        if (data_.size() - pos_ < 8) return Fail();
        pos_ += 8;
        return true;
      case 2:
        return Bytes(&bytes);
      case 5:
        if (data_.size() - pos_ < 4) return Fail();
        pos_ += 4;
        return true;
      default:
        return Fail();
    }
  }
  bool ok() const { return ok_; }

 private:
  bool Fail() {
    ok_ = false;
    pos_ = data_.size();
    return false;
  }
  absl::string_view data_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// string_util::OneCharLen: the length a UTF-8 lead byte announces (1 for stray bytes).
size_t OneCharLen(char c) {
  return "\1\1\1\1\1\1\1\1\1\1\1\1\2\2\3\4"[(static_cast<unsigned char>(c)) >> 4];
}

// string_util::IsValidDecodeUTF8: whether a well-formed character starts `s` (its length in
// `*length`, else 1).
bool IsValidDecodeUtf8(absl::string_view s, size_t* length) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  *length = 1;
  if (p[0] < 0x80) return true;
  size_t need;
  char32_t cp, min;
  if (n >= 2 && (p[0] & 0xE0) == 0xC0) {
    need = 2;
    cp = p[0] & 0x1F;
    min = 0x80;
  } else if (n >= 3 && (p[0] & 0xF0) == 0xE0) {
    need = 3;
    cp = p[0] & 0x0F;
    min = 0x800;
  } else if (n >= 4 && (p[0] & 0xF8) == 0xF0) {
    need = 4;
    cp = p[0] & 0x07;
    min = 0x10000;
  } else {
    return false;
  }
  for (size_t k = 1; k < need; ++k) {
    if ((p[k] & 0xC0) != 0x80) return false;
    cp = (cp << 6) | (p[k] & 0x3F);
  }
  if (cp < min || (cp >= 0xD800 && cp < 0xE000) || cp > 0x10FFFF) return false;
  *length = need;
  return true;
}

// Darts-clone's double-array trie as SentencePiece stores the precompiled character map:
// 32-bit little-endian units. Lookups are bounds-checked, so a corrupt map fails to match
// instead of reading out of bounds.
class DoubleArray {
 public:
  DoubleArray() = default;
  explicit DoubleArray(absl::string_view units) : units_(units) {}
  bool empty() const { return units_.size() < 4; }

  // The longest key that is a prefix of `key`: its length (0 if none) and value.
  size_t LongestPrefix(absl::string_view key, uint32_t* value) const {
    size_t best = 0;
    uint32_t node = 0;
    uint32_t unit;
    if (!Unit(node, &unit)) return 0;
    node ^= Offset(unit);
    for (size_t i = 0; i < key.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(key[i]);
      node ^= c;
      if (!Unit(node, &unit) || Label(unit) != c) break;
      node ^= Offset(unit);
      if (HasLeaf(unit)) {
        uint32_t leaf;
        if (!Unit(node, &leaf)) break;
        best = i + 1;
        *value = leaf & ((1U << 31) - 1);
      }
    }
    return best;
  }

 private:
  bool Unit(uint32_t index, uint32_t* unit) const {
    if (index >= units_.size() / 4) return false;
    std::memcpy(unit, units_.data() + 4 * static_cast<size_t>(index), 4);
    return true;
  }
  static bool HasLeaf(uint32_t unit) { return ((unit >> 8) & 1) == 1; }
  static uint32_t Label(uint32_t unit) { return unit & ((1U << 31) | 0xFF); }
  static uint32_t Offset(uint32_t unit) { return (unit >> 10) << ((unit & (1U << 9)) >> 6); }

  absl::string_view units_;
};

// A byte trie over a set of pieces: memory linear in their total length. A walk from a text
// position stops as soon as no piece below the current node can fit in the rest of the text,
// so text that is a prefix of a huge piece costs nothing extra.
class PieceTrie {
 public:
  void Insert(absl::string_view key, int value) {
    int32_t node = 0;
    for (const char c : key) {
      auto [it, inserted] = children_.try_emplace(Edge(node, c), 0);
      if (inserted) {
        it->second = nodes();
        values_.push_back(-1);
        parents_.push_back(node);
        depths_.push_back(depths_[node] + 1);
        labels_.push_back(c);
      }
      node = it->second;
    }
    values_[node] = value;
  }

  // After the last Insert: the shortest key length in each node's subtree.
  void Finalize() {
    shortest_below_.assign(values_.size(), INT32_MAX);
    // Children are created after their parents, so a reverse sweep sees children first.
    for (int32_t node = nodes(); node-- > 0;) {
      if (is_key(node)) shortest_below_[node] = std::min(shortest_below_[node], depths_[node]);
      if (node > 0) {
        int32_t& parent = shortest_below_[parents_[node]];
        parent = std::min(parent, shortest_below_[node]);
      }
    }
  }

  // Calls fn(length, value) for each key that is a prefix of `text`, shortest first.
  template <typename Fn>
  void ForEachPrefix(absl::string_view text, Fn fn) const {
    int32_t node = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      node = Child(node, text[i]);
      if (node < 0) return;
      if (is_key(node)) fn(i + 1, values_[node]);
      if (static_cast<size_t>(shortest_below_[node]) > text.size()) return;
    }
  }

  // Node 0 is the root; a child's number is larger than its parent's.
  int32_t nodes() const { return static_cast<int32_t>(values_.size()); }
  int32_t Child(int32_t node, char c) const {
    auto it = children_.find(Edge(node, c));
    return it == children_.end() ? -1 : it->second;
  }
  int32_t parent(int32_t node) const { return parents_[node]; }
  int32_t depth(int32_t node) const { return depths_[node]; }
  char label(int32_t node) const { return labels_[node]; }  // the byte leading to `node`
  bool is_key(int32_t node) const { return values_[node] >= 0; }

 private:
  static uint64_t Edge(int32_t node, char c) {
    return (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(c);
  }

  absl::flat_hash_map<uint64_t, int32_t> children_;  // (node, byte) -> child node
  std::vector<int32_t> values_ = {-1};               // per node; -1: no key ends here
  std::vector<int32_t> parents_ = {-1};
  std::vector<int32_t> depths_ = {0};
  std::vector<char> labels_ = {0};
  std::vector<int32_t> shortest_below_;
};

// Aho-Corasick over the user-defined symbols: the longest symbol starting at every position of
// a text in one pass, O(text + matches) however long the symbols are (a per-position scan is
// O(text x longest symbol), minutes for a hostile 200,000-byte symbol).
class SymbolMatcher {
 public:
  bool empty() const { return trie_.nodes() == 1; }

  void Insert(absl::string_view key) { trie_.Insert(key, 0); }

  // After the last Insert: failure links (longest proper suffix that is a trie node) and
  // output links (longest proper suffix that is a key), breadth first.
  void Build() {
    std::vector<std::vector<int32_t>> levels;  // nodes by depth - 1
    for (int32_t node = 1; node < trie_.nodes(); ++node) {
      if (static_cast<int32_t>(levels.size()) < trie_.depth(node)) levels.resize(trie_.depth(node));
      levels[trie_.depth(node) - 1].push_back(node);
    }
    fail_.assign(trie_.nodes(), 0);
    output_.assign(trie_.nodes(), -1);
    for (const std::vector<int32_t>& level : levels) {
      for (const int32_t node : level) {
        if (trie_.depth(node) == 1) continue;  // fails to the root
        const int32_t f = Next(fail_[trie_.parent(node)], trie_.label(node));
        fail_[node] = f;
        output_[node] = trie_.is_key(f) ? f : output_[f];
      }
    }
  }

  // result[i]: length of the longest symbol starting at byte i of `text` (0 if none).
  std::vector<uint32_t> LongestAt(absl::string_view text) const {
    std::vector<uint32_t> longest(text.size() + 1, 0);
    if (empty()) return longest;
    int32_t state = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      state = Next(state, text[i]);
      for (int32_t k = trie_.is_key(state) ? state : output_[state]; k > 0; k = output_[k]) {
        const uint32_t length = static_cast<uint32_t>(trie_.depth(k));
        uint32_t& at = longest[i + 1 - length];
        at = std::max(at, length);
      }
    }
    return longest;
  }

 private:
  // The automaton's move from `state` on byte `c`: the child, else the failure chain's.
  int32_t Next(int32_t state, char c) const {
    int32_t next = trie_.Child(state, c);
    while (next < 0 && state != 0) {
      state = fail_[state];
      next = trie_.Child(state, c);
    }
    return next >= 0 ? next : 0;
  }

  PieceTrie trie_;
  std::vector<int32_t> fail_, output_;
};

}  // namespace

struct SentencePieceModel::Impl {
  enum class Type { kUnigram, kBpe } model_type = Type::kUnigram;
  bool byte_fallback = false;
  bool escape_whitespaces = true;
  std::vector<float> scores;
  // The library's pieces_ (normal, user-defined and unused pieces) and reserved_id_map_.
  absl::flat_hash_map<std::string, int> pieces;
  absl::flat_hash_map<std::string, int> reserved;
  // Unigram: `pieces` as a trie, for the lattice's prefix scan.
  PieceTrie piece_trie;
  // User-defined symbols, matched longest first.
  SymbolMatcher user_defined;
  float min_score = FLT_MAX;  // unigram, over normal pieces
  float max_score = FLT_MIN;
  // Precompiled character map: <uint32 trie size><double array><NUL-terminated strings>.
  std::string charsmap;
  DoubleArray trie;
  absl::string_view normalized_strings;

  // normalizer::PrefixMatcher::PrefixMatch over the user-defined symbols, given the length of
  // the longest symbol at the start of `w` (SymbolMatcher::LongestAt).
  static size_t PrefixMatch(absl::string_view w, size_t longest_symbol, bool* found) {
    *found = longest_symbol > 0;
    return longest_symbol > 0 ? longest_symbol : std::min(w.size(), OneCharLen(w[0]));
  }

  // normalizer::Normalizer::NormalizePrefix; `longest_symbol` as for PrefixMatch.
  std::pair<absl::string_view, size_t> NormalizePrefix(absl::string_view input,
                                                       size_t longest_symbol) const {
    if (input.empty()) return {};
    bool found;
    const size_t user = PrefixMatch(input, longest_symbol, &found);
    if (found) return {input.substr(0, user), user};
    if (!trie.empty()) {
      uint32_t value = 0;
      const size_t length = trie.LongestPrefix(input, &value);
      if (length > 0 && value < normalized_strings.size()) {
        absl::string_view rest = normalized_strings.substr(value);
        return {rest.substr(0, std::min(rest.find('\0'), rest.size())), length};
      }
    }
    size_t length;
    if (!IsValidDecodeUtf8(input, &length)) return {kReplacementChar, 1};
    return {input.substr(0, length), length};
  }
};

SentencePieceModel::SentencePieceModel() : impl_(std::make_unique<Impl>()) {}
SentencePieceModel::~SentencePieceModel() = default;

absl::StatusOr<std::unique_ptr<SentencePieceModel>> SentencePieceModel::Load(
    const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream bytes;
  bytes << file.rdbuf();
  if (file.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return Parse(bytes.str(), path);
}

absl::StatusOr<std::unique_ptr<SentencePieceModel>> SentencePieceModel::Parse(
    std::string serialized, absl::string_view source) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not a usable SentencePiece model (", what, ")"));
  };
  auto unsupported = [&](absl::string_view what) {
    return absl::UnimplementedError(
        absl::StrCat(source, ": ", what, " is not supported by lgpt's SentencePiece"));
  };
  std::unique_ptr<SentencePieceModel> model(new SentencePieceModel());
  SentencePieceModel& m = *model;
  Impl& impl = *m.impl_;
  std::string unk_piece = "<unk>", bos_piece = "<s>", eos_piece = "</s>";
  bool treat_whitespace_as_suffix = false;
  bool has_denormalizer = false;
  absl::string_view charsmap;

  WireReader top(serialized);
  uint32_t field, wire;
  while (top.Next(&field, &wire)) {
    if (wire != 2 || (field != 1 && field != 2 && field != 3 && field != 5)) {
      if (!top.Skip(wire)) break;
      continue;
    }
    absl::string_view message;
    if (!top.Bytes(&message)) break;
    WireReader inner(message);
    uint32_t f, w;
    if (field == 1) {  // SentencePiece {piece = 1, score = 2, type = 3}
      std::string piece;
      float score = 0;
      uint64_t type = 1;
      while (inner.Next(&f, &w)) {
        absl::string_view text;
        uint32_t bits;
        if (f == 1 && w == 2 && inner.Bytes(&text)) {
          piece = std::string(text);
        } else if (f == 2 && w == 5 && inner.Fixed32(&bits)) {
          std::memcpy(&score, &bits, 4);
        } else if (f == 3 && w == 0 && inner.Varint(&type)) {
        } else if (!inner.ok() || !inner.Skip(w)) {
          break;
        }
      }
      if (!inner.ok()) return bad("a malformed piece");
      if (type < 1 || type > 6) return bad(absl::StrCat("piece type ", type));
      static constexpr PieceType kTypes[] = {PieceType::kNormal,  PieceType::kUnknown,
                                             PieceType::kControl, PieceType::kUserDefined,
                                             PieceType::kUnused,  PieceType::kByte};
      m.pieces_.push_back(std::move(piece));
      m.types_.push_back(kTypes[type - 1]);
      impl.scores.push_back(score);
      continue;
    }
    while (inner.Next(&f, &w)) {
      uint64_t value = 0;
      absl::string_view text;
      if (w == 0) {
        if (!inner.Varint(&value)) break;
      } else if (w == 2) {
        if (!inner.Bytes(&text)) break;
      } else if (!inner.Skip(w)) {
        break;
      }
      if (field == 2) {  // TrainerSpec
        if (f == 3 && w == 0) {
          if (value == 2) {
            impl.model_type = Impl::Type::kBpe;
          } else if (value != 1) {
            return unsupported(value == 3   ? "the word model"
                               : value == 4 ? "the char model"
                                            : "this model type");
          }
        }
        if (f == 24 && w == 0) treat_whitespace_as_suffix = value != 0;
        if (f == 35 && w == 0) impl.byte_fallback = value != 0;
        if (f == 44 && w == 2) m.unk_surface_ = std::string(text);
        if (f == 45 && w == 2) unk_piece = std::string(text);
        if (f == 46 && w == 2) bos_piece = std::string(text);
        if (f == 47 && w == 2) eos_piece = std::string(text);
      } else if (field == 3) {  // NormalizerSpec
        if (f == 2 && w == 2) charsmap = text;
        if (f == 3 && w == 0) m.add_dummy_prefix_ = value != 0;
        if (f == 4 && w == 0) m.remove_extra_whitespaces_ = value != 0;
        if (f == 5 && w == 0) impl.escape_whitespaces = value != 0;
      } else if (field == 5) {  // denormalizer NormalizerSpec
        if (f == 2 && w == 2 && !text.empty()) has_denormalizer = true;
      }
    }
    if (!inner.ok()) return bad("a malformed specification");
  }
  if (!top.ok()) return bad("malformed protobuf");
  if (treat_whitespace_as_suffix) return unsupported("treat_whitespace_as_suffix");
  if (has_denormalizer) return unsupported("a denormalizer");

  // ModelInterface::InitializePieces.
  bool byte_found[256] = {};
  for (int id = 0; id < m.size(); ++id) {
    const std::string& piece = m.pieces_[id];
    const PieceType type = m.types_[id];
    if (piece.empty()) return bad("an empty piece");
    const bool normal =
        type == PieceType::kNormal || type == PieceType::kUserDefined || type == PieceType::kUnused;
    if (!(normal ? impl.pieces : impl.reserved).emplace(piece, id).second) {
      return bad(absl::StrCat("piece '", piece, "' is defined twice"));
    }
    if (type == PieceType::kUserDefined) {
      impl.user_defined.Insert(piece);
    }
    if (type == PieceType::kUnknown) {
      if (m.unk_id_ >= 0) return bad("two unknown pieces");
      m.unk_id_ = id;
    }
    if (type == PieceType::kByte) {
      if (!impl.byte_fallback) return bad("byte pieces without byte_fallback");
      // PieceToByte: exactly "<0x%02X>".
      int byte = -1;
      for (int b = 0; b < 256 && byte < 0; ++b) {
        if (piece == absl::StrFormat("<0x%02X>", b)) byte = b;
      }
      if (byte < 0) return bad(absl::StrCat("byte piece '", piece, "'"));
      byte_found[byte] = true;
    }
    if (type == PieceType::kNormal) {
      impl.min_score = std::min(impl.min_score, impl.scores[id]);
      impl.max_score = std::max(impl.max_score, impl.scores[id]);
    }
  }
  impl.user_defined.Build();
  if (m.unk_id_ < 0) return bad("no unknown piece");
  if (impl.byte_fallback &&
      std::find(std::begin(byte_found), std::end(byte_found), false) != std::end(byte_found)) {
    return bad("byte_fallback without all 256 byte pieces");
  }
  if (impl.model_type == Impl::Type::kUnigram) {
    for (const auto& [piece, id] : impl.pieces) impl.piece_trie.Insert(piece, id);
    impl.piece_trie.Finalize();
  }
  // bos_id() / eos_id(): the named piece when it is a control symbol.
  const int bos = m.PieceToId(bos_piece), eos = m.PieceToId(eos_piece);
  m.bos_id_ = m.types_[bos] == PieceType::kControl ? bos : -1;
  m.eos_id_ = m.types_[eos] == PieceType::kControl ? eos : -1;
  (void)unk_piece;

  if (!charsmap.empty()) {
    impl.charsmap = std::string(charsmap);
    uint32_t trie_size = 0;
    if (impl.charsmap.size() <= 4) return bad("a broken normalization map");
    std::memcpy(&trie_size, impl.charsmap.data(), 4);
    if (trie_size >= impl.charsmap.size() - 4) return bad("a broken normalization map");
    const absl::string_view blob(impl.charsmap);
    impl.trie = DoubleArray(blob.substr(4, trie_size));
    impl.normalized_strings = blob.substr(4 + trie_size);
  }
  return model;
}

int SentencePieceModel::PieceToId(absl::string_view piece) const {
  if (auto it = impl_->reserved.find(piece); it != impl_->reserved.end()) return it->second;
  if (auto it = impl_->pieces.find(piece); it != impl_->pieces.end()) return it->second;
  return unk_id_;
}

// normalizer::Normalizer::Normalize.
std::string SentencePieceModel::Normalize(absl::string_view input) const {
  const Impl& impl = *impl_;
  std::string normalized;
  if (input.empty()) return normalized;
  const std::vector<uint32_t> symbols = impl.user_defined.LongestAt(input);
  const size_t input_size = input.size();
  // The longest user-defined symbol at the start of what is left of the input.
  auto symbol_here = [&] { return symbols[input_size - input.size()]; };
  if (remove_extra_whitespaces_) {
    while (!input.empty()) {
      const auto p = impl.NormalizePrefix(input, symbol_here());
      if (p.first != " ") break;
      input.remove_prefix(p.second);
    }
  }
  if (input.empty()) return normalized;
  const absl::string_view space = impl.escape_whitespaces ? kSpaceSymbol : " ";
  normalized.reserve(input.size() * 3);
  if (add_dummy_prefix_) normalized.append(space.data(), space.size());
  bool is_prev_space = remove_extra_whitespaces_;
  while (!input.empty()) {
    const auto p = impl.NormalizePrefix(input, symbol_here());
    absl::string_view sp = p.first;
    while (is_prev_space && absl::ConsumePrefix(&sp, " ")) {
    }
    if (!sp.empty()) {
      for (char c : sp) {
        if (impl.escape_whitespaces && c == ' ') {
          normalized.append(kSpaceSymbol.data(), kSpaceSymbol.size());
        } else {
          normalized.push_back(c);
        }
      }
      is_prev_space = absl::EndsWith(sp, " ");
    }
    input.remove_prefix(p.second);
    if (!remove_extra_whitespaces_) is_prev_space = false;
  }
  if (remove_extra_whitespaces_) {
    while (absl::EndsWith(normalized, space)) normalized.resize(normalized.size() - space.size());
  }
  return normalized;
}

std::vector<int64_t> SentencePieceModel::Encode(absl::string_view text) const {
  const std::string normalized = Normalize(text);
  return PiecesToIds(impl_->model_type == Impl::Type::kBpe ? EncodeBpe(normalized)
                                                           : EncodeUnigram(normalized));
}

SentencePieceModel::Pieces SentencePieceModel::EncodeBpe(absl::string_view all) const {
  const Impl& impl = *impl_;
  Pieces result;
  struct Symbol {
    int prev, next;
    bool freeze;
    absl::string_view piece;
  };
  struct Pair {
    int left, right;
    float score;
    size_t size;
  };
  auto worse = [](const Pair& a, const Pair& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Pair, std::vector<Pair>, decltype(worse)> agenda(worse);
  std::vector<Symbol> symbols;
  absl::flat_hash_map<absl::string_view, std::pair<absl::string_view, absl::string_view>> rev_merge;
  auto maybe_add = [&](int left, int right) {
    if (left == -1 || right == -1 || symbols[left].freeze || symbols[right].freeze) return;
    const absl::string_view piece(symbols[left].piece.data(),
                                  symbols[left].piece.size() + symbols[right].piece.size());
    auto it = impl.pieces.find(piece);
    if (it == impl.pieces.end()) return;
    agenda.push({left, right, impl.scores[it->second], piece.size()});
    if (types_[it->second] == PieceType::kUnused) {
      rev_merge[piece] = {symbols[left].piece, symbols[right].piece};
    }
  };
  const std::vector<uint32_t> user_symbols = impl.user_defined.LongestAt(all);
  absl::string_view rest = all;
  int index = 0;
  while (!rest.empty()) {
    Symbol s;
    const size_t length = impl.PrefixMatch(rest, user_symbols[all.size() - rest.size()], &s.freeze);
    s.piece = rest.substr(0, length);
    s.prev = index == 0 ? -1 : index - 1;
    rest.remove_prefix(length);
    s.next = rest.empty() ? -1 : index + 1;
    ++index;
    symbols.push_back(s);
  }
  for (size_t i = 1; i < symbols.size(); ++i) maybe_add(i - 1, i);
  while (!agenda.empty()) {
    const Pair top = agenda.top();
    agenda.pop();
    Symbol& left = symbols[top.left];
    Symbol& right = symbols[top.right];
    if (left.piece.empty() || right.piece.empty() ||
        left.piece.size() + right.piece.size() != top.size) {
      continue;
    }
    left.piece = absl::string_view(left.piece.data(), left.piece.size() + right.piece.size());
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    right.piece = absl::string_view();
    maybe_add(left.prev, top.left);
    maybe_add(top.left, left.next);
  }
  // Unused pieces are split back into the pair they were merged from (an explicit stack:
  // the split chain of a hostile model can be as long as its longest piece).
  std::vector<absl::string_view> pending;
  auto resegment = [&](absl::string_view piece) {
    pending.push_back(piece);
    while (!pending.empty()) {
      const absl::string_view w = pending.back();
      pending.pop_back();
      const int id = PieceToId(w);
      auto p = rev_merge.find(w);
      if (types_[id] != PieceType::kUnused || p == rev_merge.end()) {
        result.emplace_back(w, id);
        continue;
      }
      pending.push_back(p->second.second);  // popped after the first half
      pending.push_back(p->second.first);
    }
  };
  if (!symbols.empty()) {
    for (int i = 0; i != -1; i = symbols[i].next) resegment(symbols[i].piece);
  }
  return result;
}

SentencePieceModel::Pieces SentencePieceModel::EncodeUnigram(absl::string_view all) const {
  const Impl& impl = *impl_;
  Pieces result;
  struct BestPathNode {
    int id = -1;
    float best_path_score = 0;
    int starts_at = -1;
  };
  const int size = static_cast<int>(all.size());
  const float unk_score = impl.min_score - 10.0f;
  std::vector<BestPathNode> best_path_ends_at(size + 1);
  int starts_at = 0;
  while (starts_at < size) {
    const auto best_path_score_till_here = best_path_ends_at[starts_at].best_path_score;
    bool has_single_node = false;
    const int mblen = std::min<int>(static_cast<int>(OneCharLen(all[starts_at])), size - starts_at);
    impl.piece_trie.ForEachPrefix(all.substr(starts_at), [&](size_t length, int ret) {
      if (types_[ret] == PieceType::kUnused) return;
      auto& target_node = best_path_ends_at[starts_at + length];
      const auto score = types_[ret] == PieceType::kUserDefined ? (length * impl.max_score - 0.1)
                                                                : impl.scores[ret];
      const auto candidate_best_path_score = score + best_path_score_till_here;
      if (target_node.starts_at == -1 || candidate_best_path_score > target_node.best_path_score) {
        target_node.best_path_score = candidate_best_path_score;
        target_node.starts_at = starts_at;
        target_node.id = ret;
      }
      if (!has_single_node && static_cast<int>(length) == mblen) has_single_node = true;
    });
    if (!has_single_node) {
      auto& target_node = best_path_ends_at[starts_at + mblen];
      const auto candidate_best_path_score = unk_score + best_path_score_till_here;
      if (target_node.starts_at == -1 || candidate_best_path_score > target_node.best_path_score) {
        target_node.best_path_score = candidate_best_path_score;
        target_node.starts_at = starts_at;
        target_node.id = unk_id_;
      }
    }
    starts_at += mblen;
  }
  for (int ends_at = size; ends_at > 0;) {
    const BestPathNode& node = best_path_ends_at[ends_at];
    result.emplace_back(all.substr(node.starts_at, ends_at - node.starts_at), node.id);
    ends_at = node.starts_at;
  }
  std::reverse(result.begin(), result.end());
  return result;
}

std::vector<int64_t> SentencePieceModel::PiecesToIds(const Pieces& result) const {
  const Impl& impl = *impl_;
  std::vector<int64_t> ids;
  ids.reserve(result.size());
  bool is_prev_unk = false;
  for (const auto& [w, id] : result) {
    const bool is_unk = types_[id] == PieceType::kUnknown;
    if (types_[id] == PieceType::kControl) {
      ids.push_back(id);
    } else if (is_unk && impl.byte_fallback) {
      for (char b : w) {
        ids.push_back(PieceToId(absl::StrFormat("<0x%02X>", static_cast<unsigned char>(b))));
      }
    } else if (!(is_prev_unk && is_unk)) {
      ids.push_back(id);
    }
    is_prev_unk = is_unk;
  }
  return ids;
}

}  // namespace lgpt
