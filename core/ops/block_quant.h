// Block-quantised weights for CPU decoding: q8_0-like (int8, one half-precision scale per
// 32 weights) and q4_0-like (4-bit, one half scale per 32 weights), and the GEMV that
// multiplies them with integer dot products.
//
// Each call quantises the activation rows to int8 per 32-block once (symmetric, scale =
// amax / 127; O(rows * K), negligible next to the weights), then streams every weight byte
// once for all rows: per 32-block an exact int32 dot product, scaled by weight scale x
// activation scale into float32 accumulators. Bytes read per weight: 1.0625 (q8_0) and
// 0.5625 (q4_0), as llama.cpp's formats, against 4 for float32; decoding is bound by them.
//
// Weights are stored in tiles of 16 rows x one 32-block, rows interleaved by 4 bytes (the
// order int8 dot-product instructions consume; llama.cpp repacks its CPU weights alike): one
// 64-byte load holds 4 consecutive weights of 16 rows, so an int8 dot-product instruction advances
// 16 rows at once against 4 broadcast activations, and a block ends with 16 finished row sums in
// one register (no horizontal sums, no per-row shuffles). Kernels, chosen at run time (the target
// builds and runs on any CPU):
//   kAmx         _tile_dpbsud (AMX-TILE + AMX-INT8, Linux's tile permission), from
//                4 activation rows (fewer: VNNI): one instruction per 32-block multiplies
//                up to 16 rows by a group's 16 weight rows
//   kAvx512Vnni  _mm512_dpbusd_epi32 (AVX-512 F/BW + VNNI)
//   kAvx2        _mm256_maddubs_epi16 + _mm256_madd_epi16 (AVX2 + FMA)
//   kPortable    scalar loops
// All kernels perform the same float operations in the same order (the integer sums are
// exact), so they agree bit for bit. Output rows are split over the row-parallel pool like
// GemvF32. A row's result never depends on the other rows of the call: batched decoding
// gives each request the result it would get alone.
#ifndef LGPT_CORE_OPS_BLOCK_QUANT_H_
#define LGPT_CORE_OPS_BLOCK_QUANT_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace lgpt {

// Weights (and activations) per scale.
inline constexpr int64_t kQuantBlock = 32;
// Weight rows per tile (interleaved in the stored layout).
inline constexpr int64_t kQuantRowGroup = 16;

enum class BlockFormat {
  kQ8_0,  // int8 q in [-127, 127]; w ~ q * scale, scale = amax / 127
  kQ4_0,  // 4-bit q in [-8, 7]; w ~ q * scale, the block's largest magnitude exactly representable
};
const char* BlockFormatName(BlockFormat format);

struct BlockQuantWeight {
  BlockFormat format = BlockFormat::kQ8_0;
  // uint8 tiles [G, K / 32, T] for G = ceil(N / 16) row groups (rows past N are padding,
  // scale 0). Tile bytes T, for chunk c of 64 bytes, row lane l (0..15), byte j (0..3):
  //   kQ8_0 (T = 512): byte [c * 64 + l * 4 + j] = q + 128 of element 4c + j;
  //   kQ4_0 (T = 256): byte [c * 64 + l * 4 + j] holds q + 8 of element 8c + j in its low
  //                    nibble and of element 8c + 4 + j in its high nibble.
  at::Tensor values;
  at::Tensor scales;         // IEEE half [G, K / 32, 16]: per tile, one scale per row lane
  int64_t out_features = 0;  // N
  int64_t in_features = 0;   // K, a multiple of kQuantBlock

  bool defined() const { return values.defined(); }
  // Bytes held (values and scales).
  int64_t bytes() const;
};

// Quantises a float [N, K] weight (any float dtype or device; the result is on the CPU:
// BlockQuantWeightTo in block_quant_device.h moves it).
// InvalidArgument when it is not 2-D, K is not a multiple of kQuantBlock, or an element is
// not finite or too large for a half scale (|w| > 65504 x 127 for q8, x 7 for q4).
absl::StatusOr<BlockQuantWeight> QuantizeBlocks(const at::Tensor& weight, BlockFormat format);

// OK when `weight` is well formed for its out_features, in_features and format: uint8
// values [G, K / 32, T] and half scales [G, K / 32, 16], contiguous, on one device (what the
// kernels of that device may read without further checks; BlockQuantGemv reads CPU weights,
// block_quant_device.h's GEMV CUDA ones). InvalidArgument saying what differs otherwise.
absl::Status CheckBlockQuantWeight(const BlockQuantWeight& weight);

// The float32 [N, K] weight a BlockQuantWeight stands for (rows [begin, end) of it with the
// second form: an embedding lookup dequantises only the rows it needs), on the weight's device.
at::Tensor DequantizeBlocks(const BlockQuantWeight& weight);
at::Tensor DequantizeBlockRows(const BlockQuantWeight& weight, const at::Tensor& rows);

enum class QuantKernel { kPortable, kAvx2, kAvx512Vnni, kAmx };
const char* QuantKernelName(QuantKernel kernel);
// Whether this CPU (and OS) runs `kernel`.
bool QuantKernelAvailable(QuantKernel kernel);
// The fastest available kernel; the environment variable LGPT_QUANT_KERNEL (portable, avx2,
// avx512vnni, amx) picks a slower one for comparisons.
QuantKernel BestQuantKernel();

// Where kAmx runs its tiles; elsewhere it runs the AVX-512 VNNI kernel (the same bits). Measured
// on a 2-core Xeon with AMX (core/ops/AMX_NOTES.md): below 16 rows a tile is mostly empty and
// VNNI wins; at 16 rows q8 gains 14% on layer shapes and 35% on a 32k-wide head, q4 only on
// wide matrices (its per-group unpack costs what the tiles save on layer shapes).
struct AmxDispatch {
  int64_t min_rows = 16;
  int64_t q4_min_outputs = 8192;
};
// Tests run the tiles on every shape: {1, 0}. Returns the previous setting.
AmxDispatch SetAmxDispatchForTesting(AmxDispatch dispatch);

// Activation rows quantised per 32-block (symmetric int8, scale = amax / 127, ties to even);
// every kernel gives the same bytes (kPortable: scalar; the others: AVX2).
struct QuantizedRows {
  std::vector<int8_t> values;  // [rows, K]
  std::vector<float> scales;   // [rows, K / 32]
  std::vector<int32_t> sums;   // [rows, K / 32]: sum of the block's values
};
void QuantizeRows(const float* x, int64_t rows, int64_t k, QuantizedRows* out,
                  QuantKernel kernel = BestQuantKernel());

// y[m, n] = sum_k x[m, k] w[n, k] (+ bias[n]) with x quantised per block, for any number of
// rows (decoding has 1..kGemvMaxRows; prefill more: per pair of row groups, held in L1/L2,
// every group of four x rows, so the weights still stream once and the cost becomes the
// integer dot products); x rows are K floats apart, y rows N floats apart. Parallel over n.
// CHECK-fails on a kernel this CPU lacks.
void BlockQuantGemv(const BlockQuantWeight& weight, const float* bias, const float* x, float* y,
                    int64_t rows, QuantKernel kernel = BestQuantKernel());

}  // namespace lgpt

#endif  // LGPT_CORE_OPS_BLOCK_QUANT_H_
