// int8 weight-only quantisation kernels: symmetric int8 weights with a float32 scale per
// output channel or per group of input features, and the GEMV that reads them (widening to
// float32 in registers). core/nn/int8_linear.h makes projections of them.
#ifndef LGPT_CORE_OPS_QUANTIZE_H_
#define LGPT_CORE_OPS_QUANTIZE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace lgpt {

struct Int8Weight {
  at::Tensor values;  // int8 [N, K], in [-127, 127]
  at::Tensor scales;  // float32 [N, K / group_size]; weight ≈ values · scale of its group
  int64_t group_size = 0;
};

// Quantises a float [N, K] weight. group_size 0 means one scale per output channel (group =
// K); otherwise it must divide K and be a multiple of 8.
Int8Weight QuantizeInt8(const at::Tensor& weight, int64_t group_size = 0);

// The float32 [N, K] weight an Int8Weight stands for.
at::Tensor DequantizeInt8(const Int8Weight& weight);

// y[m, n] = sum_k x[m, k] · dequantised w[n, k] (+ bias[n]) for rows <= kGemvMaxRows; the
// layout of GemvF32 (core/ops/gemv.h). Parallel over n; `use_avx2` false forces the portable loop.
void Int8Gemv(const Int8Weight& weight, const float* bias, const float* x, float* y, int64_t rows,
              bool use_avx2);

}  // namespace lgpt

#endif  // LGPT_CORE_OPS_QUANTIZE_H_
