// Data-parallel fine-tuning over Gloo on loopback: each case runs sft_data_parallel_test_worker
// as 2 local ranks through the launcher (tools/sft_trainer.h, core/dist/data_parallel.h).
#include <iostream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/dist/launcher.h"
#include "core/dist/test_util.h"

namespace lgpt {
namespace {

using ::testing::HasSubstr;

constexpr char kWorker[] = "tools/sft_data_parallel_test_worker";

absl::StatusOr<RanksRun> RunWorker(const std::string& mode, bool stop_on_failure = true) {
  LaunchSpec spec;
  spec.world_size = 2;
  spec.executable = kWorker;
  spec.argv = {kWorker, mode};
  spec.timeout = absl::Seconds(120);
  spec.stop_on_failure = stop_on_failure;
  spec.env = {{"OMP_NUM_THREADS", "1"}};
  return RunRanks(spec);
}

// Two ranks with micro-batch 1 end 3 AdamW steps where one process with micro-batch 2 does.
class SftDataParallelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SftDataParallelTest, TwoRanksEqualOneProcessWithTheirMicroBatchesTogether) {
  absl::StatusOr<RanksRun> run = RunWorker("equal:" + GetParam());
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->out << run->err;
  EXPECT_THAT(run->out, HasSubstr(GetParam() + " equal max_param_diff="));
  std::cout << run->out;  // the differences, in the test log
}

INSTANTIATE_TEST_SUITE_P(Methods, SftDataParallelTest,
                         ::testing::Values("full", "lora", "adapter", "adapter_v2"));

TEST(SftDataParallelFaultTest, DifferentSettingsAreRefusedOnEveryRankNamingThem) {
  absl::StatusOr<RanksRun> run = RunWorker("mismatch");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->err;
  EXPECT_EQ(run->out,
            "FAILED_PRECONDITION: ranks disagree on the training options (rank 1 differs from "
            "rank 0): every rank must run the same command on the same data\n");
}

TEST(SftDataParallelFaultTest, AKilledRankFailsTheOtherNamingItWithinTheTimeout) {
  absl::StatusOr<RanksRun> run = RunWorker("rank_dies", /*stop_on_failure=*/false);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 128 + 9) << run->err;  // the launcher reports the first failure
  EXPECT_THAT(run->err, HasSubstr("[launcher] rank 1 was killed by signal 9"));
  // The survivor's own error names the rank, as it would on another host without a launcher.
  EXPECT_THAT(run->err, HasSubstr("[rank 0] error: UNAVAILABLE: rank 0: all-reduce across 2 "
                                  "ranks failed (a rank exited or timed out): rank 1 did not "
                                  "report back within 5s"));
  EXPECT_THAT(run->err, HasSubstr("[launcher] rank 0 exited with status 2"));
  EXPECT_LT(run->elapsed, absl::Seconds(60));
}

}  // namespace
}  // namespace lgpt
