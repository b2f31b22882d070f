// Choosing a decoding step's tokens on a device: SampleNext's draw there (the row sampler, one
// launch and the ids read back) against the path it replaced, the rows read back and drawn on
// the host by the CPU sampler. Rows x vocabulary as serving meets them (Llama 2's 32000 and
// Llama 3's 128256 tokens); temperature 0.8 with top_p 0.95, and with top_k 50. On CUDA where
// there is a GPU; the CPU twin on one shape (a correctness reference, not a serving path).
// rows_per_s: rows chosen a second.
//
//   bazel run -c opt --config=cuda //core/model:sampling_benchmark
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/device.h"
#include "core/model/sampling.h"

namespace lgpt {
namespace {

enum class Path { kDevice, kHostAfterCopy, kTwin };

// state: rows, vocabulary, top_k (0: top_p 0.95 instead).
void BM_ChooseStep(benchmark::State& state, Path path) {
  const bool on_cuda = path != Path::kTwin;
  if (on_cuda && !CudaAvailable()) {
    state.SkipWithError("skipped: no CUDA device");
    return;
  }
  const c10::Device device = on_cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  const int64_t rows = state.range(0), vocab = state.range(1), top_k = state.range(2);
  const at::Tensor logits = (at::randn({rows, vocab}) * 4).to(device);  // [B, V]
  SamplingOptions options{0.8, top_k, top_k > 0 ? 1.0 : 0.95};
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(7);
  for (auto _ : state) {
    absl::Status status;
    if (path == Path::kHostAfterCopy) {
      status = SampleNext(logits.to(at::kCPU), options, generator).status();
    } else if (path == Path::kDevice) {
      status = SampleNext(logits, options, generator).status();
    } else {
      std::vector<RowSampling> keyed;
      for (int64_t b = 0; b < rows; ++b) keyed.push_back(RowSamplingFor(options, generator));
      for (const absl::StatusOr<int64_t>& choice : ChooseRows(logits, keyed)) {
        status.Update(choice.status());
      }
    }
    if (!status.ok()) {
      state.SkipWithError(std::string(status.message()).c_str());
      return;
    }
  }
  state.counters["rows_per_s"] =
      benchmark::Counter(static_cast<double>(rows), benchmark::Counter::kIsIterationInvariantRate);
}

void StepShapes(benchmark::internal::Benchmark* b) {
  for (int64_t vocab : {32000, 128256}) {
    for (int64_t rows : {1, 16, 64}) b->Args({rows, vocab, 0})->Args({rows, vocab, 50});
  }
}

BENCHMARK_CAPTURE(BM_ChooseStep, cuda_device, Path::kDevice)->Apply(StepShapes);
BENCHMARK_CAPTURE(BM_ChooseStep, cuda_host_after_copy, Path::kHostAfterCopy)->Apply(StepShapes);
BENCHMARK_CAPTURE(BM_ChooseStep, cpu_twin, Path::kTwin)->Args({16, 32000, 0});

}  // namespace
}  // namespace lgpt
