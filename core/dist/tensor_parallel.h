// Megatron-style tensor parallelism, entered through the linear factory as LoRA and
// quantised weights are:
//   attn.qkv            column-parallel by query groups: rank r owns n_head/N query heads and
//                       the KV groups they read (groups replicated when n_query_groups < N,
//                       as vLLM does), so its KV cache holds only those groups;
//   attn.proj           row-parallel, then one all-reduce;
//   mlp fc / fc_1 / fc_2 (experts' too) column-parallel, mlp proj row-parallel + all-reduce;
//   attn.norm_q/norm_k  OLMo 2's whole-width q/k norms: each rank keeps its heads' (groups')
//                       weights, and the mean square sums over the ranks (one all-reduce of
//                       [B, T, 1] per norm; core/nn/norm.h NormFeatureShards);
//   wte, lm_head, MoE router and the other norms replicated. A vocab-parallel head would all-gather
//                       [B, padded_vocab] logits per decoded token (V·4 bytes: 128 KB for a
//                       32k vocabulary) to sample, against the one n_embd·4-byte all-reduce
//                       (3 KB at n_embd 768) a replicated head needs none of; embedding
//                       lookups are reads of n_embd values. Replicating both moves no bytes
//                       and costs each rank the embedding's memory only.
// The per-rank geometry lives in one place, ShardConfig: the model, its attention and its
// KV cache are built from the per-rank config and never see the tensor-parallel size.
#ifndef LGPT_CORE_DIST_TENSOR_PARALLEL_H_
#define LGPT_CORE_DIST_TENSOR_PARALLEL_H_

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/config/config.h"
#include "core/dist/process_group.h"
#include "core/nn/linear_factory.h"

namespace lgpt {

// Rank `rank`'s view of `config` under `world_size`-way tensor parallelism: n_head/N query
// heads, the KV groups they use, intermediate_size/N (and moe_intermediate_size/N), the same
// head_size. Sizes that do not divide are InvalidArgument naming the field. `config` may be
// unfinalised; the result is finalised. World size 1 returns the finalised config.
absl::StatusOr<Config> ShardConfig(const Config& config, int rank, int world_size);

// The checkpoint tensors of rank `rank`, by LitGPT name, from the full ones of `config`:
// views (narrow) of the full tensors where the shard is one slice, so a memory-mapped
// checkpoint is read only where the shard lies; qkv gathers its Q, K and V slices (the
// shard's size only). Replicated tensors are passed through. A LoRA model's own adapters
// (`lora_A`, `lora_B`, weights under `.linear`) shard as ShardLoraTensors does, with the
// config's lora_query/key/value; other tensors of sharded projections are Unimplemented.
absl::StatusOr<std::map<std::string, at::Tensor>> ShardTensors(
    const std::map<std::string, at::Tensor>& tensors, const Config& config, int rank,
    int world_size);

// Which parts of the fused qkv projection a LoRA file adapts: its qkv lora_B holds those
// parts' rows, in this order.
struct LoraQkvParts {
  bool query = false, key = false, value = false;
};

// A LoRA file's tensors (`...attn.qkv.lora_A`, `...mlp.proj.lora_B`, by LitGPT name) for rank
// `rank`, sharded so the low-rank product needs no collective of its own (as S-LoRA and
// Punica shard adapters under tensor parallelism): column-parallel sites (qkv, fc, fc_1, fc_2)
// keep A whole and take B's rows of their outputs (qkv: per adapted part, the rank's heads
// or groups); row-parallel sites (attn.proj, mlp proj) take A's columns of their input slice
// and keep B whole, so x_r·A_rᵀ·Bᵀ is a partial sum the projection's all-reduce completes;
// the head and the router stay whole. Shapes that do not fit are InvalidArgument.
absl::StatusOr<std::map<std::string, at::Tensor>> ShardLoraTensors(
    const std::map<std::string, at::Tensor>& tensors, const Config& config, LoraQkvParts qkv_parts,
    int rank, int world_size);

// Makes the projections of a model built from ShardConfig's per-rank config: column-parallel
// sites are `base`'s projections of the local width; row-parallel sites (attn.proj, mlp
// proj) are `base`'s projection without bias, all-reduced over `group`, plus the bias.
// Parameter names stay those of `base` ("weight", "bias", int8's buffers, a LoRA projection's
// "linear.weight" and "lora_A"), so checkpoints map one to one.
class TensorParallelLinearFactory : public LinearFactory {
 public:
  TensorParallelLinearFactory(std::shared_ptr<const LinearFactory> base,
                              std::shared_ptr<ProcessGroup> group);
  ProjectionPtr Make(const LinearSpec& spec) const override;
  int64_t AdapterSlots() const override { return base_->AdapterSlots(); }

 private:
  std::shared_ptr<const LinearFactory> base_;
  std::shared_ptr<ProcessGroup> group_;
};

// Row-parallel projection: y = all_reduce(x_r · W_rᵀ) + b, x_r and W_r this rank's slice of
// the input features. It adopts the local projection's parameters, buffers and submodules
// under their own names (a decorated local, such as LoRA over the slice, keeps its structure).
// Throws (as LibTorch does) when the all-reduce fails; GPT::Forward turns that into a Status.
class RowParallelProjectionImpl : public ProjectionImpl {
 public:
  RowParallelProjectionImpl(ProjectionPtr local, const LinearSpec& spec,
                            std::shared_ptr<ProcessGroup> group);
  at::Tensor forward(const at::Tensor& x) override;
  at::Tensor DenseWeight() const override { return local_->DenseWeight(); }
  at::Tensor DenseBias() const override { return bias.defined() ? bias.detach() : bias; }
  ProjectionImpl* flat_inner() const override { return local_.get(); }

  at::Tensor bias;  // [out_features]; undefined without bias

 private:
  ProjectionPtr local_;  // [out_features, in_features / N], no bias
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace lgpt

#endif  // LGPT_CORE_DIST_TENSOR_PARALLEL_H_
