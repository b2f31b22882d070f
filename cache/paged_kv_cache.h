// One request's dense KV cache over a shared BlockPool: a block table maps its positions to
// pool blocks (position p lives in block table[p / entries_per_block] at slot
// p % entries_per_block), taken from the pool as the request grows and given back when the
// cache is reset or destroyed.
// Attention reads the entries block by block where they lie (AttendBlockwise over one source
// per block), so no contiguous copy of the request's cache is made per step.
//
// Batch size 1; entries are appended in position order (a step continues where the last one
// ended), as generation and the serving scheduler feed them. Entries in the pool's dtype: the
// model's, or 16-bit entries of a float32 model (bfloat16, float16: the step's keys and values
// rounded to nearest even as they are written, widened exactly as attention reads them, a
// block or a tile at a time, or in registers by the decode kernel; the plain contract's copy
// is widened to the step's dtype), or int8 / int4 codes with float16 scales (a quantised pool:
// every query, its own step's included, reads the entries as stored, dequantised in registers
// by the decode kernel, a run of blocks at a time for prompt chunks). A CUDA pool's decoding
// steps go through the paged decode kernel (core/ops/paged_attention.h) over the block table.
//
// Prefix reuse: the entries of a block depend only on the tokens up to and including it, so
// PublishPrefix offers the cache's full blocks to a prefix cache (cache/prefix_cache.h) over
// its pool and AttachPrefix starts an empty cache with the longest cached chain of a prompt's
// blocks. A block that others share is copied before a step writes into it (copy-on-write: the
// last block of a prompt that is a whole number of blocks, whose last token is computed again
// for its logits).
//
// Rollback (speculative decoding): Truncate gives back the blocks past the new length; a
// published block it cuts into stays shared, so the next write copies it first.
//
// Evicting caches in the pool (StreamingLLM's sink and window policies, PagedEviction): the
// cache keeps the first `sink_entries` positions and the most recent ones in a fixed set of
// `budget` slots (sinks first, then a ring of budget - sink_entries slots: position p lives in
// slot p while the ring has not wrapped, in slot sinks + (p - sinks) % ring after), so it never
// holds more than ceil(budget / entries_per_block) blocks. A step attends to what the cache
// kept after the previous step (the sinks and the budget - sinks most recent entries) plus the
// step's own entries, as cache/policy_kv_cache.h's sink and window caches do (on every layer
// where PagedEvictionKeepsAsThePolicy holds). Once the slots are full, a decoding step's entry
// waits beside them (one entry per layer, in the pool's format, outside the pool) and is
// attended from there; the next step first writes it over the oldest recent entry, the one the
// policy evicted. A prompt chunk that wraps the ring attends to a transient copy of the kept
// entries and its own (as stored), and only its entries that stay are written. Slots hold
// positions out of order once the ring wraps, so attention reads each slot's position (every
// path takes key positions). No prefix sharing, no rollback once an entry was overwritten, no
// CUDA kernel yet (the generic path over the blocks serves device pools). Forking (KVForker,
// the n choices of a prompt): the copy shares every block of the original, and each copies a
// shared block before writing into it, so a fork costs no blocks until the rings turn.
#ifndef LGPT_CACHE_PAGED_KV_CACHE_H_
#define LGPT_CACHE_PAGED_KV_CACHE_H_

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cache/block_pool.h"
#include "cache/kv_cache.h"
#include "cache/prefix_cache.h"
#include "core/ops/attention.h"
#include "core/ops/decode_attention.h"

namespace lgpt {

// Which positions a paged cache keeps.
struct PagedEviction {
  // 0: every position (a dense cache). Otherwise the entries kept between steps: the first
  // `sink_entries` positions and the budget - sink_entries most recent ones (the sink policy;
  // the window policy has no sinks).
  int64_t budget = 0;
  int64_t sink_entries = 0;
};

// Whether an evicting paged cache keeps on a layer of sliding `window` (0: global attention)
// what cache/policy_kv_cache.h's policy of the same budget keeps: always on global layers and
// without sinks; on a windowed layer only when the budget - sinks recent entries cover what a
// query sees of the window (the policy cache drops sinks that have left the window and keeps
// more recent entries instead; the paged cache, one slot layout for every layer, keeps them).
bool PagedEvictionKeepsAsThePolicy(const PagedEviction& eviction, int64_t window);

class PagedKVCache : public KVCache,
                     public KVPoolBlocks,
                     public KVDecodeRows,
                     public KVTableRows,
                     public KVRollback,
                     public KVForker {
 public:
  // A cache of up to `max_sequence_length` positions over `pool`, keeping what `eviction`
  // says. InvalidArgument for a missing pool, max_sequence_length < 1, a negative budget or
  // sink_entries outside [0, budget].
  static absl::StatusOr<std::unique_ptr<PagedKVCache>> Create(std::shared_ptr<BlockPool> pool,
                                                              int64_t max_sequence_length,
                                                              PagedEviction eviction = {});
  ~PagedKVCache() override;

  // The step must continue the stream (positions next, next + 1, ... on its one row) and its
  // blocks are taken from the pool here, before any layer runs: ResourceExhausted when the
  // pool has too few free blocks (nothing taken then).
  absl::Status CheckStep(const KVStep& step, int64_t batch_size) const override;
  // A contiguous copy of the entries (for callers of the plain contract; attention does not
  // use it).
  absl::StatusOr<KVView> Update(int64_t layer, const KVStep& step, const at::Tensor& keys,
                                const at::Tensor& values) override;
  absl::StatusOr<at::Tensor> UpdateAndAttend(int64_t layer, const KVStep& step, const at::Tensor& q,
                                             const at::Tensor& keys, const at::Tensor& values,
                                             const AttentionParams& params) override;
  // The blocks as they lie (CPU pools of float32 entries, 16-bit entries of a float32 model, or
  // quantised entries).
  absl::StatusOr<std::optional<DecodeRow>> UpdateForDecode(int64_t layer, const KVStep& step,
                                                           const at::Tensor& keys,
                                                           const at::Tensor& values) override;
  KVDecodeRows* decode_rows() override { return this; }
  // Device pools with the CUDA paged kernel (dense caches).
  KVTableRows* table_rows() override;
  // Any dense cache's one-token step (CPU pools too: the kernel's CPU twin reads the row).
  absl::StatusOr<std::optional<Row>> UpdateForTable(int64_t layer, const KVStep& step,
                                                    const at::Tensor& keys,
                                                    const at::Tensor& values) override;
  // Dense caches only (an evicting cache cannot bring back what it overwrote).
  KVRollback* rollback() override { return evicts() ? nullptr : this; }
  // Evicting caches only (dense ones share their prompt's blocks through the prefix cache).
  const KVForker* forker() const override { return evicts() ? this : nullptr; }
  // A PagedKVCache over the same pool, keeping the same positions, long enough for this one's.
  absl::Status CheckCopyInto(const KVCache& target) const override;
  // `target` gives back its blocks and takes references to this cache's.
  absl::Status CopyInto(KVCache& target) const override;
  int64_t max_rollback() const override { return kUnlimited; }
  // The cache holds positions [0, min(length, length())) afterwards; blocks past them go back
  // to the pool, and a published (prefix-cached) block the cut falls in is no longer this
  // cache's to publish. FailedPrecondition for an evicting cache whose ring has wrapped.
  absl::Status Truncate(int64_t length) override;

  // Gives every block back to the pool.
  void Reset() override;
  // Bytes of the blocks held (whole blocks, in every layer).
  int64_t AllocatedBytes() const override;
  int64_t IndexBytes() const override;
  int64_t max_sequence_length() const override { return max_sequence_length_; }
  int64_t batch_size() const override { return 1; }
  int64_t num_layers() const override { return static_cast<int64_t>(pool_->layers().size()); }
  std::string DebugName() const override;

  const BlockPool* pool() const override { return pool_.get(); }
  int64_t blocks_held() const override { return static_cast<int64_t>(table_.size()); }
  // Entries every layer has seen (the next position to write).
  int64_t length() const { return length_; }
  // Whether the cache evicts (PagedEviction.budget > 0 and below the sequence length).
  bool evicts() const override { return evicts_; }
  // Blocks the cache holds once it has seen `entries` entries (from empty).
  int64_t BlocksToHold(int64_t entries) const override;
  // Takes the blocks the next step of `steps` entries writes into (CheckStep does it too):
  // ResourceExhausted when the pool has too few, taking nothing then.
  absl::Status TakeBlocks(int64_t steps) override;
  // Blocks the next step of `steps` entries takes from the pool (new ones and copies of
  // shared ones).
  int64_t BlocksNeeded(int64_t steps) const override;

  // An empty cache takes the cached blocks that start `tokens` (whole blocks, chained from the
  // first) and holds their entries; returns how many positions it now holds, at most
  // tokens.size() - 1 so that the last token is computed again for its logits (its block is
  // copied before that write when shared). 0 when nothing is cached, the cache is not empty
  // or it evicts.
  // `prefixes` is over this cache's pool.
  int64_t AttachPrefix(PrefixCache& prefixes, absl::Span<const int64_t> tokens);
  // Publishes the full blocks of `tokens` (the ids at positions 0, 1, ... whose entries the
  // cache holds: at most length() of them) not published yet; nothing for an evicting cache.
  void PublishPrefix(PrefixCache& prefixes, absl::Span<const int64_t> tokens);

 private:
  PagedKVCache(std::shared_ptr<BlockPool> pool, int64_t max_sequence_length,
               PagedEviction eviction);
  // Writes the step's entries of `layer` into its blocks; returns the layer's new length.
  absl::StatusOr<int64_t> Write(int64_t layer, const KVStep& step, const at::Tensor& keys,
                                const at::Tensor& values);
  // The pool blocks [G, entries_per_block, hs] holding `layer`'s entries after `length`
  // positions (its first Filled(length) slots), in slot order.
  struct BlockList {
    std::vector<at::Tensor> keys, values;
  };
  BlockList Blocks(int64_t layer, int64_t length) const;
  at::Tensor Positions(int64_t begin, int64_t length) const;
  // Slots in use once `length` positions are in the blocks.
  int64_t Filled(int64_t length) const { return evicts() ? std::min(length, slots_) : length; }
  // The positions a step of `layer` attends to after its Write: its Filled slots' (0, 1, ...
  // until the ring wraps), then its newest entry's when it waits beside them; [1, 1, n] int64
  // on the pool's device.
  at::Tensor KeyPositions(int64_t layer) const;
  // Entries of `layer` in its blocks (positions seen, less a newest entry waiting beside them).
  int64_t InBlocks(int64_t layer) const { return layer_length_[layer] - newest_[layer]; }
  // Writes `layer`'s waiting newest entry over the oldest recent one (nothing without a ring).
  void PlaceNewest(int64_t layer);
  // The segments of `layer`'s attended entries: the first `filled` slots of `blocks`, then the
  // waiting newest entry.
  KVSegmentsOf AttendedSegments(int64_t layer, BlockList blocks, int64_t filled) const;
  // The waiting newest entry of `layer`, [1, G, 1, hs] in `dtype`.
  at::Tensor NewestAs(int64_t layer, bool keys, c10::ScalarType dtype) const;
  // It as the last source of an AttendBlockwise over key_positions [1, 1, filled + 1].
  KVBlockSource NewestSource(int64_t layer, c10::ScalarType dtype,
                             const at::Tensor& key_positions) const;
  // Entries [1, G, T, hs] as Store encodes them (quantised pools: float32 rows on the CPU).
  at::Tensor Encodable(const at::Tensor& entries) const;
  // Entries [from, from + n) of src (Encodable) into slots [slot, slot + n) of a block
  // [G, bs, width] of `layer`'s format: copied (rounded to 16 bits) or quantised.
  void Store(int64_t layer, const at::Tensor& src, int64_t from, int64_t n, const at::Tensor& block,
             int64_t slot) const;
  // The first `filled` entries of `layer`'s blocks [G, bs, width] in order, widened or decoded:
  // [1, G, filled, hs] in `dtype`.
  at::Tensor ReadSlots(int64_t layer, const std::vector<at::Tensor>& blocks, int64_t filled,
                       c10::ScalarType dtype) const;
  // The slot of position `position`.
  int64_t SlotOf(int64_t position) const;
  // The step's positions [begin, begin + steps) whose entries stay in the cache after it (an
  // evicting cache skips those a later entry of the same step overwrites): ranges of
  // [first, end).
  std::vector<std::pair<int64_t, int64_t>> Survivors(int64_t begin, int64_t steps) const;
  // Whether a step of `steps` entries into `layer` is a prompt chunk that wraps the ring.
  bool WrapsInChunk(int64_t layer, int64_t steps) const;
  // A prompt chunk that wraps the ring (evicting caches): the kept entries of `layer` before
  // the step, read as stored, then the chunk's own entries rounded as they will be stored, in
  // the step's dtype; the chunk's surviving entries are written afterwards.
  absl::StatusOr<KVView> WrappingChunk(int64_t layer, const KVStep& step, const at::Tensor& keys,
                                       const at::Tensor& values);
  // Entries [1, G, T, hs] rounded (16-bit pools) or quantised (quantised pools) as `layer`'s
  // blocks store them, read back in `dtype`.
  at::Tensor AsStored(int64_t layer, const at::Tensor& entries, c10::ScalarType dtype) const;
  // Grows ramp_ to at least `length` entries.
  void EnsureRamp(int64_t length) const;
  // Whether a step of queries `q` attends through the CUDA paged decode kernel (a device pool,
  // one query, no autograd).
  bool PagedKernelApplies(const at::Tensor& q) const;
  // UpdateAndAttend's step through core/ops/paged_attention.h over the block table.
  absl::StatusOr<at::Tensor> AttendThroughTable(int64_t layer, const KVStep& step,
                                                const at::Tensor& q, const at::Tensor& keys,
                                                const at::Tensor& values,
                                                const AttentionParams& params);
  // UpdateAndAttend over a quantised pool.
  absl::StatusOr<at::Tensor> AttendQuantised(int64_t layer, const KVStep& step, const at::Tensor& q,
                                             const at::Tensor& keys, const at::Tensor& values,
                                             const AttentionParams& params);
  // Whether a step of queries `q` attends through FlashAttention over the blocks directly.
  bool FlashOverBlocksApplies(const at::Tensor& q, const KVStep& step) const;
  // TakeBlocks' work; CheckStep (const in the KVCache contract) calls it too.
  absl::Status TakeStepBlocks(int64_t steps) const;
  // Indices into table_ that the next `steps` entries write into and that need a block of
  // their own: past the table's end (ascending from it), or shared (copied on write).
  std::vector<int64_t> TableSlotsToFill(int64_t steps) const;

  std::shared_ptr<BlockPool> pool_;
  int64_t max_sequence_length_;
  bool evicts_ = false;
  int64_t sinks_ = 0;  // evicting caches: slots [0, sinks_) hold positions [0, sinks_)
  int64_t ring_ = 0;   // evicting caches: slots [sinks_, sinks_ + ring_) the recent ones
  int64_t slots_ = 0;  // slots in all: the budget, or max_sequence_length_ (dense)
  // Evicting caches, per layer: whether (1) its newest entry waits beside the slots, and that
  // entry's keys and values [G, 1, head_size or entry_bytes] in the pool's format.
  std::vector<int64_t> newest_;
  std::vector<at::Tensor> newest_keys_, newest_values_;
  // Blocks in position order; CheckStep grows it for the step about to run.
  mutable std::vector<int64_t> table_;
  // Prefix keys of table_[0, keys_.size()): blocks published (or found published) so far.
  std::vector<uint64_t> keys_;
  std::vector<int64_t> layer_length_;  // entries written per layer
  int64_t length_ = 0;                 // entries every layer holds
  mutable at::Tensor ramp_;            // [1, 1, size]: 0, 1, 2, ... the entries' positions
  // Evicting caches: KeyPositions for slot_positions_key_ = (entries in blocks, newest) (a new
  // tensor per key, so decode rows holding the last one keep it).
  mutable at::Tensor slot_positions_;
  mutable std::pair<int64_t, int64_t> slot_positions_key_{-1, 0};
};

}  // namespace lgpt

#endif  // LGPT_CACHE_PAGED_KV_CACHE_H_
