// Paged decode attention (vLLM's PagedAttention, FlashDecoding's split-K): one query token per
// request against the request's entries where they lie in a block pool, read through its block
// table, with no gather of the cache. One kernel library per device: on CUDA a kernel of ours,
// on the CPU its twin (plain loops over the same index math, paged_attention_layout.h), which
// the CUDA kernel is tested against and which tests check against AttendByPositions.
//
// Entries: float32, bfloat16 or float16, or int8 / int4 codes with their float16 scales inside
// the block, dequantised as they are read (no decoded copy). Per request: its length, its query
// position, its block table (blocks in any order). Masks: causal by position, the sliding
// window, softcapping (Gemma 2), and, for caches that evict (window, sink, h2o, tova), each
// slot's own token position (-1: empty). GQA and MQA: the q_per_kv heads of a key group read
// each entry once.
//
// Long requests are split into runs of entries attended independently (one CUDA thread block
// each, so one long request still fills the GPU) and merged by their log-sum-exp
// (paged::MergeFactors). Scores, softmax and accumulation in float32.
#ifndef LGPT_CORE_OPS_PAGED_ATTENTION_H_
#define LGPT_CORE_OPS_PAGED_ATTENTION_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/ops/attention_mask.h"

namespace lgpt {

// One layer's entries in a block pool.
struct PagedKVLayer {
  // [num_blocks, n_query_groups, entries_per_block, head_size] float32, bfloat16 or float16
  // (bits 16), or [num_blocks, n_query_groups, entries_per_block, entry_bytes] uint8 (bits 8
  // or 4: paged_attention_layout.h's entries); contiguous, keys and values alike.
  at::Tensor keys;
  at::Tensor values;
  int bits = 16;            // 16: entries in the tensors' float dtype; 8 or 4: quantised
  int64_t group_size = 32;  // quantised: channels per scale (divides head_size; even for 4 bits)
  // Optional [num_blocks, n_query_groups, entries_per_block] int32: each slot's token position
  // (-1: empty), for caches whose entries are not positions 0, 1, ... in table order.
  // Undefined: entry e of a request holds position e.
  at::Tensor slot_positions;
};

// The requests of one decoding step, as plain data on the pool's device.
struct PagedDecodeBatch {
  at::Tensor block_tables;     // [R, max_blocks] int32: request r's entry e in block [r, e / block]
  at::Tensor lengths;          // [R] int32: entries of request r (0: an empty request, reads 0)
  at::Tensor query_positions;  // [R] int32: the position of request r's query token
  // A bound on every length, known on the host, so that the splits are sized without reading
  // lengths back from the device. A CUDA request longer than this reads NaN (a contract
  // violation made visible); on the CPU it is an InvalidArgument.
  int64_t max_length = 0;
};

struct PagedDecodeOptions {
  // Entries per split (rounded down to a multiple of 32 and lowered so one split's scores fit
  // a CUDA thread block's shared memory; at least 32).
  int64_t entries_per_split = 256;
};

// q [R, n_head, head_size] float32, bfloat16 or float16 on the pool's device; head_size at most
// 256; n_head a multiple of n_query_groups (query head h reads key group h / (n_head /
// n_query_groups), LitGPT's layout). Returns [R, n_head, head_size] in q's dtype.
// InvalidArgument naming the argument at fault for shapes, dtypes or devices that do not fit
// (and, on the CPU, lengths beyond max_length or the block table and blocks outside the pool;
// on CUDA entries whose block is outside the pool are skipped, never read).
absl::StatusOr<at::Tensor> PagedDecodeAttention(const at::Tensor& q, const PagedKVLayer& layer,
                                                const PagedDecodeBatch& batch,
                                                const AttentionParams& params,
                                                const PagedDecodeOptions& options = {});

// One request of a decoding step as host data: its blocks in order (entry e in blocks[e /
// entries_per_block]), its length and its query's position.
struct PagedDecodeRow {
  std::vector<int32_t> blocks;
  int64_t length = 0;
  int64_t query_position = 0;
};

// PagedDecodeAttention over `rows` (the serving engine's batched step, one kernel launch for
// every request): q [R, n_head, head_size], row r's query attending over rows[r]'s entries.
// The block tables, padded to the longest, the lengths and the query positions travel to the
// pool's device in one copy. InvalidArgument for no rows, a row's blocks too few for its length
// (naming `rows[r]`), or PagedDecodeAttention's errors.
absl::StatusOr<at::Tensor> PagedDecodeRows(const at::Tensor& q, const PagedKVLayer& layer,
                                           const std::vector<PagedDecodeRow>& rows,
                                           const AttentionParams& params,
                                           const PagedDecodeOptions& options = {});

// The entries per split PagedDecodeAttention uses for `heads_per_group` query heads a group
// and `head_size` channels (the shared-memory bound applied to options.entries_per_split).
int64_t PagedEntriesPerSplit(const PagedDecodeOptions& options, int64_t heads_per_group,
                             int64_t head_size);

// Whether this build has the CUDA kernel (built against a CUDA LibTorch).
bool PagedAttentionHasCudaKernel();

}  // namespace lgpt

#endif  // LGPT_CORE_OPS_PAGED_ATTENTION_H_
