// The interface between the public Tokenizer (core/text/tokenizer.h), which applies LitGPT's rules
// for BOS/EOS, and the two tokenizer implementations: Hugging Face tokenizer.json
// (core/text/tokenizer_hf.h) and SentencePiece tokenizer.model
// (core/text/sentencepiece_tokenizer.h).
#ifndef LGPT_CORE_TEXT_TOKENIZER_BACKEND_H_
#define LGPT_CORE_TEXT_TOKENIZER_BACKEND_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lgpt {

// Turns ids into text one id at a time. Push() appends the text that no later id can change
// any more; Finish() appends the rest. Every appended chunk is well-formed UTF-8 that ends on
// a character boundary, and all chunks together are exactly the text of decoding all the ids
// at once: a backend's batch decode is implemented as Push()es and a Finish().
class IncrementalDecoder {
 public:
  virtual ~IncrementalDecoder() = default;
  // InvalidArgument for an id that has no token; nothing is appended then.
  virtual absl::Status Push(int64_t id, std::string* out) = 0;
  virtual void Finish(std::string* out) = 0;
};

class TokenizerBackend {
 public:
  virtual ~TokenizerBackend() = default;

  // What the underlying library's plain encode returns (Hugging Face: with the
  // post-processor's special tokens; SentencePiece: without BOS/EOS). `text` is well-formed
  // UTF-8 (the caller checks).
  virtual absl::StatusOr<std::vector<int64_t>> Encode(absl::string_view text) const = 0;

  // Vocabulary size as LitGPT reports it (Hugging Face: without added tokens).
  virtual int64_t vocab_size() const = 0;

  // One more than the largest id Encode or TokenToId can return (added tokens included).
  virtual int64_t id_limit() const = 0;

  // The id of a token string (Hugging Face: added tokens first, then the model's vocabulary;
  // SentencePiece: the piece), or nullopt.
  virtual std::optional<int64_t> TokenToId(absl::string_view token) const = 0;

  virtual std::unique_ptr<IncrementalDecoder> NewDecoder() const = 0;

  // The exact bytes token `id` adds to the text when it follows other text (a leading space
  // that the first token of a decode loses is kept): a byte-fallback token is its one byte, a
  // byte-level token the bytes its characters stand for. nullopt for special and control
  // tokens, which decode to nothing, and for ids without a token.
  virtual std::optional<std::string> TokenBytes(int64_t id) const = 0;

  // "huggingface" or "sentencepiece", as LitGPT's Tokenizer.backend.
  virtual absl::string_view name() const = 0;
};

}  // namespace lgpt

#endif  // LGPT_CORE_TEXT_TOKENIZER_BACKEND_H_
