// The exact KV cache: every entry of every layer kept at full precision, with storage sized
// by n_query_groups (never n_head).
//
// Global layers store position p in slot p and grow their buffers on demand up to
// max_sequence_length (doubling, so a short generation never holds a long buffer); each
// step returns views of slots [0, max position written]. Sliding-window layers keep a ring of
// min(window, max_sequence_length) slots. A decode step writes into the ring first; a chunk
// of T > 1 tokens attends to the ring's old entries concatenated with its own, and only then
// is written, so no query loses a key it needs whatever the chunk size (LitGPT's ring
// overwrites such keys).
//
// Rollback (speculative decoding): global layers forget positions by ending their views
// earlier; a ring overwrites the oldest entries, so it keeps `rollback_slots` slots beyond its
// window for the entries a rejected step displaced (a step may then run rollback_slots + 1
// entries past what it keeps).
#ifndef LGPT_CACHE_DENSE_KV_CACHE_H_
#define LGPT_CACHE_DENSE_KV_CACHE_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/kv_cache.h"

namespace lgpt {

struct DenseKVCacheOptions : KVCacheGeometry {
  // Slots allocated up front for global layers; 0 grows on demand. Callers that know the
  // final length (prompt + new tokens) pass it to avoid any regrowth.
  int64_t initial_capacity = 0;
  // Sliding-window layers: slots kept beyond the window, so that a Truncate may forget up to
  // rollback_slots + 1 of the newest entries (speculative decoding of k tokens needs k - 1).
  int64_t rollback_slots = 0;
};

class DenseKVCache : public KVCache, public KVDecodeRows, public KVForker, public KVRollback {
 public:
  static absl::StatusOr<std::unique_ptr<DenseKVCache>> Create(const DenseKVCacheOptions& options);

  absl::StatusOr<KVView> Update(int64_t layer, const KVStep& step, const at::Tensor& keys,
                                const at::Tensor& values) override;
  absl::Status CheckStep(const KVStep& step, int64_t batch_size) const override;
  // Float32 caches of one row on the CPU, global (not sliding-window) layers.
  absl::StatusOr<std::optional<DecodeRow>> UpdateForDecode(int64_t layer, const KVStep& step,
                                                           const at::Tensor& keys,
                                                           const at::Tensor& values) override;
  KVDecodeRows* decode_rows() override { return this; }
  // Forking: into another DenseKVCache of the same rows, dtype, device and layers (its
  // max_sequence_length may differ where the windowed layers stay rings and the entries fit).
  // Global layers copy their written slots [0, end) into storage of this cache's capacity;
  // rings copy their window.
  const KVForker* forker() const override { return this; }
  absl::Status CheckCopyInto(const KVCache& target) const override;
  absl::Status CopyInto(KVCache& target) const override;
  KVRollback* rollback() override { return this; }
  // Unlimited without sliding-window rings; else rollback_slots + 1.
  int64_t max_rollback() const override;
  // Global layers end their views at `length`; rings mark the forgotten slots empty, after
  // checking that they still hold every entry a query at or after `length` sees.
  absl::Status Truncate(int64_t length) override;
  void Reset() override;
  // Key and value storage: 2 · batch · n_query_groups · capacity · head_size · element size,
  // summed over layers (capacity window-sized on windowed layers).
  int64_t AllocatedBytes() const override;
  // Ring-slot positions and the shared position ramp.
  int64_t IndexBytes() const override;
  int64_t max_sequence_length() const override { return options_.max_sequence_length; }
  int64_t batch_size() const override { return options_.batch_size; }
  int64_t num_layers() const override { return static_cast<int64_t>(layers_.size()); }
  std::string DebugName() const override { return "dense"; }

  // Slots currently allocated for `layer`.
  int64_t capacity(int64_t layer) const { return layers_[layer].capacity; }

 private:
  struct Layer {
    KVLayerSpec spec;
    bool ring = false;     // sliding window shorter than max_sequence_length
    int64_t capacity = 0;  // allocated slots
    int64_t end = 0;       // global layers: max position written + 1
    at::Tensor keys;       // [B, n_query_groups, capacity, head_size]
    at::Tensor values;     // [B, n_query_groups, capacity, head_size]
    at::Tensor positions;  // ring layers: [B, 1, capacity] int64, -1 where empty
  };

  explicit DenseKVCache(const DenseKVCacheOptions& options);
  void Grow(Layer& layer, int64_t needed);
  KVView RingUpdate(Layer& layer, const KVStep& step, const at::Tensor& keys,
                    const at::Tensor& values);
  // ramp_ with at least `length` entries, and its first `length` ([1, 1, length]).
  void GrowRamp(int64_t length);
  at::Tensor Ramp(int64_t length);
  // keys or values in options_.dtype.
  at::Tensor InCacheDtype(const at::Tensor& t) const;
  // A global layer's writes (Update's and UpdateForDecode's): grows it, stores k and v
  // (options_.dtype, [B, G, T, hs]) in their slots and returns the [B, ...] buffers written.
  std::pair<at::Tensor, at::Tensor> WriteSlots(Layer& layer, const KVStep& step,
                                               const at::Tensor& k, const at::Tensor& v);

  DenseKVCacheOptions options_;
  std::vector<Layer> layers_;
  at::Tensor ramp_;  // [1, 1, capacity] int64: 0, 1, 2, ...
};

}  // namespace lgpt

#endif  // LGPT_CACHE_DENSE_KV_CACHE_H_
