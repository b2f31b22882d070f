// Choosing the next token from logits as LitGPT's `sample` does: top-k, then temperature,
// then min-p (vLLM's), then top-p; greedy (argmax) when temperature or top_p is 0.
// Reproducible for a seed. The penalties and biases below are applied to the logits before
// (core/model/next_token.h keeps the per-request state they need).
#ifndef LGPT_CORE_MODEL_SAMPLING_H_
#define LGPT_CORE_MODEL_SAMPLING_H_

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/ops/row_sampler.h"

namespace lgpt {

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;         // 0: all tokens
  double top_p = 1.0;        // in [0, 1]; 0: greedy
  // In [0, 1]: after temperature, tokens less likely than min_p times the most likely one are
  // dropped (vLLM's min_p); 0: none.
  double min_p = 0.0;
  // Applied to the logits before sampling, in this order (vLLM's): logit_bias added; then
  // repetition_penalty on every token of the prompt and the output (a positive logit divided
  // by it, a negative one multiplied); then OpenAI's penalties over the output's tokens:
  // logit -= count * frequency_penalty + (count > 0) * presence_penalty.
  double presence_penalty = 0.0;    // in [-2, 2]
  double frequency_penalty = 0.0;   // in [-2, 2]
  double repetition_penalty = 1.0;  // > 0; 1: none
  // (token id, bias) pairs, bias in [-100, 100] (OpenAI's logit_bias; -100 bans in effect).
  std::vector<std::pair<int64_t, double>> logit_bias;

  // Whether any of the logits adjustments above is asked for.
  bool AdjustsLogits() const {
    return presence_penalty != 0 || frequency_penalty != 0 || repetition_penalty != 1 ||
           !logit_bias.empty();
  }
};

// Errors name the option and carry it (SamplingOptions.temperature, written "temperature":
// core/base/status_field.h): negative temperature, top_k < 0, top_p or min_p outside [0, 1],
// penalties outside their ranges, a bias outside [-100, 100] or a biased id < 0 (ids past the
// vocabulary are the request's check: the model knows its size).
absl::Status ValidateSampling(const SamplingOptions& options);

// logits [B, V] -> next token ids [B] (int64). `generator` drives the random draws.
// CPU logits are drawn on the host as torch.multinomial draws them (LitGPT's tokens for a seed).
// A device's rows are chosen there with a CPU generator (as every lgpt caller makes): one
// kernel launch, the ids alone read back (ChooseRows), each sampled row keyed by one 64-bit draw
// of `generator` (RowSamplingFor): a seed gives the same tokens on that device whatever the
// batch, and other tokens than on the CPU (another random stream, the same distribution).
// FailedPrecondition when a row of logits holds NaN or +inf, or nothing but -inf (a model with
// non-finite weights or activations): no token is drawn from a broken distribution.
absl::StatusOr<at::Tensor> SampleNext(const at::Tensor& logits, const SamplingOptions& options,
                                      at::Generator& generator);

// A row's options for ChooseRows: the key is one 64-bit draw of `generator` (a CPU generator;
// undefined: LibTorch's default) when the options sample; greedy options draw nothing.
RowSampling RowSamplingFor(const SamplingOptions& options, at::Generator& generator);

// Choices for logits [B, V] (any float dtype) on the CPU or a CUDA device, drawn there
// (core/ops/row_sampler.h) and read back in one transfer: a decoding step's rows on a GPU
// synchronise once, not once a row. Per row its token, or SampleNext's FailedPrecondition for a
// row holding NaN or +inf, or nothing but -inf (or, for every row, the error that stopped the
// draw). The options' penalties and biases are not applied: the caller's rows have none.
std::vector<absl::StatusOr<int64_t>> ChooseRows(const at::Tensor& logits,
                                                absl::Span<const RowSampling> rows);

// Whether the options choose the most likely token (temperature or top_p 0).
inline bool IsGreedy(const SamplingOptions& options) {
  return options.temperature <= 0 || options.top_p <= 0;
}

// The distribution SampleNext draws a token from, for one row of float32 logits [vocab] and
// options that are not greedy: probabilities [vocab] summing to 1 (0 for the tokens top_k,
// min_p and top_p drop). Speculative decoding's rejection sampling needs it whole.
// FailedPrecondition for a row holding NaN or +inf, or nothing but -inf.
absl::StatusOr<std::vector<double>> SamplingProbabilities(const float* row, int64_t vocab,
                                                          const SamplingOptions& options);

// A number uniform in [0, 1) from `generator` (a CPU generator; undefined: LibTorch's default).
double DrawUniform(at::Generator& generator);
// An index i drawn with probability weights[i] / sum(weights) (weights >= 0, some > 0).
int64_t DrawIndex(absl::Span<const double> weights, at::Generator& generator);

}  // namespace lgpt

#endif  // LGPT_CORE_MODEL_SAMPLING_H_
