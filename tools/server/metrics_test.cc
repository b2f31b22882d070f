// Prometheus text: counters by label, cumulative histogram buckets, the scheduler's gauges.
#include "tools/server/metrics.h"

#include <gtest/gtest.h>

namespace lgpt {
namespace {

bool Has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(MetricsTest, HistogramBucketsAreCumulative) {
  Histogram histogram({0.1, 1});
  histogram.Observe(0.05);
  histogram.Observe(0.1);
  histogram.Observe(0.5);
  histogram.Observe(7);
  std::string out;
  histogram.Render("h", out);
  EXPECT_TRUE(Has(out, "h_bucket{le=\"0.1\"} 2")) << out;
  EXPECT_TRUE(Has(out, "h_bucket{le=\"1\"} 3")) << out;
  EXPECT_TRUE(Has(out, "h_bucket{le=\"+Inf\"} 4")) << out;
  EXPECT_TRUE(Has(out, "h_sum 7.65")) << out;
  EXPECT_TRUE(Has(out, "h_count 4")) << out;
}

TEST(MetricsTest, RendersRequestsTokensAndSchedulerState) {
  ServerMetrics metrics;
  metrics.RecordRequest("/v1/completions", "200");
  metrics.RecordRequest("/v1/completions", "200");
  metrics.RecordRequest("/v1/chat/completions", "cancelled");
  metrics.AddTokens(10, 3);
  metrics.AddTokens(5, 2);
  metrics.ObserveTimeToFirstToken(0.2);
  metrics.ObserveInterToken(0.01);
  SchedulerStats stats;
  stats.running = 2;
  stats.waiting = 1;
  stats.pool_blocks = 100;
  stats.pool_blocks_used = 30;
  stats.pool_blocks_cached = 10;
  stats.prefix_hits = 4;
  stats.preemptions = 1;
  const std::string text = metrics.Render(stats);
  EXPECT_TRUE(Has(text, "lgpt_http_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2"));
  EXPECT_TRUE(Has(
      text, "lgpt_http_requests_total{endpoint=\"/v1/chat/completions\",status=\"cancelled\"} 1"));
  EXPECT_TRUE(Has(text, "lgpt_prompt_tokens_total 15"));
  EXPECT_TRUE(Has(text, "lgpt_generation_tokens_total 5"));
  EXPECT_TRUE(Has(text, "lgpt_requests_running 2"));
  EXPECT_TRUE(Has(text, "lgpt_requests_waiting 1"));
  EXPECT_TRUE(Has(text, "lgpt_kv_blocks_used 30"));
  EXPECT_TRUE(Has(text, "lgpt_kv_blocks_free 60"));
  EXPECT_TRUE(Has(text, "lgpt_prefix_cache_hits_total 4"));
  EXPECT_TRUE(Has(text, "lgpt_preemptions_total 1"));
  EXPECT_TRUE(Has(text, "lgpt_time_to_first_token_seconds_count 1"));
  EXPECT_TRUE(Has(text, "lgpt_inter_token_latency_seconds_count 1"));
  EXPECT_TRUE(Has(text, "# TYPE lgpt_time_to_first_token_seconds histogram"));
  EXPECT_TRUE(Has(text, "# TYPE lgpt_requests_running gauge"));
}

TEST(MetricsTest, RendersSpeculativeDecodingCounters) {
  ServerMetrics metrics;
  SchedulerStats stats;
  std::string text = metrics.Render(stats);
  // Present (at zero) before any speculation, so that rates over them start from 0.
  EXPECT_TRUE(Has(text, "lgpt_spec_decode_num_drafts_total 0")) << text;
  EXPECT_TRUE(Has(text, "lgpt_spec_decode_num_draft_tokens_total 0")) << text;
  EXPECT_TRUE(Has(text, "lgpt_spec_decode_num_accepted_tokens_total 0")) << text;
  stats.speculative_steps = 7;
  stats.proposed_tokens = 28;
  stats.accepted_tokens = 19;
  text = metrics.Render(stats);
  EXPECT_TRUE(Has(text, "# TYPE lgpt_spec_decode_num_drafts_total counter")) << text;
  EXPECT_TRUE(Has(text, "# TYPE lgpt_spec_decode_num_draft_tokens_total counter")) << text;
  EXPECT_TRUE(Has(text, "# TYPE lgpt_spec_decode_num_accepted_tokens_total counter")) << text;
  EXPECT_TRUE(Has(text, "lgpt_spec_decode_num_drafts_total 7")) << text;
  EXPECT_TRUE(Has(text, "lgpt_spec_decode_num_draft_tokens_total 28")) << text;
  EXPECT_TRUE(Has(text, "lgpt_spec_decode_num_accepted_tokens_total 19")) << text;
}

}  // namespace
}  // namespace lgpt
