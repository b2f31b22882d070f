// --tp, --tp_timeout_s and --tp_backend of the inference tools (generate, score, chat, serve,
// bench_serve): tensor-parallel inference on N local ranks that the tool starts itself, or as
// one rank of a torchrun-style world (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set, one
// command per host); the ranks' tensors move over Gloo, or NCCL on GPUs.
#ifndef LGPT_TOOLS_TP_FLAGS_H_
#define LGPT_TOOLS_TP_FLAGS_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "c10/core/Device.h"
#include "core/dist/process_group.h"

ABSL_DECLARE_FLAG(int, tp);
ABSL_DECLARE_FLAG(int, tp_timeout_s);
ABSL_DECLARE_FLAG(std::string, tp_backend);

namespace lgpt {

// Checks --tp, --tp_timeout_s and --tp_backend's name. With --tp > 1 and no RANK in the
// environment, runs that many local ranks of this tool (same argv, core/dist/launcher.h) and
// returns the exit code main should return; nullopt: carry on in this process (one rank, or
// --tp=1).
absl::StatusOr<std::optional<int>> LaunchTensorParallel(int argc, char** argv);

// nullptr for --tp=1 without RANK; else this rank's group of the environment's world, whose
// WORLD_SIZE must equal --tp, its collectives over --tp_backend (auto: NCCL when the model
// runs on `device`, a GPU; else Gloo). Every rank computes the same outputs, so ranks other
// than 0 have their stdout silenced here (the launcher drops it too; torchrun would not).
absl::StatusOr<std::shared_ptr<ProcessGroup>> JoinTensorParallel(const c10::Device& device);

// Interactive input for every rank: rank 0 passes `has_line` and `*line` (what it read);
// every rank returns rank 0's `has_line` with `*line` set to rank 0's line.
absl::StatusOr<bool> ShareLine(ProcessGroup& group, bool has_line, std::string* line);

}  // namespace lgpt

#endif  // LGPT_TOOLS_TP_FLAGS_H_
