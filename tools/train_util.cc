#include "tools/train_util.h"

#include <algorithm>
#include <cmath>

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

}  // namespace lgpt
