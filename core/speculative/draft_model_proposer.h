// A draft model proposes (Leviathan et al. 2023; Chen et al. 2023): a second, smaller GPT
// with the same tokenizer runs k decode steps through its own KV cache ahead of the model. It
// catches up on what the model accepted and forgets what it rejected by comparing each call's
// context with the tokens its cache holds: the common prefix stays (the cache truncated to it,
// KVRollback), the rest is prefilled. Greedy by default (each proposal the draft's argmax: a
// point mass); with sampling options it draws from its own distribution and reports it, so
// that the model accepts with min(1, p / q).
#ifndef LGPT_CORE_SPECULATIVE_DRAFT_MODEL_PROPOSER_H_
#define LGPT_CORE_SPECULATIVE_DRAFT_MODEL_PROPOSER_H_

#include <ATen/core/Generator.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cache/dense_kv_cache.h"
#include "core/config/config.h"
#include "core/model/gpt.h"
#include "core/model/sampling.h"
#include "core/speculative/proposer.h"

namespace lgpt {

// Whether `draft` can propose tokens for `target`: the same vocab_size (ids mean the same
// tokens; the tokenizer files themselves are the loader's check, lgpt.h). InvalidArgument
// naming `field` (the caller's name for the draft) otherwise.
absl::Status CheckDraftVocabulary(const Config& target, const Config& draft,
                                  absl::string_view field);

struct DraftModelProposerOptions {
  // How the draft picks a token: greedy (temperature 0: the argmax, a point mass), or drawn
  // from its distribution under these options (top_k, temperature, min_p, top_p; penalties
  // and biases are not applied: the draft's q only has to be known, not equal p).
  SamplingOptions sampling;
  uint64_t seed = 1234;  // the draft's own draws
  // The most tokens a call proposes (sliding-window rings of the draft's cache keep this many
  // slots more, so rejected proposals can be forgotten).
  int64_t max_k = 8;
  int64_t prefill_chunk = 0;  // catching up in chunks of this many tokens; 0: at once
};

class DraftModelProposer : public Proposer {
 public:
  // A proposer over `draft` for `target`'s vocabulary (CheckDraftVocabulary). The draft's
  // context is its block_size: a longer context gets no proposals.
  static absl::StatusOr<std::unique_ptr<DraftModelProposer>> Create(
      GPT draft, const Config& target, const DraftModelProposerOptions& options = {});

  // Up to min(k, max_k) tokens: fewer where the draft's context ends.
  absl::StatusOr<Proposal> Propose(absl::Span<const int64_t> context, int64_t k) override;
  std::string DebugName() const override;

  // Tokens the draft's cache holds (the last context and the proposals fed back), for tests.
  const std::vector<int64_t>& cached() const { return cached_; }
  // Tokens the draft has run through its model (prefill and decode), for tests and statistics.
  int64_t draft_tokens() const { return draft_tokens_; }

 private:
  DraftModelProposer(GPT draft, int64_t vocab, const DraftModelProposerOptions& options,
                     std::unique_ptr<DenseKVCache> cache);
  // Runs `tokens` through the draft after what it holds; returns the last one's logits [1, V].
  absl::StatusOr<at::Tensor> Feed(absl::Span<const int64_t> tokens);
  // The draft's token from logits [.., V], and its distribution when it samples.
  absl::StatusOr<int64_t> Pick(const at::Tensor& logits, std::vector<float>* probabilities);

  GPT draft_;
  int64_t vocab_;  // ids the draft may propose: min(its padded vocabulary, the target's)
  DraftModelProposerOptions options_;
  std::unique_ptr<DenseKVCache> cache_;
  std::vector<int64_t> cached_;
  at::Generator generator_;
  int64_t draft_tokens_ = 0;
};

}  // namespace lgpt

#endif  // LGPT_CORE_SPECULATIVE_DRAFT_MODEL_PROPOSER_H_
