#include "tools/sft_trainer.h"

#include <ATen/ATen.h>
#include <torch/nn/utils/clip_grad.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "tools/train_util.h"

namespace lgpt {
namespace {

at::Tensor BatchLoss(GPTImpl& model, const SftBatch& batch) {
  absl::StatusOr<at::Tensor> logits = model.Forward(batch.input_ids.to(model.device()));
  TORCH_CHECK(logits.ok(), std::string(logits.status().message()));
  return SftLoss(*logits, batch.labels.to(model.device()));
}

std::vector<const SftExample*> Slice(const std::vector<SftExample>& examples,
                                     const std::vector<size_t>& order, size_t begin, size_t n) {
  std::vector<const SftExample*> out;
  for (size_t i = begin; i < std::min(order.size(), begin + n); ++i) {
    out.push_back(&examples[order[i]]);
  }
  return out;
}

}  // namespace

double SftValidationLoss(GPTImpl& model, const std::vector<SftExample>& examples,
                         int64_t micro_batch_size, int64_t pad_id, int64_t max_batches) {
  at::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  std::vector<size_t> order(examples.size());
  std::iota(order.begin(), order.end(), 0);
  // Token-weighted, so the result does not depend on how examples fall into batches.
  double total = 0;
  int64_t tokens = 0;
  for (int64_t b = 0; b < max_batches && static_cast<size_t>(b * micro_batch_size) < order.size();
       ++b) {
    const SftBatch batch =
        CollateSft(Slice(examples, order, b * micro_batch_size, micro_batch_size), pad_id);
    if (batch.target_tokens == 0) continue;
    total += BatchLoss(model, batch).item<double>() * batch.target_tokens;
    tokens += batch.target_tokens;
  }
  model.train(was_training);
  return tokens > 0 ? total / tokens : std::nan("");
}

static absl::StatusOr<SftTrainStats> TrainSftUnchecked(GPTImpl& model,
                                                       const std::vector<SftExample>& train,
                                                       const std::vector<SftExample>& val,
                                                       const SftTrainOptions& options) {
  const int64_t micro = options.micro_batch_size, global = options.global_batch_size;
  if (micro < 1 || global < micro || global % micro != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("global_batch_size (", global,
                     ") must be a positive multiple of micro_batch_size (", micro, ")"));
  }
  if (options.max_steps < 0 || options.epochs < 1 || options.warmup_steps < 0 ||
      options.eval_interval < 1 || options.log_interval < 1) {
    return absl::InvalidArgumentError(
        "max_steps must be >= 0, and epochs, eval_interval, log_interval >= 1, warmup_steps >= 0");
  }
  if (options.eval_max_batches < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eval_max_batches must be >= 0 (0: no validation), got ", options.eval_max_batches));
  }
  if (train.empty()) return absl::InvalidArgumentError("no training examples");
  const int64_t accumulate = global / micro;
  const int64_t steps_per_epoch = std::max<int64_t>(1, static_cast<int64_t>(train.size()) / global);
  const int64_t max_steps =
      options.max_steps > 0 ? options.max_steps : options.epochs * steps_per_epoch;

  std::vector<at::Tensor> trainable;
  SftTrainStats stats;
  for (const auto& p : model.parameters()) {
    if (p.requires_grad()) {
      trainable.push_back(p);
      stats.trainable_parameters += p.numel();
    }
  }
  if (trainable.empty()) return absl::InvalidArgumentError("the model has no trainable parameters");
  std::unique_ptr<torch::optim::AdamW> optimizer =
      MakeAdamW(trainable, options.lr, options.weight_decay);
  auto log = [&](const std::string& line) {
    if (options.log) options.log(line);
  };

  // eval_max_batches == 0 turns validation off.
  auto validate = [&](int64_t step) -> absl::Status {
    if (val.empty() || options.eval_max_batches == 0) return absl::OkStatus();
    const double loss =
        SftValidationLoss(model, val, micro, options.pad_id, options.eval_max_batches);
    if (!std::isfinite(loss)) {
      return absl::FailedPreconditionError(
          absl::StrCat("the validation loss is not finite (", loss, ") at step ", step,
                       ": the model's weights or activations are not numbers"));
    }
    stats.val_losses.push_back({step, loss});
    log(absl::StrFormat("step %d val_loss %.4f val_ppl %.2f", step, loss, std::exp(loss)));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(validate(0));

  std::mt19937_64 rng(options.seed);
  std::vector<size_t> order(train.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  size_t cursor = 0;
  auto next_micro_batch = [&]() {
    std::vector<const SftExample*> examples;
    while (static_cast<int64_t>(examples.size()) < micro) {
      if (cursor == order.size()) {  // next epoch
        std::shuffle(order.begin(), order.end(), rng);
        cursor = 0;
      }
      examples.push_back(&train[order[cursor++]]);
    }
    return CollateSft(examples, options.pad_id);
  };

  model.train();
  double total_s = 0;
  for (int64_t step = 0; step < max_steps; ++step) {
    const auto begin = std::chrono::steady_clock::now();
    const double lr =
        LearningRate(step, max_steps, options.warmup_steps, options.lr, options.min_lr);
    SetLearningRate(*optimizer, lr);
    optimizer->zero_grad();
    double step_loss = 0;
    int64_t step_tokens = 0;
    for (int64_t m = 0; m < accumulate; ++m) {
      const SftBatch batch = next_micro_batch();
      at::Tensor loss = BatchLoss(model, batch) / static_cast<double>(accumulate);
      loss.backward();
      const double micro_loss = loss.item<double>();
      if (!std::isfinite(micro_loss)) {
        return absl::FailedPreconditionError(
            absl::StrCat("the training loss is not finite (", micro_loss, ") at step ", step + 1,
                         ": the model's weights or activations are not numbers (lower --lr?)"));
      }
      step_loss += micro_loss;
      step_tokens += batch.input_ids.numel();
      stats.target_tokens += batch.target_tokens;
    }
    if (options.grad_clip > 0) torch::nn::utils::clip_grad_norm_(trainable, options.grad_clip);
    optimizer->step();
    const double step_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    total_s += step_s;
    stats.tokens += step_tokens;
    if (step == 0) stats.first_loss = step_loss;
    stats.last_loss = step_loss;
    stats.steps = step + 1;
    if (options.on_step) options.on_step(step + 1, max_steps, step_loss, lr);
    if ((step + 1) % options.log_interval == 0 || step == 0 || step + 1 == max_steps) {
      log(absl::StrFormat("step %d/%d loss %.4f lr %.2e step_time %.3fs %.0f tokens/s", step + 1,
                          max_steps, step_loss, lr, step_s, step_tokens / step_s));
    }
    if ((step + 1) % options.eval_interval == 0 || step + 1 == max_steps) {
      RETURN_IF_ERROR(validate(step + 1));
    }
  }
  model.eval();
  stats.mean_step_s = total_s / std::max<int64_t>(1, stats.steps);
  stats.tokens_per_s = total_s > 0 ? stats.tokens / total_s : 0;
  return stats;
}

absl::StatusOr<SftTrainStats> TrainSft(GPTImpl& model, const std::vector<SftExample>& train,
                                       const std::vector<SftExample>& val,
                                       const SftTrainOptions& options) {
  try {
    return TrainSftUnchecked(model, train, val, options);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("training failed: ", e.what_without_backtrace()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("training failed: out of memory");
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("training failed: ", e.what()));
  }
}

}  // namespace lgpt
