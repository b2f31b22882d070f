// Where a KV entry lives in a paged pool, shared by the CPU twin and the CUDA kernel
// (__host__ __device__): a layer's pool storage is [num_blocks, n_query_groups, entries_per_block,
// head_size] and a request's position p lives at the flat slot table[p / entries_per_block] *
// entries_per_block + p % entries_per_block (vLLM's slot mapping), so one slot id names block and
// offset. No LibTorch, no CUDA headers: plain integer math that CPU tests exercise directly.
#ifndef LGPT_CORE_OPS_KV_SLOT_LAYOUT_H_
#define LGPT_CORE_OPS_KV_SLOT_LAYOUT_H_

#include <cstdint>

#if defined(__CUDACC__)
#define LGPT_HOST_DEVICE __host__ __device__
#else
#define LGPT_HOST_DEVICE
#endif

namespace lgpt {
namespace kv_slot {

// Pool geometry of one layer: [num_blocks, groups, entries_per_block, head_size], contiguous.
struct PoolShape {
  int64_t num_blocks;
  int64_t groups;
  int64_t entries_per_block;
  int64_t head_size;
};

// Entries to write: [groups, tokens, head_size] with these element strides (head_size
// contiguous).
struct SourceShape {
  int64_t groups;
  int64_t tokens;
  int64_t head_size;
  int64_t group_stride;
  int64_t token_stride;
};

// The flat slot of position `position` through a block table (table[i]: the pool block of
// positions [i * entries_per_block, (i + 1) * entries_per_block)).
LGPT_HOST_DEVICE inline int64_t SlotOfPosition(const int64_t* table, int64_t entries_per_block,
                                               int64_t position) {
  return table[position / entries_per_block] * entries_per_block + position % entries_per_block;
}

// Element offset in the pool of (slot, group, dim).
LGPT_HOST_DEVICE inline int64_t PoolOffset(const PoolShape& pool, int64_t slot, int64_t group,
                                           int64_t dim) {
  const int64_t block = slot / pool.entries_per_block, in_block = slot % pool.entries_per_block;
  return ((block * pool.groups + group) * pool.entries_per_block + in_block) * pool.head_size + dim;
}

// Element offset in the source of (group, token, dim).
LGPT_HOST_DEVICE inline int64_t SourceOffset(const SourceShape& source, int64_t group,
                                             int64_t token, int64_t dim) {
  return group * source.group_stride + token * source.token_stride + dim;
}

// Whether a slot lies inside the pool (negative slots are padding: skipped).
LGPT_HOST_DEVICE inline bool SlotInPool(const PoolShape& pool, int64_t slot) {
  return slot >= 0 && slot < pool.num_blocks * pool.entries_per_block;
}

}  // namespace kv_slot
}  // namespace lgpt

#endif  // LGPT_CORE_OPS_KV_SLOT_LAYOUT_H_
