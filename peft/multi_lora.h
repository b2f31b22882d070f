// Per-request LoRA (S-LoRA, Punica): several LoRA adapters over one base model, each request
// picking one (or none), and requests of different adapters sharing one forward pass. Every
// projection runs its base (dense, int8 or int4) once over all rows, then adds, for each
// adapter that some rows use, scaling_k · B_k·A_k·x on those rows only: the rows are gathered,
// go through the two small products and are added back (index_add). Rows of the base model
// are untouched; when every row uses one adapter nothing is gathered.
//
// Which rows use which adapter is the forward pass's AdapterRouting (core/nn/adapter_routing.h),
// set from ForwardOptions.adapters (SequenceChunk.adapter in ForwardChunks,
// GenerateOptions.adapter, BatchGenerateOptions.adapters): adapter k is slot k.
//
// Adapters are independent: each has its own rank, alpha, scale and targets, and one may leave
// a site alone (rank 0 there). A row of adapter k computes what adapter k's LoRA model alone
// computes (peft/lora.h), up to the rounding of the update.
//
// Names: the base projection is `linear` as in LitGPT's LoRA (`qkv.linear.weight`, so base
// checkpoints load through BaseParameterName), slot k's pair is `slot<k>`
// (`qkv.slot1.lora_A`, `qkv.slot1.lora_B`: adapter 1's file names it `qkv.lora_A`).
//
// For inference: dropout is not applied, and the updates are added in place to the base's
// output.
#ifndef LGPT_PEFT_MULTI_LORA_H_
#define LGPT_PEFT_MULTI_LORA_H_

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/config/config.h"
#include "core/model/gpt.h"
#include "core/model/model_parts.h"
#include "core/nn/linear_factory.h"
#include "peft/lora.h"

namespace lgpt {

// One adapter's low-rank pair at one site: a LoraProjection's lora_A and lora_B without the
// base. Rank 0 (the adapter leaves the site alone): no parameters, no update.
class LoraSlotImpl : public torch::nn::Module {
 public:
  LoraSlotImpl(const LinearSpec& spec, const LoraOptions& options);

  // y [rows, out_features] += scaling · B·A·x for x [n, in_features]: into y's rows `rows`
  // ([n] int64), or into every row when `rows` is undefined (n == rows).
  void AddUpdate(const at::Tensor& x, at::Tensor& y, const at::Tensor& rows) const;
  // scaling · B·A laid out like the base weight, [out_features, in_features] float32 on the
  // CPU.
  at::Tensor DeltaWeight() const;

  int64_t rank() const { return r_; }
  double scaling() const { return scaling_; }

  at::Tensor lora_A;  // [r · enabled parts, in_features]; undefined at rank 0
  at::Tensor lora_B;  // [sum of enabled part widths, r]; undefined at rank 0

 private:
  int64_t r_;
  int64_t in_features_, out_features_;
  double scaling_;
  std::vector<std::pair<int64_t, int64_t>> parts_;  // (offset, width) in out_features
};

// y = linear(x) + scaling_k · B_k·A_k·x on the rows routed to slot k, for every slot k.
class MultiLoraProjectionImpl : public ProjectionImpl {
 public:
  // Slot k adapts the site as adapters[k] says (LoraEnabledParts; rank 0 where it does not).
  MultiLoraProjectionImpl(const LinearSpec& spec, ProjectionPtr base,
                          const std::vector<LoraOptions>& adapters);
  // x [..., in_features] -> [..., out_features], routed by CurrentAdapterRouting(): none or
  // base_only, the base alone. A per-row routing must describe x's flattened rows.
  at::Tensor forward(const at::Tensor& x) override;
  // The base model's weight and bias (no slot's update).
  at::Tensor DenseWeight() const override { return linear->DenseWeight(); }
  at::Tensor DenseBias() const override { return linear->DenseBias(); }

  int64_t slots() const { return static_cast<int64_t>(slots_.size()); }
  const LoraSlotImpl& slot(int64_t k) const;
  LoraSlotImpl& slot(int64_t k);

  ProjectionPtr linear;  // the base projection, LitGPT's `linear`

 private:
  int64_t in_features_, out_features_;
  std::vector<std::shared_ptr<LoraSlotImpl>> slots_;
};

// Decorates every projection `base` makes with one slot per adapter; AdapterSlots() is the
// number of adapters.
class MultiLoraLinearFactory : public LinearFactory {
 public:
  explicit MultiLoraLinearFactory(std::vector<LoraOptions> adapters,
                                  std::shared_ptr<const LinearFactory> base = nullptr)
      : adapters_(std::move(adapters)), base_(LinearFactoryOrDefault(std::move(base))) {}
  ProjectionPtr Make(const LinearSpec& spec) const override;
  int64_t AdapterSlots() const override { return static_cast<int64_t>(adapters_.size()); }

 private:
  std::vector<LoraOptions> adapters_;
  std::shared_ptr<const LinearFactory> base_;
};

// OK when `adapter` can be a slot of a multi-adapter model of `config`: valid options
// (LoraOptions::Validate), rank <= n_embd, and no update on MoE experts (the experts see only
// their tokens' rows; Unimplemented).
absl::Status CheckMultiLoraAdapter(const Config& config, const LoraOptions& adapter);

// The parts of a model of `config` serving `adapters` per request, slot k being adapters[k],
// over the projections of `base` (null: dense; QuantizedModelParts(...).linear_factory: an
// int8 or int4 base to quantise after loading). At least one adapter; errors name the slot.
absl::StatusOr<ModelParts> MultiLoraParts(const Config& config,
                                          const std::vector<LoraOptions>& adapters,
                                          std::shared_ptr<const LinearFactory> base = nullptr);

// Every multi-adapter projection of the model.
std::vector<std::shared_ptr<MultiLoraProjectionImpl>> MultiLoraProjections(GPTImpl& model);

// The slot of the adapter called `name` among `names` (slot k is names[k]); -1 for the empty
// name (the base model). NotFound, listing the names, otherwise.
absl::StatusOr<int64_t> AdapterSlotByName(const std::vector<std::string>& names,
                                          absl::string_view name);

}  // namespace lgpt

#endif  // LGPT_PEFT_MULTI_LORA_H_
