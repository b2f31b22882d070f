// Speculative decoding's flags, shared by generate and chat (core/speculative/README.md):
// --speculative=none|ngram|draft:DIR, --speculative_k, --ngram_min, --ngram_max, and the
// statistics line the tools print.
#ifndef LGPT_TOOLS_SPECULATIVE_FLAGS_H_
#define LGPT_TOOLS_SPECULATIVE_FLAGS_H_

#include <string>

#include "absl/status/status.h"
#include "lgpt.h"

namespace lgpt {

// The flags into `request.speculative` and, for draft:DIR, `engine.draft_checkpoint_dir` (a
// path from where the tool was started); errors name the flag.
absl::Status ApplySpeculativeFlags(RequestOptions& request, EngineOptions& engine);

// "speculative=ngram k=4 proposed=120 accepted=96 acceptance_rate=0.800 verify_steps=40
// tokens_per_verify_step=3.40"; empty without speculation.
std::string SpeculativeStatsLine(const RequestOptions& request, const GenerateStats& stats);

}  // namespace lgpt

#endif  // LGPT_TOOLS_SPECULATIVE_FLAGS_H_
