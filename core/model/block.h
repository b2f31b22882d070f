// LitGPT's Block: norm_1 -> attention -> post_attention_norm, then the MLP with sequential
// or parallel residual (optionally sharing norm_1's output), -> post_mlp_norm.
#ifndef LGPT_CORE_MODEL_BLOCK_H_
#define LGPT_CORE_MODEL_BLOCK_H_

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"
#include "attention/causal_self_attention.h"
#include "cache/kv_cache.h"
#include "core/config/config.h"
#include "core/nn/mlp.h"
#include "core/model/model_parts.h"
#include "core/nn/norm.h"
#include "core/nn/rope.h"

namespace lgpt {

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const Config& config, int64_t layer, const ModelParts& parts);

  // x [B, T, n_embd] -> [B, T, n_embd]
  absl::StatusOr<at::Tensor> Forward(const at::Tensor& x, const RopeTables& rope,
                                     const KVStep& step, KVCache* cache);

  CausalSelfAttention& attn() { return attn_; }

 private:
  bool parallel_residual_;
  bool shared_attention_norm_;
  Norm norm_1_{nullptr};               // [n_embd]; absent when config.norm_1 is false
  CausalSelfAttention attn_{nullptr};
  Norm post_attention_norm_{nullptr};  // [n_embd]; optional
  Norm norm_2_{nullptr};               // [n_embd]; absent if shared or config.norm_2 false
  FeedForwardPtr mlp_;
  Norm post_mlp_norm_{nullptr};        // [n_embd]; optional
};
TORCH_MODULE(Block);

}  // namespace lgpt

#endif  // LGPT_CORE_MODEL_BLOCK_H_
