// Launcher of the CUDA row sampler (row_sampler.cu), in plain C++ types so that the host
// compiler's code (row_sampler.cc) calls it without CUDA headers. Built only against a CUDA
// LibTorch (LGPT_LIBTORCH_HAS_CUDA); see row_sampler.h for the operation.
#ifndef LGPT_CORE_OPS_ROW_SAMPLER_CUDA_H_
#define LGPT_CORE_OPS_ROW_SAMPLER_CUDA_H_

#include <cstdint>

#include "core/ops/row_sampler_layout.h"

namespace lgpt {
namespace cuda {

// Queues one thread block per row on `stream` (a cudaStream_t): logits [rows, vocab] float32
// (rows `row_stride` floats apart), params [rows] and tokens [rows] int64 in device memory;
// tokens[r] gets row r's token, or -1 when the row holds NaN or +inf, or nothing but -inf.
// Returns the launch's cudaError_t (0 on success).
int LaunchSampleRows(const float* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                     const row_sampler::RowParams* params, int64_t* tokens, void* stream);

}  // namespace cuda
}  // namespace lgpt

#endif  // LGPT_CORE_OPS_ROW_SAMPLER_CUDA_H_
