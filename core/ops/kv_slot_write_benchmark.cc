// The KV slot write as a serving step runs it: T new entries of every group into a pool of
// 16-entry blocks at scattered slots, on the CPU and (where there is a GPU) on CUDA.
// GB_per_s counts the key and value bytes read and written.
//
//   bazel run -c opt //core/ops:kv_slot_write_benchmark -- [--threads=N]
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>

#include "core/base/device.h"
#include "core/ops/kv_slot_write.h"

#ifdef LGPT_LIBTORCH_HAS_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace lgpt {
namespace {

// The 110M serving model's layer: 12 key/value groups of head size 64.
constexpr int64_t kGroups = 12, kHeadSize = 64, kBlockSize = 16, kBlocks = 4096;

void Synchronize(const c10::Device& device) {
#ifdef LGPT_LIBTORCH_HAS_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
}

void BM_KVSlotWrite(benchmark::State& state, bool on_cuda) {
  if (on_cuda && !CudaAvailable()) {
    state.SkipWithError("skipped: no CUDA device");
    return;
  }
  const c10::Device device = on_cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  const int64_t tokens = state.range(0);
  const auto options = at::TensorOptions().dtype(at::kBFloat16).device(device);
  const at::Tensor keys = at::randn({tokens, kGroups, kHeadSize}, options).transpose(0, 1);
  const at::Tensor values = at::randn({tokens, kGroups, kHeadSize}, options).transpose(0, 1);
  const at::Tensor slots =
      at::randperm(kBlocks * kBlockSize, at::kLong).narrow(0, 0, tokens).to(device);
  const at::Tensor key_pool = at::zeros({kBlocks, kGroups, kBlockSize, kHeadSize}, options);
  const at::Tensor value_pool = at::zeros_like(key_pool);
  for (auto _ : state) {
    const absl::Status status = WriteKVSlots(keys, values, slots, key_pool, value_pool);
    if (!status.ok()) {
      state.SkipWithError(std::string(status.message()).c_str());
      return;
    }
    Synchronize(device);
  }
  const int64_t bytes = 2 * 2 * tokens * kGroups * kHeadSize * keys.element_size();
  state.counters["GB_per_s"] =
      benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

BENCHMARK_CAPTURE(BM_KVSlotWrite, cpu, false)->Arg(1)->Arg(16)->Arg(512)->Arg(4096);
BENCHMARK_CAPTURE(BM_KVSlotWrite, cuda, true)->Arg(1)->Arg(16)->Arg(512)->Arg(4096);

}  // namespace
}  // namespace lgpt
