// The arithmetic of block-quantised weights (core/ops/block_quant.h's q8_0 / q4_0 tiles) shared
// by the CPU kernels, the CUDA GEMV (block_quant.cu) and its CPU twin (block_quant_device.cc),
// as __host__ __device__ code without LibTorch: where element e of a row lives in its tile, the
// exact int32 dot product of a 32-block with int8 activations, the activations' quantisation
// (symmetric int8 per 32-block, ties to even) and the float accumulation of a block's product.
//
// A tile holds one 32-block of 16 consecutive weight rows ("lanes"), interleaved by 4 bytes:
// chunk c of 64 bytes holds bytes [c * 64 + lane * 4, + 4) of every lane. q8: byte j of chunk c
// is element 4c + j plus 128; q4: byte j of chunk p holds element 8p + j plus 8 in its low
// nibble and element 8p + 4 + j plus 8 in its high nibble.
#ifndef LGPT_CORE_OPS_BLOCK_QUANT_LAYOUT_H_
#define LGPT_CORE_OPS_BLOCK_QUANT_LAYOUT_H_

#include <cmath>
#include <cstdint>

#include "core/ops/kv_slot_layout.h"          // LGPT_HOST_DEVICE
#include "core/ops/paged_attention_layout.h"  // paged::HalfToFloat, LoadAligned

namespace lgpt {
namespace block_quant {

constexpr int64_t kBlock = 32;       // weights (and activations) per scale
constexpr int64_t kGroup = 16;       // weight rows per tile
constexpr int64_t kLaneBytes = 4;    // consecutive bytes of one row in a chunk
constexpr int64_t kChunkBytes = 64;  // kGroup * kLaneBytes
constexpr int64_t kQ8TileBytes = kBlock * kGroup;
constexpr int64_t kQ4TileBytes = kBlock * kGroup / 2;
constexpr int kQ8Offset = 128;
constexpr int kQ4Offset = 8;
// Activation blocks whose largest magnitude is at most this quantise to zeros (scale 0).
constexpr float kTinyScale = 1e-30f;

LGPT_HOST_DEVICE inline int64_t TileBytes(bool q4) { return q4 ? kQ4TileBytes : kQ8TileBytes; }

// The byte of element e (0..31) of `lane`'s row inside a q8 tile.
LGPT_HOST_DEVICE inline int64_t Q8ByteInTile(int64_t lane, int64_t e) {
  return (e / kLaneBytes) * kChunkBytes + lane * kLaneBytes + e % kLaneBytes;
}

// The byte of element e inside a q4 tile, and whether it is that byte's high nibble.
LGPT_HOST_DEVICE inline int64_t Q4ByteInTile(int64_t lane, int64_t e, bool* high) {
  const int64_t pair = e / (2 * kLaneBytes), within = e % (2 * kLaneBytes);
  *high = within >= kLaneBytes;
  return pair * kChunkBytes + lane * kLaneBytes + within % kLaneBytes;
}

// The signed code of element e of `lane`'s row in `tile` (q8: [-128, 127]; q4: [-8, 7]).
LGPT_HOST_DEVICE inline int CodeInTile(const uint8_t* tile, bool q4, int64_t lane, int64_t e) {
  if (!q4) return static_cast<int>(tile[Q8ByteInTile(lane, e)]) - kQ8Offset;
  bool high;
  const uint8_t byte = tile[Q4ByteInTile(lane, e, &high)];
  return static_cast<int>(high ? byte >> 4 : byte & 15) - kQ4Offset;
}

// A float product and sum rounded on their own: nvcc fuses a * b + c into one FMA by default,
// which would round differently from the CPU (whose portable code is built without FMA).
LGPT_HOST_DEVICE inline float MulRounded(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
LGPT_HOST_DEVICE inline float AddRounded(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// Rounds |v| < 2^22 to the nearest integer, ties to even, as the default rounding mode and
// _mm256_cvtps_epi32 do: adding and subtracting 1.5 * 2^23 leaves no fraction bits. (A
// std::nearbyint call per element would cost more than the whole quantisation.)
LGPT_HOST_DEVICE inline int RoundToInt(float v) {
  constexpr float kMagic = 12582912.0f;
  return static_cast<int>(AddRounded(AddRounded(v, kMagic), -kMagic));
}

// Quantises one 32-block of activations: codes x / scale rounded (ties to even) into [-127,
// 127], scale = amax / 127 (0 for a block within kTinyScale of zero). Returns the scale; the
// codes' sum goes to *sum when it is not null.
LGPT_HOST_DEVICE inline float QuantizeActivationBlock(const float* x, int8_t* codes, int32_t* sum) {
  float amax = 0;
  for (int64_t j = 0; j < kBlock; ++j) {
    const float magnitude = x[j] < 0 ? -x[j] : x[j];
    amax = magnitude > amax ? magnitude : amax;
  }
  const float inverse = amax > kTinyScale ? 127.0f / amax : 0.0f;
  int32_t total = 0;
  for (int64_t j = 0; j < kBlock; ++j) {
    int q = RoundToInt(MulRounded(x[j], inverse));
    q = q < -127 ? -127 : (q > 127 ? 127 : q);
    codes[j] = static_cast<int8_t>(q);
    total += q;
  }
  if (sum != nullptr) *sum = total;
  return amax / 127.0f;
}

// The exact dot product of `lane`'s row of a tile with one block of activation codes.
LGPT_HOST_DEVICE inline int32_t BlockDot(const uint8_t* tile, bool q4, int64_t lane,
                                         const int8_t* codes) {
  int32_t dot = 0;
#if defined(__CUDA_ARCH__)
  // Four bytes at a time: dp4a's products and sums are exact, so any order gives the same
  // integer as the loop below.
  const uint8_t* row = tile + lane * kLaneBytes;
  if (q4) {
    int32_t code_sum = 0;
    for (int64_t p = 0; p < kBlock / 8; ++p) {
      const uint32_t word = *reinterpret_cast<const uint32_t*>(row + p * kChunkBytes);
      const int low_codes = *reinterpret_cast<const int*>(codes + 8 * p);
      const int high_codes = *reinterpret_cast<const int*>(codes + 8 * p + 4);
      dot = __dp4a(static_cast<int>(word & 0x0f0f0f0fu), low_codes, dot);
      dot = __dp4a(static_cast<int>((word >> 4) & 0x0f0f0f0fu), high_codes, dot);
      code_sum = __dp4a(0x01010101, low_codes, code_sum);
      code_sum = __dp4a(0x01010101, high_codes, code_sum);
    }
    return dot - kQ4Offset * code_sum;
  }
  for (int64_t c = 0; c < kBlock / 4; ++c) {
    const uint32_t word = *reinterpret_cast<const uint32_t*>(row + c * kChunkBytes);
    // Flipping each byte's top bit turns q + 128 into q as a signed byte.
    dot = __dp4a(static_cast<int>(word ^ 0x80808080u), *reinterpret_cast<const int*>(codes + 4 * c),
                 dot);
  }
#else
  for (int64_t e = 0; e < kBlock; ++e) dot += CodeInTile(tile, q4, lane, e) * int32_t{codes[e]};
#endif
  return dot;
}

// One block's contribution to a row's float32 sum: acc + dot * (weight scale * activation
// scale), fused (one rounding). Every kernel accumulates its blocks with this.
LGPT_HOST_DEVICE inline float AccumulateBlock(float acc, int32_t dot, uint16_t weight_scale_bits,
                                              float activation_scale) {
  const float scale = MulRounded(paged::HalfToFloat(weight_scale_bits), activation_scale);
  return fmaf(static_cast<float>(dot), scale, acc);
}

// float to bfloat16 bits, rounding to nearest even (as c10::BFloat16 does; NaN stays NaN).
LGPT_HOST_DEVICE inline uint16_t FloatToBFloat16(float value) {
  const uint32_t bits = paged::BitsOfFloat(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// Output element types of a dequantisation.
enum class OutputType { kFloat32, kBFloat16, kFloat16 };

// Dequantises one 4-byte word of `lane`'s row in a tile: q8 word c holds elements 4c .. 4c + 3,
// q4 word p elements 8p .. 8p + 7 (low nibbles, then high ones). Writes them to `out` (element
// 0 of the word's first element) as code * scale in float32, rounded once to the output type.
template <OutputType Out>
LGPT_HOST_DEVICE inline void DequantizeWord(const uint8_t* tile, bool q4, int64_t lane,
                                            int64_t word, float scale, void* out) {
  const int64_t count = q4 ? 8 : 4;
  for (int64_t j = 0; j < count; ++j) {
    const int64_t e = (q4 ? 8 : 4) * word + j;
    const float value = MulRounded(static_cast<float>(CodeInTile(tile, q4, lane, e)), scale);
    if (Out == OutputType::kFloat32) {
      static_cast<float*>(out)[j] = value;
    } else if (Out == OutputType::kBFloat16) {
      static_cast<uint16_t*>(out)[j] = FloatToBFloat16(value);
    } else {
      static_cast<uint16_t*>(out)[j] = paged::FloatToHalf(value);
    }
  }
}

// How the CUDA GEMV (and its twin) splits a row's blocks: part p of kGemvParts sums blocks p,
// p + kGemvParts, ... in order; the parts' sums are added in part order, then the bias.
constexpr int kGemvParts = 16;

// Part `part`'s sum of `lane`'s row of tile group `tiles` (its blocks' tiles, consecutive, and
// their 16 scales each) against one row of activation codes and scales.
LGPT_HOST_DEVICE inline float PartSum(const uint8_t* tiles, const uint16_t* scales, int64_t blocks,
                                      bool q4, int64_t lane, int part, const int8_t* codes,
                                      const float* activation_scales) {
  const int64_t tile_bytes = TileBytes(q4);
  float acc = 0;
  for (int64_t b = part; b < blocks; b += kGemvParts) {
    const int32_t dot = BlockDot(tiles + b * tile_bytes, q4, lane, codes + b * kBlock);
    acc = AccumulateBlock(acc, dot, scales[b * kGroup + lane], activation_scales[b]);
  }
  return acc;
}

// The output of one (row, lane) from its kGemvParts part sums (`stride` floats apart).
LGPT_HOST_DEVICE inline float CombineParts(const float* parts, int64_t stride, float bias) {
  float sum = parts[0];
  for (int p = 1; p < kGemvParts; ++p) sum += parts[p * stride];
  return sum + bias;
}

}  // namespace block_quant
}  // namespace lgpt

#endif  // LGPT_CORE_OPS_BLOCK_QUANT_LAYOUT_H_
