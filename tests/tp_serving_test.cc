// Serving over tensor-parallel ranks (core/serving/step_sync.h): mixed requests through an
// engine over two local ranks give the tokens of one process, a pool sized from free memory is
// the same on every rank, and a rank that dies fails the request in flight within the
// collectives' timeout instead of hanging.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/dist/launcher.h"
#include "core/dist/test_util.h"

namespace lgpt {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kWorker[] = "tests/tp_serving_test_worker";

absl::StatusOr<RanksRun> RunWorker(const std::string& mode) {
  LaunchSpec spec;
  spec.world_size = 2;
  spec.executable = kWorker;
  spec.argv = {kWorker, mode};
  spec.timeout = absl::Seconds(240);
  spec.stop_on_failure = false;
  spec.env = {{"OMP_NUM_THREADS", "1"}};
  return RunRanks(spec);
}

TEST(TpServingTest, MixedRequestsOverTwoRanksEqualOneProcess) {
  absl::StatusOr<RanksRun> run = RunWorker("serving");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->out << run->err;
  EXPECT_THAT(run->out, HasSubstr("tools/default_model serving equal"));
  EXPECT_THAT(run->out, Not(HasSubstr("DIFFERENT")));
  // The mix reached the paths it is for.
  EXPECT_THAT(run->out, Not(HasSubstr("prefix_hits=0 ")));
  EXPECT_THAT(run->out, Not(HasSubstr("forked_choices=0")));
  EXPECT_THAT(run->out, Not(HasSubstr("preemptions=0 ")));
  EXPECT_THAT(run->out, Not(HasSubstr("accepted_tokens=0\n")));  // speculative rows verified
  EXPECT_THAT(run->err, HasSubstr("follower: OK"));
}

TEST(TpServingTest, EveryGoldenFamilyOverTwoRanksEqualsOneProcess) {
  absl::StatusOr<RanksRun> run = RunWorker("golden");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->out << run->err;
  EXPECT_THAT(run->out, Not(HasSubstr("DIFFERENT")));
  for (const char* family :
       {"pythia", "llama2", "llama3_gqa", "falcon", "gemma2", "gemma3", "interleave", "linear_rope",
        "llama31_yarn", "mixtral", "olmo2", "phi2", "qwen25", "qwen3", "stablelm"}) {
    EXPECT_THAT(run->out, HasSubstr(absl::StrCat(family, " serving equal"))) << run->out;
  }
}

// EngineOptions.kv_pool_memory_fraction over the ranks: each rank's free memory differs, their
// pools may not; every rank takes the least rank's share.
TEST(TpServingTest, APoolFromFreeMemoryIsTheSameOnEveryRank) {
  absl::StatusOr<RanksRun> run = RunWorker("memory_fraction");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->out << run->err;
  std::vector<int64_t> pools;
  for (size_t at = run->err.find("kv_pool_bytes="); at != std::string::npos;
       at = run->err.find("kv_pool_bytes=", at + 1)) {
    pools.push_back(std::stoll(run->err.substr(at + 14)));
  }
  ASSERT_EQ(pools.size(), 2u) << run->err;
  EXPECT_GT(pools[0], 0);
  EXPECT_EQ(pools[0], pools[1]) << run->err;
  EXPECT_THAT(run->out, HasSubstr("served 6 tokens")) << run->out << run->err;
  EXPECT_THAT(run->err, HasSubstr("follower: OK"));
}

TEST(TpServingTest, ARankThatDiesFailsTheRequestInFlight) {
  absl::StatusOr<RanksRun> run = RunWorker("rank_dies");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_THAT(run->out, HasSubstr("request failed after")) << run->out << run->err;
  EXPECT_THAT(run->out, Not(HasSubstr("later submit: accepted")));
  const size_t at = run->out.find("request failed after ");
  ASSERT_NE(at, std::string::npos);
  EXPECT_LT(std::stod(run->out.substr(at + 21)), 30.0) << run->out;
}

}  // namespace
}  // namespace lgpt
