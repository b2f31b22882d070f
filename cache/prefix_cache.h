// Automatic prefix caching (vLLM's): a full pool block whose entries depend only on the tokens
// up to and including it (dense full-precision entries written from position 0) is published
// under a key made of its parent's key and its own token ids. A later request whose tokens
// start the same way finds the chain block by block and reuses it instead of recomputing it.
//
// Published blocks are kept by the pool (cache/block_pool.h): when no request references one,
// it stays stored and the pool recycles the longest idle first when it needs the room. This
// map remembers each block by (block, generation), so an entry whose block was recycled is
// recognised and dropped when next met. Keys are never reused (a counter), so a chain can never
// lead into a block that was recycled for other tokens, and lookups compare the token ids
// themselves, not a hash. Costs: Publish and Lookup O(entries_per_block) (hash and compare of
// one block's ids); the map holds at most one entry per pool block, entries_per_block ids each.
// Thread-safe (its lock is taken before the pool's, never after).
#ifndef LGPT_CACHE_PREFIX_CACHE_H_
#define LGPT_CACHE_PREFIX_CACHE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "absl/types/span.h"
#include "cache/block_pool.h"

namespace lgpt {

class PrefixCache {
 public:
  explicit PrefixCache(std::shared_ptr<BlockPool> pool);

  // The key of the empty prefix, parent of every first block.
  static constexpr uint64_t kRootKey = 0;

  // Publishes `block` (referenced, full, its entries those of `tokens`, entries_per_block ids,
  // after the prefix of key `parent`) and returns the key its successors chain from. When a
  // block with the same parent and ids is already published, that block's key is returned and
  // `block` stays private.
  uint64_t Publish(int64_t block, uint64_t parent, absl::Span<const int64_t> tokens);
  struct Hit {
    int64_t block;
    uint64_t key;
  };
  // The block published after `parent` with these entries_per_block ids, with one more
  // reference taken for the caller; nullopt when none is stored.
  std::optional<Hit> Lookup(uint64_t parent, absl::Span<const int64_t> tokens);

  const std::shared_ptr<BlockPool>& pool() const { return pool_; }

 private:
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
    int64_t block = -1;
    uint64_t generation = 0;  // the block's generation when it was kept
    uint64_t key = 0;
  };
  using Map = std::unordered_map<PrefixId, Published, PrefixIdHash>;
  // Whether `entry` still names the entries it was published for.
  bool Live(const Map::iterator& entry) const;
  // Forgets the entry that names `block`, if any (mutex_ held).
  void Forget(int64_t block);

  const std::shared_ptr<BlockPool> pool_;
  std::mutex mutex_;
  Map prefixes_;
  // Per pool block: its entry in prefixes_, or end() (at most one entry names a block).
  std::vector<Map::iterator> entry_of_block_;
  uint64_t next_key_ = 1;
};

}  // namespace lgpt

#endif  // LGPT_CACHE_PREFIX_CACHE_H_
