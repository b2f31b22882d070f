#include "core/sentencepiece_tokenizer.h"

#include <cstdint>
#include <fstream>
#include <sstream>
#include <unordered_map>

// Must not be mixed with Abseil headers in one translation unit (see the header).
#include <sentencepiece_processor.h>

namespace lgpt {
namespace {

// A minimal protobuf wire-format reader: just enough to find a few scalar and string fields
// of the ModelProto without the generated protobuf classes (which Debian does not ship).
class WireReader {
 public:
  explicit WireReader(std::string_view data) : data_(data) {}

  // Advances to the next field; false at the end or on malformed input (then ok() is false).
  bool Next(uint32_t* field, uint32_t* wire_type) {
    if (pos_ >= data_.size()) return false;
    uint64_t key;
    if (!Varint(&key)) return Fail();
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
  bool Bytes(std::string_view* value) {
    uint64_t length;
    if (!Varint(&length) || length > data_.size() - pos_) return Fail();
    *value = data_.substr(pos_, length);
    pos_ += length;
    return true;
  }
  bool Skip(uint32_t wire_type) {
    uint64_t ignored;
    std::string_view bytes;
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
  std::string_view data_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace

struct SentencePieceModel::Impl {
  sentencepiece::SentencePieceProcessor processor;
  std::unordered_map<std::string, int> ids;
};

SentencePieceModel::SentencePieceModel() : impl_(std::make_unique<Impl>()) {}
SentencePieceModel::~SentencePieceModel() = default;

std::unique_ptr<SentencePieceModel> SentencePieceModel::Load(const std::string& path,
                                                             std::string* error) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    *error = "cannot open " + path;
    return nullptr;
  }
  std::ostringstream bytes;
  bytes << file.rdbuf();
  const std::string serialized = bytes.str();

  std::unique_ptr<SentencePieceModel> model(new SentencePieceModel());
  const sentencepiece::util::Status status =
      model->impl_->processor.LoadFromSerializedProto(serialized);
  if (!status.ok()) {
    *error = path + ": not a SentencePiece model (" + status.ToString() + ")";
    return nullptr;
  }
  const sentencepiece::SentencePieceProcessor& p = model->impl_->processor;
  const int n = p.GetPieceSize();
  model->pieces_.reserve(n);
  model->types_.reserve(n);
  for (int id = 0; id < n; ++id) {
    model->pieces_.push_back(p.IdToPiece(id));
    model->impl_->ids.emplace(model->pieces_.back(), id);
    PieceType type = PieceType::kNormal;
    if (p.IsUnknown(id)) {
      type = PieceType::kUnknown;
    } else if (p.IsControl(id)) {
      type = PieceType::kControl;
    } else if (p.IsByte(id)) {
      type = PieceType::kByte;
    } else if (p.IsUnused(id)) {
      type = PieceType::kUnused;
    }
    model->types_.push_back(type);
  }
  model->bos_id_ = p.bos_id();
  model->eos_id_ = p.eos_id();

  // ModelProto: trainer_spec = 2 (unk_surface = 44), normalizer_spec = 3
  // (add_dummy_prefix = 3, remove_extra_whitespaces = 4), denormalizer_spec = 5
  // (precompiled_charsmap = 2). The library accepted the bytes, so malformed wire data here
  // would be a library/wrapper mismatch; it is reported rather than ignored.
  WireReader top(serialized);
  bool malformed = false;
  uint32_t field, wire_type;
  while (!malformed && top.Next(&field, &wire_type)) {
    if ((field == 2 || field == 3 || field == 5) && wire_type == 2) {
      std::string_view sub;
      if (!top.Bytes(&sub)) break;
      WireReader inner(sub);
      uint32_t f, w;
      while (inner.Next(&f, &w)) {
        uint64_t value;
        std::string_view text;
        if (field == 2 && f == 44 && w == 2) {
          if (!inner.Bytes(&text)) break;
          model->unk_surface_ = std::string(text);
        } else if (field == 3 && (f == 3 || f == 4) && w == 0) {
          if (!inner.Varint(&value)) break;
          (f == 3 ? model->add_dummy_prefix_ : model->remove_extra_whitespaces_) = value != 0;
        } else if (field == 5 && f == 2 && w == 2) {
          if (!inner.Bytes(&text)) break;
          model->has_denormalizer_ = !text.empty();
        } else if (!inner.Skip(w)) {
          break;
        }
      }
      malformed = !inner.ok();
    } else if (!top.Skip(wire_type)) {
      break;
    }
  }
  if (malformed || !top.ok()) {
    *error = path + ": cannot read the normalizer settings of the SentencePiece model";
    return nullptr;
  }
  return model;
}

bool SentencePieceModel::Encode(std::string_view text, std::vector<int>* ids,
                                std::string* error) const {
  const sentencepiece::util::Status status = impl_->processor.Encode(text, ids);
  if (!status.ok()) {
    *error = status.ToString();
    return false;
  }
  return true;
}

bool SentencePieceModel::Decode(const std::vector<int>& ids, std::string* text,
                                std::string* error) const {
  const sentencepiece::util::Status status = impl_->processor.Decode(ids, text);
  if (!status.ok()) {
    *error = status.ToString();
    return false;
  }
  return true;
}

int SentencePieceModel::PieceToId(std::string_view piece) const {
  auto it = impl_->ids.find(std::string(piece));
  return it == impl_->ids.end() ? -1 : it->second;
}

}  // namespace lgpt
