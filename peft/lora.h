// LoRA by composition: a LoRA projection entered through the linear factory, so the base
// model's attention, cache and block code run unchanged. Parameter names equal LitGPT's
// (`qkv.linear.weight`, `qkv.lora_A`, `qkv.lora_B`, ...), so LitGPT LoRA checkpoints load.
//
// As in LitGPT, every projection of a LoRA model is a LoRA projection (rank 0 where its
// site is disabled), so names carry `.linear.` uniformly.
#ifndef LGPT_PEFT_LORA_H_
#define LGPT_PEFT_LORA_H_

#include <ATen/core/Tensor.h>

#include <array>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/config/config.h"
#include "core/io/tensor_map.h"
#include "core/model/gpt.h"
#include "core/model/model_parts.h"
#include "core/nn/linear_factory.h"

namespace lgpt {

struct LoraOptions {
  int64_t r = 0;
  double alpha = 1;
  double dropout = 0;
  bool query = false, key = false, value = false;
  bool projection = false, mlp = false, head = false;
  // The user's weight of the update at run time (llama.cpp's --lora-scaled): scaling is
  // scale · alpha / r. Not part of a trained config: FromConfig leaves it 1.
  double scale = 1;

  static LoraOptions FromConfig(const Config& config);
  absl::Status Validate() const;
  double scaling() const { return r > 0 ? scale * alpha / static_cast<double>(r) : 0.0; }
};

// Which output parts of a `site` projection `options` adapts: query, key, value for the fused
// QKV projection; element 0 alone for the others (projection, mlp, head; the MoE router and
// experts count as mlp, as in LitGPT's create_lora_linear).
std::array<bool, 3> LoraEnabledParts(const LoraOptions& options, LinearSite site);
// The (offset, width) ranges of out_features that `enabled` parts cover, in order.
std::vector<std::pair<int64_t, int64_t>> LoraOutputParts(const LinearSpec& spec,
                                                         std::array<bool, 3> enabled);

// y = linear(x) + scaling · B·A·dropout(x), where `linear` is any base projection (dense,
// int8, adapter v2, another LoRA projection: stacked adapters) and scaling = scale · alpha / r.
// For the fused QKV projection, A and B hold one rank-r pair per enabled part (query, key,
// value) and the update is zero for disabled parts.
class LoraProjectionImpl : public ProjectionImpl {
 public:
  LoraProjectionImpl(const LinearSpec& spec, ProjectionPtr base, int64_t r, double alpha,
                     double dropout, std::array<bool, 3> enabled_parts, double scale = 1);
  at::Tensor forward(const at::Tensor& x) override;
  // The base weight plus the update, W + scaling · B·A.
  at::Tensor DenseWeight() const override;
  at::Tensor DenseBias() const override { return linear->DenseBias(); }

  // scaling · B·A laid out like the base weight: [out_features, in_features].
  at::Tensor DeltaWeight() const;
  // Writes the update into the base's float weight; later forwards skip the LoRA branch.
  // Fails (and changes nothing) when the base has no float weight to write into (int8).
  absl::Status Merge();
  // Whether Merge() can write the update: nothing to merge, or a float dense base.
  bool CanMerge() const;
  bool merged() const { return merged_; }
  int64_t rank() const { return r_; }

  ProjectionPtr linear;  // the base projection, LitGPT's `linear`
  at::Tensor lora_A;     // [r · enabled parts, in_features]; undefined at rank 0
  at::Tensor lora_B;     // [sum of enabled part widths, r]; undefined at rank 0

 private:
  int64_t r_;
  int64_t in_features_, out_features_;
  double scaling_;
  double dropout_;
  bool merged_ = false;
  std::vector<std::pair<int64_t, int64_t>> parts_;  // (offset, width) in out_features
};

// Decorates every projection `base` makes with LoRA: LoRA over int8 weights (QLoRA-style
// fine-tuning), over adapter v2, or over plain dense weights (the default).
class LoraLinearFactory : public LinearFactory {
 public:
  explicit LoraLinearFactory(const LoraOptions& options,
                             std::shared_ptr<const LinearFactory> base = DefaultLinearFactory())
      : options_(options), base_(std::move(base)) {}
  ProjectionPtr Make(const LinearSpec& spec) const override;

 private:
  LoraOptions options_;
  std::shared_ptr<const LinearFactory> base_;
};

// The parts of a LoRA model for `config`'s lora_* fields, decorating `base` (null: dense).
absl::StatusOr<ModelParts> LoraParts(const Config& config,
                                     std::shared_ptr<const LinearFactory> base = nullptr);
absl::StatusOr<GPT> CreateLoraGPT(const Config& config,
                                  std::shared_ptr<const LinearFactory> base = nullptr);

// Every LoRA projection of the model.
std::vector<std::shared_ptr<LoraProjectionImpl>> LoraProjections(GPTImpl& model);
// Merges every LoRA update into its base weight, in place; fails before changing anything when
// a base has no float weight (int8, or stacked adapters: a LoRA projection over another).
absl::Status MergeLora(GPTImpl& model);
// A plain base-model state dict (LitGPT's names without `.linear.`, no lora_*), with the LoRA
// updates merged: W + scaling · B·A, summed over stacked adapters (int8 bases dequantised).
// The model is left unchanged.
TensorMap MergedBaseStateDict(GPTImpl& model);
// Only the LoRA parameters (LitGPT's `lit_model.pth.lora` content).
TensorMap LoraStateDict(GPTImpl& model);

}  // namespace lgpt

#endif  // LGPT_PEFT_LORA_H_
