#include "core/text/tokenizer.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "core/base/file_util.h"
#include "core/base/status_macros.h"
#include "core/text/sentencepiece_tokenizer.h"
#include "core/text/tokenizer_backend.h"
#include "core/text/tokenizer_hf.h"
#include "core/text/tokenizer_unicode.h"

namespace lgpt {
namespace {

using json = nlohmann::json;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return text.str();
}

absl::StatusOr<json> ReadJsonObject(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  if (!value.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  return value;
}

bool IsPythonSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' ||
         (c >= '\x1c' && c <= '\x1f');
}

// LitGPT's fix_and_load_json, for generation_config.json files with JSON errors (some
// Llama 3.2 ones): re.sub(r",(\s*[}\]])", r"\1", s), then
// re.sub(r'(?<=[}\]0-9truefalsenull"])\s*(\n\s*)"', r',\1"', s).
std::string FixJson(absl::string_view s) {
  std::string a;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == ',') {
      size_t j = i + 1;
      while (j < s.size() && IsPythonSpace(s[j])) ++j;
      if (j < s.size() && (s[j] == '}' || s[j] == ']')) continue;  // drop the comma
    }
    a.push_back(s[i]);
  }
  constexpr absl::string_view kBefore = "}]0123456789truefalsn\"";
  std::string b;
  size_t i = 0;
  while (i < a.size()) {
    if (i > 0 && kBefore.find(a[i - 1]) != absl::string_view::npos) {
      size_t q = i;
      while (q < a.size() && IsPythonSpace(a[q])) ++q;
      const size_t newline = a.rfind('\n', q == 0 ? 0 : q - 1);
      if (q < a.size() && a[q] == '"' && newline != std::string::npos && newline >= i && q > i) {
        b += ',';
        b.append(a, newline, q - newline);
        b += '"';
        i = q + 1;
        continue;
      }
    }
    b.push_back(a[i]);
    ++i;
  }
  return b;
}

// Path(dir).name and Path(dir).stem as Python's pathlib computes them.
std::string PathName(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const size_t slash = dir.rfind('/');
  std::string name = slash == std::string::npos ? dir : dir.substr(slash + 1);
  return name == "." ? "" : name;
}

std::string PathStem(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot != std::string::npos && dot > 0 && dot + 1 < name.size()) return name.substr(0, dot);
  return name;
}

bool Truthy(const json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer()) return v.get<int64_t>() != 0;
  if (v.is_number()) return v.get<double>() != 0.0;
  if (v.is_string()) return !v.get<std::string>().empty();
  return !v.empty();
}

// A bos_token / eos_token entry: a string, {"content": ...}, or null.
absl::StatusOr<std::optional<std::string>> TokenContent(const json& config, const char* key,
                                                        const std::string& path) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_object()) {
    auto content = it->find("content");
    if (content == it->end() || content->is_null()) return std::optional<std::string>();
    if (content->is_string()) return std::optional<std::string>(content->get<std::string>());
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": '", key, "' is neither a string nor {\"content\": string}"));
}

// bos_token_id / eos_token_id: an integer, null, or a list of integers (the first is used).
absl::StatusOr<std::optional<int64_t>> TokenIdEntry(const json& config, const char* key,
                                                    const std::string& path) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::optional<int64_t>();
  const json* id = it->is_array() && !it->empty() ? &(*it)[0] : &*it;
  if (!id->is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": '", key, "' is neither an integer nor a list of integers"));
  }
  // Unsigned JSON integers beyond int64 would wrap to negative ids.
  if (id->is_number_unsigned() && id->get<uint64_t>() > uint64_t{INT64_MAX}) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": '", key, "' ", id->dump(), " is not a token id"));
  }
  const int64_t value = id->get<int64_t>();
  if (value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": '", key, "' ", value, " is not a token id (ids are >= 0)"));
  }
  return std::optional<int64_t>(value);
}

// ---------------------------------------------------------------------------------------------
// SentencePiece backend.

// SentencePieceProcessor::Decode, one id at a time (sentencepiece 0.1.97's rules): control
// pieces vanish, unknown ones become the unk surface, byte pieces are assembled into
// characters (ill-formed bytes become U+FFFD one byte at a time), and the first piece's
// leading "▁" is dropped when the model adds a dummy prefix or removes extra whitespace.
class SentencePieceDecoder : public IncrementalDecoder {
 public:
  explicit SentencePieceDecoder(const SentencePieceModel& model) : m_(model) {}

  absl::Status Push(int64_t id, std::string* out) override {
    if (id < 0 || id >= m_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is out of range [0, ", m_.size(), ")"));
    }
    const int i = static_cast<int>(id);
    const SentencePieceModel::PieceType type = m_.type(i);
    if (type == SentencePieceModel::PieceType::kByte) {
      bytes_.push_back(static_cast<char>(ByteOf(m_.piece(i))));
      DrainBytes(/*at_end=*/false, out);
      return absl::OkStatus();
    }
    DrainBytes(/*at_end=*/true, out);
    if (bos_ws_seen_ || produced_) is_bos_ws_ = false;
    bool has_bos_ws = false;
    std::string text;
    if (type == SentencePieceModel::PieceType::kControl) {
      // invisible
    } else if (type == SentencePieceModel::PieceType::kUnknown) {
      text = m_.unk_surface();
    } else {
      absl::string_view piece = m_.piece(i);
      if (is_bos_ws_ && (m_.add_dummy_prefix() || m_.remove_extra_whitespaces())) {
        has_bos_ws = absl::ConsumePrefix(&piece, "\xE2\x96\x81");
        if (m_.remove_extra_whitespaces()) has_bos_ws = false;
      }
      text = absl::StrReplaceAll(piece, {{"\xE2\x96\x81", " "}});
    }
    bos_ws_seen_ = has_bos_ws;
    Emit(text, out);
    return absl::OkStatus();
  }

  void Finish(std::string* out) override { DrainBytes(/*at_end=*/true, out); }

 private:
  static int ByteOf(const std::string& piece) {  // "<0xAB>"
    return static_cast<int>(std::stoul(piece.substr(3, 2), nullptr, 16));
  }

  void Emit(absl::string_view text, std::string* out) {
    if (text.empty()) return;
    produced_ = true;
    out->append(text.data(), text.size());
  }

  // sentencepiece's string_util::DecodeUTF8 over the pending bytes; a character whose bytes
  // have not all arrived waits unless the run of byte pieces has ended.
  void DrainBytes(bool at_end, std::string* out) {
    const auto* p = reinterpret_cast<const unsigned char*>(bytes_.data());
    const size_t n = bytes_.size();
    size_t pos = 0;
    while (pos < n) {
      const unsigned char b0 = p[pos];
      size_t need;
      char32_t min;
      if (b0 < 0x80) {
        need = 1;
        min = 0;
      } else if ((b0 & 0xE0) == 0xC0) {
        need = 2;
        min = 0x80;
      } else if ((b0 & 0xF0) == 0xE0) {
        need = 3;
        min = 0x800;
      } else if ((b0 & 0xF8) == 0xF0) {
        need = 4;
        min = 0x10000;
      } else {
        need = 0;  // not a lead byte
        min = 0;
      }
      bool valid = false;
      if (need == 1) {
        valid = true;
      } else if (need > 1) {
        if (n - pos < need && !at_end) break;
        if (n - pos >= need) {
          char32_t cp = b0 & (need == 2 ? 0x1F : need == 3 ? 0x0F : 0x07);
          valid = true;
          for (size_t k = 1; k < need; ++k) {
            valid = valid && (p[pos + k] & 0xC0) == 0x80;
            cp = (cp << 6) | (p[pos + k] & 0x3F);
          }
          valid = valid && cp >= min && (cp < 0xD800 || (cp >= 0xE000 && cp <= 0x10FFFF));
        }
      }
      if (valid) {
        Emit(absl::string_view(bytes_).substr(pos, need), out);
        pos += need;
      } else {
        Emit("\xEF\xBF\xBD", out);
        pos += 1;
      }
    }
    bytes_.erase(0, pos);
  }

  const SentencePieceModel& m_;
  std::string bytes_;
  bool is_bos_ws_ = true;
  bool bos_ws_seen_ = false;
  bool produced_ = false;
};

class SentencePieceBackend : public TokenizerBackend {
 public:
  explicit SentencePieceBackend(std::unique_ptr<SentencePieceModel> model)
      : model_(std::move(model)) {}

  absl::StatusOr<std::vector<int64_t>> Encode(absl::string_view text) const override {
    return model_->Encode(text);
  }
  int64_t vocab_size() const override { return model_->size(); }
  int64_t id_limit() const override { return model_->size(); }
  // SentencePieceProcessor::PieceToId answers the unknown piece's id for unknown pieces.
  std::optional<int64_t> TokenToId(absl::string_view token) const override {
    return model_->PieceToId(token);
  }
  std::unique_ptr<IncrementalDecoder> NewDecoder() const override {
    return std::make_unique<SentencePieceDecoder>(*model_);
  }
  // SentencePieceDecoder's rules for a piece that is not the first.
  std::optional<std::string> TokenBytes(int64_t id) const override {
    if (id < 0 || id >= model_->size()) return std::nullopt;
    const int i = static_cast<int>(id);
    switch (model_->type(i)) {
      case SentencePieceModel::PieceType::kControl:
        return std::nullopt;
      case SentencePieceModel::PieceType::kByte:  // "<0xAB>"
        return std::string(
            1, static_cast<char>(std::stoul(model_->piece(i).substr(3, 2), nullptr, 16)));
      case SentencePieceModel::PieceType::kUnknown:
        return model_->unk_surface();
      default:
        return absl::StrReplaceAll(model_->piece(i), {{"\xE2\x96\x81", " "}});
    }
  }
  absl::string_view name() const override { return "sentencepiece"; }

 private:
  std::unique_ptr<SentencePieceModel> model_;
};

// LitGPT's check_if_bos_token_used.
absl::StatusOr<bool> CheckIfBosTokenUsed(const std::string& dir, const std::string& name,
                                         const std::string& stem) {
  const std::string path = dir + "/tokenizer_config.json";
  if (!IsFile(path)) return false;
  ASSIGN_OR_RETURN(const json config, ReadJsonObject(path));
  // Llama 3's tokenizer_config.json has neither add_bos_token nor a telling tokenizer_class.
  if (absl::StartsWith(stem, "Meta-Llama-3") || absl::StartsWith(stem, "Llama-3")) return true;
  if (absl::StartsWith(stem, "SmolLM2") && absl::EndsWith(name, "Instruct")) return true;
  if (auto it = config.find("add_bos_token"); it != config.end()) return Truthy(*it);
  auto it = config.find("tokenizer_class");
  return it != config.end() && it->is_string() && it->get<std::string>() == "LlamaTokenizer";
}

}  // namespace

// ---------------------------------------------------------------------------------------------

Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& checkpoint_dir) {
  struct stat st;
  if (::stat(checkpoint_dir.c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat("the checkpoint directory does not exist: ", checkpoint_dir));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the checkpoint directory is not a directory: ", checkpoint_dir));
  }
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  const std::string name = PathName(checkpoint_dir);
  t->model_name_ = PathStem(name);
  ASSIGN_OR_RETURN(t->use_bos_, CheckIfBosTokenUsed(checkpoint_dir, name, t->model_name_));

  const std::string json_path = checkpoint_dir + "/tokenizer.json";
  const std::string model_path = checkpoint_dir + "/tokenizer.model";
  const std::string config_path = checkpoint_dir + "/tokenizer_config.json";
  const std::string generation_path = checkpoint_dir + "/generation_config.json";
  // Some checkpoints have both files; tokenizer.json takes precedence.
  if (IsFile(json_path)) {
    ASSIGN_OR_RETURN(t->backend_, LoadHfTokenizer(json_path));
    t->file_ = json_path;
    if (IsFile(config_path)) {
      ASSIGN_OR_RETURN(const json config, ReadJsonObject(config_path));
      for (const char* key : {"bos_token", "eos_token"}) {
        ASSIGN_OR_RETURN(std::optional<std::string> content,
                         TokenContent(config, key, config_path));
        if (!content) continue;
        std::optional<int64_t> id = t->backend_->TokenToId(*content);
        if (!id) {
          return absl::InvalidArgumentError(absl::StrCat(config_path, ": ", key, " '", *content,
                                                         "' is not a token of ", json_path));
        }
        (std::string(key) == "bos_token" ? t->bos_id_ : t->eos_id_) = *id;
      }
    }
    if (IsFile(generation_path)) {
      ASSIGN_OR_RETURN(const std::string text, ReadFile(generation_path));
      json config = json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (config.is_discarded()) {
        // Some files (Llama 3.2's) have trailing or missing commas; LitGPT repairs them.
        config = json::parse(FixJson(text), nullptr, /*allow_exceptions=*/false);
      }
      if (config.is_discarded() || !config.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(generation_path, ": not valid JSON, even after fixing commas"));
      }
      ASSIGN_OR_RETURN(std::optional<int64_t> bos,
                       TokenIdEntry(config, "bos_token_id", generation_path));
      ASSIGN_OR_RETURN(std::optional<int64_t> eos,
                       TokenIdEntry(config, "eos_token_id", generation_path));
      if (!t->bos_id_) t->bos_id_ = bos;
      if (!t->eos_id_) t->eos_id_ = eos;
    }
  } else if (IsFile(model_path)) {
    ASSIGN_OR_RETURN(std::unique_ptr<SentencePieceModel> model,
                     SentencePieceModel::Load(model_path));
    if (model->bos_id() >= 0) t->bos_id_ = model->bos_id();
    if (model->eos_id() >= 0) t->eos_id_ = model->eos_id();
    t->backend_ = std::make_unique<SentencePieceBackend>(std::move(model));
    t->file_ = model_path;
  } else {
    return absl::NotFoundError(absl::StrCat(
        "no tokenizer.json or tokenizer.model in the checkpoint directory ", checkpoint_dir));
  }

  // LitGPT's workaround for Llama tokenizers, which strip the leading space when decoding a
  // single token (huggingface/transformers#31643): decode behind a dummy token, drop its text.
  if (IsFile(config_path)) {
    ASSIGN_OR_RETURN(const json config, ReadJsonObject(config_path));
    auto it = config.find("tokenizer_class");
    if (it != config.end() && it->is_string() &&
        absl::StrContains(it->get<std::string>(), "LlamaTokenizer")) {
      int64_t dummy = 33;  // \x1e
      absl::StatusOr<std::string> text = t->RawDecode({dummy});
      if (!text.ok() || *text != "\x1e") {
        dummy = 165;  // \x1e in salamandra tokenizers
        text = t->RawDecode({dummy});
      }
      if (text.ok()) {
        t->dummy_id_ = dummy;
        t->dummy_chars_ = CountCodePoints(*text);
      }
    }
  }
  return t;
}

absl::StatusOr<std::vector<int64_t>> Tokenizer::Encode(absl::string_view text,
                                                       std::optional<bool> bos, bool eos) const {
  RETURN_IF_ERROR(CheckUtf8(text, "the text to encode"));
  ASSIGN_OR_RETURN(std::vector<int64_t> tokens, backend_->Encode(text));
  if (bos.value_or(use_bos_)) {
    if (!bos_id_) {
      return absl::FailedPreconditionError("this tokenizer does not have a defined bos token");
    }
    if (tokens.empty() || tokens.front() != *bos_id_) tokens.insert(tokens.begin(), *bos_id_);
  } else if (bos_id_ && !tokens.empty() && tokens.front() == *bos_id_) {
    tokens.erase(tokens.begin());
  }
  if (eos) {
    if (!eos_id_) {
      return absl::FailedPreconditionError("this tokenizer does not have a defined eos token");
    }
    if (tokens.empty() || tokens.back() != *eos_id_) tokens.push_back(*eos_id_);
  } else if (eos_id_ && !tokens.empty() && tokens.back() == *eos_id_) {
    tokens.pop_back();
  }
  return tokens;
}

absl::StatusOr<std::string> Tokenizer::RawDecode(absl::Span<const int64_t> ids) const {
  std::unique_ptr<IncrementalDecoder> decoder = backend_->NewDecoder();
  std::string text;
  for (int64_t id : ids) RETURN_IF_ERROR(decoder->Push(id, &text));
  decoder->Finish(&text);
  return text;
}

std::optional<std::string> Tokenizer::TokenBytes(int64_t id) const {
  return backend_->TokenBytes(id);
}

std::vector<std::string> Tokenizer::VocabularyBytes() const {
  std::vector<std::string> bytes(backend_->id_limit());
  for (int64_t id = 0; id < static_cast<int64_t>(bytes.size()); ++id) {
    bytes[id] = backend_->TokenBytes(id).value_or("");
  }
  return bytes;
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int64_t> ids) const {
  if (ids.size() == 1 && dummy_id_) {
    ASSIGN_OR_RETURN(std::string text, RawDecode({*dummy_id_, ids[0]}));
    // Python's text[len(dummy):] counts code points.
    size_t pos = 0;
    for (size_t k = 0; k < dummy_chars_ && pos < text.size(); ++k) {
      char32_t c;
      if (!NextCodePoint(text, &pos, &c)) ++pos;
    }
    return text.substr(pos);
  }
  return RawDecode(ids);
}

absl::StatusOr<int64_t> Tokenizer::TokenToId(absl::string_view token) const {
  std::optional<int64_t> id = backend_->TokenToId(token);
  if (!id) {
    return absl::NotFoundError(absl::StrCat("token '", token, "' not found in the collection"));
  }
  return *id;
}

int64_t Tokenizer::vocab_size() const { return backend_->vocab_size(); }

absl::Status Tokenizer::CheckFitsVocabulary(int64_t model_vocabulary) const {
  int64_t limit = backend_->id_limit();
  for (const std::optional<int64_t>& special : {bos_id_, eos_id_}) {
    if (special) limit = std::max(limit, *special + 1);
  }
  if (limit <= model_vocabulary) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      file_, " produces token ids up to ", limit - 1, " but the model's vocabulary has ",
      model_vocabulary, " ids (padded_vocab_size): the tokenizer belongs to another model"));
}

absl::string_view Tokenizer::backend() const { return backend_->name(); }

// ---------------------------------------------------------------------------------------------

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer)
    : tokenizer_(tokenizer), decoder_(tokenizer.backend_->NewDecoder()) {}

StreamingDecoder::~StreamingDecoder() = default;

absl::StatusOr<std::string> StreamingDecoder::Prime(absl::Span<const int64_t> context) {
  std::string ignored;
  std::unique_ptr<IncrementalDecoder> probe = tokenizer_.backend_->NewDecoder();
  for (int64_t id : context) RETURN_IF_ERROR(probe->Push(id, &ignored));
  decoder_ = tokenizer_.backend_->NewDecoder();
  held_.reset();
  count_ = 0;
  std::string out;
  for (int64_t id : context) RETURN_IF_ERROR(decoder_->Push(id, &out));
  count_ = context.size();
  return out;
}

absl::StatusOr<std::string> StreamingDecoder::Push(int64_t id) {
  std::string out;
  if (tokenizer_.dummy_id_ && count_ == 0) {
    // Whether this token is decoded alone (with the fix) or as the first of many is not
    // known yet. Check the id now, decide at the next Push or at Flush.
    std::string ignored;
    RETURN_IF_ERROR(tokenizer_.backend_->NewDecoder()->Push(id, &ignored));
    held_ = id;
    count_ = 1;
    return out;
  }
  if (held_) {
    std::unique_ptr<IncrementalDecoder> probe = tokenizer_.backend_->NewDecoder();
    std::string ignored;
    RETURN_IF_ERROR(probe->Push(id, &ignored));
    RETURN_IF_ERROR(decoder_->Push(*held_, &out));
    held_.reset();
  }
  RETURN_IF_ERROR(decoder_->Push(id, &out));
  ++count_;
  return out;
}

std::string StreamingDecoder::Flush() {
  std::string out;
  if (held_) {
    absl::StatusOr<std::string> text = tokenizer_.Decode({*held_});
    if (text.ok()) out = *std::move(text);  // the id was checked when it was pushed
  } else {
    decoder_->Finish(&out);
  }
  decoder_ = tokenizer_.backend_->NewDecoder();
  held_.reset();
  count_ = 0;
  return out;
}

}  // namespace lgpt
