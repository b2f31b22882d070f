// Block-quantised weights (core/ops/block_quant.h) on the device of the model: moving them, and
// the GEMV of a decoding step's few rows there. One kernel library per device: on CUDA a kernel
// of ours (block_quant.cu), on the CPU its twin, plain loops over the same arithmetic
// (block_quant_layout.h: the activations quantised to int8 per 32-block, exact int32 block dots,
// each row's blocks summed in kGemvParts interleaved parts, the parts added in order), which
// the kernel is tested against bit for bit. The twin's order of float additions differs from
// BlockQuantGemv's (one chain per row), so the two agree to rounding, not to the bit; the CPU's
// serving path keeps BlockQuantGemv.
//
// Many rows (prefill) are better served by dequantising the weight once on its device
// (DequantizeBlocks runs there) and multiplying through cuBLAS: kDeviceGemvMaxRows says where.
#ifndef LGPT_CORE_OPS_BLOCK_QUANT_DEVICE_H_
#define LGPT_CORE_OPS_BLOCK_QUANT_DEVICE_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/ops/block_quant.h"

namespace lgpt {

// The most rows for which a projection on a CUDA device runs the GEMV kernel (it reads the
// weight's bytes once per 8 rows); with more it dequantises the weight and calls cuBLAS.
inline constexpr int64_t kDeviceGemvMaxRows = 16;

// `weight` with its values and scales on `device` (the same tensors where they already are).
BlockQuantWeight BlockQuantWeightTo(const BlockQuantWeight& weight, c10::Device device);

// y [rows, N] float32 = x [rows, K] float32 · Wᵀ (+ bias [N] float32), in the order above: on
// a CUDA device the kernel, on the CPU the twin (the same bits). `x`, `bias` (optional) and the
// weight on one device. InvalidArgument naming the tensor that is not as said.
absl::StatusOr<at::Tensor> BlockQuantGemvByParts(const BlockQuantWeight& weight,
                                                 const at::Tensor& x, const at::Tensor& bias);

// The [N, K] weight `weight` stands for, in `dtype` (float32, bfloat16 or float16), on the
// weight's device: each element code x scale in float32, rounded once to `dtype` (the values of
// DequantizeBlocks(weight).to(dtype)). On CUDA one kernel writes it (prefill's operand for
// cuBLAS: 0.56 or 1.06 bytes read and 2 written per bfloat16 weight); on the CPU its twin.
// InvalidArgument for another dtype or a weight that is not well formed.
absl::StatusOr<at::Tensor> DequantizeBlocksTo(const BlockQuantWeight& weight, at::ScalarType dtype);

// Whether this build holds the CUDA kernels (a build against a CUDA LibTorch).
bool BlockQuantHasCudaKernel();

}  // namespace lgpt

#endif  // LGPT_CORE_OPS_BLOCK_QUANT_DEVICE_H_
