// Scoring eviction policies (h2o, h2o-vlen, tova: cache/eviction_policy.h) over a shared BlockPool:
// one request's budgeted cache whose entries live in pool blocks, so budgeted caches of every kind
// and dense requests share one memory and one accounting (cache/paged_kv_cache.h keeps the
// sink and window policies in a ring of pool blocks; this cache keeps the entries a scoring
// policy chooses).
//
// Slots: each layer addresses budget + 1 slots per query group (slot s of every layer and
// group lives in block table[s / entries_per_block] at s % entries_per_block), so the cache
// never holds more than ceil((budget + 1) / entries_per_block) blocks (the largest budget over
// the layers). The slots, their positions (-1: empty) and scores mirror
// cache/policy_kv_cache.h's main store of the same policy (batch 1, no quantised residual):
// a decoding step writes its entry into each group's first empty slot, attends to slots
// [0, high) with the decode kernel (which hands out the softmax weights the policy scores
// with), and evicts the entry of lowest EntryPriority when over budget (the first of equals);
// a prompt chunk attends to the kept entries and its own (a transient view, the chunk's entries
// as stored), then keeps the policy's top `budget` in position order. So with a float32 pool it
// attends to the bit as that PolicyKVCache; a pool of 16-bit or int8 / int4 entries attends to
// every entry as stored, the step's own included (as cache/paged_kv_cache.h's pools do).
// Entries kept across a chunk are moved as stored (never re-encoded).
//
// Where the slots' bookkeeping runs (ScoredSlotWork): for a CPU pool on the host (positions and
// scores in host memory, rows copied one by one, a decoding step attended by the CPU decode
// kernel, which hands out the weights); for a device pool (CUDA) on the pool's device, as tensor
// operations that never read a value back: each group's first empty slot and its victim by
// argmax / argmin (the first of equals, as the host's loops take them), entries written and
// moved through the block table with index_put (stored rows moved as stored), scores added
// from the weights of ATen's attention over the kept slots. Both keep the same entries; tests
// run the device's code on a CPU pool against the host's. Float32, bfloat16 or float16 models
// (a 16-bit model's entries widen to float32 exactly on their way into the pool's format, and
// views read them back in the model's dtype). No prefix
// sharing (entries depend on the steps, not only the tokens), no rollback (an evicted entry cannot
// come back). Forking (KVForker, the n choices of a prompt): the copy shares every block and copies
// a shared block before its first write.
#ifndef LGPT_CACHE_SCORED_PAGED_KV_CACHE_H_
#define LGPT_CACHE_SCORED_PAGED_KV_CACHE_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/block_pool.h"
#include "cache/eviction_policy.h"
#include "cache/kv_cache.h"
#include "core/ops/attention.h"

namespace lgpt {

// Where a ScoredPagedKVCache keeps and updates its slots' positions and scores.
enum class ScoredSlotWork {
  kAuto,        // on the host for a CPU pool, on the pool's device otherwise
  kHost,        // loops over host memory (CPU pools only)
  kPoolDevice,  // tensor operations on the pool's device (a CUDA pool's; on a CPU pool, for tests)
};

struct ScoredPagedKVCacheOptions {
  std::shared_ptr<BlockPool> pool;
  int64_t max_sequence_length = 0;
  // h2o, h2o-vlen or tova (cache/eviction_policy.h's options: budget, layer_budgets,
  // recent_fraction, grace_period, normalize_scores).
  EvictionPolicyOptions policy;
  ScoredSlotWork slot_work = ScoredSlotWork::kAuto;
};

// Whether a request of `policy` can be kept in a ScoredPagedKVCache: a scoring
// policy (h2o, h2o-vlen, tova). OK or InvalidArgument naming the field
// (ScoredPagedKVCacheOptions.policy.kind). Layers with a score reducer (a group's copies on
// tensor-parallel ranks) pass each step's scores through it, as PolicyKVCache does.
absl::Status CheckScoredPagedPolicy(const EvictionPolicyOptions& policy);

class ScoredPagedKVCache : public KVCache,
                           public KVPoolBlocks,
                           public KVAttentionScorer,
                           public KVForker {
 public:
  // InvalidArgument for a missing pool, max_sequence_length < 1, a policy that
  // CheckScoredPagedPolicy or ValidateEvictionPolicy refuses, host slot work over a device pool
  // (errors name the field).
  static absl::StatusOr<std::unique_ptr<ScoredPagedKVCache>> Create(
      const ScoredPagedKVCacheOptions& options);
  ~ScoredPagedKVCache() override;

  // Positions must continue the stream (length(), length() + 1, ...); the blocks the step
  // needs are taken here, before any layer runs (and shared ones copied): ResourceExhausted
  // when the pool has too few free blocks (nothing taken then).
  absl::Status CheckStep(const KVStep& step, int64_t batch_size) const override;
  // The kept entries (slots [0, high), as stored, read in the step's dtype) and the step's own;
  // positions [1, G, S]. The step's eviction waits for ObserveAttentionWeights (or the layer's
  // next step, without weights).
  absl::StatusOr<KVView> Update(int64_t layer, const KVStep& step, const at::Tensor& keys,
                                const at::Tensor& values) override;
  // Host slot work: decoding steps in host loops (place, attend with the decode kernel, score,
  // evict). Otherwise, and for prompt chunks, through Update, attention over the view and
  // ObserveAttentionWeights.
  absl::StatusOr<at::Tensor> UpdateAndAttend(int64_t layer, const KVStep& step, const at::Tensor& q,
                                             const at::Tensor& keys, const at::Tensor& values,
                                             const AttentionParams& params) override;
  bool WantsAttentionWeights(int64_t layer) const override;
  void ObserveAttentionWeights(int64_t layer, const at::Tensor& weights) override;
  KVAttentionScorer* attention_scorer() override { return this; }

  const KVForker* forker() const override { return this; }
  // A ScoredPagedKVCache over the same pool with the same layer plans, long enough for this
  // one's entries, between steps.
  absl::Status CheckCopyInto(const KVCache& target) const override;
  // `target` gives back its blocks and takes references to this cache's (copied on write).
  absl::Status CopyInto(KVCache& target) const override;

  // Gives every block back to the pool.
  void Reset() override;
  // Bytes of the blocks held (whole blocks, every layer).
  int64_t AllocatedBytes() const override;
  // Slot positions and scores, and the table.
  int64_t IndexBytes() const override;
  int64_t max_sequence_length() const override { return max_sequence_length_; }
  int64_t batch_size() const override { return 1; }
  int64_t num_layers() const override { return static_cast<int64_t>(layers_.size()); }
  std::string DebugName() const override;

  const BlockPool* pool() const override { return pool_.get(); }
  const LayerPlan& plan(int64_t layer) const { return layers_[layer].plan; }
  int64_t blocks_held() const override { return static_cast<int64_t>(table_.size()); }
  bool evicts() const override { return true; }
  // Entries every layer has seen (the next position to write).
  int64_t length() const { return length_; }
  // Blocks the cache holds once it has seen `entries` entries (from empty); the most it ever
  // holds is BlocksToHold(max_sequence_length()).
  int64_t BlocksToHold(int64_t entries) const override;
  // Blocks the next step of `steps` entries takes from the pool (new ones and copies of shared
  // ones).
  int64_t BlocksNeeded(int64_t steps) const override;
  absl::Status TakeBlocks(int64_t steps) override { return TakeStepBlocks(steps); }
  // Positions `layer` keeps for `group`, ascending, once any pending eviction is settled.
  std::vector<int64_t> KeptPositions(int64_t layer, int64_t group);

 private:
  // A step whose eviction waits for its weights: a decoding step's (evict one entry) or a
  // prompt chunk's (keep the top `budget` of the kept entries and the chunk's).
  struct Pending {
    enum Kind { kNone, kDecode, kChunk } kind = kNone;
    int64_t newest = 0;       // the step's last position
    int64_t view_high = 0;    // kept slots in the step's view
    at::Tensor keys, values;  // chunk: [1, G, T, hs] as given, in float32 (stored when kept)
    at::Tensor positions;     // chunk: [T] int32
    at::Tensor feature;       // h2o-vlen: the step's entries' value norms [1, G, T] float32
  };
  struct Layer {
    LayerPlan plan;
    int64_t groups = 0, head_size = 0;
    int64_t channels = 1;  // state per slot: the score, and h2o-vlen's value norm
    int64_t capacity = 0;  // slots addressed: budget + 1 (the step's entry beside the budget)
    int64_t high = 0;      // slots [0, high) hold entries or holes; views stop there
    int64_t used = 0;      // live entries of any group (an upper bound)
    at::Tensor positions;  // [1, G, capacity] int32, -1 where empty (where the slot work runs)
    at::Tensor scores;     // [1, G, capacity, channels] float32: the policy's state (likewise)
    std::vector<float> step_weights;  // a decoding step's weights [n_head, high]
    Pending pending;
  };

  ScoredPagedKVCache(const ScoredPagedKVCacheOptions& options, std::vector<Layer> layers);
  // Table indices the next `steps` entries may write into that need a block of their own:
  // past the table's end, or shared.
  std::vector<int64_t> TableSlotsToFill(int64_t steps) const;
  absl::Status TakeStepBlocks(int64_t steps) const;
  absl::Status CheckLayer(int64_t layer, const KVStep& step, const at::Tensor& keys,
                          const at::Tensor& values) const;
  // Update after CheckLayer.
  KVView UpdateChecked(int64_t layer, const KVStep& step, const at::Tensor& keys,
                       const at::Tensor& values);
  // Counts a layer's step as written; the cache's length moves on once every layer has.
  void Advance(int64_t layer, int64_t steps);
  // The slots' blocks of `layer`: keys or values [G, bs, width], for the first `slots` slots.
  std::vector<at::Tensor> SlotBlocks(int64_t layer, bool keys, int64_t slots) const;
  // `layer`'s entry format in a quantised pool, else nullptr (entries of the pool's dtype).
  const paged::EntryFormat* QuantisedFormat(int64_t layer) const;
  // Row bytes of `layer`'s stored entries and where (slot, group) lies.
  int64_t RowBytes(int64_t layer) const;
  char* RowOf(int64_t layer, bool keys, int64_t slot, int64_t group) const;
  // Stores the float32 entry `src` (head_size floats) of `group` into `slot`.
  void StoreRow(int64_t layer, bool keys, int64_t slot, int64_t group, const float* src) const;
  // A decoding step's entry into each group's first empty slot, with a fresh score.
  void PlaceDecode(Layer& layer, int64_t index, int64_t position, const at::Tensor& keys,
                   const at::Tensor& values);
  void PlaceDecodeOnHost(Layer& layer, int64_t index, int64_t position, const at::Tensor& keys,
                         const at::Tensor& values);
  void PlaceDecodeOnDevice(Layer& layer, int64_t index, int64_t position, const at::Tensor& keys,
                           const at::Tensor& values);
  // Device slot work: the table [blocks] int64 on the pool's device (copied there once after
  // each change of the table).
  at::Tensor TableOnDevice() const;
  // Slots [0, n) of every group: [G, n] int64 on the pool's device.
  at::Tensor SlotRange(int64_t layer, int64_t n) const;
  // Entries [1, G, T, hs] encoded as `layer`'s pool stores them: [G, T, width].
  at::Tensor Encode(int64_t layer, const at::Tensor& entries) const;
  // Where `slots` [G, n] lie in a layer's storage: their blocks, groups and places in the block.
  std::vector<at::indexing::TensorIndex> StorageIndex(const at::Tensor& slots) const;
  // The stored rows of `slots` [G, n] of `layer`'s keys or values: [G, n, width].
  at::Tensor ReadStored(int64_t layer, bool keys, const at::Tensor& slots) const;
  // Stored rows [G, n, width] into `slots` [G, n] of `layer`'s keys or values.
  void WriteStored(int64_t layer, bool keys, const at::Tensor& slots, const at::Tensor& rows) const;
  // The step's view of the kept slots: [1, G, high, hs] in `dtype`.
  at::Tensor ReadKept(int64_t layer, bool keys, int64_t high, c10::ScalarType dtype) const;
  // Float32 entries [1, G, T, hs] as the pool stores them, read back in `dtype`.
  at::Tensor AsStored(int64_t layer, const at::Tensor& entries, c10::ScalarType dtype) const;
  // The pending step's end: scores from `weights` [1, n_head, T, S] (undefined: none), then
  // the eviction.
  void Settle(int64_t index, const at::Tensor& weights);
  // h2o-vlen: the value norms of the pending step's view (kept slots, then a chunk's entries),
  // [1, G, S]; else undefined.
  at::Tensor ViewFeature(const Layer& layer) const;
  // Adds (h2o) or sets (tova) the scores of slots [0, high) from a decoding step's weights.
  void ScoreDecode(Layer& layer, int64_t n_head, const float* weights);
  // Evicts each group's entry of lowest priority when over budget.
  void EvictDecode(Layer& layer, int64_t newest);
  void EvictDecodeOnHost(Layer& layer, int64_t newest);
  void EvictDecodeOnDevice(Layer& layer, int64_t newest);
  // After a chunk: slots [0, kept) become the policy's top `budget` of the kept entries and the
  // chunk's, in position order.
  void Compact(int64_t index, const at::Tensor& chunk_scores);
  // Compact's move of the chosen entries (`chosen` [1, G, kept]: indices into the kept slots,
  // then the chunk's entries) into slots [0, kept), as stored.
  void MoveChosenOnHost(int64_t index, const at::Tensor& chosen);
  void MoveChosenOnDevice(int64_t index, const at::Tensor& chosen);
  bool DecodeOnHostApplies(int64_t index, const at::Tensor& q, const at::Tensor& keys,
                           const KVStep& step) const;
  at::Tensor DecodeOnHost(int64_t index, const KVStep& step, const at::Tensor& q,
                          const at::Tensor& keys, const at::Tensor& values,
                          const AttentionParams& params);

  std::shared_ptr<BlockPool> pool_;
  int64_t max_sequence_length_;
  EvictionPolicyOptions policy_;
  bool on_host_;              // the slot work (ScoredSlotWork) runs on the host
  int64_t max_capacity_ = 0;  // the most slots any layer addresses
  std::vector<Layer> layers_;
  mutable std::vector<int64_t> table_;  // blocks in slot order; CheckStep grows it
  mutable at::Tensor table_on_device_;  // device slot work: table_, once copied there
  mutable bool table_changed_ = true;   // table_ changed since that copy
  std::vector<int64_t> layer_length_;   // entries seen per layer
  int64_t length_ = 0;                  // entries every layer has seen
};

}  // namespace lgpt

#endif  // LGPT_CACHE_SCORED_PAGED_KV_CACHE_H_
