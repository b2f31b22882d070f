#include "tools/bench_util.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace lgpt {

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t index = std::min(values.size() - 1, static_cast<size_t>(q * values.size()));
  return values[index];
}

absl::StatusOr<std::vector<int64_t>> ParseConcurrency(const std::string& text) {
  if (text.empty()) return absl::InvalidArgumentError("--concurrency is empty");
  std::vector<int64_t> counts;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    // Every request of a round is built and submitted at once: a million is far beyond any
    // server's batch, and 10^11 ran out of memory building prompts.
    constexpr int64_t kMostRequests = int64_t{1} << 20;
    int64_t n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1 || n > kMostRequests) {
      return absl::InvalidArgumentError(absl::StrCat("--concurrency takes numbers in [1, ",
                                                     kMostRequests, "], got '", part, "'"));
    }
    counts.push_back(n);
  }
  return counts;
}

}  // namespace lgpt
