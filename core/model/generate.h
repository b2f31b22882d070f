// Autoregressive generation for one sequence through a caller-owned KV cache: prefill the
// prompt (whole or in chunks), then decode one token a step, computing logits for the last
// position only.
#ifndef LGPT_CORE_MODEL_GENERATE_H_
#define LGPT_CORE_MODEL_GENERATE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/kv_cache.h"
#include "core/model/gpt.h"
#include "core/sampling.h"

namespace lgpt {

struct GenerateOptions {
  int64_t max_new_tokens = 50;
  SamplingOptions sampling;
  uint64_t seed = 1234;
  int64_t prefill_chunk = 0;         // 0: the whole prompt in one step
  std::vector<int64_t> stop_tokens;  // generation ends after emitting one of these
  // Called with each new token; returning false stops generation.
  std::function<bool(int64_t)> on_token;
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t new_tokens = 0;
  double time_to_first_token_s = 0;  // prefill plus the first sample
  double prefill_s = 0;
  double decode_s = 0;               // the steps after the first token
  int64_t kv_cache_bytes = 0;
};

// Generates up to max_new_tokens after `prompt`; the cache must be empty (or hold exactly
// what precedes position 0 of the prompt) and large enough for prompt + new tokens.
absl::StatusOr<std::vector<int64_t>> Generate(GPTImpl& model, KVCache& cache,
                                              const std::vector<int64_t>& prompt,
                                              const GenerateOptions& options,
                                              GenerateStats* stats = nullptr);

}  // namespace lgpt

#endif  // LGPT_CORE_MODEL_GENERATE_H_
