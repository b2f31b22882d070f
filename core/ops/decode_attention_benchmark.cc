// Decode attention over paged KV blocks as a serving step reads them: every running request's
// query against its own blocks, one layer an iteration, the layers' blocks together larger than
// the last-level cache (so entries come from memory, as in a model step). GB_per_s counts the
// key and value bytes read.
//
//   bazel run -c opt //core/ops:decode_attention_benchmark -- [--threads=N]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "core/ops/decode_attention.h"

namespace lgpt {
namespace {

// The 110M serving model's attention: 16 heads, 16 key/value groups, head size 64.
constexpr int64_t kHeads = 16, kGroups = 16, kHeadSize = 64;

// args: requests, entries per request, block size, 1 to read the entries from memory (0: one
// layer, in the caches after the first iteration).
void BM_DecodeAttentionBlocks(benchmark::State& state) {
  const int64_t requests = state.range(0), entries = state.range(1), block = state.range(2);
  const bool from_memory = state.range(3) == 1;
  const int64_t blocks = (entries + block - 1) / block;
  const int64_t layer_bytes = requests * blocks * 2 * kGroups * block * kHeadSize * 4;
  const int64_t layers = from_memory ? std::max<int64_t>(2, (int64_t{256} << 20) / layer_bytes) : 1;
  // [layer][request][block]: blocks allocated one by one, as a pool takes them.
  std::vector<std::vector<std::vector<at::Tensor>>> keys(layers), values(layers);
  for (int64_t l = 0; l < layers; ++l) {
    keys[l].resize(requests);
    values[l].resize(requests);
    for (int64_t r = 0; r < requests; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        keys[l][r].push_back(at::randn({kGroups, block, kHeadSize}));
        values[l][r].push_back(at::randn({kGroups, block, kHeadSize}));
      }
    }
  }
  const at::Tensor q = at::randn({1, kHeads, 1, kHeadSize});
  const at::Tensor query_positions = at::full({1, 1}, entries - 1, at::kLong);
  const at::Tensor key_positions = at::arange(entries, at::kLong).view({1, 1, entries});
  AttentionParams params;
  params.scale = 1.0 / std::sqrt(static_cast<double>(kHeadSize));
  int64_t layer = 0;
  for (auto _ : state) {
    for (int64_t r = 0; r < requests; ++r) {
      benchmark::DoNotOptimize(DecodeAttentionBlocks(q, keys[layer][r], values[layer][r], entries,
                                                     query_positions, key_positions, params));
    }
    layer = (layer + 1) % layers;
  }
  const int64_t bytes = requests * 2 * kGroups * entries * kHeadSize * 4;
  state.counters["GB_per_s"] =
      benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

void Shapes(benchmark::internal::Benchmark* b) {
  for (const int64_t from_memory : {0, 1}) {
    for (const int64_t block : {16, 64}) {
      b->Args({1, 2048, block, from_memory});
      b->Args({16, 192, block, from_memory});
    }
  }
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}

BENCHMARK(BM_DecodeAttentionBlocks)->Apply(Shapes);

}  // namespace
}  // namespace lgpt

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
