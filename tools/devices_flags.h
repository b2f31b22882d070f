// --devices, --dist_timeout_s and --device of the training tools (pretrain, finetune):
// data-parallel training on N local ranks that the tool starts itself (like generate --tp), or
// as one rank of a torchrun-style world (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set, one
// command per host); or training in one process on a CUDA device.
#ifndef LGPT_TOOLS_DEVICES_FLAGS_H_
#define LGPT_TOOLS_DEVICES_FLAGS_H_

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "core/dist/process_group.h"

ABSL_DECLARE_FLAG(int32_t, devices);
ABSL_DECLARE_FLAG(int32_t, dist_timeout_s);
ABSL_DECLARE_FLAG(std::string, device);

namespace lgpt {

// Checks --devices and --dist_timeout_s. With --devices > 1 and no RANK in the environment,
// runs that many local ranks of this tool (same argv, through core/dist/launcher.h) and
// returns the exit code main should return; nullopt: carry on in this process (one device,
// or a rank).
absl::StatusOr<std::optional<int>> LaunchDevices(int argc, char** argv);

// This process's rank from RANK (0 when unset), known before JoinDevices: for work rank 0
// does before the ranks meet.
int RankFromEnv();

// This process's data-parallel group: a group of one for --devices=1 without RANK; else the
// torchrun-style world of the environment, whose WORLD_SIZE must equal --devices. Ranks that
// do not arrive within --dist_timeout_s, and later collectives that take longer, are errors.
absl::StatusOr<std::shared_ptr<ProcessGroup>> JoinDevices();

// The device --device names (core/base/device.h's ParseDevice); Unimplemented for a CUDA device
// with --devices > 1 (data parallelism runs on the CPU).
absl::StatusOr<c10::Device> TrainingDevice();

}  // namespace lgpt

#endif  // LGPT_TOOLS_DEVICES_FLAGS_H_
