// Autoregressive generation for one sequence through a caller-owned KV cache: prefill the
// prompt (whole or in chunks), then decode one token a step, computing logits for the last
// position only. With a proposer (speculative decoding, core/speculative/README.md) a step
// feeds the last token and up to k proposed ones, computes logits for each, keeps the
// proposals the model accepts plus one token of its own, and truncates the cache back to them:
// greedy output token for token as without, sampled output with the same distribution.
#ifndef LGPT_CORE_MODEL_GENERATE_H_
#define LGPT_CORE_MODEL_GENERATE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/kv_cache.h"
#include "core/model/gpt.h"
#include "core/model/next_token.h"
#include "core/model/sampling.h"
#include "core/speculative/proposer.h"

namespace lgpt {

// Speculative decoding for one request.
struct SpeculativeOptions {
  // Proposes the tokens each step verifies (core/speculative/); null: no speculation. The
  // request's own: it may hold state (a draft model's KV cache) across calls.
  std::shared_ptr<Proposer> proposer;
  int64_t k = 4;  // tokens proposed per step, at most (>= 1)
  // The tokens before the prompt (the cache's positions [0, start_position): a session's
  // earlier turns), which the proposer sees as the start of the context; empty or
  // start_position of them.
  std::vector<int64_t> history;
};

struct GenerateOptions {
  int64_t max_new_tokens = 50;
  SamplingOptions sampling;
  uint64_t seed = 1234;
  int64_t prefill_chunk = 0;  // 0: the whole prompt in one step
  // Position of the prompt's first token: the cache already holds positions
  // [0, start_position) (a multi-turn session continuing its context). With a cache that
  // shifts positions (KVCache::ShiftsPositions) this is a cache position, and there is no
  // length limit: the cache makes room as the stream reaches the context.
  int64_t start_position = 0;
  std::vector<int64_t> stop_tokens;  // generation ends after emitting one of these
  // Which tokens may come next (constrained decoding); null: any. Used by one request only.
  std::shared_ptr<TokenConstraint> constraint;
  // Log-probabilities reported through on_logprob: -1 none, 0 the chosen token's, K > 0 also
  // the K most likely tokens of its step (core/model/next_token.h says from which logits).
  int64_t top_logprobs = -1;
  // Called with each new token's log-probabilities, just before on_token.
  std::function<void(const TokenLogprob&)> on_logprob;
  // Called with each new token; returning false stops generation.
  std::function<bool(int64_t)> on_token;
  // The adapter slot of a multi-adapter model (peft/multi_lora.h) every step uses; -1: the
  // base model.
  int64_t adapter = -1;
  // Speculative decoding: needs a cache that rolls back (KVCache::rollback(): dense, paged,
  // quantised; not the budgeted ones) and composes with everything above (sampling, penalties,
  // logit_bias, constraint, logprobs, stop tokens, adapters); see core/speculative/README.md.
  SpeculativeOptions speculative;
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t new_tokens = 0;
  double time_to_first_token_s = 0;  // prefill plus the first sample
  double prefill_s = 0;
  double decode_s = 0;  // the steps after the first token
  int64_t kv_cache_bytes = 0;
  // Cache positions: how far the cache moved its entries down during the call (the next
  // token's cache position is start_position + prompt + new tokens - position_shift).
  int64_t position_shift = 0;
  // Speculative decoding: tokens proposed and accepted, and verification steps (each also
  // yields one token of the model's own).
  int64_t proposed_tokens = 0;
  int64_t accepted_tokens = 0;
  int64_t verify_steps = 0;
  double acceptance_rate() const {
    return proposed_tokens > 0 ? static_cast<double>(accepted_tokens) / proposed_tokens : 0.0;
  }
};

// Generate's checks of a request, before any work: sampling options, an empty prompt,
// negative counts (InvalidArgument), a stream past the context of model and cache
// (OutOfRange, unless the cache shifts positions), and speculation a cache cannot roll back
// (FailedPrecondition naming GenerateOptions.speculative) or a k past what it forgets.
absl::Status CheckGenerateRequest(const GPTImpl& model, const KVCache& cache, int64_t prompt_length,
                                  const GenerateOptions& options);

// Generates up to max_new_tokens after `prompt`; the cache must hold exactly positions
// [0, start_position) and be large enough for start_position + prompt + new tokens, unless it
// shifts positions (then any length goes; long prompts are prefilled in chunks that fit).
absl::StatusOr<std::vector<int64_t>> Generate(GPTImpl& model, KVCache& cache,
                                              const std::vector<int64_t>& prompt,
                                              const GenerateOptions& options,
                                              GenerateStats* stats = nullptr);

struct BatchGenerateOptions {
  int64_t max_new_tokens = 50;
  SamplingOptions sampling;
  // Every row samples from its own generator seeded with this, so a row's output equals
  // what Generate gives for its prompt alone with the same seed.
  uint64_t seed = 1234;
  int64_t prefill_chunk = 0;
  std::vector<int64_t> stop_tokens;
  // Called with (row, token) for each new token; returning false ends that row.
  std::function<bool(int64_t, int64_t)> on_token;
  // Each prompt's adapter slot of a multi-adapter model (peft/multi_lora.h), -1 for the base
  // model; empty: every prompt uses the base model. Rows of different adapters share each
  // forward pass.
  std::vector<int64_t> adapters;
};

// Generates for prompts of different lengths at once through one cache with batch_size >=
// prompts.size(). All rows advance in lockstep at the same position, so every cache policy
// works unchanged and no padding ever enters the cache: the shortest prompt's length is
// prefilled as one batched step, then each row is fed the rest of its own prompt one token
// per step (teacher forcing) while rows whose prompt is done sample. Cost: prompt tokens
// beyond the shortest prompt run at batched decode speed. Stats are for the whole batch. A cache
// that shifts positions lifts the length limit as for Generate.
absl::StatusOr<std::vector<std::vector<int64_t>>> GenerateBatch(
    GPTImpl& model, KVCache& cache, const std::vector<std::vector<int64_t>>& prompts,
    const BatchGenerateOptions& options, GenerateStats* stats = nullptr);

}  // namespace lgpt

#endif  // LGPT_CORE_MODEL_GENERATE_H_
