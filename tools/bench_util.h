// Helpers shared by the serving benchmarks (bench_serve in process, bench_http over HTTP).
#ifndef LGPT_TOOLS_BENCH_UTIL_H_
#define LGPT_TOOLS_BENCH_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace lgpt {

// The q-quantile (0..1) of `values` by the nearest-rank rule; 0 for none.
double Percentile(std::vector<double> values, double q);

// "1,4,16" -> {1, 4, 16}; InvalidArgument naming --concurrency for an empty list or a part
// that is not a number >= 1.
absl::StatusOr<std::vector<int64_t>> ParseConcurrency(const std::string& text);

}  // namespace lgpt

#endif  // LGPT_TOOLS_BENCH_UTIL_H_
