// The cache tests' check of KVRollback: a cache that took a speculative step and forgot its
// rejected entries against one that decoded only the kept ones, over the same stream.
#ifndef LGPT_CACHE_ROLLBACK_TEST_UTIL_H_
#define LGPT_CACHE_ROLLBACK_TEST_UTIL_H_

#include <cstdint>

#include "cache/kv_cache.h"

namespace lgpt {

struct RollbackStream {
  KVCacheGeometry geometry;  // the caches' (batch size 1); entries and queries follow it
  int64_t prompt = 10;       // prefilled in one chunk
  int64_t begin = 12;        // decoded one at a time up to here
  int64_t step = 5;          // the speculative step's entries, at begin .. begin + step - 1
  int64_t keep = 2;          // of which the first `keep` stay (1 .. step)
  int64_t total = 24;        // then decoded one at a time up to here
};

// Drives `speculating` and `plain`, two empty caches of `stream.geometry`, through the same
// entries: the prompt, decode steps up to `begin`; then `speculating` takes one sequential step
// of `step` entries (KVStep.sequential) and Truncate(begin + keep), while `plain` decodes the
// `keep` entries one at a time; then both decode up to `total`. Every layer attends with the
// same queries (2 per group). Returns the largest difference between the two caches' attention
// outputs from `begin` on (the speculative step's kept rows included); a failed Truncate or
// step fails the calling test and returns infinity.
double RollbackDifference(KVCache& speculating, KVCache& plain, const RollbackStream& stream);

}  // namespace lgpt

#endif  // LGPT_CACHE_ROLLBACK_TEST_UTIL_H_
