#include "cache/block_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "glog/logging.h"

namespace lgpt {

absl::Status BlockPoolOptions::Validate() const {
  if (block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("BlockPoolOptions.block_size must be >= 1, got ", block_size));
  }
  if (num_blocks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("BlockPoolOptions.num_blocks must be >= 1, got ", num_blocks));
  }
  return absl::OkStatus();
}

BlockPool::BlockPool(std::vector<KVLayerSpec> layers, int64_t block_size, int64_t num_blocks,
                     at::TensorOptions tensor_options)
    : layers_(std::move(layers)),
      block_size_(block_size),
      num_blocks_(num_blocks),
      tensor_options_(tensor_options) {}

int64_t BlockPool::BytesPerBlock(const KVCacheGeometry& geometry, int64_t block_size) {
  int64_t bytes = 0;
  for (const KVLayerSpec& layer : geometry.layers) {
    bytes += 2 * layer.n_query_groups * block_size * layer.head_size *
             static_cast<int64_t>(c10::elementSize(geometry.dtype));
  }
  return bytes;
}

absl::StatusOr<std::shared_ptr<BlockPool>> BlockPool::Create(const KVCacheGeometry& geometry,
                                                             const BlockPoolOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  KVCacheGeometry checked = geometry;
  checked.batch_size = std::max<int64_t>(checked.batch_size, 1);
  checked.max_sequence_length = std::max<int64_t>(checked.max_sequence_length, 1);
  RETURN_IF_ERROR(CheckCacheGeometry("BlockPool", checked));
  const at::TensorOptions tensor_options =
      at::TensorOptions().dtype(geometry.dtype).device(geometry.device);
  std::shared_ptr<BlockPool> pool(
      new BlockPool(geometry.layers, options.block_size, options.num_blocks, tensor_options));
  pool->bytes_per_block_ = BytesPerBlock(geometry, options.block_size);
  try {  // ~60 bytes of bookkeeping a block, allocated now
    pool->storage_.resize(options.num_blocks);
    pool->references_.assign(options.num_blocks, 0);
    pool->published_.resize(options.num_blocks);
    pool->free_.reserve(options.num_blocks);
  } catch (const std::exception&) {  // bad_alloc, or length_error past a vector's max_size
    return absl::ResourceExhaustedError(
        absl::StrCat("BlockPoolOptions.num_blocks (", options.num_blocks,
                     ") is too many: their bookkeeping alone does not fit in memory"));
  }
  try {
    for (const KVLayerSpec& layer : geometry.layers) {
      for (int kv = 0; kv < 2; ++kv) {
        pool->arena_.push_back(at::empty(
            {options.num_blocks, layer.n_query_groups, options.block_size, layer.head_size},
            tensor_options));
      }
    }
  } catch (const std::exception& e) {  // c10::Error: the allocator could not reserve it
    return absl::ResourceExhaustedError(
        absl::StrCat("BlockPoolOptions.num_blocks (", options.num_blocks, ") blocks of ",
                     pool->bytes_per_block_, " bytes cannot be allocated: ", e.what()));
  }
  for (int64_t block = options.num_blocks - 1; block >= 0; --block) {
    pool->free_.push_back(block);
  }
  return pool;
}

int64_t BlockPool::TakeBlock() {
  if (referenced_ + reserved_ + static_cast<int64_t>(cached_.size()) >= num_blocks_) {
    if (cached_.empty()) return -1;
    EvictOldestCached();
  }
  const int64_t block = free_.back();
  free_.pop_back();
  std::vector<at::Tensor>& storage = storage_[block];
  for (const at::Tensor& layer : arena_) storage.push_back(layer.select(0, block));
  return block;
}

void BlockPool::FreeStorage(int64_t block) {
  storage_[block].clear();
  if (!device().is_cpu()) return;
  // The whole pages inside the block's slice of each layer go back to the system; they read
  // as zeros when touched again (a block's entries are unset until written anyway).
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  for (const at::Tensor& layer : arena_) {
    const int64_t bytes = layer.nbytes() / num_blocks_;
    const uintptr_t begin = reinterpret_cast<uintptr_t>(layer.data_ptr()) + block * bytes;
    const uintptr_t first = (begin + page - 1) / page * page;
    const uintptr_t last = (begin + bytes) / page * page;
    if (first < last) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
  }
}

void BlockPool::EvictOldestCached() {
  const int64_t block = cached_.front();
  Unpublish(block);
  FreeStorage(block);
  free_.push_back(block);
}

absl::StatusOr<int64_t> BlockPool::Allocate() {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t block = TakeBlock();
  if (block < 0) {
    return absl::ResourceExhaustedError(absl::StrCat("the KV block pool is full (", num_blocks_,
                                                     " blocks of ", block_size_, " entries, ",
                                                     reserved_, " of them reserved)"));
  }
  references_[block] = 1;
  ++referenced_;
  return block;
}

absl::Status BlockPool::Reserve(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t reserved = BlocksForBytes(reserved_bytes_ + bytes);
  if (bytes < 0 || referenced_ + reserved > num_blocks_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the KV block pool cannot set aside ", bytes, " bytes: ", num_blocks_, " blocks of ",
        bytes_per_block_, " bytes, ", referenced_, " in use, ", reserved_, " reserved"));
  }
  while (referenced_ + reserved + static_cast<int64_t>(cached_.size()) > num_blocks_) {
    EvictOldestCached();
  }
  reserved_bytes_ += bytes;
  reserved_ = reserved;
  return absl::OkStatus();
}

void BlockPool::Unreserve(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  CHECK(bytes >= 0 && bytes <= reserved_bytes_) << bytes << " of " << reserved_bytes_;
  reserved_bytes_ -= bytes;
  reserved_ = BlocksForBytes(reserved_bytes_);
}

void BlockPool::Unpublish(int64_t block) {
  Published& published = published_[block];
  if (published.key == 0) return;
  if (references_[block] == 0) cached_.erase(published.lru);
  prefixes_.erase(published.entry);
  published = Published();
}

void BlockPool::Retain(int64_t block) {
  std::lock_guard<std::mutex> lock(mutex_);
  CHECK(block >= 0 && block < num_blocks_ && references_[block] > 0) << "block " << block;
  ++references_[block];
}

void BlockPool::Release(int64_t block) {
  std::lock_guard<std::mutex> lock(mutex_);
  CHECK(block >= 0 && block < num_blocks_ && references_[block] > 0) << "block " << block;
  if (--references_[block] > 0) return;
  --referenced_;
  Published& published = published_[block];
  if (published.key != 0) {
    published.lru = cached_.insert(cached_.end(), block);
  } else {
    FreeStorage(block);
    free_.push_back(block);
  }
}

bool BlockPool::IsShared(int64_t block) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return references_[block] > 1 || published_[block].key != 0;
}

void BlockPool::CopyBlock(int64_t from, int64_t to) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < storage_[from].size(); ++i) storage_[to][i].copy_(storage_[from][i]);
}

size_t BlockPool::PrefixIdHash::operator()(const PrefixId& id) const {
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

uint64_t BlockPool::Publish(int64_t block, uint64_t parent, absl::Span<const int64_t> tokens) {
  CHECK_EQ(static_cast<int64_t>(tokens.size()), block_size_);
  std::lock_guard<std::mutex> lock(mutex_);
  CHECK(block >= 0 && block < num_blocks_ && references_[block] > 0) << "block " << block;
  if (published_[block].key != 0) return published_[block].key;
  PrefixId id{parent, std::vector<int64_t>(tokens.begin(), tokens.end())};
  auto [entry, inserted] = prefixes_.emplace(std::move(id), block);
  if (!inserted) return published_[entry->second].key;
  published_[block].key = next_key_++;
  published_[block].entry = entry;
  return published_[block].key;
}

std::optional<BlockPool::Hit> BlockPool::Lookup(uint64_t parent, absl::Span<const int64_t> tokens) {
  if (static_cast<int64_t>(tokens.size()) != block_size_) return std::nullopt;
  std::lock_guard<std::mutex> lock(mutex_);
  auto entry = prefixes_.find(PrefixId{parent, std::vector<int64_t>(tokens.begin(), tokens.end())});
  if (entry == prefixes_.end()) return std::nullopt;
  const int64_t block = entry->second;
  if (references_[block]++ == 0) {
    cached_.erase(published_[block].lru);
    ++referenced_;
  }
  return Hit{block, published_[block].key};
}

int64_t BlockPool::free_blocks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return num_blocks_ - referenced_ - reserved_;
}

int64_t BlockPool::stored_blocks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return referenced_ + static_cast<int64_t>(cached_.size());
}

int64_t BlockPool::reserved_blocks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reserved_;
}

int64_t BlockPool::cached_blocks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(cached_.size());
}

}  // namespace lgpt
