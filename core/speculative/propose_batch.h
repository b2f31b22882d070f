// Proposing for many requests at once: the serving engine's step asks every speculative
// request's proposer together, and proposers that share work (Proposer::batch_key: draft
// proposers over one draft model) run as one batch, their forward passes shared
// (DraftModelProposer::ProposeTogether). Each task gets what its proposer's own Propose would
// return, and its proposer ends in the state that call would leave.
//
//   std::vector<ProposalTask> tasks;
//   for (Request& r : speculative) tasks.push_back({r.proposer.get(), r.tokens, r.k});
//   std::vector<absl::StatusOr<Proposal>> proposals = ProposeAll(tasks);  // in task order
#ifndef LGPT_CORE_SPECULATIVE_PROPOSE_BATCH_H_
#define LGPT_CORE_SPECULATIVE_PROPOSE_BATCH_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/speculative/proposer.h"

namespace lgpt {

// Per task: OK, or InvalidArgument naming ProposalTask.proposer where it is null or where the
// same proposer is another task's too (each of those tasks: a proposer's state follows one
// request, so two contexts in one call cannot both be its next).
std::vector<absl::Status> CheckProposalTasks(absl::Span<const ProposalTask> tasks);

// Every task's proposal, in task order: tasks refused by CheckProposalTasks get its error;
// proposers without a batch_key() propose alone (Propose); those sharing one propose together
// (ProposeTogether, once per key, over its tasks in their order). One task's error fails only
// that task where its proposer can go on without it (Proposer::ProposeTogether).
std::vector<absl::StatusOr<Proposal>> ProposeAll(absl::Span<const ProposalTask> tasks);

}  // namespace lgpt

#endif  // LGPT_CORE_SPECULATIVE_PROPOSE_BATCH_H_
