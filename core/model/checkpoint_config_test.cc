// A model_config.yaml that inflates a dimension past what the checkpoint holds is refused in
// well under a second, before any module is built, naming the config's number and the
// checkpoint's (2^20 layers over the 4-layer default model took minutes to refuse). float16 on
// the CPU is refused only where LibTorch cannot multiply it.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "core/model/checkpoint.h"

namespace lgpt {
namespace {

constexpr char kDefaultModel[] = "tools/default_model";

// A checkpoint directory of the default model's weights whose model_config.yaml sets `field` to
// `value`.
std::string CheckpointWith(const std::string& field, const std::string& value) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/" + field + "_" + value;
  EXPECT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  char cwd[4096];
  EXPECT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  const std::string weights = std::string(cwd) + "/" + kDefaultModel + "/model.safetensors";
  unlink((dir + "/model.safetensors").c_str());
  EXPECT_EQ(symlink(weights.c_str(), (dir + "/model.safetensors").c_str()), 0);
  std::ifstream in(std::string(kDefaultModel) + "/model_config.yaml");
  std::stringstream yaml;
  yaml << in.rdbuf();
  const std::regex line("(^|\n)" + field + ": [^\n]*");
  EXPECT_TRUE(std::regex_search(yaml.str(), line)) << field;
  std::ofstream(dir + "/model_config.yaml")
      << std::regex_replace(yaml.str(), line, "$1" + field + ": " + value);
  return dir;
}

// Loads and expects a fast refusal whose message holds every one of `numbers`.
void ExpectFastRefusal(const std::string& field, const std::string& value,
                       const std::vector<std::string>& numbers) {
  SCOPED_TRACE(field + ": " + value);
  const std::string dir = CheckpointWith(field, value);
  const auto start = std::chrono::steady_clock::now();
  const absl::StatusOr<LoadedModel> loaded = LoadCheckpoint(dir);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument) << loaded.status();
  EXPECT_LT(seconds, 1.0) << loaded.status();
  for (const std::string& number : numbers) {
    EXPECT_NE(loaded.status().message().find(number), absl::string_view::npos)
        << number << " in " << loaded.status();
  }
}

TEST(CheckpointConfigTest, TheUnchangedConfigLoads) {
  const absl::StatusOr<LoadedModel> loaded = LoadCheckpoint(CheckpointWith("n_layer", "4"));
  EXPECT_TRUE(loaded.ok()) << loaded.status();
}

// float16 on the CPU loads where LibTorch multiplies float16 matrices there (PyPI's 2.x: the CUDA
// toolchain) and its forward pass runs; elsewhere (Debian's 1.13) it is refused before reading
// anything, naming the precisions that work.
TEST(CheckpointConfigTest, Float16OnTheCpuLoadsWhereLibTorchMultipliesIt) {
  bool half_products = true;
  try {
    const at::Tensor x = at::ones({1, 1}, at::TensorOptions().dtype(at::kHalf));
    at::addmm(x, x, x);
  } catch (const c10::Error&) {
    half_products = false;
  }
  LoadOptions options;
  options.dtype = c10::kHalf;
  const absl::StatusOr<LoadedModel> loaded = LoadCheckpoint(kDefaultModel, options);
  if (!half_products) {
    ASSERT_FALSE(loaded.ok());
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(loaded.status().message().find("bf16-true or 32-true"), std::string::npos)
        << loaded.status();
    return;
  }
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->model->dtype(), c10::kHalf);
  const absl::StatusOr<at::Tensor> logits =
      loaded->model->Forward(at::arange(1, 9, at::kLong).unsqueeze(0), nullptr, ForwardOptions{});
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_EQ(logits->scalar_type(), c10::kHalf);
  EXPECT_TRUE(at::isfinite(*logits).all().item<bool>());
}

TEST(CheckpointConfigTest, AMillionLayersAreRefusedAtOnce) {
  ExpectFastRefusal("n_layer", "1048576", {"n_layer: 1048576", "holds 4 layers"});
}

TEST(CheckpointConfigTest, InflatedDimensionsAreRefusedAtOnce) {
  ExpectFastRefusal("n_embd", "1048576", {"1048576", "[4096, 192]"});
  ExpectFastRefusal("n_head", "65536", {"n_head", "[320, 192]"});
  ExpectFastRefusal("n_query_groups", "65536", {"n_query_groups (65536)"});
  ExpectFastRefusal("head_size", "1048576", {"head_size", "[320, 192]"});
  ExpectFastRefusal("intermediate_size", "1073741824", {"1073741824", "[512, 192]"});
  ExpectFastRefusal("padded_vocab_size", "1073741824", {"1073741824", "[4096, 192]"});
  ExpectFastRefusal("block_size", "1099511627776", {"1099511627776", "16777216"});
}

TEST(CheckpointConfigTest, ExpertsTheCheckpointLacksAreRefusedAtOnce) {
  ExpectFastRefusal("n_expert", "1024", {"1024"});
}

}  // namespace
}  // namespace lgpt
