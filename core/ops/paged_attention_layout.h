// What the paged decode attention kernels (core/ops/paged_attention.h) share between the CPU
// twin and the CUDA kernel (__host__ __device__): how an entry is stored in a pool block, how a
// request's block table leads to its entries, which keys a query sees, how a long request's
// entries are split (FlashDecoding / vLLM's paged attention v2) and how the splits' partial
// softmaxes merge. No LibTorch, no CUDA headers: plain arithmetic that CPU tests exercise.
//
// One layer's pool holds keys (and, alike, values) as [num_blocks, groups, entries_per_block,
// entry_bytes] bytes; an entry is one token's head_size channels of one key group:
//   float32, bfloat16, float16  head_size elements;
//   int8, int4                  the codes (int8: q in [-127, 127]; int4: q + 8 in a nibble,
//                               channel 2i low, 2i+1 high), padded to an even byte count, then
//                               one float16 scale per `group_size` channels (symmetric absmax):
//                               codes and scales inside the block, read in place and
//                               dequantised in registers (cache/kv_codec.h's QuantizeRow, bit
//                               for bit).
#ifndef LGPT_CORE_OPS_PAGED_ATTENTION_LAYOUT_H_
#define LGPT_CORE_OPS_PAGED_ATTENTION_LAYOUT_H_

#include <cstdint>
#include <cstring>

#include "core/ops/kv_slot_layout.h"  // LGPT_HOST_DEVICE

namespace lgpt {
namespace paged {

enum class EntryKind : int32_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2, kInt8 = 3, kInt4 = 4 };

struct EntryFormat {
  EntryKind kind = EntryKind::kFloat32;
  int32_t head_size = 0;
  int32_t group_size = 32;  // quantised kinds: channels sharing a scale (divides head_size)
};

LGPT_HOST_DEVICE inline bool IsQuantised(EntryKind kind) {
  return kind == EntryKind::kInt8 || kind == EntryKind::kInt4;
}

// Bytes of an entry's codes or elements, before the scales (even for quantised kinds, so that
// the float16 scales after them are aligned).
LGPT_HOST_DEVICE inline int64_t CodeBytes(const EntryFormat& f) {
  switch (f.kind) {
    case EntryKind::kFloat32:
      return 4 * static_cast<int64_t>(f.head_size);
    case EntryKind::kBFloat16:
    case EntryKind::kFloat16:
      return 2 * static_cast<int64_t>(f.head_size);
    case EntryKind::kInt8:
      return (f.head_size + 1) / 2 * 2;
    case EntryKind::kInt4:
      return (f.head_size / 2 + 1) / 2 * 2;
  }
  return 0;
}

// Bytes of one entry: codes and, for quantised kinds, head_size / group_size float16 scales.
LGPT_HOST_DEVICE inline int64_t EntryBytes(const EntryFormat& f) {
  return CodeBytes(f) +
         (IsQuantised(f.kind) ? 2 * static_cast<int64_t>(f.head_size / f.group_size) : 0);
}

LGPT_HOST_DEVICE inline float FloatFromBits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

// Loads and stores at aligned addresses (entries and scales are aligned to their width): on the
// host through memcpy (no aliasing assumptions), on the device as plain accesses.
template <typename T>
LGPT_HOST_DEVICE inline T LoadAligned(const uint8_t* at) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const T*>(at);
#else
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
#endif
}

template <typename T>
LGPT_HOST_DEVICE inline void StoreAligned(uint8_t* at, T value) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<T*>(at) = value;
#else
  std::memcpy(at, &value, sizeof(T));
#endif
}

LGPT_HOST_DEVICE inline float BFloat16ToFloat(uint16_t bits) {
  return FloatFromBits(static_cast<uint32_t>(bits) << 16);
}

// IEEE half to float, exactly (every half is a float).
LGPT_HOST_DEVICE inline float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) return FloatFromBits(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    // Zero or subnormal: mantissa · 2^-24, exact in float.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return FloatFromBits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

LGPT_HOST_DEVICE inline uint32_t BitsOfFloat(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
#endif
}

// float to IEEE half, rounding to nearest even (as c10::Half does); beyond the largest half:
// infinity.
LGPT_HOST_DEVICE inline uint16_t FloatToHalf(float value) {
  uint32_t x = BitsOfFloat(value);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: infinity
  uint32_t rounded, rest, half;
  if (x < 0x38800000u) {
    // Below 2^-14: a subnormal half, |value| · 2^24 rounded to an integer.
    const uint32_t exponent = x >> 23;
    if (exponent < 102) return static_cast<uint16_t>(sign);  // below 2^-25: rounds to zero
    const uint32_t mantissa = (x & 0x7fffffu) | 0x800000u, shift = 126 - exponent;
    rounded = mantissa >> shift;
    rest = mantissa & ((1u << shift) - 1);
    half = 1u << (shift - 1);
  } else {
    // Normal: the exponent rebiased (127 -> 15), 13 mantissa bits rounded away (a carry
    // into the exponent is the right result).
    rounded = (x - 0x38000000u) >> 13;
    rest = x & 0x1fffu;
    half = 0x1000u;
  }
  if (rest > half || (rest == half && (rounded & 1u) != 0)) ++rounded;
  return static_cast<uint16_t>(sign | rounded);
}

LGPT_HOST_DEVICE inline float RoundToNearestEven(float value) {
#if defined(__CUDA_ARCH__)
  return rintf(value);
#else
  return __builtin_rintf(value);
#endif
}

// Encodes one entry of `f` (a quantised kind) from x[0, head_size): per group the float16
// scale absmax / levels (levels 127 or 7, capped at the largest half), codes x / scale rounded
// to nearest even and clamped to ±levels. cache/kv_codec.h's QuantizeRow, bit for bit, in the
// block layout above.
LGPT_HOST_DEVICE inline void QuantizeEntry(const float* x, const EntryFormat& f, uint8_t* entry) {
  const float levels = f.kind == EntryKind::kInt8 ? 127.0f : 7.0f;
  uint8_t* scales = entry + CodeBytes(f);
  for (int64_t begin = 0; begin < f.head_size; begin += f.group_size) {
    float absmax = 0.0f;
    for (int64_t i = begin; i < begin + f.group_size; ++i) {
      const float a = x[i] < 0.0f ? -x[i] : x[i];
      absmax = a > absmax ? a : absmax;
    }
    const float capped = absmax / levels < 65504.0f ? absmax / levels : 65504.0f;
    const uint16_t scale_bits = FloatToHalf(capped);
    StoreAligned<uint16_t>(scales + 2 * (begin / f.group_size), scale_bits);
    const float scale = HalfToFloat(scale_bits);
    const float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
    for (int64_t i = begin; i < begin + f.group_size; ++i) {
      float q = RoundToNearestEven(x[i] * inverse);
      q = q < -levels ? -levels : (q > levels ? levels : q);
      if (f.kind == EntryKind::kInt8) {
        entry[i] = static_cast<uint8_t>(static_cast<int8_t>(q));
      } else {
        const uint8_t nibble = static_cast<uint8_t>(static_cast<int>(q) + 8);
        entry[i / 2] = i % 2 == 0 ? nibble : static_cast<uint8_t>(entry[i / 2] | (nibble << 4));
      }
    }
  }
}

// Channel `d` of the entry at `entry`, as float32.
LGPT_HOST_DEVICE inline float EntryElement(const uint8_t* entry, const EntryFormat& f, int64_t d) {
  switch (f.kind) {
    case EntryKind::kFloat32:
      return FloatFromBits(LoadAligned<uint32_t>(entry + 4 * d));
    case EntryKind::kBFloat16:
      return BFloat16ToFloat(LoadAligned<uint16_t>(entry + 2 * d));
    case EntryKind::kFloat16:
      return HalfToFloat(LoadAligned<uint16_t>(entry + 2 * d));
    case EntryKind::kInt8:
    case EntryKind::kInt4: {
      const uint16_t scale_bits =
          LoadAligned<uint16_t>(entry + CodeBytes(f) + 2 * (d / f.group_size));
      const int code = f.kind == EntryKind::kInt8
                           ? static_cast<int>(static_cast<int8_t>(entry[d]))
                           : static_cast<int>((entry[d / 2] >> (4 * (d % 2))) & 15) - 8;
      return static_cast<float>(code) * HalfToFloat(scale_bits);
    }
  }
  return 0.0f;
}

// The whole entry as float32 into out[0, head_size): EntryElement for every channel, one scale
// load per group.
LGPT_HOST_DEVICE inline void DecodeEntry(const uint8_t* entry, const EntryFormat& f, float* out) {
  if (!IsQuantised(f.kind)) {
    for (int64_t d = 0; d < f.head_size; ++d) out[d] = EntryElement(entry, f, d);
    return;
  }
  const uint8_t* scales = entry + CodeBytes(f);
  for (int64_t begin = 0; begin < f.head_size; begin += f.group_size) {
    const float scale = HalfToFloat(LoadAligned<uint16_t>(scales + 2 * (begin / f.group_size)));
    for (int64_t d = begin; d < begin + f.group_size; ++d) {
      const int code = f.kind == EntryKind::kInt8
                           ? static_cast<int>(static_cast<int8_t>(entry[d]))
                           : static_cast<int>((entry[d / 2] >> (4 * (d % 2))) & 15) - 8;
      out[d] = static_cast<float>(code) * scale;
    }
  }
}

// One layer's pool: [num_blocks, groups, entries_per_block] entries of entry_bytes bytes.
struct PoolShape {
  int64_t num_blocks = 0;
  int64_t groups = 0;
  int64_t entries_per_block = 0;
  int64_t entry_bytes = 0;
};

// Index of (block, group, slot) among the pool's entries ([num_blocks, groups,
// entries_per_block] in order): times entry_bytes, the entry's byte offset; the index of its
// position in a slot-positions pool.
LGPT_HOST_DEVICE inline int64_t EntryIndex(const PoolShape& pool, int64_t block, int64_t group,
                                           int64_t slot) {
  return (block * pool.groups + group) * pool.entries_per_block + slot;
}

// Where entry `e` (in the request's order) of key group `group` lies, through the request's
// block table (table[i]: the block of entries [i · entries_per_block, (i + 1) ·
// entries_per_block), `table_size` of them): its entry index, or -1 when the table has no block
// there or names one outside the pool (such an entry is never read: it is masked).
LGPT_HOST_DEVICE inline int64_t LocateEntry(const PoolShape& pool, const int32_t* table,
                                            int64_t table_size, int64_t group, int64_t e) {
  const int64_t i = e / pool.entries_per_block;
  if (i >= table_size) return -1;
  const int64_t block = table[i];
  if (block < 0 || block >= pool.num_blocks) return -1;
  return EntryIndex(pool, block, group, e % pool.entries_per_block);
}

// Whether a query at `query_position` sees a key at `key_position` (negative: an empty slot):
// causal, within the sliding window when there is one (core/ops/attention_mask.h's KeyAllowed).
LGPT_HOST_DEVICE inline bool KeyVisible(int64_t query_position, int64_t key_position,
                                        int64_t sliding_window) {
  return key_position >= 0 && key_position <= query_position &&
         (sliding_window <= 0 || key_position > query_position - sliding_window);
}

// The splits of a request of `length` entries, `entries_per_split` each (the last one partial).
LGPT_HOST_DEVICE inline int64_t SplitCount(int64_t length, int64_t entries_per_split) {
  return length <= 0 ? 0 : (length + entries_per_split - 1) / entries_per_split;
}

// Bytes of shared memory one CUDA thread block (one request, key group and split) takes: the
// split's entry indices (int64), then float32 the group's queries [heads_per_group, head_size],
// the scores [heads_per_group, entries_per_split] and a max and a sum per head.
LGPT_HOST_DEVICE inline int64_t SplitSharedBytes(int64_t heads_per_group, int64_t head_size,
                                                 int64_t entries_per_split) {
  return 8 * entries_per_split + 4 * heads_per_group * (head_size + entries_per_split + 2);
}

LGPT_HOST_DEVICE inline float NegativeInfinity() { return FloatFromBits(0xff800000u); }

// The largest of `n` values (-infinity when n is 0 or all are).
LGPT_HOST_DEVICE inline float MaxOf(const float* values, int64_t n) {
  float m = NegativeInfinity();
  for (int64_t i = 0; i < n; ++i) m = values[i] > m ? values[i] : m;
  return m;
}

// Merging the splits of one (request, head): split s attended with max score maxes[s], summed
// exponentials sums[s] (relative to its max) and unnormalised output acc_s. The output is
// sum_s factors[s] · acc_s, with factors[s] = exp(maxes[s] - M) / sum_t sums[t] · exp(maxes[t] -
// M), M the largest max; all factors are 0 when no split saw a key (an empty request reads 0).
// `exp_fn` is the platform's expf.
template <typename ExpFn>
LGPT_HOST_DEVICE inline void MergeFactors(const float* maxes, const float* sums, int64_t n,
                                          ExpFn exp_fn, float* factors) {
  const float m = MaxOf(maxes, n);
  float total = 0.0f;
  for (int64_t s = 0; s < n; ++s) {
    factors[s] = sums[s] > 0.0f ? exp_fn(maxes[s] - m) : 0.0f;
    total += factors[s] * sums[s];
  }
  const float inverse = total > 0.0f ? 1.0f / total : 0.0f;
  for (int64_t s = 0; s < n; ++s) factors[s] *= inverse;
}

}  // namespace paged
}  // namespace lgpt

#endif  // LGPT_CORE_OPS_PAGED_ATTENTION_LAYOUT_H_
