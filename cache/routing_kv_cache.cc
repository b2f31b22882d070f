#include "cache/routing_kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/device.h"
#include "core/base/status_macros.h"
#include "core/ops/decode_attention.h"
#include "core/ops/paged_attention.h"

namespace lgpt {
namespace {

// Row `row` of t ([B, ...]) as a [1, ...] tensor over t's memory that does not own it.
at::Tensor RowView(const at::Tensor& t, int64_t row) {
  std::vector<int64_t> sizes = t.sizes().vec();
  sizes[0] = 1;
  return at::from_blob(static_cast<char*>(t.data_ptr()) + row * t.stride(0) * t.element_size(),
                       sizes, t.strides(), t.options());
}

absl::Status CheckLayout(const KVBatch& batch) {
  if (batch.caches.empty()) {
    return absl::InvalidArgumentError("RoutingKVCache needs at least one sequence");
  }
  if (batch.lengths.size() != batch.caches.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KVBatch has ", batch.caches.size(), " caches and ", batch.lengths.size(), " lengths"));
  }
  if (!batch.sequential.empty() && batch.sequential.size() != batch.caches.size()) {
    return absl::InvalidArgumentError(absl::StrCat("KVBatch has ", batch.caches.size(),
                                                   " caches and ", batch.sequential.size(),
                                                   " sequential flags (none or one each)"));
  }
  for (size_t s = 0; s < batch.caches.size(); ++s) {
    const KVCache* cache = batch.caches[s];
    if (cache == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("KVBatch sequence ", s, " has no cache"));
    }
    if (cache->batch_size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KVBatch sequence ", s, "'s cache has batch size ", cache->batch_size(), ", must be 1"));
    }
    if (cache->num_layers() != batch.caches[0]->num_layers()) {
      return absl::InvalidArgumentError(absl::StrCat("KVBatch sequence ", s, "'s cache has ",
                                                     cache->num_layers(), " layers, sequence 0's ",
                                                     batch.caches[0]->num_layers()));
    }
    const int64_t length = batch.lengths[s];
    if (length < 1 || (batch.axis == KVBatch::Axis::kBatch && length != 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("KVBatch sequence ", s, " has length ", length, ", must be ",
                       batch.axis == KVBatch::Axis::kBatch ? "1 along the batch axis" : ">= 1"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RoutingKVCache> RoutingKVCache::Create(KVBatch batch) {
  RETURN_IF_ERROR(CheckLayout(batch));
  return RoutingKVCache(std::move(batch));
}

RoutingKVCache::RoutingKVCache(KVBatch batch) : batch_(std::move(batch)) {
  for (int64_t length : batch_.lengths) {
    offsets_.push_back(tokens_);
    tokens_ += length;
  }
  const size_t end = batch_.caches.size();
  if (batch_.axis == KVBatch::Axis::kBatch) {
    rows_begin_ = 0;
    return;
  }
  rows_begin_ = end;
  while (rows_begin_ > 0 && batch_.lengths[rows_begin_ - 1] == 1) --rows_begin_;
  // A single trailing one-token sequence attends on its own.
  if (end - rows_begin_ < 2) rows_begin_ = end;
}

int64_t RoutingKVCache::batch_size() const {
  return batch_.axis == KVBatch::Axis::kBatch ? batch_.sequences() : 1;
}

absl::StatusOr<const std::vector<KVStep>*> RoutingKVCache::SequenceSteps(const KVStep& step) const {
  if (split_positions_.defined() && split_positions_.is_same(step.positions)) {
    return &sequence_steps_;
  }
  const bool along_batch = batch_.axis == KVBatch::Axis::kBatch;
  const int64_t rows = along_batch ? batch_.sequences() : 1;
  const int64_t steps = along_batch ? 1 : tokens_;
  if (step.positions.dim() != 2 || step.positions.size(0) != rows ||
      step.positions.size(1) != steps) {
    return absl::InvalidArgumentError(absl::StrCat("a KVBatch of ", batch_.sequences(),
                                                   " sequences needs positions [", rows, ", ",
                                                   steps, "], got ", ShapeString(step.positions)));
  }
  // Along either axis the positions, flattened, are the sequences' in order.
  const at::Tensor host = step.positions.to(at::kCPU, at::kLong).contiguous();
  const int64_t* positions = host.data_ptr<int64_t>();
  const auto span_step = [&](at::Tensor view, int64_t begin, int64_t length) {
    KVStep part;
    part.positions = std::move(view);
    part.sequential = step.sequential;
    const auto [lowest, highest] =
        std::minmax_element(positions + begin, positions + begin + length);
    part.min_position = *lowest;
    part.max_position = *highest;
    return part;
  };
  std::vector<KVStep> parts;
  parts.reserve(batch_.caches.size());
  for (size_t s = 0; s < batch_.caches.size(); ++s) {
    const int64_t begin = offsets_[s], length = batch_.lengths[s];
    parts.push_back(span_step(
        along_batch ? step.positions.narrow(0, begin, 1) : step.positions.narrow(1, begin, length),
        begin, length));
    if (!batch_.sequential.empty() && batch_.sequential[s]) parts.back().sequential = true;
  }
  if (rows_begin_ < batch_.caches.size()) {
    // The rows' step [rows, 1]: a view, made once per model step.
    const int64_t begin = offsets_[rows_begin_], count = tokens_ - begin;
    rows_step_ = span_step(
        along_batch ? step.positions : step.positions.narrow(1, begin, count).view({count, 1}),
        begin, count);
  }
  sequence_steps_ = std::move(parts);
  split_positions_ = step.positions;
  return &sequence_steps_;
}

absl::Status RoutingKVCache::CheckStep(const KVStep& step, int64_t batch_size) const {
  if (batch_size != this->batch_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a step of ", batch_size, " rows for a KVBatch of ", this->batch_size()));
  }
  ASSIGN_OR_RETURN(const std::vector<KVStep>* steps, SequenceSteps(step));
  for (size_t s = 0; s < batch_.caches.size(); ++s) {
    const absl::Status status = batch_.caches[s]->CheckStep((*steps)[s], 1);
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat("sequence ", s, ": ", status.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<KVView> RoutingKVCache::Update(int64_t layer, const KVStep& step,
                                              const at::Tensor& keys, const at::Tensor& values) {
  return absl::UnimplementedError(
      "RoutingKVCache has no single view of its sequences' entries; use UpdateAndAttend");
}

absl::StatusOr<at::Tensor> RoutingKVCache::UpdateAndAttend(int64_t layer, const KVStep& step,
                                                           const at::Tensor& q,
                                                           const at::Tensor& keys,
                                                           const at::Tensor& values,
                                                           const AttentionParams& params) {
  ASSIGN_OR_RETURN(const std::vector<KVStep>* steps, SequenceSteps(step));
  if (q.dim() != 4 || q.size(0) != batch_size() || q.size(2) != step.positions.size(1)) {
    return absl::InvalidArgumentError(absl::StrCat("a KVBatch step with positions ",
                                                   ShapeString(step.positions), " got queries ",
                                                   ShapeString(q)));
  }
  if (batch_.axis == KVBatch::Axis::kBatch) return AttendRows(layer, q, keys, values, params);
  std::vector<at::Tensor> outputs;
  outputs.reserve(rows_begin_ + 1);
  for (size_t s = 0; s < rows_begin_; ++s) {
    const int64_t begin = offsets_[s], length = batch_.lengths[s];
    // Contiguous slices, as a batch-1 run of the chunk hands them to its cache.
    ASSIGN_OR_RETURN(at::Tensor y, batch_.caches[s]->UpdateAndAttend(
                                       layer, (*steps)[s], q.narrow(2, begin, length).contiguous(),
                                       keys.narrow(2, begin, length).contiguous(),
                                       values.narrow(2, begin, length).contiguous(), params));
    outputs.push_back(std::move(y));
  }
  const bool rows = rows_begin_ < batch_.caches.size();
  if (rows) {
    // The rows' steps [1, *, rows, hs] as a batch of one-step rows [rows, *, 1, hs].
    const int64_t begin = offsets_[rows_begin_], count = tokens_ - begin;
    auto as_rows = [&](const at::Tensor& t) {
      return t.narrow(2, begin, count).permute({2, 1, 0, 3}).contiguous();
    };
    ASSIGN_OR_RETURN(at::Tensor y,
                     AttendRows(layer, as_rows(q), as_rows(keys), as_rows(values), params));
    outputs.push_back(y.permute({2, 1, 0, 3}));  // back to [1, n_head, rows, hs]
  }
  return outputs.size() == 1 && !rows ? outputs.front() : at::cat(outputs, 2);
}

absl::StatusOr<at::Tensor> RoutingKVCache::AttendRows(int64_t layer, const at::Tensor& q,
                                                      const at::Tensor& keys,
                                                      const at::Tensor& values,
                                                      const AttentionParams& params) {
  const int64_t count = q.size(0);
  const auto row_cache = [&](int64_t row) { return batch_.caches[rows_begin_ + row]; };
  const auto row_step = [&](int64_t row) -> const KVStep& {
    return sequence_steps_[rows_begin_ + row];
  };
  const auto alone = [&](int64_t row) { return AttendAlone(layer, row, q, keys, values, params); };
  if (count >= 2 && keys.defined() && keys.dim() == 4 && !q.device().is_cpu()) {
    ASSIGN_OR_RETURN(std::optional<at::Tensor> y, AttendTableRows(layer, q, keys, values, params));
    if (y.has_value()) return *std::move(y);
  }
  if (count < 2 || !keys.defined() || keys.dim() != 4 ||
      !DecodeAttentionRowsApplies(q, keys.size(1), rows_step_.positions)) {
    std::vector<at::Tensor> outputs;
    outputs.reserve(count);
    for (int64_t row = 0; row < count; ++row) {
      ASSIGN_OR_RETURN(at::Tensor y, alone(row));
      outputs.push_back(std::move(y));
    }
    return count == 1 ? outputs.front() : at::cat(outputs);
  }
  RETURN_IF_ERROR(CheckQueries(layer, q, keys));
  std::vector<DecodeRow> fast;
  std::vector<int64_t> fast_rows;
  std::vector<std::pair<int64_t, at::Tensor>> others;  // rows that attend on their own
  for (int64_t row = 0; row < count; ++row) {
    // UpdateForDecode copies the row at once: a view made without LibTorch's dispatcher (a
    // narrow is three dispatched operations, for every request and layer of a step).
    KVDecodeRows* decode = row_cache(row)->decode_rows();
    std::optional<DecodeRow> source;
    if (decode != nullptr) {
      ASSIGN_OR_RETURN(source, decode->UpdateForDecode(layer, row_step(row), RowView(keys, row),
                                                       RowView(values, row)));
    }
    if (source.has_value()) {
      fast.push_back(std::move(*source));
      fast_rows.push_back(row);
      continue;
    }
    ASSIGN_OR_RETURN(at::Tensor y, alone(row));
    others.emplace_back(row, std::move(y));
  }
  const int64_t groups = keys.size(1);
  const at::Tensor& positions = rows_step_.positions;  // [rows, 1]
  if (others.empty()) return DecodeAttentionRows(q, groups, fast, positions, params);
  at::Tensor out = at::empty(q.sizes(), q.options());  // [rows, n_head, 1, hs]
  if (!fast.empty()) {
    const at::Tensor index = at::tensor(fast_rows, at::kLong);
    out.index_copy_(0, index,
                    DecodeAttentionRows(q.index_select(0, index), groups, fast,
                                        positions.index_select(0, index), params));
  }
  for (const auto& [row, y] : others) out.narrow(0, row, 1).copy_(y);
  return out;
}

absl::StatusOr<at::Tensor> RoutingKVCache::AttendAlone(int64_t layer, int64_t row,
                                                       const at::Tensor& q, const at::Tensor& keys,
                                                       const at::Tensor& values,
                                                       const AttentionParams& params) {
  return batch_.caches[rows_begin_ + row]->UpdateAndAttend(
      layer, sequence_steps_[rows_begin_ + row], q.narrow(0, row, 1), keys.narrow(0, row, 1),
      values.narrow(0, row, 1), params);
}

absl::StatusOr<std::optional<at::Tensor>> RoutingKVCache::AttendTableRows(
    int64_t layer, const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
    const AttentionParams& params) {
  const int64_t count = q.size(0);
  std::vector<KVTableRows*> tables(count);
  bool any = false;
  for (int64_t row = 0; row < count; ++row) {
    tables[row] = batch_.caches[rows_begin_ + row]->table_rows();
    any = any || tables[row] != nullptr;
  }
  if (!any) return std::nullopt;
  RETURN_IF_ERROR(CheckQueries(layer, q, keys));
  // Rows by pool (its layer's key storage), each pool's in one launch.
  struct Pool {
    PagedKVLayer layer;
    std::vector<PagedDecodeRow> rows;
    std::vector<int64_t> indices;
  };
  std::vector<Pool> pools;
  at::Tensor out = at::empty(q.sizes(), q.options());  // [rows, n_head, 1, hs]
  for (int64_t row = 0; row < count; ++row) {
    const KVStep& step = sequence_steps_[rows_begin_ + row];
    std::optional<KVTableRows::Row> table_row;
    if (tables[row] != nullptr) {
      ASSIGN_OR_RETURN(table_row, tables[row]->UpdateForTable(layer, step, keys.narrow(0, row, 1),
                                                              values.narrow(0, row, 1)));
    }
    if (!table_row) {
      ASSIGN_OR_RETURN(const at::Tensor y, AttendAlone(layer, row, q, keys, values, params));
      out.narrow(0, row, 1).copy_(y);
      continue;
    }
    auto pool = std::find_if(pools.begin(), pools.end(), [&](const Pool& p) {
      return p.layer.keys.is_same(table_row->layer.keys);
    });
    if (pool == pools.end()) pool = pools.insert(pools.end(), Pool{table_row->layer, {}, {}});
    pool->rows.push_back(std::move(table_row->row));
    pool->indices.push_back(row);
  }
  if (pools.size() == 1 && pools[0].indices.size() == static_cast<size_t>(count)) {
    // Every row in one pool, in order (the usual step): no gather and no scatter.
    ASSIGN_OR_RETURN(const at::Tensor y,
                     PagedDecodeRows(q.select(2, 0), pools[0].layer, pools[0].rows,
                                     params));  // [rows, n_head, hs]
    return y.unsqueeze(2);
  }
  for (const Pool& pool : pools) {
    const at::Tensor index = ToDeviceQueued(at::tensor(pool.indices, at::kLong), q.device());
    ASSIGN_OR_RETURN(const at::Tensor y,
                     PagedDecodeRows(q.index_select(0, index).select(2, 0), pool.layer, pool.rows,
                                     params));  // [n, n_head, hs]
    out.index_copy_(0, index, y.unsqueeze(2));
  }
  return out;
}

void RoutingKVCache::Reset() {
  for (KVCache* cache : batch_.caches) cache->Reset();
}

int64_t RoutingKVCache::AllocatedBytes() const {
  int64_t bytes = 0;
  for (const KVCache* cache : batch_.caches) bytes += cache->AllocatedBytes();
  return bytes;
}

int64_t RoutingKVCache::IndexBytes() const {
  int64_t bytes = 0;
  for (const KVCache* cache : batch_.caches) bytes += cache->IndexBytes();
  return bytes;
}

int64_t RoutingKVCache::max_sequence_length() const {
  int64_t length = std::numeric_limits<int64_t>::max();
  for (const KVCache* cache : batch_.caches) {
    length = std::min(length, cache->max_sequence_length());
  }
  return length;
}

std::string RoutingKVCache::DebugName() const {
  return absl::StrCat("routing(", batch_.sequences(), " sequences, ", tokens_, " tokens along ",
                      batch_.axis == KVBatch::Axis::kBatch ? "the batch" : "time", ")");
}

}  // namespace lgpt
