// main() of the kernel benchmarks: Google Benchmark's, after setting LibTorch's (and so the row
// pool's) thread count from --threads=N (default: all hardware threads), which the kernels'
// parallel loops read.
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <thread>

int main(int argc, char** argv) {
  int threads = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) threads = std::atoi(argv[i] + 10);
  }
  at::set_num_threads(threads > 0 ? threads
                                  : static_cast<int>(std::thread::hardware_concurrency()));
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
