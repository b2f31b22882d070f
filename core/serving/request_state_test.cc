#include "core/serving/request_state.h"

#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace lgpt {
namespace {

using S = RequestState;

const std::vector<S> kAll = {S::kWaiting,  S::kAdmitted,  S::kPrefilling, S::kDecoding,
                             S::kSampling, S::kPreempted, S::kFinished};
const std::vector<S> kRunning = {S::kAdmitted, S::kPrefilling, S::kDecoding, S::kSampling};

// Whether every consecutive pair of `path` is a transition.
::testing::AssertionResult IsPath(const std::vector<S>& path) {
  for (size_t i = 1; i < path.size(); ++i) {
    if (!IsRequestTransition(path[i - 1], path[i])) {
      return ::testing::AssertionFailure() << RequestStateName(path[i - 1]) << " -> "
                                           << RequestStateName(path[i]) << " is not allowed";
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(RequestStateTest, ThePathsOfTheSchedulerAreTransitions) {
  // Prefill, three tokens sampled, the last one ends it.
  EXPECT_TRUE(IsPath({S::kWaiting, S::kAdmitted, S::kPrefilling, S::kSampling, S::kDecoding,
                      S::kSampling, S::kDecoding, S::kSampling, S::kFinished}));
  // Preempted while decoding: prefilled again, its generated tokens replayed, then sampled on.
  EXPECT_TRUE(IsPath({S::kWaiting, S::kAdmitted, S::kPrefilling, S::kSampling, S::kDecoding,
                      S::kPreempted, S::kWaiting, S::kAdmitted, S::kPrefilling, S::kDecoding,
                      S::kDecoding, S::kSampling, S::kDecoding}));
  // The prefix cache held the whole prompt of a preempted request: it replays at once.
  EXPECT_TRUE(IsPath({S::kPreempted, S::kWaiting, S::kAdmitted, S::kDecoding, S::kSampling}));
  // Cancelled in the queue; max_new_tokens = 0 ends at the prompt.
  EXPECT_TRUE(IsPath({S::kWaiting, S::kFinished}));
  EXPECT_TRUE(IsPath({S::kWaiting, S::kAdmitted, S::kPrefilling, S::kFinished}));
}

TEST(RequestStateTest, EveryRunningStateCanBePreemptedOrEnd) {
  for (S state : kRunning) {
    EXPECT_TRUE(IsRequestTransition(state, S::kPreempted)) << RequestStateName(state);
    EXPECT_TRUE(IsRequestTransition(state, S::kFinished)) << RequestStateName(state);
    // Back to the queue only through a preemption.
    EXPECT_FALSE(IsRequestTransition(state, S::kWaiting)) << RequestStateName(state);
  }
}

TEST(RequestStateTest, FinishedIsFinalAndPreemptedOnlyRequeues) {
  for (S to : kAll) {
    EXPECT_FALSE(IsRequestTransition(S::kFinished, to)) << RequestStateName(to);
    EXPECT_EQ(IsRequestTransition(S::kPreempted, to), to == S::kWaiting) << RequestStateName(to);
  }
}

TEST(RequestStateTest, NoPhaseIsSkipped) {
  // A waiting request has no cache set up: it is admitted first.
  EXPECT_FALSE(IsRequestTransition(S::kWaiting, S::kPrefilling));
  EXPECT_FALSE(IsRequestTransition(S::kWaiting, S::kDecoding));
  EXPECT_FALSE(IsRequestTransition(S::kWaiting, S::kPreempted));
  // Logits come from a forward pass: never straight from admission, nor twice without a feed.
  EXPECT_FALSE(IsRequestTransition(S::kAdmitted, S::kSampling));
  EXPECT_FALSE(IsRequestTransition(S::kSampling, S::kSampling));
  // The prompt is never prefilled again without a preemption.
  EXPECT_FALSE(IsRequestTransition(S::kDecoding, S::kPrefilling));
  EXPECT_FALSE(IsRequestTransition(S::kSampling, S::kPrefilling));
}

TEST(RequestStateTest, NamesAreDistinct) {
  std::set<std::string> names;
  for (S state : kAll) names.insert(std::string(RequestStateName(state)));
  EXPECT_EQ(names.size(), kAll.size());
  EXPECT_EQ(RequestStateName(S::kPrefilling), "prefilling");
}

}  // namespace
}  // namespace lgpt
