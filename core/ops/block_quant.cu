// CUDA GEMV over block-quantised weights (q8_0 / q4_0 tiles, block_quant_layout.h) for the few
// rows of a decoding step. Two kernels: the activations' int8 quantisation (a thread per
// 32-block), then one thread block per group of 16 weight rows: 16 lanes x kGemvParts parts,
// part p summing blocks p, p + kGemvParts, ... of its lane's row (the parts of a warp read
// neighbouring tiles, 64 contiguous bytes per half warp and chunk), the parts' sums added in
// order through shared memory. The arithmetic is block_quant_layout.h's, the same the CPU twin
// (block_quant_device.cc) runs, so kernel and twin agree bit for bit.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/ops/block_quant_cuda.h"
#include "core/ops/block_quant_layout.h"

namespace lgpt {
namespace cuda {
namespace {

using block_quant::kBlock;
using block_quant::kGemvParts;
using block_quant::kGroup;

constexpr int kThreads = kGroup * kGemvParts;  // 256
constexpr int kRowsPerPass = 8;                // activation rows whose sums a thread keeps

__global__ void QuantizeActivationsKernel(const float* x, int64_t blocks_total, int8_t* codes,
                                          float* scales) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < blocks_total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    scales[i] = block_quant::QuantizeActivationBlock(x + i * kBlock, codes + i * kBlock, nullptr);
  }
}

// Thread (part, lane) of the block for row group blockIdx.x.
__global__ void __launch_bounds__(kThreads) GemvKernel(BlockQuantGemvArgs a) {
  __shared__ float part_sums[kGemvParts][kRowsPerPass][kGroup];
  const int lane = threadIdx.x % kGroup, part = threadIdx.x / kGroup;
  const int64_t group = blockIdx.x, blocks = a.k / kBlock;
  const int64_t n = group * kGroup + lane;
  const uint8_t* tiles = a.tiles + group * blocks * block_quant::TileBytes(a.q4);
  const uint16_t* scales = a.scales + group * blocks * kGroup;
  for (int64_t first = 0; first < a.rows; first += kRowsPerPass) {
    const int rows =
        static_cast<int>(a.rows - first < kRowsPerPass ? a.rows - first : kRowsPerPass);
    for (int m = 0; m < rows; ++m) {
      const int64_t row = first + m;
      part_sums[part][m][lane] =
          block_quant::PartSum(tiles, scales, blocks, a.q4, lane, part, a.codes + row * a.k,
                               a.code_scales + row * blocks);
    }
    __syncthreads();
    // Thread (part, lane) finishes row `part` of the pass.
    if (part < rows && n < a.n_out) {
      const float bias = a.bias != nullptr ? a.bias[n] : 0.0f;
      a.y[(first + part) * a.n_out + n] =
          block_quant::CombineParts(&part_sums[0][part][lane], kRowsPerPass * kGroup, bias);
    }
    __syncthreads();
  }
}

// Thread i dequantises word i % words of row-block i / words (row-major: consecutive threads
// write consecutive elements of a row).
template <block_quant::OutputType Out, typename T>
__global__ void DequantizeKernel(const uint8_t* tiles, const uint16_t* scales, int64_t n_out,
                                 int64_t k, bool q4, T* out) {
  const int64_t blocks = k / kBlock, words = q4 ? 4 : 8, per_word = kBlock / words;
  const int64_t total = n_out * blocks * words;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t word = i % words, b = (i / words) % blocks, n = i / (words * blocks);
    const int64_t group = n / kGroup, lane = n % kGroup;
    const int64_t tile = group * blocks + b;
    const float scale = paged::HalfToFloat(scales[tile * kGroup + lane]);
    block_quant::DequantizeWord<Out>(tiles + tile * block_quant::TileBytes(q4), q4, lane, word,
                                     scale, out + n * k + b * kBlock + word * per_word);
  }
}

template <block_quant::OutputType Out, typename T>
int LaunchDequantize(const uint8_t* tiles, const uint16_t* scales, int64_t n_out, int64_t k,
                     bool q4, void* out, cudaStream_t stream) {
  const int64_t total = n_out * (k / kBlock) * (q4 ? 4 : 8);
  if (total == 0) return cudaSuccess;
  const int64_t wanted = (total + 255) / 256;
  DequantizeKernel<Out, T>
      <<<static_cast<unsigned>(wanted < 65535 ? wanted : 65535), 256, 0, stream>>>(
          tiles, scales, n_out, k, q4, static_cast<T*>(out));
  return cudaGetLastError();
}

}  // namespace

int LaunchDequantizeBlocks(const uint8_t* tiles, const uint16_t* scales, int64_t n_out, int64_t k,
                           bool q4, int output_type, void* out, void* stream) {
  if (k <= 0 || k % kBlock != 0) return cudaErrorInvalidValue;
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  switch (static_cast<block_quant::OutputType>(output_type)) {
    case block_quant::OutputType::kFloat32:
      return LaunchDequantize<block_quant::OutputType::kFloat32, float>(tiles, scales, n_out, k, q4,
                                                                        out, cuda_stream);
    case block_quant::OutputType::kBFloat16:
      return LaunchDequantize<block_quant::OutputType::kBFloat16, uint16_t>(tiles, scales, n_out, k,
                                                                            q4, out, cuda_stream);
    case block_quant::OutputType::kFloat16:
      return LaunchDequantize<block_quant::OutputType::kFloat16, uint16_t>(tiles, scales, n_out, k,
                                                                           q4, out, cuda_stream);
  }
  return cudaErrorInvalidValue;
}

int LaunchBlockQuantGemv(const BlockQuantGemvArgs& a, void* stream) {
  if (a.rows == 0 || a.n_out == 0) return cudaSuccess;
  if (a.k <= 0 || a.k % kBlock != 0) return cudaErrorInvalidValue;
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  const int64_t blocks_total = a.rows * (a.k / kBlock);
  const int64_t wanted = (blocks_total + 255) / 256;
  QuantizeActivationsKernel<<<static_cast<unsigned>(wanted < 65535 ? wanted : 65535), 256, 0,
                              cuda_stream>>>(a.x, blocks_total, a.codes, a.code_scales);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  const int64_t groups = (a.n_out + kGroup - 1) / kGroup;
  GemvKernel<<<static_cast<unsigned>(groups), kThreads, 0, cuda_stream>>>(a);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace lgpt
