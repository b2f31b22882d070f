// The supervised fine-tuning loop: AdamW over the parameters that require grad only,
// gradient accumulation up to the global batch, linear warm-up plus cosine decay, gradient
// clipping, periodic validation, and progress lines; in one process or data-parallel over the
// ranks of a process group (core/dist/data_parallel.h).
//
// Data-parallel training equals one process whose micro-batch holds every rank's: each
// optimizer step, every rank draws the same global micro-batches of micro_batch_size · W
// examples (same data, same seed) and trains on its slice (ShardOfBatch). The loss of a
// micro-batch is the mean over the response tokens of all W slices, not the mean of the
// ranks' means (slices hold different numbers of tokens): each rank weights its own mean by
// W · its tokens / the micro-batch's tokens (counted locally: every rank sees the whole
// micro-batch), so the gradients averaged over ranks are the one-process gradients.
// Gradients are averaged before clipping and the optimizer step, so every rank keeps the
// same parameters; losses reported are these global ones.
#ifndef LGPT_TOOLS_SFT_TRAINER_H_
#define LGPT_TOOLS_SFT_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/dist/data_parallel.h"
#include "core/dist/process_group.h"
#include "core/model/gpt.h"
#include "core/train/chunked_backward.h"
#include "tools/sft_data.h"

namespace lgpt {

struct SftTrainOptions {
  int64_t micro_batch_size = 1;
  int64_t global_batch_size = 16;  // a multiple of micro_batch_size
  int64_t max_steps = 0;           // optimizer steps; 0: `epochs` passes over the data
  int64_t epochs = 1;
  double lr = 3e-4;
  double min_lr = 0;
  int64_t warmup_steps = 100;
  double weight_decay = 0.02;
  double grad_clip = 1.0;          // 0: off
  int64_t eval_interval = 100;     // optimizer steps between validation runs
  int64_t eval_max_batches = 100;  // micro-batches per validation run; 0: no validation
  int64_t log_interval = 1;        // optimizer steps between progress lines
  int64_t pad_id = 0;
  uint64_t seed = 1337;
  std::function<void(const std::string&)> log;  // progress lines, rank 0 only; null: quiet
  // After every optimizer step, on every rank: steps done, steps in all, the step's (global)
  // loss and learning rate.
  std::function<void(int64_t step, int64_t max_steps, double loss, double lr)> on_step;

  // Data-parallel ranks; null or world size 1: this process alone. With W ranks
  // micro_batch_size is per rank, global_batch_size counts the examples of all ranks (a
  // multiple of micro_batch_size · W), and each validation batch is micro_batch_size · W
  // examples split the same way. At start the ranks check they agree on the trained
  // parameters, these options and the data (and on `agree_on`: say, the model config),
  // then take rank 0's trained parameters; each rank seeds its own dropout masks.
  std::shared_ptr<ProcessGroup> group;
  std::vector<AgreementItem> agree_on;
  int64_t bucket_bytes = GradientAllReducerOptions().bucket_bytes;

  // Cache-aware training (core/train/chunked_backward.h): every micro-batch, and validation,
  // runs through this cache policy in chunks, gradients cell by cell; unset: plain forward
  // and backward over whole sequences.
  std::optional<ChunkedTrainingOptions> chunked;
};

struct SftTrainStats {
  int64_t steps = 0;
  int64_t trainable_parameters = 0;
  int64_t target_tokens = 0;             // response tokens trained on (all ranks)
  int64_t tokens = 0;                    // all tokens fed, padding included (all ranks)
  double first_loss = 0, last_loss = 0;  // train loss of the first and last step
  double mean_step_s = 0;
  double tokens_per_s = 0;
  // (step, validation loss), step 0 first (before training).
  std::vector<std::pair<int64_t, double>> val_losses;
};

// Mean validation loss over up to `max_batches` micro-batches (in order, no dropout), through
// `chunked`'s cache policy when given.
double SftValidationLoss(GPTImpl& model, const std::vector<SftExample>& examples,
                         int64_t micro_batch_size, int64_t pad_id, int64_t max_batches,
                         const ChunkedTrainingOptions* chunked = nullptr);

// Trains in place. InvalidArgument for bad options or no trainable parameters.
absl::StatusOr<SftTrainStats> TrainSft(GPTImpl& model, const std::vector<SftExample>& train,
                                       const std::vector<SftExample>& val,
                                       const SftTrainOptions& options);

}  // namespace lgpt

#endif  // LGPT_TOOLS_SFT_TRAINER_H_
