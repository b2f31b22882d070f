#include "core/base/device.h"

#include <ATen/Context.h>
#include <glog/logging.h>

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

#ifdef LGPT_LIBTORCH_HAS_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace lgpt {

bool CudaAvailable() { return at::hasCUDA(); }

namespace {

// "cuda" in a process a launcher started as one of several on this machine (LOCAL_RANK, as
// core/dist/launcher.cc and torchrun set it): GPU LOCAL_RANK modulo the GPUs seen, so that ranks
// do not all share GPU 0. 0 otherwise.
int LocalRankDevice() {
  const char* local_rank = std::getenv("LOCAL_RANK");
  int rank = 0;
  if (local_rank == nullptr || !absl::SimpleAtoi(local_rank, &rank) || rank < 0) return 0;
  const int gpus = static_cast<int>(at::getNumGPUs());
  return gpus > 0 ? rank % gpus : 0;
}

}  // namespace

void SynchronizeDevice(const c10::Device& device) {
#ifdef LGPT_LIBTORCH_HAS_CUDA
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard guard(device);
    c10::cuda::device_synchronize();
  }
#else
  (void)device;
#endif
}

at::Tensor ToDeviceQueued(const at::Tensor& host, const c10::Device& device) {
  if (!device.is_cuda() || !host.device().is_cpu()) return host.to(device);
  // The caching host allocator keeps the pinned block until the queued copy has read it.
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

absl::StatusOr<c10::Device> ParseDevice(absl::string_view name) {
  if (name == "cpu") return c10::Device(c10::kCPU);
  absl::string_view rest = name;
  if (absl::ConsumePrefix(&rest, "cuda")) {
    int index = 0;
    if (rest.empty()) index = LocalRankDevice();
    if (!rest.empty() && (!absl::ConsumePrefix(&rest, ":") || !absl::SimpleAtoi(rest, &index) ||
                          index < 0 || index > 64)) {
      return absl::InvalidArgumentError(absl::StrCat("bad device '", name, "'"));
    }
    if (!CudaAvailable()) {
      return absl::FailedPreconditionError(
          absl::StrCat("device '", name, "' requested but this LibTorch sees no CUDA GPU"));
    }
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device '", name, "' (expected cpu, cuda or cuda:N)"));
}

c10::Device DefaultDevice() {
  const char* env = std::getenv("LGPT_DEVICE");
  if (env == nullptr || *env == '\0') return c10::Device(c10::kCPU);
  absl::StatusOr<c10::Device> device = ParseDevice(env);
  if (!device.ok()) {
    LOG(WARNING) << "LGPT_DEVICE: " << device.status().message() << "; using cpu";
    return c10::Device(c10::kCPU);
  }
  return *device;
}

}  // namespace lgpt
