// Rotary position embeddings (RoPE) as LitGPT builds them: partial rotary, condensed
// positions, Llama 3 frequency adjustment, linear and YaRN scaling, and a second (local)
// base frequency for layers chosen by `rope_indices`.
//
// Unlike LitGPT, no [block_size, n_elem] table is precomputed: cos/sin are computed for the
// positions of each step (cost O(B·T·n_elem)), so nothing scales with the maximum length.
#ifndef LGPT_CORE_NN_ROPE_H_
#define LGPT_CORE_NN_ROPE_H_

#include <ATen/core/Tensor.h>

#include "core/config/config.h"

namespace lgpt {

struct RopeTables {
  at::Tensor cos;  // [B, T, rope_n_elem], float32
  at::Tensor sin;  // [B, T, rope_n_elem], float32
};

class Rope {
 public:
  // `config` must be finalised.
  Rope(const Config& config, const at::Device& device);

  // Tables for the global base frequency, or the local one (`rope_local_base_freq`).
  // positions [B, T] int64.
  RopeTables Tables(const at::Tensor& positions, bool local) const;
  // Tables of the pure rotation by `shift` positions [B, T] (no YaRN magnitude factor). RoPE
  // angles are linear in the position, so ApplyRope with these tables moves features rotated
  // at position p to position p + shift (KV caches with cache positions move keys this way).
  RopeTables RotationTables(const at::Tensor& shift, bool local) const;

  bool has_local() const { return local_theta_.defined(); }
  int64_t n_elem() const { return n_elem_; }

 private:
  int64_t n_elem_;
  double condense_ratio_;
  double attention_scaling_ = 1.0;  // YaRN's mscale ratio.
  at::Tensor theta_;        // [n_elem / 2], float32
  at::Tensor local_theta_;  // [n_elem / 2], float32; undefined without a local base
};

// Rotates the first `cos.size(-1)` features of x in place of a copy:
// x [B, H, T, hs] -> [B, H, T, hs]; cos/sin [B, T, n_elem].
at::Tensor ApplyRope(const at::Tensor& x, const RopeTables& tables, bool interleave);

// Decoding's split of the fused projection, qkv [B, T, (n_head + 2·G)·hs], into new contiguous
// q [B, n_head, T, hs] and k [B, G, T, hs], both roped, and v [B, G, T, hs], in one pass
// (instead of nine views and two ApplyRope calls). The values are exactly those of narrowing,
// reshaping and ApplyRope. Returns false, writing nothing, where it does not apply: autograd,
// not float32 on the CPU, not contiguous, or interleaved RoPE. Any number of steps: prefill
// chunks split their tokens over the row pool's threads.
bool SplitQkvRope(const at::Tensor& qkv, int64_t n_head, int64_t n_query_groups,
                  int64_t head_size, const RopeTables& tables, bool interleave, at::Tensor* q,
                  at::Tensor* k, at::Tensor* v);

}  // namespace lgpt

#endif  // LGPT_CORE_NN_ROPE_H_
