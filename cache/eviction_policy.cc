#include "cache/eviction_policy.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace lgpt {
namespace {

// Protected entries rank above any score (scores are sums of weights: at most the number of
// queries times heads) and keep their order by position (positions are far below 1e15 / 2).
constexpr double kProtected = 1e15;

}  // namespace

const std::vector<std::string>& PolicyNames() {
  static const auto* names = new std::vector<std::string>{"dense", "window", "sink", "h2o", "tova"};
  return *names;
}

absl::StatusOr<PolicyKind> ParsePolicyKind(absl::string_view name) {
  if (name == "dense") return PolicyKind::kDense;
  if (name == "window") return PolicyKind::kWindow;
  if (name == "sink") return PolicyKind::kSink;
  if (name == "h2o") return PolicyKind::kH2O;
  if (name == "tova") return PolicyKind::kTova;
  return absl::InvalidArgumentError(absl::StrCat("unknown KV cache policy '", name,
                                                 "' (expected one of ",
                                                 absl::StrJoin(PolicyNames(), ", "), ")"));
}

std::string PolicyName(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kDense:
      return "dense";
    case PolicyKind::kWindow:
      return "window";
    case PolicyKind::kSink:
      return "sink";
    case PolicyKind::kH2O:
      return "h2o";
    case PolicyKind::kTova:
      return "tova";
  }
  return "?";
}

LayerPlan MakeLayerPlan(const EvictionPolicyOptions& options, int64_t window,
                        int64_t max_sequence_length) {
  LayerPlan plan;
  plan.window = window;
  const int64_t span = window > 0 ? std::min(window, max_sequence_length) : max_sequence_length;
  if (options.kind == PolicyKind::kDense || options.budget >= span) {
    // Everything a query can still see fits: keep it all (a window layer keeps its window).
    plan.kind =
        window > 0 && window < max_sequence_length ? PolicyKind::kWindow : PolicyKind::kDense;
    plan.budget = span;
    plan.recent = span;
    return plan;
  }
  plan.kind = options.kind;
  plan.budget = options.budget;
  switch (options.kind) {
    case PolicyKind::kWindow:
      plan.recent = plan.budget;
      break;
    case PolicyKind::kSink:
      plan.sink_tokens = options.sink_tokens;
      plan.recent = plan.budget - options.sink_tokens;
      break;
    case PolicyKind::kH2O:
      plan.recent = std::min<int64_t>(
          plan.budget, static_cast<int64_t>(std::ceil(plan.budget * options.recent_fraction)));
      plan.scored = plan.recent < plan.budget;
      break;
    case PolicyKind::kTova:
      plan.recent = 0;
      plan.scored = true;
      break;
    case PolicyKind::kDense:
      break;
  }
  return plan;
}

at::Tensor Priority(const LayerPlan& plan, const at::Tensor& positions, const at::Tensor& scores,
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
    case PolicyKind::kTova: {
      // Without scores (a policy whose recent window is its whole budget) every score is 0.
      const at::Tensor s = scores.defined() ? scores.to(at::kDouble) : at::zeros({}, p.options());
      priority = at::where(positions > newest - plan.recent, p + kProtected, s);
      break;
    }
  }
  if (plan.window > 0) {
    priority =
        at::where(positions <= newest - plan.window, at::full({}, -inf, p.options()), priority);
  }
  return at::where(positions >= 0, priority, at::full({}, -inf, p.options()));
}

at::Tensor StepScores(const LayerPlan& plan, const at::Tensor& weights, int64_t groups) {
  const int64_t batch = weights.size(0), n_head = weights.size(1), steps = weights.size(2),
                entries = weights.size(3);
  const at::Tensor w = weights.view({batch, groups, n_head / groups, steps, entries});
  if (plan.kind == PolicyKind::kTova) return w.select(3, steps - 1).mean(2);
  return w.sum({2, 3});
}

absl::Status ValidateEvictionPolicy(const EvictionPolicyOptions& policy,
                                    absl::string_view owner) {
  if (policy.kind != PolicyKind::kDense && policy.budget < 1) {
    return absl::InvalidArgumentError(absl::StrCat(owner, ".budget must be >= 1 for policy ",
                                                   PolicyName(policy.kind), ", got ",
                                                   policy.budget));
  }
  if (policy.kind == PolicyKind::kSink &&
      (policy.sink_tokens < 0 || policy.sink_tokens > policy.budget)) {
    return absl::InvalidArgumentError(absl::StrCat(owner, ".sink_tokens=", policy.sink_tokens,
                                                   " must be in [0, ", owner,
                                                   ".budget=", policy.budget, "]"));
  }
  if (!(policy.recent_fraction >= 0 && policy.recent_fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(owner, ".recent_fraction must be in [0, 1], got ",
                                                   policy.recent_fraction));
  }
  return absl::OkStatus();
}

bool KeepsContiguousPositions(PolicyKind kind) {
  return kind == PolicyKind::kWindow || kind == PolicyKind::kSink;
}

}  // namespace lgpt
