#include "cache/kv_cache_factory.h"

#include "absl/strings/str_cat.h"
#include "cache/dense_kv_cache.h"
#include "cache/eviction_policy.h"
#include "cache/policy_kv_cache.h"
#include "core/base/status_macros.h"

namespace lgpt {

absl::Status ValidateKVCacheSpec(const KVCacheSpec& spec) {
  ASSIGN_OR_RETURN(const PolicyKind kind, ParsePolicyKind(spec.policy));
  if (spec.bits != 16 && spec.bits != 8 && spec.bits != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_bits must be 16, 8 or 4, got ", spec.bits));
  }
  if (kind != PolicyKind::kDense && spec.budget < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv_budget must be >= 1 for --kv_cache=", spec.policy, ", got ", spec.budget));
  }
  if (kind == PolicyKind::kSink && (spec.sink_tokens < 0 || spec.sink_tokens > spec.budget)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv_sink=", spec.sink_tokens, " must be in [0, --kv_budget=", spec.budget, "]"));
  }
  if (spec.residual < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_residual must be >= 0, got ", spec.residual));
  }
  if (spec.group_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_group must be >= 1, got ", spec.group_size));
  }
  if (!(spec.recent_fraction >= 0 && spec.recent_fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("h2o recent fraction must be in [0, 1], got ", spec.recent_fraction));
  }
  if (spec.block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV attention block size must be >= 1, got ", spec.block_size));
  }
  if (spec.positions != "absolute" && spec.positions != "cache") {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_positions (KVCacheSpec.positions) must be absolute or cache, got '",
                     spec.positions, "'"));
  }
  if (UsesCachePositions(spec) && kind != PolicyKind::kWindow && kind != PolicyKind::kSink) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv_positions=cache (KVCacheSpec.positions) needs --kv_cache=window or sink (whose "
        "kept entries are contiguous in position), got --kv_cache=",
        spec.policy));
  }
  return absl::OkStatus();
}

std::string DescribeKVCacheSpec(const KVCacheSpec& spec,
                                std::optional<c10::ScalarType> model_dtype) {
  const int64_t bits =
      spec.bits == 16 && model_dtype ? 8 * c10::elementSize(*model_dtype) : spec.bits;
  if (spec.policy == "dense") return absl::StrCat("dense bits=", bits);
  return absl::StrCat(spec.policy, " budget=", spec.budget, " bits=", bits,
                      UsesCachePositions(spec) ? " positions=cache" : "");
}

absl::StatusOr<std::unique_ptr<KVCache>> MakeKVCache(const KVCacheSpec& spec,
                                                     const KVCacheShape& shape) {
  RETURN_IF_ERROR(ValidateKVCacheSpec(spec));
  ASSIGN_OR_RETURN(const PolicyKind kind, ParsePolicyKind(spec.policy));
  if (kind == PolicyKind::kDense && spec.bits == 16) {
    DenseKVCacheOptions options;
    options.batch_size = shape.batch_size;
    options.max_sequence_length = shape.max_sequence_length;
    options.layers = shape.layers;
    options.dtype = shape.dtype;
    options.device = shape.device;
    options.initial_capacity = shape.initial_capacity;
    ASSIGN_OR_RETURN(std::unique_ptr<DenseKVCache> cache, DenseKVCache::Create(options));
    return std::unique_ptr<KVCache>(std::move(cache));
  }
  PolicyKVCacheOptions options;
  options.batch_size = shape.batch_size;
  options.max_sequence_length = shape.max_sequence_length;
  options.layers = shape.layers;
  options.dtype = shape.dtype;
  options.device = shape.device;
  options.policy.kind = kind;
  options.policy.budget = spec.budget;
  options.policy.sink_tokens = spec.sink_tokens;
  options.policy.recent_fraction = spec.recent_fraction;
  options.bits = spec.bits;
  options.residual = spec.residual;
  options.group_size = spec.group_size;
  options.block_size = spec.block_size;
  options.cache_positions = UsesCachePositions(spec);
  ASSIGN_OR_RETURN(std::unique_ptr<PolicyKVCache> cache, PolicyKVCache::Create(options));
  return std::unique_ptr<KVCache>(std::move(cache));
}

int64_t KVCacheIndexBytes(const KVCache& cache) {
  if (const auto* dense = dynamic_cast<const DenseKVCache*>(&cache)) return dense->IndexBytes();
  if (const auto* policy = dynamic_cast<const PolicyKVCache*>(&cache)) {
    return policy->IndexBytes();
  }
  return 0;
}

}  // namespace lgpt
