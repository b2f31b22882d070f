#include "core/model/tensor_parallel_model.h"

#include "core/dist/tensor_parallel.h"

namespace lgpt {

absl::StatusOr<RankModelSpec> TensorParallelSpec(const Config& config, const ModelParts& parts,
                                                 const std::shared_ptr<ProcessGroup>& group) {
  RankModelSpec spec;
  spec.parts = parts;
  const int rank = group ? group->rank() : 0, world_size = group ? group->world_size() : 1;
  absl::StatusOr<Config> local = ShardConfig(config, rank, world_size);
  if (!local.ok()) return local.status();
  spec.config = *std::move(local);
  if (world_size > 1) {
    spec.parts.linear_factory =
        std::make_shared<TensorParallelLinearFactory>(parts.linear_factory, group);
  }
  return spec;
}

}  // namespace lgpt
