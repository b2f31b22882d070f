#include "core/speculative/speculative_spec.h"

#include "absl/strings/str_cat.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "core/speculative/draft_model_proposer.h"
#include "core/speculative/ngram_proposer.h"

namespace lgpt {
namespace {

constexpr int64_t kMaxSpeculativeTokens = 64;

}  // namespace

absl::Status ValidateSpeculativeSpec(const SpeculativeSpec& spec) {
  if (!spec.method.empty() && spec.method != "none" && spec.method != "ngram" &&
      spec.method != "draft") {
    return InvalidFieldError("SpeculativeSpec.method",
                             absl::StrCat("SpeculativeSpec.method must be none, ngram or draft, "
                                          "got '",
                                          spec.method, "'"));
  }
  if (spec.num_speculative_tokens < 1 || spec.num_speculative_tokens > kMaxSpeculativeTokens) {
    return InvalidFieldError(
        "SpeculativeSpec.num_speculative_tokens",
        absl::StrCat("SpeculativeSpec.num_speculative_tokens must be in [1, ",
                     kMaxSpeculativeTokens, "], got ", spec.num_speculative_tokens));
  }
  return ValidateNgramSizes(spec.prompt_lookup_min, spec.prompt_lookup_max, "SpeculativeSpec",
                            "prompt_lookup_min", "prompt_lookup_max");
}

absl::StatusOr<std::shared_ptr<Proposer>> MakeProposer(const SpeculativeSpec& spec,
                                                       const Config& target, GPT draft,
                                                       const SamplingOptions& sampling,
                                                       uint64_t seed) {
  RETURN_IF_ERROR(ValidateSpeculativeSpec(spec));
  if (!spec.enabled()) return std::shared_ptr<Proposer>();
  if (spec.method == "ngram") {
    NgramProposerOptions options;
    options.min_n = spec.prompt_lookup_min;
    options.max_n = spec.prompt_lookup_max;
    ASSIGN_OR_RETURN(std::unique_ptr<NgramProposer> proposer, NgramProposer::Create(options));
    return std::shared_ptr<Proposer>(std::move(proposer));
  }
  if (draft == nullptr) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "SpeculativeSpec.method",
                      "SpeculativeSpec.method=draft needs a draft model, and none was loaded "
                      "(EngineOptions.draft_checkpoint_dir)",
                      {"EngineOptions.draft_checkpoint_dir"});
  }
  DraftModelProposerOptions options;
  if (!IsGreedy(sampling)) {
    options.sampling.temperature = sampling.temperature;
    options.sampling.top_k = sampling.top_k;
    options.sampling.top_p = sampling.top_p;
    options.sampling.min_p = sampling.min_p;
  }
  options.seed = seed;
  options.max_k = spec.num_speculative_tokens;
  ASSIGN_OR_RETURN(std::unique_ptr<DraftModelProposer> proposer,
                   DraftModelProposer::Create(std::move(draft), target, options));
  return std::shared_ptr<Proposer>(std::move(proposer));
}

}  // namespace lgpt
