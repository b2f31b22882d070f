// Attention for decoding steps on the CPU: a few float32 queries against the filled cache,
// without building the [B, ·, T, S] mask and score tensors that AttendByPositions' generic
// path allocates (at one token a step, those small LibTorch operations cost more than the
// arithmetic). Same semantics as AttendByPositions, float32 softmax included.
#ifndef LGPT_CORE_OPS_DECODE_ATTENTION_H_
#define LGPT_CORE_OPS_DECODE_ATTENTION_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "core/ops/attention_mask.h"
#include "core/ops/gemv.h"

namespace lgpt {

// Whether t is [B, G, S, hs] with each entry's hs floats contiguous: what the CPU attention
// kernels read by pointer.
bool KVRowsContiguous(const at::Tensor& t);

// Whether DecodeAttention handles these inputs: CPU float32, at most 4 query steps, keys and
// values with contiguous [S, hs] rows per (batch, group), int64 query positions, int64 or
// int32 key positions.
bool DecodeAttentionApplies(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                            const at::Tensor& query_positions, const at::Tensor& key_positions);

// AttendByPositions (core/ops/attention.h) for the inputs DecodeAttentionApplies accepts;
// returns [B, n_head, T, hs].
// Cost per (row, group): one pass over the filled keys for up to 4 queries, a vectorised
// softmax, one pass over the values per 4 queries. `use_avx2` false forces the portable loops
// (tests); AVX2 needs head_size % 8 == 0.
at::Tensor DecodeAttention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                           const at::Tensor& query_positions, const at::Tensor& key_positions,
                           const AttentionParams& params, bool use_avx2 = CpuHasAvx2Fma());

// The same over a cache stored in blocks (the paged KV pool) without gathering them: one
// batch row whose first `entries` entries are those of blocks 0, 1, ... in order, each block
// [G, block_size, hs] (keys and values alike); key_positions [1, 1 or G, entries]. The
// arithmetic is DecodeAttention's on the concatenated blocks, to the bit. Applies to CPU
// float32 contiguous blocks of one shape and up to 4 query steps.
bool DecodeAttentionBlocksApplies(const at::Tensor& q, const std::vector<at::Tensor>& block_keys,
                                  const std::vector<at::Tensor>& block_values, int64_t entries,
                                  const at::Tensor& query_positions,
                                  const at::Tensor& key_positions);
at::Tensor DecodeAttentionBlocks(const at::Tensor& q, const std::vector<at::Tensor>& block_keys,
                                 const std::vector<at::Tensor>& block_values, int64_t entries,
                                 const at::Tensor& query_positions,
                                 const at::Tensor& key_positions, const AttentionParams& params,
                                 bool use_avx2 = CpuHasAvx2Fma());

}  // namespace lgpt

#endif  // LGPT_CORE_OPS_DECODE_ATTENTION_H_
