// What speculative decoding's proposers implement (core/speculative/README.md): given a
// request's tokens so far, guess the next few. The model then verifies every guess in one
// forward pass (core/model/generate.h; NextTokenChooser::Verify decides), so a proposer only
// changes how fast tokens come, never which: a bad guess costs the compute of verifying it.
//
// One proposer serves one request (or one conversation) at a time: it may keep state between
// calls, such as a draft model's KV cache, and it sees the whole context every call, so it
// catches up on what the model accepted (and forgets what it rejected) by comparing contexts.
//
//   ASSIGN_OR_RETURN(Proposal proposal, proposer.Propose(context, /*k=*/4));
//
// Proposers that share work (draft proposers over one draft model) propose for many requests
// at once through ProposeAll (core/speculative/propose_batch.h): those with the same
// batch_key() run as one batch, each proposing what it would alone.
#ifndef LGPT_CORE_SPECULATIVE_PROPOSER_H_
#define LGPT_CORE_SPECULATIVE_PROPOSER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace lgpt {

struct Proposal {
  std::vector<int64_t> tokens;  // at most k
  // Per token, the distribution the proposer drew it from: probabilities over the vocabulary
  // (ids past a row's end have probability 0). Empty: every token was chosen deterministically
  // (greedy drafts, look-ups), a point mass at it.
  std::vector<std::vector<float>> probabilities;
};

class Proposer;

// One request's part of a batched call (ProposeAll, Proposer::ProposeTogether): its proposer,
// the request's tokens so far and how many to propose, as Propose(context, k) takes them.
struct ProposalTask {
  Proposer* proposer = nullptr;  // not owned
  absl::Span<const int64_t> context;
  int64_t k = 0;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  // Up to `k` (>= 1) tokens likely to follow `context`: the request's tokens so far (the
  // prompt, earlier turns included, and every token generated), all of them the model's own.
  // No tokens when it has no guess (the step then decodes one token as usual).
  virtual absl::StatusOr<Proposal> Propose(absl::Span<const int64_t> context, int64_t k) = 0;
  // "ngram(2..4)", "draft(NAME)".
  virtual std::string DebugName() const = 0;

  // Proposers with the same non-null key may propose together (ProposeTogether): a draft
  // proposer's key is its draft model, so every request drafting with one model shares its
  // forward passes. nullptr (the default): this one proposes alone.
  virtual const void* batch_key() const { return nullptr; }

  // Proposes for `tasks` at once, called on one of their proposers: each task's proposer
  // distinct and with this one's batch_key(). Results in task order, each what that proposer's
  // own Propose(context, k) would return, leaving it as that call would. An error in one task
  // fails only that task where the others can go on. ProposeAll calls it; the default runs
  // each task's Propose in turn.
  virtual std::vector<absl::StatusOr<Proposal>> ProposeTogether(
      absl::Span<const ProposalTask> tasks) {
    std::vector<absl::StatusOr<Proposal>> proposals;
    proposals.reserve(tasks.size());
    for (const ProposalTask& task : tasks) {
      proposals.push_back(task.proposer->Propose(task.context, task.k));
    }
    return proposals;
  }
};

}  // namespace lgpt

#endif  // LGPT_CORE_SPECULATIVE_PROPOSER_H_
