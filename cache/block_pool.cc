#include "cache/block_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "glog/logging.h"

namespace lgpt {

absl::Status BlockPoolOptions::Validate() const {
  if (entries_per_block < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("BlockPoolOptions.entries_per_block must be >= 1, got ", entries_per_block));
  }
  if (num_blocks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("BlockPoolOptions.num_blocks must be >= 1, got ", num_blocks));
  }
  if (entry_bits != 16 && entry_bits != 8 && entry_bits != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("BlockPoolOptions.entry_bits must be 16, 8 or 4, got ", entry_bits));
  }
  if (group_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("BlockPoolOptions.group_size must be >= 1, got ", group_size));
  }
  return absl::OkStatus();
}

namespace {

// The quantised entry layout of a layer (entry_bits 8 or 4).
paged::EntryFormat QuantisedFormat(const KVLayerSpec& layer, int entry_bits, int64_t group_size) {
  paged::EntryFormat format;
  format.kind = entry_bits == 8 ? paged::EntryKind::kInt8 : paged::EntryKind::kInt4;
  format.head_size = static_cast<int32_t>(layer.head_size);
  format.group_size = static_cast<int32_t>(std::gcd(group_size, layer.head_size));
  return format;
}

// Bytes of one entry (keys or values) of `layer`.
int64_t EntryBytesOf(const KVLayerSpec& layer, c10::ScalarType dtype, int entry_bits,
                     int64_t group_size) {
  if (entry_bits == 16) return layer.head_size * static_cast<int64_t>(c10::elementSize(dtype));
  return paged::EntryBytes(QuantisedFormat(layer, entry_bits, group_size));
}

}  // namespace

BlockPool::BlockPool(std::vector<KVLayerSpec> layers, int64_t entries_per_block, int64_t num_blocks,
                     at::TensorOptions tensor_options, int entry_bits,
                     std::vector<paged::EntryFormat> formats)
    : layers_(std::move(layers)),
      entries_per_block_(entries_per_block),
      num_blocks_(num_blocks),
      tensor_options_(tensor_options),
      entry_bits_(entry_bits),
      formats_(std::move(formats)) {}

int64_t BlockPool::BytesPerBlock(const KVCacheGeometry& geometry, int64_t entries_per_block,
                                 int entry_bits, int64_t group_size) {
  int64_t bytes = 0;
  for (const KVLayerSpec& layer : geometry.layers) {
    bytes += 2 * layer.n_query_groups * entries_per_block *
             EntryBytesOf(layer, geometry.dtype, entry_bits, group_size);
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
  std::vector<paged::EntryFormat> formats;
  if (options.entry_bits != 16) {
    for (const KVLayerSpec& layer : geometry.layers) {
      formats.push_back(QuantisedFormat(layer, options.entry_bits, options.group_size));
      if (options.entry_bits == 4 && formats.back().group_size % 2 != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "BlockPoolOptions.entry_bits 4 needs an even group of channels; head_size ",
            layer.head_size, " and group_size ", options.group_size, " share ",
            formats.back().group_size));
      }
    }
  }
  const at::TensorOptions tensor_options =
      at::TensorOptions()
          .dtype(options.entry_bits == 16 ? geometry.dtype : c10::kByte)
          .device(geometry.device);
  std::shared_ptr<BlockPool> pool(new BlockPool(geometry.layers, options.entries_per_block,
                                                options.num_blocks, tensor_options,
                                                options.entry_bits, std::move(formats)));
  pool->bytes_per_block_ =
      BytesPerBlock(geometry, options.entries_per_block, options.entry_bits, options.group_size);
  try {  // ~60 bytes of bookkeeping a block, allocated now
    pool->storage_.resize(options.num_blocks);
    pool->blocks_.resize(options.num_blocks);
    pool->free_.reserve(options.num_blocks);
  } catch (const std::exception&) {  // bad_alloc, or length_error past a vector's max_size
    return absl::ResourceExhaustedError(
        absl::StrCat("BlockPoolOptions.num_blocks (", options.num_blocks,
                     ") is too many: their bookkeeping alone does not fit in memory"));
  }
  try {
    for (size_t i = 0; i < geometry.layers.size(); ++i) {
      const KVLayerSpec& layer = geometry.layers[i];
      const int64_t last =
          options.entry_bits == 16 ? layer.head_size : paged::EntryBytes(pool->formats_[i]);
      for (int kv = 0; kv < 2; ++kv) {
        pool->arena_.push_back(
            at::empty({options.num_blocks, layer.n_query_groups, options.entries_per_block, last},
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
  if (free_.empty()) {
    if (idle_.empty()) return -1;
    const int64_t recycled = idle_.front();
    idle_.pop_front();
    FreeStorage(recycled);
    free_.push_back(recycled);
  }
  const int64_t block = free_.back();
  free_.pop_back();
  std::vector<at::Tensor>& storage = storage_[block];
  for (const at::Tensor& layer : arena_) storage.push_back(layer.select(0, block));
  return block;
}

void BlockPool::FreeStorage(int64_t block) {
  storage_[block].clear();
  BlockState& state = blocks_[block];
  state.kept = false;
  ++state.generation;
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

absl::StatusOr<int64_t> BlockPool::Allocate() {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t block = TakeBlock();
  if (block < 0) {
    return absl::ResourceExhaustedError(absl::StrCat("the KV block pool is full (", num_blocks_,
                                                     " blocks of ", entries_per_block_,
                                                     " entries, all in use)"));
  }
  blocks_[block].references = 1;
  ++referenced_;
  return block;
}

void BlockPool::CheckReferenced(int64_t block) const {
  CHECK(block >= 0 && block < num_blocks_ && blocks_[block].references > 0) << "block " << block;
}

void BlockPool::Retain(int64_t block) {
  std::lock_guard<std::mutex> lock(mutex_);
  CheckReferenced(block);
  ++blocks_[block].references;
}

void BlockPool::Release(int64_t block) {
  std::lock_guard<std::mutex> lock(mutex_);
  CheckReferenced(block);
  BlockState& state = blocks_[block];
  if (--state.references > 0) return;
  --referenced_;
  if (state.kept) {
    state.idle = idle_.insert(idle_.end(), block);
  } else {
    FreeStorage(block);
    free_.push_back(block);
  }
}

bool BlockPool::IsShared(int64_t block) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return blocks_[block].references > 1 || blocks_[block].kept;
}

void BlockPool::CopyBlock(int64_t from, int64_t to) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < storage_[from].size(); ++i) storage_[to][i].copy_(storage_[from][i]);
}

uint64_t BlockPool::Keep(int64_t block) {
  std::lock_guard<std::mutex> lock(mutex_);
  CheckReferenced(block);
  blocks_[block].kept = true;
  return blocks_[block].generation;
}

bool BlockPool::RetainKept(int64_t block, uint64_t generation) {
  std::lock_guard<std::mutex> lock(mutex_);
  BlockState& state = blocks_[block];
  if (!state.kept || state.generation != generation) return false;
  if (state.references++ == 0) {
    idle_.erase(state.idle);
    ++referenced_;
  }
  return true;
}

bool BlockPool::IsKept(int64_t block, uint64_t generation) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return blocks_[block].kept && blocks_[block].generation == generation;
}

int64_t BlockPool::free_blocks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return num_blocks_ - referenced_;
}

int64_t BlockPool::idle_blocks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(idle_.size());
}

int64_t BlockPool::stored_blocks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return referenced_ + static_cast<int64_t>(idle_.size());
}

absl::Status TakeTableBlocks(BlockPool& pool, std::vector<int64_t>& table,
                             const std::vector<int64_t>& indices) {
  std::vector<int64_t> taken;
  for (size_t k = 0; k < indices.size(); ++k) {
    absl::StatusOr<int64_t> block = pool.Allocate();
    if (!block.ok()) {
      for (int64_t b : taken) pool.Release(b);
      return block.status();
    }
    taken.push_back(*block);
  }
  for (size_t k = 0; k < indices.size(); ++k) {
    const int64_t i = indices[k];
    if (i == static_cast<int64_t>(table.size())) {
      table.push_back(taken[k]);
    } else {
      pool.CopyBlock(table[i], taken[k]);
      pool.Release(table[i]);
      table[i] = taken[k];
    }
  }
  return absl::OkStatus();
}

}  // namespace lgpt
