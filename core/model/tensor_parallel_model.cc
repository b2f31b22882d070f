#include "core/model/tensor_parallel_model.h"

#include <ATen/ATen.h>

#include <memory>
#include <stdexcept>
#include <utility>

#include "cache/kv_cache.h"
#include "core/dist/tensor_parallel.h"

namespace lgpt {
namespace {

// A rank that holds a copy of KV group `group` (of `groups`) sees the attention of its own
// query heads only. Every rank writes its scores into its group's slot of a [B, groups, S]
// zero tensor; one all-reduce sums each group's copies, i.e. all of the group's heads.
// Ranks of one world step their caches alike, so S agrees. A failed all-reduce leaves this
// rank's own scores: the model's next all-reduce reports the dead peer.
class ReplicatedGroupScores : public KVScoreReducer {
 public:
  ReplicatedGroupScores(std::shared_ptr<ProcessGroup> process_group, int64_t groups, int64_t group)
      : process_group_(std::move(process_group)), groups_(groups), group_(group) {}

  void Reduce(at::Tensor& scores) const override {
    if (scores.dim() != 3 || scores.size(1) != 1) return;
    at::Tensor all = at::zeros({scores.size(0), groups_, scores.size(2)}, scores.options());
    all.select(1, group_).copy_(scores.select(1, 0));
    if (process_group_->AllReduceSum(all).ok()) scores.copy_(all.narrow(1, group_, 1));
  }

 private:
  std::shared_ptr<ProcessGroup> process_group_;
  int64_t groups_;
  int64_t group_;
};

// OLMo 2's q or k norm over the ranks: every rank holds the same number of features (its
// heads', or its groups', possibly copies), so all ranks together hold world_size times that.
class RankNormShards : public NormFeatureShards {
 public:
  RankNormShards(std::shared_ptr<ProcessGroup> process_group, int64_t total_size)
      : process_group_(std::move(process_group)), total_size_(total_size) {}

  void SumOverRanks(at::Tensor& partial) const override {
    const absl::Status status = process_group_->AllReduceSum(partial);
    if (!status.ok()) throw std::runtime_error(status.ToString());
  }
  int64_t total_size() const override { return total_size_; }

 private:
  std::shared_ptr<ProcessGroup> process_group_;
  int64_t total_size_;
};

}  // namespace

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
    // Fewer KV groups than ranks: each rank keeps the one group its heads read (ShardConfig).
    Config global = config;
    if (absl::Status s = global.Finalize(); !s.ok()) return s;
    const int64_t groups = global.QueryGroups();
    if (spec.config.norm_qk && spec.config.norm_qk_type == NormQkType::kOlmo2) {
      const int64_t head_size = spec.config.HeadSize();
      spec.parts.q_norm_shards =
          std::make_shared<RankNormShards>(group, world_size * spec.config.n_head * head_size);
      spec.parts.k_norm_shards = std::make_shared<RankNormShards>(
          group, world_size * spec.config.QueryGroups() * head_size);
    }
    if (groups % world_size != 0) {
      const int64_t heads_per_rank = global.n_head / world_size;
      const int64_t group_of_rank = rank * heads_per_rank / (global.n_head / groups);
      spec.parts.kv_score_reducer =
          std::make_shared<ReplicatedGroupScores>(group, groups, group_of_rank);
    }
  }
  return spec;
}

}  // namespace lgpt
