#include "core/dist/data_parallel.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace lgpt {

absl::StatusOr<BatchShard> ShardOfBatch(int64_t batch_size, int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside [0, world size ", world_size, ")"));
  }
  if (batch_size < 0 || batch_size % world_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a batch of ", batch_size, " rows does not split evenly into ", world_size, " ranks"));
  }
  const int64_t size = batch_size / world_size;
  return BatchShard{rank * size, size};
}

uint64_t Fingerprint64(const void* bytes, size_t size, uint64_t hash) {
  const unsigned char* p = static_cast<const unsigned char*>(bytes);
  for (size_t i = 0; i < size; ++i) {
    hash ^= p[i];
    hash *= 1099511628211ull;
  }
  return hash;
}

uint64_t Fingerprint64(const std::string& text) { return Fingerprint64(text.data(), text.size()); }

std::string ParameterFingerprint(
    const std::vector<std::pair<std::string, at::Tensor>>& named_parameters) {
  std::string text;
  for (const auto& [name, tensor] : named_parameters) {
    absl::StrAppend(&text, name, " [", absl::StrJoin(tensor.sizes(), ","), "] ",
                    c10::toString(tensor.scalar_type()),
                    tensor.requires_grad() ? " trained\n" : " frozen\n");
  }
  return text;
}

absl::Status CheckRanksAgree(ProcessGroup& group, const std::vector<AgreementItem>& items) {
  const int world = group.world_size();
  if (world == 1) return absl::OkStatus();
  // First what is being compared (so the second all-gather has one shape on every rank).
  const int64_t count = static_cast<int64_t>(items.size());
  absl::StatusOr<at::Tensor> counts = group.AllGather(at::tensor({count, int64_t{world}}));
  if (!counts.ok()) return counts.status();
  for (int r = 1; r < world; ++r) {
    const int64_t theirs = (*counts)[2 * r].item<int64_t>();
    const int64_t their_world = (*counts)[2 * r + 1].item<int64_t>();
    if (their_world != world) {
      return absl::FailedPreconditionError(absl::StrCat("ranks disagree on the world size: rank ",
                                                        r, " has ", their_world, ", rank 0 has ",
                                                        world));
    }
    if (theirs != count) {
      return absl::FailedPreconditionError(
          absl::StrCat("ranks disagree on what to check at start: rank ", r, " has ", theirs,
                       " items, rank 0 has ", count, " (different builds of the tool?)"));
    }
  }
  if (count == 0) return absl::OkStatus();
  at::Tensor mine = at::empty({count}, at::kLong);
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t hash = Fingerprint64(items[i].text);
    int64_t as_signed;
    std::memcpy(&as_signed, &hash, sizeof(hash));
    mine[i] = as_signed;
  }
  absl::StatusOr<at::Tensor> all = group.AllGather(mine);
  if (!all.ok()) return all.status();
  const at::Tensor table = all->view({world, count});  // [world, items]
  std::vector<std::string> differences;
  for (int64_t i = 0; i < count; ++i) {
    std::vector<int> differ;
    for (int r = 1; r < world; ++r) {
      if (table[r][i].item<int64_t>() != table[0][i].item<int64_t>()) differ.push_back(r);
    }
    if (differ.empty()) continue;
    differences.push_back(absl::StrCat(
        "the ", items[i].what, " (rank", differ.size() > 1 ? "s " : " ",
        absl::StrJoin(differ, ", "), differ.size() > 1 ? " differ" : " differs", " from rank 0)"));
  }
  if (differences.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("ranks disagree on ", absl::StrJoin(differences, "; on "),
                   ": every rank must run the same command on the same data"));
}

absl::StatusOr<double> SumAcrossRanks(ProcessGroup& group, double value) {
  at::Tensor t = at::tensor({value}, at::kDouble);
  if (absl::Status s = group.AllReduceSum(t); !s.ok()) return s;
  return t[0].item<double>();
}

absl::StatusOr<double> GlobalMean(ProcessGroup& group, double value, double weight) {
  at::Tensor t = at::tensor({value * weight, weight}, at::kDouble);
  if (absl::Status s = group.AllReduceSum(t); !s.ok()) return s;
  const double total_weight = t[1].item<double>();
  return total_weight != 0 ? t[0].item<double>() / total_weight : std::nan("");
}

absl::StatusOr<std::string> BroadcastBytes(ProcessGroup& group, const std::string& bytes,
                                           int root) {
  if (group.world_size() == 1) return bytes;
  at::Tensor size = at::tensor({static_cast<int64_t>(bytes.size())}, at::kLong);
  if (absl::Status s = group.Broadcast(size, root); !s.ok()) return s;
  const int64_t n = size[0].item<int64_t>();
  if (n == 0) return std::string();
  at::Tensor data = at::empty({n}, at::kByte);
  if (group.rank() == root) std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
  if (absl::Status s = group.Broadcast(data, root); !s.ok()) return s;
  return std::string(static_cast<const char*>(data.data_ptr()), static_cast<size_t>(n));
}

GradientAllReducer::GradientAllReducer(
    std::shared_ptr<ProcessGroup> group,
    std::vector<std::pair<std::string, at::Tensor>> named_parameters,
    GradientAllReducerOptions options)
    : group_(std::move(group)) {
  for (auto& named : named_parameters) {
    if (named.second.requires_grad()) trained_.push_back(std::move(named));
  }
  int64_t bucket_bytes = 0;
  for (size_t i = 0; i < trained_.size(); ++i) {
    const at::Tensor& p = trained_[i].second;
    const bool dtype_changes =
        !buckets_.empty() && !buckets_.back().empty() &&
        trained_[buckets_.back().back()].second.scalar_type() != p.scalar_type();
    if (buckets_.empty() || bucket_bytes >= options.bucket_bytes || dtype_changes) {
      buckets_.emplace_back();
      bucket_bytes = 0;
    }
    buckets_.back().push_back(i);
    bucket_bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
}

absl::Status GradientAllReducer::AllReduceGradients() {
  const int world = group_->world_size();
  if (world == 1) return absl::OkStatus();
  at::NoGradGuard no_grad;
  for (const std::vector<size_t>& bucket : buckets_) {
    const c10::ScalarType dtype = trained_[bucket.front()].second.scalar_type();
    int64_t total = 0;
    for (size_t i : bucket) total += trained_[i].second.numel();
    // [gradients of the bucket's parameters..., one has-a-gradient flag per parameter]
    at::Tensor flat =
        at::empty({total + static_cast<int64_t>(bucket.size())}, at::TensorOptions().dtype(dtype));
    int64_t offset = 0;
    for (size_t k = 0; k < bucket.size(); ++k) {
      const at::Tensor& p = trained_[bucket[k]].second;
      at::Tensor slice = flat.narrow(0, offset, p.numel());
      const at::Tensor& grad = p.grad();
      if (grad.defined()) {
        slice.copy_(grad.reshape(-1));
      } else {
        slice.zero_();
      }
      flat[total + static_cast<int64_t>(k)] = grad.defined() ? 1 : 0;
      offset += p.numel();
    }
    if (absl::Status s = group_->AllReduceSum(flat); !s.ok()) return s;
    offset = 0;
    for (size_t k = 0; k < bucket.size(); ++k) {
      at::Tensor& p = trained_[bucket[k]].second;
      const at::Tensor mean = flat.narrow(0, offset, p.numel()).view(p.sizes()).div_(world);
      offset += p.numel();
      if (flat[total + static_cast<int64_t>(k)].item<double>() < 0.5) continue;  // no rank had one
      if (p.grad().defined()) {
        p.mutable_grad().copy_(mean);
      } else {
        p.mutable_grad() = mean.to(p.device()).clone();
      }
    }
  }
  return absl::OkStatus();
}

absl::Status GradientAllReducer::BroadcastParameters(int root) {
  if (group_->world_size() == 1) return absl::OkStatus();
  at::NoGradGuard no_grad;
  for (const std::vector<size_t>& bucket : buckets_) {
    std::vector<at::Tensor> flat_parts;
    for (size_t i : bucket) flat_parts.push_back(trained_[i].second.detach().cpu().reshape(-1));
    at::Tensor flat = at::cat(flat_parts);
    if (absl::Status s = group_->Broadcast(flat, root); !s.ok()) return s;
    int64_t offset = 0;
    for (size_t i : bucket) {
      at::Tensor& p = trained_[i].second;
      p.copy_(flat.narrow(0, offset, p.numel()).view(p.sizes()));
      offset += p.numel();
    }
  }
  return absl::OkStatus();
}

}  // namespace lgpt
