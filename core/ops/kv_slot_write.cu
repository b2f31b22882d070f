// CUDA KV slot write: one thread per (token, group, element), keys and values in one launch.
// Index math is kv_slot_layout.h's, the same the CPU twin (kv_slot_write.cc) runs.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/ops/kv_slot_layout.h"
#include "core/ops/kv_slot_write_cuda.h"

namespace lgpt {
namespace cuda {
namespace {

// Element of `Bytes` bytes, copied as one load and store.
template <int Bytes>
struct Element;
template <>
struct Element<2> {
  using type = uint16_t;
};
template <>
struct Element<4> {
  using type = uint32_t;
};

template <int Bytes>
__global__ void KVSlotWriteKernel(const typename Element<Bytes>::type* keys,
                                  const typename Element<Bytes>::type* values,
                                  const int64_t* slots, kv_slot::SourceShape source,
                                  typename Element<Bytes>::type* key_pool,
                                  typename Element<Bytes>::type* value_pool,
                                  kv_slot::PoolShape pool) {
  const int64_t total = source.tokens * source.groups * source.head_size;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t dim = i % source.head_size;
    const int64_t group = (i / source.head_size) % source.groups;
    const int64_t token = i / (source.head_size * source.groups);
    const int64_t slot = slots[token];
    if (!kv_slot::SlotInPool(pool, slot)) continue;
    const int64_t to = kv_slot::PoolOffset(pool, slot, group, dim);
    const int64_t from = kv_slot::SourceOffset(source, group, token, dim);
    key_pool[to] = keys[from];
    value_pool[to] = values[from];
  }
}

template <int Bytes>
int Launch(const void* keys, const void* values, const int64_t* slots,
           const kv_slot::SourceShape& source, void* key_pool, void* value_pool,
           const kv_slot::PoolShape& pool, cudaStream_t stream) {
  using T = typename Element<Bytes>::type;
  const int64_t total = source.tokens * source.groups * source.head_size;
  if (total == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t wanted = (total + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(wanted < 65535 ? wanted : 65535);
  KVSlotWriteKernel<Bytes><<<blocks, kThreads, 0, stream>>>(
      static_cast<const T*>(keys), static_cast<const T*>(values), slots, source,
      static_cast<T*>(key_pool), static_cast<T*>(value_pool), pool);
  return cudaGetLastError();
}

}  // namespace

int LaunchKVSlotWrite(const void* keys, const void* values, const int64_t* slots,
                      const kv_slot::SourceShape& source, void* key_pool, void* value_pool,
                      const kv_slot::PoolShape& pool, int element_bytes, void* stream) {
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  switch (element_bytes) {
    case 2:
      return Launch<2>(keys, values, slots, source, key_pool, value_pool, pool, cuda_stream);
    case 4:
      return Launch<4>(keys, values, slots, source, key_pool, value_pool, pool, cuda_stream);
    default:
      return cudaErrorInvalidValue;
  }
}

const char* CudaErrorName(int error) { return cudaGetErrorName(static_cast<cudaError_t>(error)); }

}  // namespace cuda
}  // namespace lgpt
