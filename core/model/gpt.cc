#include "core/model/gpt.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/modules/container/modulelist.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/device.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "core/nn/adapter_routing.h"
#include "core/ops/block_quant_device.h"

namespace lgpt {
namespace {

// Smallest and largest of an int64 tensor; a plain loop for the few ids of a decode step on
// the CPU (four LibTorch operations and two synchronisations otherwise).
std::pair<int64_t, int64_t> MinMax(const at::Tensor& values) {
  if (values.device().is_cpu() && values.is_contiguous() && values.numel() <= 4096) {
    const int64_t* v = values.data_ptr<int64_t>();
    int64_t lowest = v[0], highest = v[0];
    for (int64_t i = 1; i < values.numel(); ++i) {
      lowest = std::min(lowest, v[i]);
      highest = std::max(highest, v[i]);
    }
    return {lowest, highest};
  }
  // On a device: both in one transfer (one synchronisation).
  const at::Tensor both = at::stack({values.min(), values.max()}).cpu();
  return {both[0].item<int64_t>(), both[1].item<int64_t>()};
}

// ForwardOptions.logit_steps: ascending steps of [0, steps), not beside last_logits_only.
absl::Status CheckLogitSteps(const ForwardOptions& options, int64_t steps) {
  const std::vector<int64_t>& wanted = options.logit_steps;
  if (wanted.empty()) return absl::OkStatus();
  if (options.last_logits_only) {
    return absl::InvalidArgumentError(
        "ForwardOptions.logit_steps and last_logits_only are exclusive");
  }
  for (size_t i = 0; i < wanted.size(); ++i) {
    if (wanted[i] < 0 || wanted[i] >= steps || (i > 0 && wanted[i] <= wanted[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat("ForwardOptions.logit_steps[", i, "] (",
                                                     wanted[i], ") must be ascending in [0, ",
                                                     steps, ")"));
    }
  }
  return absl::OkStatus();
}

// The routing of ForwardOptions.adapters over a [batch, steps] forward pass of a model with
// `slots` adapter slots.
absl::StatusOr<AdapterRouting> RoutingOf(const std::vector<int64_t>& adapters, int64_t slots,
                                         int64_t batch, int64_t steps, c10::Device device) {
  constexpr char kField[] = "ForwardOptions.adapters";
  if (adapters.empty()) return AdapterRouting();
  for (size_t i = 0; i < adapters.size(); ++i) {
    if (adapters[i] < -1 || adapters[i] >= slots) {
      return InvalidFieldError(
          kField, absl::StrCat(kField, "[", i, "] is ", adapters[i], ": ",
                               slots == 0 ? "the model serves no adapters (only -1, the base model)"
                                          : absl::StrCat("the model's adapter slots are [0, ",
                                                         slots, "), or -1 for the base model")));
    }
  }
  const int64_t given = static_cast<int64_t>(adapters.size());
  if (given == 1) return AdapterRouting::Uniform(adapters[0]);
  if (given == batch * steps) return AdapterRouting::PerRow(adapters, device);
  if (given == batch) {
    std::vector<int64_t> per_token;
    per_token.reserve(static_cast<size_t>(batch * steps));
    for (int64_t slot : adapters)
      per_token.insert(per_token.end(), static_cast<size_t>(steps), slot);
    return AdapterRouting::PerRow(std::move(per_token), device);
  }
  return InvalidFieldError(
      kField, absl::StrCat(kField, " has ", given, " entries for ids [", batch, ", ", steps,
                           "]: give 1 (the batch), ", batch, " (a row each) or ", batch * steps,
                           " (a token each)"));
}

}  // namespace

TransformerImpl::TransformerImpl(const Config& config, const ModelParts& parts) {
  // LitGPT's _init_weights: N(0, 0.02); none under SkipWeightInit (a 128k x 16k table is
  // 8.4 GB of pages written twice, by Embedding's own init and this one, for nothing).
  torch::nn::EmbeddingOptions embedding(config.PaddedVocabSize(), config.n_embd);
  if (WeightInitSkipped()) embedding._weight(at::empty({config.PaddedVocabSize(), config.n_embd}));
  wte = register_module("wte", torch::nn::Embedding(embedding));
  if (!WeightInitSkipped()) wte->weight.data().normal_(0, 0.02);
  torch::nn::ModuleList blocks;
  for (int64_t layer = 0; layer < config.n_layer; ++layer) {
    h.push_back(Block(config, layer, parts));
    blocks->push_back(h.back());
  }
  register_module("h", blocks);
  ln_f = register_module("ln_f", Norm(NormOptions::FromConfig(config, config.n_embd)));
}

absl::StatusOr<GPT> GPTImpl::Create(const Config& config, const ModelParts& parts) {
  Config finalised = config;
  RETURN_IF_ERROR(finalised.Finalize());
  if (finalised.has_latent_attention) {
    return absl::UnimplementedError(
        absl::StrCat(finalised.name, ": multi-head latent attention is not supported"));
  }
  if (finalised.n_expert_groups) {
    return absl::UnimplementedError(
        absl::StrCat(finalised.name, ": grouped top-k expert routing is not supported"));
  }
  return GPT(new GPTImpl(finalised, parts));
}

GPTImpl::GPTImpl(const Config& config, const ModelParts& parts)
    : config_(config), kv_score_reducer_(parts.kv_score_reducer) {
  transformer = register_module("transformer", Transformer(config, parts));
  LinearSpec head;
  head.site = LinearSite::kHead;
  head.in_features = config.n_embd;
  head.out_features = config.PaddedVocabSize();
  head.bias = config.lm_head_bias;
  const std::shared_ptr<const LinearFactory> factory = LinearFactoryOrDefault(parts.linear_factory);
  lm_head = register_module("lm_head", factory->Make(head));
  adapter_slots_ = factory->AdapterSlots();
  rope_ = std::make_unique<Rope>(config_, c10::Device(c10::kCPU));
}

c10::Device GPTImpl::device() const { return transformer->wte->weight.device(); }
c10::ScalarType GPTImpl::dtype() const { return transformer->wte->weight.scalar_type(); }

void GPTImpl::To(c10::Device device, c10::ScalarType dtype) {
  to(device, dtype);  // block-quantised projections move their tiles too (their to())
  quantized_wte_ = BlockQuantWeightTo(quantized_wte_, device);
  rope_ = std::make_unique<Rope>(config_, device);
}

absl::Status GPTImpl::SetQuantizedEmbedding(BlockQuantWeight table) {
  if (!table.defined() || table.out_features != config_.PaddedVocabSize() ||
      table.in_features != config_.n_embd) {
    return absl::InvalidArgumentError(
        absl::StrCat("quantised embedding must be [", config_.PaddedVocabSize(), ", ",
                     config_.n_embd, "], got [", table.out_features, ", ", table.in_features, "]"));
  }
  absl::Status well_formed = CheckBlockQuantWeight(table);
  if (!well_formed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("quantised embedding: ", well_formed.message()));
  }
  // Where the model is (a quantised checkpoint's table is read on the CPU).
  quantized_wte_ = BlockQuantWeightTo(table, transformer->wte->weight.device());
  at::NoGradGuard no_grad;
  at::Tensor& weight = transformer->wte->weight;
  weight.set_data(at::empty({0}, weight.options()));
  return absl::OkStatus();
}

at::Tensor GPTImpl::Embed(const at::Tensor& ids) {
  if (!quantized_wte_.defined()) return transformer->wte->forward(ids);
  std::vector<int64_t> shape = ids.sizes().vec();
  shape.push_back(config_.n_embd);
  return DequantizeBlockRows(quantized_wte_, ids).view(shape).to(ids.device(), dtype());
}

std::vector<KVLayerSpec> GPTImpl::CacheLayout() const {
  std::vector<KVLayerSpec> layers;
  for (int64_t layer = 0; layer < config_.n_layer; ++layer) {
    KVLayerSpec spec;
    spec.n_query_groups = config_.QueryGroups();
    spec.head_size = config_.HeadSize();
    if (config_.IsSlidingWindowLayer(layer)) spec.sliding_window = *config_.sliding_window_size;
    spec.score_reducer = kv_score_reducer_;
    layers.push_back(spec);
  }
  return layers;
}

at::Tensor GPTImpl::ShiftKeys(int64_t layer, const at::Tensor& keys, int64_t shift) const {
  if (rope_->n_elem() == 0 || shift == 0) return keys;
  const at::Tensor delta =
      at::full({1, 1}, -shift, at::TensorOptions().dtype(at::kLong).device(keys.device()));
  const bool local = config_.UsesLocalRope(layer) && rope_->has_local();
  // Roped keys are already in half-split order (the interleaved layout is gathered into
  // halves when RoPE is applied), so the shift rotates them half-split, whatever the config.
  return ApplyRope(keys, rope_->RotationTables(delta, local), /*interleave=*/false);
}

absl::StatusOr<std::unique_ptr<DenseKVCache>> GPTImpl::NewDenseCache(int64_t batch_size,
                                                                     int64_t max_sequence_length,
                                                                     int64_t initial_capacity) {
  if (max_sequence_length > config_.block_size) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache length ", max_sequence_length,
                                                   " exceeds the block size ", config_.block_size,
                                                   " of ", config_.name));
  }
  DenseKVCacheOptions options;
  options.batch_size = batch_size;
  options.max_sequence_length = max_sequence_length;
  options.layers = CacheLayout();
  options.dtype = dtype();
  options.device = device();
  options.initial_capacity = initial_capacity;
  return DenseKVCache::Create(options);
}

absl::StatusOr<at::Tensor> GPTImpl::Forward(const at::Tensor& idx, KVCache* cache,
                                            const ForwardOptions& options) {
  // LibTorch reports failures (out of memory, unsupported dtype on a device) by throwing;
  // callers get a Status instead.
  try {
    return ForwardUnchecked(idx, cache, options);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("forward pass failed: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("forward pass failed: ", e.what()));
  }
}

absl::StatusOr<at::Tensor> GPTImpl::ForwardUnchecked(const at::Tensor& idx, KVCache* cache,
                                                     const ForwardOptions& options) {
  if (idx.dim() != 2 || idx.size(0) < 1 || idx.size(1) < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token ids must have shape [B, T] with B, T >= 1; got ", idx.dim(), " dimensions"));
  }
  if (idx.scalar_type() != at::kLong) {
    return absl::InvalidArgumentError("token ids must be int64");
  }
  const int64_t batch = idx.size(0), steps = idx.size(1);
  {
    // Checked where the caller's ids are (host ids: no device synchronisation).
    const auto [lowest, highest] = MinMax(idx);
    if (lowest < 0 || highest >= config_.PaddedVocabSize()) {
      return absl::OutOfRangeError(absl::StrCat("token id ", lowest < 0 ? lowest : highest,
                                                " is outside the vocabulary [0, ",
                                                config_.PaddedVocabSize(), ")"));
    }
  }
  const at::Tensor ids = ToDeviceQueued(idx, device());
  RETURN_IF_ERROR(CheckLogitSteps(options, steps));
  KVStep step;
  if (options.positions.defined()) {
    if (options.positions.dim() != 2 || options.positions.size(0) != batch ||
        options.positions.size(1) != steps || options.positions.scalar_type() != at::kLong) {
      return absl::InvalidArgumentError(
          absl::StrCat("positions must be int64 [", batch, ", ", steps, "] like the token ids"));
    }
    std::tie(step.min_position, step.max_position) = MinMax(options.positions);
    step.positions = ToDeviceQueued(options.positions, device());
  } else {
    step.positions = at::arange(steps, ids.options()).unsqueeze(0).expand({batch, steps});
    step.min_position = 0;
    step.max_position = steps - 1;
  }
  step.sequential = options.sequential;
  if (step.min_position < 0 || step.max_position >= config_.block_size) {
    return absl::OutOfRangeError(
        absl::StrCat("position ", step.min_position < 0 ? step.min_position : step.max_position,
                     " is outside the model's context [0, ", config_.block_size, ")"));
  }
  if (cache != nullptr) {
    if (cache->num_layers() != config_.n_layer) {
      return absl::InvalidArgumentError(absl::StrCat("KV cache has ", cache->num_layers(),
                                                     " layers, the model ", config_.n_layer));
    }
    RETURN_IF_ERROR(cache->CheckStep(step, batch));
  }

  ASSIGN_OR_RETURN(const AdapterRouting routing,
                   RoutingOf(options.adapters, adapter_slots_, batch, steps, device()));
  const ScopedAdapterRouting routed(&routing);

  const RopeTables global = rope_->Tables(step.positions, /*local=*/false);
  const RopeTables local = rope_->has_local() ? rope_->Tables(step.positions, true) : global;
  at::Tensor x = EmbedTokens(ids);  // [B, T, n_embd]
  for (int64_t layer = 0; layer < config_.n_layer; ++layer) {
    const RopeTables& rope = config_.UsesLocalRope(layer) ? local : global;
    ASSIGN_OR_RETURN(x, transformer->h[layer]->Forward(x, rope, step, cache));
  }
  std::vector<int64_t> kept_steps;  // empty: every step
  if (options.last_logits_only) {
    x = x.narrow(1, steps - 1, 1);
    kept_steps = {steps - 1};
  } else if (!options.logit_steps.empty()) {
    x = x.index_select(1, ToDeviceQueued(at::tensor(options.logit_steps, at::kLong), x.device()));
    kept_steps = options.logit_steps;
  }
  if (options.hidden_states) return transformer->ln_f->forward(x);
  if (routing.rows() < 0 || kept_steps.empty()) return Head(x);
  // The head sees only the kept steps' rows: their slots, in the same order.
  std::vector<int64_t> kept_rows;
  kept_rows.reserve(static_cast<size_t>(batch) * kept_steps.size());
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t : kept_steps) kept_rows.push_back(b * steps + t);
  }
  const AdapterRouting head_routing = routing.Select(kept_rows, device());
  const ScopedAdapterRouting head_routed(&head_routing);
  return Head(x);
}

at::Tensor GPTImpl::EmbedTokens(const at::Tensor& ids) {
  at::Tensor x = Embed(ids);  // [B, T, n_embd]
  if (config_.scale_embeddings) {
    x = x * at::scalar_tensor(std::sqrt(static_cast<double>(config_.n_embd)), x.options());
  }
  return x;
}

absl::StatusOr<at::Tensor> GPTImpl::ForwardBlock(int64_t layer, const at::Tensor& x,
                                                 const KVStep& step, KVCache* cache) {
  if (layer < 0 || layer >= config_.n_layer) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " is outside the model's [0, ", config_.n_layer, ")"));
  }
  const bool local = config_.UsesLocalRope(layer) && rope_->has_local();
  return transformer->h[layer]->Forward(x, rope_->Tables(step.positions, local), step, cache);
}

at::Tensor GPTImpl::Head(const at::Tensor& x) {
  at::Tensor logits = lm_head->forward(transformer->ln_f->forward(x));
  if (config_.final_logit_softcapping) {
    const double cap = *config_.final_logit_softcapping;
    logits = at::tanh(logits / cap) * cap;
  }
  return logits;
}

}  // namespace lgpt
