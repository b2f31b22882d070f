// Paged decode attention as a serving step runs it on a 1B-class Llama layer (32 query heads, 8
// key groups of 64 channels, Llama 3.2 1B): R requests of S entries each in 16-entry blocks
// scattered over the pool, one query each, on CUDA where there is a GPU (the CPU twin is
// plain loops: a correctness reference, timed only on small shapes). GB_per_s counts the key and
// value bytes the step must read (codes and scales for int8/int4): against the device's memory
// bandwidth, the kernel's efficiency (issue goal on an H200: 70% of ~4.8 TB/s at 16 x 2048,
// bfloat16 and int8).
//
//   bazel run -c opt --config=cuda //core/ops:paged_attention_benchmark
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>

#include "core/base/device.h"
#include "core/ops/paged_attention.h"
#include "core/ops/paged_attention_layout.h"

#ifdef LGPT_LIBTORCH_HAS_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace lgpt {
namespace {

constexpr int64_t kHeads = 32, kGroups = 8, kHeadSize = 64, kBlockSize = 16;

void Synchronize(const c10::Device& device) {
#ifdef LGPT_LIBTORCH_HAS_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
}

void BM_PagedDecode(benchmark::State& state, bool on_cuda, paged::EntryKind kind) {
  if (on_cuda && !CudaAvailable()) {
    state.SkipWithError("skipped: no CUDA device");
    return;
  }
  const c10::Device device = on_cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  const int64_t requests = state.range(0), entries = state.range(1);
  const int64_t blocks_each = (entries + kBlockSize - 1) / kBlockSize;
  const int64_t num_blocks = requests * blocks_each;
  const paged::EntryFormat format{kind, static_cast<int32_t>(kHeadSize), 32};
  PagedKVLayer layer;
  if (paged::IsQuantised(kind)) {
    // Codes of random bytes with small float16 scales (0x1400: 2^-10).
    const int64_t entry_bytes = paged::EntryBytes(format);
    layer.keys = at::randint(0, 256, {num_blocks, kGroups, kBlockSize, entry_bytes}, at::kByte);
    layer.keys.narrow(3, paged::CodeBytes(format), entry_bytes - paged::CodeBytes(format))
        .view(at::kShort)
        .fill_(0x1400);
    layer.values = layer.keys.clone();
    layer.bits = kind == paged::EntryKind::kInt8 ? 8 : 4;
  } else {
    const at::ScalarType dtype = kind == paged::EntryKind::kFloat32    ? at::kFloat
                                 : kind == paged::EntryKind::kBFloat16 ? at::kBFloat16
                                                                       : at::kHalf;
    layer.keys = at::randn({num_blocks, kGroups, kBlockSize, kHeadSize}, dtype);
    layer.values = at::randn_like(layer.keys);
  }
  layer.keys = layer.keys.to(device);
  layer.values = layer.values.to(device);
  PagedDecodeBatch batch;
  batch.block_tables = at::randperm(num_blocks, at::kInt).view({requests, blocks_each}).to(device);
  batch.lengths = at::full({requests}, entries, at::kInt).to(device);
  batch.query_positions = at::full({requests}, entries - 1, at::kInt).to(device);
  batch.max_length = entries;
  const at::Tensor q = at::randn({requests, kHeads, kHeadSize}).to(device);
  AttentionParams params;
  params.scale = 0.125;
  for (auto _ : state) {
    const absl::StatusOr<at::Tensor> y = PagedDecodeAttention(q, layer, batch, params);
    if (!y.ok()) {
      state.SkipWithError(std::string(y.status().message()).c_str());
      return;
    }
    Synchronize(device);
  }
  const int64_t bytes = 2 * requests * entries * kGroups * paged::EntryBytes(format);
  state.counters["GB_per_s"] =
      benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

void CudaShapes(benchmark::internal::Benchmark* b) {
  b->Args({1, 2048})->Args({16, 2048})->Args({64, 2048})->Args({1, 32768})->Args({16, 8192});
}

BENCHMARK_CAPTURE(BM_PagedDecode, cuda_bfloat16, true, paged::EntryKind::kBFloat16)
    ->Apply(CudaShapes);
BENCHMARK_CAPTURE(BM_PagedDecode, cuda_float16, true, paged::EntryKind::kFloat16)
    ->Apply(CudaShapes);
BENCHMARK_CAPTURE(BM_PagedDecode, cuda_float32, true, paged::EntryKind::kFloat32)
    ->Apply(CudaShapes);
BENCHMARK_CAPTURE(BM_PagedDecode, cuda_int8, true, paged::EntryKind::kInt8)->Apply(CudaShapes);
BENCHMARK_CAPTURE(BM_PagedDecode, cuda_int4, true, paged::EntryKind::kInt4)->Apply(CudaShapes);
BENCHMARK_CAPTURE(BM_PagedDecode, cpu_twin_bfloat16, false, paged::EntryKind::kBFloat16)
    ->Args({4, 512});
BENCHMARK_CAPTURE(BM_PagedDecode, cpu_twin_int8, false, paged::EntryKind::kInt8)->Args({4, 512});

}  // namespace
}  // namespace lgpt
