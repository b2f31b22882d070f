#include "core/speculative/propose_batch.h"

#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status_field.h"

namespace lgpt {

std::vector<absl::Status> CheckProposalTasks(absl::Span<const ProposalTask> tasks) {
  std::vector<absl::Status> checks(tasks.size());
  std::unordered_map<const Proposer*, size_t> first;  // a proposer's first task
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (tasks[i].proposer != nullptr) first.emplace(tasks[i].proposer, i);
  }
  for (size_t i = 0; i < tasks.size(); ++i) {
    const Proposer* proposer = tasks[i].proposer;
    if (proposer == nullptr) {
      checks[i] = InvalidFieldError("ProposalTask.proposer",
                                    absl::StrCat("tasks[", i, "]: ProposalTask.proposer is null"));
      continue;
    }
    // Another task with the same proposer: the first one's other, or the first one itself.
    size_t other = first[proposer];
    if (other == i) {
      for (size_t j = i + 1; j < tasks.size(); ++j) {
        if (tasks[j].proposer == proposer) {
          other = j;
          break;
        }
      }
    }
    if (other == i) continue;
    checks[i] = InvalidFieldError(
        "ProposalTask.proposer",
        absl::StrCat("tasks[", i, "]: ProposalTask.proposer (", proposer->DebugName(),
                     ") is tasks[", other,
                     "]'s too: a proposer follows one request, so it proposes for one task a "
                     "call"));
  }
  return checks;
}

std::vector<absl::StatusOr<Proposal>> ProposeAll(absl::Span<const ProposalTask> tasks) {
  std::vector<absl::StatusOr<Proposal>> proposals(tasks.size(), Proposal());
  const std::vector<absl::Status> checks = CheckProposalTasks(tasks);
  // The tasks of each batch key, keys in the order they first appear.
  std::vector<std::pair<const void*, std::vector<size_t>>> groups;
  std::unordered_map<const void*, size_t> group_of;
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (!checks[i].ok()) {
      proposals[i] = checks[i];
      continue;
    }
    const void* key = tasks[i].proposer->batch_key();
    if (key == nullptr) {
      proposals[i] = tasks[i].proposer->Propose(tasks[i].context, tasks[i].k);
      continue;
    }
    const auto [it, added] = group_of.emplace(key, groups.size());
    if (added) groups.emplace_back(key, std::vector<size_t>());
    groups[it->second].second.push_back(i);
  }
  for (const auto& [key, members] : groups) {
    if (members.size() == 1) {
      const ProposalTask& task = tasks[members.front()];
      proposals[members.front()] = task.proposer->Propose(task.context, task.k);
      continue;
    }
    std::vector<ProposalTask> group;
    group.reserve(members.size());
    for (size_t i : members) group.push_back(tasks[i]);
    std::vector<absl::StatusOr<Proposal>> results = group.front().proposer->ProposeTogether(group);
    for (size_t j = 0; j < members.size(); ++j) {
      proposals[members[j]] =
          j < results.size()
              ? std::move(results[j])
              : absl::InternalError(absl::StrCat(group.front().proposer->DebugName(),
                                                 "'s ProposeTogether returned ", results.size(),
                                                 " proposals for ", group.size(), " tasks"));
    }
  }
  return proposals;
}

}  // namespace lgpt
