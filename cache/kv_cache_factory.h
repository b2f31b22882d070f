// Building a KV cache from what a caller names (KVCacheSpec): policy
// dense|window|sink|h2o|tova|h2o-vlen|qh2o,
// budget (entries kept per layer), bits 16|8|4 (16: the model's own dtype), the finer
// sink_tokens, residual and group_size, and positions absolute|cache (whether a window or sink
// cache keeps stream positions, bounded by the context, or positions within the cache,
// unbounded: see cache/policy_kv_cache.h). Tools fill it from --kv_cache, --kv_budget, ... The
// dense policy at 16 bits is the exact DenseKVCache; everything else is a PolicyKVCache
// (cache/policy_kv_cache.h).
#ifndef LGPT_CACHE_KV_CACHE_FACTORY_H_
#define LGPT_CACHE_KV_CACHE_FACTORY_H_

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/eviction_policy.h"
#include "cache/kv_cache.h"

namespace lgpt {

struct KVCacheSpec {
  std::string policy = "dense";
  int64_t budget = 0;  // entries per layer and (row, group); >= 1, or 0 for dense
  int bits = 16;
  int64_t sink_tokens = 4;        // sink
  double recent_fraction = 0.5;   // h2o family: the recent window's share of the budget
  int64_t grace_period = -1;      // score policies: newest positions never evicted (-1: default)
  bool normalize_scores = false;  // h2o family: scores per query that saw the entry
  double quant_weight = 0.5;      // qh2o: the attention score's weight against the error
  std::string budget_rule = "uniform";  // or "pyramid": budgets per layer (eviction_policy.h)
  int64_t residual = 16;                // quantised: most recent entries kept in full precision
  int64_t group_size = 32;              // quantised: channels per scale
  int64_t read_chunk = 512;  // quantised: entries decoded at a time when attending in place
  // "absolute": entries keep their stream positions, so a stream ends at the context.
  // "cache" (window and sink only): positions within the cache, shifted down when they reach
  // the context, so generation goes on indefinitely in flat memory (StreamingLLM).
  std::string positions = "absolute";
};

// Whether `spec` asks for cache positions (a stream not bounded by the context).
inline bool UsesCachePositions(const KVCacheSpec& spec) { return spec.positions == "cache"; }

// Every rule of a KVCacheSpec, checked here alone (MakeKVCache, the facade and the tools and
// server call it). Errors name the field and the value ("KVCacheSpec.budget must be >= 1 for
// policy h2o, got 0") and carry the field (core/base/status_field.h), which tools show as their
// flag and the server as its request field: unknown policy, budget < 1, a budget on the dense
// cache (which would ignore it), a sink budget below its sink tokens, bits not 16/8/4, negative
// residual, group or block size < 1, positions other than absolute/cache, cache positions with
// a policy other than window and sink, qh2o at 16 bits, a budget rule other than
// uniform/pyramid. MakeKVCache adds the one rule that needs the shape: cache positions need a
// budget below the context.
absl::Status ValidateKVCacheSpec(const KVCacheSpec& spec);

// The eviction policy a spec asks for over `num_layers` layers (its budget rule's budgets per
// layer); the policy name's error.
absl::StatusOr<EvictionPolicyOptions> EvictionPolicyOf(const KVCacheSpec& spec,
                                                       int64_t num_layers);

// "h2o budget=256 bits=8", or "dense bits=16". With the model's dtype, full-precision storage
// (bits 16: the model's dtype) shows its real width: "dense bits=32" for float32.
std::string DescribeKVCacheSpec(const KVCacheSpec& spec,
                                std::optional<c10::ScalarType> model_dtype = std::nullopt);

// The model-side shape of a cache (GPTImpl::CacheLayout() gives `layers`).
struct KVCacheShape : KVCacheGeometry {
  int64_t initial_capacity = 0;  // dense only: slots allocated up front
  int64_t growth_step = 0;       // budgeted and quantised: PolicyKVCacheOptions.growth_step
  // Dense: DenseKVCacheOptions.rollback_slots (sliding-window rings keep this many slots more,
  // so speculative decoding of rollback_slots + 1 tokens can forget rejected entries).
  int64_t rollback_slots = 0;
};

absl::StatusOr<std::unique_ptr<KVCache>> MakeKVCache(const KVCacheSpec& spec,
                                                     const KVCacheShape& shape);

}  // namespace lgpt

#endif  // LGPT_CACHE_KV_CACHE_FACTORY_H_
