// Every file writer killed at random moments: the file under its final name is always the old
// complete file or the new complete file, never a truncated one.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/io/npy.h"
#include "core/base/output_dir.h"
#include "core/io/safetensors.h"
#include "core/io/torch_pickle.h"
#include "core/io/torch_pickle_writer.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

struct Writer {
  std::string name;
  // Writes a file whose contents are all `value`.
  std::function<absl::Status(const std::string& path, float value)> write;
  // The single value the file holds, or an error for a damaged file.
  std::function<absl::StatusOr<float>(const std::string& path)> read;
};

at::Tensor Filled(float value) { return at::full({1 << 20}, value); }  // 4 MB

absl::StatusOr<float> Uniform(const at::Tensor& t) {
  if (t.numel() != (1 << 20)) return absl::DataLossError("wrong size");
  const float first = t.flatten()[0].item<float>();
  if (!at::all(t == first).item<bool>()) return absl::DataLossError("mixed contents");
  return first;
}

std::vector<Writer> Writers() {
  return {
      {"safetensors",
       [](const std::string& path, float v) {
         return WriteSafetensors(path, {{"w", Filled(v)}});
       },
       [](const std::string& path) -> absl::StatusOr<float> {
         absl::StatusOr<TensorMap> t = ReadSafetensors(path);
         if (!t.ok()) return t.status();
         return Uniform(t->at("w"));
       }},
      {"lit_model.pth",
       [](const std::string& path, float v) {
         return WriteTorchStateDict(path, {{"w", Filled(v)}});
       },
       [](const std::string& path) -> absl::StatusOr<float> {
         absl::StatusOr<TensorMap> t = ReadTorchStateDict(path);
         if (!t.ok()) return t.status();
         return Uniform(t->at("w"));
       }},
      {"npy", [](const std::string& path, float v) { return WriteNpy(path, Filled(v)); },
       [](const std::string& path) -> absl::StatusOr<float> {
         absl::StatusOr<at::Tensor> t = ReadNpy(path);
         if (!t.ok()) return t.status();
         return Uniform(*t);
       }},
      {"text",
       [](const std::string& path, float v) {
         return WriteFileAtomically(path, std::string(4 << 20, static_cast<char>('a' + v)));
       },
       [](const std::string& path) -> absl::StatusOr<float> {
         std::ifstream in(path, std::ios::binary);
         std::stringstream text;
         text << in.rdbuf();
         const std::string s = text.str();
         if (s.size() != (4u << 20) || s.find_first_not_of(s[0]) != std::string::npos) {
           return absl::DataLossError("truncated or mixed text");
         }
         return static_cast<float>(s[0] - 'a');
       }},
  };
}

TEST(WriterKillTest, FinalNameHoldsOldOrNewFile) {
  at::set_num_threads(1);  // no OpenMP team in the parent, so the forked writers are safe
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::mt19937 rng(21);
  for (const Writer& writer : Writers()) {
    const std::string path = absl::StrCat(tmp ? tmp : "/tmp", "/kill_", writer.name);
    ASSERT_TRUE(writer.write(path, 1).ok()) << writer.name;
    // One uncontested write's duration, to spread the kills over it.
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(writer.write(path, 2).ok());
    const auto write_us = std::chrono::duration_cast<std::chrono::microseconds>(
                              std::chrono::steady_clock::now() - start)
                              .count();
    int saw_old = 0, saw_new = 0;
    for (int round = 0; round < 12; ++round) {
      ASSERT_TRUE(writer.write(path, 1).ok());
      const pid_t pid = fork();
      if (pid == 0) _exit(writer.write(path, 2).ok() ? 0 : 1);
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % (write_us + 1)));
      kill(pid, SIGKILL);
      int status = 0;
      waitpid(pid, &status, 0);
      const absl::StatusOr<float> value = writer.read(path);
      ASSERT_TRUE(value.ok()) << writer.name << " round " << round << ": " << value.status();
      ASSERT_TRUE(*value == 1 || *value == 2) << writer.name;
      (*value == 1 ? saw_old : saw_new)++;
    }
    EXPECT_GT(saw_old + saw_new, 0);
  }
}

}  // namespace
}  // namespace lgpt
