// How much memory a device can still give this process, for sizing what lives there (the
// serving engine's KV pool, EngineOptions.kv_pool_memory_fraction) and refusing sizes it cannot
// hold before allocating them.
#ifndef LGPT_CORE_BASE_DEVICE_MEMORY_H_
#define LGPT_CORE_BASE_DEVICE_MEMORY_H_

#include <c10/core/Device.h>

#include <cstdint>

#include "absl/status/statusor.h"

namespace lgpt {

// Bytes a new allocation on `device` may take: on a GPU the driver's free memory plus what
// LibTorch's caching allocator holds reserved and unused (it hands those out first); on the CPU
// MemAvailable (core/base/system_memory.h). FailedPrecondition where it cannot be read (no
// /proc/meminfo; CUDA in a build without it, or no such GPU); InvalidArgument for other kinds
// of device.
absl::StatusOr<int64_t> FreeDeviceMemoryBytes(const c10::Device& device);

}  // namespace lgpt

#endif  // LGPT_CORE_BASE_DEVICE_MEMORY_H_
