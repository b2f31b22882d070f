// The KV memory a serving engine shares between requests (PagedAttention's block pool): per
// layer, key and value blocks [num_blocks, n_query_groups, block_size, head_size] allocated
// once; a block holds block_size consecutive entries of one request in every layer. Requests
// take blocks as they grow and give them back when they end, so memory follows what is in
// use, not what each request might need. Blocks are reference counted (for shared prefixes).
// Thread-safe.
#ifndef LGPT_CACHE_BLOCK_POOL_H_
#define LGPT_CACHE_BLOCK_POOL_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/kv_cache.h"

namespace lgpt {

struct BlockPoolOptions {
  int64_t block_size = 16;  // entries per block
  int64_t num_blocks = 0;   // blocks in the pool (>= 1)

  absl::Status Validate() const;
};

class BlockPool {
 public:
  // Storage for geometry.layers in geometry.dtype on geometry.device (its batch size and
  // sequence length are not used). InvalidArgument for a bad geometry or options.
  static absl::StatusOr<std::shared_ptr<BlockPool>> Create(const KVCacheGeometry& geometry,
                                                           const BlockPoolOptions& options);

  // A free block with one reference; ResourceExhausted when none is free.
  absl::StatusOr<int64_t> Allocate();
  // Another reference to an allocated block.
  void Retain(int64_t block);
  // Drops one reference; the block is free again at zero.
  void Release(int64_t block);

  int64_t free_blocks() const;
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  // Key and value bytes of one block over all layers.
  int64_t BytesPerBlock() const { return bytes_per_block_; }
  const std::vector<KVLayerSpec>& layers() const { return layers_; }
  // [num_blocks, n_query_groups, block_size, head_size] of `layer`.
  const at::Tensor& keys(int64_t layer) const { return keys_[layer]; }
  const at::Tensor& values(int64_t layer) const { return values_[layer]; }

 private:
  BlockPool(std::vector<KVLayerSpec> layers, int64_t block_size, int64_t num_blocks);

  const std::vector<KVLayerSpec> layers_;
  const int64_t block_size_;
  const int64_t num_blocks_;
  int64_t bytes_per_block_ = 0;
  std::vector<at::Tensor> keys_, values_;
  mutable std::mutex mutex_;
  std::vector<int64_t> free_;        // free block ids (a stack)
  std::vector<int32_t> references_;  // per block
};

}  // namespace lgpt

#endif  // LGPT_CACHE_BLOCK_POOL_H_
