// Loading LitGPT checkpoint directories: model_config.yaml plus model.safetensors or
// lit_model.pth, into a GPT of the dtype and device the caller asks for.
#ifndef LGPT_CORE_MODEL_CHECKPOINT_H_
#define LGPT_CORE_MODEL_CHECKPOINT_H_

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/config/config.h"
#include "core/dist/process_group.h"
#include "core/model/gpt.h"
#include "core/model/model_parts.h"
#include "core/io/tensor_map.h"
#include "core/model/state_dict.h"

namespace lgpt {

// Reads the weights of a checkpoint directory: model.safetensors if present, else
// lit_model.pth (a state dict, optionally wrapped as {"model": ...}), whose records are checked
// against their CRC-32s unless `verify_checksums` is false (see LoadOptions): a mismatch is
// DataLoss naming the record and the tensor, and LoadOptions.verify_checksums.
absl::StatusOr<TensorMap> ReadCheckpointTensors(const std::string& checkpoint_dir,
                                                std::string* source = nullptr,
                                                bool verify_checksums = true);

struct LoadOptions {
  c10::ScalarType dtype = c10::kFloat;
  c10::Device device = c10::Device(c10::kCPU);
  ModelParts parts;
  // Refuse weights holding NaN or infinity (CheckFinite). Costs one read of the weights
  // (~0.1 s per GB); turn off only for large files that are known good.
  bool check_finite = true;
  // Check lit_model.pth's records against the CRC-32s its zip stores (ReadTorchStateDict), so
  // that flipped bits in the weights fail the load, naming the tensor, instead of changing
  // the logits. One more read of the weights, ~35 ms of CPU per 444 MB (the 110M model) over
  // the intra-op threads, that is also the first to touch the mapped pages (a cost moved from
  // check_finite or the first forward): the 110M model's whole load measured -3..-8% warm,
  // +6..+9% cold (README.md, "Bad input"). Turn off only for trusted storage.
  // model.safetensors has no checksums.
  bool verify_checksums = true;
  // Called with a short description of each loading stage (for progress output).
  std::function<void(const std::string&)> progress;
  // Tensor parallelism over this group (world size > 1): the model is this rank's part
  // (core/model/tensor_parallel_model.h), LoadedModel::config its per-rank view, and only
  // this rank's slices of the checkpoint are read (and checked for NaN) from the mapping.
  // Every rank of the group must load the same checkpoint.
  std::shared_ptr<ProcessGroup> tensor_parallel;
};

struct LoadedModel {
  Config config;
  GPT model;
  // Things a user should hear about, e.g. a block_size beyond the trained context.
  std::vector<std::string> warnings;
};

// The context the model was trained for, when the directory says: train_config.yaml's
// block_size (lgpt pretrain writes it), else the block_size of the preset named like the
// config. nullopt when neither is known.
std::optional<int64_t> TrainedContext(const std::string& checkpoint_dir, const Config& config);

// What every loader of `options` refuses before reading anything: float16 on the CPU when
// LibTorch has no float16 products there (Debian's 1.13).
absl::Status CheckLoadOptions(const LoadOptions& options);
// LoadedModel::warnings for `config` loaded with the weights of `checkpoint_dir`: a block_size
// past TrainedContext.
std::vector<std::string> ContextWarnings(const std::string& checkpoint_dir,
                                         const Config& config);

// What LoadCheckpoint refuses before it builds any module, in well under a second: a config
// that the checkpoint's tensors (read from `source`) contradict, an InvalidArgument naming the
// config's number and the checkpoint's (the layers and experts that tensor names hold, the
// shapes of the embedding, head, attention and MLP weights: n_layer, n_expert, n_embd, n_head,
// n_query_groups, head_size, intermediate_size, padded_vocab_size); a block_size beyond
// kMostBlockSize; and weights that cannot fit the memory available once converted to `dtype`
// (ResourceExhausted with both sizes). A config of 2^20 layers over a 4-layer checkpoint was
// built layer by layer for minutes before its weights were looked at.
absl::Status CheckConfigAgainstCheckpoint(const Config& config, const TensorMap& tensors,
                                          const std::string& source, c10::ScalarType dtype);

// The longest context a config may state (2^24 tokens; caches are sized from it).
inline constexpr int64_t kMostBlockSize = int64_t{1} << 24;

absl::StatusOr<LoadedModel> LoadCheckpoint(const std::string& checkpoint_dir,
                                           const LoadOptions& options = {});

}  // namespace lgpt

#endif  // LGPT_CORE_MODEL_CHECKPOINT_H_
