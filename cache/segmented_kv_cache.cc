#include "cache/segmented_kv_cache.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace lgpt {

absl::StatusOr<SegmentedKVCache> SegmentedKVCache::Create(std::vector<KVCache*> segments,
                                                          std::vector<int64_t> lengths) {
  if (segments.empty()) {
    return absl::InvalidArgumentError("SegmentedKVCache needs at least one segment");
  }
  if (lengths.size() != segments.size()) {
    return absl::InvalidArgumentError(absl::StrCat("SegmentedKVCache got ", segments.size(),
                                                   " segments and ", lengths.size(), " lengths"));
  }
  for (size_t s = 0; s < segments.size(); ++s) {
    if (segments[s] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("SegmentedKVCache segment ", s, " is null"));
    }
    if (segments[s]->batch_size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat("SegmentedKVCache segment ", s,
                                                     " has batch size ", segments[s]->batch_size(),
                                                     ", must be 1"));
    }
    if (segments[s]->num_layers() != segments[0]->num_layers()) {
      return absl::InvalidArgumentError(
          absl::StrCat("SegmentedKVCache segment ", s, " has ", segments[s]->num_layers(),
                       " layers, segment 0 ", segments[0]->num_layers()));
    }
    if (lengths[s] < 1) {
      return absl::InvalidArgumentError(absl::StrCat("SegmentedKVCache segment ", s, " has length ",
                                                     lengths[s], ", must be >= 1"));
    }
  }
  return SegmentedKVCache(std::move(segments), std::move(lengths));
}

SegmentedKVCache::SegmentedKVCache(std::vector<KVCache*> segments, std::vector<int64_t> lengths)
    : segments_(std::move(segments)), lengths_(std::move(lengths)) {
  for (int64_t length : lengths_) {
    offsets_.push_back(total_);
    total_ += length;
  }
  rows_begin_ = segments_.size();
  while (rows_begin_ > 0 && lengths_[rows_begin_ - 1] == 1) --rows_begin_;
  if (segments_.size() - rows_begin_ >= 2) {
    // Batch-1 caches of one model, as Create checked: BatchedKVCache::Create cannot fail.
    rows_.emplace(*BatchedKVCache::Create(
        std::vector<KVCache*>(segments_.begin() + rows_begin_, segments_.end())));
  } else {
    rows_begin_ = segments_.size();
  }
}

std::vector<int64_t> SegmentedKVCache::LastSteps() const {
  std::vector<int64_t> last;
  for (size_t s = 0; s < segments_.size(); ++s) last.push_back(offsets_[s] + lengths_[s] - 1);
  return last;
}

absl::StatusOr<const std::vector<KVStep>*> SegmentedKVCache::SegmentSteps(
    const KVStep& step) const {
  if (split_positions_.defined() && split_positions_.is_same(step.positions)) {
    return &segment_steps_;
  }
  if (step.positions.dim() != 2 || step.positions.size(0) != 1 ||
      step.positions.size(1) != total_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SegmentedKVCache of ", total_, " steps got positions ", ShapeString(step.positions)));
  }
  const at::Tensor host = step.positions.to(at::kCPU, at::kLong).contiguous();
  const int64_t* positions = host.data_ptr<int64_t>();
  std::vector<KVStep> steps(segments_.size());
  for (size_t s = 0; s < segments_.size(); ++s) {
    KVStep& segment = steps[s];
    segment.positions = step.positions.narrow(1, offsets_[s], lengths_[s]);
    const auto [lowest, highest] =
        std::minmax_element(positions + offsets_[s], positions + offsets_[s] + lengths_[s]);
    segment.min_position = *lowest;
    segment.max_position = *highest;
  }
  segment_steps_ = std::move(steps);
  split_positions_ = step.positions;
  if (rows_) {
    // [1, rows] -> [rows, 1]: a view, made once per model step (BatchedKVCache splits it once).
    const int64_t rows = static_cast<int64_t>(segments_.size() - rows_begin_);
    rows_step_.positions = step.positions.narrow(1, offsets_[rows_begin_], rows).view({rows, 1});
    const auto [lowest, highest] = std::minmax_element(positions + offsets_[rows_begin_],
                                                       positions + offsets_[rows_begin_] + rows);
    rows_step_.min_position = *lowest;
    rows_step_.max_position = *highest;
  }
  return &segment_steps_;
}

absl::Status SegmentedKVCache::CheckStep(const KVStep& step, int64_t batch_size) const {
  if (batch_size != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a step of ", batch_size, " rows for a SegmentedKVCache (one row)"));
  }
  ASSIGN_OR_RETURN(const std::vector<KVStep>* steps, SegmentSteps(step));
  for (size_t s = 0; s < segments_.size(); ++s) {
    const absl::Status status = segments_[s]->CheckStep((*steps)[s], 1);
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat("segment ", s, ": ", status.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<KVView> SegmentedKVCache::Update(int64_t layer, const KVStep& step,
                                                const at::Tensor& keys, const at::Tensor& values) {
  return absl::UnimplementedError(
      "SegmentedKVCache has no single view of its segments' entries; use UpdateAndAttend");
}

absl::StatusOr<at::Tensor> SegmentedKVCache::UpdateAndAttend(int64_t layer, const KVStep& step,
                                                             const at::Tensor& q,
                                                             const at::Tensor& keys,
                                                             const at::Tensor& values,
                                                             const AttentionParams& params) {
  ASSIGN_OR_RETURN(const std::vector<KVStep>* steps, SegmentSteps(step));
  if (q.dim() != 4 || q.size(2) != total_) {
    return absl::InvalidArgumentError(
        absl::StrCat("SegmentedKVCache of ", total_, " steps got queries ", ShapeString(q)));
  }
  std::vector<at::Tensor> outputs;
  outputs.reserve(rows_begin_ + 1);
  for (size_t s = 0; s < rows_begin_; ++s) {
    const int64_t begin = offsets_[s], length = lengths_[s];
    // Contiguous slices, as a batch-1 run of the chunk hands them to its cache.
    ASSIGN_OR_RETURN(at::Tensor y, segments_[s]->UpdateAndAttend(
                                       layer, (*steps)[s], q.narrow(2, begin, length).contiguous(),
                                       keys.narrow(2, begin, length).contiguous(),
                                       values.narrow(2, begin, length).contiguous(), params));
    outputs.push_back(std::move(y));
  }
  if (rows_) {
    // The rows' steps [1, *, rows, hs] as a batch of one-step rows [rows, *, 1, hs].
    const int64_t begin = offsets_[rows_begin_], rows = total_ - begin;
    auto as_rows = [&](const at::Tensor& t) {
      return t.narrow(2, begin, rows).permute({2, 1, 0, 3}).contiguous();
    };
    ASSIGN_OR_RETURN(at::Tensor y, rows_->UpdateAndAttend(layer, rows_step_, as_rows(q),
                                                          as_rows(keys), as_rows(values), params));
    outputs.push_back(y.permute({2, 1, 0, 3}));  // back to [1, n_head, rows, hs]
  }
  return outputs.size() == 1 && !rows_ ? outputs.front() : at::cat(outputs, 2);
}

void SegmentedKVCache::Reset() {
  for (KVCache* segment : segments_) segment->Reset();
}

int64_t SegmentedKVCache::AllocatedBytes() const {
  int64_t bytes = 0;
  for (const KVCache* segment : segments_) bytes += segment->AllocatedBytes();
  return bytes;
}

int64_t SegmentedKVCache::IndexBytes() const {
  int64_t bytes = 0;
  for (const KVCache* segment : segments_) bytes += segment->IndexBytes();
  return bytes;
}

int64_t SegmentedKVCache::max_sequence_length() const {
  int64_t length = std::numeric_limits<int64_t>::max();
  for (const KVCache* segment : segments_) {
    length = std::min(length, segment->max_sequence_length());
  }
  return length;
}

std::string SegmentedKVCache::DebugName() const {
  return absl::StrCat("segmented(", segments_.size(), " segments, ", total_, " steps)");
}

}  // namespace lgpt
