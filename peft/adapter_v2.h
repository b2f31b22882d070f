// LLaMA-Adapter v2 by composition: every projection becomes scale · (linear(x) + bias)
// through the linear factory, on top of the adapter prefix extension; the norms are
// trainable too. Parameter names equal LitGPT's (`linear.weight`, `adapter_bias`,
// `adapter_scale`).
#ifndef LGPT_PEFT_ADAPTER_V2_H_
#define LGPT_PEFT_ADAPTER_V2_H_

#include <memory>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "core/config/config.h"
#include "core/nn/linear_factory.h"
#include "core/model/gpt.h"
#include "core/model/model_parts.h"
#include "core/io/tensor_map.h"

namespace lgpt {

// scale · (linear(x) + bias) over any base projection `linear`.
class AdapterV2ProjectionImpl : public ProjectionImpl {
 public:
  AdapterV2ProjectionImpl(const LinearSpec& spec, ProjectionPtr base);
  at::Tensor forward(const at::Tensor& x) override;

  ProjectionPtr linear;  // the base projection, LitGPT's `linear`
  at::Tensor adapter_bias;   // [out_features], zero-initialised
  at::Tensor adapter_scale;  // [out_features], one-initialised
};

// Decorates every projection `base` makes (dense by default, int8, ...).
class AdapterV2LinearFactory : public LinearFactory {
 public:
  explicit AdapterV2LinearFactory(
      std::shared_ptr<const LinearFactory> base = DefaultLinearFactory())
      : base_(std::move(base)) {}
  ProjectionPtr Make(const LinearSpec& spec) const override;

 private:
  std::shared_ptr<const LinearFactory> base_;
};

absl::StatusOr<ModelParts> AdapterV2Parts(const Config& config, bool legacy_qkv_split = false);
absl::StatusOr<GPT> CreateAdapterV2GPT(const Config& config, bool legacy_qkv_split = false);
// A plain base-model state dict with scale and bias folded into each linear:
// W' = diag(scale) · W, b' = scale · (b + adapter_bias). Fails where a linear without a bias
// has a non-zero adapter_bias (the base model has no slot for it).
absl::StatusOr<TensorMap> FoldedAdapterV2StateDict(GPTImpl& model);

}  // namespace lgpt

#endif  // LGPT_PEFT_ADAPTER_V2_H_
