#include "core/dist/data_parallel.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/dist/launcher.h"
#include "core/dist/test_util.h"

namespace lgpt {
namespace {

using ::testing::HasSubstr;

constexpr char kWorker[] = "core/dist/data_parallel_test_worker";

TEST(ShardOfBatchTest, RankTakesItsContiguousSlice) {
  for (int rank = 0; rank < 4; ++rank) {
    absl::StatusOr<BatchShard> shard = ShardOfBatch(12, rank, 4);
    ASSERT_TRUE(shard.ok()) << shard.status();
    EXPECT_EQ(shard->begin, 3 * rank);
    EXPECT_EQ(shard->size, 3);
  }
  absl::StatusOr<BatchShard> whole = ShardOfBatch(5, 0, 1);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->begin, 0);
  EXPECT_EQ(whole->size, 5);
}

TEST(ShardOfBatchTest, UnevenBatchesAndBadRanksAreErrors) {
  EXPECT_THAT(ShardOfBatch(5, 0, 2).status().message(),
              HasSubstr("a batch of 5 rows does not split evenly into 2 ranks"));
  EXPECT_THAT(ShardOfBatch(4, 2, 2).status().message(), HasSubstr("rank 2 is outside"));
  EXPECT_FALSE(ShardOfBatch(4, 0, 0).ok());
}

TEST(FingerprintTest, StableAndSensitive) {
  // FNV-1a's published value for "a": the same on every host and build.
  EXPECT_EQ(Fingerprint64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_NE(Fingerprint64("n_layer: 2"), Fingerprint64("n_layer: 3"));
  // Pieces in a row fingerprint as their concatenation.
  EXPECT_EQ(Fingerprint64("bc", 2, Fingerprint64("a")), Fingerprint64("abc"));
}

TEST(FingerprintTest, ParametersByNameShapeDtypeAndTraining) {
  at::Tensor w = at::zeros({2, 3});
  at::Tensor b = at::zeros({3}, at::kDouble);
  w.set_requires_grad(true);
  EXPECT_EQ(ParameterFingerprint({{"w", w}, {"b", b}}),
            "w [2,3] Float trained\nb [3] Double frozen\n");
}

TEST(DataParallelTest, OneProcessIsANoOp) {
  std::shared_ptr<ProcessGroup> group = ProcessGroup::Single();
  at::Tensor p = at::ones({3});
  p.set_requires_grad(true);
  p.mutable_grad() = at::full({3}, 2.0);
  GradientAllReducer reducer(group, {{"p", p}});
  ASSERT_TRUE(reducer.AllReduceGradients().ok());
  ASSERT_TRUE(reducer.BroadcastParameters().ok());
  EXPECT_TRUE(at::equal(p.grad(), at::full({3}, 2.0)));
  EXPECT_TRUE(CheckRanksAgree(*group, {{"anything", "x"}}).ok());
  EXPECT_EQ(*SumAcrossRanks(*group, 2.5), 2.5);
  EXPECT_EQ(*GlobalMean(*group, 2.5, 7), 2.5);
  EXPECT_EQ(*BroadcastBytes(*group, "abc"), "abc");
}

absl::StatusOr<RanksRun> RunWorker(int world_size, const std::string& mode) {
  LaunchSpec spec;
  spec.world_size = world_size;
  spec.executable = kWorker;
  spec.argv = {kWorker, mode};
  spec.timeout = absl::Seconds(60);
  return RunRanks(spec);
}

TEST(DataParallelTest, BucketedGradientsAreTheMeanOverRanks) {
  for (int world : {2, 3}) {
    absl::StatusOr<RanksRun> run = RunWorker(world, "reduce");
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->exit_code, 0) << run->err;
    EXPECT_EQ(run->out, absl::StrCat("reduce ok on ", world, " ranks\n"));
  }
}

TEST(DataParallelTest, AgreementAndScalarReductions) {
  absl::StatusOr<RanksRun> run = RunWorker(2, "agree");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->err;
  EXPECT_EQ(run->out, "agree ok on 2 ranks\n");
}

TEST(DataParallelTest, ADifferingConfigIsNamedOnEveryRank) {
  absl::StatusOr<RanksRun> run = RunWorker(3, "disagree");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->err;
  EXPECT_EQ(run->out,
            "FAILED_PRECONDITION: ranks disagree on the model config (rank 2 differs from rank "
            "0): every rank must run the same command on the same data\n");
}

}  // namespace
}  // namespace lgpt
