// Writes a step's keys and values into a paged KV pool at their slots, keys and values in one
// pass (vLLM's reshape_and_cache): entry t of every group goes to flat slot slots[t] of the
// pool, the slot naming block and offset (kv_slot_layout.h). One kernel library per device:
// on the CPU a loop of row copies (the CUDA kernel's twin, same index math), on CUDA one
// kernel launch on the current stream (built only against a CUDA LibTorch).
#ifndef LGPT_CORE_OPS_KV_SLOT_WRITE_H_
#define LGPT_CORE_OPS_KV_SLOT_WRITE_H_

#include <ATen/ATen.h>

#include "absl/status/status.h"

namespace lgpt {

// keys, values: [n_query_groups, T, head_size] (head_size contiguous, any other strides);
// slots: [T] int64 on the pools' device, a slot outside [0, num_blocks * entries_per_block) (-1 for
// padding) is skipped; key_pool, value_pool: [num_blocks, n_query_groups, entries_per_block,
// head_size], contiguous. float32, bfloat16 or float16, all of one dtype and device.
// InvalidArgument naming the argument at fault otherwise.
absl::Status WriteKVSlots(const at::Tensor& keys, const at::Tensor& values, const at::Tensor& slots,
                          const at::Tensor& key_pool, const at::Tensor& value_pool);

// Whether this build has the CUDA kernel (built against a CUDA LibTorch).
bool KVSlotWriteHasCudaKernel();

}  // namespace lgpt

#endif  // LGPT_CORE_OPS_KV_SLOT_WRITE_H_
