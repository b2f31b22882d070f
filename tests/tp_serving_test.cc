// Serving over tensor-parallel ranks (core/serving/step_sync.h): mixed requests through an
// engine over two local ranks give the tokens of one process, and a rank that dies fails the
// request in flight within the collectives' timeout instead of hanging.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

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
