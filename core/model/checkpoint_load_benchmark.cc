// What checking lit_model.pth's CRC-32s (LoadOptions::verify_checksums) costs at load:
// rounds of verified and unverified loads of one checkpoint, interleaved (the order alternates
// each round), with the file's pages in the page cache (warm) or evicted before every load
// (cold; posix_fadvise DONTNEED, so the disk or the host's cache serves them). Per mode and
// setting, the median of:
//   read       ReadCheckpointTensors: the zip, the pickle and, when verifying, the CRC pass
//              (unverified, the mapping is not even touched);
//   read+fin   then CheckFinite, the first to touch the pages when unverified;
//   load       LoadCheckpoint with the default options (check_finite reads every weight);
//   load+fwd   LoadCheckpoint, then the logits of one token (every weight is read).
//
//   bazel run //core/model:checkpoint_load_benchmark -- DIR [ROUNDS]
//
// DIR must hold lit_model.pth (model.safetensors would take precedence and has no CRCs).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include "core/model/checkpoint.h"

namespace lgpt {
namespace {

// Drops the file's pages from the page cache (they are clean, so nothing is written).
void Evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

double Milliseconds(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void Die(const absl::Status& status) {
  std::fprintf(stderr, "checkpoint_load_benchmark: error: %s\n",
               std::string(status.message()).c_str());
  std::exit(1);
}

struct Times {
  std::vector<double> read, read_finite, load, load_forward;
};

// Each measure ends before the tensors are released: unmapping a file whose pages were all
// touched takes tens of milliseconds, which a real program pays at exit, not at load.
void Measure(const std::string& dir, bool cold, bool verify, Times& times) {
  const std::string file = dir + "/lit_model.pth";
  if (cold) Evict(file);
  {
    absl::StatusOr<TensorMap> tensors;
    const double read_ms =
        Milliseconds([&] { tensors = ReadCheckpointTensors(dir, nullptr, verify); });
    if (!tensors.ok()) Die(tensors.status());
    const double finite_ms = Milliseconds([&] {
      const absl::Status finite = CheckFinite(*tensors, file);
      if (!finite.ok()) Die(finite);
    });
    times.read.push_back(read_ms);
    times.read_finite.push_back(read_ms + finite_ms);
  }
  if (cold) Evict(file);
  LoadOptions options;
  options.verify_checksums = verify;
  absl::StatusOr<LoadedModel> loaded;
  double load_ms = 0;
  const double total_ms = Milliseconds([&] {
    load_ms = Milliseconds([&] { loaded = LoadCheckpoint(dir, options); });
    if (!loaded.ok()) Die(loaded.status());
    at::NoGradGuard no_grad;
    absl::StatusOr<at::Tensor> logits = loaded->model->Forward(at::ones({1, 1}, at::kLong));
    if (!logits.ok()) Die(logits.status());
  });
  times.load.push_back(load_ms);
  times.load_forward.push_back(total_ms);
}

int Run(const std::string& dir, int rounds) {
  const std::string file = dir + "/lit_model.pth";
  const int fd = ::open(file.c_str(), O_RDONLY);
  if (fd < 0) Die(absl::NotFoundError(file + " cannot be opened"));
  const double bytes = static_cast<double>(::lseek(fd, 0, SEEK_END));
  ::close(fd);
  std::printf("%s: %.1f MB, %d intra-op threads, %d rounds per mode\n", file.c_str(), bytes / 1e6,
              at::get_num_threads(), rounds);
  Times warm_up;  // Libraries, allocator, the file into the page cache.
  Measure(dir, /*cold=*/false, /*verify=*/true, warm_up);
  for (const bool cold : {false, true}) {
    Times on, off;
    for (int round = 0; round < rounds; ++round) {
      const bool on_first = round % 2 == 0;
      Measure(dir, cold, on_first, on_first ? on : off);
      Measure(dir, cold, !on_first, on_first ? off : on);
    }
    const char* mode = cold ? "cold" : "warm";
    auto row = [&](const char* what, const std::vector<double>& with,
                   const std::vector<double>& without) {
      const double a = Median(with), b = Median(without);
      std::printf("%s %-9s verified %8.1f ms  unverified %8.1f ms  difference %+7.1f ms (%+.1f%%)",
                  mode, what, a, b, a - b, 100 * (a - b) / b);
      if (a > b) std::printf("  = %.2f GB/s", bytes / ((a - b) * 1e6));
      std::printf("\n");
    };
    row("read", on.read, off.read);
    row("read+fin", on.read_finite, off.read_finite);
    row("load", on.load, off.load);
    row("load+fwd", on.load_forward, off.load_forward);
  }
  return 0;
}

}  // namespace
}  // namespace lgpt

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: checkpoint_load_benchmark DIR [ROUNDS]\n");
    return 2;
  }
  const int rounds = argc > 2 ? std::max(1, std::atoi(argv[2])) : 7;
  return lgpt::Run(argv[1], rounds);
}
