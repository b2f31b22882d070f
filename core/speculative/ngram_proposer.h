// Prompt lookup (llama.cpp's `lookup`, vLLM's `ngram` speculator): the proposal is what
// followed the most recent earlier occurrence of the context's last n tokens, n tried from
// max_n down to min_n. Free (no model runs), and it pays where outputs copy their inputs:
// retrieval-augmented answers, code edits, summaries, quotations.
#ifndef LGPT_CORE_SPECULATIVE_NGRAM_PROPOSER_H_
#define LGPT_CORE_SPECULATIVE_NGRAM_PROPOSER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/speculative/proposer.h"

namespace lgpt {

struct NgramProposerOptions {
  int64_t min_n = 2;  // >= 1
  int64_t max_n = 4;  // >= min_n
};

// Checks min_n >= 1 and max_n >= min_n; errors name the fields under `owner`
// ("NgramProposerOptions", or the caller's own struct) and carry them.
absl::Status ValidateNgramSizes(int64_t min_n, int64_t max_n, absl::string_view owner,
                                absl::string_view min_name = "min_n",
                                absl::string_view max_name = "max_n");

class NgramProposer : public Proposer {
 public:
  static absl::StatusOr<std::unique_ptr<NgramProposer>> Create(const NgramProposerOptions& options);

  // The k tokens (fewer where the context ends sooner) after the latest earlier match of the
  // longest suffix of length in [min_n, max_n] that occurs before; none without a match.
  // O(context · (max_n - min_n + 1) · max_n) compares at worst; stateless.
  absl::StatusOr<Proposal> Propose(absl::Span<const int64_t> context, int64_t k) override;
  std::string DebugName() const override;

 private:
  explicit NgramProposer(const NgramProposerOptions& options) : options_(options) {}
  NgramProposerOptions options_;
};

}  // namespace lgpt

#endif  // LGPT_CORE_SPECULATIVE_NGRAM_PROPOSER_H_
