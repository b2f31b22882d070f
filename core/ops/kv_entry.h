// The element types a CPU attention kernel reads KV entries in: float32, or 16-bit entries
// (bfloat16, float16) of a float32 model's KV pool, widened to float32 as they are read. The
// widening is exact, so a kernel over 16-bit entries computes what it computes over their
// float32 copies (at::Tensor::to(at::kFloat)), to the bit.
#ifndef LGPT_CORE_OPS_KV_ENTRY_H_
#define LGPT_CORE_OPS_KV_ENTRY_H_

#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <optional>

namespace lgpt {

enum class KVEntryType : uint8_t { kFloat32, kBFloat16, kFloat16 };

// The entry type of a tensor dtype; nullopt for dtypes the kernels do not read.
inline std::optional<KVEntryType> KVEntryTypeOf(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float:
      return KVEntryType::kFloat32;
    case c10::ScalarType::BFloat16:
      return KVEntryType::kBFloat16;
    case c10::ScalarType::Half:
      return KVEntryType::kFloat16;
    default:
      return std::nullopt;
  }
}

// Bytes of one element.
inline int64_t KVEntryBytes(KVEntryType type) { return type == KVEntryType::kFloat32 ? 4 : 2; }

// Element i of `data` (of `type`) as float32.
inline float KVEntryAt(const void* data, KVEntryType type, int64_t i) {
  switch (type) {
    case KVEntryType::kFloat32:
      return static_cast<const float*>(data)[i];
    case KVEntryType::kBFloat16: {
      const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(data)[i]) << 16;
      float value;
      std::memcpy(&value, &bits, sizeof(value));
      return value;
    }
    case KVEntryType::kFloat16:
      return static_cast<float>(
          c10::Half(static_cast<const uint16_t*>(data)[i], c10::Half::from_bits()));
  }
  return 0.0f;
}

// dst[0, n) = src[0, n) widened to float32 (a loop per type, which the compiler vectorises).
inline void KVEntriesToFloat(const void* src, KVEntryType type, int64_t n, float* dst) {
  switch (type) {
    case KVEntryType::kFloat32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case KVEntryType::kBFloat16: {
      const uint16_t* words = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t bits = static_cast<uint32_t>(words[i]) << 16;
        std::memcpy(dst + i, &bits, sizeof(bits));
      }
      return;
    }
    case KVEntryType::kFloat16:
      for (int64_t i = 0; i < n; ++i) dst[i] = KVEntryAt(src, KVEntryType::kFloat16, i);
      return;
  }
}

// dst[0, n) = src[0, n) rounded to `type` (ATen's conversion: round to nearest even).
inline void FloatToKVEntries(const float* src, int64_t n, KVEntryType type, void* dst) {
  switch (type) {
    case KVEntryType::kFloat32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case KVEntryType::kBFloat16:
      for (int64_t i = 0; i < n; ++i) {
        static_cast<uint16_t*>(dst)[i] = c10::BFloat16(src[i]).x;
      }
      return;
    case KVEntryType::kFloat16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = c10::Half(src[i]).x;
      return;
  }
}

}  // namespace lgpt

#endif  // LGPT_CORE_OPS_KV_ENTRY_H_
