// Entry codecs: how a KV store encodes the keys and values of one entry (one token of one
// (batch row, query group)) into storage tensors laid out entry-major along dim 2, so that
// stores move, gather, evict and refill entries without knowing the encoding.
//
// - Full: the model's dtype, unchanged (16 or 32 bits an element).
// - Quantised, int8 and int4: per entry, per group of `group_size` channels, one symmetric
//   absmax scale stored in float16; int8 holds q in [-127, 127]; int4 holds q in [-7, 7] as
//   q + 8, two channels a byte (channel 2i in the low nibble, 2i+1 in the high one).
//   Bytes an entry (keys + values): 2 · (head_size · bits / 8 + 2 · head_size / group_size).
//   With groups of 32 that is 0.531 (int8) and 0.281 (int4) of a 16-bit entry.
//
// Why per-token keys rather than KIVI's per-channel keys (grouped over tokens): eviction
// policies drop and refill single slots per (row, group), which a scale shared by a group of
// tokens cannot follow without requantising the group (and widening its range when a new token
// lands in it). Per-token groups keep every slot independent. KIVI's concern, a few key
// channels with large magnitudes, is confined by the small channel groups (an outlier widens
// only its own group's scale), and the caches keep the most recent entries in full precision
// as KIVI does (PolicyKVCacheOptions::residual). At 8 and 4 bits this is what llama.cpp's
// q8_0 / q4_0 KV caches do.
#ifndef LGPT_CACHE_KV_CODEC_H_
#define LGPT_CACHE_KV_CODEC_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace lgpt {

class EntryCodec {
 public:
  virtual ~EntryCodec() = default;

  // Encodes keys, values [B, G, T, head_size] into storage tensors, each [B, G, T, width_i].
  // Cost: O(B · G · T · head_size), allocating only the encoded result.
  virtual std::vector<at::Tensor> Encode(const at::Tensor& keys,
                                         const at::Tensor& values) const = 0;
  // Decodes storage tensors [B, G, n, width_i] into keys and/or values [B, G, n, head_size]
  // of the model's dtype; either output may be null. Full codecs return views (no copy);
  // quantised ones allocate only the decoded n entries.
  virtual void Decode(const std::vector<at::Tensor>& parts, at::Tensor* keys,
                      at::Tensor* values) const = 0;
  // Zeroed storage for `capacity` entries per (row, group).
  virtual std::vector<at::Tensor> Allocate(int64_t batch, int64_t groups,
                                           int64_t capacity) const = 0;
  // Bytes of keys plus values of one entry of one (row, group), scales included.
  virtual int64_t BytesPerEntry() const = 0;
  // Storage tensors [0, key_parts()) of Encode/Allocate hold the keys, the rest the values.
  virtual int key_parts() const = 0;
  // 16 stands for the model's own dtype, whatever its width.
  virtual int bits() const = 0;
  virtual int64_t head_size() const = 0;
};

// Stores entries as they are, in `dtype`.
std::unique_ptr<EntryCodec> MakeFullCodec(int64_t head_size, c10::ScalarType dtype,
                                          c10::Device device);

// int8 or int4 entries with a float16 scale per `group_size` channels (reduced to the greatest
// common divisor with head_size when it does not divide it); decodes to `dtype`.
absl::StatusOr<std::unique_ptr<EntryCodec>> MakeQuantCodec(int bits, int64_t head_size,
                                                           int64_t group_size,
                                                           c10::ScalarType dtype,
                                                           c10::Device device);

// The quantisation itself, for tests and benchmarks. x [..., n] with n a multiple of `group`
// (and even for 4 bits) -> data [..., n · bits / 8] (int8 for 8 bits, uint8 nibbles for 4),
// scales [..., n / group] float16. Round trip error per element <= scale / 2 of its group,
// scale = absmax / (2^(bits-1) - 1) (rounded to float16).
struct QuantizedGroups {
  at::Tensor data;
  at::Tensor scales;
};
QuantizedGroups QuantizeGroups(const at::Tensor& x, int bits, int64_t group);
at::Tensor DequantizeGroups(const at::Tensor& data, const at::Tensor& scales, int bits,
                            int64_t group, c10::ScalarType dtype);

// One entry's n channels on the host, bit for bit what QuantizeGroups / DequantizeGroups do to
// a row (same float32 operations, round half to even, float16 scales): for caches that place
// and read single entries in host loops. data is int8_t[n] (8 bits) or uint8_t[n / 2] (4 bits),
// scales n / group float16. Cost O(n), no allocation.
void QuantizeRow(const float* x, int64_t n, int bits, int64_t group, void* data, at::Half* scales);
void DequantizeRow(const void* data, const at::Half* scales, int64_t n, int bits, int64_t group,
                   float* out);

}  // namespace lgpt

#endif  // LGPT_CACHE_KV_CODEC_H_
