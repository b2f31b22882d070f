#include "cache/prefix_cache.h"

#include <utility>

#include "glog/logging.h"

namespace lgpt {

PrefixCache::PrefixCache(std::shared_ptr<BlockPool> pool) : pool_(std::move(pool)) {
  // At most one entry per block: with their buckets reserved the map never rehashes, so the
  // iterators entry_of_block_ holds stay valid.
  prefixes_.reserve(pool_->num_blocks());
  entry_of_block_.assign(pool_->num_blocks(), prefixes_.end());
}

size_t PrefixCache::PrefixIdHash::operator()(const PrefixId& id) const {
  // FNV-1a over the parent key and the ids; equality still compares the ids.
  uint64_t hash = 1469598103934665603ull;
  auto mix = [&hash](uint64_t value) {
    for (int byte = 0; byte < 8; ++byte) {
      hash ^= (value >> (8 * byte)) & 0xff;
      hash *= 1099511628211ull;
    }
  };
  mix(id.parent);
  for (int64_t token : id.tokens) mix(static_cast<uint64_t>(token));
  return static_cast<size_t>(hash);
}

bool PrefixCache::Live(const Map::iterator& entry) const {
  return pool_->IsKept(entry->second.block, entry->second.generation);
}

void PrefixCache::Forget(int64_t block) {
  Map::iterator& entry = entry_of_block_[block];
  if (entry == prefixes_.end()) return;
  prefixes_.erase(entry);
  entry = prefixes_.end();
}

uint64_t PrefixCache::Publish(int64_t block, uint64_t parent, absl::Span<const int64_t> tokens) {
  CHECK_EQ(static_cast<int64_t>(tokens.size()), pool_->entries_per_block());
  CHECK(block >= 0 && block < pool_->num_blocks()) << "block " << block;
  std::lock_guard<std::mutex> lock(mutex_);
  const Map::iterator mine = entry_of_block_[block];
  if (mine != prefixes_.end()) {
    if (Live(mine)) return mine->second.key;  // published already
    Forget(block);                            // a recycled block's old entry
  }
  PrefixId id{parent, std::vector<int64_t>(tokens.begin(), tokens.end())};
  auto [entry, inserted] = prefixes_.emplace(std::move(id), Published());
  if (!inserted) {
    if (Live(entry)) return entry->second.key;  // the same entries in another block
    // Recycled: this block takes the entry over.
    if (entry_of_block_[entry->second.block] == entry) {
      entry_of_block_[entry->second.block] = prefixes_.end();
    }
  }
  entry->second = Published{block, pool_->Keep(block), next_key_++};
  entry_of_block_[block] = entry;
  return entry->second.key;
}

std::optional<PrefixCache::Hit> PrefixCache::Lookup(uint64_t parent,
                                                    absl::Span<const int64_t> tokens) {
  if (static_cast<int64_t>(tokens.size()) != pool_->entries_per_block()) return std::nullopt;
  std::lock_guard<std::mutex> lock(mutex_);
  auto entry = prefixes_.find(PrefixId{parent, std::vector<int64_t>(tokens.begin(), tokens.end())});
  if (entry == prefixes_.end()) return std::nullopt;
  const Published published = entry->second;
  if (!pool_->RetainKept(published.block, published.generation)) {
    Forget(published.block);  // recycled since it was published
    return std::nullopt;
  }
  return Hit{published.block, published.key};
}

}  // namespace lgpt
