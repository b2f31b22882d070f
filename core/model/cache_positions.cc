#include "core/model/cache_positions.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace lgpt {

CachePositions::CachePositions(GPTImpl& model, KVCache& cache, int64_t next)
    : model_(model),
      cache_(cache),
      shifts_(cache.ShiftsPositions()),
      context_(std::min(model.config().block_size, cache.max_sequence_length())),
      next_(next) {}

absl::StatusOr<int64_t> CachePositions::MakeRoom(int64_t steps) {
  if (steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("a step needs >= 1 token, got ", steps));
  }
  if (!shifts_) return steps;
  const GPTImpl& model = model_;
  ASSIGN_OR_RETURN(const int64_t shift,
                   cache_.mutable_position_shifter()->MakeRoom(
                       next_, steps, [&model](int64_t layer, const at::Tensor& keys, int64_t by) {
                         return model.ShiftKeys(layer, keys, by);
                       }));
  next_ -= shift;
  shifted_ += shift;
  const int64_t fits = std::min(steps, context_ - next_);
  if (fits < 1) {
    return absl::InternalError(absl::StrCat(cache_.DebugName(), " made no room at cache position ",
                                            next_, " of a ", context_, "-token context"));
  }
  return fits;
}

at::Tensor CachePositions::Take(int64_t steps, int64_t rows) {
  const at::Tensor positions =
      at::arange(next_, next_ + steps, at::kLong).unsqueeze(0).expand({rows, steps});
  next_ += steps;
  return positions;
}

}  // namespace lgpt
