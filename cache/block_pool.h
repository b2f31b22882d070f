// The KV memory a serving engine shares between requests (PagedAttention's block pool): blocks
// of entries_per_block consecutive entries of one request, each holding per layer its keys and
// values [n_query_groups, entries_per_block, head_size]. The pool's storage is allocated once,
// when it is made: per layer keys and values [num_blocks, n_query_groups, entries_per_block,
// head_size], a block a slice of them. On the CPU that is address space only: a page takes
// memory when a block first writes it, and a block that is free again gives its pages back, so
// memory follows what is in use (at most num_blocks · BytesPerBlock()); a device pool holds its
// memory throughout.
//
// The pool is the allocator only: blocks and their reference counts. A block may be kept
// (cache/prefix_cache.h keeps the blocks it publishes): when its last reference goes it stays
// stored, idle, and counts as free; Allocate takes free blocks first, then recycles the
// longest idle kept block. A block's generation changes whenever it is recycled or freed, so
// whoever remembers a kept block by (block, generation) can tell whether it still holds the
// entries it was kept for. What the engine sets aside for caches with storage of their own
// (core/serving/kv_memory.h) is blocks it allocates and holds like any other.
// Thread-safe.
#ifndef LGPT_CACHE_BLOCK_POOL_H_
#define LGPT_CACHE_BLOCK_POOL_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/kv_cache.h"
#include "core/ops/paged_attention_layout.h"

namespace lgpt {

struct BlockPoolOptions {
  int64_t entries_per_block = 16;
  int64_t num_blocks = 0;  // blocks in the pool (>= 1)
  // 16: entries in the geometry's dtype. 8 or 4: quantised entries, each one token's channels of
  // one group as int8 / int4 codes followed by float16 scales per `group_size` channels (the
  // layout core/ops/paged_attention_layout.h defines, shared with the CUDA kernel; the codes of
  // cache/kv_codec.h's QuantizeRow). A layer's storage is then uint8 [num_blocks,
  // n_query_groups, entries_per_block, entry_bytes].
  int entry_bits = 16;
  // Channels per scale (reduced to its greatest common divisor with each layer's head size, as
  // cache/kv_codec.h's codecs do; int4 needs it even).
  int64_t group_size = 32;

  absl::Status Validate() const;
};

class BlockPool {
 public:
  // Blocks for geometry.layers in geometry.dtype on geometry.device (its batch size and
  // sequence length are not used). Allocates no storage yet. InvalidArgument for a bad
  // geometry or options.
  static absl::StatusOr<std::shared_ptr<BlockPool>> Create(const KVCacheGeometry& geometry,
                                                           const BlockPoolOptions& options);

  // A block with one reference and fresh storage (recycling the longest idle kept block when
  // no block is free); ResourceExhausted when every block is referenced. Its entries are unset
  // until written.
  absl::StatusOr<int64_t> Allocate();
  // Another reference to a referenced block.
  void Retain(int64_t block);
  // Drops one reference; at zero the block is free again, or idle when kept.
  void Release(int64_t block);
  // Whether a write into `block` would change what others see: it is referenced more than
  // once or kept (copy it first).
  bool IsShared(int64_t block) const;
  // Copies the entries of block `from` into block `to`, in every layer.
  void CopyBlock(int64_t from, int64_t to);

  // Marks a referenced block kept (its entries stay stored when no one references it) and
  // returns its generation.
  uint64_t Keep(int64_t block);
  // Another reference to `block` when it is still kept in `generation` (idle or not); false,
  // taking nothing, when it was recycled since.
  bool RetainKept(int64_t block, uint64_t generation);
  // Whether `block` is still kept in `generation`.
  bool IsKept(int64_t block, uint64_t generation) const;

  // Blocks Allocate can still take: those no one references (idle kept ones count as free).
  int64_t free_blocks() const;
  // Kept blocks no one references (counted in free_blocks).
  int64_t idle_blocks() const;
  // Blocks holding entries now (referenced and idle).
  int64_t stored_blocks() const;
  int64_t num_blocks() const { return num_blocks_; }
  int64_t entries_per_block() const { return entries_per_block_; }
  // Key and value bytes of one block over all layers.
  int64_t BytesPerBlock() const { return bytes_per_block_; }
  // The same for a geometry not yet made into a pool (sizing a pool by bytes), with entries of
  // `entry_bits` bits (BlockPoolOptions).
  static int64_t BytesPerBlock(const KVCacheGeometry& geometry, int64_t entries_per_block,
                               int entry_bits = 16, int64_t group_size = 32);
  // 16, or 8 / 4 for quantised entries (BlockPoolOptions.entry_bits).
  int entry_bits() const { return entry_bits_; }
  bool quantised() const { return entry_bits_ != 16; }
  // The layout of `layer`'s quantised entries (quantised pools).
  const paged::EntryFormat& entry_format(int64_t layer) const { return formats_[layer]; }
  // Blocks that hold `entries` entries, and blocks that cover `bytes` bytes (rounded up).
  int64_t BlocksFor(int64_t entries) const {
    return (entries + entries_per_block_ - 1) / entries_per_block_;
  }
  int64_t BlocksForBytes(int64_t bytes) const {
    return (bytes + bytes_per_block_ - 1) / bytes_per_block_;
  }
  const std::vector<KVLayerSpec>& layers() const { return layers_; }
  c10::Device device() const { return tensor_options_.device(); }
  // The entries' dtype (uint8 for quantised entries).
  c10::ScalarType dtype() const { return c10::typeMetaToScalarType(tensor_options_.dtype()); }
  // [n_query_groups, entries_per_block, head_size] (quantised: [.., entry_bytes] uint8): the
  // keys or values of `layer` in a taken block.
  const at::Tensor& keys(int64_t block, int64_t layer) const { return storage_[block][2 * layer]; }
  const at::Tensor& values(int64_t block, int64_t layer) const {
    return storage_[block][2 * layer + 1];
  }
  // The whole pool's keys or values of `layer`, [num_blocks, n_query_groups, entries_per_block,
  // head_size or entry_bytes]: what a paged kernel reads through block tables.
  const at::Tensor& layer_keys(int64_t layer) const { return arena_[2 * layer]; }
  const at::Tensor& layer_values(int64_t layer) const { return arena_[2 * layer + 1]; }

 private:
  BlockPool(std::vector<KVLayerSpec> layers, int64_t entries_per_block, int64_t num_blocks,
            at::TensorOptions tensor_options, int entry_bits,
            std::vector<paged::EntryFormat> formats);
  // Takes a free block id with fresh storage, or recycles the longest idle kept block
  // (mutex_ held); -1 when every block is referenced.
  int64_t TakeBlock();
  // Gives a block's pages back (CPU), drops its views and its kept mark, and changes its
  // generation (mutex_ held).
  void FreeStorage(int64_t block);
  void CheckReferenced(int64_t block) const;

  const std::vector<KVLayerSpec> layers_;
  const int64_t entries_per_block_;
  const int64_t num_blocks_;
  const at::TensorOptions tensor_options_;
  const int entry_bits_;
  const std::vector<paged::EntryFormat> formats_;  // per layer, quantised pools
  int64_t bytes_per_block_ = 0;

  // Per layer: keys and values [num_blocks, n_query_groups, entries_per_block, head_size].
  std::vector<at::Tensor> arena_;
  // Per taken block, per layer: keys and values, views of arena_ (empty while the block is free).
  std::vector<std::vector<at::Tensor>> storage_;

  mutable std::mutex mutex_;
  std::vector<int64_t> free_;  // free block ids (a stack)
  struct BlockState {
    int32_t references = 0;
    bool kept = false;
    uint64_t generation = 0;
    std::list<int64_t>::iterator idle;  // valid while kept and unreferenced
  };
  std::vector<BlockState> blocks_;
  int64_t referenced_ = 0;   // blocks with references
  std::list<int64_t> idle_;  // kept blocks no one references, longest idle first
};

// A cache whose entries live in a BlockPool's blocks (cache/paged_kv_cache.h,
// cache/scored_paged_kv_cache.h): what a serving engine's KV memory asks of it to admit,
// reserve and preempt by blocks.
class KVPoolBlocks {
 public:
  virtual ~KVPoolBlocks() = default;
  virtual const BlockPool* pool() const = 0;
  // Blocks the cache holds once it has seen `entries` entries (from empty).
  virtual int64_t BlocksToHold(int64_t entries) const = 0;
  // Blocks the next step of `steps` entries takes from the pool (new ones and copies of shared
  // ones).
  virtual int64_t BlocksNeeded(int64_t steps) const = 0;
  // Takes them (CheckStep does it too): ResourceExhausted when the pool has too few, taking
  // nothing then.
  virtual absl::Status TakeBlocks(int64_t steps) = 0;
  virtual int64_t blocks_held() const = 0;
  // Whether it evicts: then it never holds more than BlocksToHold(max_sequence_length()).
  virtual bool evicts() const = 0;
};

// Gives `table` (a cache's blocks in order) a block of its own at each of `indices`
// (ascending): a new block where the index is the table's end (appended), a copy of the shared
// block elsewhere (copy-on-write: the copy replaces the cache's reference). Takes every block
// first, so ResourceExhausted (a full pool) leaves the table as it was.
absl::Status TakeTableBlocks(BlockPool& pool, std::vector<int64_t>& table,
                             const std::vector<int64_t>& indices);

}  // namespace lgpt

#endif  // LGPT_CACHE_BLOCK_POOL_H_
