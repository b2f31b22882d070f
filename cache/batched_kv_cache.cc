#include "cache/batched_kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/ops/decode_attention.h"

namespace lgpt {
namespace {

// Row `row` of t ([B, ...]) as a [1, ...] tensor over t's memory that does not own it.
at::Tensor RowView(const at::Tensor& t, int64_t row) {
  std::vector<int64_t> sizes = t.sizes().vec();
  sizes[0] = 1;
  return at::from_blob(static_cast<char*>(t.data_ptr()) + row * t.stride(0) * t.element_size(),
                       sizes, t.strides(), t.options());
}

}  // namespace

absl::StatusOr<BatchedKVCache> BatchedKVCache::Create(std::vector<KVCache*> rows) {
  if (rows.empty()) return absl::InvalidArgumentError("BatchedKVCache needs at least one row");
  for (size_t b = 0; b < rows.size(); ++b) {
    if (rows[b] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("BatchedKVCache row ", b, " is null"));
    }
    if (rows[b]->batch_size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat("BatchedKVCache row ", b, " has batch size ",
                                                     rows[b]->batch_size(), ", must be 1"));
    }
    if (rows[b]->num_layers() != rows[0]->num_layers()) {
      return absl::InvalidArgumentError(absl::StrCat("BatchedKVCache row ", b, " has ",
                                                     rows[b]->num_layers(), " layers, row 0 ",
                                                     rows[0]->num_layers()));
    }
  }
  return BatchedKVCache(std::move(rows));
}

absl::StatusOr<const std::vector<KVStep>*> BatchedKVCache::RowSteps(const KVStep& step) const {
  if (split_positions_.defined() && split_positions_.is_same(step.positions)) return &row_steps_;
  if (step.positions.dim() != 2 || step.positions.size(0) != batch_size()) {
    return absl::InvalidArgumentError(absl::StrCat("BatchedKVCache of ", batch_size(),
                                                   " rows got positions ",
                                                   ShapeString(step.positions)));
  }
  const at::Tensor host = step.positions.to(at::kCPU, at::kLong).contiguous();
  const auto positions = host.accessor<int64_t, 2>();
  std::vector<KVStep> steps(rows_.size());
  for (int64_t b = 0; b < batch_size(); ++b) {
    KVStep& row = steps[b];
    row.positions = step.positions.narrow(0, b, 1);
    row.min_position = std::numeric_limits<int64_t>::max();
    row.max_position = std::numeric_limits<int64_t>::min();
    for (int64_t t = 0; t < host.size(1); ++t) {
      row.min_position = std::min(row.min_position, positions[b][t]);
      row.max_position = std::max(row.max_position, positions[b][t]);
    }
  }
  row_steps_ = std::move(steps);
  split_positions_ = step.positions;
  return &row_steps_;
}

absl::Status BatchedKVCache::CheckStep(const KVStep& step, int64_t batch_size) const {
  if (batch_size != this->batch_size()) {
    return absl::InvalidArgumentError(absl::StrCat("a step of ", batch_size,
                                                   " rows for a BatchedKVCache of ",
                                                   this->batch_size()));
  }
  ASSIGN_OR_RETURN(const std::vector<KVStep>* steps, RowSteps(step));
  for (size_t b = 0; b < rows_.size(); ++b) {
    const absl::Status status = rows_[b]->CheckStep((*steps)[b], 1);
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat("row ", b, ": ", status.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<KVView> BatchedKVCache::Update(int64_t layer, const KVStep& step,
                                              const at::Tensor& keys, const at::Tensor& values) {
  ASSIGN_OR_RETURN(const std::vector<KVStep>* steps, RowSteps(step));
  std::vector<KVView> views;
  int64_t slots = 0;
  for (size_t b = 0; b < rows_.size(); ++b) {
    const int64_t row = static_cast<int64_t>(b);
    ASSIGN_OR_RETURN(KVView view, rows_[b]->Update(layer, (*steps)[b], keys.narrow(0, row, 1),
                                                   values.narrow(0, row, 1)));
    slots = std::max(slots, view.keys.size(2));
    views.push_back(std::move(view));
  }
  // Rows hold different numbers of entries: pad each to the longest with empty slots.
  const int64_t groups = keys.size(1);
  std::vector<at::Tensor> k, v, p;
  for (KVView& view : views) {
    const int64_t pad = slots - view.keys.size(2);
    at::Tensor positions = view.positions.expand({1, groups, view.positions.size(2)});
    if (pad > 0) {
      view.keys = at::constant_pad_nd(view.keys, {0, 0, 0, pad});
      view.values = at::constant_pad_nd(view.values, {0, 0, 0, pad});
      positions = at::constant_pad_nd(positions, {0, pad}, -1);
    }
    k.push_back(view.keys);
    v.push_back(view.values);
    p.push_back(positions);
  }
  return KVView{at::cat(k), at::cat(v), at::cat(p)};
}

absl::StatusOr<at::Tensor> BatchedKVCache::UpdateAndAttend(int64_t layer, const KVStep& step,
                                                           const at::Tensor& q,
                                                           const at::Tensor& keys,
                                                           const at::Tensor& values,
                                                           const AttentionParams& params) {
  ASSIGN_OR_RETURN(const std::vector<KVStep>* steps, RowSteps(step));
  if (rows_.size() > 1 && keys.defined() && keys.dim() == 4 &&
      DecodeAttentionRowsApplies(q, keys.size(1), step.positions)) {
    RETURN_IF_ERROR(CheckQueries(layer, q, keys));
    return UpdateAndAttendRows(layer, step, *steps, q, keys, values, params);
  }
  std::vector<at::Tensor> outputs;
  outputs.reserve(rows_.size());
  for (size_t b = 0; b < rows_.size(); ++b) {
    const int64_t row = static_cast<int64_t>(b);
    ASSIGN_OR_RETURN(at::Tensor y,
                     rows_[b]->UpdateAndAttend(layer, (*steps)[b], q.narrow(0, row, 1),
                                               keys.narrow(0, row, 1), values.narrow(0, row, 1),
                                               params));
    outputs.push_back(std::move(y));
  }
  return rows_.size() == 1 ? outputs.front() : at::cat(outputs);
}

absl::StatusOr<at::Tensor> BatchedKVCache::UpdateAndAttendRows(
    int64_t layer, const KVStep& step, const std::vector<KVStep>& steps, const at::Tensor& q,
    const at::Tensor& keys, const at::Tensor& values, const AttentionParams& params) {
  std::vector<DecodeRow> fast;
  std::vector<int64_t> fast_rows;
  std::vector<std::pair<int64_t, at::Tensor>> others;  // rows that attend on their own
  for (size_t b = 0; b < rows_.size(); ++b) {
    const int64_t row = static_cast<int64_t>(b);
    // UpdateForDecode copies the row at once: a view made without LibTorch's dispatcher (a
    // narrow is three dispatched operations, for every request and layer of a step).
    ASSIGN_OR_RETURN(
        std::optional<DecodeRow> source,
        rows_[b]->UpdateForDecode(layer, steps[b], RowView(keys, row), RowView(values, row)));
    if (source.has_value()) {
      fast.push_back(std::move(*source));
      fast_rows.push_back(row);
      continue;
    }
    ASSIGN_OR_RETURN(at::Tensor y, rows_[b]->UpdateAndAttend(layer, steps[b], q.narrow(0, row, 1),
                                                             keys.narrow(0, row, 1),
                                                             values.narrow(0, row, 1), params));
    others.emplace_back(row, std::move(y));
  }
  const int64_t groups = keys.size(1);
  if (others.empty()) return DecodeAttentionRows(q, groups, fast, step.positions, params);
  at::Tensor out = at::empty(q.sizes(), q.options());  // [B, n_head, T, hs]
  if (!fast.empty()) {
    const at::Tensor index = at::tensor(fast_rows, at::kLong);
    out.index_copy_(0, index,
                    DecodeAttentionRows(q.index_select(0, index), groups, fast,
                                        step.positions.index_select(0, index), params));
  }
  for (const auto& [row, y] : others) out.narrow(0, row, 1).copy_(y);
  return out;
}

void BatchedKVCache::Reset() {
  for (KVCache* row : rows_) row->Reset();
}

int64_t BatchedKVCache::AllocatedBytes() const {
  int64_t bytes = 0;
  for (const KVCache* row : rows_) bytes += row->AllocatedBytes();
  return bytes;
}

int64_t BatchedKVCache::IndexBytes() const {
  int64_t bytes = 0;
  for (const KVCache* row : rows_) bytes += row->IndexBytes();
  return bytes;
}

int64_t BatchedKVCache::max_sequence_length() const {
  int64_t length = std::numeric_limits<int64_t>::max();
  for (const KVCache* row : rows_) length = std::min(length, row->max_sequence_length());
  return length;
}

std::string BatchedKVCache::DebugName() const {
  return absl::StrCat("batched(", rows_.size(), " rows)");
}

}  // namespace lgpt
