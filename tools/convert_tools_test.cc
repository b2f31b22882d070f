// Runs convert_lit and convert_hf as a user would: the embedded default model goes to a
// Hugging Face directory and back with identical weights, and bad input ends with one error
// line on stderr and exit status 1.
#include <ATen/ATen.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/config/config.h"
#include "core/io/safetensors.h"
#include "core/io/torch_pickle.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

const char kModel[] = "tools/default_model";

struct ToolRun {
  int status = -1;
  std::string err;
};

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir ? dir : "/tmp";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

ToolRun Execute(const std::string& tool, const std::string& args) {
  const std::string err = TempDir() + "/stderr.txt";
  const std::string command = absl::StrCat("tools/", tool, " ", args, " >/dev/null 2>", err);
  ToolRun run;
  const int raw = std::system(command.c_str());
  run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  run.err = ReadAll(err);
  return run;
}

void ExpectOneErrorLine(const ToolRun& run, const std::string& tool, const std::string& detail) {
  EXPECT_EQ(run.status, 1) << run.err;
  EXPECT_TRUE(absl::StartsWith(run.err, tool + ": error: ")) << run.err;
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  EXPECT_NE(run.err.find(detail), std::string::npos) << run.err;
}

TEST(ConvertToolsTest, DefaultModelRoundTrip) {
  const std::string hf = TempDir() + "/hf", lit = TempDir() + "/lit";
  ToolRun run = Execute("convert_lit", absl::StrCat("--checkpoint_dir=", kModel, " --out_dir=", hf,
                                                    " --max_shard_mb=2"));
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_NE(run.err.find("converted lgpt-kjv-3m"), std::string::npos) << run.err;
  EXPECT_FALSE(ReadAll(hf + "/model.safetensors.index.json").empty());
  EXPECT_FALSE(ReadAll(hf + "/tokenizer.model").empty());
  // The default model is no preset: its yaml says what it is.
  run = Execute("convert_hf", absl::StrCat("--hf_dir=", hf, " --out_dir=", lit, " --model_config=",
                                           kModel, "/model_config.yaml --safetensors"));
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(ReadAll(lit + "/model_config.yaml"),
            ReadAll(std::string(kModel) + "/model_config.yaml"));
  absl::StatusOr<TensorMap> original = ReadSafetensors(std::string(kModel) + "/model.safetensors");
  absl::StatusOr<TensorMap> pth = ReadTorchStateDict(lit + "/lit_model.pth");
  absl::StatusOr<TensorMap> st = ReadSafetensors(lit + "/model.safetensors");
  ASSERT_TRUE(original.ok() && pth.ok() && st.ok());
  ASSERT_EQ(pth->size(), original->size());
  for (const auto& [name, t] : *original) {
    ASSERT_EQ(pth->count(name), 1u) << name;
    EXPECT_TRUE(at::equal(pth->at(name), t)) << name;
    EXPECT_TRUE(at::equal(st->at(name), t)) << name;
    EXPECT_EQ(pth->at(name).scalar_type(), t.scalar_type()) << name;
  }

  // --dtype converts.
  const std::string f32 = TempDir() + "/lit_f32";
  run = Execute("convert_hf", absl::StrCat("--hf_dir=", hf, " --out_dir=", f32, " --model_config=",
                                           kModel, "/model_config.yaml --dtype=float32"));
  ASSERT_EQ(run.status, 0) << run.err;
  absl::StatusOr<TensorMap> converted = ReadTorchStateDict(f32 + "/lit_model.pth");
  ASSERT_TRUE(converted.ok());
  EXPECT_EQ(converted->at("transformer.wte.weight").scalar_type(), at::kFloat);
}

// Without --model_config, config.json alone says what the model computes; with a preset that
// disagrees, config.json wins and the tool says where.
TEST(ConvertToolsTest, ConfigJsonAloneAndOverAPreset) {
  const std::string hf = TempDir() + "/hf_alone", lit = TempDir() + "/lit_alone";
  ToolRun run =
      Execute("convert_lit", absl::StrCat("--checkpoint_dir=", kModel, " --out_dir=", hf));
  ASSERT_EQ(run.status, 0) << run.err;
  run = Execute("convert_hf", absl::StrCat("--hf_dir=", hf, " --out_dir=", lit));
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_FALSE(absl::StrContains(run.err, "overrides")) << run.err;
  absl::StatusOr<Config> original = LoadConfigFile(std::string(kModel) + "/model_config.yaml");
  absl::StatusOr<Config> derived = LoadConfigFile(lit + "/model_config.yaml");
  ASSERT_TRUE(original.ok() && derived.ok());
  EXPECT_EQ(derived->name, "hf_alone");  // The directory's name.
  derived->name = original->name;
  derived->hf_org = original->hf_org;
  derived->hf_name = original->hf_name;
  derived->vocab_size = original->vocab_size;  // The tokenizer's size is no config.json key.
  derived->padding_multiple = original->padding_multiple;
  EXPECT_EQ(ConfigToYaml(*derived), ConfigToYaml(*original));
  absl::StatusOr<TensorMap> weights = ReadTorchStateDict(lit + "/lit_model.pth");
  absl::StatusOr<TensorMap> expected = ReadSafetensors(std::string(kModel) + "/model.safetensors");
  ASSERT_TRUE(weights.ok() && expected.ok());
  for (const auto& [name, t] : *expected) EXPECT_TRUE(at::equal(weights->at(name), t)) << name;

  const std::string over = TempDir() + "/lit_over";
  run = Execute("convert_hf",
                absl::StrCat("--hf_dir=", hf, " --out_dir=", over, " --model_name=Llama-3.2-1B"));
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_TRUE(absl::StrContains(run.err, "preset Llama-3.2-1B fills")) << run.err;
  EXPECT_TRUE(absl::StrContains(run.err, "config.json overrides n_layer: ")) << run.err;
  EXPECT_TRUE(absl::StrContains(run.err, "config.json overrides rope_adjustments: none")) << run.err;
  absl::StatusOr<Config> over_config = LoadConfigFile(over + "/model_config.yaml");
  ASSERT_TRUE(over_config.ok());
  EXPECT_EQ(over_config->n_layer, original->n_layer);
  EXPECT_FALSE(over_config->rope_adjustments.has_value());
}

TEST(ConvertToolsTest, BadInputIsOneErrorLine) {
  const std::string tmp = TempDir();
  ExpectOneErrorLine(Execute("convert_hf", "--out_dir=" + tmp + "/x"), "convert_hf",
                     "--hf_dir is required");
  ExpectOneErrorLine(Execute("convert_hf", "--hf_dir=" + tmp + "/nope --out_dir=" + tmp + "/x"),
                     "convert_hf", "no config.json");
  ExpectOneErrorLine(Execute("convert_hf", absl::StrCat("--hf_dir=", kModel, " --out_dir=", tmp,
                                                        "/x --dtype=int4")),
                     "convert_hf", "--dtype");
  // Flag parsing (InitTool) words its own line.
  const ToolRun bogus =
      Execute("convert_hf", "--hf_dir=" + tmp + " --out_dir=" + tmp + "/x --bogus");
  EXPECT_EQ(bogus.status, 1);
  EXPECT_EQ(std::count(bogus.err.begin(), bogus.err.end(), '\n'), 1) << bogus.err;
  EXPECT_NE(bogus.err.find("bogus"), std::string::npos) << bogus.err;
  ExpectOneErrorLine(Execute("convert_lit", "--checkpoint_dir=" + tmp + "/nope --out_dir=" + tmp),
                     "convert_lit", "nope");
  ExpectOneErrorLine(
      Execute("convert_lit", absl::StrCat("--checkpoint_dir=", kModel, " --out_dir=", kModel)),
      "convert_lit", "another output directory");
  ExpectOneErrorLine(Execute("convert_lit", absl::StrCat("--checkpoint_dir=", kModel, " --out_dir=",
                                                         tmp, "/y --max_shard_mb=-1")),
                     "convert_lit", "max_shard_mb");
}

// Every regular file under `dir` by name, with its contents.
std::map<std::string, std::string> Snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_regular_file()) files[entry.path().filename().string()] = ReadAll(entry.path());
  }
  return files;
}

// convert_hf killed at random moments while it replaces another checkpoint: the directory
// always holds the old checkpoint or the new one, never new files beside old weights.
TEST(ConvertToolsTest, KilledConversionLeavesOldOrNewCheckpoint) {
  namespace fs = std::filesystem;
  const std::string hf = TempDir() + "/kill_hf", fresh = TempDir() + "/kill_fresh";
  const std::string target = TempDir() + "/kill_target";
  ASSERT_EQ(
      Execute("convert_lit", absl::StrCat("--checkpoint_dir=", kModel, " --out_dir=", hf)).status,
      0);
  const std::string args = absl::StrCat("--hf_dir=", hf, " --model_config=", kModel,
                                        "/model_config.yaml --dtype=float32 --out_dir=");
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(Execute("convert_hf", args + fresh).status, 0);
  const auto run_us = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::steady_clock::now() - start)
                          .count();
  fs::copy(kModel, target);
  const std::map<std::string, std::string> old_files = Snapshot(target);
  // The new checkpoint: what a fresh conversion writes, plus the old files it neither rewrites
  // nor drops (model.safetensors would shadow the new lit_model.pth, so it goes).
  std::map<std::string, std::string> new_files = Snapshot(fresh);
  for (const auto& [name, text] : old_files) {
    if (name != "model.safetensors" && !new_files.count(name)) new_files[name] = text;
  }
  std::mt19937 rng(9);
  int saw_old = 0, saw_new = 0;
  for (int round = 0; round < 10; ++round) {
    fs::remove_all(target);
    fs::copy(kModel, target);
    const pid_t pid = fork();
    if (pid == 0) {
      const std::string command =
          absl::StrCat("exec tools/convert_hf ", args, target, " >/dev/null 2>&1");
      execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % (run_us + 1)));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    const std::map<std::string, std::string> seen = Snapshot(target);
    ASSERT_TRUE(seen == old_files || seen == new_files) << "a mixed directory in round " << round;
    (seen == old_files ? saw_old : saw_new)++;
  }
  EXPECT_GT(saw_old + saw_new, 0);
}

}  // namespace
}  // namespace lgpt
