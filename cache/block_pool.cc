#include "cache/block_pool.h"

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

BlockPool::BlockPool(std::vector<KVLayerSpec> layers, int64_t block_size, int64_t num_blocks)
    : layers_(std::move(layers)), block_size_(block_size), num_blocks_(num_blocks) {}

absl::StatusOr<std::shared_ptr<BlockPool>> BlockPool::Create(const KVCacheGeometry& geometry,
                                                             const BlockPoolOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  KVCacheGeometry checked = geometry;
  checked.batch_size = std::max<int64_t>(checked.batch_size, 1);
  checked.max_sequence_length = std::max<int64_t>(checked.max_sequence_length, 1);
  RETURN_IF_ERROR(CheckCacheGeometry("BlockPool", checked));
  std::shared_ptr<BlockPool> pool(
      new BlockPool(geometry.layers, options.block_size, options.num_blocks));
  const at::TensorOptions tensor_options =
      at::TensorOptions().dtype(geometry.dtype).device(geometry.device);
  for (const KVLayerSpec& layer : geometry.layers) {
    const std::vector<int64_t> shape = {options.num_blocks, layer.n_query_groups,
                                        options.block_size, layer.head_size};
    pool->keys_.push_back(at::zeros(shape, tensor_options));
    pool->values_.push_back(at::zeros(shape, tensor_options));
    pool->bytes_per_block_ += 2 * layer.n_query_groups * options.block_size * layer.head_size *
                              static_cast<int64_t>(c10::elementSize(geometry.dtype));
  }
  pool->references_.assign(options.num_blocks, 0);
  for (int64_t block = options.num_blocks - 1; block >= 0; --block) {
    pool->free_.push_back(block);
  }
  return pool;
}

absl::StatusOr<int64_t> BlockPool::Allocate() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the KV block pool is full (", num_blocks_, " blocks of ", block_size_,
                     " entries)"));
  }
  const int64_t block = free_.back();
  free_.pop_back();
  references_[block] = 1;
  return block;
}

void BlockPool::Retain(int64_t block) {
  std::lock_guard<std::mutex> lock(mutex_);
  CHECK(block >= 0 && block < num_blocks_ && references_[block] > 0) << "block " << block;
  ++references_[block];
}

void BlockPool::Release(int64_t block) {
  std::lock_guard<std::mutex> lock(mutex_);
  CHECK(block >= 0 && block < num_blocks_ && references_[block] > 0) << "block " << block;
  if (--references_[block] == 0) free_.push_back(block);
}

int64_t BlockPool::free_blocks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(free_.size());
}

}  // namespace lgpt
