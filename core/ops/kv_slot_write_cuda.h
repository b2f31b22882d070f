// Launchers of the CUDA KV slot write (kv_slot_write.cu), in plain C++ types so that the host
// compiler's code (kv_slot_write.cc) calls them without CUDA headers. Built only against a
// CUDA LibTorch (LGPT_LIBTORCH_HAS_CUDA); see kv_slot_write.h for the operation.
#ifndef LGPT_CORE_OPS_KV_SLOT_WRITE_CUDA_H_
#define LGPT_CORE_OPS_KV_SLOT_WRITE_CUDA_H_

#include <cstdint>

#include "core/ops/kv_slot_layout.h"

namespace lgpt {
namespace cuda {

// Copies keys and values [groups, tokens, head_size] (strided as `source`) into the pools at
// slots[token] (device memory; negative: skipped), elements of `element_bytes` (2 or 4) bytes,
// on `stream` (a cudaStream_t). Returns the launch's cudaError_t (0 on success).
int LaunchKVSlotWrite(const void* keys, const void* values, const int64_t* slots,
                      const kv_slot::SourceShape& source, void* key_pool, void* value_pool,
                      const kv_slot::PoolShape& pool, int element_bytes, void* stream);

// The name of a cudaError_t, for messages.
const char* CudaErrorName(int error);

}  // namespace cuda
}  // namespace lgpt

#endif  // LGPT_CORE_OPS_KV_SLOT_WRITE_CUDA_H_
