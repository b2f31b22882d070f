// Which element types LibTorch computes in on a device. Builds differ (Debian's LibTorch 1.13
// has no float16 matrix products on the CPU; PyPI's 2.x and CUDA have them), so loaders refuse
// and tests skip by asking LibTorch, not by its version.
#ifndef LGPT_CORE_BASE_DTYPE_SUPPORT_H_
#define LGPT_CORE_BASE_DTYPE_SUPPORT_H_

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace lgpt {

// Whether LibTorch multiplies matrices of `dtype` on `device` (one 1 x 1 product; false where it
// throws, a device that is absent included).
bool MultipliesMatrices(const c10::Device& device, c10::ScalarType dtype);

}  // namespace lgpt

#endif  // LGPT_CORE_BASE_DTYPE_SUPPORT_H_
