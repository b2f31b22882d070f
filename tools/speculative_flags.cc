#include "tools/speculative_flags.h"

#include <cstdint>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/tool_util.h"

ABSL_FLAG(std::string, speculative, "none",
          "speculative decoding: none, ngram (prompt lookup: proposals copied from the prompt "
          "and output) or draft:DIR (a draft checkpoint with the same tokenizer); greedy output "
          "is unchanged token for token, sampled output keeps its distribution");
ABSL_FLAG(int64_t, speculative_k, 4, "speculative decoding: tokens proposed per step (1..64)");
ABSL_FLAG(int64_t, ngram_min, 2, "--speculative=ngram: the shortest suffix looked up");
ABSL_FLAG(int64_t, ngram_max, 4, "--speculative=ngram: the longest suffix looked up");

namespace lgpt {

absl::Status ApplySpeculativeFlags(RequestOptions& request, EngineOptions& engine) {
  const std::string value = absl::GetFlag(FLAGS_speculative);
  SpeculativeSpec& spec = request.speculative;
  if (absl::StartsWith(value, "draft:")) {
    spec.method = "draft";
    engine.draft_checkpoint_dir = ResolvePath(value.substr(6));
    if (engine.draft_checkpoint_dir.empty()) {
      return absl::InvalidArgumentError("--speculative=draft:DIR needs a directory");
    }
  } else if (value == "draft") {
    return absl::InvalidArgumentError(
        "--speculative=draft needs the draft checkpoint: --speculative=draft:DIR");
  } else {
    spec.method = value;
  }
  spec.num_speculative_tokens = absl::GetFlag(FLAGS_speculative_k);
  spec.prompt_lookup_min = absl::GetFlag(FLAGS_ngram_min);
  spec.prompt_lookup_max = absl::GetFlag(FLAGS_ngram_max);
  return ValidateSpeculativeSpec(spec);
}

std::string SpeculativeStatsLine(const RequestOptions& request, const GenerateStats& stats) {
  if (!request.speculative.enabled()) return "";
  const double per_step =
      stats.verify_steps > 0
          ? static_cast<double>(stats.accepted_tokens + stats.verify_steps) / stats.verify_steps
          : 0.0;
  return absl::StrFormat(
      "speculative=%s k=%d proposed=%d accepted=%d acceptance_rate=%.3f verify_steps=%d "
      "tokens_per_verify_step=%.2f",
      request.speculative.method, request.speculative.num_speculative_tokens, stats.proposed_tokens,
      stats.accepted_tokens, stats.acceptance_rate(), stats.verify_steps, per_step);
}

}  // namespace lgpt
