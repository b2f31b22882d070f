// A thin wrapper over Debian's libsentencepiece for tokenizer.model files. Its header
// declares `absl::string_view` as std::string_view, which clashes with Abseil's own
// absl::string_view, so the library is confined to sentencepiece_tokenizer.cc and this
// interface uses only standard types (errors are returned as strings).
#ifndef LGPT_CORE_SENTENCEPIECE_TOKENIZER_H_
#define LGPT_CORE_SENTENCEPIECE_TOKENIZER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace lgpt {

class SentencePieceModel {
 public:
  enum class PieceType { kNormal, kUnknown, kControl, kUserDefined, kUnused, kByte };

  // nullptr with `*error` set when the file cannot be read or is not a model.
  static std::unique_ptr<SentencePieceModel> Load(const std::string& path, std::string* error);

  ~SentencePieceModel();
  SentencePieceModel(const SentencePieceModel&) = delete;
  SentencePieceModel& operator=(const SentencePieceModel&) = delete;

  // The library's Encode (no BOS/EOS). `text` must be well-formed UTF-8.
  bool Encode(std::string_view text, std::vector<int>* ids, std::string* error) const;
  // The library's DecodeIds, the reference lgpt's own incremental decoding is tested against.
  bool Decode(const std::vector<int>& ids, std::string* text, std::string* error) const;

  int size() const { return static_cast<int>(pieces_.size()); }
  const std::string& piece(int id) const { return pieces_[id]; }
  PieceType type(int id) const { return types_[id]; }
  // -1 when absent.
  int PieceToId(std::string_view piece) const;
  int bos_id() const { return bos_id_; }
  int eos_id() const { return eos_id_; }

  // Normalizer settings that decoding depends on (from the serialized model proto).
  bool add_dummy_prefix() const { return add_dummy_prefix_; }
  bool remove_extra_whitespaces() const { return remove_extra_whitespaces_; }
  bool has_denormalizer() const { return has_denormalizer_; }
  // What an unknown piece decodes to (TrainerSpec.unk_surface, " \xE2\x81\x87 " by default).
  const std::string& unk_surface() const { return unk_surface_; }

 private:
  struct Impl;
  SentencePieceModel();

  std::unique_ptr<Impl> impl_;
  std::vector<std::string> pieces_;
  std::vector<PieceType> types_;
  int bos_id_ = -1;
  int eos_id_ = -1;
  bool add_dummy_prefix_ = true;
  bool remove_extra_whitespaces_ = true;
  bool has_denormalizer_ = false;
  std::string unk_surface_ = " \xE2\x81\x87 ";
};

}  // namespace lgpt

#endif  // LGPT_CORE_SENTENCEPIECE_TOKENIZER_H_
