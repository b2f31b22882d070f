// The few-row GEMV against at::linear (OpenBLAS) at decode shapes of the 110M Llama, the
// int8 (per-channel) and block-quantised (q8_0/q4_0-like, each kernel) GEMVs, and a streaming
// read of the same bytes (the memory-bandwidth bound). GB_per_s counts the weight bytes read.
//
//   bazel run -c opt //core/ops:gemv_benchmark -- [--threads=N] [--benchmark_filter=Block]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "core/ops/block_quant.h"
#include "core/ops/gemv.h"
#include "core/ops/quantize.h"

namespace lgpt {
namespace {

void SetBytes(benchmark::State& state, int64_t bytes) {
  state.counters["GB_per_s"] =
      benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

// args: rows, n_out, k
void BM_Gemv(benchmark::State& state, GemvKernel kernel) {
  if (kernel == GemvKernel::kAvx512 && BestGemvKernel() != kernel) {
    state.SkipWithError("kernel not available on this CPU");
    return;
  }
  const int64_t rows = state.range(0), n_out = state.range(1), k = state.range(2);
  const at::Tensor w = at::randn({n_out, k});
  const at::Tensor x = at::randn({rows, k});
  at::Tensor y = at::empty({rows, n_out});
  for (auto _ : state) {
    GemvF32(w.data_ptr<float>(), nullptr, x.data_ptr<float>(), y.data_ptr<float>(), rows, n_out, k,
            kernel);
    benchmark::DoNotOptimize(y.data_ptr<float>());
  }
  SetBytes(state, n_out * k * 4);
  state.counters["GFLOP_per_s"] = benchmark::Counter(static_cast<double>(2 * rows * n_out * k),
                                                     benchmark::Counter::kIsIterationInvariantRate,
                                                     benchmark::Counter::kIs1000);
}

// BM_Gemv with the weights read from memory, as in a model's decoding step: the product runs
// over copies of the weights that together exceed the last-level cache, one copy an iteration.
void BM_GemvFromMemory(benchmark::State& state) {
  const int64_t rows = state.range(0), n_out = state.range(1), k = state.range(2);
  const int64_t copies = std::max<int64_t>(2, (int64_t{256} << 20) / (n_out * k * 4));
  const at::Tensor w = at::randn({copies, n_out, k});
  const at::Tensor x = at::randn({rows, k});
  at::Tensor y = at::empty({rows, n_out});
  int64_t copy = 0;
  for (auto _ : state) {
    GemvF32(w[copy].data_ptr<float>(), nullptr, x.data_ptr<float>(), y.data_ptr<float>(), rows,
            n_out, k, BestGemvKernel());
    copy = (copy + 1) % copies;
    benchmark::DoNotOptimize(y.data_ptr<float>());
  }
  SetBytes(state, n_out * k * 4);
  state.counters["GFLOP_per_s"] = benchmark::Counter(static_cast<double>(2 * rows * n_out * k),
                                                     benchmark::Counter::kIsIterationInvariantRate,
                                                     benchmark::Counter::kIs1000);
}

void BM_AtLinear(benchmark::State& state) {
  const int64_t rows = state.range(0), n_out = state.range(1), k = state.range(2);
  const at::Tensor w = at::randn({n_out, k});
  const at::Tensor x = at::randn({1, rows, k});
  for (auto _ : state) benchmark::DoNotOptimize(at::linear(x, w));
  SetBytes(state, n_out * k * 4);
  state.counters["GFLOP_per_s"] = benchmark::Counter(static_cast<double>(2 * rows * n_out * k),
                                                     benchmark::Counter::kIsIterationInvariantRate,
                                                     benchmark::Counter::kIs1000);
}

void BM_Int8Gemv(benchmark::State& state) {
  const int64_t rows = state.range(0), n_out = state.range(1), k = state.range(2);
  const Int8Weight w = QuantizeInt8(at::randn({n_out, k}), 0);
  const at::Tensor x = at::randn({rows, k});
  at::Tensor y = at::empty({rows, n_out});
  for (auto _ : state) {
    Int8Gemv(w, nullptr, x.data_ptr<float>(), y.data_ptr<float>(), rows, CpuHasAvx2Fma());
    benchmark::DoNotOptimize(y.data_ptr<float>());
  }
  SetBytes(state, n_out * k);
}

// args: rows, n_out, k. Skipped where the CPU lacks the kernel.
void BM_BlockQuantGemv(benchmark::State& state, BlockFormat format, QuantKernel kernel) {
  if (!QuantKernelAvailable(kernel)) {
    state.SkipWithError("kernel not available on this CPU");
    return;
  }
  const int64_t rows = state.range(0), n_out = state.range(1), k = state.range(2);
  const BlockQuantWeight w = QuantizeBlocks(at::randn({n_out, k}), format).value();
  const at::Tensor x = at::randn({rows, k});
  at::Tensor y = at::empty({rows, n_out});
  for (auto _ : state) {
    BlockQuantGemv(w, nullptr, x.data_ptr<float>(), y.data_ptr<float>(), rows, kernel);
    benchmark::DoNotOptimize(y.data_ptr<float>());
  }
  SetBytes(state, w.bytes());
}

// Sums `bytes` of int32 in chunks over the GEMV's threads: the read bandwidth the GEMV can
// reach (far larger than the caches).
void BM_StreamRead(benchmark::State& state) {
  const int64_t n = state.range(0) / 4;
  const at::Tensor data = at::randint(0, 100, {n}, at::kInt);
  const int32_t* p = data.data_ptr<int32_t>();
  for (auto _ : state) {
    std::atomic<int64_t> total{0};
    ParallelForRows(n, 1024, 1 << 20, [&](int64_t begin, int64_t end) {
      int32_t s[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // Integer sums vectorise without fast-math.
      for (int64_t i = begin; i + 8 <= end; i += 8) {
        for (int j = 0; j < 8; ++j) s[j] += p[i + j];
      }
      total += s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
    });
    benchmark::DoNotOptimize(total.load());
  }
  SetBytes(state, n * 4);
}

void Shapes(benchmark::internal::Benchmark* b) {
  for (const int64_t rows : {1, 4, 16}) {
    b->Args({rows, 2304, 768});   // qkv
    b->Args({rows, 2048, 768});   // fc_1 / fc_2
    b->Args({rows, 768, 2048});   // proj
    b->Args({rows, 32000, 768});  // lm_head
  }
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}

// A batched decoding step of the 110M Llama (n_embd 1024, SwiGLU 2816, vocabulary 4096) at
// 1, 4 and 16 streams: the float32 GEMV's serving shapes.
void ServingShapes(benchmark::internal::Benchmark* b) {
  for (const int64_t rows : {1, 4, 16}) {
    b->Args({rows, 3072, 1024});  // qkv
    b->Args({rows, 1024, 1024});  // attn.proj
    b->Args({rows, 2816, 1024});  // fc_1 / fc_2
    b->Args({rows, 1024, 2816});  // mlp.proj
    b->Args({rows, 4096, 1024});  // lm_head
  }
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}

// A 128-token prefill chunk of the same model: the AVX-512 kernel past kGemvMaxRows against
// BLAS's GEMM.
void PrefillShapes(benchmark::internal::Benchmark* b) {
  for (const int64_t rows : {32, 256}) {
    b->Args({rows, 3072, 1024});
    b->Args({rows, 2816, 1024});
    b->Args({rows, 1024, 2816});
  }
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}

BENCHMARK_CAPTURE(BM_Gemv, prefill_avx512, GemvKernel::kAvx512)->Apply(PrefillShapes);
BENCHMARK(BM_AtLinear)->Apply(PrefillShapes);
BENCHMARK(BM_GemvFromMemory)->Apply(PrefillShapes);
BENCHMARK_CAPTURE(BM_Gemv, avx512, GemvKernel::kAvx512)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_Gemv, avx2, GemvKernel::kAvx2)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_Gemv, portable, GemvKernel::kPortable)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_Gemv, serving_avx512, GemvKernel::kAvx512)->Apply(ServingShapes);
BENCHMARK_CAPTURE(BM_Gemv, serving_avx2, GemvKernel::kAvx2)->Apply(ServingShapes);
BENCHMARK(BM_GemvFromMemory)->Apply(ServingShapes);
BENCHMARK(BM_AtLinear)->Apply(Shapes);
BENCHMARK(BM_Int8Gemv)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_BlockQuantGemv, q8_0_amx, BlockFormat::kQ8_0, QuantKernel::kAmx)
    ->Apply(Shapes);
BENCHMARK_CAPTURE(BM_BlockQuantGemv, q8_0_vnni, BlockFormat::kQ8_0, QuantKernel::kAvx512Vnni)
    ->Apply(Shapes);
BENCHMARK_CAPTURE(BM_BlockQuantGemv, q8_0_avx2, BlockFormat::kQ8_0, QuantKernel::kAvx2)
    ->Apply(Shapes);
BENCHMARK_CAPTURE(BM_BlockQuantGemv, q4_0_amx, BlockFormat::kQ4_0, QuantKernel::kAmx)
    ->Apply(Shapes);
BENCHMARK_CAPTURE(BM_BlockQuantGemv, q4_0_vnni, BlockFormat::kQ4_0, QuantKernel::kAvx512Vnni)
    ->Apply(Shapes);
BENCHMARK_CAPTURE(BM_BlockQuantGemv, q4_0_avx2, BlockFormat::kQ4_0, QuantKernel::kAvx2)
    ->Apply(Shapes);
BENCHMARK_CAPTURE(BM_BlockQuantGemv, q4_0_portable, BlockFormat::kQ4_0, QuantKernel::kPortable)
    ->Apply(Shapes);
BENCHMARK(BM_StreamRead)->Arg(int64_t{438} << 20)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace lgpt
