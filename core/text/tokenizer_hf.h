// Hugging Face tokenizer.json, reimplemented (no Rust `tokenizers` library): added tokens,
// normalizers, pre-tokenizers, the BPE model (byte-level like GPT-2, Llama 3 and Qwen, or
// SentencePiece-style with byte fallback like Llama 2, Mistral and Gemma), post-processors
// and decoders, each following the `tokenizers` crate's semantics. What is supported:
//   normalizer:    null, Sequence, Prepend, Replace (string pattern), NFC, Strip, ByteLevel
//   pre_tokenizer: null, Sequence, ByteLevel, Split (the GPT-2, Llama 3 and Qwen2 regexes,
//                  Falcon's [0-9][0-9][0-9], or a String pattern), Digits, Punctuation,
//                  Metaspace
//   model:         BPE (vocab + merges, unk_token, byte_fallback, fuse_unk, ignore_merges)
//   post_processor: null, Sequence, ByteLevel, TemplateProcessing, BertProcessing,
//                  RobertaProcessing; truncation and padding of a single sequence
//   decoder:       null, ByteLevel, or Sequence of Replace, ByteFallback, Metaspace, Strip,
//                  Fuse (then Strip)
// Anything else is an Unimplemented error that names it, at load time.
#ifndef LGPT_CORE_TEXT_TOKENIZER_HF_H_
#define LGPT_CORE_TEXT_TOKENIZER_HF_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/text/tokenizer_backend.h"

namespace lgpt {

// Parses tokenizer.json text; `source` names it in errors.
absl::StatusOr<std::unique_ptr<TokenizerBackend>> ParseHfTokenizer(absl::string_view json_text,
                                                                   absl::string_view source);

// Reads and parses a tokenizer.json file.
absl::StatusOr<std::unique_ptr<TokenizerBackend>> LoadHfTokenizer(const std::string& path);

}  // namespace lgpt

#endif  // LGPT_CORE_TEXT_TOKENIZER_HF_H_
