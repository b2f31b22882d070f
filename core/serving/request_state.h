// The phase of a request in the serving scheduler (core/serving/scheduler.h), one explicit
// state instead of a set of flags, and the transitions the scheduler may make between them.
//
//   kWaiting    -> kAdmitted    admitted (arrival order, when it fits the pool)
//               -> kFinished    cancelled in the queue, or the scheduler stops
//   kAdmitted   -> kPrefilling  its first prefill turn (cached prefix blocks attached)
//               -> kDecoding    ... when the prefix cache held its whole prompt (a replay)
//   kPrefilling -> kSampling    prompt done, nothing generated yet: its logits are ready
//                               (or copied, with its cache, from the choice that read the
//                               prompt: a fork, scheduler.h)
//               -> kDecoding    prompt done after a preemption: generated tokens to replay
//   kDecoding   -> kDecoding    fed, the next generated token to replay
//               -> kSampling    fed, nothing left to replay: its logits are ready
//   kSampling   -> kDecoding    sampled a token to feed
//   running     -> kFinished    stop token, max_new_tokens, on_token, cancelled or failed
//   running     -> kPreempted   the pool lacks memory: its KV memory is freed
//   kPreempted  -> kWaiting     requeued at the head of the queue at the step's end
// where running is kAdmitted, kPrefilling, kDecoding or kSampling.
//
// kDecoding holds a token to feed in the next forward pass: the one just sampled, or, after a
// preemption, the next generated token replayed (the prompt is prefilled again, then every
// generated token fed one by one). kSampling lasts from a pass until the sampling that follows
// it in the same step. kPreempted and kFinished requests leave the running set at the end of
// the step: preempted ones back to the head of the queue, finished ones to their waiters.
#ifndef LGPT_CORE_SERVING_REQUEST_STATE_H_
#define LGPT_CORE_SERVING_REQUEST_STATE_H_

#include "absl/strings/string_view.h"

namespace lgpt {

enum class RequestState {
  kWaiting,     // in the queue: submitted, or preempted and requeued
  kAdmitted,    // running; its cache is empty until its first prefill turn
  kPrefilling,  // running; prompt tokens left to prefill
  kDecoding,    // running; a token to feed in the next pass (sampled, or replayed)
  kSampling,    // running; the logits of its last position are ready to sample from
  kPreempted,   // its KV memory freed this step; requeued at the step's end
  kFinished,    // done, cancelled or failed; retired at the step's end
};

// Whether the scheduler may move a request from `from` to `to` (the table above); any other
// move is a scheduler bug.
bool IsRequestTransition(RequestState from, RequestState to);

// "waiting", "admitted", ...: for messages.
absl::string_view RequestStateName(RequestState state);

}  // namespace lgpt

#endif  // LGPT_CORE_SERVING_REQUEST_STATE_H_
