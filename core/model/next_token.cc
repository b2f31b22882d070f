#include "core/model/next_token.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/model/logit_rows.h"

namespace lgpt {

RowLogprobs ComputeRowLogprobs(const float* row, int64_t vocab, int64_t top) {
  float best = -std::numeric_limits<float>::infinity();
  for (int64_t v = 0; v < vocab; ++v) best = std::max(best, row[v]);
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - best);
  RowLogprobs result;
  result.log_normalizer = best + std::log(sum);
  if (top <= 0) return result;
  for (const int64_t id : MostLikelyIds(row, vocab, top)) {
    result.top.emplace_back(id, row[id] - result.log_normalizer);
  }
  return result;
}

TokenPenalties::TokenPenalties(const SamplingOptions& options, absl::Span<const int64_t> prompt)
    : options_(options) {
  if (options.repetition_penalty != 1) {
    prompt_tokens_.assign(prompt.begin(), prompt.end());
    std::sort(prompt_tokens_.begin(), prompt_tokens_.end());
    prompt_tokens_.erase(std::unique(prompt_tokens_.begin(), prompt_tokens_.end()),
                         prompt_tokens_.end());
  }
}

void TokenPenalties::Apply(float* row, int64_t vocab) const {
  for (const auto& [token, bias] : options_.logit_bias) {
    if (token < vocab) row[token] += static_cast<float>(bias);
  }
  if (options_.repetition_penalty != 1) {
    const float penalty = static_cast<float>(options_.repetition_penalty);
    auto repeat = [&](int64_t token) {
      if (token < 0 || token >= vocab) return;
      row[token] = row[token] > 0 ? row[token] / penalty : row[token] * penalty;
    };
    // Each token once, whether it is in the prompt, the output or both.
    for (const int64_t token : prompt_tokens_) repeat(token);
    for (const auto& [token, count] : generated_) {
      if (!std::binary_search(prompt_tokens_.begin(), prompt_tokens_.end(), token)) {
        repeat(token);
      }
    }
  }
  if (options_.frequency_penalty != 0 || options_.presence_penalty != 0) {
    for (const auto& [token, count] : generated_) {
      if (token < 0 || token >= vocab) continue;
      row[token] -= static_cast<float>(static_cast<double>(count) * options_.frequency_penalty +
                                       options_.presence_penalty);
    }
  }
}

NextTokenChooser::NextTokenChooser(SamplingOptions sampling, absl::Span<const int64_t> prompt,
                                   std::shared_ptr<TokenConstraint> constraint,
                                   int64_t top_logprobs)
    : sampling_(std::move(sampling)),
      penalties_(sampling_, prompt),
      constraint_(std::move(constraint)),
      top_logprobs_(top_logprobs) {}

absl::StatusOr<int64_t> NextTokenChooser::Choose(const at::Tensor& logits, at::Generator& generator,
                                                 TokenLogprob* logprob) {
  at::Tensor row = logits.reshape({1, -1});  // [1, V]
  const int64_t vocab = row.size(1);
  const bool host = row.device().is_cpu() && row.scalar_type() == at::kFloat && row.stride(1) == 1;
  if (!host && (Adjusts() || reports_logprobs())) row = row.to(at::kFloat).cpu().contiguous();
  RowLogprobs reported;
  at::Tensor raw;  // the row as the model gave it, when it will change before the draw
  if (reports_logprobs()) {
    const float* values = row.data_ptr<float>();
    if (!LogitRowUsable(values, vocab)) {
      return absl::FailedPreconditionError(
          "the model's logits are not finite (NaN or infinity): its weights or activations "
          "overflowed or are not numbers");
    }
    reported = ComputeRowLogprobs(values, vocab, top_logprobs_);
    if (Adjusts()) raw = row.clone();
  }
  if (Adjusts()) {
    float* values = row.data_ptr<float>();
    penalties_.Apply(values, vocab);
    if (constraint_) {
      constraint_->BanDisallowed(values, vocab);
      if (std::all_of(values, values + vocab, [](float x) { return std::isinf(x) && x < 0; })) {
        return absl::FailedPreconditionError(
            "the output constraint allows no token here (the grammar cannot continue)");
      }
    }
  }
  ASSIGN_OR_RETURN(const at::Tensor sampled, SampleNext(row, sampling_, generator));
  const int64_t token = sampled.device().is_cpu() && sampled.scalar_type() == at::kLong
                            ? sampled.data_ptr<int64_t>()[0]
                            : sampled.cpu().item<int64_t>();
  if (constraint_) RETURN_IF_ERROR(constraint_->Accept(token));
  penalties_.Observe(token);
  if (logprob != nullptr && reports_logprobs()) {
    const float* values = raw.defined() ? raw.data_ptr<float>() : row.data_ptr<float>();
    logprob->token = token;
    logprob->logprob = values[token] - reported.log_normalizer;
    logprob->top = std::move(reported.top);
  }
  return token;
}

}  // namespace lgpt
