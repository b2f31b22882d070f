#include "cache/kv_cache_factory.h"

#include "absl/strings/str_cat.h"
#include "cache/dense_kv_cache.h"
#include "cache/eviction_policy.h"
#include "cache/policy_kv_cache.h"
#include "core/base/status_macros.h"

namespace lgpt {

namespace {

EvictionPolicyOptions PolicyOptions(const KVCacheSpec& spec, PolicyKind kind) {
  EvictionPolicyOptions policy;
  policy.kind = kind;
  policy.budget = spec.budget;
  policy.sink_tokens = spec.sink_tokens;
  policy.recent_fraction = spec.recent_fraction;
  return policy;
}

absl::StatusOr<PolicyKind> SpecPolicy(const KVCacheSpec& spec) {
  absl::StatusOr<PolicyKind> kind = ParsePolicyKind(spec.policy);
  if (!kind.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("KVCacheSpec.policy: ", kind.status().message()));
  }
  return kind;
}

}  // namespace

absl::Status ValidateKVCacheSpec(const KVCacheSpec& spec) {
  ASSIGN_OR_RETURN(const PolicyKind kind, SpecPolicy(spec));
  RETURN_IF_ERROR(ValidateEvictionPolicy(PolicyOptions(spec, kind), "KVCacheSpec"));
  RETURN_IF_ERROR(ValidateEntryStorage(spec.bits, spec.residual, spec.group_size,
                                       spec.block_size, "KVCacheSpec"));
  if (spec.positions != "absolute" && spec.positions != "cache") {
    return absl::InvalidArgumentError(absl::StrCat(
        "KVCacheSpec.positions must be absolute or cache, got '", spec.positions, "'"));
  }
  if (UsesCachePositions(spec) && !KeepsContiguousPositions(kind)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KVCacheSpec.positions=cache needs KVCacheSpec.policy window or sink (whose kept entries "
        "are contiguous in position), got ",
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
  ASSIGN_OR_RETURN(const PolicyKind kind, SpecPolicy(spec));
  if (kind == PolicyKind::kDense && spec.bits == 16) {
    DenseKVCacheOptions options;
    static_cast<KVCacheGeometry&>(options) = shape;
    options.initial_capacity = shape.initial_capacity;
    ASSIGN_OR_RETURN(std::unique_ptr<DenseKVCache> cache, DenseKVCache::Create(options));
    return std::unique_ptr<KVCache>(std::move(cache));
  }
  PolicyKVCacheOptions options;
  static_cast<KVCacheGeometry&>(options) = shape;
  options.policy = PolicyOptions(spec, kind);
  options.bits = spec.bits;
  options.residual = spec.residual;
  options.group_size = spec.group_size;
  options.block_size = spec.block_size;
  options.cache_positions = UsesCachePositions(spec);
  ASSIGN_OR_RETURN(std::unique_ptr<PolicyKVCache> cache, PolicyKVCache::Create(options));
  return std::unique_ptr<KVCache>(std::move(cache));
}

}  // namespace lgpt
