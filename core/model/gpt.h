// LitGPT's GPT: token embedding (scaled for Gemma), the blocks, the final norm and the
// language-model head with optional final soft-capping. Registered names equal LitGPT's
// state-dict names (transformer.wte, transformer.h.N.*, transformer.ln_f, lm_head).
//
// The KV cache is not part of the model: Forward takes the caller's cache, so one set of
// weights serves many sessions at once.
#ifndef LGPT_CORE_MODEL_GPT_H_
#define LGPT_CORE_MODEL_GPT_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/dense_kv_cache.h"
#include "cache/kv_cache.h"
#include "core/config/config.h"
#include "core/model/block.h"
#include "core/model/model_parts.h"
#include "core/nn/linear_factory.h"
#include "core/nn/norm.h"
#include "core/nn/rope.h"
#include "core/ops/block_quant.h"

namespace lgpt {

struct ForwardOptions {
  // [B, T] int64 token positions; undefined means 0 .. T-1 for every row.
  at::Tensor positions;
  // Compute logits for the last position of each row only (decoding needs nothing else).
  bool last_logits_only = false;
  // The steps (indices along T, ascending) whose logits are wanted, for every row: logits
  // [B, logit_steps.size(), padded_vocab_size]. Empty: every step (or the last, above). A
  // step over several sequences end to end (cache/kv_batch.h) names each one's last token.
  std::vector<int64_t> logit_steps;
  // Instead of logits: the final norm's output [B, T (or as above), n_embd], the hidden states
  // the head reads (embeddings).
  bool hidden_states = false;
  // Per-request adapters (peft/multi_lora.h): the adapter slot of the rows, -1 for the base
  // model; slots are -1 or in [0, GPTImpl::adapter_slots()). Empty: every row uses the base
  // model. One entry: the whole batch. B entries: one per batch row (all its T tokens). B·T
  // entries: one per token, row b's token t at b·T + t (a step of several sequences end to end
  // in one row gives each one's slot over its tokens). The forward pass installs the routing
  // (core/nn/adapter_routing.h) while its layers and head run.
  std::vector<int64_t> adapters;
  // The step's tokens are attended as one-token steps would attend them (KVStep.sequential):
  // speculative verification, whose logits must be those of decoding the tokens one by one.
  bool sequential = false;
};

// transformer.{wte, h, ln_f}
class TransformerImpl : public torch::nn::Module {
 public:
  TransformerImpl(const Config& config, const ModelParts& parts);
  torch::nn::Embedding wte{nullptr};  // [padded_vocab_size, n_embd]
  std::vector<Block> h;
  Norm ln_f{nullptr};  // [n_embd]
};
TORCH_MODULE(Transformer);

class GPTImpl : public torch::nn::Module {
 public:
  // Fails on configs the model cannot build (unsupported features, bad values).
  static absl::StatusOr<std::shared_ptr<GPTImpl>> Create(const Config& config,
                                                         const ModelParts& parts = {});

  // idx [B, T] int64 -> logits [B, T or 1 or logit_steps, padded_vocab_size]. With a cache, the
  // step's keys and values are added to it and attention sees every cached entry; without one, the
  // step attends to itself only (a full forward pass).
  absl::StatusOr<at::Tensor> Forward(const at::Tensor& idx, KVCache* cache = nullptr,
                                     const ForwardOptions& options = {});

  // Forward's pieces, for callers that run one layer at a time (core/train's chunked
  // backward): the token embedding (scaled where the model scales it), one block over x
  // [B, T, n_embd] at step.positions (RoPE tables built for them), and the head (final norm,
  // lm_head, soft-capping). Forward is EmbedTokens, every ForwardBlock, Head. Ids and
  // positions are not checked here.
  at::Tensor EmbedTokens(const at::Tensor& ids);
  absl::StatusOr<at::Tensor> ForwardBlock(int64_t layer, const at::Tensor& x, const KVStep& step,
                                          KVCache* cache);
  at::Tensor Head(const at::Tensor& x);

  // A dense cache shaped for this model (per-layer windows included).
  absl::StatusOr<std::unique_ptr<DenseKVCache>> NewDenseCache(int64_t batch_size,
                                                              int64_t max_sequence_length,
                                                              int64_t initial_capacity = 0);
  std::vector<KVLayerSpec> CacheLayout() const;
  // Keys of `layer` as the KV cache holds them (RoPE applied at positions p), re-rotated to
  // positions p - shift with the layer's RoPE (rotary dims, local or global base, scaling,
  // interleaving); the KeyShifter of caches with cache positions. Models without rotary
  // features return the keys as they are (positions then enter through the mask alone).
  at::Tensor ShiftKeys(int64_t layer, const at::Tensor& keys, int64_t shift) const;

  const Config& config() const { return config_; }
  // The adapter slots ForwardOptions.adapters may name: its linear factory's AdapterSlots()
  // (0: a single model).
  int64_t adapter_slots() const { return adapter_slots_; }
  c10::Device device() const;
  c10::ScalarType dtype() const;

  // Moves parameters (and the RoPE frequency tables) to a device and dtype.
  void To(c10::Device device, c10::ScalarType dtype);

  // Replaces the token embedding by a block-quantised table [padded_vocab_size, n_embd]
  // (possibly the quantised lm_head of a tied model); the float table is freed, its
  // parameter stays registered, empty. Lookups dequantise only the rows they read.
  // InvalidArgument on a table of another shape.
  absl::Status SetQuantizedEmbedding(BlockQuantWeight table);
  const BlockQuantWeight& quantized_embedding() const { return quantized_wte_; }

  Transformer transformer{nullptr};
  ProjectionPtr lm_head;  // [padded_vocab_size, n_embd]

 private:
  GPTImpl(const Config& config, const ModelParts& parts);
  absl::StatusOr<at::Tensor> ForwardUnchecked(const at::Tensor& idx, KVCache* cache,
                                              const ForwardOptions& options);

  // ids [B, T] -> [B, T, n_embd] in the model's dtype.
  at::Tensor Embed(const at::Tensor& ids);

  Config config_;
  std::unique_ptr<Rope> rope_;
  BlockQuantWeight quantized_wte_;  // undefined unless the embedding is quantised
  std::shared_ptr<const KVScoreReducer> kv_score_reducer_;  // ModelParts::kv_score_reducer
  int64_t adapter_slots_ = 0;
};
using GPT = std::shared_ptr<GPTImpl>;

}  // namespace lgpt

#endif  // LGPT_CORE_MODEL_GPT_H_
