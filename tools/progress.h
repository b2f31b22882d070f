// Progress of long work (training steps, evaluation rows) with an ETA, on stderr: a line
// rewritten in place (carriage return) a few times a second when stderr is a terminal, a full
// line every ten seconds otherwise (logs and pipes get no per-step spam).
//
//   Progress progress("pretrain", max_steps);
//   for (...) progress.Update(step + 1, absl::StrFormat("loss %.4f", loss));
//   progress.Finish();
#ifndef LGPT_TOOLS_PROGRESS_H_
#define LGPT_TOOLS_PROGRESS_H_

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/strings/string_view.h"

namespace lgpt {

struct ProgressOptions {
  FILE* out = stderr;
  // -1: ask isatty() on `out`; 0 or 1 force the mode (tests).
  int terminal = -1;
  double terminal_interval_s = 0.25;  // between in-place rewrites
  double line_interval_s = 10;        // between full lines when not a terminal
};

class Progress {
 public:
  // `total` units of work (steps, tokens); `start` units already done (a resumed run), which
  // the ETA does not count as this run's speed.
  Progress(std::string label, int64_t total, int64_t start = 0, ProgressOptions options = {});
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // `done` units so far (absolute); `detail` is appended (loss, rate). Prints only when the
  // interval has passed, and always when `done` reaches the total.
  void Update(int64_t done, absl::string_view detail = "");
  // A line of its own (a validation loss, a result row), keeping the progress line intact.
  void Message(absl::string_view line);
  // Ends the progress line (once; the destructor calls it too).
  void Finish();

  // "42s", "3m05s", "1h02m".
  static std::string FormatDuration(double seconds);
  // "label 120/1400 (8.6%) 1m05s elapsed, eta 11m30s  detail"
  std::string Line(int64_t done, double elapsed_s, absl::string_view detail) const;

 private:
  void Print(const std::string& line);

  std::string label_;
  int64_t total_, start_;
  ProgressOptions options_;
  bool terminal_;
  std::chrono::steady_clock::time_point begin_, last_print_;
  bool line_pending_ = false;  // a terminal line without its newline
  bool finished_ = false;
  std::string last_line_;
};

}  // namespace lgpt

#endif  // LGPT_TOOLS_PROGRESS_H_
