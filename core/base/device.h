// Chooses the device computations run on. Tests and tools take it from one place: the
// LGPT_DEVICE environment variable ("cpu" by default, "cuda" under --config=cuda).
#ifndef LGPT_CORE_BASE_DEVICE_H_
#define LGPT_CORE_BASE_DEVICE_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lgpt {

// Parses "cpu", "cuda" or "cuda:N"; fails when CUDA is asked for and absent. "cuda" is GPU 0,
// or, in a process started with LOCAL_RANK (one of a launcher's ranks on this machine), GPU
// LOCAL_RANK modulo the GPUs seen.
absl::StatusOr<c10::Device> ParseDevice(absl::string_view name);

// The device named by LGPT_DEVICE (CPU when unset). A CUDA request without a GPU falls back
// to CPU with a warning, so that CPU-capable tests still run.
c10::Device DefaultDevice();

// Whether LibTorch sees a usable CUDA device.
bool CudaAvailable();

// Waits until every kernel queued on `device` has finished (a no-op on the CPU), for timings.
void SynchronizeDevice(const c10::Device& device);

// `host` (a CPU tensor) on `device` without waiting for the device: for a CUDA device it goes
// through pinned memory and its copy is queued on the current stream (a copy from pageable
// memory first waits for every kernel queued before it). Otherwise `host.to(device)`.
at::Tensor ToDeviceQueued(const at::Tensor& host, const c10::Device& device);

}  // namespace lgpt

#endif  // LGPT_CORE_BASE_DEVICE_H_
