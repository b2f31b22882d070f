// One model step over many requests: a KVCache whose batch rows are other caches, one per
// request (each of batch size 1, of any kind: dense, budgeted, quantised, paged).
//
// The serving scheduler runs the decode steps of all running requests as one [B, 1] forward
// pass, so every projection reads its weights once per step for B tokens. Attention stays per
// request: row b's keys, values and queries go to row b's own cache, which attends over its own
// entries and positions exactly as in a batch-1 run. Requests at different lengths, with
// different policies and storage, share the step.
//
// Not thread-safe; the rows must outlive it and must not be used elsewhere during a step.
#ifndef LGPT_CACHE_BATCHED_KV_CACHE_H_
#define LGPT_CACHE_BATCHED_KV_CACHE_H_

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/kv_cache.h"

namespace lgpt {

class BatchedKVCache : public KVCache {
 public:
  // `rows` (not owned): one cache of batch size 1 per batch row, all with the same number
  // of layers. InvalidArgument otherwise.
  static absl::StatusOr<BatchedKVCache> Create(std::vector<KVCache*> rows);

  // Row b gets positions [1, T] = step.positions[b]. Splitting the step here (once per model
  // step, not per layer) keeps the per-layer cost to the rows' own work.
  absl::Status CheckStep(const KVStep& step, int64_t batch_size) const override;

  // Each row's Update; the views are padded to the longest with empty slots (position -1).
  absl::StatusOr<KVView> Update(int64_t layer, const KVStep& step, const at::Tensor& keys,
                                const at::Tensor& values) override;
  // Each row's UpdateAndAttend on its slice of q, keys and values: [B, n_head, T, head_size].
  // Rows whose caches take UpdateForDecode (dense and paged float32 rows on the CPU) attend
  // in one DecodeAttentionRows pass (one fork for every row and key group, the same bits).
  // A failing row leaves the rows before it updated for this layer; the step's CheckStep
  // makes failures here invariant violations only.
  absl::StatusOr<at::Tensor> UpdateAndAttend(int64_t layer, const KVStep& step,
                                             const at::Tensor& q, const at::Tensor& keys,
                                             const at::Tensor& values,
                                             const AttentionParams& params) override;

  void Reset() override;
  int64_t AllocatedBytes() const override;
  int64_t IndexBytes() const override;
  // The smallest of the rows' (every row checks its own bound in CheckStep).
  int64_t max_sequence_length() const override;
  int64_t batch_size() const override { return static_cast<int64_t>(rows_.size()); }
  int64_t num_layers() const override { return rows_.front()->num_layers(); }
  std::string DebugName() const override;

 private:
  explicit BatchedKVCache(std::vector<KVCache*> rows) : rows_(std::move(rows)) {}
  // UpdateAndAttend with the rows that can in one DecodeAttentionRows pass.
  absl::StatusOr<at::Tensor> UpdateAndAttendRows(int64_t layer, const KVStep& step,
                                                 const std::vector<KVStep>& steps,
                                                 const at::Tensor& q, const at::Tensor& keys,
                                                 const at::Tensor& values,
                                                 const AttentionParams& params);
  // The steps of the rows for `step` (split when the step's positions change).
  absl::StatusOr<const std::vector<KVStep>*> RowSteps(const KVStep& step) const;

  std::vector<KVCache*> rows_;
  // The last step split into rows, recognised by its positions tensor.
  mutable at::Tensor split_positions_;
  mutable std::vector<KVStep> row_steps_;
};

}  // namespace lgpt

#endif  // LGPT_CACHE_BATCHED_KV_CACHE_H_
