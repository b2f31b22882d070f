// A draft model proposes (Leviathan et al. 2023; Chen et al. 2023): a second, smaller GPT
// with the same tokenizer runs k decode steps through its own KV cache ahead of the model. It
// catches up on what the model accepted and forgets what it rejected by comparing each call's
// context with the tokens its cache holds: the common prefix stays (the cache truncated to it,
// KVRollback), the rest is prefilled. Greedy by default (each proposal the draft's argmax: a
// point mass); with sampling options it draws from its own distribution and reports it, so
// that the model accepts with min(1, p / q).
//
// Draft proposers over one draft model propose together (ProposeTogether; ProposeAll in
// core/speculative/propose_batch.h): every request's catch-up in one forward pass, then each
// decode step one pass over all the requests still proposing, every weight read once for all.
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
  // OutOfRange naming ProposalTask.context for a token past the draft's padded vocabulary.
  absl::StatusOr<Proposal> Propose(absl::Span<const int64_t> context, int64_t k) override;
  std::string DebugName() const override;

  // The draft model: proposers over the same draft propose together.
  const void* batch_key() const override { return draft_.get(); }
  // For DraftModelProposers over this one's draft (InvalidArgument naming ProposalTask.proposer
  // for other proposers, and for one given twice): each task's catch-up (the common prefix
  // kept, the cache truncated, the rest fed) as one ForwardChunks pass over every task's cache
  // (one pass per prefill_chunk tokens where a proposer catches up in chunks), then its decode
  // steps as ForwardChunks passes of one token per task, each task dropping out at its own k
  // or its draft context's end. Sampled drafts draw with their own generators in the order
  // they would alone, so each task gets what its Propose would (up to the rounding of batched
  // matrix products: core/model/batch_forward.h). A task that fails validation fails alone; a
  // failed pass is run again one task at a time, failing only the tasks that fail alone.
  std::vector<absl::StatusOr<Proposal>> ProposeTogether(
      absl::Span<const ProposalTask> tasks) override;

  // Tokens the draft's cache holds (the last context and the proposals fed back), for tests.
  const std::vector<int64_t>& cached() const { return cached_; }
  // Tokens the draft has run through its model (prefill and decode), for tests and statistics.
  int64_t draft_tokens() const { return draft_tokens_; }

 private:
  struct Member;  // a task of ProposeTogether (draft_model_proposer.cc)

  DraftModelProposer(GPT draft, int64_t vocab, const DraftModelProposerOptions& options,
                     std::unique_ptr<DenseKVCache> cache);
  // Readies a call: the tokens it will propose (k capped at max_k and the draft's context; 0:
  // none, and nothing changes), with the context's tokens checked and the cache truncated to
  // the prefix it shares with the context (all but the context's last token at most).
  absl::StatusOr<int64_t> Begin(absl::Span<const int64_t> context, int64_t k);
  // Runs `tokens` through the draft after what it holds; returns the last one's logits [1, V].
  absl::StatusOr<at::Tensor> Feed(absl::Span<const int64_t> tokens);
  // The draft's token from logits [.., V], and its distribution when it samples.
  absl::StatusOr<int64_t> Pick(const at::Tensor& logits, std::vector<float>* probabilities);
  // The same from a host float32 row of at least vocab_ logits.
  absl::StatusOr<int64_t> PickRow(const float* values, std::vector<float>* probabilities);
  // Runs members[j]'s `tokens[j]` after what its cache holds, all in one ForwardChunks pass
  // over `draft`; sets each member's row to its last token's logits, or its status to the
  // error. A failed pass of several runs again one member at a time, each cache first
  // truncated back to what it held (a ring that cannot: reset, the member failed).
  static void FeedTogether(GPTImpl& draft, absl::Span<Member* const> members,
                           absl::Span<const absl::Span<const int64_t>> tokens);

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
