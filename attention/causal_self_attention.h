// LitGPT's CausalSelfAttention: fused [Q | K | V] projection, optional q/k norms (per head
// or OLMo 2's over all heads), RoPE on the first rope_n_elem features, the KV cache, the
// position-masked attention kernel, extensions, and the output projection. Registered
// names (qkv, proj, norm_q, norm_k) equal LitGPT's.
#ifndef LGPT_ATTENTION_CAUSAL_SELF_ATTENTION_H_
#define LGPT_ATTENTION_CAUSAL_SELF_ATTENTION_H_

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "attention/attention_extension.h"
#include "cache/kv_cache.h"
#include "core/config/config.h"
#include "core/nn/linear_factory.h"
#include "core/nn/norm.h"
#include "core/nn/rope.h"
#include "core/ops/attention.h"

namespace lgpt {

struct CausalSelfAttentionOptions {
  Config config;  // finalised
  int64_t layer = 0;
  std::shared_ptr<const LinearFactory> linear_factory;
  std::vector<std::shared_ptr<const AttentionExtensionFactory>> extensions;
  // OLMo 2's whole-width q/k norms split over tensor-parallel ranks (core/nn/norm.h); null:
  // not split.
  std::shared_ptr<const NormFeatureShards> q_norm_shards;
  std::shared_ptr<const NormFeatureShards> k_norm_shards;
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const CausalSelfAttentionOptions& options);

  // x [B, T, n_embd] -> [B, T, n_embd]. `rope` holds this layer's tables for the step's
  // positions. Without a cache, the step attends to its own tokens only.
  absl::StatusOr<at::Tensor> Forward(const at::Tensor& x, const RopeTables& rope,
                                     const KVStep& step, KVCache* cache);

  int64_t layer() const { return layer_; }
  const AttentionParams& params() const { return params_; }

 private:
  int64_t layer_;
  int64_t n_head_, n_query_groups_, head_size_;
  bool norm_qk_olmo2_ = false;
  bool rope_interleave_ = false;
  AttentionParams params_;
  ProjectionPtr qkv_;     // [(n_head + 2 · n_query_groups) · head_size, n_embd]
  ProjectionPtr proj_;    // [n_embd, n_head · head_size]
  Norm norm_q_{nullptr};  // [head_size] or OLMo 2's [n_head · head_size]
  Norm norm_k_{nullptr};  // [head_size] or OLMo 2's [n_query_groups · head_size]
  std::vector<std::shared_ptr<AttentionExtension>> extensions_;
};
TORCH_MODULE(CausalSelfAttention);

}  // namespace lgpt

#endif  // LGPT_ATTENTION_CAUSAL_SELF_ATTENTION_H_
