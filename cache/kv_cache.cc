#include "cache/kv_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace lgpt {

std::string ShapeString(const at::Tensor& t) {
  if (!t.defined()) return "(undefined)";
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) absl::StrAppend(&s, i ? ", " : "", t.size(i));
  return s + "]";
}

absl::Status CheckCacheGeometry(absl::string_view owner, const KVCacheGeometry& geometry) {
  const int64_t batch_size = geometry.batch_size;
  const int64_t max_sequence_length = geometry.max_sequence_length;
  const std::vector<KVLayerSpec>& layers = geometry.layers;
  if (batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(owner, ".batch_size must be >= 1, got ", batch_size));
  }
  if (max_sequence_length < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(owner, ".max_sequence_length must be >= 1, got ", max_sequence_length));
  }
  if (layers.empty()) return absl::InvalidArgumentError(absl::StrCat(owner, ".layers is empty"));
  for (size_t i = 0; i < layers.size(); ++i) {
    const KVLayerSpec& spec = layers[i];
    if (spec.n_query_groups < 1 || spec.head_size < 1 || spec.sliding_window < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          owner, ".layers[", i, "]: n_query_groups ", spec.n_query_groups, " and head_size ",
          spec.head_size, " must be >= 1, sliding_window ", spec.sliding_window, " >= 0"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckStepBounds(const KVStep& step, int64_t batch_size, int64_t max_batch_size,
                             int64_t max_sequence_length) {
  if (batch_size < 1 || batch_size > max_batch_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch of ", batch_size, " rows does not fit a KV cache built for ", max_batch_size));
  }
  if (step.min_position < 0) {
    return absl::OutOfRangeError(absl::StrCat("negative position ", step.min_position));
  }
  if (step.max_position >= max_sequence_length) {
    return absl::OutOfRangeError(absl::StrCat("position ", step.max_position,
                                              " is beyond the KV cache's max_sequence_length ",
                                              max_sequence_length));
  }
  return absl::OkStatus();
}

absl::Status CheckLayerStep(int64_t layer, const std::vector<KVLayerSpec>& layers,
                            const KVStep& step, const at::Tensor& keys, const at::Tensor& values,
                            int64_t max_batch_size, int64_t max_sequence_length) {
  if (layer < 0 || layer >= static_cast<int64_t>(layers.size())) {
    return absl::OutOfRangeError(absl::StrCat("KV cache has no layer ", layer));
  }
  const KVLayerSpec& spec = layers[layer];
  if (!keys.defined() || keys.dim() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache layer ", layer, ": keys ", ShapeString(keys), " are not [B, G, T, head_size]"));
  }
  const int64_t batch = keys.size(0);
  RETURN_IF_ERROR(CheckStepBounds(step, batch, max_batch_size, max_sequence_length));
  if (!values.defined() || keys.sizes() != values.sizes() || keys.size(1) != spec.n_query_groups ||
      keys.size(3) != spec.head_size || !step.positions.defined() || step.positions.dim() != 2 ||
      step.positions.size(0) != batch || step.positions.size(1) != keys.size(2)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache layer ", layer, ": keys ", ShapeString(keys), ", values ", ShapeString(values),
        ", positions ", ShapeString(step.positions), " do not match [B, ", spec.n_query_groups,
        ", T, ", spec.head_size, "] and [B, T]"));
  }
  return absl::OkStatus();
}

absl::Status CheckQueries(int64_t layer, const at::Tensor& q, const at::Tensor& keys) {
  if (!q.defined() || q.dim() != 4 || q.size(0) != keys.size(0) || q.size(1) % keys.size(1) != 0 ||
      q.size(2) != keys.size(2) || q.size(3) != keys.size(3)) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache layer ", layer, ": queries ",
                                                   ShapeString(q), " do not match keys ",
                                                   ShapeString(keys)));
  }
  return absl::OkStatus();
}

int64_t GrownCapacity(int64_t needed, int64_t current, int64_t limit) {
  constexpr int64_t kMinGrowth = 64;
  return std::min(std::max({needed, 2 * current, kMinGrowth}), limit);
}

absl::StatusOr<at::Tensor> KVCache::UpdateAndAttend(int64_t layer, const KVStep& step,
                                                    const at::Tensor& q, const at::Tensor& keys,
                                                    const at::Tensor& values,
                                                    const AttentionParams& params) {
  if (keys.defined() && keys.dim() == 4) RETURN_IF_ERROR(CheckQueries(layer, q, keys));
  ASSIGN_OR_RETURN(const KVView view, Update(layer, step, keys, values));
  KVAttentionScorer* scorer = attention_scorer();
  const bool want_weights = scorer != nullptr && scorer->WantsAttentionWeights(layer);
  at::Tensor weights;
  at::Tensor y = AttendByPositions(q, view.keys, view.values, step.positions, view.positions,
                                   params, want_weights ? &weights : nullptr);
  if (want_weights) scorer->ObserveAttentionWeights(layer, weights);
  return y;
}

}  // namespace lgpt
