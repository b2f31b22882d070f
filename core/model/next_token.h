// A request's choice of each next token, shared by Generate (batch 1), GenerateBatch and the
// serving scheduler: the penalties and biases of its SamplingOptions (which need the tokens so
// far), a constraint that bans tokens (constrained decoding, core/constrain/), the sampler,
// and the log-probabilities a request asks to see.
//
// Order, per token: the log-probabilities are read from the model's logits as they come
// (before any bias, penalty or mask, as OpenAI and vLLM report them; temperature does not
// change them); then logit_bias, repetition, frequency and presence penalties
// (SamplingOptions), then the constraint's mask, then sampling (core/model/sampling.h).
// Float32 CPU logits are adjusted in place (the sparse adjustments touch only the tokens seen
// and biased); other dtypes and devices are copied to a float32 host row first.
//
//   NextTokenChooser chooser(options.sampling, prompt, constraint, /*top_logprobs=*/5);
//   ASSIGN_OR_RETURN(int64_t token, chooser.Choose(logits, generator, &logprob));
#ifndef LGPT_CORE_MODEL_NEXT_TOKEN_H_
#define LGPT_CORE_MODEL_NEXT_TOKEN_H_

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/model/sampling.h"

namespace lgpt {

// A chosen token's natural-log probability under the model's distribution, and the most likely
// tokens at its step (most likely first; ties: the lower id first).
struct TokenLogprob {
  int64_t token = -1;
  double logprob = 0;
  std::vector<std::pair<int64_t, double>> top;  // (id, logprob), as many as asked
};

// Which tokens may come next: a grammar, a regex, a JSON schema (core/constrain/ implements
// it over a tokenizer's vocabulary). One object per request, used from one thread at a time.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets row[id] to -inf for every id in [0, vocab) that may not come next.
  virtual void BanDisallowed(float* row, int64_t vocab) = 0;
  // The chosen token; an error when it was not allowed.
  virtual absl::Status Accept(int64_t token) = 0;
  // A copy in the same state (a request's other choices).
  virtual std::unique_ptr<TokenConstraint> Clone() const = 0;
  // Whether nothing more may follow (a grammar's sentence complete and not extensible, or its
  // end token taken): generation ends there, as at a stop token.
  virtual bool Done() const { return false; }
};

// The log-probabilities of row [vocab] (float32 logits): the normaliser and the `top` most
// likely tokens. The row must hold at least one finite value.
struct RowLogprobs {
  double log_normalizer = 0;  // log sum exp(row)
  std::vector<std::pair<int64_t, double>> top;
};
RowLogprobs ComputeRowLogprobs(const float* row, int64_t vocab, int64_t top);

// The penalty state of one request: how often each token was generated, which tokens the prompt
// holds. Applies SamplingOptions' biases and penalties to a row of logits in place.
class TokenPenalties {
 public:
  TokenPenalties(const SamplingOptions& options, absl::Span<const int64_t> prompt);
  void Apply(float* row, int64_t vocab) const;
  void Observe(int64_t token) { ++generated_[token]; }

 private:
  const SamplingOptions& options_;
  absl::flat_hash_map<int64_t, int64_t> generated_;  // token -> times generated
  std::vector<int64_t> prompt_tokens_;               // distinct, for repetition_penalty
};

class NextTokenChooser {
 public:
  // `top_logprobs`: -1 reports nothing; 0 the chosen token's logprob; K > 0 also the K most
  // likely tokens. `constraint` may be null. `prompt` feeds repetition_penalty.
  NextTokenChooser(SamplingOptions sampling, absl::Span<const int64_t> prompt,
                   std::shared_ptr<TokenConstraint> constraint = nullptr,
                   int64_t top_logprobs = -1);
  NextTokenChooser(const NextTokenChooser&) = delete;
  NextTokenChooser& operator=(const NextTokenChooser&) = delete;

  // The next token from logits [1, V] (or [V]); may change them in place. `logprob` (when
  // reporting) receives the token's log-probability and the top ones. Errors: SampleNext's,
  // a constraint that bans every token (FailedPrecondition), a constraint refusing the token.
  absl::StatusOr<int64_t> Choose(const at::Tensor& logits, at::Generator& generator,
                                 TokenLogprob* logprob = nullptr);

  // Speculative decoding (core/speculative/README.md): the choice at one position of a
  // verified block, where a proposer put `proposed`. Returns the token the position gets and
  // whether it is `proposed` (accepted; else the block ends at this replacement). Greedy
  // options accept exactly when `proposed` is the token Choose would pick, and pick that.
  // Sampled options accept with probability min(1, p(proposed) / q(proposed)) and otherwise
  // draw from max(0, p - q) renormalised, p the distribution Choose draws from (penalties,
  // biases and constraint applied, then top_k, temperature, min_p, top_p) and q the proposer's:
  // `draft` (probabilities over the vocabulary) or, empty, a point mass at `proposed`. So the
  // token is distributed as Choose's is (Leviathan et al. 2023; Chen et al. 2023). The
  // penalties, the constraint and `logprob` then see the token as after Choose.
  struct Verdict {
    int64_t token = -1;
    bool accepted = false;
  };
  absl::StatusOr<Verdict> Verify(const at::Tensor& logits, int64_t proposed,
                                 absl::Span<const float> draft, at::Generator& generator,
                                 TokenLogprob* logprob = nullptr);

  // Whether Choose's token comes from the logits and the sampling options alone (nothing
  // adjusted or reported): a step's such rows on a device can be chosen together (ChooseRows
  // in core/model/sampling.h with RowSamplingFor's options, one launch and one transfer) and
  // handed over through Take; Choose on one such row draws the same token.
  bool ChoosesFromLogitsAlone() const { return !Adjusts() && !reports_logprobs(); }
  // Takes `choice` (a ChoosesFromLogitsAlone row's ChooseRows result) as Choose would have
  // chosen it; its error as it is.
  absl::StatusOr<int64_t> Take(const absl::StatusOr<int64_t>& choice);

  bool reports_logprobs() const { return top_logprobs_ >= 0; }
  const SamplingOptions& sampling() const { return sampling_; }

 private:
  // Whether the logits must be changed before sampling.
  bool Adjusts() const { return constraint_ != nullptr || sampling_.AdjustsLogits(); }
  // A row of logits made ready to choose from: float32 on the host when it is read or changed
  // (always with `host`), the logprobs read from it as it came, then biased, penalised and
  // masked.
  struct Prepared {
    at::Tensor row;  // [1, V]
    RowLogprobs reported;
    at::Tensor raw;  // the row as it came, when it changed and logprobs are reported
  };
  absl::StatusOr<Prepared> Prepare(const at::Tensor& logits, bool host);
  // The chosen token enters the constraint and the penalties; `logprob` gets its numbers.
  absl::Status Commit(int64_t token, Prepared& prepared, TokenLogprob* logprob);

  const SamplingOptions sampling_;
  TokenPenalties penalties_;
  std::shared_ptr<TokenConstraint> constraint_;
  const int64_t top_logprobs_;
};

}  // namespace lgpt

#endif  // LGPT_CORE_MODEL_NEXT_TOKEN_H_
