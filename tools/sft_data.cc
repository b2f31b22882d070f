#include "tools/sft_data.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace lgpt {

absl::StatusOr<std::vector<InstructionRecord>> ParseAlpacaJson(absl::string_view text,
                                                               absl::string_view source) {
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": malformed JSON: ", e.what()));
  }
  if (!root.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected a JSON list of {instruction, input, output} objects"));
  }
  std::vector<InstructionRecord> records;
  for (size_t i = 0; i < root.size(); ++i) {
    const nlohmann::json& item = root[i];
    if (!item.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": record ", i, " is not an object"));
    }
    InstructionRecord record;
    for (const auto& [key, field, required] :
         {std::make_tuple("instruction", &record.instruction, true),
          std::make_tuple("input", &record.input, false),
          std::make_tuple("output", &record.output, true)}) {
      auto it = item.find(key);
      if (it == item.end() || it->is_null()) {
        if (required) {
          return absl::InvalidArgumentError(
              absl::StrCat(source, ": record ", i, " has no \"", key, "\""));
        }
        continue;
      }
      if (!it->is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": record ", i, ": \"", key, "\" is not a string"));
      }
      *field = it->get<std::string>();
    }
    records.push_back(std::move(record));
  }
  if (records.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": no records"));
  return records;
}

absl::StatusOr<std::vector<InstructionRecord>> LoadAlpacaJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read data file ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseAlpacaJson(buffer.str(), path);
}

SftEncoder TokenizerEncoder(const Tokenizer& tokenizer) {
  return [&tokenizer](absl::string_view text, bool response) {
    return response ? tokenizer.Encode(text, /*bos=*/false, /*eos=*/true) : tokenizer.Encode(text);
  };
}

absl::StatusOr<std::vector<SftExample>> TokenizeSft(const std::vector<InstructionRecord>& records,
                                                    const PromptStyle& style,
                                                    const SftEncoder& encode,
                                                    const SftOptions& options, SftStats* stats) {
  SftStats counts;
  std::vector<SftExample> examples;
  for (const InstructionRecord& record : records) {
    ASSIGN_OR_RETURN(std::vector<int64_t> prompt,
                     encode(style.Apply(record.instruction, record.input), false));
    ASSIGN_OR_RETURN(std::vector<int64_t> response, encode(record.output, true));
    SftExample example;
    example.prompt_tokens = static_cast<int64_t>(prompt.size());
    example.input_ids = prompt;
    example.input_ids.insert(example.input_ids.end(), response.begin(), response.end());
    if (options.max_seq_length > 0 &&
        static_cast<int64_t>(example.input_ids.size()) > options.max_seq_length) {
      // A label at position t is predicted from position t - 1, so at least one response
      // token must follow the prompt inside the window.
      if (example.prompt_tokens >= options.max_seq_length) {
        ++counts.dropped;
        continue;
      }
      example.input_ids.resize(options.max_seq_length);
      ++counts.truncated;
    }
    example.labels = example.input_ids;
    if (options.mask_prompt) {
      std::fill(example.labels.begin(), example.labels.begin() + example.prompt_tokens,
                kIgnoreIndex);
    }
    examples.push_back(std::move(example));
  }
  if (stats) *stats = counts;
  if (examples.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "every one of the ", records.size(), " examples has a prompt of max_seq_length (",
        options.max_seq_length, ") tokens or more; raise --max_seq_length"));
  }
  return examples;
}

SftBatch CollateSft(const std::vector<const SftExample*>& examples, int64_t pad_id) {
  size_t length = 0;
  for (const SftExample* e : examples) length = std::max(length, e->input_ids.size());
  const int64_t batch = static_cast<int64_t>(examples.size());
  SftBatch out;
  out.input_ids = at::full({batch, static_cast<int64_t>(length)}, pad_id, at::kLong);
  out.labels = at::full({batch, static_cast<int64_t>(length)}, kIgnoreIndex, at::kLong);
  auto ids = out.input_ids.accessor<int64_t, 2>();
  auto labels = out.labels.accessor<int64_t, 2>();
  for (int64_t b = 0; b < batch; ++b) {
    const SftExample& e = *examples[b];
    for (size_t t = 0; t < e.input_ids.size(); ++t) {
      ids[b][t] = e.input_ids[t];
      labels[b][t] = e.labels[t];
      // The first position is never a target (nothing predicts it).
      if (t > 0 && e.labels[t] != kIgnoreIndex) ++out.target_tokens;
    }
  }
  return out;
}

at::Tensor SftLoss(const at::Tensor& logits, const at::Tensor& labels) {
  const int64_t steps = logits.size(1);
  const at::Tensor shifted_logits = logits.narrow(1, 0, steps - 1);
  const at::Tensor shifted_labels = labels.narrow(1, 1, steps - 1);
  return at::cross_entropy_loss(shifted_logits.reshape({-1, logits.size(-1)}).to(at::kFloat),
                                shifted_labels.reshape(-1), /*weight=*/{}, at::Reduction::Mean,
                                kIgnoreIndex);
}

}  // namespace lgpt
