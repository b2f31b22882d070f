#include "tools/tp_flags.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/base/status_macros.h"
#include "core/dist/launcher.h"

ABSL_FLAG(int, tp, 1,
          "tensor-parallel ranks: without RANK in the environment, runs this many local ranks "
          "(rank 0 prints); under torchrun-style RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, must "
          "equal WORLD_SIZE");
ABSL_FLAG(int, tp_timeout_s, 120,
          "seconds every rank may take to arrive, and each collective to complete");
ABSL_FLAG(std::string, tp_backend, "auto",
          "what moves the ranks' tensors: gloo (TCP), nccl (GPUs: NVLink / PCIe; control data "
          "still over gloo) or auto (nccl when --device is a GPU)");

namespace lgpt {

absl::StatusOr<std::optional<int>> LaunchTensorParallel(int argc, char** argv) {
  const int tp = absl::GetFlag(FLAGS_tp);
  if (tp < 1) return absl::InvalidArgumentError(absl::StrCat("--tp must be >= 1, got ", tp));
  if (absl::GetFlag(FLAGS_tp_timeout_s) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp_timeout_s must be >= 1, got ", absl::GetFlag(FLAGS_tp_timeout_s)));
  }
  // The name only: which backend "auto" means depends on the device, known to each rank.
  RETURN_IF_ERROR(
      ParseDistBackend(absl::GetFlag(FLAGS_tp_backend), c10::Device(c10::kCPU), "--tp_backend")
          .status());
  return LaunchIfRequested(tp, argc, argv);
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> JoinTensorParallel(const c10::Device& device) {
  const int tp = absl::GetFlag(FLAGS_tp);
  ASSIGN_OR_RETURN(const DistBackend backend,
                   ParseDistBackend(absl::GetFlag(FLAGS_tp_backend), device, "--tp_backend"));
  if (tp == 1 && std::getenv("RANK") == nullptr) return std::shared_ptr<ProcessGroup>();
  ASSIGN_OR_RETURN(DistOptions dist,
                   DistOptionsFromEnv(absl::Seconds(absl::GetFlag(FLAGS_tp_timeout_s))));
  dist.backend = backend;
  if (dist.world_size != tp) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp=", tp, " but WORLD_SIZE=", dist.world_size));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<ProcessGroup> group, ProcessGroup::Create(dist));
  if (group->rank() != 0 && !std::freopen("/dev/null", "w", stdout)) {
    return absl::InternalError("cannot silence stdout of a rank other than 0");
  }
  return group;
}

absl::StatusOr<bool> ShareLine(ProcessGroup& group, bool has_line, std::string* line) {
  // [has_line, bytes], then the bytes.
  at::Tensor header = at::tensor(
      {has_line ? int64_t{1} : int64_t{0}, static_cast<int64_t>(has_line ? line->size() : 0)},
      at::kLong);
  RETURN_IF_ERROR(group.Broadcast(header, 0));
  const int64_t size = header[1].item<int64_t>();
  if (header[0].item<int64_t>() == 0) return false;
  at::Tensor bytes = at::empty({std::max<int64_t>(size, 1)}, at::kByte);
  if (group.rank() == 0 && size > 0) std::memcpy(bytes.data_ptr<uint8_t>(), line->data(), size);
  RETURN_IF_ERROR(group.Broadcast(bytes, 0));
  line->assign(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), size);
  return true;
}

}  // namespace lgpt
