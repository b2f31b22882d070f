// The layout of one model step over several sequences (llama.cpp's ubatch), as plain data:
// which cache serves which tokens of the step. Each sequence (a request's prompt chunk or its
// one decode token) keeps its own batch-1 KV cache of any kind; RoutingKVCache
// (cache/routing_kv_cache.h) hands each cache its part of every layer's attention.
//
//   Axis::kTime   the step is [1, sum of lengths]: the sequences' tokens end to end, sequence
//                 s the steps [offset_s, offset_s + lengths[s]) (prompt chunks, and decode
//                 tokens behind them in a mixed pass);
//   Axis::kBatch  the step is [S, 1]: row s is sequence s's one token (a decode step).
#ifndef LGPT_CACHE_KV_BATCH_H_
#define LGPT_CACHE_KV_BATCH_H_

#include <cstdint>
#include <vector>

#include "cache/kv_cache.h"

namespace lgpt {

struct KVBatch {
  enum class Axis { kTime, kBatch };
  Axis axis = Axis::kTime;
  std::vector<KVCache*> caches;  // one per sequence, batch size 1, not owned
  std::vector<int64_t> lengths;  // tokens per sequence (all 1 along kBatch)
  // Per sequence, whether its tokens attend as one-token steps would (KVStep::sequential:
  // a speculative verification chunk); empty: none (the step's own KVStep::sequential holds).
  std::vector<bool> sequential;

  int64_t sequences() const { return static_cast<int64_t>(caches.size()); }
  // Tokens of the step: the sum of lengths.
  int64_t tokens() const {
    int64_t total = 0;
    for (int64_t length : lengths) total += length;
    return total;
  }
};

}  // namespace lgpt

#endif  // LGPT_CACHE_KV_BATCH_H_
