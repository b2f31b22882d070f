// LLaMA-Adapter by composition: an attention extension that adds, from
// `adapter_start_layer` on, gated attention over a learned prefix of
// `adapter_prompt_length` tokens. The prefix keys and values come from the layer's own QKV
// projection, without RoPE, and are computed once and reused by every step (recomputed
// only while training or after the weights change).
//
// Layout: lgpt splits the prefix projection as the model does, [Q | K | V]. LitGPT's
// adapter.py still splits it in the old per-group interleaved layout ([q.. k v] per query
// group); `legacy_qkv_split` reproduces that to load LitGPT adapter checkpoints faithfully.
#ifndef LGPT_PEFT_ADAPTER_H_
#define LGPT_PEFT_ADAPTER_H_

#include <memory>

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/embedding.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "attention/attention_extension.h"
#include "core/config/config.h"
#include "core/model/gpt.h"
#include "core/model/model_parts.h"

namespace lgpt {

struct AdapterOptions {
  int64_t prompt_length = 10;  // LitGPT's defaults
  int64_t start_layer = 2;
  bool legacy_qkv_split = false;

  static AdapterOptions FromConfig(const Config& config);
  absl::Status Validate(const Config& config) const;
};

class AdapterPrefix : public AttentionExtension {
 public:
  AdapterPrefix(const Config& config, const AdapterOptions& options);
  void Attach(torch::nn::Module& attention) override;
  at::Tensor Contribute(const AttentionExtensionInputs& inputs) override;

 private:
  // Prefix keys and values, each [1, n_query_groups, prompt_length, head_size].
  std::pair<at::Tensor, at::Tensor> PrefixKeysValues(ProjectionImpl& qkv);

  int64_t n_embd_, n_head_, n_query_groups_, head_size_;
  AdapterOptions options_;
  torch::nn::Embedding adapter_wte{nullptr};  // [prompt_length, n_embd]
  at::Tensor gating_factor;                   // [1, 1, n_head, 1], zero-initialised
  // Concurrent sessions share the model: the prefix cache is guarded.
  absl::Mutex mutex_;
  at::Tensor cached_keys_ ABSL_GUARDED_BY(mutex_);    // [1, G, prompt_length, hs]
  at::Tensor cached_values_ ABSL_GUARDED_BY(mutex_);  // [1, G, prompt_length, hs]
  int64_t cached_fingerprint_ ABSL_GUARDED_BY(mutex_) = -1;
};

class AdapterExtensionFactory : public AttentionExtensionFactory {
 public:
  explicit AdapterExtensionFactory(const AdapterOptions& options) : options_(options) {}
  std::shared_ptr<AttentionExtension> Make(const Config& config, int64_t layer) const override;

 private:
  AdapterOptions options_;
};

absl::StatusOr<ModelParts> AdapterParts(const Config& config, bool legacy_qkv_split = false);
absl::StatusOr<GPT> CreateAdapterGPT(const Config& config, bool legacy_qkv_split = false);

}  // namespace lgpt

#endif  // LGPT_PEFT_ADAPTER_H_
