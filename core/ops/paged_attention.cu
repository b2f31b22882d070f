// CUDA paged decode attention: one thread block per (request, key group, split of entries).
// A block locates its split's entries through the block table, computes the scores of the
// group's query heads (a warp per entry: each lane holds its channels of the key in registers
// and reuses them for every head, so a key is read once per group), a float32 softmax per head
// (a warp per head), and the weighted values (a thread per (head, channel)); a second kernel
// merges the splits by their log-sum-exp. Index math, dequantisation, masks and the merge are
// paged_attention_layout.h's, the same the CPU twin (paged_attention.cc) runs.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/ops/paged_attention_cuda.h"
#include "core/ops/paged_attention_layout.h"

namespace lgpt {
namespace cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxChannelsPerLane = 8;  // head_size <= 256

__device__ float WarpSum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ float WarpMax(float x) {
  for (int offset = 16; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

struct DeviceExp {
  __device__ float operator()(float x) const { return expf(x); }
};

// Index of (row, head, split) in the partial arrays.
__device__ int64_t PartialIndex(const PagedDecodeArgs& a, int64_t row, int64_t head,
                                int64_t split) {
  return (row * a.heads + head) * a.max_splits + split;
}

// Fills entry_index[0, n) with the pool index of the split's visible entries (-1: masked).
__device__ void LocateSplit(const PagedDecodeArgs& a, int64_t row, int64_t group, int64_t begin,
                            int64_t n, int64_t* entry_index) {
  const int32_t* table = a.block_tables + row * a.table_size;
  const int64_t query_position = a.query_positions[row];
  for (int64_t e = threadIdx.x; e < n; e += kThreads) {
    const int64_t index = paged::LocateEntry(a.pool, table, a.table_size, group, begin + e);
    int64_t position = begin + e;
    if (a.slot_positions != nullptr) position = index >= 0 ? a.slot_positions[index] : -1;
    const bool visible =
        index >= 0 && paged::KeyVisible(query_position, position, a.sliding_window);
    entry_index[e] = visible ? index : -1;
  }
}

// scores[h * stride + e] = the capped, scaled q_h · k_e, or -infinity where masked.
template <paged::EntryKind Kind>
__device__ void Scores(const PagedDecodeArgs& a, int heads_per_group, int64_t n,
                       const int64_t* entry_index, const float* q, float* scores, int64_t stride) {
  paged::EntryFormat format = a.format;
  format.kind = Kind;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int head_size = format.head_size;
  for (int64_t e = warp; e < n; e += kWarps) {
    if (entry_index[e] < 0) {
      for (int h = lane; h < heads_per_group; h += 32)
        scores[h * stride + e] = paged::NegativeInfinity();
      continue;
    }
    const uint8_t* key = a.keys + entry_index[e] * a.pool.entry_bytes;
    float k[kMaxChannelsPerLane];
#pragma unroll
    for (int j = 0; j < kMaxChannelsPerLane; ++j) {
      const int d = lane + 32 * j;
      k[j] = d < head_size ? paged::EntryElement(key, format, d) : 0.0f;
    }
    for (int h = 0; h < heads_per_group; ++h) {
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < kMaxChannelsPerLane; ++j) {
        const int d = lane + 32 * j;
        if (d < head_size) dot += k[j] * q[h * head_size + d];
      }
      dot = WarpSum(dot);
      if (lane == 0) {
        float score = dot * a.scale;
        if (a.softcap > 0.0f) score = tanhf(score / a.softcap) * a.softcap;
        scores[h * stride + e] = score;
      }
    }
  }
}

// Per head: the max score, the scores replaced by exp(score - max), and their sum.
__device__ void Softmax(int heads_per_group, int64_t n, float* scores, int64_t stride, float* maxes,
                        float* sums) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int h = warp; h < heads_per_group; h += kWarps) {
    float* row = scores + h * stride;
    float m = paged::NegativeInfinity();
    for (int64_t e = lane; e < n; e += 32) m = fmaxf(m, row[e]);
    m = WarpMax(m);
    float sum = 0.0f;
    for (int64_t e = lane; e < n; e += 32) {
      const float p = row[e] == paged::NegativeInfinity() ? 0.0f : expf(row[e] - m);
      row[e] = p;
      sum += p;
    }
    sum = WarpSum(sum);
    if (lane == 0) {
      maxes[h] = m;
      sums[h] = sum;
    }
  }
}

template <paged::EntryKind Kind>
__global__ void __launch_bounds__(kThreads) SplitKernel(PagedDecodeArgs a) {
  const int64_t row = blockIdx.x, group = blockIdx.y, split = blockIdx.z;
  const int64_t length = a.lengths[row];
  const int64_t begin = split * a.entries_per_split;
  if (split > 0 && begin >= length) return;  // the merge reads only SplitCount(length) splits
  const int64_t n = length - begin < a.entries_per_split ? (length > begin ? length - begin : 0)
                                                         : a.entries_per_split;
  const int heads_per_group = static_cast<int>(a.heads / a.pool.groups);
  const int head_size = a.format.head_size;
  const int64_t stride = a.entries_per_split;

  extern __shared__ int64_t shared[];
  int64_t* entry_index = shared;
  float* q = reinterpret_cast<float*>(entry_index + a.entries_per_split);
  float* scores = q + heads_per_group * head_size;
  float* maxes = scores + heads_per_group * stride;
  float* sums = maxes + heads_per_group;

  const float* q_in = a.q + (row * a.heads + group * heads_per_group) * head_size;
  for (int i = threadIdx.x; i < heads_per_group * head_size; i += kThreads) q[i] = q_in[i];
  LocateSplit(a, row, group, begin, n, entry_index);
  __syncthreads();
  Scores<Kind>(a, heads_per_group, n, entry_index, q, scores, stride);
  __syncthreads();
  Softmax(heads_per_group, n, scores, stride, maxes, sums);
  __syncthreads();

  paged::EntryFormat format = a.format;
  format.kind = Kind;
  // A length beyond the splits sized from max_length: the contract was broken, say so.
  const bool overlong = length > a.max_splits * a.entries_per_split;
  for (int i = threadIdx.x; i < heads_per_group * head_size; i += kThreads) {
    const int h = i / head_size, d = i % head_size;
    float acc = 0.0f;
    for (int64_t e = 0; e < n; ++e) {
      if (entry_index[e] < 0) continue;
      acc += scores[h * stride + e] *
             paged::EntryElement(a.values + entry_index[e] * a.pool.entry_bytes, format, d);
    }
    const int64_t head = group * heads_per_group + h;
    if (a.max_splits == 1 || overlong) {
      float y = sums[h] > 0.0f ? acc / sums[h] : 0.0f;
      if (overlong) y = __int_as_float(0x7fc00000);
      a.out[(row * a.heads + head) * head_size + d] = y;
    } else {
      const int64_t p = PartialIndex(a, row, head, split);
      a.partial_out[p * head_size + d] = acc;
      if (d == 0) {
        a.partial_max[p] = maxes[h];
        a.partial_sum[p] = sums[h];
      }
    }
  }
}

// One thread block per (row, head): the splits' outputs weighted by MergeFactors.
__global__ void __launch_bounds__(kThreads) MergeKernel(PagedDecodeArgs a) {
  const int64_t row = blockIdx.x, head = blockIdx.y;
  const int64_t length = a.lengths[row];
  if (length > a.max_splits * a.entries_per_split) return;  // NaN written by the split kernel
  const int64_t splits = paged::SplitCount(length, a.entries_per_split);
  extern __shared__ float factors[];  // [max_splits]
  const int64_t first = PartialIndex(a, row, head, 0);
  if (threadIdx.x == 0) {
    paged::MergeFactors(a.partial_max + first, a.partial_sum + first, splits, DeviceExp(), factors);
  }
  __syncthreads();
  const int head_size = a.format.head_size;
  for (int d = threadIdx.x; d < head_size; d += kThreads) {
    float y = 0.0f;
    for (int64_t s = 0; s < splits; ++s)
      y += factors[s] * a.partial_out[(first + s) * head_size + d];
    a.out[(row * a.heads + head) * head_size + d] = y;
  }
}

template <paged::EntryKind Kind>
int Launch(const PagedDecodeArgs& a, cudaStream_t stream) {
  const int64_t heads_per_group = a.heads / a.pool.groups;
  const int64_t shared =
      paged::SplitSharedBytes(heads_per_group, a.format.head_size, a.entries_per_split);
  if (shared > 48 * 1024) {
    const cudaError_t error = cudaFuncSetAttribute(
        SplitKernel<Kind>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
    if (error != cudaSuccess) return error;
  }
  const dim3 grid(static_cast<unsigned>(a.rows), static_cast<unsigned>(a.pool.groups),
                  static_cast<unsigned>(a.max_splits));
  SplitKernel<Kind><<<grid, kThreads, shared, stream>>>(a);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess || a.max_splits == 1) return error;
  const dim3 merge_grid(static_cast<unsigned>(a.rows), static_cast<unsigned>(a.heads));
  MergeKernel<<<merge_grid, kThreads, a.max_splits * sizeof(float), stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

int LaunchPagedDecodeAttention(const PagedDecodeArgs& args, void* stream) {
  if (args.rows == 0) return cudaSuccess;
  if (args.format.head_size > 32 * kMaxChannelsPerLane) return cudaErrorInvalidValue;
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  switch (args.format.kind) {
    case paged::EntryKind::kFloat32:
      return Launch<paged::EntryKind::kFloat32>(args, cuda_stream);
    case paged::EntryKind::kBFloat16:
      return Launch<paged::EntryKind::kBFloat16>(args, cuda_stream);
    case paged::EntryKind::kFloat16:
      return Launch<paged::EntryKind::kFloat16>(args, cuda_stream);
    case paged::EntryKind::kInt8:
      return Launch<paged::EntryKind::kInt8>(args, cuda_stream);
    case paged::EntryKind::kInt4:
      return Launch<paged::EntryKind::kInt4>(args, cuda_stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace lgpt
