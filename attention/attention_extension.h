// The attention-extension seam: a hook through which a variant (the LLaMA-Adapter prefix,
// a memory or sink-token scheme) adds to what an attention layer computes, so the base
// attention knows nothing of the variants.
#ifndef LGPT_ATTENTION_ATTENTION_EXTENSION_H_
#define LGPT_ATTENTION_ATTENTION_EXTENSION_H_

#include <memory>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "core/ops/attention.h"
#include "core/config/config.h"
#include "core/nn/linear_factory.h"

namespace lgpt {

// What an extension sees of one attention call.
struct AttentionExtensionInputs {
  at::Tensor q;                  // [B, n_head, T, head_size], after q-norm and RoPE
  ProjectionImpl* qkv = nullptr;  // the layer's fused projection, to project extra tokens
  const AttentionParams* params = nullptr;  // the layer's scale, softcap and window
};

// One layer's extension.
class AttentionExtension {
 public:
  virtual ~AttentionExtension() = default;
  // Registers the extension's parameters on the layer's attention module under LitGPT's
  // names (e.g. "adapter_wte", "gating_factor"), so state dicts map one to one.
  virtual void Attach(torch::nn::Module& attention) {}
  // An addition to the attention output [B, n_head, T, head_size], or an undefined tensor.
  virtual at::Tensor Contribute(const AttentionExtensionInputs& inputs) = 0;
};

class AttentionExtensionFactory {
 public:
  virtual ~AttentionExtensionFactory() = default;
  // The extension for `layer`, or null where this variant leaves the layer alone.
  virtual std::shared_ptr<AttentionExtension> Make(const Config& config,
                                                   int64_t layer) const = 0;
};

}  // namespace lgpt

#endif  // LGPT_ATTENTION_ATTENTION_EXTENSION_H_
