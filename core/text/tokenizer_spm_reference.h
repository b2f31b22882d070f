// Debian's libsentencepiece behind a standard-types interface, as the reference lgpt's
// native SentencePiece (core/text/sentencepiece_tokenizer.h) is tested against. Test-only: the
// library's bundled protobuf cannot share a process with LibTorch's, and its header
// redefines absl::string_view, so nothing but tests links it and this header has no Abseil.
#ifndef LGPT_CORE_TEXT_TOKENIZER_SPM_REFERENCE_H_
#define LGPT_CORE_TEXT_TOKENIZER_SPM_REFERENCE_H_

#include <memory>
#include <string>
#include <vector>

namespace lgpt {

class SentencePieceReference {
 public:
  // nullptr with `*error` set when the library cannot load the file.
  static std::unique_ptr<SentencePieceReference> Load(const std::string& path, std::string* error);
  ~SentencePieceReference();

  // SentencePieceProcessor::Encode and Decode (DecodeIds).
  bool Encode(const std::string& text, std::vector<int>* ids, std::string* error) const;
  bool Decode(const std::vector<int>& ids, std::string* text, std::string* error) const;
  int bos_id() const;
  int eos_id() const;
  int size() const;

 private:
  struct Impl;
  SentencePieceReference();
  std::unique_ptr<Impl> impl_;
};

}  // namespace lgpt

#endif  // LGPT_CORE_TEXT_TOKENIZER_SPM_REFERENCE_H_
