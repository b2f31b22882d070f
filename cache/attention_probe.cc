#include "cache/attention_probe.h"

#include <ATen/ATen.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace lgpt {

absl::StatusOr<std::unique_ptr<AttentionProbe>> AttentionProbe::Create(
    std::unique_ptr<KVCache> inner, const AttentionProbeOptions& options) {
  if (inner == nullptr) return absl::InvalidArgumentError("attention probe: no cache to wrap");
  if (options.first_tokens < 1 || options.min_query_position < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention probe: first_tokens ", options.first_tokens, " must be >= 1 and ",
                     "min_query_position ", options.min_query_position, " >= 0"));
  }
  return std::unique_ptr<AttentionProbe>(new AttentionProbe(std::move(inner), options));
}

AttentionProbe::AttentionProbe(std::unique_ptr<KVCache> inner, const AttentionProbeOptions& options)
    : inner_(std::move(inner)), options_(options), layers_(inner_->num_layers()) {}

absl::StatusOr<KVView> AttentionProbe::Update(int64_t layer, const KVStep& step,
                                              const at::Tensor& keys, const at::Tensor& values) {
  ASSIGN_OR_RETURN(KVView view, inner_->Update(layer, step, keys, values));
  LayerStats& stats = layers_[layer];
  stats.query_positions = step.positions;
  stats.key_positions = view.positions;
  return view;
}

void AttentionProbe::ObserveAttentionWeights(int64_t layer, const at::Tensor& weights) {
  KVAttentionScorer* inner = inner_->attention_scorer();
  if (inner != nullptr && inner->WantsAttentionWeights(layer)) {
    inner->ObserveAttentionWeights(layer, weights);
  }
  LayerStats& stats = layers_[layer];
  if (!stats.query_positions.defined()) return;
  const int64_t n_head = weights.size(1);
  const at::Tensor key_positions = stats.key_positions.to(at::kCPU);  // [B, 1|G, S]
  const int64_t groups = key_positions.size(1);
  // [B, 1|G, S] -> [B, n_head, 1, S]: head h reads group h / (n_head / G).
  at::Tensor at_start = (key_positions >= 0).logical_and(key_positions < options_.first_tokens);
  at_start = at_start.to(at::kFloat).repeat_interleave(n_head / groups, 1).unsqueeze(2);
  const at::Tensor mass = (weights.to(at::kCPU, at::kFloat) * at_start).sum(-1);  // [B, nh, T]
  const at::Tensor query_positions = stats.query_positions.to(at::kCPU);          // [B, T]
  const at::Tensor measured = query_positions >= options_.min_query_position;     // [B, T]
  const int64_t count = measured.sum().item<int64_t>();
  if (count == 0) return;
  const at::Tensor selected = measured.unsqueeze(1).to(at::kFloat);           // [B, 1, T]
  const at::Tensor head_sums = (mass * selected).sum(at::IntArrayRef{0, 2});  // [nh]
  if (stats.head_sums.empty()) stats.head_sums.assign(n_head, 0.0);
  for (int64_t h = 0; h < n_head; ++h) stats.head_sums[h] += head_sums[h].item<double>();
  // Uniform attention over positions 0..q puts min(k, q + 1) / (q + 1) on the start.
  const at::Tensor q = query_positions.to(at::kDouble);
  const at::Tensor uniform =
      at::clamp_max(q + 1, static_cast<double>(options_.first_tokens)) / (q + 1);
  stats.uniform_sum += (uniform * measured.to(at::kDouble)).sum().item<double>();
  stats.queries += count;
}

AttentionStartMass AttentionProbe::Result() const {
  AttentionStartMass result;
  for (const LayerStats& stats : layers_) {
    std::vector<double> heads;
    for (double sum : stats.head_sums) heads.push_back(stats.queries ? sum / stats.queries : 0.0);
    result.per_head.push_back(heads);
    result.uniform.push_back(stats.queries ? stats.uniform_sum / stats.queries : 0.0);
    result.queries.push_back(stats.queries);
  }
  return result;
}

}  // namespace lgpt
