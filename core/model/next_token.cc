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

absl::StatusOr<NextTokenChooser::Prepared> NextTokenChooser::Prepare(const at::Tensor& logits,
                                                                     bool host) {
  Prepared prepared;
  at::Tensor& row = prepared.row;
  row = logits.reshape({1, -1});  // [1, V]
  const int64_t vocab = row.size(1);
  const bool on_host =
      row.device().is_cpu() && row.scalar_type() == at::kFloat && row.stride(1) == 1;
  if (!on_host && (host || Adjusts() || reports_logprobs())) {
    row = row.to(at::kFloat).cpu().contiguous();
  }
  if (reports_logprobs()) {
    const float* values = row.data_ptr<float>();
    if (!LogitRowUsable(values, vocab)) {
      return absl::FailedPreconditionError(
          "the model's logits are not finite (NaN or infinity): its weights or activations "
          "overflowed or are not numbers");
    }
    prepared.reported = ComputeRowLogprobs(values, vocab, top_logprobs_);
    if (Adjusts()) prepared.raw = row.clone();
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
  return prepared;
}

absl::Status NextTokenChooser::Commit(int64_t token, Prepared& prepared, TokenLogprob* logprob) {
  if (constraint_) RETURN_IF_ERROR(constraint_->Accept(token));
  penalties_.Observe(token);
  if (logprob != nullptr && reports_logprobs()) {
    const float* values =
        prepared.raw.defined() ? prepared.raw.data_ptr<float>() : prepared.row.data_ptr<float>();
    logprob->token = token;
    logprob->logprob = values[token] - prepared.reported.log_normalizer;
    logprob->top = std::move(prepared.reported.top);
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> NextTokenChooser::Choose(const at::Tensor& logits, at::Generator& generator,
                                                 TokenLogprob* logprob) {
  ASSIGN_OR_RETURN(Prepared prepared, Prepare(logits, /*host=*/false));
  ASSIGN_OR_RETURN(const at::Tensor sampled, SampleNext(prepared.row, sampling_, generator));
  const int64_t token = sampled.device().is_cpu() && sampled.scalar_type() == at::kLong
                            ? sampled.data_ptr<int64_t>()[0]
                            : sampled.cpu().item<int64_t>();
  RETURN_IF_ERROR(Commit(token, prepared, logprob));
  return token;
}

absl::StatusOr<int64_t> NextTokenChooser::Take(const absl::StatusOr<int64_t>& choice) {
  if (!choice.ok()) return choice.status();
  Prepared nothing_prepared;
  RETURN_IF_ERROR(Commit(*choice, nothing_prepared, nullptr));
  return *choice;
}

absl::StatusOr<NextTokenChooser::Verdict> NextTokenChooser::Verify(const at::Tensor& logits,
                                                                   int64_t proposed,
                                                                   absl::Span<const float> draft,
                                                                   at::Generator& generator,
                                                                   TokenLogprob* logprob) {
  Verdict verdict;
  if (IsGreedy(sampling_)) {
    ASSIGN_OR_RETURN(verdict.token, Choose(logits, generator, logprob));
    verdict.accepted = verdict.token == proposed;
    return verdict;
  }
  ASSIGN_OR_RETURN(Prepared prepared, Prepare(logits, /*host=*/true));
  const int64_t vocab = prepared.row.size(1);
  ASSIGN_OR_RETURN(const std::vector<double> p,
                   SamplingProbabilities(prepared.row.data_ptr<float>(), vocab, sampling_));
  // q(i): the proposer's probability of token i (a point mass at `proposed` without `draft`).
  const auto q = [&](int64_t i) -> double {
    if (draft.empty()) return i == proposed ? 1.0 : 0.0;
    return i >= 0 && i < static_cast<int64_t>(draft.size()) ? draft[i] : 0.0;
  };
  const double p_proposed = proposed >= 0 && proposed < vocab ? p[proposed] : 0.0;
  const double q_proposed = q(proposed);
  // Accept with probability min(1, p / q); a proposal its own distribution could not give
  // (q = 0) is taken wherever p allows it.
  const bool accept = p_proposed > 0 && (q_proposed <= p_proposed ||
                                         DrawUniform(generator) * q_proposed < p_proposed);
  if (accept) {
    verdict.token = proposed;
    verdict.accepted = true;
  } else {
    std::vector<double> residual(static_cast<size_t>(vocab));
    double total = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      residual[i] = std::max(0.0, p[i] - q(i));
      total += residual[i];
    }
    // p == q leaves nothing (and then a rejection has probability 0): draw from p.
    verdict.token = DrawIndex(total > 0 ? residual : p, generator);
  }
  RETURN_IF_ERROR(Commit(verdict.token, prepared, logprob));
  return verdict;
}

}  // namespace lgpt
