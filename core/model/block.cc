#include "core/model/block.h"

#include <ATen/ATen.h>

#include "core/base/status_macros.h"

namespace lgpt {
namespace {

at::Tensor MaybeNorm(Norm& norm, const at::Tensor& x) { return norm ? norm->forward(x) : x; }

}  // namespace

BlockImpl::BlockImpl(const Config& config, int64_t layer, const ModelParts& parts)
    : parallel_residual_(config.parallel_residual),
      shared_attention_norm_(config.shared_attention_norm) {
  const NormOptions norm = NormOptions::FromConfig(config, config.n_embd);
  if (config.norm_1) norm_1_ = register_module("norm_1", Norm(norm));
  CausalSelfAttentionOptions attention;
  attention.config = config;
  attention.layer = layer;
  attention.linear_factory = parts.linear_factory;
  attention.extensions = parts.attention_extensions;
  attention.q_norm_shards = parts.q_norm_shards;
  attention.k_norm_shards = parts.k_norm_shards;
  attn_ = register_module("attn", CausalSelfAttention(attention));
  if (config.post_attention_norm) {
    post_attention_norm_ = register_module("post_attention_norm", Norm(norm));
  }
  if (config.norm_2 && !config.shared_attention_norm) {
    norm_2_ = register_module("norm_2", Norm(norm));
  }
  const std::shared_ptr<const LinearFactory> factory = LinearFactoryOrDefault(parts.linear_factory);
  mlp_ = register_module("mlp", MakeFeedForward(config, layer, *factory));
  if (config.post_mlp_norm) post_mlp_norm_ = register_module("post_mlp_norm", Norm(norm));
}

absl::StatusOr<at::Tensor> BlockImpl::Forward(const at::Tensor& x, const RopeTables& rope,
                                              const KVStep& step, KVCache* cache) {
  at::Tensor x_normed = MaybeNorm(norm_1_, x);
  ASSIGN_OR_RETURN(at::Tensor attention, attn_->Forward(x_normed, rope, step, cache));
  attention = MaybeNorm(post_attention_norm_, attention);
  at::Tensor residual;
  if (parallel_residual_) {
    if (!shared_attention_norm_) x_normed = MaybeNorm(norm_2_, x);
    residual = attention + x;
  } else if (norm_2_) {
    x_normed = norm_2_->AddForward(x, attention, &residual);
  } else {
    residual = attention + x;
    x_normed = residual;
  }
  return MaybeNorm(post_mlp_norm_, mlp_->forward(x_normed)) + residual;
}

}  // namespace lgpt
