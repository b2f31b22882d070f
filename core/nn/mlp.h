// The feed-forward part of a block: LitGPT's GptNeoxMLP, LLaMAMLP, GemmaMLP and LLaMAMoE,
// with LitGPT's parameter names (fc, fc_1, fc_2, proj, gate, experts.N.*,
// shared_experts.*). All projections come from the LinearFactory.
#ifndef LGPT_CORE_NN_MLP_H_
#define LGPT_CORE_NN_MLP_H_

#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "core/config/config.h"
#include "core/nn/linear_factory.h"

namespace lgpt {

class FeedForwardImpl : public torch::nn::Module {
 public:
  // x [B, T, n_embd] -> [B, T, n_embd]
  virtual at::Tensor forward(const at::Tensor& x) = 0;
};
using FeedForwardPtr = std::shared_ptr<FeedForwardImpl>;

// GptNeoxMLP (fc -> gelu -> proj), LLaMAMLP (silu(fc_1) * fc_2 -> proj) and GemmaMLP
// (gelu(fc_1) * fc_2 -> proj).
class MlpImpl : public FeedForwardImpl {
 public:
  MlpImpl(const Config& config, MlpClass kind, int64_t intermediate_size, int64_t layer,
          int64_t expert, const LinearFactory& factory);
  at::Tensor forward(const at::Tensor& x) override;

 private:
  MlpClass kind_;
  bool gelu_tanh_;
  ProjectionPtr fc_;    // GptNeoxMLP: [intermediate, n_embd]
  ProjectionPtr fc_1_;  // gated MLPs: [intermediate, n_embd]
  ProjectionPtr fc_2_;  // gated MLPs: [intermediate, n_embd]
  ProjectionPtr proj_;  // [n_embd, intermediate]
};

// LLaMAMoE: a linear router picks n_expert_per_token LLaMAMLP experts per token, weighted
// by the softmax of their router logits; optional shared experts see every token.
class MoeImpl : public FeedForwardImpl {
 public:
  MoeImpl(const Config& config, int64_t layer, const LinearFactory& factory);
  at::Tensor forward(const at::Tensor& x) override;

 private:
  int64_t n_expert_per_token_;
  double routed_scaling_factor_;
  ProjectionPtr gate_;                          // [n_expert, n_embd]
  std::vector<std::shared_ptr<MlpImpl>> experts_;
  std::shared_ptr<MlpImpl> shared_experts_;     // may be null
};

// The feed-forward module LitGPT's Block builds for `layer`.
FeedForwardPtr MakeFeedForward(const Config& config, int64_t layer,
                               const LinearFactory& factory);

}  // namespace lgpt

#endif  // LGPT_CORE_NN_MLP_H_
