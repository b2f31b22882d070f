#include "cache/kv_cache_factory.h"

#include "absl/strings/str_cat.h"
#include "cache/dense_kv_cache.h"
#include "cache/eviction_policy.h"
#include "cache/policy_kv_cache.h"
#include "core/base/status_field.h"
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
    return InvalidFieldError("KVCacheSpec.policy",
                             absl::StrCat("KVCacheSpec.policy: ", kind.status().message()));
  }
  return kind;
}

// KVCacheSpec's names for the rules across a policy cache's options.
const PolicyCacheFields& SpecFields() {
  static const PolicyCacheFields* fields = [] {
    auto* f = new PolicyCacheFields();
    f->policy = "KVCacheSpec.policy";
    f->bits = "KVCacheSpec.bits";
    f->budget = "KVCacheSpec.budget";
    f->positions = "KVCacheSpec.positions";
    f->positions_on = "KVCacheSpec.positions=cache";
    f->layer_budgets = "KVCacheSpec.budget_rule";
    f->one_budget = "KVCacheSpec.budget_rule uniform";
    return f;
  }();
  return *fields;
}

}  // namespace

absl::Status ValidateKVCacheSpec(const KVCacheSpec& spec) {
  ASSIGN_OR_RETURN(const PolicyKind kind, SpecPolicy(spec));
  RETURN_IF_ERROR(ValidateEvictionPolicy(PolicyOptions(spec, kind), "KVCacheSpec"));
  RETURN_IF_ERROR(ValidateEntryStorage(spec.bits, spec.residual, spec.group_size, spec.read_chunk,
                                       "KVCacheSpec"));
  if (spec.positions != "absolute" && spec.positions != "cache") {
    return InvalidFieldError("KVCacheSpec.positions",
                             absl::StrCat("KVCacheSpec.positions must be absolute or cache, got '",
                                          spec.positions, "'"));
  }
  if (absl::Status rule = LayerBudgets(spec.budget_rule, spec.budget, 1).status(); !rule.ok()) {
    return InvalidFieldError("KVCacheSpec.budget_rule",
                             absl::StrCat("KVCacheSpec.", rule.message()));
  }
  RETURN_IF_ERROR(CheckPolicyCacheRules(kind, spec.bits, UsesCachePositions(spec), spec.budget,
                                        spec.budget_rule != "uniform", std::nullopt, SpecFields()));
  // The dense cache keeps every entry: a budget there would be silently ignored.
  if (kind == PolicyKind::kDense && spec.budget != 0) {
    return InvalidFieldError(
        "KVCacheSpec.budget",
        absl::StrCat("KVCacheSpec.budget=", spec.budget,
                     " needs a budgeted KVCacheSpec.policy (window, sink, h2o, tova, h2o-vlen, "
                     "qh2o), not dense"),
        {"KVCacheSpec.policy"});
  }
  return absl::OkStatus();
}

absl::StatusOr<EvictionPolicyOptions> EvictionPolicyOf(const KVCacheSpec& spec,
                                                       int64_t num_layers) {
  ASSIGN_OR_RETURN(const PolicyKind kind, SpecPolicy(spec));
  EvictionPolicyOptions policy = PolicyOptions(spec, kind);
  if (spec.budget_rule != "uniform" && kind != PolicyKind::kDense) {
    ASSIGN_OR_RETURN(policy.layer_budgets, LayerBudgets(spec.budget_rule, spec.budget, num_layers));
  }
  return policy;
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
    options.rollback_slots = shape.rollback_slots;
    ASSIGN_OR_RETURN(std::unique_ptr<DenseKVCache> cache, DenseKVCache::Create(options));
    return std::unique_ptr<KVCache>(std::move(cache));
  }
  // The rule PolicyKVCache::Create checks too, here in the names the caller wrote.
  RETURN_IF_ERROR(CheckPolicyCacheRules(kind, spec.bits, UsesCachePositions(spec), spec.budget,
                                        spec.budget_rule != "uniform", shape.max_sequence_length,
                                        SpecFields()));
  PolicyKVCacheOptions options;
  static_cast<KVCacheGeometry&>(options) = shape;
  ASSIGN_OR_RETURN(options.policy,
                   EvictionPolicyOf(spec, static_cast<int64_t>(shape.layers.size())));
  options.bits = spec.bits;
  options.residual = spec.residual;
  options.group_size = spec.group_size;
  options.read_chunk = spec.read_chunk;
  options.cache_positions = UsesCachePositions(spec);
  options.growth_step = shape.growth_step;
  ASSIGN_OR_RETURN(std::unique_ptr<PolicyKVCache> cache, PolicyKVCache::Create(options));
  return std::unique_ptr<KVCache>(std::move(cache));
}

}  // namespace lgpt
