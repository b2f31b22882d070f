// Local launcher, torchrun's job for one host: a tool given --tp=N and no RANK in its
// environment re-executes itself N times with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
// MASTER_PORT set, forwards rank 0's stdout, prefixes every rank's stderr with "[rank R] ",
// and exits non-zero when any rank fails, ending the others first so nothing waits forever
// on a dead peer. On several hosts, run the tool under each host's own RANK/WORLD_SIZE
// instead: with RANK set the launcher steps aside.
#ifndef LGPT_CORE_DIST_LAUNCHER_H_
#define LGPT_CORE_DIST_LAUNCHER_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace lgpt {

struct LaunchSpec {
  int world_size = 1;
  std::string executable = "/proc/self/exe";
  std::vector<std::string> argv;  // argv[0] included
  // Variables set in every rank besides the launcher's own.
  std::vector<std::pair<std::string, std::string>> env;
  int stdout_fd = STDOUT_FILENO;  // receives rank 0's stdout; other ranks' goes to /dev/null
  int stderr_fd = STDERR_FILENO;  // receives every rank's stderr, line by line, prefixed
  // After a rank fails, the others get SIGTERM, then SIGKILL once this has passed.
  absl::Duration grace = absl::Seconds(3);
  // Stop the others as soon as one rank fails (false: let each rank notice on its own, for
  // testing how ranks report a dead peer).
  bool stop_on_failure = true;
  // The whole run; past it every rank is killed and the run fails.
  absl::Duration timeout = absl::InfiniteDuration();
};

// Runs the ranks of `spec` to completion. Returns the exit code for the launcher: 0 when
// every rank exited 0, else the first failing rank's code (128 + signal when killed, 124
// on timeout); the launcher's own "[launcher] ..." lines on stderr_fd name the rank and why.
// Errors only when no rank could be started.
absl::StatusOr<int> LaunchRanks(const LaunchSpec& spec);

// What a tool calls first. With RANK set in the environment, or tensor_parallel <= 1,
// returns nullopt: run as this process. Otherwise runs `tensor_parallel` ranks of this very
// binary (same argv, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT) and returns the exit code
// the tool's main should return.
std::optional<int> LaunchIfRequested(int tensor_parallel, int argc, char** argv);

// A TCP port on 127.0.0.1 that was free when asked.
absl::StatusOr<int> FreeLocalPort();

}  // namespace lgpt

#endif  // LGPT_CORE_DIST_LAUNCHER_H_
