#include "core/dist/launcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/dist/test_util.h"

namespace lgpt {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

LaunchSpec Shell(int world_size, const std::string& script) {
  LaunchSpec spec;
  spec.world_size = world_size;
  spec.executable = "/bin/sh";
  spec.argv = {"sh", "-c", script};
  spec.timeout = absl::Seconds(60);
  return spec;
}

TEST(LaunchRanksTest, SetsTheEnvironmentAndForwardsRankZerosStdout) {
  absl::StatusOr<RanksRun> run = RunRanks(Shell(
      2, "echo \"out $RANK/$WORLD_SIZE/$LOCAL_RANK $MASTER_ADDR\"; echo \"err $RANK\" >&2"));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->err;
  EXPECT_EQ(run->out, "out 0/2/0 127.0.0.1\n");
  EXPECT_THAT(run->err, HasSubstr("[rank 0] err 0\n"));
  EXPECT_THAT(run->err, HasSubstr("[rank 1] err 1\n"));
}

// Local ranks split the cores between them unless OMP_NUM_THREADS says otherwise.
TEST(LaunchRanksTest, RanksShareTheCoresUnlessOmpNumThreadsIsSet) {
  const char* saved = std::getenv("OMP_NUM_THREADS");
  const std::string restore = saved != nullptr ? saved : "";
  unsetenv("OMP_NUM_THREADS");
  absl::StatusOr<RanksRun> run = RunRanks(Shell(2, "echo \"$OMP_NUM_THREADS\""));
  ASSERT_TRUE(run.ok()) << run.status();
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_EQ(run->out, absl::StrCat(std::max(1, cores / 2), "\n"));
  setenv("OMP_NUM_THREADS", "3", 1);
  run = RunRanks(Shell(2, "echo \"$OMP_NUM_THREADS\""));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->out, "3\n");
  if (saved != nullptr) {
    setenv("OMP_NUM_THREADS", restore.c_str(), 1);
  } else {
    unsetenv("OMP_NUM_THREADS");
  }
}

TEST(LaunchRanksTest, FailingRankFailsTheRunAndNamesIt) {
  absl::StatusOr<RanksRun> run = RunRanks(Shell(3, "exit $((RANK == 2 ? 7 : 0))"));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 7);
  EXPECT_THAT(run->err, HasSubstr("rank 2 exited with status 7"));
}

TEST(LaunchRanksTest, StopsTheOthersPromptlyWhenOneFails) {
  // Rank 1 would sleep for a minute; rank 0's failure must end it within the grace period,
  // even though it ignores SIGTERM.
  LaunchSpec spec = Shell(2, "if [ $RANK = 0 ]; then sleep 0.2; exit 3; fi; "
                             "trap '' TERM; sleep 60");
  spec.grace = absl::Seconds(1);
  absl::StatusOr<RanksRun> run = RunRanks(spec);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 3);
  EXPECT_THAT(run->err, HasSubstr("rank 0 exited with status 3"));
  EXPECT_LT(run->elapsed, absl::Seconds(20));
}

TEST(LaunchRanksTest, TimeoutKillsEveryRank) {
  LaunchSpec spec = Shell(2, "sleep 60");
  spec.timeout = absl::Seconds(1);
  spec.grace = absl::Seconds(1);
  absl::StatusOr<RanksRun> run = RunRanks(spec);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 124);
  EXPECT_THAT(run->err, HasSubstr("timed out"));
  EXPECT_LT(run->elapsed, absl::Seconds(20));
}

TEST(LaunchRanksTest, ExecFailureIsAFailedRun) {
  LaunchSpec spec = Shell(2, "true");
  spec.executable = "/nonexistent/binary";
  absl::StatusOr<RanksRun> run = RunRanks(spec);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 127);
  EXPECT_THAT(run->err, HasSubstr("exec failed"));
}

TEST(LaunchIfRequestedTest, StepsAsideWithRankSetOrOneRank) {
  char arg0[] = "tool";
  char* argv[] = {arg0, nullptr};
  EXPECT_EQ(LaunchIfRequested(1, 1, argv), std::nullopt);
  setenv("RANK", "0", 1);
  EXPECT_EQ(LaunchIfRequested(2, 1, argv), std::nullopt);
  unsetenv("RANK");
}

TEST(FreeLocalPortTest, ReturnsAUsablePort) {
  absl::StatusOr<int> port = FreeLocalPort();
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_GT(*port, 0);
  EXPECT_LT(*port, 65536);
}

}  // namespace
}  // namespace lgpt
