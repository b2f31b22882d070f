// The few-row GEMV over block-quantised weights on the shapes of a 1B-class Llama (Llama 3.2 1B:
// d_model 2048, MLP 8192, vocabulary 128256) as a decoding step runs it: on CUDA where there is
// a GPU; the CPU twin (plain loops, a correctness reference) on one small shape. GB_per_s counts
// the weight bytes the call must read (codes and scales): against the device's memory bandwidth,
// the kernel's efficiency. The dequantise-then-cuBLAS path that many rows take is timed beside
// it (dequantise_*: DequantizeBlocksTo bfloat16, then at::linear), for where the two meet.
//
//   bazel run -c opt --config=cuda //core/ops:block_quant_device_benchmark
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>

#include "core/base/device.h"
#include "core/ops/block_quant.h"
#include "core/ops/block_quant_device.h"

namespace lgpt {
namespace {

// state: rows, N, K.
void BM_BlockQuantGemv(benchmark::State& state, bool on_cuda, BlockFormat format, bool dequantise) {
  if (on_cuda && !CudaAvailable()) {
    state.SkipWithError("skipped: no CUDA device");
    return;
  }
  const c10::Device device = on_cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  const int64_t rows = state.range(0), n_out = state.range(1), k = state.range(2);
  const BlockQuantWeight weight =
      BlockQuantWeightTo(*QuantizeBlocks(at::randn({n_out, k}) * 0.02, format), device);
  const at::Tensor x = at::randn({rows, k}).to(device);  // [rows, K]
  for (auto _ : state) {
    if (dequantise) {
      const at::Tensor y =
          at::linear(x.to(at::kBFloat16), *DequantizeBlocksTo(weight, at::kBFloat16));
      benchmark::DoNotOptimize(y.data_ptr());
    } else {
      const absl::StatusOr<at::Tensor> y = BlockQuantGemvByParts(weight, x, at::Tensor());
      if (!y.ok()) {
        state.SkipWithError(std::string(y.status().message()).c_str());
        return;
      }
    }
    SynchronizeDevice(device);
  }
  state.counters["GB_per_s"] = benchmark::Counter(static_cast<double>(weight.bytes()),
                                                  benchmark::Counter::kIsIterationInvariantRate,
                                                  benchmark::Counter::kIs1000);
}

void CudaShapes(benchmark::internal::Benchmark* b) {
  for (int64_t rows : {1, 16}) {
    b->Args({rows, 2048, 2048})->Args({rows, 8192, 2048})->Args({rows, 2048, 8192});
  }
  b->Args({1, 128256, 2048});
}

BENCHMARK_CAPTURE(BM_BlockQuantGemv, cuda_q8_0, true, BlockFormat::kQ8_0, false)->Apply(CudaShapes);
BENCHMARK_CAPTURE(BM_BlockQuantGemv, cuda_q4_0, true, BlockFormat::kQ4_0, false)->Apply(CudaShapes);
BENCHMARK_CAPTURE(BM_BlockQuantGemv, cuda_dequantise_q4_0, true, BlockFormat::kQ4_0, true)
    ->Args({16, 8192, 2048})
    ->Args({128, 8192, 2048});
BENCHMARK_CAPTURE(BM_BlockQuantGemv, cpu_twin_q4_0, false, BlockFormat::kQ4_0, false)
    ->Args({1, 256, 2048});

}  // namespace
}  // namespace lgpt
