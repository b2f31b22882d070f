#include "cache/kv_cache.h"

#include "absl/strings/str_cat.h"

namespace lgpt {

absl::Status CheckStepBounds(const KVStep& step, int64_t batch_size, int64_t max_batch_size,
                             int64_t max_sequence_length) {
  if (batch_size < 1 || batch_size > max_batch_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch of ", batch_size, " rows does not fit a KV cache built for ", max_batch_size));
  }
  if (step.min_position < 0) {
    return absl::OutOfRangeError(absl::StrCat("negative position ", step.min_position));
  }
  if (step.max_position >= max_sequence_length) {
    return absl::OutOfRangeError(absl::StrCat("position ", step.max_position,
                                              " is beyond the KV cache's max_sequence_length ",
                                              max_sequence_length));
  }
  return absl::OkStatus();
}

}  // namespace lgpt
