// The positions a token stream takes in a KV cache. With a cache that keeps stream positions
// they are 0, 1, 2, ... and the stream ends at the model's context. With a cache that shifts
// (KVCache::ShiftsPositions(): window and sink caches with KVCacheSpec.positions = "cache"),
// MakeRoom asks the cache for room before each step, so the positions stay below the context
// however long the stream (cache/policy_kv_cache.h describes the shift and its cost).
//
//   CachePositions stream(model, cache, /*next=*/0);
//   ASSIGN_OR_RETURN(int64_t length, stream.MakeRoom(chunk));  // <= chunk tokens fit
//   forward.positions = stream.Take(length, batch);            // [batch, length]
#ifndef LGPT_CORE_MODEL_CACHE_POSITIONS_H_
#define LGPT_CORE_MODEL_CACHE_POSITIONS_H_

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/statusor.h"
#include "cache/kv_cache.h"
#include "core/model/gpt.h"

namespace lgpt {

class CachePositions {
 public:
  // `next`: the cache position of the stream's next token (the cache holds [0, next)).
  CachePositions(GPTImpl& model, KVCache& cache, int64_t next = 0);

  // How many of the next `steps` tokens one model step may take: `steps`, or fewer (at least
  // 1) when a shifting cache would otherwise cross the context; shifts the cache first when
  // the step needs room. Non-shifting caches return `steps` (the model checks the bounds).
  absl::StatusOr<int64_t> MakeRoom(int64_t steps);
  // Positions [rows, steps] int64 (next .. next + steps - 1 on every row); advances past them.
  at::Tensor Take(int64_t steps, int64_t rows = 1);
  // Take(1) of one row as a number (a batched decode step builds one [B, 1] tensor for all).
  int64_t TakeOne() { return next_++; }
  // Back to `next` (<= next()): positions taken by a speculative step whose entries the cache
  // forgot (KVRollback::Truncate(next)).
  void Rewind(int64_t next) { next_ = std::min(next_, next); }

  int64_t next() const { return next_; }
  // Positions the cache moved down so far: stream position = cache position + shifted() for
  // every entry but the sinks.
  int64_t shifted() const { return shifted_; }
  bool shifts() const { return shifts_; }

 private:
  GPTImpl& model_;
  KVCache& cache_;
  bool shifts_;
  int64_t context_;
  int64_t next_;
  int64_t shifted_ = 0;
};

}  // namespace lgpt

#endif  // LGPT_CORE_MODEL_CACHE_POSITIONS_H_
