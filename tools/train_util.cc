#include "tools/train_util.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace lgpt {

double LearningRate(int64_t step, int64_t max_steps, int64_t warmup, double lr, double min_lr) {
  if (step < warmup) return lr * (step + 1) / warmup;
  const double progress =
      std::min(1.0, static_cast<double>(step - warmup) / std::max<int64_t>(1, max_steps - warmup));
  return min_lr + 0.5 * (lr - min_lr) * (1 + std::cos(M_PI * progress));
}

std::unique_ptr<torch::optim::AdamW> MakeAdamW(const std::vector<at::Tensor>& parameters, double lr,
                                               double weight_decay) {
  std::vector<at::Tensor> decay, no_decay;
  for (const auto& p : parameters) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  torch::optim::AdamWOptions adamw(lr);
  adamw.betas({0.9, 0.95}).eps(1e-8);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decay.empty()) {
    groups.emplace_back(
        decay, std::make_unique<torch::optim::AdamWOptions>(adamw.weight_decay(weight_decay)));
  }
  if (!no_decay.empty()) {
    groups.emplace_back(no_decay,
                        std::make_unique<torch::optim::AdamWOptions>(adamw.weight_decay(0)));
  }
  return std::make_unique<torch::optim::AdamW>(groups, adamw);
}

void SetLearningRate(torch::optim::AdamW& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
}

absl::Status CheckOptimizerSettings(double lr, double min_lr, double weight_decay, double grad_clip,
                                    absl::string_view prefix) {
  for (const auto& [name, value] : {std::pair<const char*, double>{"lr", lr},
                                    {"min_lr", min_lr},
                                    {"weight_decay", weight_decay},
                                    {"grad_clip", grad_clip}}) {
    if (!std::isfinite(value) || value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, name, " must be a finite number >= 0, got ", value));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckParametersFinite(const std::vector<std::pair<std::string, at::Tensor>>& named,
                                   int64_t steps) {
  at::NoGradGuard no_grad;
  for (const auto& [name, p] : named) {
    if (!at::isfinite(p).all().item<bool>()) {
      return absl::FailedPreconditionError(
          absl::StrCat("parameter ", name, " holds values that are not finite after ", steps,
                       " optimizer steps (lower the learning rate?); nothing was saved"));
    }
  }
  return absl::OkStatus();
}

}  // namespace lgpt
