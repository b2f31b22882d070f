#include "cache/eviction_policy.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/status_field.h"

namespace lgpt {
namespace {

// Protected entries rank above any score (scores are sums of weights: at most the number of
// queries times heads; qh2o's lie in [-1, 1]) and keep their order by position (positions are
// far below 1e15 / 2).
constexpr double kProtected = 1e15;

struct NamedKind {
  const char* name;
  PolicyKind kind;
};
constexpr NamedKind kKinds[] = {
    {"dense", PolicyKind::kDense}, {"window", PolicyKind::kWindow},
    {"sink", PolicyKind::kSink},   {"h2o", PolicyKind::kH2O},
    {"tova", PolicyKind::kTova},   {"h2o-vlen", PolicyKind::kH2OVlen},
    {"qh2o", PolicyKind::kQH2O},
};

// x [B, G, S] float64 -> (x - min) / (max - min) over the valid entries of each (row, group);
// 0 where max == min.
at::Tensor MinMaxNormalized(const at::Tensor& x, const at::Tensor& valid) {
  const double inf = std::numeric_limits<double>::infinity();
  const at::Tensor low = x.masked_fill(valid.logical_not(), inf).amin(-1, /*keepdim=*/true);
  const at::Tensor high = x.masked_fill(valid.logical_not(), -inf).amax(-1, /*keepdim=*/true);
  const at::Tensor span = high - low;
  return at::where(span > 0, (x - low) / span.clamp_min(1e-300), at::zeros({}, x.options()));
}

// The score a policy ranks unprotected entries by: state [B, G, S, C] -> [B, G, S] float64.
at::Tensor RankScore(const LayerPlan& plan, const at::Tensor& positions, const at::Tensor& state,
                     const at::Tensor& newest) {
  if (!state.defined()) return at::zeros({}, positions.options().dtype(at::kDouble));
  at::Tensor score = state.select(3, 0).to(at::kDouble);
  if (plan.normalize) {
    // Queries that have seen the entry so far: itself and every later position.
    score = score / (newest - positions + 1).clamp_min(1).to(at::kDouble);
  }
  if (plan.kind == PolicyKind::kQH2O) {
    const at::Tensor valid = positions >= 0;
    const double c = plan.quant_weight;
    score = c * MinMaxNormalized(score, valid) -
            (1 - c) / 2 * MinMaxNormalized(state.select(3, 1).to(at::kDouble), valid);
  }
  return score;
}

}  // namespace

const std::vector<std::string>& PolicyNames() {
  static const auto* names = [] {
    auto* list = new std::vector<std::string>;
    for (const NamedKind& k : kKinds) list->push_back(k.name);
    return list;
  }();
  return *names;
}

absl::StatusOr<PolicyKind> ParsePolicyKind(absl::string_view name) {
  for (const NamedKind& k : kKinds) {
    if (name == k.name) return k.kind;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown KV cache policy '", name,
                                                 "' (expected one of ",
                                                 absl::StrJoin(PolicyNames(), ", "), ")"));
}

std::string PolicyName(PolicyKind kind) {
  for (const NamedKind& k : kKinds) {
    if (kind == k.kind) return k.name;
  }
  return "?";
}

bool IsH2OFamily(PolicyKind kind) {
  return kind == PolicyKind::kH2O || kind == PolicyKind::kH2OVlen || kind == PolicyKind::kQH2O;
}

int64_t StateChannels(const LayerPlan& plan) {
  if (!plan.scored) return 0;
  return plan.kind == PolicyKind::kH2OVlen || plan.kind == PolicyKind::kQH2O ? 2 : 1;
}

LayerPlan MakeLayerPlan(const EvictionPolicyOptions& options, int64_t budget, int64_t window,
                        int64_t max_sequence_length) {
  LayerPlan plan;
  plan.window = window;
  const int64_t span = window > 0 ? std::min(window, max_sequence_length) : max_sequence_length;
  if (options.kind == PolicyKind::kDense || budget >= span) {
    // Everything a query can still see fits: keep it all (a window layer keeps its window).
    plan.kind =
        window > 0 && window < max_sequence_length ? PolicyKind::kWindow : PolicyKind::kDense;
    plan.budget = span;
    plan.recent = span;
    return plan;
  }
  plan.kind = options.kind;
  plan.budget = budget;
  switch (options.kind) {
    case PolicyKind::kWindow:
      plan.recent = plan.budget;
      break;
    case PolicyKind::kSink:
      plan.sink_tokens = options.sink_tokens;
      plan.recent = plan.budget - options.sink_tokens;
      break;
    case PolicyKind::kH2O:
    case PolicyKind::kH2OVlen:
    case PolicyKind::kQH2O:
    case PolicyKind::kTova: {
      const int64_t fallback =
          options.kind == PolicyKind::kTova
              ? 0
              : static_cast<int64_t>(std::ceil(plan.budget * options.recent_fraction));
      plan.recent =
          std::min(plan.budget, options.grace_period >= 0 ? options.grace_period : fallback);
      plan.scored = plan.recent < plan.budget;
      plan.normalize = options.normalize_scores && IsH2OFamily(options.kind);
      plan.quant_weight = options.quant_weight;
      break;
    }
    case PolicyKind::kDense:
      break;
  }
  return plan;
}

at::Tensor Priority(const LayerPlan& plan, const at::Tensor& positions, const at::Tensor& state,
                    const at::Tensor& newest) {
  const at::Tensor p = positions.to(at::kDouble);
  const double inf = std::numeric_limits<double>::infinity();
  at::Tensor priority;
  switch (plan.kind) {
    case PolicyKind::kDense:
    case PolicyKind::kWindow:
      priority = p;
      break;
    case PolicyKind::kSink:
      priority = at::where(positions < plan.sink_tokens, p + kProtected, p);
      break;
    case PolicyKind::kH2O:
    case PolicyKind::kH2OVlen:
    case PolicyKind::kQH2O:
    case PolicyKind::kTova:
      priority = at::where(positions > newest - plan.recent, p + kProtected,
                           RankScore(plan, positions, state, newest));
      break;
  }
  if (plan.window > 0) {
    priority =
        at::where(positions <= newest - plan.window, at::full({}, -inf, p.options()), priority);
  }
  return at::where(positions >= 0, priority, at::full({}, -inf, p.options()));
}

bool EntryPriorityApplies(const LayerPlan& plan) { return plan.kind != PolicyKind::kQH2O; }

double EntryPriority(const LayerPlan& plan, int64_t position, double score, int64_t newest) {
  const double p = static_cast<double>(position);
  double priority = p;
  switch (plan.kind) {
    case PolicyKind::kDense:
    case PolicyKind::kWindow:
      break;
    case PolicyKind::kSink:
      if (position < plan.sink_tokens) priority = p + kProtected;
      break;
    case PolicyKind::kH2O:
    case PolicyKind::kH2OVlen:
    case PolicyKind::kQH2O:
    case PolicyKind::kTova:
      if (position > newest - plan.recent) {
        priority = p + kProtected;
      } else {
        priority = plan.normalize
                       ? score / static_cast<double>(std::max<int64_t>(1, newest - position + 1))
                       : score;
      }
      break;
  }
  if (plan.window > 0 && position <= newest - plan.window) {
    priority = -std::numeric_limits<double>::infinity();
  }
  return priority;
}

at::Tensor EntryFeature(const LayerPlan& plan, const at::Tensor& keys, const at::Tensor& values,
                        const RoundTrip& round_trip) {
  if (StateChannels(plan) < 2) return at::Tensor();
  const at::Tensor v = values.to(at::kFloat);
  if (plan.kind == PolicyKind::kH2OVlen) return at::linalg_vector_norm(v, 2, {-1});
  const auto [k2, v2] = round_trip(keys, values);
  return at::linalg_vector_norm(keys.to(at::kFloat) - k2.to(at::kFloat), 2, {-1}) +
         at::linalg_vector_norm(v - v2.to(at::kFloat), 2, {-1});
}

at::Tensor StepScores(const LayerPlan& plan, const at::Tensor& weights, int64_t groups,
                      const at::Tensor& value_norms) {
  const int64_t batch = weights.size(0), n_head = weights.size(1), steps = weights.size(2),
                entries = weights.size(3);
  at::Tensor w = weights.view({batch, groups, n_head / groups, steps, entries});
  if (plan.kind == PolicyKind::kTova) return w.select(3, steps - 1).mean(2);
  if (plan.kind == PolicyKind::kH2OVlen && value_norms.defined()) {
    w = w * value_norms.view({batch, groups, 1, 1, entries});
    w = w / w.sum(-1, /*keepdim=*/true).clamp_min(1e-30);
  }
  return w.sum({2, 3});
}

absl::Status ValidateEvictionPolicy(const EvictionPolicyOptions& policy, absl::string_view owner) {
  const std::string budget = absl::StrCat(owner, ".budget");
  if (policy.kind != PolicyKind::kDense && policy.budget < 1) {
    return InvalidFieldError(
        budget, absl::StrCat(budget, " must be >= 1 for policy ", PolicyName(policy.kind), ", got ",
                             policy.budget));
  }
  if (policy.kind == PolicyKind::kSink) {
    const std::string sink_tokens = absl::StrCat(owner, ".sink_tokens");
    if (policy.sink_tokens < 0) {
      return InvalidFieldError(
          sink_tokens, absl::StrCat(sink_tokens, " must be >= 0, got ", policy.sink_tokens));
    }
    // The budget is what falls short: a sink cache keeps every sink token within it.
    if (policy.sink_tokens > policy.budget) {
      return InvalidFieldError(
          budget,
          absl::StrCat(budget, "=", policy.budget, " must be at least the sink cache's ",
                       sink_tokens, "=", policy.sink_tokens, " (it keeps them all)"),
          {sink_tokens});
    }
  }
  if (!(policy.recent_fraction >= 0 && policy.recent_fraction <= 1)) {
    const std::string field = absl::StrCat(owner, ".recent_fraction");
    return InvalidFieldError(
        field, absl::StrCat(field, " must be in [0, 1], got ", policy.recent_fraction));
  }
  if (policy.grace_period < -1) {
    const std::string field = absl::StrCat(owner, ".grace_period");
    return InvalidFieldError(
        field, absl::StrCat(field, " must be >= 0 (or -1: the policy's default), got ",
                            policy.grace_period));
  }
  if (!(policy.quant_weight >= 0 && policy.quant_weight <= 1)) {
    const std::string field = absl::StrCat(owner, ".quant_weight");
    return InvalidFieldError(field,
                             absl::StrCat(field, " must be in [0, 1], got ", policy.quant_weight));
  }
  for (size_t i = 0; i < policy.layer_budgets.size(); ++i) {
    if (policy.layer_budgets[i] < 1) {
      const std::string field = absl::StrCat(owner, ".layer_budgets");
      return InvalidFieldError(
          field, absl::StrCat(field, "[", i, "] must be >= 1, got ", policy.layer_budgets[i]));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> LayerBudgets(absl::string_view rule, int64_t budget,
                                                  int64_t num_layers) {
  if (rule != "uniform" && rule != "pyramid") {
    return absl::InvalidArgumentError(
        absl::StrCat("budget_rule must be uniform or pyramid, got '", rule, "'"));
  }
  std::vector<int64_t> budgets(std::max<int64_t>(num_layers, 0), budget);
  if (rule == "pyramid" && num_layers > 1) {
    for (int64_t i = 0; i < num_layers; ++i) {
      const double share = 1.5 - static_cast<double>(i) / static_cast<double>(num_layers - 1);
      budgets[i] = std::max<int64_t>(1, std::llround(budget * share));
    }
  }
  return budgets;
}

bool KeepsContiguousPositions(PolicyKind kind) {
  return kind == PolicyKind::kWindow || kind == PolicyKind::kSink;
}

}  // namespace lgpt
