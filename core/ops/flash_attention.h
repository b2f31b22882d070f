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
//
// Training: FlashAttention can also return each query's log-sum-exp, and
// FlashAttentionBackward recomputes the weights tile by tile from q, k and it (FlashAttention-2's
// backward), so the gradient of q, k and v costs O(T · S · hs) time and no [T, S] tensor
// either; the autograd wrapper is core/ops/flash_attention_grad.h.
#ifndef LGPT_CORE_OPS_FLASH_ATTENTION_H_
#define LGPT_CORE_OPS_FLASH_ATTENTION_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "core/ops/attention_mask.h"
#include "core/ops/gemv.h"
#include "core/ops/kv_entry.h"

namespace lgpt {

// Query steps from which prompts take FlashAttention rather than the decode-step or generic
// kernels (AttendByPositions, AttendBlockwise and the paged cache agree on it: their results are
// then the same bits).
inline constexpr int64_t kFlashMinSteps = 5;

// Consecutive cache entries of one (batch row, key group) stored together.
struct KVRun {
  const float* keys = nullptr;    // [entries, hs]
  const float* values = nullptr;  // [entries, hs]
  KeyPositionRun positions;       // entry e at positions[e]
  int64_t entries = 0;
  // 16-bit entries instead (a float32 model's KV pool; keys and values above null):
  // [entries, hs] of `type`, widened to float32 one key tile at a time, so the results are those
  // of their float32 copies, to the bit. Forward only.
  KVEntryType type = KVEntryType::kFloat32;
  const void* keys16 = nullptr;
  const void* values16 = nullptr;
};

// Fills `runs` with the entries of (batch row b, key group g), in order.
using KVRunsOf = std::function<void(int64_t b, int64_t g, std::vector<KVRun>* runs)>;

// q [B, n_head, T, hs] float32 on the CPU (any strides), query_positions [B, T] int64;
// n_head a multiple of `groups`. Returns [B, n_head, T, hs]. `use_avx2` false forces the
// portable loops (tests); AVX2 needs hs % 8 == 0. If `lse` is given it receives [B, n_head, T]
// float32: log sum_e exp(s_e) over the query's visible (scaled, soft-capped) scores, +inf for
// a query with no visible key (its output is the mean of the values).
at::Tensor FlashAttention(const at::Tensor& q, int64_t groups, const KVRunsOf& runs_of,
                          const at::Tensor& query_positions, const AttentionParams& params,
                          bool use_avx2 = CpuHasAvx2Fma(), at::Tensor* lse = nullptr);

struct FlashGradients {
  at::Tensor q;       // [B, n_head, T, hs]
  at::Tensor keys;    // [B, G, S, hs]
  at::Tensor values;  // [B, G, S, hs]
};

// The gradients of FlashAttention's output over keys, values [B, G, S, hs] (one run per
// (row, group), float32 on the CPU, any strides) given `grad_out` [B, n_head, T, hs], from
// its inputs, output `out` and `lse`; key_positions [B, 1 or G, S] int64 or int32. Matches
// autograd through the generic path (core/ops/attention.h): the soft-capping's tanh derivative,
// masked scores get no gradient, a query with no visible key sends grad_out / S to every value.
//
// Per key/value tile of 64 entries, each visible query tile of 32 rows recomputes the scores
// and weights P = exp(s - lse), then dP = dO V^T, dS = P (dP - D) with D = rowsum(dO · out),
// and accumulates dV += P^T dO, dK += scale dS^T Q, dQ += scale dS K: five few-row products
// per tile pair, about 2.5x the forward's work; extra memory is D and, when there are more
// threads than (row, group) pairs, one partial dQ per key-tile share. Tasks (row, group,
// share of the key tiles) run in parallel (at::parallel_for): each key tile's dK and dV have
// one writer, and the partial dQs are summed in a fixed order.
FlashGradients FlashAttentionBackward(const at::Tensor& q, const at::Tensor& keys,
                                      const at::Tensor& values, const at::Tensor& out,
                                      const at::Tensor& lse, const at::Tensor& grad_out,
                                      const at::Tensor& query_positions,
                                      const at::Tensor& key_positions,
                                      const AttentionParams& params,
                                      bool use_avx2 = CpuHasAvx2Fma());

}  // namespace lgpt

#endif  // LGPT_CORE_OPS_FLASH_ATTENTION_H_
