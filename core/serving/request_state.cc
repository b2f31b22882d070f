#include "core/serving/request_state.h"

namespace lgpt {
namespace {

bool IsRunning(RequestState state) {
  switch (state) {
    case RequestState::kAdmitted:
    case RequestState::kPrefilling:
    case RequestState::kDecoding:
    case RequestState::kSampling:
      return true;
    default:
      return false;
  }
}

}  // namespace

bool IsRequestTransition(RequestState from, RequestState to) {
  using S = RequestState;
  if (IsRunning(from) && (to == S::kPreempted || to == S::kFinished)) return true;
  switch (from) {
    case S::kWaiting:
      return to == S::kAdmitted || to == S::kFinished;
    case S::kAdmitted:
      return to == S::kPrefilling || to == S::kDecoding;
    case S::kPrefilling:
      return to == S::kDecoding || to == S::kSampling;
    case S::kDecoding:
      return to == S::kDecoding || to == S::kSampling;
    case S::kSampling:
      return to == S::kDecoding;
    case S::kPreempted:
      return to == S::kWaiting;
    case S::kFinished:
      return false;
  }
  return false;
}

absl::string_view RequestStateName(RequestState state) {
  switch (state) {
    case RequestState::kWaiting:
      return "waiting";
    case RequestState::kAdmitted:
      return "admitted";
    case RequestState::kPrefilling:
      return "prefilling";
    case RequestState::kDecoding:
      return "decoding";
    case RequestState::kSampling:
      return "sampling";
    case RequestState::kPreempted:
      return "preempted";
    case RequestState::kFinished:
      return "finished";
  }
  return "unknown";
}

}  // namespace lgpt
