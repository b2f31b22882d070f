// CRC-32 throughput over a buffer the size of the 110M checkpoint (444 MB, in memory): the
// carry-less multiplication path Crc32 takes on x86-64 against zlib's crc32_z, the fallback.
//
//   bazel run //core/io:crc32_benchmark -- --benchmark_repetitions=5
#include <cstdint>
#include <random>
#include <vector>

#include <benchmark/benchmark.h>

#include "core/io/crc32.h"

namespace lgpt {
namespace {

constexpr size_t kBytes = 444683886;  // /work/scratch/big/lit_model.pth

const std::vector<uint8_t>& Buffer() {
  static const std::vector<uint8_t>* const buffer = [] {
    auto* bytes = new std::vector<uint8_t>(kBytes);
    std::mt19937_64 rng(1);
    for (size_t i = 0; i + 8 <= bytes->size(); i += 8) {
      const uint64_t r = rng();
      for (int k = 0; k < 8; ++k) (*bytes)[i + k] = static_cast<uint8_t>(r >> (8 * k));
    }
    return bytes;
  }();
  return *buffer;
}

void SetBytes(benchmark::State& state) {
  state.counters["GB_per_s"] =
      benchmark::Counter(static_cast<double>(kBytes), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

void BM_Crc32(benchmark::State& state) {
  const std::vector<uint8_t>& bytes = Buffer();
  for (auto _ : state) benchmark::DoNotOptimize(Crc32(bytes.data(), bytes.size()));
  SetBytes(state);
}
BENCHMARK(BM_Crc32)->Unit(benchmark::kMillisecond);

void BM_Crc32Zlib(benchmark::State& state) {
  const std::vector<uint8_t>& bytes = Buffer();
  for (auto _ : state) {
    benchmark::DoNotOptimize(crc32_internal::Crc32Portable(bytes.data(), bytes.size(), 0));
  }
  SetBytes(state);
}
BENCHMARK(BM_Crc32Zlib)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace lgpt

BENCHMARK_MAIN();
