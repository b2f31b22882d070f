#include "core/base/device_memory.h"

#include <ATen/Context.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/base/system_memory.h"

#ifdef LGPT_LIBTORCH_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace lgpt {
namespace {

absl::StatusOr<int64_t> FreeCudaMemoryBytes(const c10::Device& device) {
#ifdef LGPT_LIBTORCH_HAS_CUDA
  if (!at::hasCUDA() || device.index() >= static_cast<int>(at::getNumGPUs())) {
    return absl::FailedPreconditionError(
        absl::StrCat("no GPU ", device.str(), " to read the free memory of"));
  }
  const c10::cuda::CUDAGuard guard(device);
  size_t free = 0, total = 0;
  if (const cudaError_t error = cudaMemGetInfo(&free, &total); error != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat(device.str(), ": cudaMemGetInfo failed: ", cudaGetErrorString(error)));
  }
  const c10::CachingDeviceAllocator::DeviceStats stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(guard.current_device().index());
  const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  const int64_t cached =
      stats.reserved_bytes[aggregate].current - stats.allocated_bytes[aggregate].current;
  return static_cast<int64_t>(free) + std::max<int64_t>(cached, 0);
#else
  return absl::FailedPreconditionError(
      absl::StrCat(device.str(), ": this build of lgpt has no CUDA (build with --config=cuda)"));
#endif
}

}  // namespace

absl::StatusOr<int64_t> FreeDeviceMemoryBytes(const c10::Device& device) {
  if (device.is_cuda()) return FreeCudaMemoryBytes(device);
  if (!device.is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the free memory of ", device.str(), " devices is not known"));
  }
  const std::optional<int64_t> available = AvailableMemoryBytes();
  if (!available) {
    return absl::FailedPreconditionError(
        "the CPU's available memory cannot be read (/proc/meminfo)");
  }
  return *available;
}

}  // namespace lgpt
