// Runs convert_lit and convert_hf as a user would: the embedded default model goes to a
// Hugging Face directory and back with identical weights, and bad input ends with one error
// line on stderr and exit status 1.
#include <ATen/ATen.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/safetensors.h"
#include "core/torch_pickle.h"
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

}  // namespace
}  // namespace lgpt
