// SentencePiece tokenizer.model files, read and run natively. Debian's libsentencepiece
// cannot be used in lgpt's binaries: it carries its own protobuf 3.14 runtime, whose
// symbols clash with the protobuf 3.21 that LibTorch loads (a binary holding both aborts at
// start-up with a protobuf version check or crashes). So the ModelProto is parsed from the
// wire format here and the library's algorithms (sentencepiece 0.1.97) are reimplemented:
// normalization with the precompiled character map (nmt_nfkc etc.), user-defined symbols,
// the BPE and unigram encoders, byte fallback and unknown-piece merging. Tests compare every
// step with the library (core/text/tokenizer_spm_reference.h), which only test binaries link.
#ifndef LGPT_CORE_TEXT_SENTENCEPIECE_TOKENIZER_H_
#define LGPT_CORE_TEXT_SENTENCEPIECE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lgpt {

class SentencePieceModel {
 public:
  enum class PieceType { kNormal, kUnknown, kControl, kUserDefined, kUnused, kByte };

  // InvalidArgument naming `source` for bytes that are not a usable model (the checks the
  // library makes when loading); Unimplemented for word/char models, whitespace as suffix
  // and denormalizers.
  static absl::StatusOr<std::unique_ptr<SentencePieceModel>> Parse(std::string serialized,
                                                                   absl::string_view source);
  static absl::StatusOr<std::unique_ptr<SentencePieceModel>> Load(const std::string& path);

  ~SentencePieceModel();
  SentencePieceModel(const SentencePieceModel&) = delete;
  SentencePieceModel& operator=(const SentencePieceModel&) = delete;

  // SentencePieceProcessor::Encode (no BOS/EOS). `text` should be well-formed UTF-8; an
  // ill-formed byte becomes U+FFFD in normalization, as in the library.
  std::vector<int64_t> Encode(absl::string_view text) const;
  // The normalizer's output (spaces escaped as U+2581), for tests.
  std::string Normalize(absl::string_view text) const;

  int size() const { return static_cast<int>(pieces_.size()); }
  const std::string& piece(int id) const { return pieces_[id]; }
  PieceType type(int id) const { return types_[id]; }
  // The library's PieceToId: the piece's id, else the unknown piece's.
  int PieceToId(absl::string_view piece) const;
  // -1 when the model has none (the library's bos_id() / eos_id()).
  int bos_id() const { return bos_id_; }
  int eos_id() const { return eos_id_; }
  int unk_id() const { return unk_id_; }

  // Decoding depends on these normalizer settings.
  bool add_dummy_prefix() const { return add_dummy_prefix_; }
  bool remove_extra_whitespaces() const { return remove_extra_whitespaces_; }
  // What an unknown piece decodes to (TrainerSpec.unk_surface, " \xE2\x81\x87 " by default).
  const std::string& unk_surface() const { return unk_surface_; }

 private:
  struct Impl;
  // (piece, id) pairs as the library's models return them, before byte fallback.
  using Pieces = std::vector<std::pair<absl::string_view, int>>;
  SentencePieceModel();
  // bpe::Model::SampleEncode without dropout, over the normalized text.
  Pieces EncodeBpe(absl::string_view normalized) const;
  // unigram::Model::EncodeOptimized (Viterbi), with the library's float arithmetic.
  Pieces EncodeUnigram(absl::string_view normalized) const;
  // SentencePieceProcessor::PopulateSentencePieceText: byte fallback or merged unknowns.
  std::vector<int64_t> PiecesToIds(const Pieces& pieces) const;

  std::unique_ptr<Impl> impl_;
  std::vector<std::string> pieces_;
  std::vector<PieceType> types_;
  int bos_id_ = -1;
  int eos_id_ = -1;
  int unk_id_ = -1;
  bool add_dummy_prefix_ = true;
  bool remove_extra_whitespaces_ = true;
  std::string unk_surface_ = " \xE2\x81\x87 ";
};

}  // namespace lgpt

#endif  // LGPT_CORE_TEXT_SENTENCEPIECE_TOKENIZER_H_
