// Attention for decoding steps on the CPU: a few float32 queries against the filled cache,
// without building the [B, ·, T, S] mask and score tensors that AttendByPositions' generic
// path allocates (at one token a step, those small LibTorch operations cost more than the
// arithmetic). Same semantics as AttendByPositions, float32 softmax included.
//
// Kernels, chosen at run time: AVX2/FMA (F16C for float16 entries) and, on CPUs with AVX-512
// F/BW/VL (CpuHasAvx512), AVX-512 versions of the scores, the softmax's exponentials and the
// weighted values that give the AVX2 kernels' results to the bit: they sum in the same order,
// two keys (or 16 value columns) a register instead of one key (8 columns). Without `use_avx2`
// the softmax and the weighted values take portable loops (the scores keep the AVX2 sums),
// equal to the vector kernels' results to float32 rounding.
#ifndef LGPT_CORE_OPS_DECODE_ATTENTION_H_
#define LGPT_CORE_OPS_DECODE_ATTENTION_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "core/ops/attention_mask.h"
#include "core/ops/gemv.h"
#include "core/ops/kv_entry.h"
#include "core/ops/paged_attention_layout.h"

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
// returns [B, n_head, T, hs]. If `weights_out` is not null it receives the softmax weights,
// [B, n_head, T, S] contiguous float32 (the caller's buffer: eviction policies score entries
// with them without a tensor allocated per step).
// Cost per (row, group): one pass over the filled keys for up to 4 queries, a vectorised
// softmax, one pass over the values per 4 queries (plus one store per weight when asked).
// `use_avx2` false forces the portable loops (tests); AVX2 needs head_size % 8 == 0 (the
// scores take the AVX2 or AVX-512 kernel at any head size).
at::Tensor DecodeAttention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                           const at::Tensor& query_positions, const at::Tensor& key_positions,
                           const AttentionParams& params, bool use_avx2 = CpuHasAvx2Fma(),
                           float* weights_out = nullptr);

// Whether the kernels may use AVX-512 where the CPU has it (default true; the results are the
// same bits either way). Tests and benchmarks set false to run the AVX2 kernels instead.
// Process-wide; returns the previous setting.
bool SetDecodeAttentionAvx512ForTesting(bool allowed);

// Consecutive cache entries of one (batch row, key group): [entries, hs] keys and values of
// `type` (float32, or the 16-bit entries of a float32 model's KV pool, widened in registers as
// they are read). A contiguous cache is one segment; a paged one, one per block.
struct KVSegment {
  const void* keys;
  const void* values;
  int64_t entries;
  KVEntryType type = KVEntryType::kFloat32;
  // Set for int8 / int4 entries (core/ops/paged_attention_layout.h: codes, then float16 scales;
  // paged::EntryBytes(*quantised) apart), read in place and dequantised in registers where the
  // group size is a multiple of 8 (AVX2), channel by channel elsewhere: the bits of the kernel
  // over their dequantised float32 copies (kv_dequant.h). `type` is then not used.
  std::optional<paged::EntryFormat> quantised;
};
// Lists the entries of (batch row b, key group g) in order. Called once per (b, g), possibly
// from several threads at once; the pointers must stay valid until the (b, g)'s attention is
// done (a decoding source may fill a thread_local buffer).
using KVSegmentsOf = std::function<void(int64_t b, int64_t g, std::vector<KVSegment>* out)>;

// DecodeAttention over entries in any storage: `entries` per (row, group), listed by
// `segments_of`; key_positions [B, 1 or G, entries]. The arithmetic of DecodeAttention on the
// concatenated segments, to the bit. Same conditions on q and positions as
// DecodeAttentionApplies; `groups` divides n_head.
at::Tensor DecodeAttentionSegments(const at::Tensor& q, int64_t groups, int64_t entries,
                                   const KVSegmentsOf& segments_of,
                                   const at::Tensor& query_positions,
                                   const at::Tensor& key_positions, const AttentionParams& params,
                                   bool use_avx2 = CpuHasAvx2Fma(), float* weights_out = nullptr);

// The segments of blocks [G, entries_per_block, hs] (contiguous, keys and values alike, float32,
// bfloat16 or float16) holding `entries` entries in order: per key group, a run of each block's
// rows. With `quantised`, uint8 blocks [G, entries_per_block, entry_bytes] of that format's
// entries (KVSegment.quantised). The blocks are kept alive by the returned function.
KVSegmentsOf BlockSegments(std::vector<at::Tensor> block_keys, std::vector<at::Tensor> block_values,
                           int64_t entries,
                           std::optional<paged::EntryFormat> quantised = std::nullopt);

// The same over a cache stored in blocks (the paged KV pool) without gathering them: one
// batch row whose first `entries` entries are those of blocks 0, 1, ... in order, each block
// [G, entries_per_block, hs] (keys and values alike); key_positions [1, 1 or G, entries]. The
// arithmetic is DecodeAttention's on the concatenated blocks, to the bit (16-bit blocks: on
// their float32 copies, to the bit). Applies to CPU contiguous blocks of one shape and one
// dtype (float32, bfloat16, float16) and up to 4 float32 query steps.
bool DecodeAttentionBlocksApplies(const at::Tensor& q, const std::vector<at::Tensor>& block_keys,
                                  const std::vector<at::Tensor>& block_values, int64_t entries,
                                  const at::Tensor& query_positions,
                                  const at::Tensor& key_positions);
at::Tensor DecodeAttentionBlocks(const at::Tensor& q, const std::vector<at::Tensor>& block_keys,
                                 const std::vector<at::Tensor>& block_values, int64_t entries,
                                 const at::Tensor& query_positions, const at::Tensor& key_positions,
                                 const AttentionParams& params, bool use_avx2 = CpuHasAvx2Fma());

// One row of a batched decoding step: a request's entries in its own storage. `segments`
// lists them per key group (called with b = 0); key_positions [1, 1 or G, entries].
struct DecodeRow {
  int64_t entries = 0;
  KVSegmentsOf segments;
  at::Tensor key_positions;
};

// Whether DecodeAttentionRows handles q [B, n_head, T, hs] and query_positions [B, T] with
// `groups` key groups: CPU float32 without autograd, at most 4 query steps.
bool DecodeAttentionRowsApplies(const at::Tensor& q, int64_t groups,
                                const at::Tensor& query_positions);

// A decoding step of many requests at once (the serving scheduler's batch): row b's queries
// q[b] attend over rows[b]'s entries only, rows of any lengths. Every (row, key group) task
// shares one fork, so a step pays one per layer instead of one per request. Row b's result
// is DecodeAttentionSegments' on that row alone, to the bit. Returns [B, n_head, T, hs].
at::Tensor DecodeAttentionRows(const at::Tensor& q, int64_t groups,
                               const std::vector<DecodeRow>& rows,
                               const at::Tensor& query_positions, const AttentionParams& params,
                               bool use_avx2 = CpuHasAvx2Fma());

}  // namespace lgpt

#endif  // LGPT_CORE_OPS_DECODE_ATTENTION_H_
