// Decode attention over paged KV blocks as a serving step reads them: every running request's
// query against its own blocks (a call per request, or one DecodeAttentionRows call for all),
// one layer an iteration, the layers' blocks together larger than
// the last-level cache (so entries come from memory, as in a model step). GB_per_s counts the
// key and value bytes read. BM_DecodeAttentionRowsBfloat16 and BM_DecodeAttentionRowsFloat16: the
// batched step over a bfloat16 or float16 pool's blocks (a float32 model's 16-bit entries,
// widened in registers); BM_DecodeAttentionRowsInt8 and BM_DecodeAttentionRowsInt4 over int8 /
// int4 entries (dequantised in registers). The last argument picks the kernels: 0 AVX2, 1 AVX-512
// (where the CPU has it; the same bits), each shape's two runs one after the other.
//
//   bazel run -c opt //core/ops:decode_attention_benchmark -- [--threads=N]
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "core/ops/decode_attention.h"
#include "core/ops/paged_attention_layout.h"

namespace lgpt {
namespace {

// The 110M serving model's attention: 16 heads, 16 key/value groups, head size 64.
constexpr int64_t kHeads = 16, kGroups = 16, kHeadSize = 64;

void SetBytes(benchmark::State& state, int64_t bytes) {
  state.counters["GB_per_s"] =
      benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

// [layer][request][block] keys and values [G, block, hs], blocks allocated one by one as a
// pool takes them; enough layers to exceed the last-level cache when `from_memory`.
struct Layers {
  std::vector<std::vector<std::vector<at::Tensor>>> keys, values;
};

// Bytes of one entry (one group's keys or values of one token) of `dtype`, or of `quantised`.
int64_t EntryBytes(at::ScalarType dtype, const std::optional<paged::EntryFormat>& quantised) {
  return quantised ? paged::EntryBytes(*quantised) : kHeadSize * at::elementSize(dtype);
}

// A block [G, block, hs] of random entries: of `dtype`, or quantised to uint8 [G, block,
// entry_bytes] entries of `quantised`.
at::Tensor RandomBlock(int64_t block, at::ScalarType dtype,
                       const std::optional<paged::EntryFormat>& quantised) {
  const at::Tensor raw = at::randn({kGroups, block, kHeadSize});
  if (!quantised) return raw.to(dtype);
  const int64_t entry_bytes = paged::EntryBytes(*quantised);
  at::Tensor out = at::empty({kGroups, block, entry_bytes}, at::kByte);
  for (int64_t i = 0; i < kGroups * block; ++i) {
    paged::QuantizeEntry(raw.data_ptr<float>() + i * kHeadSize, *quantised,
                         out.data_ptr<uint8_t>() + i * entry_bytes);
  }
  return out;
}

Layers MakeLayers(int64_t requests, int64_t entries, int64_t block, bool from_memory,
                  at::ScalarType dtype = at::kFloat,
                  const std::optional<paged::EntryFormat>& quantised = std::nullopt) {
  const int64_t blocks = (entries + block - 1) / block;
  const int64_t layer_bytes =
      requests * blocks * 2 * kGroups * block * EntryBytes(dtype, quantised);
  const int64_t layers = from_memory ? std::max<int64_t>(2, (int64_t{256} << 20) / layer_bytes) : 1;
  Layers data;
  data.keys.resize(layers);
  data.values.resize(layers);
  for (int64_t l = 0; l < layers; ++l) {
    data.keys[l].resize(requests);
    data.values[l].resize(requests);
    for (int64_t r = 0; r < requests; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        data.keys[l][r].push_back(RandomBlock(block, dtype, quantised));
        data.values[l][r].push_back(RandomBlock(block, dtype, quantised));
      }
    }
  }
  return data;
}

AttentionParams Params() {
  AttentionParams params;
  params.scale = 1.0 / std::sqrt(static_cast<double>(kHeadSize));
  return params;
}

// Sets the kernels from the benchmark's last argument (1: AVX-512 where the CPU has it) for
// one benchmark, then restores the setting.
class Kernels {
 public:
  explicit Kernels(const benchmark::State& state)
      : previous_(SetDecodeAttentionAvx512ForTesting(state.range(4) == 1)) {}
  ~Kernels() { SetDecodeAttentionAvx512ForTesting(previous_); }
  Kernels(const Kernels&) = delete;
  Kernels& operator=(const Kernels&) = delete;

 private:
  bool previous_;
};

// args: requests, entries per request, block size, 1 to read the entries from memory (0: one
// layer, in the caches after the first iteration), 1 for the AVX-512 kernels (0: AVX2). One
// DecodeAttentionBlocks call (one fork) per request, as a request's own cache attends.
void BM_DecodeAttentionBlocks(benchmark::State& state) {
  const Kernels kernels(state);
  const int64_t requests = state.range(0), entries = state.range(1), block = state.range(2);
  const Layers data = MakeLayers(requests, entries, block, state.range(3) == 1);
  const at::Tensor q = at::randn({1, kHeads, 1, kHeadSize});
  const at::Tensor query_positions = at::full({1, 1}, entries - 1, at::kLong);
  const at::Tensor key_positions = at::arange(entries, at::kLong).view({1, 1, entries});
  const AttentionParams params = Params();
  size_t layer = 0;
  for (auto _ : state) {
    for (int64_t r = 0; r < requests; ++r) {
      benchmark::DoNotOptimize(DecodeAttentionBlocks(q, data.keys[layer][r], data.values[layer][r],
                                                     entries, query_positions, key_positions,
                                                     params));
    }
    layer = (layer + 1) % data.keys.size();
  }
  SetBytes(state, requests * 2 * kGroups * entries * kHeadSize * 4);
}

// The same step as one DecodeAttentionRows call (a serving batch's path): every request's
// (row, key group) tasks in one fork, over entries of `dtype` (or `quantised` ones, read in
// place). Args as BM_DecodeAttentionBlocks.
void DecodeAttentionRowsOf(benchmark::State& state, at::ScalarType dtype,
                           const std::optional<paged::EntryFormat>& quantised = std::nullopt) {
  const Kernels kernels(state);
  const int64_t requests = state.range(0), entries = state.range(1), block = state.range(2);
  const Layers data = MakeLayers(requests, entries, block, state.range(3) == 1, dtype, quantised);
  const at::Tensor q = at::randn({requests, kHeads, 1, kHeadSize});
  const at::Tensor query_positions = at::full({requests, 1}, entries - 1, at::kLong);
  const at::Tensor key_positions = at::arange(entries, at::kLong).view({1, 1, entries});
  const AttentionParams params = Params();
  std::vector<std::vector<DecodeRow>> rows(data.keys.size());  // [layer][request]
  for (size_t l = 0; l < rows.size(); ++l) {
    for (int64_t r = 0; r < requests; ++r) {
      DecodeRow row;
      row.entries = entries;
      row.key_positions = key_positions;
      row.segments = BlockSegments(data.keys[l][r], data.values[l][r], entries, quantised);
      rows[l].push_back(std::move(row));
    }
  }
  size_t layer = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(DecodeAttentionRows(q, kGroups, rows[layer], query_positions, params));
    layer = (layer + 1) % rows.size();
  }
  SetBytes(state, requests * 2 * kGroups * entries * EntryBytes(dtype, quantised));
}

void BM_DecodeAttentionRows(benchmark::State& state) { DecodeAttentionRowsOf(state, at::kFloat); }
void BM_DecodeAttentionRowsBfloat16(benchmark::State& state) {
  DecodeAttentionRowsOf(state, at::kBFloat16);
}
void BM_DecodeAttentionRowsFloat16(benchmark::State& state) {
  DecodeAttentionRowsOf(state, at::kHalf);
}
// A float32 model's int8 / int4 pool entries (one float16 scale per 32 channels).
void BM_DecodeAttentionRowsInt8(benchmark::State& state) {
  DecodeAttentionRowsOf(state, at::kFloat, paged::EntryFormat{paged::EntryKind::kInt8, kHeadSize});
}
void BM_DecodeAttentionRowsInt4(benchmark::State& state) {
  DecodeAttentionRowsOf(state, at::kFloat, paged::EntryFormat{paged::EntryKind::kInt4, kHeadSize});
}

void Shapes(benchmark::internal::Benchmark* b) {
  auto both_kernels = [b](int64_t requests, int64_t entries, int64_t block, int64_t from_memory) {
    for (const int64_t avx512 : {0, 1}) b->Args({requests, entries, block, from_memory, avx512});
  };
  for (const int64_t from_memory : {0, 1}) {
    for (const int64_t block : {16, 64}) {
      both_kernels(1, 2048, block, from_memory);
      both_kernels(16, 32, block, from_memory);
      both_kernels(16, 192, block, from_memory);
    }
    // One segment per request and group (a dense cache's layout).
    both_kernels(1, 2048, 2048, from_memory);
    both_kernels(16, 192, 192, from_memory);
  }
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}

BENCHMARK(BM_DecodeAttentionBlocks)->Apply(Shapes);
BENCHMARK(BM_DecodeAttentionRows)->Apply(Shapes);
BENCHMARK(BM_DecodeAttentionRowsBfloat16)->Apply(Shapes);
BENCHMARK(BM_DecodeAttentionRowsFloat16)->Apply(Shapes);
BENCHMARK(BM_DecodeAttentionRowsInt8)->Apply(Shapes);
BENCHMARK(BM_DecodeAttentionRowsInt4)->Apply(Shapes);

}  // namespace
}  // namespace lgpt
