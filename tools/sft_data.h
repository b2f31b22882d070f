// Supervised fine-tuning data as LitGPT's SFTDataset builds it: Alpaca-style records
// ({instruction, input, output}) become prompt = style.Apply(instruction, input) and
// response = output + EOS; the loss sees the response tokens only (prompt and padding
// labels are kIgnoreIndex).
#ifndef LGPT_TOOLS_SFT_DATA_H_
#define LGPT_TOOLS_SFT_DATA_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/text/prompt_style.h"
#include "core/text/tokenizer.h"

namespace lgpt {

constexpr int64_t kIgnoreIndex = -100;  // LitGPT's ignore_index

struct InstructionRecord {
  std::string instruction;
  std::string input;  // optional in the file
  std::string output;
};

// A JSON list of objects with string fields instruction, output and optional input.
// Errors name `source` and the offending record.
absl::StatusOr<std::vector<InstructionRecord>> ParseAlpacaJson(absl::string_view text,
                                                               absl::string_view source);
absl::StatusOr<std::vector<InstructionRecord>> LoadAlpacaJson(const std::string& path);

struct SftExample {
  std::vector<int64_t> input_ids;
  std::vector<int64_t> labels;  // input_ids with the prompt positions set to kIgnoreIndex
  int64_t prompt_tokens = 0;
};

// Encodes text: the prompt with BOS as the tokenizer adds it, the response without BOS and
// with EOS (LitGPT's encode(prompt) and encode(output, bos=False, eos=True)).
using SftEncoder =
    std::function<absl::StatusOr<std::vector<int64_t>>(absl::string_view text, bool response)>;
SftEncoder TokenizerEncoder(const Tokenizer& tokenizer);

struct SftOptions {
  int64_t max_seq_length = -1;  // > 0: truncate prompt + response to this many tokens
  bool mask_prompt = true;
};

struct SftStats {
  int64_t truncated = 0;  // kept, with the response cut short
  int64_t dropped = 0;    // the prompt alone fills max_seq_length: nothing left to learn
};

// InvalidArgument when every record is dropped.
absl::StatusOr<std::vector<SftExample>> TokenizeSft(const std::vector<InstructionRecord>& records,
                                                    const PromptStyle& style,
                                                    const SftEncoder& encode,
                                                    const SftOptions& options,
                                                    SftStats* stats = nullptr);

struct SftBatch {
  at::Tensor input_ids;       // [B, T] int64, padded with pad_id
  at::Tensor labels;          // [B, T] int64, padded with kIgnoreIndex
  int64_t target_tokens = 0;  // labels that count
};
SftBatch CollateSft(const std::vector<const SftExample*>& examples, int64_t pad_id);

// Mean next-token cross-entropy over the labels that count: logits [B, T, V] at position t
// predict labels at t + 1 (LitGPT: logits[..., :-1, :] against labels[..., 1:]).
at::Tensor SftLoss(const at::Tensor& logits, const at::Tensor& labels);

}  // namespace lgpt

#endif  // LGPT_TOOLS_SFT_DATA_H_
