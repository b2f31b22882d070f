// Trainable attention on the CPU: FlashAttention's forward (core/ops/flash_attention.h) and
// FlashAttentionBackward wrapped as one autograd function, so training attends with the
// memory of the inference kernel. q, keys and values all get gradients; with grouped queries
// the gradient of a key/value group sums over the group's query heads.
//
// Cost: the forward is FlashAttention's plus one log-sum-exp per query; autograd keeps q, k,
// v (contiguous copies where they were views), the output and the log-sum-exp, never a
// [T, S] tensor (the generic path keeps the scores, the mask and the weights
// [B, n_head, T, S] float32). The backward recomputes the weights tile by tile, about 2.5x
// the forward's multiply-adds, in parallel over (batch row, group, share of the key tiles).
#ifndef LGPT_CORE_OPS_FLASH_ATTENTION_GRAD_H_
#define LGPT_CORE_OPS_FLASH_ATTENTION_GRAD_H_

#include <ATen/core/Tensor.h>

#include "core/ops/attention_mask.h"

namespace lgpt {

// Whether FlashAttentionTrainable takes these inputs: q [B, n_head, T >= 1, hs], keys and
// values [B, G, S >= 1, hs] float32 on the CPU with n_head a multiple of G (any strides),
// query_positions [B, T] int64 and key_positions [B, 1 or G, S] int64 or int32 on the CPU.
bool FlashAttentionTrainableApplies(const at::Tensor& q, const at::Tensor& keys,
                                    const at::Tensor& values, const at::Tensor& query_positions,
                                    const at::Tensor& key_positions);

// AttendByPositions (core/ops/attention.h) for the inputs above, recorded for autograd as one
// node whose backward is FlashAttentionBackward. Returns [B, n_head, T, hs]. `use_avx2`
// false forces the portable loops in both directions (tests).
at::Tensor FlashAttentionTrainable(const at::Tensor& q, const at::Tensor& keys,
                                   const at::Tensor& values, const at::Tensor& query_positions,
                                   const at::Tensor& key_positions, const AttentionParams& params,
                                   bool use_avx2 = true);

}  // namespace lgpt

#endif  // LGPT_CORE_OPS_FLASH_ATTENTION_GRAD_H_
