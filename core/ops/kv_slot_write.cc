#include "core/ops/kv_slot_write.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/base/shape_text.h"
#include "core/base/status_macros.h"
#include "core/ops/kv_slot_layout.h"

#ifdef LGPT_LIBTORCH_HAS_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "core/ops/kv_slot_write_cuda.h"
#endif

namespace lgpt {
namespace {

absl::Status CheckPool(const char* name, const at::Tensor& pool, const at::Tensor& keys) {
  if (pool.dim() != 4 || pool.size(1) != keys.size(0) || pool.size(3) != keys.size(2)) {
    return absl::InvalidArgumentError(absl::StrCat("WriteKVSlots: ", name, " must be [num_blocks, ",
                                                   keys.size(0), ", entries_per_block, ", keys.size(2),
                                                   "], got ", ShapeText(pool.sizes())));
  }
  if (!pool.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat("WriteKVSlots: ", name, " must be contiguous"));
  }
  if (pool.scalar_type() != keys.scalar_type() || pool.device() != keys.device()) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteKVSlots: ", name, " is ", c10::toString(pool.scalar_type()), " on ",
                     pool.device().str(), ", keys ", c10::toString(keys.scalar_type()), " on ",
                     keys.device().str()));
  }
  return absl::OkStatus();
}

absl::Status CheckArguments(const at::Tensor& keys, const at::Tensor& values,
                            const at::Tensor& slots, const at::Tensor& key_pool,
                            const at::Tensor& value_pool) {
  if (keys.dim() != 3 || !values.sizes().equals(keys.sizes())) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteKVSlots: keys and values must both be [n_query_groups, T, "
                     "head_size], got keys ",
                     ShapeText(keys.sizes()), " and values ", ShapeText(values.sizes())));
  }
  const auto dtype = keys.scalar_type();
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WriteKVSlots: keys must be float32, bfloat16 or float16, got ", c10::toString(dtype)));
  }
  if (values.scalar_type() != dtype || values.device() != keys.device()) {
    return absl::InvalidArgumentError("WriteKVSlots: values must match keys' dtype and device");
  }
  if ((keys.size(2) > 1 && keys.stride(2) != 1) || (values.size(2) > 1 && values.stride(2) != 1) ||
      keys.strides() != values.strides()) {
    return absl::InvalidArgumentError(
        "WriteKVSlots: keys and values must have the same strides, head_size contiguous");
  }
  if (slots.dim() != 1 || slots.size(0) != keys.size(1) || slots.scalar_type() != at::kLong ||
      slots.device() != keys.device() || !slots.is_contiguous()) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteKVSlots: slots must be a contiguous int64 [", keys.size(1), "] on ",
                     keys.device().str(), ", got ", ShapeText(slots.sizes()), " ",
                     c10::toString(slots.scalar_type()), " on ", slots.device().str()));
  }
  RETURN_IF_ERROR(CheckPool("key_pool", key_pool, keys));
  RETURN_IF_ERROR(CheckPool("value_pool", value_pool, keys));
  if (!value_pool.sizes().equals(key_pool.sizes())) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteKVSlots: value_pool ", ShapeText(value_pool.sizes()),
                     " differs from key_pool ", ShapeText(key_pool.sizes())));
  }
  return absl::OkStatus();
}

kv_slot::SourceShape SourceOf(const at::Tensor& keys) {
  return {keys.size(0), keys.size(1), keys.size(2), keys.stride(0), keys.stride(1)};
}

kv_slot::PoolShape PoolOf(const at::Tensor& pool) {
  return {pool.size(0), pool.size(1), pool.size(2), pool.size(3)};
}

// The CUDA kernel's twin: the same offsets, a head_size row at a time.
void WriteOnCpu(const at::Tensor& keys, const at::Tensor& values, const at::Tensor& slots,
                const at::Tensor& key_pool, const at::Tensor& value_pool) {
  const kv_slot::SourceShape source = SourceOf(keys);
  const kv_slot::PoolShape pool = PoolOf(key_pool);
  const int64_t item = keys.element_size(), row = source.head_size * item;
  const int64_t* slot = slots.data_ptr<int64_t>();
  const char* key_data = static_cast<const char*>(keys.data_ptr());
  const char* value_data = static_cast<const char*>(values.data_ptr());
  char* key_out = static_cast<char*>(key_pool.data_ptr());
  char* value_out = static_cast<char*>(value_pool.data_ptr());
  for (int64_t t = 0; t < source.tokens; ++t) {
    if (!kv_slot::SlotInPool(pool, slot[t])) continue;
    for (int64_t g = 0; g < source.groups; ++g) {
      const int64_t to = kv_slot::PoolOffset(pool, slot[t], g, 0) * item;
      const int64_t from = kv_slot::SourceOffset(source, g, t, 0) * item;
      std::memcpy(key_out + to, key_data + from, row);
      std::memcpy(value_out + to, value_data + from, row);
    }
  }
}

#ifdef LGPT_LIBTORCH_HAS_CUDA
absl::Status WriteOnCuda(const at::Tensor& keys, const at::Tensor& values, const at::Tensor& slots,
                         const at::Tensor& key_pool, const at::Tensor& value_pool) {
  const c10::cuda::CUDAGuard guard(keys.device());
  const int error = cuda::LaunchKVSlotWrite(
      keys.data_ptr(), values.data_ptr(), slots.data_ptr<int64_t>(), SourceOf(keys),
      key_pool.data_ptr(), value_pool.data_ptr(), PoolOf(key_pool),
      static_cast<int>(keys.element_size()), c10::cuda::getCurrentCUDAStream().stream());
  if (error != 0) {
    return absl::InternalError(
        absl::StrCat("WriteKVSlots: CUDA launch failed: ", cuda::CudaErrorName(error)));
  }
  return absl::OkStatus();
}
#endif

}  // namespace

absl::Status WriteKVSlots(const at::Tensor& keys, const at::Tensor& values, const at::Tensor& slots,
                          const at::Tensor& key_pool, const at::Tensor& value_pool) {
  RETURN_IF_ERROR(CheckArguments(keys, values, slots, key_pool, value_pool));
  if (keys.device().is_cpu()) {
    WriteOnCpu(keys, values, slots, key_pool, value_pool);
    return absl::OkStatus();
  }
#ifdef LGPT_LIBTORCH_HAS_CUDA
  if (keys.device().is_cuda()) return WriteOnCuda(keys, values, slots, key_pool, value_pool);
#endif
  return absl::UnimplementedError(
      absl::StrCat("WriteKVSlots: no kernel for ", keys.device().str(), " in this build"));
}

bool KVSlotWriteHasCudaKernel() {
#ifdef LGPT_LIBTORCH_HAS_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace lgpt
