// A guard for tools that build a model of a given shape with fresh weights (init_checkpoint,
// pretrain, eval_cache --random_model): an impossible shape is refused with its sizes before
// its initialisation fills the memory and the kernel's OOM killer ends the process.
#ifndef LGPT_TOOLS_MODEL_MEMORY_H_
#define LGPT_TOOLS_MODEL_MEMORY_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/config/config.h"

namespace lgpt {

// Parameters of the shape, counted on a model built with its projections left uninitialised
// (their pages never touched). InvalidArgument for a config the model cannot build.
absl::StatusOr<int64_t> CountParameters(const Config& config);

// ResourceExhausted, naming the sizes, when `bytes_per_parameter` bytes for each of the shape's
// parameters exceed the available memory (`purpose`: "initialising them", "training them");
// OK where the available memory is unknown.
absl::Status CheckParametersFitMemory(const Config& config, int64_t bytes_per_parameter,
                                      absl::string_view purpose);

}  // namespace lgpt

#endif  // LGPT_TOOLS_MODEL_MEMORY_H_
