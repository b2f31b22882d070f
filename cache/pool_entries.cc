#include "cache/pool_entries.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "cache/kv_codec.h"
#include "core/ops/kv_dequant.h"
#include "core/ops/kv_entry.h"

namespace lgpt {

void StoreFloatRow(const float* src, int64_t head_size, c10::ScalarType stored,
                   const paged::EntryFormat* quantised, void* dst) {
  if (quantised != nullptr) {
    paged::QuantizeEntry(src, *quantised, static_cast<uint8_t*>(dst));
  } else if (stored == at::kFloat) {
    std::memcpy(dst, src, head_size * sizeof(float));
  } else {
    FloatToKVEntries(src, head_size, *KVEntryTypeOf(stored), dst);
  }
}

// Entries [from, from + n) of src [1, G, T, hs] or [G, T, hs] into slots [slot, slot + n) of
// a pool block [G, bs, hs] (or, src and block alike, rows of entry_bytes quantised bytes). Rows
// are copied directly on the CPU (a decoding step writes one entry per layer: the views and
// copy_ of the tensor path cost ten dispatched operations for 2 x 128 bytes); float32 rows into
// a 16-bit pool are rounded as ATen's conversion rounds (to nearest even).
void CopyEntries(const at::Tensor& src, int64_t from, int64_t n, const at::Tensor& block,
                 int64_t slot) {
  const int64_t lead = src.dim() - 3;  // src's group dimension
  const int64_t group_stride = src.stride(lead), entry_stride = src.stride(lead + 1);
  const std::optional<KVEntryType> narrow = KVEntryTypeOf(block.scalar_type());
  const bool host_rows = src.device().is_cpu() && block.device().is_cpu() &&
                         src.stride(lead + 2) == 1 && block.is_contiguous();
  if (host_rows && src.scalar_type() == at::kFloat && narrow && *narrow != KVEntryType::kFloat32) {
    const int64_t groups = block.size(0), block_entries = block.size(1), hs = block.size(2);
    char* dst = static_cast<char*>(block.data_ptr());
    const float* from_data = src.data_ptr<float>();
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t t = 0; t < n; ++t) {
        StoreFloatRow(from_data + g * group_stride + (from + t) * entry_stride, hs,
                      block.scalar_type(), nullptr,
                      dst + ((g * block_entries + slot + t) * hs) * 2);
      }
    }
    return;
  }
  if (host_rows && src.scalar_type() == block.scalar_type()) {
    const int64_t groups = block.size(0), block_entries = block.size(1), hs = block.size(2);
    const int64_t item = block.element_size();
    char* dst = static_cast<char*>(block.data_ptr());
    const char* from_data = static_cast<const char*>(src.data_ptr());
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t t = 0; t < n; ++t) {
        std::memcpy(dst + ((g * block_entries + slot + t) * hs) * item,
                    from_data + (g * group_stride + (from + t) * entry_stride) * item, hs * item);
      }
    }
    return;
  }
  block.narrow(1, slot, n).copy_((lead == 1 ? src.select(0, 0) : src).narrow(1, from, n));
}

// Entries [from, from + n) of src [1, G, T, hs] encoded into slots [slot, slot + n) of a
// quantised pool block [G, bs, entry_bytes] (core/ops/paged_attention_layout.h's entries): on
// the CPU an entry at a time, elsewhere with tensor operations (the same codes:
// kv_codec_test's PagedEntriesAreQuantizeRowsBitForBit).
void QuantiseEntries(const at::Tensor& src, int64_t from, int64_t n, const at::Tensor& block,
                     int64_t slot, const paged::EntryFormat& format) {
  const int64_t groups = block.size(0), block_entries = block.size(1), entry_bytes = block.size(2);
  if (src.device().is_cpu() && block.device().is_cpu() && src.scalar_type() == at::kFloat &&
      src.stride(3) == 1 && block.is_contiguous()) {
    uint8_t* dst = block.data_ptr<uint8_t>();
    const float* x = src.data_ptr<float>();
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t t = 0; t < n; ++t) {
        StoreFloatRow(x + g * src.stride(1) + (from + t) * src.stride(2), format.head_size,
                      block.scalar_type(), &format,
                      dst + (g * block_entries + slot + t) * entry_bytes);
      }
    }
    return;
  }
  const int bits = format.kind == paged::EntryKind::kInt8 ? 8 : 4;
  const QuantizedGroups q =
      QuantizeGroups(src.select(0, 0).narrow(1, from, n), bits, format.group_size);
  const at::Tensor entries = block.narrow(1, slot, n);  // [G, n, entry_bytes]
  entries.narrow(2, 0, q.data.size(-1)).copy_(q.data.view(at::kByte));
  entries.narrow(2, paged::CodeBytes(format), 2 * q.scales.size(-1))
      .view(at::kHalf)
      .copy_(q.scales);
}

// The first n entries of a quantised pool block [G, bs, entry_bytes], decoded: [G, n, hs].
at::Tensor DecodeEntries(const at::Tensor& block, int64_t n, const paged::EntryFormat& format,
                         c10::ScalarType dtype) {
  if (block.device().is_cpu() && block.is_contiguous()) {
    const int64_t groups = block.size(0), block_entries = block.size(1),
                  entry_bytes = block.size(2);
    at::Tensor out = at::empty({groups, n, format.head_size}, at::kFloat);
    for (int64_t g = 0; g < groups; ++g) {
      DecodeQuantisedEntries(block.data_ptr<uint8_t>() + g * block_entries * entry_bytes, n,
                             entry_bytes, format, out.data_ptr<float>() + g * n * format.head_size);
    }
    return dtype == at::kFloat ? out : out.to(dtype);
  }
  const int bits = format.kind == paged::EntryKind::kInt8 ? 8 : 4;
  const at::Tensor entries = block.narrow(1, 0, n);
  at::Tensor codes = entries.narrow(2, 0, format.head_size * bits / 8);
  if (bits == 8) codes = codes.view(at::kChar);
  const at::Tensor scales =
      entries.narrow(2, paged::CodeBytes(format), 2 * (format.head_size / format.group_size))
          .view(at::kHalf);
  return DequantizeGroups(codes, scales, bits, format.group_size, dtype);
}

// The entries of quantised blocks [G, bs, entry_bytes] holding `entries` entries (the last
// block partly filled), decoded: [G, entries, hs].
at::Tensor DecodeBlocks(absl::Span<const at::Tensor> blocks, int64_t entries,
                        const paged::EntryFormat& format, c10::ScalarType dtype) {
  std::vector<at::Tensor> decoded;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const int64_t block_entries = blocks[i].size(1);
    const int64_t n = std::min(block_entries, entries - static_cast<int64_t>(i) * block_entries);
    decoded.push_back(DecodeEntries(blocks[i], n, format, dtype));
  }
  return at::cat(decoded, 1);
}

void StoreEntries(const at::Tensor& src, int64_t from, int64_t n, const at::Tensor& block,
                  int64_t slot, const paged::EntryFormat* quantised) {
  if (quantised != nullptr) {
    QuantiseEntries(src, from, n, block, slot, *quantised);
  } else {
    CopyEntries(src, from, n, block, slot);
  }
}

at::Tensor ReadEntries(absl::Span<const at::Tensor> blocks, int64_t entries,
                       const paged::EntryFormat* quantised, c10::ScalarType dtype) {
  if (quantised != nullptr) return DecodeBlocks(blocks, entries, *quantised, dtype);
  return at::cat(std::vector<at::Tensor>(blocks.begin(), blocks.end()), 1)
      .narrow(1, 0, entries)
      .to(dtype);
}

}  // namespace lgpt
