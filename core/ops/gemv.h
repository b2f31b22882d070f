// Few-row float32 matrix-vector products for CPU decoding: y = x W^T (+ b) with x of at most
// kGemvMaxRows rows. BLAS runs such products as a GEMM with M = 1 at a fraction of the memory
// bandwidth; decoding is bound by reading W once per token, so this path streams each weight
// row once for all rows of x, split over at::get_num_threads() threads of a persistent pool.
//
// The kernel is chosen at run time (AVX-512 for two or more rows, else AVX2/FMA, with equal
// bits); other CPUs get a portable loop, so the target builds anywhere. Accumulation is
// float32 in a different order than BLAS: results equal at::linear to float32 rounding, not
// bit for bit. With the AVX-512 kernel prefill chunks take this path too (up to 4096 rows,
// in slices of kGemvMaxRows), faster than Debian's OpenBLAS on this CPU.
#ifndef LGPT_CORE_OPS_GEMV_H_
#define LGPT_CORE_OPS_GEMV_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

namespace lgpt {

// Rows of x (the product of its leading dimensions) up to which the GEMV path is used.
// Up to here streaming each weight row once beats BLAS's GEMM, which repacks the weights per
// call (batched decoding steps of a serving scheduler have one row per running request).
inline constexpr int64_t kGemvMaxRows = 32;

// Whether the CPU has AVX2 and FMA (the fast kernels' requirement).
bool CpuHasAvx2Fma();

// Whether the CPU converts float16 to float32 in vectors (F16C; every AVX2 CPU so far): what
// the kernels reading float16 KV entries and float16 scales in AVX2 registers use.
bool CpuHasF16c();

// Whether the CPU has AVX-512 F, BW and VL on top of AVX2/FMA and the OS saves the zmm state:
// what the 16-bit AVX-512 kernels use (masked 16-bit loads need BW, masked 256-bit ones VL).
bool CpuHasAvx512();

// The GEMV kernels. kAvx512 runs two or more rows with AVX-512F/DQ (one row with AVX2) and
// gives the same bits as kAvx2; kPortable sums in another order (equal within rounding).
enum class GemvKernel { kPortable, kAvx2, kAvx512 };

// The fastest kernel this CPU runs.
GemvKernel BestGemvKernel();

// Whether GemvLinear can stand in for at::linear(x, weight, bias): CPU float32 tensors, a
// contiguous [N, K] weight, x [..., K] with at most kGemvMaxRows rows (4096
// with the AVX-512 kernel), and no autograd
// graph to record (grad mode off or nothing requiring grad).
bool GemvApplies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// at::linear(x, weight, bias) for the inputs GemvApplies accepts.
at::Tensor GemvLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// The kernel: y[m, n] = sum_k x[m, k] w[n, k] (+ bias[n]) for m < rows (<= kGemvMaxRows; a
// row's result is the same whatever the number of rows),
// n < n_out; x rows are k floats apart, y rows n_out floats apart; bias may be null.
// Parallel over n; `kernel` must be one the CPU runs (tests and benchmarks pick one).
void GemvF32(const float* w, const float* bias, const float* x, float* y, int64_t rows,
             int64_t n_out, int64_t k, GemvKernel kernel);

// GemvF32 with the best kernel, or with the portable loop when `use_avx2` is false.
void GemvF32(const float* w, const float* bias, const float* x, float* y, int64_t rows,
             int64_t n_out, int64_t k, bool use_avx2 = CpuHasAvx2Fma());

// GemvF32 on the calling thread only (the best kernel), for callers that split work
// themselves.
void GemvF32Serial(const float* w, const float* bias, const float* x, float* y, int64_t rows,
                   int64_t n_out, int64_t k);

// Runs fn(begin, end) over [0, n) in blocks of `align` rows (the last may be shorter),
// split across the intra-op threads when each thread gets at least `min_rows_per_thread`.
// Shared by the float and quantised kernels.
void ParallelForRows(int64_t n, int64_t align, int64_t min_rows_per_thread,
                     const std::function<void(int64_t, int64_t)>& fn);

}  // namespace lgpt

#endif  // LGPT_CORE_OPS_GEMV_H_
