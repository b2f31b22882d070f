// Tensor-parallel inference over Gloo on loopback (and over NCCL where two GPUs are): each
// case runs tensor_parallel_test_worker as 2 (or more) local ranks through the launcher.
#include <ATen/Context.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "core/dist/launcher.h"
#include "core/dist/process_group.h"
#include "core/dist/test_util.h"

namespace lgpt {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kWorker[] = "tests/tensor_parallel_test_worker";

absl::StatusOr<RanksRun> RunWorker(int world_size, const std::string& mode,
                                   bool stop_on_failure = true) {
  LaunchSpec spec;
  spec.world_size = world_size;
  spec.executable = kWorker;
  spec.argv = {kWorker, mode};
  spec.timeout = absl::Seconds(240);
  spec.stop_on_failure = stop_on_failure;
  spec.env = {{"OMP_NUM_THREADS", "1"}};
  return RunRanks(spec);
}

TEST(TensorParallelTest, EveryPresetMatchesOneProcessOrIsRefusedNamingTheField) {
  absl::StatusOr<RanksRun> run = RunWorker(2, "presets");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->out << run->err;
  EXPECT_THAT(run->out, Not(HasSubstr("DIFFERENT")));
  // A refusal names the field that does not divide (or the unsupported feature).
  for (absl::string_view line : absl::StrSplit(run->out, '\n')) {
    if (!absl::StrContains(line, " refused: ")) continue;
    const bool named = absl::StrContains(line, "UNIMPLEMENTED") ||
                       absl::StrContains(line, "INVALID_ARGUMENT: n_head (") ||
                       absl::StrContains(line, "INVALID_ARGUMENT: n_query_groups (") ||
                       absl::StrContains(line, "INVALID_ARGUMENT: intermediate_size (") ||
                       absl::StrContains(line, "INVALID_ARGUMENT: moe_intermediate_size (");
    EXPECT_TRUE(named) << line;
  }
  // Families from the golden set and beyond must be among the matches.
  for (const char* family :
       {"pythia-14m equal", "Llama-2-7b-hf equal", "Gemma-2-2b equal", "Gemma-3-4b-it equal",
        "Mixtral-8x7B-v0.1 equal", "phi-2 equal", "Qwen3-30B-A3B equal", "OLMo-2-1124-7B equal"}) {
    EXPECT_THAT(run->out, HasSubstr(family));
  }
  const size_t summary = run->out.find("summary: ");
  ASSERT_NE(summary, std::string::npos) << run->out;
  int equal = 0;
  ASSERT_TRUE(absl::SimpleAtoi(
      run->out.substr(summary + 9, run->out.find(' ', summary + 9) - summary - 9), &equal));
  EXPECT_GT(equal, 50) << run->out;
}

TEST(TensorParallelTest, FewerKvGroupsThanRanksAreReplicated) {
  // Shrunk, these have 4 query heads in 2 groups: 4 ranks hold one head each and a copy of
  // the group it reads.
  absl::StatusOr<RanksRun> run =
      RunWorker(4, "presets:Gemma-2-2b,Gemma-3-4b-it,Qwen3-0.6B,Falcon3-1B-Base");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->out << run->err;
  EXPECT_THAT(run->out, HasSubstr("Gemma-3-4b-it equal"));
  EXPECT_THAT(run->out, HasSubstr("heads=1/4 kv_groups=1/2"));
  // Scoring caches combine the copies' scores: the same evictions, the same tokens.
  EXPECT_THAT(run->out, HasSubstr("Qwen3-0.6B greedy h2o budget=6 equal"));
  EXPECT_THAT(run->out, HasSubstr("Qwen3-0.6B greedy tova budget=6 equal"));
  EXPECT_THAT(run->out, Not(HasSubstr("DIFFERENT")));
  EXPECT_THAT(run->out, HasSubstr("summary: 4 equal, 0 refused"));
}

TEST(TensorParallelTest, BlockQuantisedWeightsMatchOneProcessQuantised) {
  for (const char* mode : {"default_model:int8", "default_model:int4"}) {
    absl::StatusOr<RanksRun> run = RunWorker(2, mode);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->exit_code, 0) << run->out << run->err;
    EXPECT_THAT(run->out, HasSubstr("logits equal"));
    EXPECT_THAT(run->out, HasSubstr("greedy dense bits=16 equal"));
    EXPECT_THAT(run->out, HasSubstr("greedy h2o budget=24 bits=16 equal"));
    // The default model's 4 layers: attn.proj and mlp.proj each.
    EXPECT_THAT(run->out, HasSubstr("row-parallel shards quantised: 8 of 8"));
    EXPECT_THAT(run->out, Not(HasSubstr("DIFFERENT")));
  }
}

TEST(TensorParallelTest, LoraFineTunesMatchOneProcess) {
  absl::StatusOr<RanksRun> run = RunWorker(2, "lora");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->out << run->err;
  EXPECT_THAT(run->out, HasSubstr("lora heads=3/6 logits equal"));
  EXPECT_THAT(run->out, HasSubstr("lora greedy equal"));
}

TEST(TensorParallelTest, EveryGoldenCaseMatchesLitGpt) {
  absl::StatusOr<RanksRun> run = RunWorker(2, "golden");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->out << run->err;
  EXPECT_THAT(run->out, Not(HasSubstr("DIFFERENT")));
  EXPECT_THAT(run->out, HasSubstr("golden summary: 16 equal, 0 refused")) << run->out;
}

TEST(TensorParallelTest, PerRequestAdaptersInOneBatchMatchOneProcess) {
  absl::StatusOr<RanksRun> run = RunWorker(2, "multi_lora");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->out << run->err;
  EXPECT_THAT(run->out, HasSubstr("multi_lora logits equal"));
}

TEST(TensorParallelTest, DefaultModelLogitsAndGreedyGenerationMatchOneProcess) {
  absl::StatusOr<RanksRun> run = RunWorker(2, "default_model");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->out << run->err;
  EXPECT_THAT(run->out, HasSubstr("default_model heads=3/6 kv_groups=1/2"));
  EXPECT_THAT(run->out, HasSubstr("logits equal"));
  EXPECT_THAT(run->out, HasSubstr("greedy dense bits=16 equal"));
  EXPECT_THAT(run->out, HasSubstr("greedy sink budget=24"));
  EXPECT_THAT(run->out, HasSubstr("greedy h2o budget=24"));
  EXPECT_THAT(run->out, Not(HasSubstr("DIFFERENT")));
}

// On two GPUs, the same check with each rank's model on its GPU and the all-reduces over NCCL
// (float32: within the same tolerance; greedy tokens equal).
TEST(TensorParallelTest, OverNcclOnTwoGpusTheDefaultModelMatchesOneProcess) {
  if (!NcclAvailable()) GTEST_SKIP() << "skipped: no NCCL or no CUDA device";
  if (at::getNumGPUs() < 2) GTEST_SKIP() << "skipped: fewer than 2 GPUs";
  absl::StatusOr<RanksRun> run = RunWorker(2, "default_model_nccl");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->out << run->err;
  EXPECT_THAT(run->out, HasSubstr("logits equal"));
  EXPECT_THAT(run->out, HasSubstr("greedy dense bits=16 equal"));
  EXPECT_THAT(run->out, HasSubstr("greedy h2o budget=24"));
  EXPECT_THAT(run->out, Not(HasSubstr("DIFFERENT")));
}

TEST(TensorParallelTest, NonDividingSizesAreRefusedNamingTheField) {
  // The default model has 6 heads in 2 groups: 3 ranks split the heads but not the groups,
  // 4 ranks not even the heads.
  absl::StatusOr<RanksRun> three = RunWorker(3, "refuse");
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->exit_code, 0) << three->err;
  EXPECT_THAT(three->out, HasSubstr("n_query_groups (2) and the tensor-parallel size 3"));
  absl::StatusOr<RanksRun> four = RunWorker(4, "refuse");
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ(four->exit_code, 0) << four->err;
  EXPECT_THAT(four->out, HasSubstr("n_head (6) is not divisible by the tensor-parallel size 4"));
}

TEST(TensorParallelTest, ARankThatDiesFailsTheOthersWithinTheTimeout) {
  absl::StatusOr<RanksRun> run = RunWorker(2, "rank_dies", /*stop_on_failure=*/false);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_NE(run->exit_code, 0);
  EXPECT_THAT(run->err, HasSubstr("rank 1 exited with status 3"));
  EXPECT_THAT(run->err, HasSubstr("[rank 0] error: "));
  EXPECT_THAT(run->err, HasSubstr("all-reduce across 2 ranks failed"));
  EXPECT_LT(run->elapsed, absl::Seconds(60));
}

}  // namespace
}  // namespace lgpt
