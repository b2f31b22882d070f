#include "core/train/replay_kv_cache.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace lgpt {

absl::StatusOr<KVView> RecordingKVCache::Update(int64_t layer, const KVStep& step,
                                                const at::Tensor& keys, const at::Tensor& values) {
  ASSIGN_OR_RETURN(KVView view, inner_->Update(layer, step, keys, values));
  if (static_cast<int64_t>(log_.size()) < num_layers()) log_.resize(num_layers());
  // A copy: the view's positions may be the cache's own storage, rewritten by later steps.
  log_[layer].push_back(view.positions.to(at::kCPU, at::kLong, /*non_blocking=*/false,
                                          /*copy=*/true));
  return view;
}

void RecordingKVCache::Reset() {
  inner_->Reset();
  log_.clear();
}

absl::StatusOr<KVView> ReplayKVCache::Update(int64_t layer, const KVStep& step,
                                             const at::Tensor& keys, const at::Tensor& values) {
  if (layer != layer_) {
    return absl::InvalidArgumentError(
        absl::StrCat("replay cache of layer ", layer_, " asked for layer ", layer));
  }
  if (keys.dim() != 4 || keys.size(0) != key_positions_.size(0) ||
      keys.size(1) != key_positions_.size(1) || keys.size(2) != key_positions_.size(2)) {
    return absl::InvalidArgumentError(absl::StrCat("replay cache: keys ", ShapeString(keys),
                                                   " do not match key positions ",
                                                   ShapeString(key_positions_)));
  }
  return KVView{keys, values, key_positions_.to(keys.device())};
}

absl::Status ReplayKVCache::CheckStep(const KVStep& step, int64_t batch_size) const {
  if (batch_size != key_positions_.size(0) || step.positions.dim() != 2 ||
      step.positions.size(1) != key_positions_.size(2)) {
    return absl::InvalidArgumentError(
        absl::StrCat("replay cache: a step of positions ", ShapeString(step.positions),
                     " against key positions ", ShapeString(key_positions_)));
  }
  return absl::OkStatus();
}

}  // namespace lgpt
