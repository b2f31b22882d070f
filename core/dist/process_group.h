// Process groups on PyTorch's c10d: a TCPStore rendezvous and ProcessGroupGloo (TCP), and in a
// CUDA build ProcessGroupNCCL for CUDA tensors (DistBackend::kNccl: NVLink / PCIe / InfiniBand,
// queued on the tensor's stream, as torch's "cpu:gloo,cuda:nccl"), initialised like torchrun
// from RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT. Collectives act on at::Tensor and report
// failures (a peer that died, a timeout) as absl::Status naming the ranks that are gone (those
// that do not report back through the store within a few seconds of the failure). An NCCL
// collective returns once queued; NCCL's watchdog bounds it by the timeout (it ends the process
// on a collective that never completes, naming it).
//
// World size 1 makes no c10d objects at all: every collective is a no-op, so single-process
// code paths run the same calls at no cost.
#ifndef LGPT_CORE_DIST_PROCESS_GROUP_H_
#define LGPT_CORE_DIST_PROCESS_GROUP_H_

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "c10/core/Device.h"

namespace lgpt {

// Which library moves a tensor between ranks.
enum class DistBackend {
  kGloo,  // every tensor over Gloo (CUDA tensors staged through host memory)
  kNccl,  // CUDA tensors over NCCL, CPU tensors over Gloo (a CUDA build, a GPU per local rank)
};

// Whether this build has NCCL (a CUDA LibTorch) and this process sees a GPU.
bool NcclAvailable();

// "gloo", "nccl", or "auto" (NCCL for a CUDA `device`, else Gloo). InvalidArgument naming
// `flag` for another name.
absl::StatusOr<DistBackend> ParseDistBackend(absl::string_view name, const c10::Device& device,
                                             absl::string_view flag);

struct DistOptions {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Bounds the rendezvous (every rank must arrive within it) and every collective.
  absl::Duration timeout = absl::Seconds(60);
  DistBackend backend = DistBackend::kGloo;
};

// DistOptions from torchrun's variables. Neither RANK nor WORLD_SIZE set: a single process
// (world size 1). Otherwise RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT must all be set
// and valid; errors name the variable.
absl::StatusOr<DistOptions> DistOptionsFromEnv(absl::Duration timeout = absl::Seconds(60));

// Checks rank, world size and port ranges, and that an NCCL backend has NCCL and a GPU
// (FailedPrecondition naming DistOptions.backend); errors name the field.
absl::Status ValidateDistOptions(const DistOptions& options);

class ProcessGroup {
 public:
  // Rendezvous of `options.world_size` ranks at MASTER_ADDR:MASTER_PORT (rank 0 serves the
  // store). Fails within options.timeout when a rank never arrives, naming the missing ranks
  // (on rank 0) or the unreachable master (on the others), and when ranks disagree on the
  // world size.
  static absl::StatusOr<std::shared_ptr<ProcessGroup>> Create(const DistOptions& options);
  // A group of one process: collectives do nothing.
  static std::shared_ptr<ProcessGroup> Single();

  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  DistBackend backend() const { return backend_; }

  // In place: every rank's `tensor` becomes the element-wise sum over ranks. Contiguous
  // tensors of the same shape and dtype on every rank, on the CPU or (each rank its own) GPU.
  absl::Status AllReduceSum(at::Tensor& tensor);
  // In place: every rank's `tensor` becomes root's.
  absl::Status Broadcast(at::Tensor& tensor, int root = 0);
  // Every rank's `tensor` [d0, ...] concatenated in rank order: [world_size · d0, ...].
  absl::StatusOr<at::Tensor> AllGather(const at::Tensor& tensor);
  absl::Status Barrier();

 private:
  struct Impl;
  ProcessGroup(int rank, int world_size, DistBackend backend, std::unique_ptr<Impl> impl);
  // After a failed collective: the ranks that are gone, in words (see Impl::Suspects).
  std::function<std::string()> Suspects();

  int rank_;
  int world_size_;
  DistBackend backend_;
  std::unique_ptr<Impl> impl_;  // null for world size 1
};

}  // namespace lgpt

#endif  // LGPT_CORE_DIST_PROCESS_GROUP_H_
