#include "tools/generation_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "core/base/device.h"
#include "core/base/status_macros.h"
#include "tools/load_flags.h"
#include "tools/tool_util.h"

ABSL_FLAG(double, temperature, 0.8, "sampling temperature; 0 is greedy");
ABSL_FLAG(int64_t, top_k, 50, "sample from the k most likely tokens; 0 means all");
ABSL_FLAG(double, top_p, 1.0, "nucleus sampling mass in [0, 1]");
ABSL_FLAG(uint64_t, seed, 1234, "random seed");
ABSL_FLAG(std::string, precision, "32-true", "32-true, bf16-true or 16-true");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda[:N]");
ABSL_FLAG(std::string, quantize, "none",
          "none, int8 (q8_0-like: int8 weights, a scale per 32) or int4 (q4_0-like: 4-bit "
          "weights, a scale per 32); every projection and lm_head, quantised at load (on the CPU "
          "with --precision=32-true; on CUDA any precision)");
ABSL_FLAG(std::string, kv_cache, "dense",
          "KV cache policy: dense, window, sink, h2o, tova, h2o-vlen or qh2o (8/4 bits)");
ABSL_FLAG(int64_t, kv_budget, 0, "entries kept per layer (and row, group); not for dense");
ABSL_FLAG(int, kv_bits, 16, "bits per cached key/value: 16 (the model's dtype), 8 or 4");
ABSL_FLAG(int64_t, kv_sink, 4, "sink: first tokens always kept");
ABSL_FLAG(int64_t, kv_residual, 16, "8/4 bits: most recent entries kept in full precision");
ABSL_FLAG(int64_t, kv_grace, -1,
          "score policies: the newest N positions are never evicted (-1: h2o family half the "
          "budget, tova none)");
ABSL_FLAG(bool, kv_normalize_scores, false,
          "h2o family: divide accumulated scores by the queries that saw the entry");
ABSL_FLAG(std::string, kv_budget_rule, "uniform",
          "uniform, or pyramid: per-layer budgets from 1.5x (first layer) to 0.5x (last)");
ABSL_FLAG(std::string, kv_positions, "absolute",
          "absolute: stream positions (generation ends at the context); cache (window and sink "
          "caches): positions within the cache, so generation goes past the context");

namespace lgpt {

absl::Status ApplyGenerationFlags(RequestOptions& options) {
  options.sampling.temperature = absl::GetFlag(FLAGS_temperature);
  options.sampling.top_k = absl::GetFlag(FLAGS_top_k);
  options.sampling.top_p = absl::GetFlag(FLAGS_top_p);
  options.seed = absl::GetFlag(FLAGS_seed);
  RETURN_IF_ERROR(ValidateSampling(options.sampling));
  options.kv_cache.policy = absl::GetFlag(FLAGS_kv_cache);
  options.kv_cache.budget = absl::GetFlag(FLAGS_kv_budget);
  options.kv_cache.bits = absl::GetFlag(FLAGS_kv_bits);
  options.kv_cache.sink_tokens = absl::GetFlag(FLAGS_kv_sink);
  options.kv_cache.residual = absl::GetFlag(FLAGS_kv_residual);
  options.kv_cache.grace_period = absl::GetFlag(FLAGS_kv_grace);
  options.kv_cache.normalize_scores = absl::GetFlag(FLAGS_kv_normalize_scores);
  options.kv_cache.budget_rule = absl::GetFlag(FLAGS_kv_budget_rule);
  options.kv_cache.positions = absl::GetFlag(FLAGS_kv_positions);
  return ValidateKVCacheSpec(options.kv_cache);
}

absl::StatusOr<EngineOptions> EngineOptionsFromFlags() {
  EngineOptions options;
  ASSIGN_OR_RETURN(options.dtype, ParsePrecision(absl::GetFlag(FLAGS_precision)));
  ASSIGN_OR_RETURN(options.device, ParseDevice(absl::GetFlag(FLAGS_device)));
  options.progress = PrintProgress;
  const std::string quantize = absl::GetFlag(FLAGS_quantize);
  absl::StatusOr<WeightQuantization> parsed = ParseWeightQuantization(quantize);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--quantize must be none, int8 or int4, got '", quantize, "'"));
  }
  options.quantize = *parsed;
  options.verify_checksums = VerifyChecksumsFlag();
  return options;
}

}  // namespace lgpt
