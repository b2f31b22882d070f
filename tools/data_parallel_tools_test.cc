// `finetune --devices=2` and `pretrain --devices=2` end to end on the embedded default model:
// two local ranks over Gloo write one checkpoint (rank 0's) equal to one process whose
// micro-batch holds both ranks'; bad --devices values and ranks started with different
// flags end with a clear error.
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/dist/launcher.h"
#include "core/dist/test_util.h"
#include "core/model/checkpoint.h"

namespace lgpt {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kCorpus[] = "tools/eval_data/kjv_heldout.txt";
constexpr char kModelConfig[] = "tools/default_model/train_config.yaml";
// Two ranks on the machine's cores, one thread each.
constexpr char kOneThread[] = "OMP_NUM_THREADS=1";

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(base ? base : "/tmp", "/", name);
  fs::create_directories(dir);
  return dir;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

struct ToolRun {
  int status = -1;
  std::string out, err;
};

// `env` is put before the command (VAR=value ...).
ToolRun Execute(const std::string& tool, const std::string& args, const std::string& env = "") {
  const std::string out = TempDir("run") + "/stdout.txt", err = TempDir("run") + "/stderr.txt";
  ToolRun run;
  const int raw =
      std::system(absl::StrCat(env, " tools/", tool, " ", args, " >", out, " 2>", err).c_str());
  run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  run.out = ReadAll(out);
  run.err = ReadAll(err);
  return run;
}

void ExpectCleanFailure(const ToolRun& run, const std::string& needle) {
  EXPECT_EQ(run.status, 1) << run.err;
  const std::string err(absl::StripTrailingAsciiWhitespace(run.err));
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 0) << "more than one line:\n" << err;
  EXPECT_THAT(err, HasSubstr("error")) << err;
  EXPECT_THAT(err, HasSubstr(needle)) << err;
}

std::set<std::string> Files(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename());
  return names;
}

// Largest |difference| over the tensors of two checkpoints with the same names.
double MaxDiff(const TensorMap& a, const TensorMap& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (const auto& [name, tensor] : a) {
    auto other = b.find(name);
    if (other == b.end()) {
      ADD_FAILURE() << name << " is missing";
      continue;
    }
    worst = std::max(
        worst, (tensor.to(at::kDouble) - other->second.to(at::kDouble)).abs().max().item<double>());
  }
  return worst;
}

std::string FinetuneData() {
  const std::string path = TempDir("data") + "/data.json";
  std::ofstream(path) << R"([
    {"instruction": "Quote Genesis 1:3.", "input": "", "output": "And God said, Let there be light: and there was light."},
    {"instruction": "Which book?", "input": "In the beginning", "output": "Genesis"},
    {"instruction": "Which book?", "input": "The LORD is my shepherd", "output": "Psalms"},
    {"instruction": "Say amen.", "input": "", "output": "Amen."},
    {"instruction": "Who was in the beginning?", "input": "", "output": "In the beginning was the Word"},
    {"instruction": "Name a river.", "input": "", "output": "Jordan"},
    {"instruction": "Name a city.", "input": "", "output": "Jerusalem"},
    {"instruction": "Count to three.", "input": "", "output": "One, two, three."},
    {"instruction": "Which book?", "input": "Vanity of vanities", "output": "Ecclesiastes"},
    {"instruction": "Finish: Blessed are", "input": "", "output": "the meek: for they shall inherit the earth."}
  ])";
  return path;
}

TEST(FinetuneDevicesTest, TwoRanksWriteOneCheckpointEqualToOneProcess) {
  const std::string dir = TempDir("finetune_devices");
  const std::string common = absl::StrCat(
      "--method=lora --data=", FinetuneData(),
      " --global_batch_size=4 --max_steps=3 --lr=1e-2 --warmup_steps=1 --lora_dropout=0 "
      "--val_split_fraction=0.2 --eval_iters=1 --merge --dist_timeout_s=60");
  const ToolRun two = Execute(
      "finetune", absl::StrCat(common, " --devices=2 --micro_batch_size=1 --out_dir=", dir, "/two"),
      kOneThread);
  ASSERT_EQ(two.status, 0) << two.err;
  // Rank 0 alone reports (the launcher prefixes its lines); rank 1 trains quietly.
  EXPECT_THAT(two.err, HasSubstr("[rank 0] method=lora threads=1 devices=2\n")) << two.err;
  EXPECT_THAT(two.err, HasSubstr("[rank 0] saved ")) << two.err;
  EXPECT_THAT(two.err, Not(HasSubstr("[rank 1]"))) << two.err;
  EXPECT_EQ(two.out, "");

  const ToolRun one = Execute(
      "finetune", absl::StrCat(common, " --devices=1 --micro_batch_size=2 --out_dir=", dir, "/one"),
      kOneThread);
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_EQ(Files(dir + "/two"), Files(dir + "/one"));
  absl::StatusOr<TensorMap> a = ReadCheckpointTensors(dir + "/two");
  absl::StatusOr<TensorMap> b = ReadCheckpointTensors(dir + "/one");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  // Float32 sums in another order (two micro-batches of one and an all-reduce against one
  // micro-batch of two) differ in the last bits, and Adam divides each gradient element by its
  // own running norm: an element whose gradients are near zero turns such a difference into up
  // to lr (1e-2) times it. Measured 4.2e-5 on an AVX2-only Zen 3 (a step's update is up to 1e-2;
  // ranks that did not average their gradients would differ by that much).
  EXPECT_LT(MaxDiff(*a, *b), 1e-4);
  EXPECT_THAT(ReadAll(dir + "/two/hyperparameters.yaml"), HasSubstr("devices: 2\n"));
}

TEST(PretrainDevicesTest, TwoRanksWriteOneCheckpointEqualToOneProcess) {
  const std::string dir = TempDir("pretrain_devices");
  const std::string common =
      absl::StrCat("--model_config=", kModelConfig, " --text_file=", kCorpus,
                   " --seq_len=32 --accumulate=2 --max_steps=3 --warmup_steps=1 --eval_every=3 "
                   "--eval_batches=2 --save_precision=32-true --dist_timeout_s=120");
  // Rank 0 trains the tokenizer and sends it to rank 1.
  const ToolRun two = Execute("pretrain",
                              absl::StrCat(common,
                                           " --vocab_size=400 --devices=2 --micro_batch=2 "
                                           "--out_dir=",
                                           dir, "/two"),
                              kOneThread);
  ASSERT_EQ(two.status, 0) << two.err;
  EXPECT_THAT(two.err, HasSubstr("[rank 0] saved ")) << two.err;
  EXPECT_THAT(two.err, Not(HasSubstr("[rank 1]"))) << two.err;
  EXPECT_EQ(Files(dir + "/two"),
            (std::set<std::string>{"model.safetensors", "model_config.yaml", "tokenizer.model",
                                   "tokenizer_config.json", "training_state.pt"}));

  const ToolRun one = Execute("pretrain",
                              absl::StrCat(common, " --tokenizer_dir=", dir,
                                           "/two --devices=1 "
                                           "--micro_batch=4 --out_dir=",
                                           dir, "/one"),
                              kOneThread);
  ASSERT_EQ(one.status, 0) << one.err;
  absl::StatusOr<TensorMap> a = ReadCheckpointTensors(dir + "/two");
  absl::StatusOr<TensorMap> b = ReadCheckpointTensors(dir + "/one");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  // float32 training of every weight: the two runs round differently (other batch shapes)
  // and AdamW divides each gradient by its own size, so entries with gradients near 0 end
  // ~3e-5 apart. A wrong or missing all-reduce moves weights ~lr (3e-3) apart; the exact
  // check (1e-5, float64) is //tools:sft_data_parallel_test's.
  EXPECT_LT(MaxDiff(*a, *b), 1e-4);
}

// Bad settings are one line before any work (the output directory is not even made); an
// infinite rate, a missing corpus and a bad --save_precision were found only by spm_encode,
// when saving, or never (weights that are not numbers saved with exit status 0).
TEST(PretrainToolTest, BadSettingsFailWithOneLineBeforeAnyWork) {
  const std::string dir = TempDir("pretrain_bad");
  const std::string common =
      absl::StrCat("--model_config=", kModelConfig,
                   " --tokenizer_dir=tools/default_model --seq_len=16 --micro_batch=2 "
                   "--max_steps=2 --warmup_steps=1 --eval_batches=1 --out_dir=",
                   dir, "/out");
  const std::string corpus = absl::StrCat(" --text_file=", kCorpus);
  ExpectCleanFailure(Execute("pretrain", common + corpus + " --lr=inf"),
                     "--lr must be a finite number >= 0, got inf");
  ExpectCleanFailure(Execute("pretrain", common + corpus + " --min_lr=nan"),
                     "--min_lr must be a finite number >= 0, got nan");
  ExpectCleanFailure(Execute("pretrain", common + corpus + " --grad_clip=-1"),
                     "--grad_clip must be a finite number >= 0, got -1");
  ExpectCleanFailure(Execute("pretrain", common + corpus + " --save_precision=64"),
                     "--save_precision: unknown value '64'");
  ExpectCleanFailure(Execute("pretrain", common + " --text_file=" + dir + "/missing.txt"),
                     "--text_file: " + dir + "/missing.txt is not a file");
  // A tokenizer to train: below byte fallback's 259 pieces spm_train failed with its reason
  // hidden; past the embedding it trained first.
  const std::string train_tokenizer =
      absl::StrCat("--model_config=", kModelConfig, " --seq_len=16 --out_dir=", dir, "/out");
  ExpectCleanFailure(Execute("pretrain", train_tokenizer + corpus + " --vocab_size=40"),
                     "--vocab_size=40 is outside [259, ");
  ExpectCleanFailure(Execute("pretrain", train_tokenizer + corpus + " --vocab_size=100000"),
                     "--vocab_size=100000 is outside [259, ");
  EXPECT_FALSE(fs::exists(dir + "/out"));
  // A corpus too small for the validation split: the output directory this run made goes.
  const std::string tiny = dir + "/tiny.txt";
  {
    std::ofstream out(tiny);
    out << "In the beginning\n";
  }
  const ToolRun small = Execute("pretrain", common + " --text_file=" + tiny);
  EXPECT_EQ(small.status, 1) << small.err;
  EXPECT_THAT(small.err, HasSubstr("is too small: its 5 tokens")) << small.err;
  EXPECT_FALSE(fs::exists(dir + "/out"));
  // Resuming keeps the tokenizer it has, whatever --vocab_size says.
  fs::create_directories(dir + "/resumed");
  fs::copy_file("tools/default_model/tokenizer.model", dir + "/resumed/tokenizer.model");
  const ToolRun resumed =
      Execute("pretrain", absl::StrCat("--model_config=", kModelConfig, corpus,
                                       " --resume --vocab_size=40 --seq_len=16 --micro_batch=2"
                                       " --max_steps=1 --warmup_steps=1 --eval_batches=1"
                                       " --out_dir=",
                                       dir, "/resumed"));
  EXPECT_EQ(resumed.status, 0) << resumed.err;

  // A finite rate that makes the weights overflow stops before saving them.
  const ToolRun blown = Execute("pretrain", common + corpus + " --lr=1e30");
  EXPECT_EQ(blown.status, 1) << blown.err;
  EXPECT_THAT(blown.err, HasSubstr("not finite")) << blown.err;
  EXPECT_FALSE(fs::exists(dir + "/out/model.safetensors"));
}

TEST(DevicesFlagTest, BadValuesAreOneLineAndStatusOne) {
  const std::string dir = TempDir("devices_bad");
  const std::string data = " --data=" + FinetuneData() + " --out_dir=" + dir + "/out";
  ExpectCleanFailure(Execute("finetune", "--devices=0" + data), "--devices must be >= 1, got 0");
  ExpectCleanFailure(
      Execute("finetune", "--devices=2 --micro_batch_size=3 --global_batch_size=4" + data),
      "--global_batch_size (4) must be a multiple of --micro_batch_size (3) times --devices (2)");
  ExpectCleanFailure(Execute("finetune", "--devices=2" + data, "RANK=0 WORLD_SIZE=1"),
                     "--devices=2 but WORLD_SIZE=1");
  const std::string corpus = absl::StrCat(" --model_config=", kModelConfig,
                                          " --text_file=", kCorpus, " --out_dir=", dir, "/p");
  ExpectCleanFailure(Execute("pretrain", "--devices=-1" + corpus), "--devices must be >= 1");
  ExpectCleanFailure(Execute("pretrain", "--devices=2 --dist_timeout_s=0" + corpus),
                     "--dist_timeout_s must be >= 1");
}

// Ranks started by hand (torchrun style) with different flags stop at start, naming what
// differs, instead of training apart.
TEST(DevicesFlagTest, RanksWithDifferentFlagsAreRefusedAtStart) {
  const std::string dir = TempDir("devices_mismatch");
  LaunchSpec spec;
  spec.world_size = 2;
  spec.executable = "/bin/sh";
  spec.argv = {
      "sh", "-c",
      absl::StrCat("exec tools/finetune --devices=2 --data=", FinetuneData(), " --out_dir=", dir,
                   "/out --global_batch_size=2 --max_steps=1 "
                   "--dist_timeout_s=60 --lr=0.00${RANK}1")};
  spec.timeout = absl::Seconds(120);
  absl::StatusOr<RanksRun> run = RunRanks(spec);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 1) << run->err;
  EXPECT_THAT(run->err, HasSubstr("error: ranks disagree on the training options (rank 1 "
                                  "differs from rank 0)"))
      << run->err;
  EXPECT_FALSE(fs::exists(dir + "/out"));
}

}  // namespace
}  // namespace lgpt
