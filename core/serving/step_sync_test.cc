// The step messages round-trip, and malformed bytes (truncated, a count past the end, bytes
// left over, mismatched lists) are refused instead of read past.
#include "core/serving/step_sync.h"

#include <gtest/gtest.h>

#include <string>

namespace lgpt {
namespace {

StepPlan SamplePlan() {
  StepPlan plan;
  plan.stop = true;
  plan.cancelled = {3, 9};
  ReplicaRequest a;
  a.id = 7;
  a.group = 6;
  a.prompt = {1, 2, 3, 40000};
  a.max_new_tokens = 12;
  a.prefill_chunk = 5;
  a.start_position = 2;
  a.adapter = 1;
  a.cache_recipe = std::string("{\"policy\":\"h2o\"}\0tail", 22);
  ReplicaRequest b;
  b.id = 8;
  plan.arrivals = {a, b};
  plan.proposals = {{8, {4, 5, 6}}, {3, {}}};
  return plan;
}

TEST(StepSyncTest, PlansAndTokensRoundTrip) {
  const StepPlan plan = SamplePlan();
  absl::StatusOr<StepPlan> back = DecodeStepPlan(EncodeStepPlan(plan));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->stop);
  EXPECT_EQ(back->cancelled, plan.cancelled);
  ASSERT_EQ(back->arrivals.size(), 2u);
  const ReplicaRequest& a = back->arrivals[0];
  EXPECT_EQ(a.id, 7u);
  EXPECT_EQ(a.group, 6);
  EXPECT_EQ(a.prompt, plan.arrivals[0].prompt);
  EXPECT_EQ(a.max_new_tokens, 12);
  EXPECT_EQ(a.prefill_chunk, 5);
  EXPECT_EQ(a.start_position, 2);
  EXPECT_EQ(a.adapter, 1);
  EXPECT_EQ(a.cache_recipe, plan.arrivals[0].cache_recipe);
  EXPECT_EQ(back->arrivals[1].id, 8u);
  EXPECT_EQ(back->arrivals[1].group, -1);
  ASSERT_EQ(back->proposals.size(), 2u);
  EXPECT_EQ(back->proposals[0].id, 8u);
  EXPECT_EQ(back->proposals[0].tokens, (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(back->proposals[1].id, 3u);
  EXPECT_TRUE(back->proposals[1].tokens.empty());

  StepTokens tokens;
  tokens.ids = {7, 8, 9};
  tokens.tokens = {11, -1, 4, 5, 6};
  tokens.counts = {1, 1, 3};  // a speculative request's verified block of three
  tokens.done = {0, 1, 0};
  absl::StatusOr<StepTokens> tokens_back = DecodeStepTokens(EncodeStepTokens(tokens));
  ASSERT_TRUE(tokens_back.ok()) << tokens_back.status();
  EXPECT_EQ(tokens_back->ids, tokens.ids);
  EXPECT_EQ(tokens_back->tokens, tokens.tokens);
  EXPECT_EQ(tokens_back->done, tokens.done);
  EXPECT_EQ(tokens_back->counts, tokens.counts);
  // Without counts: one token each.
  StepTokens plain;
  plain.ids = {1, 2};
  plain.tokens = {5, 6};
  plain.done = {0, 0};
  absl::StatusOr<StepTokens> plain_back = DecodeStepTokens(EncodeStepTokens(plain));
  ASSERT_TRUE(plain_back.ok()) << plain_back.status();
  EXPECT_EQ(plain_back->counts, (std::vector<int64_t>{1, 1}));
  // Counts that do not add up to the tokens are refused.
  StepTokens miscounted = tokens;
  miscounted.counts = {1, 1, 2};
  EXPECT_FALSE(DecodeStepTokens(EncodeStepTokens(miscounted)).ok());
}

TEST(StepSyncTest, MalformedMessagesAreRefused) {
  const std::string bytes = EncodeStepPlan(SamplePlan());
  for (size_t cut : {size_t{0}, size_t{5}, size_t{8}, bytes.size() / 2, bytes.size() - 1}) {
    EXPECT_FALSE(DecodeStepPlan(bytes.substr(0, cut)).ok()) << cut;
  }
  EXPECT_FALSE(DecodeStepPlan(bytes + "x").ok());
  std::string huge = bytes;
  huge[15] = '\x7f';  // the cancelled list's count, far past the end
  EXPECT_FALSE(DecodeStepPlan(huge).ok());
  StepTokens uneven;
  uneven.ids = {1, 2};
  uneven.tokens = {3};
  uneven.done = {0, 0};
  EXPECT_FALSE(DecodeStepTokens(EncodeStepTokens(uneven)).ok());
}

}  // namespace
}  // namespace lgpt
