#include "core/dist/process_group.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "core/base/status_field.h"
#include "core/dist/launcher.h"
#include "core/dist/test_util.h"

namespace lgpt {
namespace {

using ::testing::HasSubstr;

constexpr char kWorker[] = "core/dist/process_group_test_worker";

class EnvTest : public ::testing::Test {
 protected:
  void SetUp() override { Clear(); }
  void TearDown() override { Clear(); }
  static void Clear() {
    for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) unsetenv(name);
  }
  static void Set(int rank, int world, const char* addr, const char* port) {
    setenv("RANK", absl::StrCat(rank).c_str(), 1);
    setenv("WORLD_SIZE", absl::StrCat(world).c_str(), 1);
    if (addr) setenv("MASTER_ADDR", addr, 1);
    if (port) setenv("MASTER_PORT", port, 1);
  }
};

TEST_F(EnvTest, NoVariablesIsASingleProcess) {
  absl::StatusOr<DistOptions> options = DistOptionsFromEnv();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->rank, 0);
  EXPECT_EQ(options->world_size, 1);
}

TEST_F(EnvTest, ReadsTorchrunVariables) {
  Set(1, 2, "127.0.0.1", "29555");
  absl::StatusOr<DistOptions> options = DistOptionsFromEnv(absl::Seconds(5));
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->rank, 1);
  EXPECT_EQ(options->world_size, 2);
  EXPECT_EQ(options->master_addr, "127.0.0.1");
  EXPECT_EQ(options->master_port, 29555);
  EXPECT_EQ(options->timeout, absl::Seconds(5));
}

TEST_F(EnvTest, ErrorsNameTheVariable) {
  setenv("RANK", "0", 1);
  EXPECT_THAT(DistOptionsFromEnv().status().message(), HasSubstr("WORLD_SIZE is not set"));
  setenv("WORLD_SIZE", "two", 1);
  EXPECT_THAT(DistOptionsFromEnv().status().message(), HasSubstr("WORLD_SIZE='two'"));
  Set(2, 2, "127.0.0.1", "29555");
  EXPECT_THAT(DistOptionsFromEnv().status().message(), HasSubstr("RANK 2 is outside"));
  Clear();
  Set(0, 2, nullptr, "29555");
  EXPECT_THAT(DistOptionsFromEnv().status().message(), HasSubstr("MASTER_ADDR is not set"));
  Set(0, 2, "127.0.0.1", "70000");
  EXPECT_THAT(DistOptionsFromEnv().status().message(), HasSubstr("MASTER_PORT=70000"));
  unsetenv("MASTER_PORT");
  EXPECT_THAT(DistOptionsFromEnv().status().message(), HasSubstr("MASTER_PORT is not set"));
}

TEST(ProcessGroupTest, WorldSizeOneCollectivesAreNoOps) {
  std::shared_ptr<ProcessGroup> group = ProcessGroup::Single();
  EXPECT_EQ(group->world_size(), 1);
  at::Tensor t = at::arange(4, at::kFloat);
  ASSERT_TRUE(group->AllReduceSum(t).ok());
  ASSERT_TRUE(group->Broadcast(t).ok());
  ASSERT_TRUE(group->Barrier().ok());
  EXPECT_TRUE(at::equal(t, at::arange(4, at::kFloat)));
  absl::StatusOr<at::Tensor> gathered = group->AllGather(t);
  ASSERT_TRUE(gathered.ok());
  EXPECT_TRUE(at::equal(*gathered, t));
}

// One rank of a world whose other ranks never start, with a 1 s timeout: it must give up
// well within 10 s.
absl::StatusOr<std::shared_ptr<ProcessGroup>> CreateAlone(int rank, int world_size, int port) {
  DistOptions options;
  options.rank = rank;
  options.world_size = world_size;
  options.master_port = port;
  options.timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<ProcessGroup>> group = ProcessGroup::Create(options);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  return group;
}

TEST(ProcessGroupTest, RankThatNeverArrivesIsNamedByRankZero) {
  absl::StatusOr<int> port = FreeLocalPort();
  ASSERT_TRUE(port.ok());
  absl::StatusOr<std::shared_ptr<ProcessGroup>> group = CreateAlone(0, 3, *port);
  ASSERT_FALSE(group.ok());
  EXPECT_EQ(group.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(group.status().message(), HasSubstr("ranks 1, 2 of WORLD_SIZE=3 never arrived"));
}

TEST(ProcessGroupTest, UnreachableMasterIsNamedByTheOtherRanks) {
  absl::StatusOr<int> port = FreeLocalPort();
  ASSERT_TRUE(port.ok());
  absl::StatusOr<std::shared_ptr<ProcessGroup>> group = CreateAlone(1, 2, *port);
  ASSERT_FALSE(group.ok());
  EXPECT_THAT(
      group.status().message(),
      HasSubstr(absl::StrCat("rank 1: could not reach rank 0's store at 127.0.0.1:", *port)));
}

TEST(ProcessGroupTest, InvalidOptionsAreRejected) {
  DistOptions options;
  options.rank = 2;
  options.world_size = 2;
  EXPECT_THAT(ProcessGroup::Create(options).status().message(), HasSubstr("RANK 2 is outside"));
}

LaunchSpec Worker(int world_size, const std::string& mode) {
  LaunchSpec spec;
  spec.world_size = world_size;
  spec.executable = kWorker;
  spec.argv = {kWorker, mode};
  spec.timeout = absl::Seconds(60);
  return spec;
}

TEST(ProcessGroupTest, CollectivesAcrossTwoRanks) {
  absl::StatusOr<RanksRun> run = RunRanks(Worker(2, "collectives"));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->err;
  EXPECT_EQ(run->out, "collectives ok on rank 0 of 2\n");
}

TEST(ProcessGroupTest, CollectivesAcrossThreeRanks) {
  absl::StatusOr<RanksRun> run = RunRanks(Worker(3, "collectives"));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->err;
  EXPECT_EQ(run->out, "collectives ok on rank 0 of 3\n");
}

// "auto" takes NCCL for a GPU and Gloo otherwise; other names are refused naming the flag.
TEST(ProcessGroupTest, BackendNames) {
  const c10::Device cpu(c10::kCPU), cuda(c10::kCUDA, 0);
  EXPECT_EQ(*ParseDistBackend("auto", cpu, "--tp_backend"), DistBackend::kGloo);
  EXPECT_EQ(*ParseDistBackend("auto", cuda, "--tp_backend"), DistBackend::kNccl);
  EXPECT_EQ(*ParseDistBackend("gloo", cuda, "--tp_backend"), DistBackend::kGloo);
  EXPECT_EQ(*ParseDistBackend("nccl", cpu, "--tp_backend"), DistBackend::kNccl);
  const absl::StatusOr<DistBackend> mpi = ParseDistBackend("mpi", cpu, "--tp_backend");
  ASSERT_FALSE(mpi.ok());
  EXPECT_EQ(mpi.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorField(mpi.status()).value_or(""), "--tp_backend");
}

// An NCCL group where this build has no NCCL or the process no GPU (or fewer GPUs than local
// ranks) is refused before any rendezvous, naming DistOptions.backend; where NCCL is available,
// it is valid.
TEST(ProcessGroupTest, NcclNeedsNcclAndAGpuPerLocalRank) {
  DistOptions options;
  options.world_size = 2;
  options.backend = DistBackend::kNccl;
  const absl::Status valid = ValidateDistOptions(options);
  if (NcclAvailable()) {
    EXPECT_TRUE(valid.ok()) << valid;
  } else {
    EXPECT_EQ(valid.code(), absl::StatusCode::kFailedPrecondition) << valid;
    EXPECT_EQ(ErrorField(valid).value_or(""), "DistOptions.backend");
    const absl::StatusOr<std::shared_ptr<ProcessGroup>> group = ProcessGroup::Create(options);
    EXPECT_EQ(group.status().code(), absl::StatusCode::kFailedPrecondition);
  }
  options.world_size = 1;  // one process moves nothing
  EXPECT_TRUE(ValidateDistOptions(options).ok());
}

// On two or more GPUs: collectives over NCCL on each rank's GPU, and CPU tensors over Gloo
// beside them in the same group.
TEST(ProcessGroupTest, CollectivesOverNcclAcrossTwoGpus) {
  if (!NcclAvailable()) GTEST_SKIP() << "skipped: no NCCL or no CUDA device";
  if (at::getNumGPUs() < 2) GTEST_SKIP() << "skipped: fewer than 2 GPUs";
  absl::StatusOr<RanksRun> run = RunRanks(Worker(2, "collectives_nccl"));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->err;
  EXPECT_EQ(run->out, "collectives ok on rank 0 of 2\n");
}

TEST(ProcessGroupTest, DeadPeerFailsTheSurvivorWithinTheTimeout) {
  LaunchSpec spec = Worker(2, "peer_dies");
  spec.stop_on_failure = false;  // rank 0 must notice on its own
  absl::StatusOr<RanksRun> run = RunRanks(spec);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_NE(run->exit_code, 0);
  EXPECT_THAT(run->err, HasSubstr("rank 1 exited with status 3"));
  EXPECT_THAT(run->err, HasSubstr("[rank 0] error: UNAVAILABLE: rank 0: all-reduce across 2 "
                                  "ranks failed (a rank exited or timed out)"));
  // The survivor names the dead rank itself (the launcher's line aside, which torchrun-style
  // runs on several hosts do not have).
  EXPECT_THAT(run->err, HasSubstr("[rank 0] error: UNAVAILABLE: rank 0: all-reduce across 2 "
                                  "ranks failed (a rank exited or timed out): rank 1 did not "
                                  "report back within 5s (exited, killed or hung); gloo: "));
  // The worker's timeout is 10 s; the failure must come well before the launcher's 60 s.
  EXPECT_LT(run->elapsed, absl::Seconds(30));
}

}  // namespace
}  // namespace lgpt
