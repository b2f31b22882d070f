// TEMPORARY stand-in (branch finetune) for the real writer being written in branch convert:
// same declaration, so the lead keeps the convert branch's files when merging.
#ifndef LGPT_CORE_TORCH_PICKLE_WRITER_H_
#define LGPT_CORE_TORCH_PICKLE_WRITER_H_

#include <string>

#include "absl/status/status.h"
#include "core/tensor_map.h"

namespace lgpt {

// Writes `tensors` as a torch.save zip file (a plain dict name -> tensor) that torch.load
// and ReadTorchStateDict read.
absl::Status WriteTorchStateDict(const std::string& path, const TensorMap& tensors);

}  // namespace lgpt

#endif  // LGPT_CORE_TORCH_PICKLE_WRITER_H_
