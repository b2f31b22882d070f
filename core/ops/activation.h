// Fused activations for CPU inference, where LibTorch would run one operation per step of
// the formula (each a pass over the tensor and, above its grain size, an OpenMP fork).
#ifndef LGPT_CORE_OPS_ACTIVATION_H_
#define LGPT_CORE_OPS_ACTIVATION_H_

#include <ATen/core/Tensor.h>

namespace lgpt {

// SwiGLU's product for inference: gate = silu(gate) · up = gate / (1 + exp(-gate)) · up, in
// place, in one pass (at::silu_ then mul_ take two passes and two forks). Applies to float32
// CPU tensors of one shape, contiguous, with an AVX2/FMA CPU and nothing to record for
// autograd; returns false, writing nothing, otherwise (the caller runs the LibTorch
// operations). exp is simd::Exp (within 2 ulp of std::exp), so results equal at::silu's to
// float32 rounding, not bit for bit. Every element's value depends on its own inputs alone
// (the last partial vector is computed as a whole one), so a row gives the same bits in any
// batch. Cost: one read of both, one write; split over the row pool's threads above 64K
// elements.
bool SiluMulInPlace(at::Tensor& gate, const at::Tensor& up);

}  // namespace lgpt

#endif  // LGPT_CORE_OPS_ACTIVATION_H_
