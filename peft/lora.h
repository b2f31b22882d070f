// LoRA by composition: a LoRA projection entered through the linear factory, so the base
// model's attention, cache and block code run unchanged. Parameter names equal LitGPT's
// (`qkv.linear.weight`, `qkv.lora_A`, `qkv.lora_B`, ...), so LitGPT LoRA checkpoints load.
//
// As in LitGPT, every projection of a LoRA model is a LoRA projection (rank 0 where its
// site is disabled), so names carry `.linear.` uniformly.
#ifndef LGPT_PEFT_LORA_H_
#define LGPT_PEFT_LORA_H_

#include <array>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/config/config.h"
#include "core/nn/linear_factory.h"
#include "core/model/gpt.h"
#include "core/model/model_parts.h"
#include "core/io/tensor_map.h"

namespace lgpt {

struct LoraOptions {
  int64_t r = 0;
  double alpha = 1;
  double dropout = 0;
  bool query = false, key = false, value = false;
  bool projection = false, mlp = false, head = false;

  static LoraOptions FromConfig(const Config& config);
  absl::Status Validate() const;
  double scaling() const { return r > 0 ? alpha / static_cast<double>(r) : 0.0; }
};

// y = linear(x) + scaling · B·A·dropout(x). For the fused QKV projection, A and B hold one
// rank-r pair per enabled part (query, key, value) and the update is zero for disabled parts.
class LoraProjectionImpl : public ProjectionImpl {
 public:
  LoraProjectionImpl(const LinearSpec& spec, int64_t r, double alpha, double dropout,
                     std::array<bool, 3> enabled_parts);
  at::Tensor forward(const at::Tensor& x) override;

  // scaling · B·A laid out like linear.weight: [out_features, in_features].
  at::Tensor DeltaWeight() const;
  // Writes the update into linear.weight; later forwards skip the LoRA branch.
  void Merge();
  bool merged() const { return merged_; }
  int64_t rank() const { return r_; }

  std::shared_ptr<DenseProjectionImpl> linear;
  at::Tensor lora_A;  // [r · enabled parts, in_features]; undefined at rank 0
  at::Tensor lora_B;  // [sum of enabled part widths, r]; undefined at rank 0

 private:
  int64_t r_;
  double scaling_;
  double dropout_;
  bool merged_ = false;
  std::vector<std::pair<int64_t, int64_t>> parts_;  // (offset, width) in out_features
};

class LoraLinearFactory : public LinearFactory {
 public:
  explicit LoraLinearFactory(const LoraOptions& options) : options_(options) {}
  ProjectionPtr Make(const LinearSpec& spec) const override;

 private:
  LoraOptions options_;
};

// The parts of a LoRA model for `config`'s lora_* fields.
absl::StatusOr<ModelParts> LoraParts(const Config& config);
absl::StatusOr<GPT> CreateLoraGPT(const Config& config);

// Every LoRA projection of the model.
std::vector<std::shared_ptr<LoraProjectionImpl>> LoraProjections(GPTImpl& model);
// Merges every LoRA update into its base weight, in place.
void MergeLora(GPTImpl& model);
// A plain base-model state dict (LitGPT's names without `.linear.`, no lora_*), with the LoRA
// updates merged: W + scaling · B·A. The model itself is left unchanged.
TensorMap MergedBaseStateDict(GPTImpl& model);
// Only the LoRA parameters (LitGPT's `lit_model.pth.lora` content).
TensorMap LoraStateDict(GPTImpl& model);
// Freezes everything but lora_A / lora_B.
void MarkOnlyLoraTrainable(GPTImpl& model);

}  // namespace lgpt

#endif  // LGPT_PEFT_LORA_H_
