#include "core/model/sampling.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/DistributionsHelper.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <numeric>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "core/model/logit_rows.h"

namespace lgpt {

absl::Status ValidateSampling(const SamplingOptions& options) {
  // Messages say "temperature" of SamplingOptions.temperature, as every options struct that
  // holds sampling does.
  if (!(options.temperature >= 0) || std::isinf(options.temperature)) {
    return InvalidFieldError(
        FieldRef("SamplingOptions.temperature", "temperature"),
        absl::StrCat("temperature must be a finite value >= 0, got ", options.temperature));
  }
  if (options.top_k < 0) {
    return InvalidFieldError(FieldRef("SamplingOptions.top_k", "top_k"),
                             absl::StrCat("top_k must be >= 0, got ", options.top_k));
  }
  if (!(options.top_p >= 0 && options.top_p <= 1)) {
    return InvalidFieldError(FieldRef("SamplingOptions.top_p", "top_p"),
                             absl::StrCat("top_p must be in [0, 1], got ", options.top_p));
  }
  if (!(options.min_p >= 0 && options.min_p <= 1)) {
    return InvalidFieldError(FieldRef("SamplingOptions.min_p", "min_p"),
                             absl::StrCat("min_p must be in [0, 1], got ", options.min_p));
  }
  for (const auto& [name, value] :
       {std::pair<const char*, double>{"presence_penalty", options.presence_penalty},
        {"frequency_penalty", options.frequency_penalty}}) {
    if (!(value >= -2 && value <= 2)) {
      return InvalidFieldError(FieldRef(absl::StrCat("SamplingOptions.", name), name),
                               absl::StrCat(name, " must be in [-2, 2], got ", value));
    }
  }
  if (!(options.repetition_penalty > 0) || std::isinf(options.repetition_penalty)) {
    return InvalidFieldError(FieldRef("SamplingOptions.repetition_penalty", "repetition_penalty"),
                             absl::StrCat("repetition_penalty must be a finite value > 0, got ",
                                          options.repetition_penalty));
  }
  for (const auto& [token, bias] : options.logit_bias) {
    if (token < 0 || !(bias >= -100 && bias <= 100)) {
      return InvalidFieldError(
          FieldRef("SamplingOptions.logit_bias", "logit_bias"),
          absl::StrCat("logit_bias needs token ids >= 0 and biases in [-100, 100], got ", token,
                       ": ", bias));
    }
  }
  return absl::OkStatus();
}

namespace {

// Whether scores [B, V] can be read on the host: float32 on the CPU, rows of unit stride.
bool HostRows(const at::Tensor& scores) {
  return scores.device().is_cpu() && scores.scalar_type() == at::kFloat && scores.dim() == 2 &&
         scores.size(1) >= 1 && scores.stride(1) == 1;
}

// Whether each row of scores [B, V] can be sampled, as tensor operations on their device:
// [B] bool, no NaN or +inf and at least one finite value.
at::Tensor UsableRows(const at::Tensor& scores) {
  return at::logical_and(
      at::logical_not(at::logical_or(at::isnan(scores), at::isposinf(scores)).any(-1)),
      at::isfinite(scores).any(-1));
}

// The first row of scores [B, V] that cannot be sampled, or -1.
int64_t FirstUnusableRow(const at::Tensor& scores) {
  if (HostRows(scores)) {
    // On the host: one pass, instead of six full-vocabulary tensor operations per call.
    const float* data = scores.data_ptr<float>();
    for (int64_t b = 0; b < scores.size(0); ++b) {
      if (!LogitRowUsable(data + b * scores.stride(0), scores.size(1))) return b;
    }
    return -1;
  }
  const at::Tensor usable = UsableRows(scores);
  if (usable.all().item<bool>()) return -1;
  return at::logical_not(usable).nonzero().flatten()[0].item<int64_t>();
}

absl::Status UnusableRowError(int64_t row) {
  return absl::FailedPreconditionError(absl::StrCat(
      "the model's logits are not finite (row ", row,
      " holds NaN or infinity): its weights or activations overflowed or are not numbers"));
}

absl::Status CheckLogits(const at::Tensor& scores) {
  const int64_t row = FirstUnusableRow(scores);
  if (row < 0) return absl::OkStatus();
  return UnusableRowError(row);
}

// Draws one index per row of scores [B, N] (every row usable) at the options' temperature
// and top_p; argmax when either is 0.
at::Tensor DrawFrom(const at::Tensor& scores, const SamplingOptions& options,
                    at::Generator& generator) {
  if (options.temperature <= 0 || options.top_p <= 0) return scores.argmax(-1);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  // Subtracting each row's maximum first keeps extreme temperatures finite: the best token
  // scores 0, the others (x - max) / T <= 0, which may round to -inf (a tiny T is greedy).
  // In float64, where a temperature such as 1e-300 is not 0.
  at::Tensor tempered = (scores - std::get<0>(scores.max(-1, /*keepdim=*/true))).to(at::kDouble) /
                        options.temperature;
  if (options.min_p > 0) {
    // The best token scores 0: p / p_max = exp(score) < min_p drops a token.
    tempered = tempered.masked_fill(tempered < std::log(options.min_p), neg_inf);
  }
  if (options.top_p < 1) {
    // Drop the least likely tokens whose cumulative probability stays within 1 - top_p;
    // the most likely token always survives.
    auto [sorted, order] = at::sort(tempered, -1, /*descending=*/false);
    at::Tensor remove = sorted.softmax(-1).cumsum(-1) <= (1 - options.top_p);
    remove.select(-1, remove.size(-1) - 1).fill_(false);
    tempered = tempered.masked_fill(remove.scatter(-1, order, remove), neg_inf);
  }
  const at::Tensor probs = at::softmax(tempered, -1);
  return at::multinomial(probs, 1, /*replacement=*/false, generator).squeeze(-1);
}

at::Tensor SampleChecked(const at::Tensor& logits, const SamplingOptions& options,
                         at::Generator& generator) {
  // [B, V] float32, every row usable.
  if (options.temperature <= 0 || options.top_p <= 0) return logits.argmax(-1);
  const int64_t vocab = logits.size(-1);
  if (options.top_k > 0 && options.top_k < vocab) {
    // Only the k most likely tokens can be drawn: tempering, top_p and the draw run over
    // them alone ([B, k]), not over the vocabulary with the rest set to -inf (the same
    // distribution at O(k) instead of O(V) a row; a 128k vocabulary cost milliseconds).
    auto [values, indices] = at::topk(logits, options.top_k);
    return indices.gather(-1, DrawFrom(values, options, generator).unsqueeze(-1)).squeeze(-1);
  }
  return DrawFrom(logits, options, generator);
}

// Greedy decoding of float32 CPU logits [B, V] (unit-stride rows) on the host: each row's
// first largest value, argmax's choice, without CheckLogits' and argmax's ~10 tensor
// operations, which cost more than the loop on small vocabularies. nullopt when the tensor
// path must decide: other options, dtypes, devices or layouts, and rows that are not usable
// (its error names them).
std::optional<at::Tensor> GreedyOnHost(const at::Tensor& logits, const SamplingOptions& options) {
  if (!(options.temperature <= 0 || options.top_p <= 0) || options.top_k != 0) {
    return std::nullopt;
  }
  if (!HostRows(logits)) return std::nullopt;
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  at::Tensor tokens = at::empty({rows}, at::kLong);  // [B]
  for (int64_t b = 0; b < rows; ++b) {
    const float* values = logits.data_ptr<float>() + b * logits.stride(0);
    int64_t best = 0;
    bool finite = false;
    for (int64_t v = 0; v < vocab; ++v) {
      const float x = values[v];
      if (std::isnan(x) || x == std::numeric_limits<float>::infinity()) return std::nullopt;
      finite = finite || std::isfinite(x);
      if (x > values[best]) best = v;
    }
    if (!finite) return std::nullopt;
    tokens.data_ptr<int64_t>()[b] = best;
  }
  return tokens;
}

// Indices of row `values` [vocab] that can be drawn: the top_k largest (0 < top_k < vocab) or all,
// most likely first (ties: lower index first) when the order matters (top_k or top_p).
std::vector<int64_t> Candidates(const float* values, int64_t vocab,
                                const SamplingOptions& options) {
  const auto more_likely = [values](int64_t a, int64_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  };
  if (options.top_k > 0 && options.top_k < vocab) {
    // A selection over all indices compared through the row several times per token and cost
    // ~5% of a small model's decode step; MostLikelyIds is one pass.
    return MostLikelyIds(values, vocab, options.top_k);
  }
  std::vector<int64_t> order;
  order.resize(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (options.top_p < 1) std::sort(order.begin(), order.end(), more_likely);
  return order;
}

// The tokens of row `values` [vocab] that can be drawn (Candidates) and their unnormalised
// weights after temperature, min_p and top_p (0: dropped), for temperature > 0 and top_p > 0.
void CandidateWeights(const float* values, int64_t vocab, const SamplingOptions& options,
                      std::vector<int64_t>* order_out, std::vector<double>* weight_out) {
  std::vector<int64_t>& order = *order_out;
  std::vector<double>& weight = *weight_out;
  order = Candidates(values, vocab, options);
  float best = -std::numeric_limits<float>::infinity();
  for (const int64_t i : order) best = std::max(best, values[i]);
  // exp((x - max) / T) in float64: the best token weighs 1, a tiny T is greedy.
  weight.assign(order.size(), 0.0);
  double total = 0;
  for (size_t j = 0; j < order.size(); ++j) {
    weight[j] = std::exp((static_cast<double>(values[order[j]]) - best) / options.temperature);
    // min_p: p / p_max below it drops the token (the best one weighs 1 and stays).
    if (weight[j] < options.min_p) weight[j] = 0;
    total += weight[j];
  }
  if (options.top_p < 1) {
    // Drop the least likely tokens whose cumulative probability stays within 1 - top_p;
    // the most likely token always survives.
    double cumulative = 0;
    for (size_t j = order.size() - 1; j > 0; --j) {
      cumulative += weight[j] / total;
      if (cumulative > 1 - options.top_p) break;
      weight[j] = 0;
    }
  }
}

// Sampling of float32 CPU logits [B, V] (unit-stride rows) on the host, for temperature > 0:
// the same distribution as the tensor path (top_k, then temperature, then top_p, then a
// draw) without its ~20 tensor operations per call, which cost more than the arithmetic at
// serving vocabularies. The draw is multinomial's: the candidate maximising p / E with E
// exponential (drawn from `generator`, one per candidate). nullopt when the tensor path must
// decide: other dtypes, devices or layouts, and rows that are not usable (its error names them).
std::optional<at::Tensor> SampleOnHost(const at::Tensor& logits, const SamplingOptions& options,
                                       at::Generator& generator) {
  if (options.temperature <= 0 || options.top_p <= 0) return std::nullopt;
  if (!HostRows(logits)) return std::nullopt;
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  for (int64_t b = 0; b < rows; ++b) {
    if (!LogitRowUsable(logits.data_ptr<float>() + b * logits.stride(0), vocab))
      return std::nullopt;
  }
  at::Tensor tokens = at::empty({rows}, at::kLong);  // [B]
  // An undefined generator means LibTorch's default one, as for the tensor operations.
  at::Generator source = generator.defined() ? generator : at::detail::getDefaultCPUGenerator();
  at::CPUGeneratorImpl* rng = at::check_generator<at::CPUGeneratorImpl>(source);
  std::lock_guard<std::mutex> lock(source.mutex());
  for (int64_t b = 0; b < rows; ++b) {
    const float* values = logits.data_ptr<float>() + b * logits.stride(0);
    std::vector<int64_t> order;
    std::vector<double> weight;
    CandidateWeights(values, vocab, options, &order, &weight);
    at::exponential_distribution<double> exponential(1.0);
    size_t chosen = 0;
    double chosen_score = -1;
    for (size_t j = 0; j < order.size(); ++j) {
      const double score = weight[j] / exponential(rng);  // +inf when the draw is 0
      if (score > chosen_score) {
        chosen = j;
        chosen_score = score;
      }
    }
    tokens.data_ptr<int64_t>()[b] = order[chosen];
  }
  return tokens;
}

}  // namespace

absl::StatusOr<std::vector<double>> SamplingProbabilities(const float* row, int64_t vocab,
                                                          const SamplingOptions& options) {
  if (IsGreedy(options)) {
    return absl::InvalidArgumentError("SamplingProbabilities: the options are greedy");
  }
  if (!LogitRowUsable(row, vocab)) {
    return absl::FailedPreconditionError(
        "the model's logits are not finite (NaN or infinity): its weights or activations "
        "overflowed or are not numbers");
  }
  std::vector<int64_t> order;
  std::vector<double> weight;
  CandidateWeights(row, vocab, options, &order, &weight);
  double total = 0;
  for (const double w : weight) total += w;
  std::vector<double> probabilities(static_cast<size_t>(vocab), 0.0);
  for (size_t j = 0; j < order.size(); ++j) probabilities[order[j]] = weight[j] / total;
  return probabilities;
}

namespace {

at::CPUGeneratorImpl* CpuGenerator(at::Generator& generator, at::Generator* source) {
  *source = generator.defined() ? generator : at::detail::getDefaultCPUGenerator();
  return at::check_generator<at::CPUGeneratorImpl>(*source);
}

}  // namespace

double DrawUniform(at::Generator& generator) {
  at::Generator source;
  at::CPUGeneratorImpl* rng = CpuGenerator(generator, &source);
  std::lock_guard<std::mutex> lock(source.mutex());
  at::uniform_real_distribution<double> uniform(0.0, 1.0);
  return uniform(rng);
}

int64_t DrawIndex(absl::Span<const double> weights, at::Generator& generator) {
  double total = 0;
  for (const double w : weights) total += w;
  const double target = DrawUniform(generator) * total;
  double cumulative = 0;
  int64_t last = 0;  // the last index of positive weight: rounding never picks a zero weight
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] <= 0) continue;
    cumulative += weights[i];
    last = static_cast<int64_t>(i);
    if (target < cumulative) return last;
  }
  return last;
}

RowSampling RowSamplingFor(const SamplingOptions& options, at::Generator& generator) {
  RowSampling row;
  if (IsGreedy(options)) return row;
  row.temperature = options.temperature;
  row.top_k = options.top_k;
  row.top_p = options.top_p;
  row.min_p = options.min_p;
  at::Generator source;
  at::CPUGeneratorImpl* rng = CpuGenerator(generator, &source);
  std::lock_guard<std::mutex> lock(source.mutex());
  row.key = rng->random64();
  return row;
}

std::vector<absl::StatusOr<int64_t>> ChooseRows(const at::Tensor& logits,
                                                absl::Span<const RowSampling> rows) {
  absl::StatusOr<std::vector<int64_t>> tokens;
  try {
    tokens = SampleRows(logits.to(at::kFloat), rows);
  } catch (const c10::Error& e) {  // the conversion (out of device memory, say)
    tokens = absl::InternalError(absl::StrCat("sampling failed: ", e.what_without_backtrace()));
  }
  if (!tokens.ok()) return std::vector<absl::StatusOr<int64_t>>(rows.size(), tokens.status());
  std::vector<absl::StatusOr<int64_t>> choices;
  choices.reserve(tokens->size());
  for (size_t b = 0; b < tokens->size(); ++b) {
    const int64_t token = (*tokens)[b];
    choices.push_back(token != kUnusableRow ? absl::StatusOr<int64_t>(token)
                                            : UnusableRowError(static_cast<int64_t>(b)));
  }
  return choices;
}

absl::StatusOr<at::Tensor> SampleNext(const at::Tensor& logits, const SamplingOptions& options,
                                      at::Generator& generator) {
  try {
    if (!logits.device().is_cpu() && (!generator.defined() || generator.device().is_cpu())) {
      // On a device: drawn there, the ids and their checks in one transfer (a step synchronises
      // once); no tensor operation meets a generator of another device. (Logits not [B, V]:
      // SampleRows says so.)
      std::vector<RowSampling> rows;
      for (int64_t b = 0; b < (logits.dim() == 2 ? logits.size(0) : 1); ++b) {
        rows.push_back(RowSamplingFor(options, generator));
      }
      std::vector<int64_t> ids;
      for (absl::StatusOr<int64_t>& choice : ChooseRows(logits, rows)) {
        if (!choice.ok()) return choice.status();
        ids.push_back(*choice);
      }
      return at::tensor(ids, at::kLong);
    }
    if (std::optional<at::Tensor> greedy = GreedyOnHost(logits, options)) return *greedy;
    if (std::optional<at::Tensor> drawn = SampleOnHost(logits, options, generator)) return *drawn;
    const at::Tensor scores = logits.to(at::kFloat);  // [B, V]
    RETURN_IF_ERROR(CheckLogits(scores));
    return SampleChecked(scores, options, generator);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("sampling failed: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {  // allocation failures
    return absl::InternalError(absl::StrCat("sampling failed: ", e.what()));
  }
}

}  // namespace lgpt
