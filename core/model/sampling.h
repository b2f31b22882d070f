// Choosing the next token from logits as LitGPT's `sample` does: top-k, then temperature,
// then top-p; greedy (argmax) when temperature or top_p is 0. Reproducible for a seed.
#ifndef LGPT_CORE_MODEL_SAMPLING_H_
#define LGPT_CORE_MODEL_SAMPLING_H_

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lgpt {

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;         // 0: all tokens
  double top_p = 1.0;        // in [0, 1]; 0: greedy
};

// Errors name the option and carry it (SamplingOptions.temperature, written "temperature":
// core/base/status_field.h): negative temperature, top_k < 0, top_p outside [0, 1].
absl::Status ValidateSampling(const SamplingOptions& options);

// logits [B, V] -> next token ids [B] (int64). `generator` drives the random draws.
// FailedPrecondition when a row of logits holds NaN or +inf, or nothing but -inf (a model with
// non-finite weights or activations): no token is drawn from a broken distribution.
absl::StatusOr<at::Tensor> SampleNext(const at::Tensor& logits, const SamplingOptions& options,
                                      at::Generator& generator);

}  // namespace lgpt

#endif  // LGPT_CORE_MODEL_SAMPLING_H_
