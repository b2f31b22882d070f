#include "peft/adapter.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/ops/attention.h"

namespace lgpt {

AdapterOptions AdapterOptions::FromConfig(const Config& config) {
  AdapterOptions options;
  if (config.adapter_prompt_length) options.prompt_length = *config.adapter_prompt_length;
  if (config.adapter_start_layer) options.start_layer = *config.adapter_start_layer;
  return options;
}

absl::Status AdapterOptions::Validate(const Config& config) const {
  if (prompt_length < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("adapter_prompt_length must be >= 1, got ", prompt_length));
  }
  if (start_layer < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("adapter_start_layer must be >= 0, got ", start_layer));
  }
  return absl::OkStatus();
}

AdapterPrefix::AdapterPrefix(const Config& config, const AdapterOptions& options)
    : n_embd_(config.n_embd),
      n_head_(config.n_head),
      n_query_groups_(config.QueryGroups()),
      head_size_(config.HeadSize()),
      options_(options) {}

void AdapterPrefix::Attach(torch::nn::Module& attention) {
  adapter_wte = attention.register_module("adapter_wte",
                                          torch::nn::Embedding(options_.prompt_length, n_embd_));
  gating_factor = attention.register_parameter("gating_factor", at::zeros({1, 1, n_head_, 1}));
}

std::pair<at::Tensor, at::Tensor> AdapterPrefix::PrefixKeysValues(ProjectionImpl& qkv) {
  // The prefix only changes with the weights: a fingerprint of their versions decides reuse.
  int64_t fingerprint = adapter_wte->weight._version();
  for (const at::Tensor& p : qkv.parameters()) fingerprint = fingerprint * 31 + p._version();
  absl::MutexLock lock(&mutex_);
  const bool reusable = !at::GradMode::is_enabled() && cached_keys_.defined() &&
                        fingerprint == cached_fingerprint_ &&
                        cached_keys_.device() == adapter_wte->weight.device() &&
                        cached_keys_.scalar_type() == adapter_wte->weight.scalar_type();
  if (reusable) return {cached_keys_, cached_values_};

  const int64_t length = options_.prompt_length;
  const at::Tensor projected = qkv.forward(adapter_wte->weight.unsqueeze(0));  // [1, P, ·]
  at::Tensor keys, values;
  if (options_.legacy_qkv_split) {
    const int64_t q_per_kv = n_head_ / n_query_groups_;
    const at::Tensor grouped =
        projected.view({1, length, n_query_groups_, q_per_kv + 2, head_size_});
    keys = grouped.select(3, q_per_kv).permute({0, 2, 1, 3});
    values = grouped.select(3, q_per_kv + 1).permute({0, 2, 1, 3});
  } else {
    const int64_t q_size = n_head_ * head_size_, kv_size = n_query_groups_ * head_size_;
    keys = projected.narrow(-1, q_size, kv_size)
               .reshape({1, length, n_query_groups_, head_size_})
               .transpose(1, 2);
    values = projected.narrow(-1, q_size + kv_size, kv_size)
                 .reshape({1, length, n_query_groups_, head_size_})
                 .transpose(1, 2);
  }
  // Contiguous on every call, so the first call and the cached ones take the same attention
  // kernel (and give the same bits).
  keys = keys.contiguous();
  values = values.contiguous();
  if (!at::GradMode::is_enabled()) {
    cached_keys_ = keys;
    cached_values_ = values;
    cached_fingerprint_ = fingerprint;
  }
  return {keys, values};
}

at::Tensor AdapterPrefix::Contribute(const AttentionExtensionInputs& inputs) {
  const auto [keys, values] = PrefixKeysValues(*inputs.qkv);
  const int64_t batch = inputs.q.size(0), steps = inputs.q.size(2);
  const int64_t length = options_.prompt_length;
  // Every query sees the whole prefix: prefix keys sit at position 0, before any query.
  AttentionParams params = *inputs.params;
  params.sliding_window = 0;
  const at::Tensor query_positions =
      at::zeros({batch, steps}, at::TensorOptions().dtype(at::kLong).device(inputs.q.device()));
  const at::Tensor key_positions =
      at::zeros({batch, 1, length}, at::TensorOptions().dtype(at::kLong).device(inputs.q.device()));
  const at::Tensor prefix_out =
      AttendByPositions(inputs.q, keys.expand({batch, -1, -1, -1}),
                        values.expand({batch, -1, -1, -1}), query_positions, key_positions, params);
  return gating_factor.view({1, n_head_, 1, 1}) * prefix_out;  // [B, n_head, T, hs]
}

std::shared_ptr<AttentionExtension> AdapterExtensionFactory::Make(const Config& config,
                                                                  int64_t layer) const {
  if (layer < options_.start_layer) return nullptr;
  return std::make_shared<AdapterPrefix>(config, options_);
}

absl::StatusOr<ModelParts> AdapterParts(const Config& config, bool legacy_qkv_split) {
  AdapterOptions options = AdapterOptions::FromConfig(config);
  options.legacy_qkv_split = legacy_qkv_split;
  RETURN_IF_ERROR(options.Validate(config));
  ModelParts parts;
  parts.attention_extensions.push_back(std::make_shared<AdapterExtensionFactory>(options));
  return parts;
}

absl::StatusOr<GPT> CreateAdapterGPT(const Config& config, bool legacy_qkv_split) {
  ASSIGN_OR_RETURN(ModelParts parts, AdapterParts(config, legacy_qkv_split));
  return GPTImpl::Create(config, parts);
}

}  // namespace lgpt
