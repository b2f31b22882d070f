#include "core/dist/test_util.h"

#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace lgpt {
namespace {

std::string ReadBack(FILE* file) {
  std::string text;
  fflush(file);
  rewind(file);
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), file)) > 0) text.append(buffer, n);
  fclose(file);
  return text;
}

}  // namespace

absl::StatusOr<RanksRun> RunRanks(LaunchSpec spec) {
  absl::StatusOr<int> port = FreeLocalPort();
  if (!port.ok()) return port.status();
  spec.env.push_back({"MASTER_ADDR", "127.0.0.1"});
  spec.env.push_back({"MASTER_PORT", absl::StrCat(*port)});
  FILE* out = tmpfile();
  FILE* err = tmpfile();
  if (out == nullptr || err == nullptr) {
    return absl::InternalError(absl::StrCat("tmpfile: ", strerror(errno)));
  }
  spec.stdout_fd = fileno(out);
  spec.stderr_fd = fileno(err);
  const absl::Time start = absl::Now();
  absl::StatusOr<int> code = LaunchRanks(spec);
  RanksRun run;
  run.elapsed = absl::Now() - start;
  run.out = ReadBack(out);
  run.err = ReadBack(err);
  if (!code.ok()) return code.status();
  run.exit_code = *code;
  return run;
}

}  // namespace lgpt
