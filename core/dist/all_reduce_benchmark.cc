// All-reduce latency over ProcessGroupGloo between local ranks, at the sizes tensor-parallel
// decoding sends: two all-reduces of the hidden state [rows, n_embd] float32 per layer and
// token. Starts --ranks local ranks itself (core/dist/launcher.h); rank 0 prints one line per
// size: bytes, median and 90th-percentile microseconds over --iterations, after a warm-up.
//
//   bazel run -c opt //core/dist:all_reduce_benchmark -- [--ranks=2] [--floats=768,1024,4096]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "core/dist/launcher.h"
#include "core/dist/process_group.h"

ABSL_FLAG(int, ranks, 2, "local ranks");
ABSL_FLAG(std::string, floats, "768,1024,4096,8192,65536", "all-reduce sizes in float32 elements");
ABSL_FLAG(int, iterations, 300, "timed all-reduces per size");

namespace lgpt {
namespace {

int Fail(const std::string& why) {
  std::fprintf(stderr, "error: %s\n", why.c_str());
  return 1;
}

int Run() {
  absl::StatusOr<DistOptions> options = DistOptionsFromEnv(absl::Seconds(60));
  if (!options.ok()) return Fail(std::string(options.status().message()));
  absl::StatusOr<std::shared_ptr<ProcessGroup>> group = ProcessGroup::Create(*options);
  if (!group.ok()) return Fail(std::string(group.status().message()));
  ProcessGroup& pg = **group;
  const int iterations = std::max(1, absl::GetFlag(FLAGS_iterations));
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_floats), ',')) {
    int64_t floats = 0;
    if (!absl::SimpleAtoi(text, &floats) || floats < 1) {
      return Fail(absl::StrCat("--floats: '", text, "' is not a positive count"));
    }
    at::Tensor x = at::ones({floats}, at::kFloat);
    std::vector<double> micros;
    for (int i = 0; i < iterations + 20; ++i) {
      const auto start = std::chrono::steady_clock::now();
      if (absl::Status s = pg.AllReduceSum(x); !s.ok()) return Fail(std::string(s.message()));
      const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
      if (i >= 20) micros.push_back(took.count());  // the first 20 warm the connections
    }
    std::sort(micros.begin(), micros.end());
    if (pg.rank() == 0) {
      std::printf("ranks=%d floats=%lld bytes=%lld median_us=%.1f p90_us=%.1f\n", pg.world_size(),
                  static_cast<long long>(floats), static_cast<long long>(4 * floats),
                  micros[micros.size() / 2], micros[micros.size() * 9 / 10]);
    }
  }
  return 0;
}

}  // namespace
}  // namespace lgpt

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int ranks = absl::GetFlag(FLAGS_ranks);
  if (ranks < 2) return lgpt::Fail("--ranks must be >= 2");
  if (std::optional<int> code = lgpt::LaunchIfRequested(ranks, argc, argv)) return *code;
  return lgpt::Run();
}
