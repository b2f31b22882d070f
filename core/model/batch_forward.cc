#include "core/model/batch_forward.h"

#include <ATen/ATen.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "cache/kv_batch.h"
#include "cache/routing_kv_cache.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"

namespace lgpt {
namespace {

absl::Status CheckChunk(const SequenceChunk& chunk, size_t index, int64_t adapter_slots) {
  const at::Tensor& ids = chunk.ids;
  const at::Tensor& positions = chunk.positions;
  if (chunk.cache == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", index, " has no KV cache"));
  }
  if (!ids.defined() || ids.dim() != 2 || ids.size(0) != 1 || ids.size(1) < 1 ||
      ids.scalar_type() != at::kLong || !positions.defined() ||
      !positions.sizes().equals(ids.sizes()) || positions.scalar_type() != at::kLong) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", index, " needs int64 ids and positions of shape [1, T], got ",
                     ids.defined() ? ShapeString(ids) : "none", " and ",
                     positions.defined() ? ShapeString(positions) : "none"));
  }
  if (chunk.adapter < -1 || chunk.adapter >= adapter_slots) {
    return InvalidFieldError(
        "SequenceChunk.adapter",
        absl::StrCat("chunk ", index, ": SequenceChunk.adapter is ", chunk.adapter, ": ",
                     adapter_slots == 0
                         ? "the model serves no adapters (only -1, the base model)"
                         : absl::StrCat("the model's adapter slots are [0, ", adapter_slots,
                                        "), or -1 for the base model")));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<at::Tensor> ForwardChunks(GPTImpl& model, const std::vector<SequenceChunk>& chunks) {
  if (chunks.empty()) return absl::InvalidArgumentError("ForwardChunks needs at least one chunk");
  KVBatch batch;
  batch.axis = KVBatch::Axis::kBatch;
  std::vector<at::Tensor> ids, positions;
  bool adapters = false;    // whether any chunk uses one
  bool sequential = false;  // whether any chunk attends sequentially
  for (size_t s = 0; s < chunks.size(); ++s) {
    RETURN_IF_ERROR(CheckChunk(chunks[s], s, model.adapter_slots()));
    adapters = adapters || chunks[s].adapter >= 0;
    sequential = sequential || chunks[s].sequential;
    batch.caches.push_back(chunks[s].cache);
    batch.lengths.push_back(chunks[s].ids.size(1));
    if (batch.lengths.back() > 1) batch.axis = KVBatch::Axis::kTime;
    ids.push_back(chunks[s].ids);
    positions.push_back(chunks[s].positions);
  }
  const int64_t count = batch.sequences();
  ForwardOptions forward;
  if (count == 1) {
    // One chunk: the batch-1 forward pass itself.
    const SequenceChunk& chunk = chunks.front();
    forward.positions = positions.front();
    forward.last_logits_only = !chunk.all_logits;
    forward.sequential = chunk.sequential;
    if (adapters) forward.adapters = {chunk.adapter};
    ASSIGN_OR_RETURN(at::Tensor logits, model.Forward(ids.front(), chunk.cache, forward));
    return logits.reshape({-1, logits.size(-1)});  // [1 or T, V]
  }
  const bool along_time = batch.axis == KVBatch::Axis::kTime;
  const int64_t dim = along_time ? 1 : 0;  // [1, tokens] or [chunks, 1]
  if (sequential) {
    for (const SequenceChunk& chunk : chunks) batch.sequential.push_back(chunk.sequential);
  }
  if (along_time) {
    int64_t begin = 0;
    for (size_t s = 0; s < chunks.size(); ++s) {
      const int64_t end = begin + batch.lengths[s];
      for (int64_t t = chunks[s].all_logits ? begin : end - 1; t < end; ++t) {
        forward.logit_steps.push_back(t);
      }
      begin = end;
    }
  } else {
    forward.last_logits_only = true;
  }
  if (adapters) {
    // A slot per row: per chunk in a decode step, per token when the chunks lie end to end.
    for (size_t s = 0; s < chunks.size(); ++s) {
      forward.adapters.insert(forward.adapters.end(),
                              static_cast<size_t>(along_time ? batch.lengths[s] : 1),
                              chunks[s].adapter);
    }
  }
  forward.positions = at::cat(positions, dim);
  ASSIGN_OR_RETURN(RoutingKVCache cache, RoutingKVCache::Create(std::move(batch)));
  ASSIGN_OR_RETURN(at::Tensor logits, model.Forward(at::cat(ids, dim), &cache, forward));
  return logits.reshape({-1, logits.size(-1)});  // [rows, V] from [1, rows, V] or [chunks, 1, V]
}

}  // namespace lgpt
