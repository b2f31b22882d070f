#include "tools/progress.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace lgpt {

Progress::Progress(std::string label, int64_t total, int64_t start, ProgressOptions options)
    : label_(std::move(label)),
      total_(std::max<int64_t>(total, 1)),
      start_(start),
      options_(options),
      terminal_(options.terminal >= 0 ? options.terminal == 1
                                      : ::isatty(::fileno(options.out)) == 1),
      begin_(std::chrono::steady_clock::now()),
      last_print_(begin_) {}

Progress::~Progress() { Finish(); }

std::string Progress::FormatDuration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::max(0.0, seconds) + 0.5);
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
}

std::string Progress::Line(int64_t done, double elapsed_s, absl::string_view detail) const {
  std::string line = absl::StrFormat("%s %d/%d (%.1f%%) %s elapsed", label_, done, total_,
                                     100.0 * done / total_, FormatDuration(elapsed_s));
  const int64_t this_run = done - start_;
  if (done >= total_) {
    absl::StrAppend(&line, ", done");
  } else if (this_run > 0 && elapsed_s > 0) {
    absl::StrAppend(&line, ", eta ",
                    FormatDuration(elapsed_s / this_run * static_cast<double>(total_ - done)));
  }
  if (!detail.empty()) absl::StrAppend(&line, "  ", detail);
  return line;
}

void Progress::Update(int64_t done, absl::string_view detail) {
  if (finished_) return;
  const auto now = std::chrono::steady_clock::now();
  const double since_print = std::chrono::duration<double>(now - last_print_).count();
  const double interval = terminal_ ? options_.terminal_interval_s : options_.line_interval_s;
  // The first line waits one interval too, so short runs print only their last line.
  if (done < total_ && since_print < interval) return;
  last_print_ = now;
  Print(Line(done, std::chrono::duration<double>(now - begin_).count(), detail));
}

void Progress::Print(const std::string& line) {
  if (terminal_) {
    // Pad over a longer previous line; "\033[K" would need a real terminal.
    std::string padded = line;
    if (last_line_.size() > padded.size()) padded.append(last_line_.size() - padded.size(), ' ');
    std::fprintf(options_.out, "\r%s", padded.c_str());
    line_pending_ = true;
  } else {
    std::fprintf(options_.out, "%s\n", line.c_str());
  }
  last_line_ = line;
  std::fflush(options_.out);
}

void Progress::Message(absl::string_view line) {
  if (line_pending_) {
    std::fprintf(options_.out, "\r%s\r", std::string(last_line_.size(), ' ').c_str());
  }
  std::fprintf(options_.out, "%.*s\n", static_cast<int>(line.size()), line.data());
  if (line_pending_ && !finished_) std::fprintf(options_.out, "%s", last_line_.c_str());
  std::fflush(options_.out);
}

void Progress::Finish() {
  if (finished_) return;
  finished_ = true;
  if (line_pending_) std::fprintf(options_.out, "\n");
  line_pending_ = false;
  std::fflush(options_.out);
}

}  // namespace lgpt
