#include "core/nn/linear_factory.h"

#include <ATen/ATen.h>

#include "core/ops/gemv.h"

namespace lgpt {

const char* LinearSiteName(LinearSite site) {
  switch (site) {
    case LinearSite::kQkv:
      return "qkv";
    case LinearSite::kAttnProj:
      return "attn.proj";
    case LinearSite::kMlpFc:
      return "mlp.fc";
    case LinearSite::kMlpFc1:
      return "mlp.fc_1";
    case LinearSite::kMlpFc2:
      return "mlp.fc_2";
    case LinearSite::kMlpProj:
      return "mlp.proj";
    case LinearSite::kMoeGate:
      return "mlp.gate";
    case LinearSite::kHead:
      return "lm_head";
  }
  return "?";
}

namespace {
thread_local bool skip_weight_init = false;
}  // namespace

SkipWeightInit::SkipWeightInit() : previous_(skip_weight_init) { skip_weight_init = true; }
SkipWeightInit::~SkipWeightInit() { skip_weight_init = previous_; }

bool WeightInitSkipped() { return skip_weight_init; }

DenseProjectionImpl::DenseProjectionImpl(const LinearSpec& spec) {
  // LitGPT's _init_weights: N(0, 0.02) weights, zero bias. Skipped, the weight's pages are
  // never written, so a checkpoint load does not hold a random copy beside the real one.
  weight = register_parameter(
      "weight", skip_weight_init ? at::empty({spec.out_features, spec.in_features})
                                 : at::randn({spec.out_features, spec.in_features}) * 0.02);
  if (spec.bias) bias = register_parameter("bias", at::zeros({spec.out_features}));
}

at::Tensor DenseProjectionImpl::forward(const at::Tensor& x) {
  // Decoding (few rows, no autograd) is bound by reading the weight: see core/ops/gemv.h.
  if (GemvApplies(x, weight, bias)) return GemvLinear(x, weight, bias);
  return at::linear(x, weight, bias);
}

ProjectionPtr LinearFactory::Make(const LinearSpec& spec) const {
  return std::make_shared<DenseProjectionImpl>(spec);
}

std::shared_ptr<const LinearFactory> DefaultLinearFactory() {
  static const auto* factory = new std::shared_ptr<const LinearFactory>(new LinearFactory());
  return *factory;
}

std::shared_ptr<const LinearFactory> LinearFactoryOrDefault(
    std::shared_ptr<const LinearFactory> factory) {
  return factory != nullptr ? std::move(factory) : DefaultLinearFactory();
}

}  // namespace lgpt
