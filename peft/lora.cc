#include "peft/lora.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/base/status_macros.h"
#include "core/model/checkpoint.h"
#include "peft/peft_method.h"

namespace lgpt {

LoraOptions LoraOptions::FromConfig(const Config& config) {
  LoraOptions options;
  options.r = config.lora_r;
  options.alpha = config.lora_alpha;
  options.dropout = config.lora_dropout;
  options.query = config.lora_query;
  options.key = config.lora_key;
  options.value = config.lora_value;
  options.projection = config.lora_projection;
  options.mlp = config.lora_mlp;
  options.head = config.lora_head;
  return options;
}

absl::Status LoraOptions::Validate() const {
  if (r < 0) return absl::InvalidArgumentError(absl::StrCat("lora_r must be >= 0, got ", r));
  if (!(dropout >= 0 && dropout < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora_dropout must be in [0, 1), got ", dropout));
  }
  if (!std::isfinite(alpha)) return absl::InvalidArgumentError("lora_alpha must be finite");
  if (!std::isfinite(scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoraOptions.scale must be finite, got ", scale));
  }
  return absl::OkStatus();
}

LoraProjectionImpl::LoraProjectionImpl(const LinearSpec& spec, ProjectionPtr base, int64_t r,
                                       double alpha, double dropout,
                                       std::array<bool, 3> enabled_parts, double scale)
    : r_(r),
      in_features_(spec.in_features),
      out_features_(spec.out_features),
      scaling_(r > 0 ? scale * alpha / r : 0.0),
      dropout_(dropout) {
  linear = register_module("linear", std::move(base));
  parts_ = LoraOutputParts(spec, enabled_parts);
  if (r_ == 0 || parts_.empty()) {
    r_ = 0;
    return;
  }
  int64_t width = 0;
  for (const auto& part : parts_) width += part.second;
  // LitGPT's init: A like nn.Linear's default (kaiming uniform, a = sqrt(5)), B zero, so a
  // fresh LoRA model equals its base exactly.
  const double bound = 1.0 / std::sqrt(static_cast<double>(spec.in_features));
  lora_A = register_parameter(
      "lora_A", at::empty({r_ * static_cast<int64_t>(parts_.size()), spec.in_features})
                    .uniform_(-bound, bound));
  lora_B = register_parameter("lora_B", at::zeros({width, r_}));
}

at::Tensor LoraProjectionImpl::forward(const at::Tensor& x) {
  at::Tensor y = linear->forward(x);
  if (r_ == 0 || merged_) return y;
  const at::Tensor dropped = dropout_ > 0 ? at::dropout(x, dropout_, is_training()) : x;
  const at::Tensor after_a = at::linear(dropped, lora_A);  // [..., r · parts]
  if (parts_.size() == 1 && parts_[0].second == y.size(-1)) {
    return y + at::linear(after_a, lora_B) * scaling_;
  }
  // Each enabled part has its own rank-r pair; disabled parts get no update.
  std::vector<at::Tensor> pieces;
  int64_t b_row = 0;
  int64_t covered = 0;
  for (size_t i = 0; i < parts_.size(); ++i) {
    const auto [offset, width] = parts_[i];
    if (offset > covered) pieces.push_back(at::zeros_like(y.narrow(-1, covered, offset - covered)));
    const at::Tensor a_part = after_a.narrow(-1, static_cast<int64_t>(i) * r_, r_);
    pieces.push_back(at::linear(a_part, lora_B.narrow(0, b_row, width)) * scaling_);
    b_row += width;
    covered = offset + width;
  }
  if (covered < y.size(-1)) {
    pieces.push_back(at::zeros_like(y.narrow(-1, covered, y.size(-1) - covered)));
  }
  return y + at::cat(pieces, -1);
}

at::Tensor LoraProjectionImpl::DeltaWeight() const {
  if (r_ == 0) return at::zeros({out_features_, in_features_});
  at::Tensor delta = at::zeros({out_features_, in_features_}, lora_A.options());
  at::NoGradGuard no_grad;
  int64_t b_row = 0;
  for (size_t i = 0; i < parts_.size(); ++i) {
    const auto [offset, width] = parts_[i];
    const at::Tensor a = lora_A.narrow(0, static_cast<int64_t>(i) * r_, r_).to(at::kFloat);
    const at::Tensor b = lora_B.narrow(0, b_row, width).to(at::kFloat);
    delta.narrow(0, offset, width).copy_(at::matmul(b, a) * scaling_);
    b_row += width;
  }
  return delta;
}

at::Tensor LoraProjectionImpl::DenseWeight() const {
  const at::Tensor base = linear->DenseWeight();
  if (!base.defined() || r_ == 0 || merged_) return base;
  return (base.to(at::kFloat) + DeltaWeight().to(base.device(), at::kFloat)).to(base.scalar_type());
}

bool LoraProjectionImpl::CanMerge() const {
  if (r_ == 0 || merged_) return true;
  const auto* dense = dynamic_cast<const DenseProjectionImpl*>(linear.get());
  return dense != nullptr && dense->weight.defined() && dense->weight.numel() > 0;
}

absl::Status LoraProjectionImpl::Merge() {
  if (r_ == 0 || merged_) return absl::OkStatus();
  if (!CanMerge()) {
    return absl::FailedPreconditionError(
        "LoRA merge needs a float base weight to write into; this base is quantised or not "
        "dense (merge into the float checkpoint instead: merge_lora)");
  }
  auto* dense = dynamic_cast<DenseProjectionImpl*>(linear.get());
  at::NoGradGuard no_grad;
  dense->weight.add_(DeltaWeight().to(dense->weight.scalar_type()));
  merged_ = true;
  return absl::OkStatus();
}

std::array<bool, 3> LoraEnabledParts(const LoraOptions& options, LinearSite site) {
  std::array<bool, 3> enabled = {false, false, false};
  switch (site) {
    case LinearSite::kQkv:
      enabled = {options.query, options.key, options.value};
      break;
    case LinearSite::kAttnProj:
      enabled[0] = options.projection;
      break;
    case LinearSite::kHead:
      enabled[0] = options.head;
      break;
    default:  // MLP and MoE linears, the router included (as LitGPT's create_lora_linear).
      enabled[0] = options.mlp;
      break;
  }
  return enabled;
}

std::vector<std::pair<int64_t, int64_t>> LoraOutputParts(const LinearSpec& spec,
                                                         std::array<bool, 3> enabled) {
  std::vector<std::pair<int64_t, int64_t>> parts;
  if (spec.site == LinearSite::kQkv) {
    const int64_t widths[3] = {spec.q_size, spec.kv_size, spec.kv_size};
    int64_t offset = 0;
    for (int part = 0; part < 3; ++part) {
      if (enabled[part]) parts.push_back({offset, widths[part]});
      offset += widths[part];
    }
  } else if (enabled[0]) {
    parts.push_back({0, spec.out_features});
  }
  return parts;
}

ProjectionPtr LoraLinearFactory::Make(const LinearSpec& spec) const {
  return std::make_shared<LoraProjectionImpl>(
      spec, base_->Make(spec), options_.r, options_.alpha, options_.dropout,
      LoraEnabledParts(options_, spec.site), options_.scale);
}

absl::StatusOr<ModelParts> LoraParts(const Config& config,
                                     std::shared_ptr<const LinearFactory> base) {
  const LoraOptions options = LoraOptions::FromConfig(config);
  RETURN_IF_ERROR(options.Validate());
  // Every LoRA site reads or writes n_embd features, so B·A has rank <= n_embd: a larger r
  // only adds parameters (and can ask for terabytes).
  if (options.r > config.n_embd) {
    return absl::InvalidArgumentError(absl::StrCat("lora_r (", options.r, ") must be <= n_embd (",
                                                   config.n_embd,
                                                   "): a larger rank adds no expressiveness"));
  }
  ModelParts parts;
  parts.linear_factory =
      std::make_shared<LoraLinearFactory>(options, LinearFactoryOrDefault(std::move(base)));
  return parts;
}

absl::StatusOr<GPT> CreateLoraGPT(const Config& config, std::shared_ptr<const LinearFactory> base) {
  ASSIGN_OR_RETURN(ModelParts parts, LoraParts(config, std::move(base)));
  return GPTImpl::Create(config, parts);
}

std::vector<std::shared_ptr<LoraProjectionImpl>> LoraProjections(GPTImpl& model) {
  std::vector<std::shared_ptr<LoraProjectionImpl>> out;
  for (const auto& module : model.modules(/*include_self=*/false)) {
    if (auto lora = std::dynamic_pointer_cast<LoraProjectionImpl>(module)) out.push_back(lora);
  }
  return out;
}

absl::Status MergeLora(GPTImpl& model) {
  const std::vector<std::shared_ptr<LoraProjectionImpl>> loras = LoraProjections(model);
  // All or nothing: every projection is checked before any weight changes.
  for (const auto& lora : loras) {
    if (!lora->CanMerge()) {
      return absl::FailedPreconditionError(
          "LoRA merge needs float base weights to write into; this model's are quantised or "
          "not dense (merge into the float checkpoint instead: merge_lora)");
    }
  }
  for (const auto& lora : loras) RETURN_IF_ERROR(lora->Merge());
  return absl::OkStatus();
}

TensorMap MergedBaseStateDict(GPTImpl& model) {
  at::NoGradGuard no_grad;
  TensorMap merged = UnwrapToBaseStateDict(StateDict(model));
  // Modules come parents first: the outermost of stacked LoRA projections holds the sum of
  // every update (its DenseWeight goes through the inner ones), and the inner ones are skipped.
  std::set<std::string> done;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto lora = std::dynamic_pointer_cast<LoraProjectionImpl>(item.value());
    const std::string weight = BaseParameterName(item.key() + ".weight");
    if (!lora || !done.insert(weight).second) continue;
    merged[weight] = lora->DenseWeight().clone();
    const at::Tensor bias = lora->DenseBias();
    if (bias.defined()) merged[BaseParameterName(item.key() + ".bias")] = bias.clone();
  }
  for (auto& [name, tensor] : merged) tensor = tensor.detach().clone();
  return merged;
}

TensorMap LoraStateDict(GPTImpl& model) {
  TensorMap out;
  for (const auto& [name, tensor] : StateDict(model)) {
    if (absl::StrContains(name, "lora_")) out[name] = tensor;
  }
  return out;
}

}  // namespace lgpt
