// What a request asks of speculative decoding, in vLLM's terms (speculative_config: method,
// num_speculative_tokens, prompt_lookup_min/max), and the proposer that serves it: the tools'
// --speculative flags and lgpt's RequestOptions fill it.
#ifndef LGPT_CORE_SPECULATIVE_SPECULATIVE_SPEC_H_
#define LGPT_CORE_SPECULATIVE_SPECULATIVE_SPEC_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/config/config.h"
#include "core/model/gpt.h"
#include "core/model/sampling.h"
#include "core/speculative/proposer.h"

namespace lgpt {

struct SpeculativeSpec {
  // "" or "none": no speculation; "ngram": prompt lookup (core/speculative/ngram_proposer.h);
  // "draft": a draft model (core/speculative/draft_model_proposer.h), the one the caller
  // loaded (lgpt's EngineOptions.draft_checkpoint_dir).
  std::string method;
  int64_t num_speculative_tokens = 4;  // k: tokens proposed per step, at most
  int64_t prompt_lookup_min = 2;       // ngram: the shortest suffix matched
  int64_t prompt_lookup_max = 4;       // ngram: the longest suffix matched

  bool enabled() const { return !method.empty() && method != "none"; }
};

// The method ("", none, ngram, draft), num_speculative_tokens in [1, 64] and the n-gram sizes
// (1 <= min <= max); errors name the fields (SpeculativeSpec.method, ...) and carry them.
absl::Status ValidateSpeculativeSpec(const SpeculativeSpec& spec);

// A proposer for one request of `target` (null when the spec asks for none): `draft` serves
// "draft" (FailedPrecondition naming SpeculativeSpec.method when there is none); a sampled
// request's draft draws from its own distribution under the request's temperature, top_k,
// min_p and top_p, seeded with `seed`.
absl::StatusOr<std::shared_ptr<Proposer>> MakeProposer(const SpeculativeSpec& spec,
                                                       const Config& target, GPT draft,
                                                       const SamplingOptions& sampling,
                                                       uint64_t seed);

}  // namespace lgpt

#endif  // LGPT_CORE_SPECULATIVE_SPECULATIVE_SPEC_H_
