// Training pieces shared by pretrain and finetune: the learning-rate schedule and AdamW
// with weight decay on matrices only.
#ifndef LGPT_TOOLS_TRAIN_UTIL_H_
#define LGPT_TOOLS_TRAIN_UTIL_H_

#include <ATen/core/Tensor.h>
#include <torch/optim/adamw.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace lgpt {

// Linear warm-up over `warmup` steps, then cosine decay from lr to min_lr at max_steps.
double LearningRate(int64_t step, int64_t max_steps, int64_t warmup, double lr, double min_lr);

// AdamW (betas 0.9, 0.95) over `parameters`: weight decay on tensors of two or more
// dimensions, none on norms and biases.
std::unique_ptr<torch::optim::AdamW> MakeAdamW(const std::vector<at::Tensor>& parameters, double lr,
                                               double weight_decay);

// Sets every parameter group's learning rate.
void SetLearningRate(torch::optim::AdamW& optimizer, double lr);

// InvalidArgument naming the first setting that is not a finite number >= 0 (`prefix` + its
// name: "" for options fields, "--" for flags). An infinite rate or a NaN clip trains on
// (torch::optim checks only the initial rate) and leaves weights that are not numbers.
absl::Status CheckOptimizerSettings(double lr, double min_lr, double weight_decay, double grad_clip,
                                    absl::string_view prefix);

// FailedPrecondition naming the first of `named` holding NaN or infinity after `steps`
// optimizer steps: the last step's update is followed by no loss that would show it, so
// this is checked before anything is saved.
absl::Status CheckParametersFinite(const std::vector<std::pair<std::string, at::Tensor>>& named,
                                   int64_t steps);

}  // namespace lgpt

#endif  // LGPT_TOOLS_TRAIN_UTIL_H_
