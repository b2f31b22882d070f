// Launcher of the CUDA block-quantised GEMV (block_quant.cu), in plain C++ types so that the
// host compiler's code (block_quant_device.cc) calls it without CUDA headers. Built only against
// a CUDA LibTorch (LGPT_LIBTORCH_HAS_CUDA); see block_quant_device.h for the operation.
#ifndef LGPT_CORE_OPS_BLOCK_QUANT_CUDA_H_
#define LGPT_CORE_OPS_BLOCK_QUANT_CUDA_H_

#include <cstdint>

namespace lgpt {
namespace cuda {

// Device pointers and sizes of one call (every pointer on the same device).
struct BlockQuantGemvArgs {
  const uint8_t* tiles = nullptr;    // [groups, K / 32, tile bytes] (block_quant_layout.h)
  const uint16_t* scales = nullptr;  // IEEE half [groups, K / 32, 16]
  const float* x = nullptr;          // [rows, K]
  const float* bias = nullptr;       // [N] or null
  float* y = nullptr;                // [rows, N]
  int8_t* codes = nullptr;           // scratch [rows, K]: x's int8 codes
  float* code_scales = nullptr;      // scratch [rows, K / 32]
  int64_t rows = 0;
  int64_t n_out = 0;  // N
  int64_t k = 0;      // K, a multiple of 32
  bool q4 = false;
};

// Queues the activations' quantisation and the GEMV on `stream` (a cudaStream_t). Returns the
// launch's cudaError_t (0 on success).
int LaunchBlockQuantGemv(const BlockQuantGemvArgs& args, void* stream);

// Writes the [N, K] weight the tiles stand for to `out`, elements of `output_type`
// (block_quant::OutputType: 0 float32, 1 bfloat16, 2 float16), on `stream`. Returns the
// launch's cudaError_t.
int LaunchDequantizeBlocks(const uint8_t* tiles, const uint16_t* scales, int64_t n_out, int64_t k,
                           bool q4, int output_type, void* out, void* stream);

}  // namespace cuda
}  // namespace lgpt

#endif  // LGPT_CORE_OPS_BLOCK_QUANT_CUDA_H_
