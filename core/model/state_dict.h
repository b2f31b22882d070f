// State dicts of torch modules by LitGPT name: reading them out, loading them in (with the
// checks a checkpoint's weights need), and the finiteness check every loader runs.
#ifndef LGPT_CORE_MODEL_STATE_DICT_H_
#define LGPT_CORE_MODEL_STATE_DICT_H_

#include <string>

#include <torch/nn/module.h>

#include "absl/status/status.h"
#include "core/io/tensor_map.h"

namespace lgpt {

// Copies `tensors` into the module's parameters and buffers by name (with dtype
// conversion). Missing or unexpected tensors and shape mismatches are errors naming the
// tensor; `source` names the file in messages. With `allow_missing`, parameters absent
// from `tensors` keep their values (used to load PEFT weights on top of a base). With
// `adopt_storage`, a contiguous tensor of the parameter's dtype and device becomes the
// parameter's storage instead of being copied (a memory-mapped checkpoint then costs no
// second copy; the mapping is private, so later in-place updates never reach the file).
absl::Status LoadStateDict(torch::nn::Module& module, const TensorMap& tensors,
                           const std::string& source, bool allow_missing = false,
                           bool adopt_storage = false);

// Error naming the first tensor (in name order) holding a NaN or infinity, and the flat index of
// its first such element; `source` names the file. One pass over the floating-point data,
// in slices, so no tensor-sized temporary is made.
absl::Status CheckFinite(const TensorMap& tensors, const std::string& source);

// The module's parameters and persistent buffers by LitGPT name.
TensorMap StateDict(const torch::nn::Module& module);

}  // namespace lgpt

#endif  // LGPT_CORE_MODEL_STATE_DICT_H_
