// The KV memory a serving engine shares between requests (PagedAttention's block pool): blocks
// of block_size consecutive entries of one request, each holding per layer its keys and values
// [n_query_groups, block_size, head_size]. The pool's storage is allocated once, when it is
// made: per layer keys and values [num_blocks, n_query_groups, block_size, head_size], a block
// a slice of them. On the CPU that is address space only: a page takes memory when a block
// first writes it, and a block that is free again gives its pages back, so memory follows what
// is in use (at most num_blocks · BytesPerBlock()); a device pool holds its memory throughout.
// The budget is shared with caches that keep their own storage (budgeted and quantised
// caches): a serving engine Reserves their bytes as their storage grows and Unreserves them
// when it is freed. Blocks are reference counted (shared prefixes).
//
// Prefix cache (vLLM's automatic prefix caching): a full block whose entries depend only on
// the tokens up to and including it (dense full-precision entries written from position 0)
// may be published under a key made of its parent's key and its own token ids. A later
// request whose tokens start the same way finds the chain block by block and reuses it
// instead of recomputing it. A published block that no request references stays cached
// (least recently released first out): Allocate takes free blocks first, then evicts cached
// ones. Keys are never reused (a counter), so a chain can never lead into a block that was
// recycled for other tokens, and lookups compare the token ids themselves, not a hash.
// Costs: Publish and Lookup O(block_size) (hash and compare of one block's ids); the map
// holds block_size ids per published block.
// Thread-safe.
#ifndef LGPT_CACHE_BLOCK_POOL_H_
#define LGPT_CACHE_BLOCK_POOL_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cache/kv_cache.h"

namespace lgpt {

struct BlockPoolOptions {
  int64_t block_size = 16;  // entries per block
  int64_t num_blocks = 0;   // blocks in the pool (>= 1)

  absl::Status Validate() const;
};

class BlockPool {
 public:
  // Blocks for geometry.layers in geometry.dtype on geometry.device (its batch size and
  // sequence length are not used). Allocates no storage yet. InvalidArgument for a bad
  // geometry or options.
  static absl::StatusOr<std::shared_ptr<BlockPool>> Create(const KVCacheGeometry& geometry,
                                                           const BlockPoolOptions& options);

  // The key of the empty prefix, parent of every first block.
  static constexpr uint64_t kRootKey = 0;

  // A block with one reference and fresh storage (evicting the least recently used cached
  // block when the budget is spent); ResourceExhausted when every block is referenced or
  // reserved. Its entries are unset until written.
  absl::StatusOr<int64_t> Allocate();
  // Sets aside `bytes` of the budget for a cache that keeps its own storage (evicting cached
  // blocks as needed); ResourceExhausted, reserving nothing, when they are not free.
  // Reservations are summed in bytes and take whole blocks only together (no rounding up
  // per cache).
  absl::Status Reserve(int64_t bytes);
  void Unreserve(int64_t bytes);
  // Another reference to an allocated block.
  void Retain(int64_t block);
  // Drops one reference; at zero the block is free again, or cached when published.
  void Release(int64_t block);
  // Whether a write into `block` would change what others see: it is referenced more than
  // once or published (copy it first).
  bool IsShared(int64_t block) const;
  // Copies the entries of block `from` into block `to`, in every layer.
  void CopyBlock(int64_t from, int64_t to);

  // Publishes `block` (referenced, full, its entries those of `tokens`, block_size ids, after
  // the prefix of key `parent`) and returns the key its successors chain from. When a block
  // with the same parent and ids is already published, that block's key is returned and
  // `block` stays private.
  uint64_t Publish(int64_t block, uint64_t parent, absl::Span<const int64_t> tokens);
  struct Hit {
    int64_t block;
    uint64_t key;
  };
  // The block published after `parent` with these block_size ids, with one more reference
  // taken for the caller; nullopt when none is cached.
  std::optional<Hit> Lookup(uint64_t parent, absl::Span<const int64_t> tokens);

  // Blocks Allocate or Reserve can still take: the budget less referenced and reserved
  // blocks (cached ones count as free).
  int64_t free_blocks() const;
  // Published blocks no request references (counted in free_blocks).
  int64_t cached_blocks() const;
  // Blocks holding entries now (referenced and cached).
  int64_t stored_blocks() const;
  // Blocks the reservations cover: their bytes rounded up to whole blocks.
  int64_t reserved_blocks() const;
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  // Key and value bytes of one block over all layers.
  int64_t BytesPerBlock() const { return bytes_per_block_; }
  // The same for a geometry not yet made into a pool (sizing a pool by bytes).
  static int64_t BytesPerBlock(const KVCacheGeometry& geometry, int64_t block_size);
  // Blocks that hold `entries` entries, and blocks that cover `bytes` bytes (rounded up).
  int64_t BlocksFor(int64_t entries) const { return (entries + block_size_ - 1) / block_size_; }
  int64_t BlocksForBytes(int64_t bytes) const {
    return (bytes + bytes_per_block_ - 1) / bytes_per_block_;
  }
  const std::vector<KVLayerSpec>& layers() const { return layers_; }
  c10::Device device() const { return tensor_options_.device(); }
  c10::ScalarType dtype() const { return c10::typeMetaToScalarType(tensor_options_.dtype()); }
  // [n_query_groups, block_size, head_size]: the keys or values of `layer` in a taken block.
  const at::Tensor& keys(int64_t block, int64_t layer) const { return storage_[block][2 * layer]; }
  const at::Tensor& values(int64_t block, int64_t layer) const {
    return storage_[block][2 * layer + 1];
  }

 private:
  BlockPool(std::vector<KVLayerSpec> layers, int64_t block_size, int64_t num_blocks,
            at::TensorOptions tensor_options);
  // Takes a free block id with fresh storage, or evicts a cached block (mutex_ held); -1 when
  // the budget is spent and nothing is cached.
  int64_t TakeBlock();
  // Frees the least recently released cached block (mutex_ held).
  void EvictOldestCached();

  const std::vector<KVLayerSpec> layers_;
  const int64_t block_size_;
  const int64_t num_blocks_;
  const at::TensorOptions tensor_options_;
  int64_t bytes_per_block_ = 0;
  // Gives a block's pages back (CPU) and drops its views (mutex_ held).
  void FreeStorage(int64_t block);

  // Per layer: keys and values [num_blocks, n_query_groups, block_size, head_size].
  std::vector<at::Tensor> arena_;
  // Per taken block, per layer: keys and values, views of arena_ (empty while the block is free).
  std::vector<std::vector<at::Tensor>> storage_;
  struct PrefixId {
    uint64_t parent;
    std::vector<int64_t> tokens;
    bool operator==(const PrefixId& other) const {
      return parent == other.parent && tokens == other.tokens;
    }
  };
  struct PrefixIdHash {
    size_t operator()(const PrefixId& id) const;
  };
  struct Published {
    uint64_t key = 0;  // 0: not published
    std::unordered_map<PrefixId, int64_t, PrefixIdHash>::iterator entry;
    std::list<int64_t>::iterator lru;  // valid while cached (unreferenced)
  };
  // Forgets the prefix entry of a cached block (mutex_ held).
  void Unpublish(int64_t block);

  mutable std::mutex mutex_;
  std::vector<int64_t> free_;        // free block ids (a stack)
  std::vector<int32_t> references_;  // per block
  int64_t referenced_ = 0;           // blocks with references
  int64_t reserved_bytes_ = 0;
  int64_t reserved_ = 0;              // reserved_bytes_ in blocks, rounded up
  std::vector<Published> published_;  // per block
  std::unordered_map<PrefixId, int64_t, PrefixIdHash> prefixes_;  // -> block
  std::list<int64_t> cached_;  // unreferenced published blocks, least recently released first
  uint64_t next_key_ = 1;
};

}  // namespace lgpt

#endif  // LGPT_CACHE_BLOCK_POOL_H_
