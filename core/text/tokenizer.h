// Tokenizers of LitGPT checkpoint directories, loaded and configured as LitGPT's
// litgpt/tokenizer.py does it:
//   - tokenizer.json (Hugging Face, reimplemented in core/text/tokenizer_hf.h) takes precedence
//     over tokenizer.model (SentencePiece, through Debian's libsentencepiece);
//   - BOS/EOS ids come from tokenizer_config.json's bos_token/eos_token, else from
//     generation_config.json's bos_token_id/eos_token_id (Hugging Face), or from the
//     SentencePiece model;
//   - whether BOS is added by default (use_bos) comes from tokenizer_config.json
//     (add_bos_token, or tokenizer_class == "LlamaTokenizer") and the directory name
//     (Meta-Llama-3*, Llama-3*, SmolLM2*Instruct);
//   - decoding a single token keeps its leading space for LlamaTokenizer checkpoints.
// All failures are absl::Status errors that name the file and the problem.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::Load(dir));
//   ASSIGN_OR_RETURN(std::vector<int64_t> ids, tokenizer->Encode("Hello"));  // BOS per use_bos
//   ASSIGN_OR_RETURN(std::string text, tokenizer->Decode(ids));
//
// For generation, StreamingDecoder turns ids into text as they arrive.
#ifndef LGPT_CORE_TEXT_TOKENIZER_H_
#define LGPT_CORE_TEXT_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace lgpt {

class IncrementalDecoder;
class TokenizerBackend;

class Tokenizer {
 public:
  // NotFound for a missing directory or when it has neither tokenizer.json nor
  // tokenizer.model; InvalidArgument for malformed files (naming them); Unimplemented for
  // tokenizer.json components lgpt does not implement (naming them).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& checkpoint_dir);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // LitGPT's Tokenizer.encode: BOS is prepended when `bos` is true, or when it is unset and
  // use_bos() is; otherwise a BOS the tokenizer itself put first is removed. With `eos` the
  // result ends in one EOS; without, an EOS the tokenizer put last is removed. (LitGPT drops
  // an existing trailing EOS even when eos=True; lgpt keeps it.) InvalidArgument for text
  // that is not well-formed UTF-8; FailedPrecondition when BOS/EOS is asked for but the
  // tokenizer has none.
  absl::StatusOr<std::vector<int64_t>> Encode(absl::string_view text,
                                              std::optional<bool> bos = std::nullopt,
                                              bool eos = false) const;

  // LitGPT's Tokenizer.decode (special tokens are skipped, as Hugging Face's decode does by
  // default). InvalidArgument for an id that has no token.
  absl::StatusOr<std::string> Decode(absl::Span<const int64_t> ids) const;

  // The exact bytes token `id` adds to the text when it is generated after other text (the
  // leading space a first token loses in Decode is kept; a byte-fallback token such as <0xE2>
  // is that one byte): what constrained decoding matches against a grammar. nullopt for
  // special and control tokens (BOS, EOS, ...) and ids without a token.
  std::optional<std::string> TokenBytes(int64_t id) const;
  // TokenBytes of every id the tokenizer can produce (0 to the largest, added tokens
  // included), an empty string for those without bytes: core/constrain's TokenVocabulary.
  std::vector<std::string> VocabularyBytes() const;

  // The id of a token string (Hugging Face: added tokens, then the vocabulary; SentencePiece:
  // the piece, or the unknown piece's id as the library answers). NotFound otherwise.
  absl::StatusOr<int64_t> TokenToId(absl::string_view token) const;

  std::optional<int64_t> bos_id() const { return bos_id_; }
  std::optional<int64_t> eos_id() const { return eos_id_; }
  bool use_bos() const { return use_bos_; }
  // Hugging Face: without added tokens (get_vocab_size(with_added_tokens=False)).
  int64_t vocab_size() const;
  // FailedPrecondition, naming the tokenizer's file, when it can produce an id the model has
  // no row for (ids >= model_vocabulary): a tokenizer from another model.
  absl::Status CheckFitsVocabulary(int64_t model_vocabulary) const;
  // "huggingface" or "sentencepiece".
  absl::string_view backend() const;
  // The checkpoint directory's stem, as Path(checkpoint_dir).stem.
  const std::string& model_name() const { return model_name_; }
  // Whether single-token decodes keep the leading space (tokenizer_class LlamaTokenizer*).
  bool apply_decoding_fix() const { return dummy_id_.has_value(); }

 private:
  friend class StreamingDecoder;
  Tokenizer() = default;

  // Decodes without the single-token fix.
  absl::StatusOr<std::string> RawDecode(absl::Span<const int64_t> ids) const;

  std::unique_ptr<TokenizerBackend> backend_;
  std::string model_name_;
  std::string file_;  // tokenizer.json or tokenizer.model, with its directory
  bool use_bos_ = false;
  std::optional<int64_t> bos_id_, eos_id_;
  std::optional<int64_t> dummy_id_;  // the decoding fix's dummy token, when it applies
  size_t dummy_chars_ = 0;           // code points the dummy token decodes to
};

// Decodes a stream of ids chunk by chunk: Push() returns the text that the ids so far
// determine for good, never part of a UTF-8 character (byte-fallback tokens such as <0xE2>
// are held until their character is complete), and Flush() returns the rest and starts a new
// stream. The chunks of a stream concatenate to exactly Tokenizer::Decode of all its ids.
// (With the single-token decoding fix, the first id is held until a second one arrives,
// because the fix changes how a lone token decodes.) The tokenizer must outlive it.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer);
  ~StreamingDecoder();

  // Starts the stream after `context` (say, the prompt) without returning all of its text,
  // so that the chunks that follow continue it exactly (a Llama continuation keeps its
  // leading space). Returns the part of the context's text that is final; that part and the
  // chunks concatenate to Decode(context + pushed ids) whenever there are two ids or more.
  // Replaces any stream in progress. InvalidArgument for an id that has no token.
  absl::StatusOr<std::string> Prime(absl::Span<const int64_t> context);

  // InvalidArgument for an id that has no token; the stream is unchanged then.
  absl::StatusOr<std::string> Push(int64_t id);
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  std::unique_ptr<IncrementalDecoder> decoder_;
  size_t count_ = 0;
  std::optional<int64_t> held_;
};

}  // namespace lgpt

#endif  // LGPT_CORE_TEXT_TOKENIZER_H_
