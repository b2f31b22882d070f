#include "tools/sft_trainer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
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

// The micro-batch's loss, through the cache policy when `chunked` is set; with
// `backward_scale`, adds backward_scale · the loss's gradient to the parameters' .grad.
absl::StatusOr<double> LossAndBackward(GPTImpl& model, const SftBatch& batch,
                                       const ChunkedTrainingOptions* chunked,
                                       std::optional<double> backward_scale) {
  if (chunked != nullptr) {
    ASSIGN_OR_RETURN(const ChunkedLossResult result,
                     ChunkedLoss(model, batch.input_ids, batch.labels, *chunked, backward_scale));
    return result.loss;
  }
  at::Tensor loss = BatchLoss(model, batch);
  if (backward_scale) (loss * *backward_scale).backward();
  return loss.item<double>();
}

std::vector<const SftExample*> Slice(const std::vector<SftExample>& examples,
                                     const std::vector<size_t>& order, size_t begin, size_t n) {
  std::vector<const SftExample*> out;
  for (size_t i = begin; i < std::min(order.size(), begin + n); ++i) {
    out.push_back(&examples[order[i]]);
  }
  return out;
}

// Labels that count toward the loss (CollateSft's target_tokens for this example alone).
int64_t TargetTokens(const SftExample& example) {
  int64_t n = 0;
  for (size_t t = 1; t < example.labels.size(); ++t) n += example.labels[t] != kIgnoreIndex;
  return n;
}

// Σ loss · tokens and Σ tokens over this rank's share of up to `max_batches` validation
// batches of micro_batch_size · world_size examples, in order: rank r takes the r-th
// micro_batch_size examples of each (fewer, or none, in a last partial batch).
std::pair<double, int64_t> ValidationSums(GPTImpl& model, const std::vector<SftExample>& examples,
                                          int64_t micro_batch_size, int64_t pad_id,
                                          int64_t max_batches, int rank, int world_size,
                                          const ChunkedTrainingOptions* chunked) {
  at::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  std::vector<size_t> order(examples.size());
  std::iota(order.begin(), order.end(), 0);
  const size_t global = static_cast<size_t>(micro_batch_size) * world_size;
  // Token-weighted, so the result does not depend on how examples fall into batches.
  double total = 0;
  int64_t tokens = 0;
  for (int64_t b = 0; b < max_batches && b * global < order.size(); ++b) {
    const size_t begin = b * global + static_cast<size_t>(rank) * micro_batch_size;
    if (begin >= order.size()) continue;
    const SftBatch batch = CollateSft(Slice(examples, order, begin, micro_batch_size), pad_id);
    if (batch.target_tokens == 0) continue;
    const absl::StatusOr<double> loss = LossAndBackward(model, batch, chunked, std::nullopt);
    TORCH_CHECK(loss.ok(), std::string(loss.status().message()));
    total += *loss * batch.target_tokens;
    tokens += batch.target_tokens;
  }
  model.train(was_training);
  return {total, tokens};
}

std::string Doubles(std::initializer_list<double> values) {
  std::string out;
  for (double v : values) absl::StrAppend(&out, absl::StrFormat("%.17g ", v));
  return out;
}

// Fingerprint of the examples' tokens, in order, as hex.
std::string DataFingerprint(const std::vector<SftExample>& examples) {
  uint64_t hash = kFingerprintSeed;
  for (const SftExample& e : examples) {
    const int64_t sizes[2] = {static_cast<int64_t>(e.input_ids.size()), e.prompt_tokens};
    hash = Fingerprint64(sizes, sizeof(sizes), hash);
    hash = Fingerprint64(e.input_ids.data(), e.input_ids.size() * sizeof(int64_t), hash);
    hash = Fingerprint64(e.labels.data(), e.labels.size() * sizeof(int64_t), hash);
  }
  return absl::StrFormat("%d examples, %016x", examples.size(), hash);
}

}  // namespace

double SftValidationLoss(GPTImpl& model, const std::vector<SftExample>& examples,
                         int64_t micro_batch_size, int64_t pad_id, int64_t max_batches,
                         const ChunkedTrainingOptions* chunked) {
  const auto [total, tokens] =
      ValidationSums(model, examples, micro_batch_size, pad_id, max_batches, 0, 1, chunked);
  return tokens > 0 ? total / tokens : std::nan("");
}

static absl::StatusOr<SftTrainStats> TrainSftUnchecked(GPTImpl& model,
                                                       const std::vector<SftExample>& train,
                                                       const std::vector<SftExample>& val,
                                                       const SftTrainOptions& options) {
  const std::shared_ptr<ProcessGroup> group =
      options.group ? options.group : ProcessGroup::Single();
  const int rank = group->rank(), world = group->world_size();
  const int64_t micro = options.micro_batch_size, global = options.global_batch_size;
  if (micro < 1 || global < micro || global % micro != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("global_batch_size (", global,
                     ") must be a positive multiple of micro_batch_size (", micro, ")"));
  }
  // Every rank's micro-batch together: the micro-batch of the equivalent single process.
  const int64_t global_micro = micro * world;
  if (global % global_micro != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("global_batch_size (", global, ") must be a multiple of micro_batch_size (",
                     micro, ") times the number of data-parallel ranks (", world, ")"));
  }
  if (options.max_steps < 0 || options.epochs < 1 || options.warmup_steps < 0 ||
      options.eval_interval < 1 || options.log_interval < 1) {
    return absl::InvalidArgumentError(
        "max_steps must be >= 0, and epochs, eval_interval, log_interval >= 1, warmup_steps >= 0");
  }
  RETURN_IF_ERROR(CheckOptimizerSettings(options.lr, options.min_lr, options.weight_decay,
                                         options.grad_clip, ""));
  if (options.eval_max_batches < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eval_max_batches must be >= 0 (0: no validation), got ", options.eval_max_batches));
  }
  if (train.empty()) return absl::InvalidArgumentError("no training examples");
  const int64_t accumulate = global / global_micro;
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

  // Data parallelism: the ranks must train the same parameters on the same data with the
  // same settings; then they start from rank 0's parameters.
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& item : model.named_parameters()) named.emplace_back(item.key(), item.value());
  GradientAllReducerOptions reducer_options;
  reducer_options.bucket_bytes = options.bucket_bytes;
  GradientAllReducer reducer(group, named, reducer_options);
  if (world > 1) {
    std::vector<AgreementItem> items = {
        {"trained parameters", ParameterFingerprint(named)},
        {"training options",
         absl::StrCat(
             micro, " ", global, " ", options.max_steps, " ", options.epochs, " ",
             options.warmup_steps, " ", options.eval_interval, " ", options.eval_max_batches, " ",
             options.pad_id, " ", options.seed, " ",
             Doubles({options.lr, options.min_lr, options.weight_decay, options.grad_clip}))},
        {"training data", DataFingerprint(train)},
        {"validation data", DataFingerprint(val)}};
    items.insert(items.end(), options.agree_on.begin(), options.agree_on.end());
    RETURN_IF_ERROR(CheckRanksAgree(*group, items));
    RETURN_IF_ERROR(reducer.BroadcastParameters(0));
    // Dropout masks differ between ranks, as they do between a single process's rows.
    at::manual_seed(options.seed + 1000003ull * static_cast<uint64_t>(rank + 1));
  }

  std::unique_ptr<torch::optim::AdamW> optimizer =
      MakeAdamW(trainable, options.lr, options.weight_decay);
  auto log = [&](const std::string& line) {
    if (options.log && rank == 0) options.log(line);
  };

  // eval_max_batches == 0 turns validation off.
  auto validate = [&](int64_t step) -> absl::Status {
    if (val.empty() || options.eval_max_batches == 0) return absl::OkStatus();
    const auto [total, tokens] =
        ValidationSums(model, val, micro, options.pad_id, options.eval_max_batches, rank, world,
                       options.chunked ? &*options.chunked : nullptr);
    double loss = tokens > 0 ? total / tokens : std::nan("");
    if (world > 1) {
      at::Tensor sums = at::tensor({total, static_cast<double>(tokens)}, at::kDouble);
      RETURN_IF_ERROR(group->AllReduceSum(sums));
      const double all_tokens = sums[1].item<double>();
      loss = all_tokens > 0 ? sums[0].item<double>() / all_tokens : std::nan("");
    }
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

  // Every rank shuffles the same order and draws the same global micro-batches.
  std::mt19937_64 rng(options.seed);
  std::vector<size_t> order(train.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  size_t cursor = 0;
  const BatchShard shard = ShardOfBatch(global_micro, rank, world).value();
  // This rank's slice of the next global micro-batch, and the response tokens of the whole.
  auto next_micro_batch = [&]() -> std::pair<SftBatch, int64_t> {
    std::vector<const SftExample*> examples;
    while (static_cast<int64_t>(examples.size()) < global_micro) {
      if (cursor == order.size()) {  // next epoch
        std::shuffle(order.begin(), order.end(), rng);
        cursor = 0;
      }
      examples.push_back(&train[order[cursor++]]);
    }
    int64_t all_targets = 0;
    for (const SftExample* e : examples) all_targets += TargetTokens(*e);
    const std::vector<const SftExample*> mine(examples.begin() + shard.begin,
                                              examples.begin() + shard.begin + shard.size);
    return {CollateSft(mine, options.pad_id), all_targets};
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
      const auto [batch, all_targets] = next_micro_batch();
      step_tokens += batch.input_ids.numel();
      stats.target_tokens += all_targets;
      if (batch.target_tokens == 0) continue;  // nothing to learn on this rank's slice
      // This rank's share of the micro-batch's token mean, times W: averaging the ranks'
      // gradients (÷ W) leaves the gradient of the mean over every rank's tokens. One process:
      // the weight is exactly 1.
      const double weight = static_cast<double>(batch.target_tokens) * world / all_targets;
      const double scale = weight / static_cast<double>(accumulate);
      ASSIGN_OR_RETURN(
          const double loss,
          LossAndBackward(model, batch, options.chunked ? &*options.chunked : nullptr, scale));
      step_loss += loss * scale / world;
    }
    if (world > 1) {
      at::Tensor sums = at::tensor({step_loss, static_cast<double>(step_tokens)}, at::kDouble);
      RETURN_IF_ERROR(group->AllReduceSum(sums));
      step_loss = sums[0].item<double>();
      step_tokens = static_cast<int64_t>(sums[1].item<double>());
    }
    // Checked on the global loss, so every rank stops with the same error.
    if (!std::isfinite(step_loss)) {
      return absl::FailedPreconditionError(
          absl::StrCat("the training loss is not finite (", step_loss, ") at step ", step + 1,
                       ": the model's weights or activations are not numbers (lower --lr?)"));
    }
    RETURN_IF_ERROR(reducer.AllReduceGradients());
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
  std::vector<std::pair<std::string, at::Tensor>> trained;
  for (const auto& [name, p] : named) {
    if (p.requires_grad()) trained.emplace_back(name, p);
  }
  RETURN_IF_ERROR(CheckParametersFinite(trained, stats.steps));
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
