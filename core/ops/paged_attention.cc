#include "core/ops/paged_attention.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/shape_text.h"
#include "core/base/status_macros.h"
#include "core/ops/paged_attention_layout.h"

#ifdef LGPT_LIBTORCH_HAS_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "core/ops/paged_attention_cuda.h"
#endif

namespace lgpt {
namespace {

constexpr int64_t kMaxHeadSize = 256;
constexpr int64_t kMaxSharedBytes = 48 * 1024;

absl::Status Invalid(const std::string& argument, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("PagedDecodeAttention: ", argument, " ", what));
}

// The entry format the layer's tensors hold for queries of `head_size` channels.
absl::StatusOr<paged::EntryFormat> FormatOf(const PagedKVLayer& layer, int64_t head_size) {
  paged::EntryFormat format;
  format.head_size = static_cast<int32_t>(head_size);
  format.group_size = static_cast<int32_t>(layer.group_size);
  if (layer.bits == 16) {
    switch (layer.keys.scalar_type()) {
      case at::kFloat:
        format.kind = paged::EntryKind::kFloat32;
        break;
      case at::kBFloat16:
        format.kind = paged::EntryKind::kBFloat16;
        break;
      case at::kHalf:
        format.kind = paged::EntryKind::kFloat16;
        break;
      default:
        return Invalid("layer.keys", absl::StrCat("must be float32, bfloat16 or float16 with bits "
                                                  "16, got ",
                                                  c10::toString(layer.keys.scalar_type())));
    }
    return format;
  }
  if (layer.bits != 8 && layer.bits != 4) {
    return Invalid("layer.bits", absl::StrCat("must be 16, 8 or 4, got ", layer.bits));
  }
  format.kind = layer.bits == 8 ? paged::EntryKind::kInt8 : paged::EntryKind::kInt4;
  if (layer.keys.scalar_type() != at::kByte) {
    return Invalid("layer.keys", absl::StrCat("must be uint8 with bits ", layer.bits, ", got ",
                                              c10::toString(layer.keys.scalar_type())));
  }
  if (layer.group_size < 1 || head_size % layer.group_size != 0 ||
      (layer.bits == 4 && layer.group_size % 2 != 0)) {
    return Invalid("layer.group_size",
                   absl::StrCat("must divide head_size ", head_size,
                                layer.bits == 4 ? " and be even" : "", ", got ", layer.group_size));
  }
  return format;
}

absl::Status CheckPool(const char* name, const at::Tensor& pool, const at::Tensor& q,
                       int64_t last_dim, const at::Tensor& keys) {
  if (!pool.defined() || pool.dim() != 4 || pool.size(3) != last_dim) {
    return Invalid(
        name, absl::StrCat("must be [num_blocks, n_query_groups, entries_per_block, ", last_dim,
                           "], got ", pool.defined() ? ShapeText(pool.sizes()) : "undefined"));
  }
  if (!pool.sizes().equals(keys.sizes()) || pool.scalar_type() != keys.scalar_type()) {
    return Invalid(name, "must match layer.keys' shape and dtype");
  }
  if (!pool.is_contiguous()) return Invalid(name, "must be contiguous");
  if (pool.device() != q.device()) {
    return Invalid(name, absl::StrCat("is on ", pool.device().str(), ", q on ", q.device().str()));
  }
  return absl::OkStatus();
}

absl::Status CheckInt32(const char* name, const at::Tensor& t, at::IntArrayRef sizes,
                        const at::Tensor& q) {
  if (!t.defined() || !t.sizes().equals(sizes) || t.scalar_type() != at::kInt ||
      !t.is_contiguous() || t.device() != q.device()) {
    return Invalid(name, absl::StrCat("must be a contiguous int32 ", ShapeText(sizes), " on ",
                                      q.device().str(), ", got ",
                                      t.defined() ? absl::StrCat(ShapeText(t.sizes()), " ",
                                                                 c10::toString(t.scalar_type()),
                                                                 " on ", t.device().str())
                                                  : "undefined"));
  }
  return absl::OkStatus();
}

struct Checked {
  paged::EntryFormat format;
  paged::PoolShape pool;
  int64_t rows = 0, heads = 0, table_size = 0;
};

absl::StatusOr<Checked> CheckArguments(const at::Tensor& q, const PagedKVLayer& layer,
                                       const PagedDecodeBatch& batch) {
  if (!q.defined() || q.dim() != 3 ||
      (q.scalar_type() != at::kFloat && q.scalar_type() != at::kBFloat16 &&
       q.scalar_type() != at::kHalf)) {
    return Invalid("q", absl::StrCat("must be float32, bfloat16 or float16 [R, n_head, "
                                     "head_size], got ",
                                     q.defined() ? ShapeText(q.sizes()) : "undefined"));
  }
  const int64_t head_size = q.size(2);
  if (head_size < 1 || head_size > kMaxHeadSize) {
    return Invalid("q", absl::StrCat("head_size must be 1 .. ", kMaxHeadSize, ", got ", head_size));
  }
  if (!layer.keys.defined()) return Invalid("layer.keys", "is undefined");
  ASSIGN_OR_RETURN(const paged::EntryFormat format, FormatOf(layer, head_size));
  const int64_t last_dim = layer.bits == 16 ? head_size : paged::EntryBytes(format);
  RETURN_IF_ERROR(CheckPool("layer.keys", layer.keys, q, last_dim, layer.keys));
  RETURN_IF_ERROR(CheckPool("layer.values", layer.values, q, last_dim, layer.keys));
  Checked c;
  c.format = format;
  c.pool = {layer.keys.size(0), layer.keys.size(1), layer.keys.size(2), paged::EntryBytes(format)};
  if (c.pool.groups < 1 || q.size(1) % c.pool.groups != 0) {
    return Invalid("q", absl::StrCat("n_head ", q.size(1), " must be a multiple of the pool's ",
                                     c.pool.groups, " key groups"));
  }
  if (c.pool.entries_per_block < 1) return Invalid("layer.keys", "has no entries per block");
  if (layer.slot_positions.defined()) {
    RETURN_IF_ERROR(CheckInt32("layer.slot_positions", layer.slot_positions,
                               {c.pool.num_blocks, c.pool.groups, c.pool.entries_per_block}, q));
  }
  c.rows = q.size(0);
  c.heads = q.size(1);
  if (!batch.block_tables.defined() || batch.block_tables.dim() != 2) {
    return Invalid("batch.block_tables", "must be [R, max_blocks]");
  }
  c.table_size = batch.block_tables.size(1);
  RETURN_IF_ERROR(CheckInt32("batch.block_tables", batch.block_tables, {c.rows, c.table_size}, q));
  RETURN_IF_ERROR(CheckInt32("batch.lengths", batch.lengths, {c.rows}, q));
  RETURN_IF_ERROR(CheckInt32("batch.query_positions", batch.query_positions, {c.rows}, q));
  if (batch.max_length < 0) {
    return Invalid("batch.max_length", absl::StrCat("must be >= 0, got ", batch.max_length));
  }
  return c;
}

// On the CPU the lengths and tables can be checked before the work.
absl::Status CheckHostRows(const Checked& c, const PagedDecodeBatch& batch) {
  const int32_t* lengths = batch.lengths.data_ptr<int32_t>();
  const int32_t* tables = batch.block_tables.data_ptr<int32_t>();
  for (int64_t r = 0; r < c.rows; ++r) {
    if (lengths[r] < 0 || lengths[r] > batch.max_length ||
        lengths[r] > c.table_size * c.pool.entries_per_block) {
      return Invalid("batch.lengths",
                     absl::StrCat("[", r, "] = ", lengths[r], " must be 0 .. min(max_length ",
                                  batch.max_length, ", the table's ",
                                  c.table_size * c.pool.entries_per_block, " entries)"));
    }
    const int64_t blocks = (lengths[r] + c.pool.entries_per_block - 1) / c.pool.entries_per_block;
    for (int64_t i = 0; i < blocks; ++i) {
      const int32_t block = tables[r * c.table_size + i];
      if (block < 0 || block >= c.pool.num_blocks) {
        return Invalid("batch.block_tables",
                       absl::StrCat("[", r, ", ", i, "] = ", block, " is outside the pool's ",
                                    c.pool.num_blocks, " blocks"));
      }
    }
  }
  return absl::OkStatus();
}

struct HostExp {
  float operator()(float x) const { return std::exp(x); }
};

// The CUDA kernel's twin for one (request, key group): the same splits, each's scores, softmax
// and unnormalised output, merged by MergeFactors. out [heads_per_group, head_size].
void TwinGroup(const Checked& c, const PagedKVLayer& layer, const PagedDecodeBatch& batch,
               const AttentionParams& params, int64_t entries_per_split, int64_t row, int64_t group,
               const float* q, float* out) {
  const int64_t hpg = c.heads / c.pool.groups, hs = c.format.head_size;
  const int64_t length = batch.lengths.data_ptr<int32_t>()[row];
  const int64_t query_position = batch.query_positions.data_ptr<int32_t>()[row];
  const int32_t* table = batch.block_tables.data_ptr<int32_t>() + row * c.table_size;
  const int32_t* slot_positions =
      layer.slot_positions.defined() ? layer.slot_positions.data_ptr<int32_t>() : nullptr;
  const auto* keys = static_cast<const uint8_t*>(layer.keys.data_ptr());
  const auto* values = static_cast<const uint8_t*>(layer.values.data_ptr());
  const int64_t splits = paged::SplitCount(length, entries_per_split);
  std::vector<float> maxes(hpg * splits), sums(hpg * splits), acc(hpg * splits * hs, 0.0f);
  std::vector<int64_t> index(entries_per_split);
  std::vector<float> scores(entries_per_split), factors(splits);
  for (int64_t s = 0; s < splits; ++s) {
    const int64_t begin = s * entries_per_split, n = std::min(entries_per_split, length - begin);
    for (int64_t e = 0; e < n; ++e) {
      const int64_t i = paged::LocateEntry(c.pool, table, c.table_size, group, begin + e);
      const int64_t position = slot_positions == nullptr ? begin + e
                               : i >= 0                  ? slot_positions[i]
                                                         : -1;
      index[e] =
          i >= 0 && paged::KeyVisible(query_position, position, params.sliding_window) ? i : -1;
    }
    for (int64_t h = 0; h < hpg; ++h) {
      for (int64_t e = 0; e < n; ++e) {
        if (index[e] < 0) {
          scores[e] = paged::NegativeInfinity();
          continue;
        }
        const uint8_t* key = keys + index[e] * c.pool.entry_bytes;
        float dot = 0.0f;
        for (int64_t d = 0; d < hs; ++d)
          dot += paged::EntryElement(key, c.format, d) * q[h * hs + d];
        float score = dot * static_cast<float>(params.scale);
        if (params.softcap) {
          const float cap = static_cast<float>(*params.softcap);
          score = std::tanh(score / cap) * cap;
        }
        scores[e] = score;
      }
      const float m = paged::MaxOf(scores.data(), n);
      float sum = 0.0f;
      float* y = acc.data() + (h * splits + s) * hs;
      for (int64_t e = 0; e < n; ++e) {
        if (index[e] < 0) continue;
        const float p = std::exp(scores[e] - m);
        sum += p;
        const uint8_t* value = values + index[e] * c.pool.entry_bytes;
        for (int64_t d = 0; d < hs; ++d) y[d] += p * paged::EntryElement(value, c.format, d);
      }
      maxes[h * splits + s] = m;
      sums[h * splits + s] = sum;
    }
  }
  for (int64_t h = 0; h < hpg; ++h) {
    paged::MergeFactors(maxes.data() + h * splits, sums.data() + h * splits, splits, HostExp(),
                        factors.data());
    for (int64_t d = 0; d < hs; ++d) {
      float y = 0.0f;
      for (int64_t s = 0; s < splits; ++s) y += factors[s] * acc[(h * splits + s) * hs + d];
      out[h * hs + d] = y;
    }
  }
}

at::Tensor AttendOnCpu(const at::Tensor& q32, const Checked& c, const PagedKVLayer& layer,
                       const PagedDecodeBatch& batch, const AttentionParams& params,
                       int64_t entries_per_split) {
  at::Tensor out = at::empty_like(q32);  // [R, n_head, hs] float32
  const int64_t hpg = c.heads / c.pool.groups, hs = c.format.head_size;
  const float* q = q32.data_ptr<float>();
  float* y = out.data_ptr<float>();
  at::parallel_for(0, c.rows * c.pool.groups, 1, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      const int64_t row = i / c.pool.groups, group = i % c.pool.groups;
      const int64_t offset = (row * c.heads + group * hpg) * hs;
      TwinGroup(c, layer, batch, params, entries_per_split, row, group, q + offset, y + offset);
    }
  });
  return out;
}

#ifdef LGPT_LIBTORCH_HAS_CUDA
absl::StatusOr<at::Tensor> AttendOnCuda(const at::Tensor& q32, const Checked& c,
                                        const PagedKVLayer& layer, const PagedDecodeBatch& batch,
                                        const AttentionParams& params, int64_t entries_per_split) {
  const c10::cuda::CUDAGuard guard(q32.device());
  cuda::PagedDecodeArgs a;
  a.q = q32.data_ptr<float>();
  a.keys = static_cast<const uint8_t*>(layer.keys.data_ptr());
  a.values = static_cast<const uint8_t*>(layer.values.data_ptr());
  a.slot_positions =
      layer.slot_positions.defined() ? layer.slot_positions.data_ptr<int32_t>() : nullptr;
  a.block_tables = batch.block_tables.data_ptr<int32_t>();
  a.lengths = batch.lengths.data_ptr<int32_t>();
  a.query_positions = batch.query_positions.data_ptr<int32_t>();
  a.pool = c.pool;
  a.format = c.format;
  a.table_size = c.table_size;
  a.rows = c.rows;
  a.heads = c.heads;
  a.entries_per_split = entries_per_split;
  a.max_splits = std::max<int64_t>(1, paged::SplitCount(batch.max_length, entries_per_split));
  if (a.max_splits > 65535) {  // a grid dimension's limit
    return Invalid("batch.max_length", absl::StrCat(batch.max_length, " needs ", a.max_splits,
                                                    " splits of ", entries_per_split,
                                                    " entries; at most 65535 (raise "
                                                    "PagedDecodeOptions.entries_per_split)"));
  }
  a.scale = static_cast<float>(params.scale);
  a.softcap = params.softcap ? static_cast<float>(*params.softcap) : 0.0f;
  a.sliding_window = params.sliding_window;
  at::Tensor out = at::empty_like(q32);
  a.out = out.data_ptr<float>();
  at::Tensor partial_out, partial_stats;
  if (a.max_splits > 1) {
    partial_out = at::empty({c.rows, c.heads, a.max_splits, c.format.head_size}, q32.options());
    partial_stats = at::empty({2, c.rows, c.heads, a.max_splits}, q32.options());
    a.partial_out = partial_out.data_ptr<float>();
    a.partial_max = partial_stats[0].data_ptr<float>();
    a.partial_sum = partial_stats[1].data_ptr<float>();
  }
  const int error = cuda::LaunchPagedDecodeAttention(a, c10::cuda::getCurrentCUDAStream().stream());
  if (error != 0) {
    return absl::InternalError(
        absl::StrCat("PagedDecodeAttention: CUDA launch failed: error ", error));
  }
  return out;
}
#endif

}  // namespace

int64_t PagedEntriesPerSplit(const PagedDecodeOptions& options, int64_t heads_per_group,
                             int64_t head_size) {
  int64_t entries = std::max<int64_t>(32, options.entries_per_split / 32 * 32);
  while (entries > 32 &&
         paged::SplitSharedBytes(heads_per_group, head_size, entries) > kMaxSharedBytes) {
    entries -= 32;
  }
  return entries;
}

absl::StatusOr<at::Tensor> PagedDecodeAttention(const at::Tensor& q, const PagedKVLayer& layer,
                                                const PagedDecodeBatch& batch,
                                                const AttentionParams& params,
                                                const PagedDecodeOptions& options) {
  ASSIGN_OR_RETURN(const Checked c, CheckArguments(q, layer, batch));
  const int64_t entries_per_split =
      PagedEntriesPerSplit(options, c.heads / c.pool.groups, c.format.head_size);
  const at::Tensor q32 = q.to(at::kFloat).contiguous();
  at::Tensor out;
  if (q.device().is_cpu()) {
    RETURN_IF_ERROR(CheckHostRows(c, batch));
    out = AttendOnCpu(q32, c, layer, batch, params, entries_per_split);
  } else {
#ifdef LGPT_LIBTORCH_HAS_CUDA
    if (!q.device().is_cuda()) {
      return absl::UnimplementedError(
          absl::StrCat("PagedDecodeAttention: no kernel for ", q.device().str()));
    }
    ASSIGN_OR_RETURN(out, AttendOnCuda(q32, c, layer, batch, params, entries_per_split));
#else
    return absl::UnimplementedError(
        absl::StrCat("PagedDecodeAttention: no kernel for ", q.device().str(), " in this build"));
#endif
  }
  return out.to(q.scalar_type());
}

absl::StatusOr<at::Tensor> PagedDecodeRows(const at::Tensor& q, const PagedKVLayer& layer,
                                           const std::vector<PagedDecodeRow>& rows,
                                           const AttentionParams& params,
                                           const PagedDecodeOptions& options) {
  if (rows.empty()) return absl::InvalidArgumentError("PagedDecodeRows: no rows");
  const int64_t block_entries = layer.keys.dim() == 4 ? layer.keys.size(2) : 0;
  size_t width = 1;
  int64_t max_length = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const PagedDecodeRow& row = rows[r];
    if (row.length < 0 || block_entries < 1 ||
        static_cast<int64_t>(row.blocks.size()) * block_entries < row.length) {
      return absl::InvalidArgumentError(absl::StrCat("PagedDecodeRows: rows[", r, "] holds ",
                                                     row.length, " entries in ", row.blocks.size(),
                                                     " blocks of ", block_entries));
    }
    width = std::max(width, row.blocks.size());
    max_length = std::max(max_length, row.length);
  }
  // [R * width] tables (padding past a row's blocks is never read), then R lengths, then R
  // query positions: one host tensor, one copy. For a device pool the host tensor is pinned, so
  // the copy is queued without waiting for the device (from pageable memory CUDA synchronises
  // first); the caching host allocator keeps its block until the copy is done.
  const int64_t count = static_cast<int64_t>(rows.size());
  const at::Tensor host =
      at::zeros({count * static_cast<int64_t>(width + 2)},
                at::TensorOptions().dtype(at::kInt).pinned_memory(!layer.keys.device().is_cpu()));
  int32_t* data = host.data_ptr<int32_t>();
  for (size_t r = 0; r < rows.size(); ++r) {
    std::copy(rows[r].blocks.begin(), rows[r].blocks.end(), data + r * width);
    data[rows.size() * width + r] = static_cast<int32_t>(rows[r].length);
    data[rows.size() * (width + 1) + r] = static_cast<int32_t>(rows[r].query_position);
  }
  const at::Tensor all = host.to(layer.keys.device(), /*non_blocking=*/true);
  PagedDecodeBatch batch;
  batch.block_tables = all.narrow(0, 0, count * static_cast<int64_t>(width))
                           .view({count, static_cast<int64_t>(width)});
  batch.lengths = all.narrow(0, count * static_cast<int64_t>(width), count);
  batch.query_positions = all.narrow(0, count * static_cast<int64_t>(width + 1), count);
  batch.max_length = max_length;
  return PagedDecodeAttention(q, layer, batch, params, options);
}

bool PagedAttentionHasCudaKernel() {
#ifdef LGPT_LIBTORCH_HAS_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace lgpt
