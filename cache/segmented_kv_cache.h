// One batch-1 model step whose time axis is several requests' chunks laid end to end: a
// KVCache whose segments are other caches, one per request (each of batch size 1, of any
// kind: dense, budgeted, quantised, paged).
//
// The serving scheduler prefills the prompt chunks of several requests in one forward pass
// over their concatenated tokens [1, T_0 + T_1 + ...]: every projection reads its weights once
// for all of them, and no row is padded. Attention stays per request: segment s's queries,
// keys and values (steps [offset_s, offset_s + T_s) of the step) go to segment s's own cache,
// which attends over its own entries and positions exactly as in a batch-1 run of that chunk.
// Since every other layer of the model works token by token, a segment's outputs equal its
// chunk's batch-1 forward pass (up to the rounding of matrix products of another row count).
// Trailing segments of one step each (the decode rows of a mixed pass) attend as a batched
// decode step does (cache/batched_kv_cache.h: one DecodeAttentionRows pass for the rows that
// take it, the same bits as each row alone), with one copy of their queries, keys and values
// instead of three per row.
//
// Not thread-safe; the segments must outlive it and must not be used elsewhere during a step.
#ifndef LGPT_CACHE_SEGMENTED_KV_CACHE_H_
#define LGPT_CACHE_SEGMENTED_KV_CACHE_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/batched_kv_cache.h"
#include "cache/kv_cache.h"

namespace lgpt {

class SegmentedKVCache : public KVCache {
 public:
  // `segments` (not owned): one cache of batch size 1 per segment, all with the same number of
  // layers; `lengths[s]` >= 1 steps of the step belong to segment s, in order.
  // InvalidArgument otherwise.
  static absl::StatusOr<SegmentedKVCache> Create(std::vector<KVCache*> segments,
                                                 std::vector<int64_t> lengths);

  // A step of batch size 1 whose positions [1, sum of lengths] are split into the segments'
  // positions (once per model step, not per layer); each segment checks its own.
  absl::Status CheckStep(const KVStep& step, int64_t batch_size) const override;

  // Unimplemented: the segments' entries do not form one view (attention goes through
  // UpdateAndAttend).
  absl::StatusOr<KVView> Update(int64_t layer, const KVStep& step, const at::Tensor& keys,
                                const at::Tensor& values) override;
  // Each segment's UpdateAndAttend on its steps of q, keys and values ([1, *, T, head_size]),
  // concatenated along the steps again. A failing segment leaves the ones before it updated for
  // this layer; the step's CheckStep makes failures here invariant violations only.
  absl::StatusOr<at::Tensor> UpdateAndAttend(int64_t layer, const KVStep& step, const at::Tensor& q,
                                             const at::Tensor& keys, const at::Tensor& values,
                                             const AttentionParams& params) override;

  void Reset() override;
  int64_t AllocatedBytes() const override;
  int64_t IndexBytes() const override;
  // The smallest of the segments' (every segment checks its own bound in CheckStep).
  int64_t max_sequence_length() const override;
  int64_t batch_size() const override { return 1; }
  int64_t num_layers() const override { return segments_.front()->num_layers(); }
  std::string DebugName() const override;

  // Index along the step's time axis of each segment's last step (where its logits are).
  std::vector<int64_t> LastSteps() const;

 private:
  SegmentedKVCache(std::vector<KVCache*> segments, std::vector<int64_t> lengths);
  // The steps of the segments for `step` (split when the step's positions change).
  absl::StatusOr<const std::vector<KVStep>*> SegmentSteps(const KVStep& step) const;

  std::vector<KVCache*> segments_;
  std::vector<int64_t> lengths_, offsets_;
  int64_t total_ = 0;
  // Segments [rows_begin_, end) are two or more one-step segments, attended through rows_;
  // rows_begin_ == segments_.size() when there are none.
  size_t rows_begin_ = 0;
  std::optional<BatchedKVCache> rows_;
  // The last step split into segments, recognised by its positions tensor, and the rows'
  // step ([rows, 1] positions).
  mutable at::Tensor split_positions_;
  mutable std::vector<KVStep> segment_steps_;
  mutable KVStep rows_step_;
};

}  // namespace lgpt

#endif  // LGPT_CACHE_SEGMENTED_KV_CACHE_H_
