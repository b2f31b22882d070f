// The tools on the test device (LGPT_DEVICE, core/base/device.h: the CPU in CI, CUDA in the GPU
// check, tools/gpu/pack.sh), run as a user runs them with --device: generate (16- and 32-bit,
// budgeted and quantised caches, int4 weights), score, perplexity (plain windows and a serving
// pool's paged entries), eval_cache, finetune (LoRA), pretrain and bench_serve. Each one's
// output on the device is compared with the same command on the CPU: float32 greedy text equal,
// logits within 1e-4, perplexities and losses within a relative 1e-3. On the CPU the two runs
// are the same command twice (the tools are deterministic there).
#include <ATen/ATen.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/base/device.h"
#include "core/base/dtype_support.h"
#include "core/io/npy.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

constexpr char kModel[] = "tools/default_model";
constexpr char kText[] = "tools/eval_data/kjv_heldout.txt";

struct ToolRun {
  int status = -1;
  std::string out;
  std::string err;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::string TempDir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(root ? root : "/tmp", "/tools_device_", name);
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

// The device under test as the tools' --device flag names it.
std::string DeviceFlag() { return DefaultDevice().is_cuda() ? "cuda" : "cpu"; }

ToolRun Execute(const std::string& tool, const std::string& args) {
  const std::string dir = TempDir("runs");
  const std::string out = dir + "/stdout.txt", err = dir + "/stderr.txt";
  const std::string command = absl::StrCat("tools/", tool, " ", args, " >", out, " 2>", err);
  ToolRun run;
  const int raw = std::system(command.c_str());
  run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  run.out = ReadAll(out);
  run.err = ReadAll(err);
  return run;
}

// `tool args` on the CPU and on the device under test; both must succeed.
struct Pair {
  ToolRun cpu;
  ToolRun device;
};
Pair OnBoth(const std::string& tool, const std::string& args) {
  Pair pair{Execute(tool, args + " --device=cpu"),
            Execute(tool, args + " --device=" + DeviceFlag())};
  EXPECT_EQ(pair.cpu.status, 0) << tool << " " << args << " on the CPU: " << pair.cpu.err;
  EXPECT_EQ(pair.device.status, 0)
      << tool << " " << args << " on " << DeviceFlag() << ": " << pair.device.err;
  return pair;
}

// The number after the last `prefix` in `text` ("loss=", "val_loss "); NaN when absent.
double ValueAfter(const std::string& text, const std::string& prefix) {
  const size_t at = text.rfind(prefix);
  if (at == std::string::npos) return std::nan("");
  const size_t start = at + prefix.size();
  const size_t end = text.find_first_of(" \n", start);
  double value = std::nan("");
  if (!absl::SimpleAtod(text.substr(start, end - start), &value)) return std::nan("");
  return value;
}

void ExpectRelativelyNear(double device, double cpu, double tolerance, const std::string& what) {
  ASSERT_FALSE(std::isnan(device) || std::isnan(cpu)) << what << ": not reported";
  EXPECT_NEAR(device, cpu, tolerance * std::abs(cpu)) << what;
}

const char kPrompt[] = " --prompt='And God said' --max_new_tokens=24 --temperature=0";

// Greedy float32 text on the device equals the CPU's, for every kind of cache and weights.
TEST(ToolsOnDeviceTest, GenerateMatchesTheCpu) {
  for (const char* variant :
       {"", " --kv_cache=sink --kv_budget=16", " --kv_cache=h2o --kv_budget=16", " --kv_bits=8",
        " --kv_cache=window --kv_budget=16 --kv_bits=4", " --quantize=int4"}) {
    SCOPED_TRACE(variant);
    const Pair pair =
        OnBoth("generate", absl::StrCat("--checkpoint_dir=", kModel, kPrompt, variant));
    EXPECT_FALSE(pair.cpu.out.empty());
    EXPECT_EQ(pair.device.out, pair.cpu.out);
  }
}

// 16-bit models generate on the device (their text may part from the CPU's at a near tie).
TEST(ToolsOnDeviceTest, GenerateIn16Bits) {
  std::vector<std::string> precisions = {"bf16-true"};
  if (MultipliesMatrices(DefaultDevice(), at::kHalf)) {
    precisions.push_back("16-true");
  } else {
    std::printf("16-true not run: no float16 matrix products on %s\n", DeviceFlag().c_str());
  }
  for (const std::string& precision : precisions) {
    const ToolRun run =
        Execute("generate", absl::StrCat("--checkpoint_dir=", kModel, kPrompt,
                                         " --precision=", precision, " --device=", DeviceFlag()));
    EXPECT_EQ(run.status, 0) << precision << ": " << run.err;
    EXPECT_GT(run.out.size(), std::string("And God said").size()) << precision;
  }
}

// The logits of one forward pass, written by score, within 1e-4 of the CPU's.
TEST(ToolsOnDeviceTest, ScoreMatchesTheCpu) {
  const std::string dir = TempDir("score");
  const std::string args =
      absl::StrCat("--checkpoint_dir=", kModel, " --token_ids=1,400,37,1020,5,77,900,3");
  const ToolRun cpu = Execute("score", args + " --device=cpu --logits_out=" + dir + "/cpu.npy");
  const ToolRun device = Execute(
      "score", absl::StrCat(args, " --device=", DeviceFlag(), " --logits_out=", dir, "/dev.npy"));
  ASSERT_EQ(cpu.status, 0) << cpu.err;
  ASSERT_EQ(device.status, 0) << device.err;
  absl::StatusOr<at::Tensor> a = ReadNpy(dir + "/cpu.npy");
  absl::StatusOr<at::Tensor> b = ReadNpy(dir + "/dev.npy");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->sizes(), b->sizes());
  EXPECT_LT((*a - *b).abs().max().item<double>(), 1e-4);
}

// Perplexity of the held-out text in windows, and through a serving pool's paged int8 and
// bfloat16 entries a step of 64 tokens at a time, within a relative 1e-3 of the CPU's.
TEST(ToolsOnDeviceTest, PerplexityMatchesTheCpu) {
  for (const char* variant :
       {"", " --kv_pool_dtype=bfloat16 --chunk=64", " --kv_pool_dtype=int8 --chunk=64"}) {
    SCOPED_TRACE(variant);
    const Pair pair = OnBoth(
        "perplexity",
        absl::StrCat("--checkpoint_dir=", kModel, " --lines_bos_eos --text_file=", kText, variant));
    ExpectRelativelyNear(ValueAfter(pair.device.out, "perplexity="),
                         ValueAfter(pair.cpu.out, "perplexity="), 1e-3, "perplexity");
  }
}

// eval_cache's policies x bits table on the device: the CPU's rows (policy, budget, bits, KV
// bytes), perplexities within a relative 1e-3.
TEST(ToolsOnDeviceTest, EvalCacheMatchesTheCpu) {
  const std::string dir = TempDir("eval_cache");
  const std::string args =
      absl::StrCat("--checkpoint_dir=", kModel, " --text_file=", kText,
                   " --max_tokens=300 --budgets=32 --policies=dense,sink,h2o --bits=16,8");
  const ToolRun cpu =
      Execute("eval_cache", absl::StrCat(args, " --device=cpu --out_dir=", dir, "/cpu"));
  const ToolRun device = Execute(
      "eval_cache", absl::StrCat(args, " --device=", DeviceFlag(), " --out_dir=", dir, "/dev"));
  ASSERT_EQ(cpu.status, 0) << cpu.err;
  ASSERT_EQ(device.status, 0) << device.err;
  const std::vector<std::string> a = absl::StrSplit(ReadAll(dir + "/cpu/results.csv"), '\n');
  const std::vector<std::string> b = absl::StrSplit(ReadAll(dir + "/dev/results.csv"), '\n');
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GE(a.size(), 7u);  // a header and six rows
  for (size_t row = 1; row < a.size(); ++row) {
    if (a[row].empty()) continue;
    const std::vector<std::string> x = absl::StrSplit(a[row], ',');
    const std::vector<std::string> y = absl::StrSplit(b[row], ',');
    ASSERT_EQ(x.size(), y.size());
    ASSERT_GE(x.size(), 7u);
    for (int column = 0; column < 4; ++column) EXPECT_EQ(y[column], x[column]) << a[row];
    double px = 0, py = 0;
    ASSERT_TRUE(absl::SimpleAtod(x[6], &px) && absl::SimpleAtod(y[6], &py)) << a[row];
    EXPECT_NEAR(py, px, 1e-3 * px) << a[row];
  }
}

// LoRA fine-tuning for three steps: the device's losses are the CPU's within a relative 1e-3.
TEST(ToolsOnDeviceTest, FinetuneMatchesTheCpu) {
  const std::string dir = TempDir("finetune");
  std::ofstream(dir + "/data.json")
      << R"([{"instruction": "Quote Genesis 1:3.", "input": "", "output": "And God said, Let there be light: and there was light."},
             {"instruction": "Which book?", "input": "In the beginning", "output": "Genesis"},
             {"instruction": "Which book?", "input": "The LORD is my shepherd", "output": "Psalms"},
             {"instruction": "Say amen.", "input": "", "output": "Amen."}])";
  const std::string args = absl::StrCat(
      "--method=lora --checkpoint_dir=", kModel, " --data=", dir,
      "/data.json --max_steps=3 --global_batch_size=2 --micro_batch_size=1 "
      "--val_split_fraction=0.25 --lr=1e-2 --warmup_steps=1 --lora_dropout=0 --out_dir=",
      dir, "/out");
  const Pair pair = OnBoth("finetune", args);
  for (const char* key : {"first_train_loss=", "last_train_loss=", "final_val_loss="}) {
    ExpectRelativelyNear(ValueAfter(pair.device.err, key), ValueAfter(pair.cpu.err, key), 1e-3,
                         key);
  }
}

// Pretraining the default model's shape for three steps (its tokenizer): losses within a
// relative 1e-3.
TEST(ToolsOnDeviceTest, PretrainMatchesTheCpu) {
  const std::string dir = TempDir("pretrain");
  const std::string args =
      absl::StrCat("--model_config=tools/default_model/train_config.yaml --text_file=", kText,
                   " --tokenizer_dir=", kModel,
                   " --seq_len=32 --micro_batch=2 --max_steps=3 --warmup_steps=1 --eval_every=3 "
                   "--eval_batches=1 --out_dir=",
                   dir, "/out");
  const Pair pair = OnBoth("pretrain", args);
  // The last step's training loss (its progress line) and the validation loss after it.
  for (const char* key : {" loss ", "val_loss "}) {
    ExpectRelativelyNear(ValueAfter(pair.device.err + pair.device.out, key),
                         ValueAfter(pair.cpu.err + pair.cpu.out, key), 1e-3, key);
  }
}

// The serving benchmark over a KV pool on the device, sized in MiB and as a fraction of the
// device's free memory: every request completes.
TEST(ToolsOnDeviceTest, BenchServeRuns) {
  for (const char* pool : {"--pool_mb=4", "--kv_memory_fraction=0.001"}) {
    const ToolRun run =
        Execute("bench_serve", absl::StrCat("--checkpoint_dir=", kModel, " --device=", DeviceFlag(),
                                            " --concurrency=1,4 --prompt_tokens=24 --new_tokens=8 ",
                                            pool, " --kv_pool_dtype=bfloat16"));
    EXPECT_EQ(run.status, 0) << pool << ": " << run.err;
    EXPECT_NE(run.out.find("kv_pool:"), std::string::npos) << pool << ": " << run.out;
  }
}

}  // namespace
}  // namespace lgpt
