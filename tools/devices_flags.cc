#include "tools/devices_flags.h"

#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/base/device.h"
#include "core/dist/launcher.h"

ABSL_FLAG(int32_t, devices, 1,
          "data-parallel ranks: without RANK in the environment, runs this many local ranks, "
          "each training on its slice of every global batch (rank 0 logs and saves); under "
          "torchrun-style RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, must equal WORLD_SIZE");
ABSL_FLAG(int32_t, dist_timeout_s, 300,
          "seconds every data-parallel rank may take to arrive (rank 0 prepares the data "
          "first), and each collective to complete");
ABSL_FLAG(std::string, device, "cpu",
          "cpu or cuda[:N]: where the model trains (one process: not with --devices > 1)");

namespace lgpt {

absl::StatusOr<std::optional<int>> LaunchDevices(int argc, char** argv) {
  const int devices = absl::GetFlag(FLAGS_devices);
  if (devices < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--devices must be >= 1, got ", devices));
  }
  if (absl::GetFlag(FLAGS_dist_timeout_s) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dist_timeout_s must be >= 1, got ", absl::GetFlag(FLAGS_dist_timeout_s)));
  }
  return LaunchIfRequested(devices, argc, argv);
}

int RankFromEnv() {
  const char* rank = std::getenv("RANK");
  int value = 0;
  if (rank == nullptr || !absl::SimpleAtoi(rank, &value)) return 0;
  return value;
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> JoinDevices() {
  const int devices = absl::GetFlag(FLAGS_devices);
  absl::StatusOr<DistOptions> dist =
      DistOptionsFromEnv(absl::Seconds(absl::GetFlag(FLAGS_dist_timeout_s)));
  if (!dist.ok()) return dist.status();
  if (dist->world_size != devices) {
    return absl::InvalidArgumentError(
        absl::StrCat("--devices=", devices, " but WORLD_SIZE=", dist->world_size));
  }
  return ProcessGroup::Create(*dist);
}

absl::StatusOr<c10::Device> TrainingDevice() {
  absl::StatusOr<c10::Device> device = ParseDevice(absl::GetFlag(FLAGS_device));
  if (device.ok() && !device->is_cpu() && absl::GetFlag(FLAGS_devices) > 1) {
    return absl::UnimplementedError(
        "--device=cuda trains in one process: data parallelism (--devices > 1) runs on the CPU");
  }
  return device;
}

}  // namespace lgpt
