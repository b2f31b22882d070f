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
  policy.grace_period = spec.grace_period;
  policy.normalize_scores = spec.normalize_scores;
  policy.quant_weight = spec.quant_weight;
  return policy;
}

absl::StatusOr<PolicyKind> SpecPolicy(const KVCacheSpec& spec) {
  absl::StatusOr<PolicyKind> kind = ParsePolicyKind(spec.policy);
  if (!kind.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KVCacheSpec.policy: ", kind.status().message()));
  }
  return kind;
}

}  // namespace

absl::Status ValidateKVCacheSpec(const KVCacheSpec& spec) {
  ASSIGN_OR_RETURN(const PolicyKind kind, SpecPolicy(spec));
  RETURN_IF_ERROR(ValidateEvictionPolicy(PolicyOptions(spec, kind), "KVCacheSpec"));
  RETURN_IF_ERROR(ValidateEntryStorage(spec.bits, spec.residual, spec.group_size, spec.block_size,
                                       "KVCacheSpec"));
  if (spec.positions != "absolute" && spec.positions != "cache") {
    return absl::InvalidArgumentError(absl::StrCat(
        "KVCacheSpec.positions must be absolute or cache, got '", spec.positions, "'"));
  }
  if (kind == PolicyKind::kQH2O && spec.bits == 16) {
    return absl::InvalidArgumentError(
        "KVCacheSpec.policy qh2o needs KVCacheSpec.bits 8 or 4 (it scores quantisation error)");
  }
  if (absl::Status rule = LayerBudgets(spec.budget_rule, spec.budget, 1).status(); !rule.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("KVCacheSpec.", rule.message()));
  }
  if (UsesCachePositions(spec) && spec.budget_rule != "uniform") {
    return absl::InvalidArgumentError(
        "KVCacheSpec.positions=cache needs KVCacheSpec.budget_rule uniform");
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
  return absl::StrCat(spec.policy, " budget=", spec.budget,
                      spec.budget_rule != "uniform" ? absl::StrCat("(", spec.budget_rule, ")") : "",
                      " bits=", bits, UsesCachePositions(spec) ? " positions=cache" : "");
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
  // PolicyKVCache checks this too, in its own options' names; a caller wrote these.
  if (UsesCachePositions(spec) && spec.budget >= shape.max_sequence_length) {
    return absl::InvalidArgumentError(
        absl::StrCat("KVCacheSpec.positions=cache needs KVCacheSpec.budget below the context (",
                     shape.max_sequence_length, " tokens), got ", spec.budget));
  }
  PolicyKVCacheOptions options;
  static_cast<KVCacheGeometry&>(options) = shape;
  options.policy = PolicyOptions(spec, kind);
  if (spec.budget_rule != "uniform" && kind != PolicyKind::kDense) {
    ASSIGN_OR_RETURN(
        options.policy.layer_budgets,
        LayerBudgets(spec.budget_rule, spec.budget, static_cast<int64_t>(shape.layers.size())));
  }
  options.bits = spec.bits;
  options.residual = spec.residual;
  options.group_size = spec.group_size;
  options.block_size = spec.block_size;
  options.cache_positions = UsesCachePositions(spec);
  options.growth_step = shape.growth_step;
  ASSIGN_OR_RETURN(std::unique_ptr<PolicyKVCache> cache, PolicyKVCache::Create(options));
  return std::unique_ptr<KVCache>(std::move(cache));
}

}  // namespace lgpt
