#include "tools/server/metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace lgpt {
namespace {

std::string LabelValue(absl::string_view value) {
  return absl::StrReplaceAll(value, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}});
}

void Header(std::string& out, absl::string_view name, absl::string_view type,
            absl::string_view help) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

void Single(std::string& out, absl::string_view name, absl::string_view type,
            absl::string_view help, int64_t value) {
  Header(out, name, type, help);
  absl::StrAppend(&out, name, " ", value, "\n");
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  std::lock_guard<std::mutex> lock(mutex_);
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

void Histogram::Render(absl::string_view name, std::string& out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t cumulative = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? absl::StrCat(bounds_[i]) : "+Inf";
    absl::StrAppend(&out, name, "_bucket{le=\"", le, "\"} ", cumulative, "\n");
  }
  absl::StrAppend(&out, name, "_sum ", sum_, "\n", name, "_count ", count_, "\n");
}

ServerMetrics::ServerMetrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      inter_token_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}),
      duration_({0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}) {}

void ServerMetrics::RecordRequest(absl::string_view endpoint, absl::string_view status) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++requests_[{std::string(endpoint), std::string(status)}];
}

void ServerMetrics::AddTokens(int64_t prompt_tokens, int64_t generated_tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  prompt_tokens_ += prompt_tokens;
  generated_tokens_ += generated_tokens;
}

std::string ServerMetrics::Render(const SchedulerStats& stats) const {
  std::string out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Header(out, "lgpt_http_requests_total", "counter",
           "HTTP requests by endpoint and status (cancelled: the client left mid-stream)");
    for (const auto& [key, count] : requests_) {
      absl::StrAppend(&out, "lgpt_http_requests_total{endpoint=\"", LabelValue(key.first),
                      "\",status=\"", LabelValue(key.second), "\"} ", count, "\n");
    }
    Single(out, "lgpt_prompt_tokens_total", "counter", "prompt tokens of served requests",
           prompt_tokens_);
    Single(out, "lgpt_generation_tokens_total", "counter", "tokens generated for served requests",
           generated_tokens_);
  }
  Single(out, "lgpt_requests_running", "gauge", "requests decoding in the scheduler",
         stats.running);
  Single(out, "lgpt_requests_waiting", "gauge", "requests queued for the scheduler", stats.waiting);
  Single(out, "lgpt_scheduler_requests_submitted_total", "counter", "requests submitted",
         stats.submitted);
  Single(out, "lgpt_scheduler_requests_completed_total", "counter", "requests completed",
         stats.completed);
  Single(out, "lgpt_scheduler_requests_cancelled_total", "counter", "requests cancelled",
         stats.cancelled);
  Single(out, "lgpt_scheduler_requests_failed_total", "counter", "requests failed", stats.failed);
  Single(out, "lgpt_kv_blocks_total", "gauge", "blocks of the KV pool (0: no pool)",
         stats.pool_blocks);
  Single(out, "lgpt_kv_blocks_used", "gauge", "KV pool blocks held by requests",
         stats.pool_blocks_used);
  Single(out, "lgpt_kv_blocks_cached", "gauge", "unreferenced KV blocks kept by the prefix cache",
         stats.pool_blocks_cached);
  Single(out, "lgpt_kv_blocks_free", "gauge", "KV pool blocks neither used nor cached",
         stats.pool_blocks - stats.pool_blocks_used - stats.pool_blocks_cached);
  Single(out, "lgpt_kv_block_bytes", "gauge", "bytes of one KV pool block", stats.pool_block_bytes);
  Single(out, "lgpt_prefix_cache_hits_total", "counter",
         "requests that reused cached prompt blocks", stats.prefix_hits);
  Single(out, "lgpt_prefix_cache_hit_tokens_total", "counter",
         "prompt tokens taken from the prefix cache", stats.prefix_hit_tokens);
  Single(out, "lgpt_preemptions_total", "counter", "requests preempted and recomputed",
         stats.preemptions);
  // Speculative decoding, in vLLM's names (vllm:spec_decode_num_*_total): acceptance rate =
  // accepted / draft tokens; each draft (a verification step of one request) also yields one
  // token of the model's own.
  Single(out, "lgpt_spec_decode_num_drafts_total", "counter",
         "speculative verification steps (one request's proposals verified at once)",
         stats.speculative_steps);
  Single(out, "lgpt_spec_decode_num_draft_tokens_total", "counter",
         "tokens proposed by speculative decoding", stats.proposed_tokens);
  Single(out, "lgpt_spec_decode_num_accepted_tokens_total", "counter",
         "proposed tokens the model accepted", stats.accepted_tokens);
  Header(out, "lgpt_time_to_first_token_seconds", "histogram",
         "from submission to the first generated token");
  ttft_.Render("lgpt_time_to_first_token_seconds", out);
  Header(out, "lgpt_inter_token_latency_seconds", "histogram",
         "between consecutive generated tokens of a request");
  inter_token_.Render("lgpt_inter_token_latency_seconds", out);
  Header(out, "lgpt_request_duration_seconds", "histogram",
         "from the request's arrival to its last byte");
  duration_.Render("lgpt_request_duration_seconds", out);
  return out;
}

}  // namespace lgpt
