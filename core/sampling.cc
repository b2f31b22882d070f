#include "core/sampling.h"

#include <cmath>
#include <limits>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"

namespace lgpt {

absl::Status ValidateSampling(const SamplingOptions& options) {
  if (!(options.temperature >= 0) || std::isinf(options.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be a finite value >= 0, got ", options.temperature));
  }
  if (options.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", options.top_k));
  }
  if (!(options.top_p >= 0 && options.top_p <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in [0, 1], got ", options.top_p));
  }
  return absl::OkStatus();
}

at::Tensor SampleNext(const at::Tensor& logits, const SamplingOptions& options,
                      at::Generator& generator) {
  at::Tensor scores = logits.to(at::kFloat);  // [B, V]
  const double neg_inf = -std::numeric_limits<double>::infinity();
  if (options.top_k > 0) {
    auto [values, indices] = at::topk(scores, std::min(options.top_k, scores.size(-1)));
    scores = at::full_like(scores, neg_inf).scatter_(-1, indices, values);
  }
  if (options.temperature <= 0 || options.top_p <= 0) return scores.argmax(-1);
  scores = scores / options.temperature;
  if (options.top_p < 1) {
    // Drop the least likely tokens whose cumulative probability stays within 1 - top_p;
    // the most likely token always survives.
    auto [sorted, order] = at::sort(scores, -1, /*descending=*/false);
    at::Tensor remove = sorted.softmax(-1).cumsum(-1) <= (1 - options.top_p);
    remove.select(-1, remove.size(-1) - 1).fill_(false);
    scores = scores.masked_fill(remove.scatter(-1, order, remove), neg_inf);
  }
  const at::Tensor probs = at::softmax(scores, -1);
  return at::multinomial(probs, 1, /*replacement=*/false, generator).squeeze(-1);
}

}  // namespace lgpt
