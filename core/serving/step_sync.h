// Serving over tensor-parallel ranks (lockstep replicas): every rank runs the same scheduler
// (core/serving/scheduler.h) over its shard of the model and its share of the KV memory. Rank
// 0, the leader, takes the requests, samples and ends them; at each step it tells the other
// ranks what only it knows, so that their schedulers take the same decisions (admission,
// chunks, preemption, forks: all functions of the same state) and every rank runs the same
// forward pass, whose collectives pair up:
//   - before the step (StepPlan): the requests that arrived since the last step, in arrival
//     order, with what a follower needs to run them (prompt, lengths, adapter, the recipe of
//     its KV cache), the requests cancelled, or the end of serving;
//   - after the forward pass (StepTokens): the token each sampled request got and whether it
//     ended (a stop token, a stop sequence, a client gone: decided by rank 0's callbacks).
// An idle leader still sends a plan every heartbeat, so a follower waiting for one can tell a
// quiet server from a dead leader by the collective's timeout; a failed exchange ends serving
// on every rank with the error.
#ifndef LGPT_CORE_SERVING_STEP_SYNC_H_
#define LGPT_CORE_SERVING_STEP_SYNC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dist/process_group.h"

namespace lgpt {

// What a follower needs to run a request as the leader does.
struct ReplicaRequest {
  uint64_t id = 0;     // the leader's arrival number
  int64_t group = -1;  // the arrival number of its SubmitChoices group's first choice; -1 alone
  std::vector<int64_t> prompt;
  int64_t max_new_tokens = 0;
  int64_t prefill_chunk = 0;
  int64_t start_position = 0;
  int64_t adapter = -1;
  std::string cache_recipe;  // the engine's description of its KV cache (Engine: spec, length)
};

// A speculative request's proposal for this step (the leader's proposer made it; the
// followers verify the same tokens).
struct StepProposal {
  uint64_t id = 0;  // the request's arrival number
  std::vector<int64_t> tokens;
};

struct StepPlan {
  std::vector<ReplicaRequest> arrivals;
  std::vector<uint64_t> cancelled;  // arrival numbers, waiting or running
  bool stop = false;                // serving ends: every request still here is cancelled
  std::vector<StepProposal> proposals;
};

struct StepTokens {
  std::vector<uint64_t> ids;  // the requests sampled this step, in the order they were
  // Per request the tokens it got, end to end: one, or a speculative request's verified block
  // (counts[i] of them; counts empty: one each).
  std::vector<int64_t> tokens;
  std::vector<int64_t> counts;
  std::vector<uint8_t> done;  // 1: the request ended with its last token
};

class StepSync {
 public:
  virtual ~StepSync() = default;
  // Rank 0: sends; the others: receive.
  virtual bool leader() const = 0;
  // The leader's `plan` reaches every rank (the followers' is replaced).
  virtual absl::Status SharePlan(StepPlan& plan) = 0;
  virtual absl::Status ShareTokens(StepTokens& tokens) = 0;
};

// Byte encodings of the messages (exposed for tests); Decode* refuse malformed input with
// InvalidArgument instead of reading past it.
std::string EncodeStepPlan(const StepPlan& plan);
absl::StatusOr<StepPlan> DecodeStepPlan(const std::string& bytes);
std::string EncodeStepTokens(const StepTokens& tokens);
absl::StatusOr<StepTokens> DecodeStepTokens(const std::string& bytes);

// Over a process group: each message is one broadcast of its length and one of its bytes from
// rank 0, with the group's timeout.
std::shared_ptr<StepSync> ProcessGroupStepSync(std::shared_ptr<ProcessGroup> group);

}  // namespace lgpt

#endif  // LGPT_CORE_SERVING_STEP_SYNC_H_
