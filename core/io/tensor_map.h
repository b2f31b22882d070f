// A named set of tensors, as a checkpoint file holds them (name -> tensor, sorted by name).
#ifndef LGPT_CORE_IO_TENSOR_MAP_H_
#define LGPT_CORE_IO_TENSOR_MAP_H_

#include <map>
#include <string>

#include <ATen/core/Tensor.h>

namespace lgpt {

using TensorMap = std::map<std::string, at::Tensor>;

}  // namespace lgpt

#endif  // LGPT_CORE_IO_TENSOR_MAP_H_
