// The two caches of cache-aware training (core/train/chunked_backward.h):
//
// RecordingKVCache wraps the policy cache of the forward pass and logs, per layer and step,
// the positions each (row, group) attended to: the replay log. A budgeted cache's eviction
// decisions are all in it (an entry a step attends to is one the policy kept until then).
//
// ReplayKVCache serves the recomputation of one layer and one chunk with autograd: the step
// feeds the rows of the entries the chunk attended to (recomputed from their layer inputs)
// followed by the chunk's own rows, and the replay cache makes each (row, group) attend to
// exactly what the log says, keeping nothing itself. So gradients flow into every key and
// value the chunk read, and the decisions are constants, as in keys_values.
#ifndef LGPT_CORE_TRAIN_REPLAY_KV_CACHE_H_
#define LGPT_CORE_TRAIN_REPLAY_KV_CACHE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/kv_cache.h"

namespace lgpt {

class RecordingKVCache : public KVCache {
 public:
  explicit RecordingKVCache(std::unique_ptr<KVCache> inner) : inner_(std::move(inner)) {}

  // Delegates, then appends a copy of the view's positions [B, 1 or G, S] (on the CPU) to
  // layer's log.
  absl::StatusOr<KVView> Update(int64_t layer, const KVStep& step, const at::Tensor& keys,
                                const at::Tensor& values) override;
  absl::Status CheckStep(const KVStep& step, int64_t batch_size) const override {
    return inner_->CheckStep(step, batch_size);
  }
  // Resets the inner cache and the log.
  void Reset() override;
  void Release() override {
    inner_->Release();
    log_.clear();
  }
  int64_t AllocatedBytes() const override { return inner_->AllocatedBytes(); }
  int64_t IndexBytes() const override { return inner_->IndexBytes(); }
  const KVStorageBound* storage_bound() const override { return inner_->storage_bound(); }
  int64_t max_sequence_length() const override { return inner_->max_sequence_length(); }
  int64_t batch_size() const override { return inner_->batch_size(); }
  int64_t num_layers() const override { return inner_->num_layers(); }
  KVAttentionScorer* attention_scorer() override { return inner_->attention_scorer(); }
  std::string DebugName() const override { return "recording(" + inner_->DebugName() + ")"; }

  // log()[layer][step]: the key positions [B, 1 or G, S] int64 step `step` of `layer` attended
  // to (negative: empty slot), the step's own positions included.
  const std::vector<std::vector<at::Tensor>>& log() const { return log_; }

 private:
  std::unique_ptr<KVCache> inner_;
  std::vector<std::vector<at::Tensor>> log_;
};

class ReplayKVCache : public KVCache {
 public:
  // A cache for one step of one layer: Update returns the step's own keys and values with
  // key_positions [B, G, T] (the mask: an entry the log says group g did not attend to has a
  // negative position in g's row).
  ReplayKVCache(int64_t layer, int64_t num_layers, int64_t max_sequence_length,
                at::Tensor key_positions)
      : layer_(layer),
        num_layers_(num_layers),
        max_sequence_length_(max_sequence_length),
        key_positions_(std::move(key_positions)) {}

  absl::StatusOr<KVView> Update(int64_t layer, const KVStep& step, const at::Tensor& keys,
                                const at::Tensor& values) override;
  absl::Status CheckStep(const KVStep& step, int64_t batch_size) const override;
  void Reset() override {}
  int64_t AllocatedBytes() const override { return 0; }
  int64_t IndexBytes() const override { return 0; }
  int64_t max_sequence_length() const override { return max_sequence_length_; }
  int64_t batch_size() const override { return key_positions_.size(0); }
  int64_t num_layers() const override { return num_layers_; }
  std::string DebugName() const override { return "replay"; }

 private:
  int64_t layer_, num_layers_, max_sequence_length_;
  at::Tensor key_positions_;  // [B, G, T]
};

}  // namespace lgpt

#endif  // LGPT_CORE_TRAIN_REPLAY_KV_CACHE_H_
