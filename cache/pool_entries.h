// Reading and writing runs of KV entries in the blocks of a BlockPool (cache/block_pool.h), in
// the pool's entry format: the model's dtype, 16-bit entries of a float32 model, or int8 / int4
// codes with their scales (core/ops/paged_attention_layout.h). The paged caches
// (cache/paged_kv_cache.h, cache/scored_paged_kv_cache.h) write and read their blocks through
// these, so every cache over a pool stores an entry the same way.
#ifndef LGPT_CACHE_POOL_ENTRIES_H_
#define LGPT_CACHE_POOL_ENTRIES_H_

#include <ATen/ATen.h>

#include <cstdint>

#include "absl/types/span.h"
#include "core/ops/paged_attention_layout.h"

namespace lgpt {

// One float32 entry of head_size values into a pool row in host memory, in the pool's format:
// encoded with `quantised` (the layer's format: codes then float16 scales), else rounded to
// `stored` (bfloat16 / float16, to nearest even as ATen's conversion) or copied (float32).
void StoreFloatRow(const float* src, int64_t head_size, c10::ScalarType stored,
                   const paged::EntryFormat* quantised, void* dst);

// Entries [from, from + n) of src [1, G, T, hs] or [G, T, hs] into slots [slot, slot + n) of
// a pool block [G, bs, hs] (or, src and block alike, rows of entry_bytes quantised bytes). Rows
// are copied directly on the CPU; float32 rows into a 16-bit pool are rounded as ATen's
// conversion rounds (to nearest even).
void CopyEntries(const at::Tensor& src, int64_t from, int64_t n, const at::Tensor& block,
                 int64_t slot);

// Entries [from, from + n) of src [1, G, T, hs] encoded into slots [slot, slot + n) of a
// quantised pool block [G, bs, entry_bytes]: on the CPU an entry at a time, elsewhere with
// tensor operations (the same codes).
void QuantiseEntries(const at::Tensor& src, int64_t from, int64_t n, const at::Tensor& block,
                     int64_t slot, const paged::EntryFormat& format);

// The first n entries of a quantised pool block [G, bs, entry_bytes], decoded: [G, n, hs].
at::Tensor DecodeEntries(const at::Tensor& block, int64_t n, const paged::EntryFormat& format,
                         c10::ScalarType dtype);

// The entries of quantised blocks [G, bs, entry_bytes] holding `entries` entries (the last
// block partly filled), decoded: [G, entries, hs].
at::Tensor DecodeBlocks(absl::Span<const at::Tensor> blocks, int64_t entries,
                        const paged::EntryFormat& format, c10::ScalarType dtype);

// Entries [from, from + n) of src into slots [slot, slot + n) of a pool block as the pool
// stores them: quantised with `quantised` (the layer's format; src float32 rows on the CPU),
// else copied (rounded to 16 bits where the block is).
void StoreEntries(const at::Tensor& src, int64_t from, int64_t n, const at::Tensor& block,
                  int64_t slot, const paged::EntryFormat* quantised);

// The first `entries` entries of blocks [G, bs, width] in order, widened or decoded (with
// `quantised`, the layer's format): [G, entries, hs] in `dtype`.
at::Tensor ReadEntries(absl::Span<const at::Tensor> blocks, int64_t entries,
                       const paged::EntryFormat* quantised, c10::ScalarType dtype);

}  // namespace lgpt

#endif  // LGPT_CACHE_POOL_ENTRIES_H_
