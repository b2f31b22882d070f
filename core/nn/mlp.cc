#include "core/nn/mlp.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/nn/modules/container/modulelist.h>

#include <string>

#include "core/ops/activation.h"

namespace lgpt {
namespace {

ProjectionPtr MakeLinear(torch::nn::Module& owner, const std::string& name,
                         const LinearFactory& factory, LinearSite site, int64_t layer,
                         int64_t expert, int64_t in, int64_t out, bool bias) {
  LinearSpec spec;
  spec.site = site;
  spec.layer = layer;
  spec.expert = expert;
  spec.in_features = in;
  spec.out_features = out;
  spec.bias = bias;
  return owner.register_module(name, factory.Make(spec));
}

}  // namespace

MlpImpl::MlpImpl(const Config& config, MlpClass kind, int64_t intermediate_size, int64_t layer,
                 int64_t expert, const LinearFactory& factory)
    : kind_(kind), gelu_tanh_(config.gelu_approximate == "tanh") {
  const int64_t n_embd = config.n_embd;
  if (kind == MlpClass::kGptNeoxMLP) {
    fc_ = MakeLinear(*this, "fc", factory, LinearSite::kMlpFc, layer, expert, n_embd,
                     intermediate_size, config.bias);
  } else {
    fc_1_ = MakeLinear(*this, "fc_1", factory, LinearSite::kMlpFc1, layer, expert, n_embd,
                       intermediate_size, config.bias);
    fc_2_ = MakeLinear(*this, "fc_2", factory, LinearSite::kMlpFc2, layer, expert, n_embd,
                       intermediate_size, config.bias);
  }
  proj_ = MakeLinear(*this, "proj", factory, LinearSite::kMlpProj, layer, expert, intermediate_size,
                     n_embd, config.bias);
}

at::Tensor MlpImpl::forward(const at::Tensor& x) {
  const c10::string_view approximate = gelu_tanh_ ? "tanh" : "none";
  switch (kind_) {
    case MlpClass::kGptNeoxMLP:
      return proj_->forward(at::gelu(fc_->forward(x), approximate));
    case MlpClass::kGemmaMLP:
      return proj_->forward(at::gelu(fc_1_->forward(x), approximate) * fc_2_->forward(x));
    default: {
      at::Tensor gate = fc_1_->forward(x);
      if (c10::GradMode::is_enabled()) return proj_->forward(at::silu(gate) * fc_2_->forward(x));
      // Inference: in place, in one fused pass where it applies (core/ops/activation.h).
      const at::Tensor up = fc_2_->forward(x);
      if (!SiluMulInPlace(gate, up)) at::silu_(gate).mul_(up);
      return proj_->forward(gate);
    }
  }
}

MoeImpl::MoeImpl(const Config& config, int64_t layer, const LinearFactory& factory)
    : n_expert_per_token_(config.n_expert_per_token),
      routed_scaling_factor_(config.routed_scaling_factor) {
  gate_ = MakeLinear(*this, "gate", factory, LinearSite::kMoeGate, layer, -1, config.n_embd,
                     config.n_expert, /*bias=*/false);
  const int64_t expert_size = config.moe_intermediate_size.value_or(config.IntermediateSize());
  torch::nn::ModuleList experts;
  for (int64_t e = 0; e < config.n_expert; ++e) {
    experts_.push_back(
        std::make_shared<MlpImpl>(config, MlpClass::kLLaMAMLP, expert_size, layer, e, factory));
    experts->push_back(experts_.back());
  }
  register_module("experts", experts);
  if (config.n_shared_expert.value_or(0) > 0) {
    shared_experts_ = register_module(
        "shared_experts",
        std::make_shared<MlpImpl>(config, MlpClass::kLLaMAMLP,
                                  expert_size * *config.n_shared_expert, layer, -2, factory));
  }
}

at::Tensor MoeImpl::forward(const at::Tensor& x) {
  const int64_t n_embd = x.size(-1);
  const at::Tensor flat = x.reshape({-1, n_embd});                       // [N, C]
  const at::Tensor router = gate_->forward(flat);                        // [N, n_expert]
  auto [top_logits, top_index] = at::topk(router, n_expert_per_token_);  // [N, k]
  at::Tensor probs = at::softmax(top_logits, 1, at::kFloat).to(x.scalar_type());
  if (routed_scaling_factor_ != 1.0) probs = probs * routed_scaling_factor_;
  // The (token, slot) choices grouped by expert, tokens ascending within each group (a stable
  // sort of the flat choices), and the groups' sizes read in one transfer: on a device one
  // synchronisation a layer, not one an expert.
  const at::Tensor choices = top_index.flatten();                                     // [N * k]
  const at::Tensor by_expert = std::get<1>(choices.sort(/*stable=*/true, 0, false));  // [N * k]
  const at::Tensor sizes =
      at::bincount(choices, /*weights=*/{}, static_cast<int64_t>(experts_.size())).cpu();
  const at::Tensor tokens = at::div(by_expert, n_expert_per_token_, "trunc");  // [N * k]
  const at::Tensor weights = probs.flatten().index_select(0, by_expert).unsqueeze(-1);
  at::Tensor y = at::zeros_like(flat);
  int64_t start = 0;
  for (int64_t e = 0; e < static_cast<int64_t>(experts_.size()); ++e) {
    const int64_t size = sizes.data_ptr<int64_t>()[e];
    if (size == 0) continue;
    const at::Tensor hits = tokens.narrow(0, start, size);  // [size] token ids, ascending
    y.index_add_(0, hits,
                 weights.narrow(0, start, size) * experts_[e]->forward(flat.index_select(0, hits)));
    start += size;
  }
  y = y.view(x.sizes());
  if (shared_experts_) y = y + shared_experts_->forward(x);
  return y;
}

FeedForwardPtr MakeFeedForward(const Config& config, int64_t layer, const LinearFactory& factory) {
  const bool dense_replaced = config.first_k_dense_replace && layer < *config.first_k_dense_replace;
  if (config.mlp_class == MlpClass::kLLaMAMoE && !dense_replaced) {
    return std::make_shared<MoeImpl>(config, layer, factory);
  }
  const MlpClass kind = dense_replaced ? MlpClass::kLLaMAMLP : config.mlp_class;
  return std::make_shared<MlpImpl>(config, kind, config.IntermediateSize(), layer, -1, factory);
}

}  // namespace lgpt
