// The linear-factory seam: every projection of the model is created through a
// LinearFactory, so PEFT variants (LoRA, adapter v2) and quantised weights replace
// projections without touching model code. The base factory makes plain projections whose
// parameters are named as LitGPT's nn.Linear ("weight", "bias").
#ifndef LGPT_CORE_NN_LINEAR_FACTORY_H_
#define LGPT_CORE_NN_LINEAR_FACTORY_H_

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>

namespace lgpt {

// The role a projection plays, so a factory can choose per site.
enum class LinearSite {
  kQkv,       // attn.qkv: fused [Q | K | V]
  kAttnProj,  // attn.proj
  kMlpFc,     // GptNeoxMLP fc
  kMlpFc1,    // LLaMAMLP / GemmaMLP fc_1 (gate)
  kMlpFc2,    // LLaMAMLP / GemmaMLP fc_2 (up)
  kMlpProj,   // MLP proj (down)
  kMoeGate,   // LLaMAMoE router
  kHead,      // lm_head
};

const char* LinearSiteName(LinearSite site);

struct LinearSpec {
  LinearSite site = LinearSite::kHead;
  int64_t layer = -1;   // Block index; -1 outside blocks.
  int64_t expert = -1;  // MoE expert index; -1 otherwise, -2 for shared experts.
  int64_t in_features = 0;
  int64_t out_features = 0;
  bool bias = false;
  // For kQkv: widths of the Q and of each of K and V inside out_features.
  int64_t q_size = 0;
  int64_t kv_size = 0;
};

// A projection y = f(x) from [..., in_features] to [..., out_features].
// Decorators (LoRA, adapter v2) wrap any projection, so they read the base's weight through
// DenseWeight() instead of assuming a dense one.
class ProjectionImpl : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& x) = 0;
  // The weight [out_features, in_features] this projection computes with, as a detached
  // float tensor of the model's dtype (dequantised for int8); undefined where there is none.
  virtual at::Tensor DenseWeight() const { return at::Tensor(); }
  // Its bias [out_features], detached; undefined without one.
  virtual at::Tensor DenseBias() const { return at::Tensor(); }
  // The projection this one computes through without holding it as a submodule (a
  // row-parallel shard keeps LitGPT's flat parameter names), for passes over a model's
  // projections such as weight quantisation; null for the others.
  virtual ProjectionImpl* flat_inner() const { return nullptr; }
};
using ProjectionPtr = std::shared_ptr<ProjectionImpl>;

// While one is alive (on this thread), new DenseProjections and token embeddings leave their
// weights uninitialised (pages never written): for building a model whose every weight is
// loaded right after, or whose parameters are only counted.
class SkipWeightInit {
 public:
  SkipWeightInit();
  ~SkipWeightInit();
  SkipWeightInit(const SkipWeightInit&) = delete;
  SkipWeightInit& operator=(const SkipWeightInit&) = delete;

 private:
  bool previous_;
};

// Whether a SkipWeightInit is alive on this thread.
bool WeightInitSkipped();

// Plain affine projection, LitGPT's nn.Linear.
class DenseProjectionImpl : public ProjectionImpl {
 public:
  explicit DenseProjectionImpl(const LinearSpec& spec);
  at::Tensor forward(const at::Tensor& x) override;
  at::Tensor DenseWeight() const override { return weight.detach(); }
  at::Tensor DenseBias() const override { return bias.defined() ? bias.detach() : bias; }

  at::Tensor weight;  // [out_features, in_features]
  at::Tensor bias;    // [out_features]; undefined without bias
};

class LinearFactory {
 public:
  virtual ~LinearFactory() = default;
  virtual ProjectionPtr Make(const LinearSpec& spec) const;
  // How many per-request adapter slots the projections it makes serve (core/nn/
  // adapter_routing.h, peft/multi_lora.h): a forward pass's rows may pick slots [0, this) or
  // -1 (the base model). 0 for factories of single-model projections.
  virtual int64_t AdapterSlots() const { return 0; }
};

// The factory of the base model.
std::shared_ptr<const LinearFactory> DefaultLinearFactory();

// `factory`, or DefaultLinearFactory() when it is null (ModelParts and the wrapping factories
// take null for plain projections): the one place a missing factory is resolved.
std::shared_ptr<const LinearFactory> LinearFactoryOrDefault(
    std::shared_ptr<const LinearFactory> factory);

}  // namespace lgpt

#endif  // LGPT_CORE_NN_LINEAR_FACTORY_H_
