// What one rank of a tensor-parallel model is built from (core/dist/tensor_parallel.h): the
// per-rank config, whose head counts and widths every module, the attention and the KV
// cache read, and parts whose linear factory shards the projections. The model code is
// the single-process one.
#ifndef LGPT_CORE_MODEL_TENSOR_PARALLEL_MODEL_H_
#define LGPT_CORE_MODEL_TENSOR_PARALLEL_MODEL_H_

#include <memory>

#include "absl/status/statusor.h"
#include "core/config/config.h"
#include "core/dist/process_group.h"
#include "core/model/model_parts.h"

namespace lgpt {

struct RankModelSpec {
  Config config;  // finalised, per rank
  ModelParts parts;
};

// For a null group or world size 1: `config` finalised and `parts` as they are. Otherwise
// ShardConfig's view for group->rank() and a TensorParallelLinearFactory over
// parts.linear_factory. Non-dividing sizes are InvalidArgument naming the field.
absl::StatusOr<RankModelSpec> TensorParallelSpec(const Config& config, const ModelParts& parts,
                                                 const std::shared_ptr<ProcessGroup>& group);

}  // namespace lgpt

#endif  // LGPT_CORE_MODEL_TENSOR_PARALLEL_MODEL_H_
