#include "attention/causal_self_attention.h"

#include <ATen/ATen.h>

#include <cmath>

#include "core/base/status_macros.h"

namespace lgpt {

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const CausalSelfAttentionOptions& options)
    : layer_(options.layer),
      n_head_(options.config.n_head),
      n_query_groups_(options.config.QueryGroups()),
      head_size_(options.config.HeadSize()),
      norm_qk_olmo2_(options.config.norm_qk_type == NormQkType::kOlmo2),
      rope_interleave_(options.config.rope_interleave) {
  const Config& config = options.config;
  const std::shared_ptr<const LinearFactory> factory =
      LinearFactoryOrDefault(options.linear_factory);
  params_.scale = config.AttentionScale();
  params_.softcap = config.attention_logit_softcapping;
  if (config.IsSlidingWindowLayer(layer_)) params_.sliding_window = *config.sliding_window_size;

  LinearSpec qkv;
  qkv.site = LinearSite::kQkv;
  qkv.layer = layer_;
  qkv.in_features = config.n_embd;
  qkv.q_size = n_head_ * head_size_;
  qkv.kv_size = n_query_groups_ * head_size_;
  qkv.out_features = qkv.q_size + 2 * qkv.kv_size;
  qkv.bias = config.bias || config.attn_bias;
  qkv_ = register_module("qkv", factory->Make(qkv));

  LinearSpec proj;
  proj.site = LinearSite::kAttnProj;
  proj.layer = layer_;
  proj.in_features = n_head_ * head_size_;
  proj.out_features = config.n_embd;
  proj.bias = config.bias;
  proj_ = register_module("proj", factory->Make(proj));

  if (config.norm_qk) {
    const int64_t q_size = norm_qk_olmo2_ ? n_head_ * head_size_ : head_size_;
    const int64_t k_size = norm_qk_olmo2_ ? n_query_groups_ * head_size_ : head_size_;
    NormOptions q_norm = NormOptions::FromConfig(config, q_size);
    NormOptions k_norm = NormOptions::FromConfig(config, k_size);
    if (norm_qk_olmo2_) {
      q_norm.shards = options.q_norm_shards;
      k_norm.shards = options.k_norm_shards;
    }
    norm_q_ = register_module("norm_q", Norm(q_norm));
    norm_k_ = register_module("norm_k", Norm(k_norm));
  }
  for (const auto& factory_ptr : options.extensions) {
    std::shared_ptr<AttentionExtension> extension = factory_ptr->Make(config, layer_);
    if (!extension) continue;
    extension->Attach(*this);
    extensions_.push_back(std::move(extension));
  }
}

absl::StatusOr<at::Tensor> CausalSelfAttentionImpl::Forward(const at::Tensor& x,
                                                            const RopeTables& rope,
                                                            const KVStep& step, KVCache* cache) {
  const int64_t batch = x.size(0), steps = x.size(1);
  const int64_t q_size = n_head_ * head_size_, kv_size = n_query_groups_ * head_size_;
  const at::Tensor qkv = qkv_->forward(x);  // [B, T, q_size + 2 · kv_size]
  at::Tensor q, k, v;                       // [B, nh, T, hs], [B, G, T, hs], [B, G, T, hs]
  if (norm_q_ || !SplitQkvRope(qkv, n_head_, n_query_groups_, head_size_, rope, rope_interleave_,
                               &q, &k, &v)) {
    q = qkv.narrow(-1, 0, q_size);
    k = qkv.narrow(-1, q_size, kv_size);
    v = qkv.narrow(-1, q_size + kv_size, kv_size);
    if (norm_q_ && norm_qk_olmo2_) {
      q = norm_q_->forward(q);
      k = norm_k_->forward(k);
    }
    q = q.reshape({batch, steps, n_head_, head_size_}).transpose(1, 2);
    k = k.reshape({batch, steps, n_query_groups_, head_size_}).transpose(1, 2);
    v = v.reshape({batch, steps, n_query_groups_, head_size_}).transpose(1, 2);
    if (norm_q_ && !norm_qk_olmo2_) {
      q = norm_q_->forward(q);
      k = norm_k_->forward(k);
    }
    q = ApplyRope(q, rope, rope_interleave_);
    k = ApplyRope(k, rope, rope_interleave_);
  }

  at::Tensor y;  // [B, nh, T, hs]
  if (cache != nullptr) {
    ASSIGN_OR_RETURN(y, cache->UpdateAndAttend(layer_, step, q, k, v, params_));
  } else {
    y = AttendByPositions(q, k, v, step.positions, step.positions.unsqueeze(1), params_);
  }
  for (const auto& extension : extensions_) {
    const at::Tensor extra = extension->Contribute({q, qkv_.get(), &params_});
    if (extra.defined()) y = y + extra;
  }
  // One step of contiguous [B, nh, 1, hs] is already [B, 1, nh · hs] in memory.
  y = steps == 1 && y.is_contiguous() ? y.view({batch, 1, q_size})
                                      : y.transpose(1, 2).reshape({batch, steps, q_size});
  return proj_->forward(y);
}

}  // namespace lgpt
