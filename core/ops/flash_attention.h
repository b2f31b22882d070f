// Attention for prompts (many query steps) on the CPU, in the manner of FlashAttention: the
// keys and values stream by in tiles of 64 entries against a tile of up to 16 queries of one
// key group, with an online softmax (running maximum and sum), so no [T, S] score, mask or
// weight tensor is built, a key/value row is read once per query tile, and tiles no query
// of the tile may see (the causal future, outside a sliding window) are skipped unread.
// Same semantics as AttendBlockwise (core/ops/attention.h): scale, soft-capping, masks from
// positions, float32 softmax; a query with no visible key gets the mean of the values (the
// uniform weights the masked softmax gives). Results differ from it by float rounding only.
//
// Cost per (row, group, query tile): the visible keys' scores (a few-row GEMV), their
// exponentials, one pass over the visible values; causal prefill of T tokens touches T^2 / 2
// entries per head instead of T^2.
#ifndef LGPT_CORE_OPS_FLASH_ATTENTION_H_
#define LGPT_CORE_OPS_FLASH_ATTENTION_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "core/ops/attention_mask.h"
#include "core/ops/gemv.h"

namespace lgpt {

// Consecutive cache entries of one (batch row, key group) stored together.
struct KVRun {
  const float* keys = nullptr;         // [entries, hs]
  const float* values = nullptr;       // [entries, hs]
  KeyPositionRun positions;             // entry e at positions[e]
  int64_t entries = 0;
};

// Fills `runs` with the entries of (batch row b, key group g), in order.
using KVRunsOf = std::function<void(int64_t b, int64_t g, std::vector<KVRun>* runs)>;

// q [B, n_head, T, hs] float32 on the CPU (any strides), query_positions [B, T] int64;
// n_head a multiple of `groups`. Returns [B, n_head, T, hs]. `use_avx2` false forces the
// portable loops (tests); AVX2 needs hs % 8 == 0.
at::Tensor FlashAttention(const at::Tensor& q, int64_t groups, const KVRunsOf& runs_of,
                          const at::Tensor& query_positions, const AttentionParams& params,
                          bool use_avx2 = CpuHasAvx2Fma());

}  // namespace lgpt

#endif  // LGPT_CORE_OPS_FLASH_ATTENTION_H_
