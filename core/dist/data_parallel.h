// Data-parallel training on a ProcessGroup: every rank holds the whole model, trains on its
// own slice of each global batch, and averages gradients across ranks before the optimizer
// step, so all ranks keep identical parameters (PyTorch's DistributedDataParallel, without
// overlap: see GradientAllReducer).
//
// The pieces a trainer needs, each usable on its own:
//   - BatchShard: which rows of a global batch a rank takes;
//   - CheckRanksAgree / ParameterFingerprint: a start-up check that every rank trains the same
//     model on the same data with the same settings, naming what differs;
//   - GradientAllReducer: averages gradients in buckets, and broadcasts rank 0's parameters;
//   - SumAcrossRanks / GlobalMean / BroadcastBytes: the scalar reductions behind the reported
//     loss, and small payloads (a tokenizer file) from rank 0.
// With a group of world size 1 everything is a no-op, so single-process training runs the
// same calls.
#ifndef LGPT_CORE_DIST_DATA_PARALLEL_H_
#define LGPT_CORE_DIST_DATA_PARALLEL_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dist/process_group.h"

namespace lgpt {

// Rows [begin, begin + size) of a batch.
struct BatchShard {
  int64_t begin = 0;
  int64_t size = 0;
};

// The sharding rule: every rank draws the same global batch of `batch_size` rows (same data,
// same order, same seed) and rank r takes the r-th of world_size equal contiguous slices. A
// global micro-batch of world_size · b rows therefore splits into the rows one process with
// micro-batch world_size · b would see, which is what makes data-parallel training equal to
// it. InvalidArgument unless world_size divides batch_size.
absl::StatusOr<BatchShard> ShardOfBatch(int64_t batch_size, int rank, int world_size);

// 64-bit FNV-1a of `bytes`: the same on every host and build (unlike std::hash). Pass the
// previous result as `hash` to fingerprint several pieces in a row.
constexpr uint64_t kFingerprintSeed = 14695981039346656037ull;
uint64_t Fingerprint64(const void* bytes, size_t size, uint64_t hash = kFingerprintSeed);
uint64_t Fingerprint64(const std::string& text);

// One line per parameter, in order: name, shape, dtype and whether it trains. Ranks whose
// lines differ would all-reduce gradients of different tensors into one another.
std::string ParameterFingerprint(
    const std::vector<std::pair<std::string, at::Tensor>>& named_parameters);

// Something every rank must agree on: `what` names it in errors ("model config"); `text` is
// compared through its fingerprint.
struct AgreementItem {
  std::string what;
  std::string text;
};

// Every rank passes the same list of items (the same `what`s in the same order); the call
// returns OK on every rank when all fingerprints equal rank 0's, and on every rank the same
// FailedPrecondition naming the items and ranks that differ otherwise ("ranks disagree on
// the model config: rank 1 differs from rank 0"). Two all-gathers; a no-op for one rank.
absl::Status CheckRanksAgree(ProcessGroup& group, const std::vector<AgreementItem>& items);

// Σ over ranks of `value` (one all-reduce of a float64).
absl::StatusOr<double> SumAcrossRanks(ProcessGroup& group, double value);

// The weighted mean over ranks, Σ value_r · weight_r / Σ weight_r (one all-reduce): the
// global mean loss when each rank passes its mean and how many terms it averaged. NaN when
// the weights sum to 0.
absl::StatusOr<double> GlobalMean(ProcessGroup& group, double value, double weight = 1);

// Every rank's result is root's `bytes` (two broadcasts: the size, then the bytes).
absl::StatusOr<std::string> BroadcastBytes(ProcessGroup& group, const std::string& bytes,
                                           int root = 0);

struct GradientAllReducerOptions {
  // Gradients of consecutive parameters are flattened into buckets of about this many bytes
  // (a bucket closes once it reaches it; a larger parameter is a bucket of its own): one
  // all-reduce per bucket instead of one per parameter, as DDP's 25 MiB default does.
  int64_t bucket_bytes = 25 << 20;
};

// Averages the gradients of a fixed list of parameters across the ranks of a group.
//
// Only parameters that require grad are reduced (a LoRA model reduces its LoRA matrices
// alone), in the order given, which must be the same on every rank (a module's
// named_parameters(); CheckRanksAgree with ParameterFingerprint verifies it). A parameter
// that requires grad but got no gradient on a rank (not used by that rank's batch) adds
// zeros; it gets the average when any rank had a gradient and stays without one (so the
// optimizer skips it, as it would in one process) when none had. Buckets hold one dtype;
// tensors off the CPU are reduced through a CPU copy (Gloo).
//
// Not overlapped with the backward pass: LibTorch 1.13's C++ API has no hook that fires once
// a parameter's gradient is final (Python's register_post_accumulate_grad_hook came in 2.1;
// a tensor hook sees each micro-batch's contribution before accumulation), the process
// group's collectives are synchronous, and on CPU with Gloo the all-reduce runs on the same
// cores the backward pass needs, so there is little to hide it behind. Buckets keep the
// number of collectives per step small instead.
class GradientAllReducer {
 public:
  GradientAllReducer(std::shared_ptr<ProcessGroup> group,
                     std::vector<std::pair<std::string, at::Tensor>> named_parameters,
                     GradientAllReducerOptions options = {});

  // After the last backward of a step (all micro-batches accumulated), before clipping and
  // the optimizer step: every trained parameter's grad becomes the mean over ranks.
  absl::Status AllReduceGradients();

  // Every rank's trained parameters become root's (at start: identical initialisation even
  // where ranks seeded or loaded differently). Frozen parameters are left as they are.
  absl::Status BroadcastParameters(int root = 0);

  int world_size() const { return group_->world_size(); }
  // Parameter indices (into the trained parameters, in order) of each bucket.
  const std::vector<std::vector<size_t>>& buckets() const { return buckets_; }
  int64_t trained_parameters() const { return static_cast<int64_t>(trained_.size()); }

 private:
  std::shared_ptr<ProcessGroup> group_;
  std::vector<std::pair<std::string, at::Tensor>> trained_;
  std::vector<std::vector<size_t>> buckets_;
};

}  // namespace lgpt

#endif  // LGPT_CORE_DIST_DATA_PARALLEL_H_
