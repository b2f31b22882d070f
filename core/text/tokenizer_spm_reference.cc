#include "core/text/tokenizer_spm_reference.h"

// Must not be mixed with Abseil headers in one translation unit (see the header).
#include <sentencepiece_processor.h>

namespace lgpt {

struct SentencePieceReference::Impl {
  sentencepiece::SentencePieceProcessor processor;
};

SentencePieceReference::SentencePieceReference() : impl_(std::make_unique<Impl>()) {}
SentencePieceReference::~SentencePieceReference() = default;

std::unique_ptr<SentencePieceReference> SentencePieceReference::Load(const std::string& path,
                                                                     std::string* error) {
  std::unique_ptr<SentencePieceReference> reference(new SentencePieceReference());
  const auto status = reference->impl_->processor.Load(path);
  if (!status.ok()) {
    *error = status.ToString();
    return nullptr;
  }
  return reference;
}

bool SentencePieceReference::Encode(const std::string& text, std::vector<int>* ids,
                                    std::string* error) const {
  const auto status = impl_->processor.Encode(text, ids);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

bool SentencePieceReference::Decode(const std::vector<int>& ids, std::string* text,
                                    std::string* error) const {
  const auto status = impl_->processor.Decode(ids, text);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

int SentencePieceReference::bos_id() const { return impl_->processor.bos_id(); }
int SentencePieceReference::eos_id() const { return impl_->processor.eos_id(); }
int SentencePieceReference::size() const { return impl_->processor.GetPieceSize(); }

}  // namespace lgpt
