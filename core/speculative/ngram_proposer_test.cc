// Prompt lookup: the latest earlier match of the longest suffix in range, what followed it,
// clipped at the context's end and at k; nothing without a match; the options' checks.
#include "core/speculative/ngram_proposer.h"

#include <vector>

#include "core/base/status_field.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

std::vector<int64_t> Propose(int64_t min_n, int64_t max_n, const std::vector<int64_t>& context,
                             int64_t k) {
  absl::StatusOr<std::unique_ptr<NgramProposer>> proposer = NgramProposer::Create({min_n, max_n});
  EXPECT_TRUE(proposer.ok()) << proposer.status();
  absl::StatusOr<Proposal> proposal = (*proposer)->Propose(context, k);
  EXPECT_TRUE(proposal.ok()) << proposal.status();
  EXPECT_TRUE(proposal->probabilities.empty());  // look-ups are point masses
  return proposal->tokens;
}

TEST(NgramProposerTest, ProposesWhatFollowedTheLatestEarlierMatch) {
  // [1 2] occurs at 0 and 3; the latest earlier one is followed by 8, 1, 2.
  EXPECT_EQ(Propose(2, 2, {1, 2, 7, 1, 2, 8, 1, 2}, 3), (std::vector<int64_t>{8, 1, 2}));
  EXPECT_EQ(Propose(2, 2, {1, 2, 7, 1, 2, 8, 1, 2}, 1), (std::vector<int64_t>{8}));
}

TEST(NgramProposerTest, TriesTheLongestSuffixFirst) {
  // The suffix [5 3] matches at 0 (then 1, 8); [3] alone matches later, at 4 (then 2, 5).
  const std::vector<int64_t> context = {5, 3, 1, 8, 3, 2, 5, 3};
  EXPECT_EQ(Propose(1, 2, context, 2), (std::vector<int64_t>{1, 8}));
  EXPECT_EQ(Propose(1, 1, context, 2), (std::vector<int64_t>{2, 5}));
  // Longer suffixes that never occurred before fall back to shorter ones.
  EXPECT_EQ(Propose(2, 4, context, 2), (std::vector<int64_t>{1, 8}));
}

TEST(NgramProposerTest, ClipsAtTheContextsEndAndFindsNothingWithoutAMatch) {
  EXPECT_EQ(Propose(1, 1, {4, 4, 4}, 5), (std::vector<int64_t>{4}));  // after the match at 1
  EXPECT_TRUE(Propose(1, 3, {1, 2, 3, 4}, 4).empty());
  EXPECT_TRUE(Propose(2, 3, {1, 2}, 4).empty());  // too short to hold an earlier match
  EXPECT_TRUE(Propose(1, 3, {}, 4).empty());
  EXPECT_TRUE(Propose(1, 3, {1, 1}, 0).empty());
}

TEST(NgramProposerTest, BadSizesNameTheirField) {
  EXPECT_EQ(ErrorField(NgramProposer::Create({0, 2}).status()), "NgramProposerOptions.min_n");
  EXPECT_EQ(ErrorField(NgramProposer::Create({3, 2}).status()), "NgramProposerOptions.max_n");
  EXPECT_EQ((*NgramProposer::Create({2, 4}))->DebugName(), "ngram(2..4)");
}

}  // namespace
}  // namespace lgpt
