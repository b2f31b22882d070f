#include "core/dist/tensor_parallel.h"

#include <ATen/ATen.h>

#include <array>
#include <stdexcept>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace lgpt {
namespace {

absl::Status Divides(const char* field, int64_t value, int world_size) {
  if (value % world_size == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, " (", value, ") is not divisible by the tensor-parallel size ", world_size));
}

// Query heads and KV groups of one rank.
struct HeadShard {
  int64_t head_begin, heads;    // query heads [head_begin, head_begin + heads)
  int64_t group_begin, groups;  // KV groups [group_begin, group_begin + groups)
};

absl::StatusOr<HeadShard> ShardHeads(const Config& config, int rank, int world_size) {
  const int64_t n_head = config.n_head, groups = config.QueryGroups();
  if (absl::Status s = Divides("n_head", n_head, world_size); !s.ok()) return s;
  HeadShard shard;
  shard.heads = n_head / world_size;
  shard.head_begin = rank * shard.heads;
  if (groups % world_size == 0) {
    shard.groups = groups / world_size;
    shard.group_begin = rank * shard.groups;
  } else if (world_size % groups == 0) {
    // Fewer groups than ranks (MQA, narrow GQA): each rank's heads read one group, which
    // is replicated on the world_size / groups ranks that share it.
    shard.groups = 1;
    shard.group_begin = shard.head_begin / (n_head / groups);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("n_query_groups (", groups,
                                                   ") and the tensor-parallel size ", world_size,
                                                   " do not divide one another"));
  }
  return shard;
}

// Where a checkpoint tensor sits: its leaf ("weight", "lora_A", ...), the projection it belongs
// to (past LoRA's ".linear" wrappers: "attn.qkv.linear.weight" and "attn.qkv.lora_A" are
// qkv's), and how that projection is split.
struct TensorSite {
  std::string leaf, module;
  bool attention = false;
  bool column = false;  // qkv, fc, fc_1, fc_2: split by output rows
  bool row = false;     // attn.proj, mlp proj: split by input columns
  bool lora() const { return (column || row) && (leaf == "lora_A" || leaf == "lora_B"); }
};

TensorSite SiteOf(const std::string& name) {
  const std::vector<std::string> parts = absl::StrSplit(name, '.');
  TensorSite site;
  site.leaf = parts.back();
  int64_t i = static_cast<int64_t>(parts.size()) - 2;
  while (i > 0 && parts[static_cast<size_t>(i)] == "linear") --i;
  site.module = i >= 0 ? parts[static_cast<size_t>(i)] : "";
  site.attention = absl::StrContains(name, ".attn.");
  const bool mlp = absl::StrContains(name, ".mlp.");
  site.column = (site.attention && site.module == "qkv") ||
                (mlp && (site.module == "fc" || site.module == "fc_1" || site.module == "fc_2"));
  site.row = (site.attention || mlp) && site.module == "proj";
  return site;
}

// Rank `rank`'s part of one LoRA tensor of a sharded projection (`site.lora()`), `full` the
// finalised config and `heads` the rank's heads and groups (ShardLoraTensors says how).
absl::StatusOr<at::Tensor> ShardLoraTensor(const std::string& name, const at::Tensor& tensor,
                                           const TensorSite& site, const Config& full,
                                           const HeadShard& heads, LoraQkvParts qkv_parts, int rank,
                                           int world_size) {
  auto bad_shape = [&](int64_t dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoRA tensor ", name, " has size ", tensor.dim() > dim ? tensor.size(dim) : -1,
                     " in dimension ", dim, ", which does not fit tensor-parallel size ",
                     world_size, " of ", full.name));
  };
  if (tensor.dim() != 2) return bad_shape(0);
  if (site.row) {
    if (site.leaf == "lora_B") return tensor;  // [out, r]: applied to the partial sum of A's
    if (tensor.size(1) % world_size != 0) return bad_shape(1);
    const int64_t width = tensor.size(1) / world_size;
    return tensor.narrow(1, rank * width, width);  // [r, in / N]
  }
  // [r · parts, in]: every output row reads the whole product.
  if (site.leaf == "lora_A") return tensor;
  if (site.module != "qkv") {
    if (tensor.size(0) % world_size != 0) return bad_shape(0);
    const int64_t width = tensor.size(0) / world_size;
    return tensor.narrow(0, rank * width, width);  // [out / N, r]
  }
  // lora_B of qkv: the adapted parts' rows in order (query, key, value), each sliced to the
  // rank's heads (query) or groups (key, value).
  const int64_t hs = full.HeadSize();
  std::vector<at::Tensor> pieces;
  int64_t row_begin = 0;
  const std::array<bool, 3> adapted = {qkv_parts.query, qkv_parts.key, qkv_parts.value};
  for (int part = 0; part < 3; ++part) {
    if (!adapted[part]) continue;
    const bool query = part == 0;
    const int64_t rows = (query ? full.n_head : full.QueryGroups()) * hs;
    if (row_begin + rows > tensor.size(0)) return bad_shape(0);
    const int64_t begin = (query ? heads.head_begin : heads.group_begin) * hs;
    const int64_t width = (query ? heads.heads : heads.groups) * hs;
    pieces.push_back(tensor.narrow(0, row_begin + begin, width));
    row_begin += rows;
  }
  if (row_begin != tensor.size(0)) return bad_shape(0);
  return at::cat(pieces, 0);
}

}  // namespace

absl::StatusOr<Config> ShardConfig(const Config& config, int rank, int world_size) {
  Config local = config;
  if (absl::Status s = local.Finalize(); !s.ok()) return s;
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " of tensor-parallel size ", world_size, " is invalid"));
  }
  if (world_size == 1) return local;
  absl::StatusOr<HeadShard> heads = ShardHeads(local, rank, world_size);
  if (!heads.ok()) return heads.status();
  if (absl::Status s = Divides("intermediate_size", local.IntermediateSize(), world_size);
      !s.ok()) {
    return s;
  }
  if (local.moe_intermediate_size) {
    if (absl::Status s = Divides("moe_intermediate_size", *local.moe_intermediate_size, world_size);
        !s.ok()) {
      return s;
    }
    local.moe_intermediate_size = *local.moe_intermediate_size / world_size;
  }
  local.n_head = heads->heads;
  local.n_query_groups = heads->groups;
  local.head_size = config.head_size ? *config.head_size : local.HeadSize();
  local.intermediate_size = local.IntermediateSize() / world_size;
  if (absl::Status s = local.Finalize(); !s.ok()) return s;
  return local;
}

absl::StatusOr<std::map<std::string, at::Tensor>> ShardTensors(
    const std::map<std::string, at::Tensor>& tensors, const Config& config, int rank,
    int world_size) {
  if (world_size == 1) return tensors;
  Config full = config;
  if (absl::Status s = full.Finalize(); !s.ok()) return s;
  absl::StatusOr<HeadShard> heads = ShardHeads(full, rank, world_size);
  if (!heads.ok()) return heads.status();
  const int64_t hs = full.HeadSize(), q_rows = full.n_head * hs, kv_rows = full.QueryGroups() * hs;

  std::map<std::string, at::Tensor> shard;
  for (const auto& [name, tensor] : tensors) {
    const TensorSite site = SiteOf(name);
    const std::string& leaf = site.leaf;
    const std::string& module = site.module;
    const bool attention = site.attention, column = site.column, row = site.row;
    if (site.lora()) {
      // A LoRA model's own adapters (its config's lora_* fields say which qkv parts).
      absl::StatusOr<at::Tensor> lora =
          ShardLoraTensor(name, tensor, site, full, *heads,
                          {full.lora_query, full.lora_key, full.lora_value}, rank, world_size);
      if (!lora.ok()) return lora.status();
      shard[name] = *std::move(lora);
      continue;
    }
    // OLMo 2's q/k norms span every head: each rank keeps its heads' (or groups') weights.
    const bool olmo2_norm = attention && full.norm_qk && full.norm_qk_type == NormQkType::kOlmo2 &&
                            (module == "norm_q" || module == "norm_k");
    if (!column && !row && !olmo2_norm) {
      shard[name] = tensor;  // replicated
      continue;
    }
    if (leaf != "weight" && leaf != "bias") {
      return absl::UnimplementedError(
          absl::StrCat("tensor ", name,
                       ": only plain weights and biases of sharded projections are "
                       "tensor-parallel yet"));
    }
    auto bad_shape = [&](int64_t dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", name, " has size ", tensor.size(dim), " in dimension ", dim,
          ", which does not fit tensor-parallel size ", world_size, " of ", full.name));
    };
    if (olmo2_norm) {
      const bool q = module == "norm_q";
      const int64_t begin = (q ? heads->head_begin : heads->group_begin) * hs;
      const int64_t width = (q ? heads->heads : heads->groups) * hs;
      if (tensor.dim() != 1 || tensor.size(0) != (q ? q_rows : kv_rows)) return bad_shape(0);
      shard[name] = tensor.narrow(0, begin, width);  // [heads or groups of the rank · hs]
      continue;
    }
    if (row) {
      if (leaf == "bias") {
        shard[name] = tensor;  // added once, after the all-reduce
        continue;
      }
      if (tensor.dim() != 2 || tensor.size(1) % world_size != 0) return bad_shape(1);
      const int64_t width = tensor.size(1) / world_size;
      shard[name] = tensor.narrow(1, rank * width, width);  // [out, in / N]
      continue;
    }
    if (module != "qkv") {
      if (tensor.size(0) % world_size != 0) return bad_shape(0);
      const int64_t width = tensor.size(0) / world_size;
      shard[name] = tensor.narrow(0, rank * width, width);  // [intermediate / N, ...]
      continue;
    }
    // [Q | K | V] rows: this rank's heads, then its groups' keys and values.
    if (tensor.size(0) != q_rows + 2 * kv_rows) return bad_shape(0);
    shard[name] =
        at::cat({tensor.narrow(0, heads->head_begin * hs, heads->heads * hs),
                 tensor.narrow(0, q_rows + heads->group_begin * hs, heads->groups * hs),
                 tensor.narrow(0, q_rows + kv_rows + heads->group_begin * hs, heads->groups * hs)},
                0);
  }
  return shard;
}

absl::StatusOr<std::map<std::string, at::Tensor>> ShardLoraTensors(
    const std::map<std::string, at::Tensor>& tensors, const Config& config, LoraQkvParts qkv_parts,
    int rank, int world_size) {
  if (world_size == 1) return tensors;
  Config full = config;
  if (absl::Status s = full.Finalize(); !s.ok()) return s;
  absl::StatusOr<HeadShard> heads = ShardHeads(full, rank, world_size);
  if (!heads.ok()) return heads.status();
  std::map<std::string, at::Tensor> shard;
  for (const auto& [name, tensor] : tensors) {
    const TensorSite site = SiteOf(name);
    if (!site.lora()) {
      shard[name] = tensor;  // replicated (the head, the router) or not LoRA's
      continue;
    }
    absl::StatusOr<at::Tensor> piece =
        ShardLoraTensor(name, tensor, site, full, *heads, qkv_parts, rank, world_size);
    if (!piece.ok()) return piece.status();
    shard[name] = *std::move(piece);
  }
  return shard;
}

RowParallelProjectionImpl::RowParallelProjectionImpl(ProjectionPtr local, const LinearSpec& spec,
                                                     std::shared_ptr<ProcessGroup> group)
    : local_(std::move(local)), group_(std::move(group)) {
  // The local projection's tensors and submodules are registered here under their own names,
  // so the state dict reads attn.proj.weight (not attn.proj.local.weight), as in LitGPT.
  for (const auto& item : local_->named_children()) register_module(item.key(), item.value());
  for (const auto& item : local_->named_parameters(/*recurse=*/false)) {
    register_parameter(item.key(), item.value(), item.value().requires_grad());
  }
  for (const auto& item : local_->named_buffers(/*recurse=*/false)) {
    register_buffer(item.key(), item.value());
  }
  if (spec.bias) bias = register_parameter("bias", at::zeros({spec.out_features}));
}

at::Tensor RowParallelProjectionImpl::forward(const at::Tensor& x) {
  at::Tensor y = local_->forward(x).contiguous();  // [..., out_features], a partial sum
  const absl::Status status = group_->AllReduceSum(y);
  if (!status.ok()) throw std::runtime_error(status.ToString());
  if (bias.defined()) y.add_(bias);
  return y;
}

TensorParallelLinearFactory::TensorParallelLinearFactory(std::shared_ptr<const LinearFactory> base,
                                                         std::shared_ptr<ProcessGroup> group)
    : base_(LinearFactoryOrDefault(std::move(base))), group_(std::move(group)) {}

ProjectionPtr TensorParallelLinearFactory::Make(const LinearSpec& spec) const {
  if (group_->world_size() == 1) return base_->Make(spec);
  switch (spec.site) {
    case LinearSite::kAttnProj:
    case LinearSite::kMlpProj: {
      LinearSpec local = spec;
      local.bias = false;
      return std::make_shared<RowParallelProjectionImpl>(base_->Make(local), spec, group_);
    }
    default:
      // qkv and MLP fc / fc_1 / fc_2 arrive with the per-rank widths of ShardConfig's
      // config; the head and the MoE router are replicated.
      return base_->Make(spec);
  }
}

}  // namespace lgpt
