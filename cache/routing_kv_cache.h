// One model step over several requests, each through its own cache: the KVCache that routes
// every layer's attention by a KVBatch layout (cache/kv_batch.h) to the sequences' caches
// (each of batch size 1, of any kind: dense, budgeted, quantised, paged).
//
// The serving scheduler runs the prompt chunks and decode tokens of many requests in one
// forward pass, so every projection reads its weights once for all of them and no row is
// padded. Attention stays per request: sequence s's queries, keys and values go to its own
// cache, which attends over its own entries and positions exactly as in a batch-1 run of that
// chunk. Since every other layer of the model works token by token, a sequence's outputs equal
// its batch-1 forward pass (up to the rounding of matrix products over another row count).
// One-token sequences (decode rows: all of a kBatch step, the trailing run of a kTime step)
// attend in one DecodeAttentionRows pass where their caches allow (UpdateForDecode: the same
// bits as each row alone), on a device in one paged kernel launch per pool (UpdateForTable),
// the others through their own UpdateAndAttend. A sequence the
// layout marks sequential (KVBatch::sequential: speculative verification) gets
// KVStep::sequential, so it attends as its batch-1 verification step does.
//
// Not thread-safe; the caches must outlive it and must not be used elsewhere during a step.
#ifndef LGPT_CACHE_ROUTING_KV_CACHE_H_
#define LGPT_CACHE_ROUTING_KV_CACHE_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/kv_batch.h"
#include "cache/kv_cache.h"

namespace lgpt {

class RoutingKVCache : public KVCache {
 public:
  // InvalidArgument unless the layout has at least one sequence, as many lengths as caches,
  // every length >= 1 (1 along kBatch) and every cache non-null, of batch size 1 and with
  // the first one's number of layers.
  static absl::StatusOr<RoutingKVCache> Create(KVBatch batch);

  // The step's positions ([1, tokens] along kTime, [sequences, 1] along kBatch) split into the
  // sequences' steps once per model step (not per layer); each cache checks its own.
  absl::Status CheckStep(const KVStep& step, int64_t batch_size) const override;

  // Unimplemented: the sequences' entries do not form one view (attention goes through
  // UpdateAndAttend).
  absl::StatusOr<KVView> Update(int64_t layer, const KVStep& step, const at::Tensor& keys,
                                const at::Tensor& values) override;
  // Each sequence's UpdateAndAttend on its part of q, keys and values, put together in the
  // step's layout again: [1, n_head, tokens, head_size] or [sequences, n_head, 1, head_size].
  // A failing sequence leaves the ones before it updated for this layer; the step's CheckStep
  // makes failures here invariant violations only.
  absl::StatusOr<at::Tensor> UpdateAndAttend(int64_t layer, const KVStep& step, const at::Tensor& q,
                                             const at::Tensor& keys, const at::Tensor& values,
                                             const AttentionParams& params) override;

  void Reset() override;
  int64_t AllocatedBytes() const override;
  int64_t IndexBytes() const override;
  // The smallest of the caches' (every cache checks its own bound in CheckStep).
  int64_t max_sequence_length() const override;
  int64_t batch_size() const override;
  int64_t num_layers() const override { return batch_.caches.front()->num_layers(); }
  std::string DebugName() const override;

  const KVBatch& batch() const { return batch_; }

 private:
  explicit RoutingKVCache(KVBatch batch);
  // The sequences' steps for `step` (split again when the step's positions change), and the
  // step of the decode rows [rows, 1].
  absl::StatusOr<const std::vector<KVStep>*> SequenceSteps(const KVStep& step) const;
  // Sequences [rows_begin_, end) as one-token rows: q [rows, n_head, 1, hs], keys and values
  // [rows, G, 1, hs] -> [rows, n_head, 1, hs].
  absl::StatusOr<at::Tensor> AttendRows(int64_t layer, const at::Tensor& q, const at::Tensor& keys,
                                        const at::Tensor& values, const AttentionParams& params);
  // Decode row `row` (of [rows_begin_, end)) through its cache's own UpdateAndAttend.
  absl::StatusOr<at::Tensor> AttendAlone(int64_t layer, int64_t row, const at::Tensor& q,
                                         const at::Tensor& keys, const at::Tensor& values,
                                         const AttentionParams& params);
  // The same on a device whose pools attend through a paged kernel (KVTableRows): the rows
  // of each pool in one PagedDecodeRows launch, the others alone; nullopt, storing nothing,
  // when no row's cache has such a kernel.
  absl::StatusOr<std::optional<at::Tensor>> AttendTableRows(int64_t layer, const at::Tensor& q,
                                                            const at::Tensor& keys,
                                                            const at::Tensor& values,
                                                            const AttentionParams& params);

  KVBatch batch_;
  std::vector<int64_t> offsets_;  // along kTime: each sequence's first step
  int64_t tokens_ = 0;
  // Sequences [rows_begin_, end) attend as decode rows: all of a kBatch step, or a trailing
  // run of two or more one-token sequences of a kTime step; end when there are none.
  size_t rows_begin_ = 0;
  // The last step split, recognised by its positions tensor.
  mutable at::Tensor split_positions_;
  mutable std::vector<KVStep> sequence_steps_;
  mutable KVStep rows_step_;  // positions [rows, 1]
};

}  // namespace lgpt

#endif  // LGPT_CACHE_ROUTING_KV_CACHE_H_
