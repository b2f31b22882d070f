#include "peft/multi_lora.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/status_macros.h"
#include "core/nn/adapter_routing.h"

namespace lgpt {

LoraSlotImpl::LoraSlotImpl(const LinearSpec& spec, const LoraOptions& options)
    : r_(options.r),
      in_features_(spec.in_features),
      out_features_(spec.out_features),
      scaling_(options.scaling()),
      parts_(LoraOutputParts(spec, LoraEnabledParts(options, spec.site))) {
  if (r_ <= 0 || parts_.empty()) {
    r_ = 0;
    parts_.clear();
    return;
  }
  int64_t width = 0;
  for (const auto& part : parts_) width += part.second;
  // As LoraProjection: A drawn like nn.Linear's default, B zero (a fresh slot changes nothing).
  const double bound = 1.0 / std::sqrt(static_cast<double>(spec.in_features));
  lora_A = register_parameter(
      "lora_A", at::empty({r_ * static_cast<int64_t>(parts_.size()), spec.in_features})
                    .uniform_(-bound, bound));
  lora_B = register_parameter("lora_B", at::zeros({width, r_}));
}

void LoraSlotImpl::AddUpdate(const at::Tensor& x, at::Tensor& y, const at::Tensor& rows) const {
  if (r_ == 0) return;
  const at::Tensor after_a = at::linear(x, lora_A);  // [n, r · parts]
  const bool one_part = parts_.size() == 1;
  int64_t b_row = 0;
  for (size_t i = 0; i < parts_.size(); ++i) {
    const auto [offset, width] = parts_[i];
    const at::Tensor a_part =
        one_part ? after_a : after_a.narrow(1, static_cast<int64_t>(i) * r_, r_);
    const at::Tensor b_part = one_part ? lora_B : lora_B.narrow(0, b_row, width);
    const at::Tensor update = at::linear(a_part, b_part);  // [n, width]
    at::Tensor target = width == out_features_ ? y : y.narrow(1, offset, width);
    if (rows.defined()) {
      target.index_add_(0, rows, update, scaling_);
    } else {
      target.add_(update, scaling_);
    }
    b_row += width;
  }
}

at::Tensor LoraSlotImpl::DeltaWeight() const {
  at::Tensor delta = at::zeros({out_features_, in_features_});
  if (r_ == 0) return delta;
  at::NoGradGuard no_grad;
  int64_t b_row = 0;
  for (size_t i = 0; i < parts_.size(); ++i) {
    const auto [offset, width] = parts_[i];
    const at::Tensor a =
        lora_A.narrow(0, static_cast<int64_t>(i) * r_, r_).to(at::kCPU, at::kFloat);
    const at::Tensor b = lora_B.narrow(0, b_row, width).to(at::kCPU, at::kFloat);
    delta.narrow(0, offset, width).copy_(at::matmul(b, a) * scaling_);
    b_row += width;
  }
  return delta;
}

MultiLoraProjectionImpl::MultiLoraProjectionImpl(const LinearSpec& spec, ProjectionPtr base,
                                                 const std::vector<LoraOptions>& adapters)
    : in_features_(spec.in_features), out_features_(spec.out_features) {
  linear = register_module("linear", std::move(base));
  for (size_t k = 0; k < adapters.size(); ++k) {
    slots_.push_back(register_module(absl::StrCat("slot", k),
                                     std::make_shared<LoraSlotImpl>(spec, adapters[k])));
  }
}

const LoraSlotImpl& MultiLoraProjectionImpl::slot(int64_t k) const {
  TORCH_CHECK(k >= 0 && k < slots(), "adapter slot ", k, " is outside the projection's [0, ",
              slots(), ")");
  return *slots_[static_cast<size_t>(k)];
}

LoraSlotImpl& MultiLoraProjectionImpl::slot(int64_t k) {
  return const_cast<LoraSlotImpl&>(static_cast<const MultiLoraProjectionImpl*>(this)->slot(k));
}

at::Tensor MultiLoraProjectionImpl::forward(const at::Tensor& x) {
  at::Tensor y = linear->forward(x);  // [..., out_features]
  const AdapterRouting* routing = CurrentAdapterRouting();
  if (routing == nullptr || routing->base_only()) return y;
  if (!y.is_contiguous()) y = y.contiguous();
  const at::Tensor x_rows = x.reshape({-1, in_features_});  // [N, in_features]
  at::Tensor y_rows = y.view({-1, out_features_});          // [N, out_features], y's storage
  if (const std::optional<int64_t> uniform = routing->uniform_slot()) {
    slot(*uniform).AddUpdate(x_rows, y_rows, at::Tensor());  // every row: no gather
    return y;
  }
  TORCH_CHECK(routing->rows() == x_rows.size(0), "the adapter routing describes ", routing->rows(),
              " rows, the projection's input has ", x_rows.size(0));
  for (const AdapterRouting::Group& group : routing->groups()) {
    const LoraSlotImpl& adapter = slot(group.slot);
    if (adapter.rank() == 0) continue;
    adapter.AddUpdate(x_rows.index_select(0, group.rows), y_rows, group.rows);  // [n_k, in]
  }
  return y;
}

ProjectionPtr MultiLoraLinearFactory::Make(const LinearSpec& spec) const {
  return std::make_shared<MultiLoraProjectionImpl>(spec, base_->Make(spec), adapters_);
}

absl::Status CheckMultiLoraAdapter(const Config& config, const LoraOptions& adapter) {
  RETURN_IF_ERROR(adapter.Validate());
  // Every LoRA site reads or writes n_embd features: a larger rank adds nothing (LoraParts).
  if (adapter.r > config.n_embd) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora_r (", adapter.r, ") must be <= n_embd (", config.n_embd, ")"));
  }
  if (config.n_expert > 0 && adapter.r > 0 && adapter.mlp) {
    return absl::UnimplementedError(
        "per-request LoRA on MoE experts (lora_mlp on a model with n_expert > 0) is not "
        "supported: each expert sees only its tokens' rows");
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelParts> MultiLoraParts(const Config& config,
                                          const std::vector<LoraOptions>& adapters,
                                          std::shared_ptr<const LinearFactory> base) {
  if (adapters.empty()) {
    return absl::InvalidArgumentError("a multi-adapter model needs at least one adapter");
  }
  for (size_t k = 0; k < adapters.size(); ++k) {
    const absl::Status status = CheckMultiLoraAdapter(config, adapters[k]);
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat("adapter slot ", k, ": ", status.message()));
    }
  }
  ModelParts parts;
  parts.linear_factory = std::make_shared<MultiLoraLinearFactory>(adapters, std::move(base));
  return parts;
}

std::vector<std::shared_ptr<MultiLoraProjectionImpl>> MultiLoraProjections(GPTImpl& model) {
  std::vector<std::shared_ptr<MultiLoraProjectionImpl>> out;
  for (const auto& module : model.modules(/*include_self=*/false)) {
    if (auto multi = std::dynamic_pointer_cast<MultiLoraProjectionImpl>(module)) {
      out.push_back(multi);
    }
  }
  return out;
}

absl::StatusOr<int64_t> AdapterSlotByName(const std::vector<std::string>& names,
                                          absl::string_view name) {
  if (name.empty()) return -1;
  for (size_t k = 0; k < names.size(); ++k) {
    if (names[k] == name) return static_cast<int64_t>(k);
  }
  return absl::NotFoundError(
      absl::StrCat("no adapter called '", name, "'; the model serves ",
                   names.empty() ? "none" : absl::StrCat("'", absl::StrJoin(names, "', '"), "'")));
}

}  // namespace lgpt
