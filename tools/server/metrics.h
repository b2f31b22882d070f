// The server's Prometheus metrics (text exposition format 0.0.4): requests by endpoint and
// status, prompt and generated tokens, histograms of time to first token, inter-token latency
// and request duration, beside the scheduler's gauges and counters (running and waiting
// requests, KV pool blocks, prefix-cache hits, preemptions, speculative decoding's drafts and
// proposed and accepted tokens). Thread-safe.
#ifndef LGPT_TOOLS_SERVER_METRICS_H_
#define LGPT_TOOLS_SERVER_METRICS_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/serving/scheduler.h"

namespace lgpt {

// Cumulative buckets with upper bounds `bounds` (ascending) and +Inf.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  // NAME_bucket{le="..."}, NAME_sum and NAME_count lines (HELP and TYPE are the caller's).
  void Render(absl::string_view name, std::string& out) const;

 private:
  mutable std::mutex mutex_;
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();

  // One finished HTTP request; `status` is the HTTP status ("200", "429", ...) or "cancelled"
  // for a stream its client left.
  void RecordRequest(absl::string_view endpoint, absl::string_view status);
  void AddTokens(int64_t prompt_tokens, int64_t generated_tokens);
  void ObserveTimeToFirstToken(double seconds) { ttft_.Observe(seconds); }
  void ObserveInterToken(double seconds) { inter_token_.Observe(seconds); }
  void ObserveRequestDuration(double seconds) { duration_.Observe(seconds); }

  // Every metric, the scheduler's included.
  std::string Render(const SchedulerStats& stats) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, std::string>, int64_t> requests_;  // (endpoint, status)
  int64_t prompt_tokens_ = 0;
  int64_t generated_tokens_ = 0;
  Histogram ttft_;
  Histogram inter_token_;
  Histogram duration_;
};

}  // namespace lgpt

#endif  // LGPT_TOOLS_SERVER_METRICS_H_
