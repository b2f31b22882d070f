// Runs a test's ranks through the launcher and collects what they print.
#ifndef LGPT_CORE_DIST_TEST_UTIL_H_
#define LGPT_CORE_DIST_TEST_UTIL_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/dist/launcher.h"

namespace lgpt {

struct RanksRun {
  int exit_code = -1;
  std::string out;  // rank 0's stdout
  std::string err;  // every rank's stderr, prefixed, and the launcher's lines
  absl::Duration elapsed;
};

// LaunchRanks(spec) with stdout and stderr captured; spec's MASTER_ADDR/MASTER_PORT are
// added (a free local port). spec.stdout_fd / stderr_fd are ignored.
absl::StatusOr<RanksRun> RunRanks(LaunchSpec spec);

}  // namespace lgpt

#endif  // LGPT_CORE_DIST_TEST_UTIL_H_
