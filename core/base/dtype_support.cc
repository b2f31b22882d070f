#include "core/base/dtype_support.h"

#include <ATen/ATen.h>

#include <exception>

namespace lgpt {

bool MultipliesMatrices(const c10::Device& device, c10::ScalarType dtype) {
  try {
    const at::Tensor x = at::ones({1, 1}, at::TensorOptions().dtype(dtype).device(device));
    at::addmm(x, x, x);
    return true;
  } catch (const std::exception&) {  // c10::Error: not implemented, or no such device
    return false;
  }
}

}  // namespace lgpt
