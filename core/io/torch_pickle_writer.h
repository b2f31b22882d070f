// Writes PyTorch checkpoints in the format of Python's torch.save(state_dict) (the zip format
// of PyTorch >= 1.6), such as LitGPT's lit_model.pth, so that torch.load in Python and
// ReadTorchStateDict (torch_pickle.h) read them back.
#ifndef LGPT_CORE_IO_TORCH_PICKLE_WRITER_H_
#define LGPT_CORE_IO_TORCH_PICKLE_WRITER_H_

#include <string>

#include "absl/status/status.h"
#include "core/io/tensor_map.h"

namespace lgpt {

// Writes `tensors` to `path` as torch.save(OrderedDict(tensors)) does: a zip archive of stored
// (uncompressed) records `archive/data.pkl` (pickle protocol 2: a collections.OrderedDict of
// str -> torch._utils._rebuild_tensor_v2(...), storages referenced by persistent id
// ('storage', torch.<Dtype>Storage, key, 'cpu', numel)), `archive/byteorder` ("little"),
// `archive/data/<key>` (one storage per tensor, holding a contiguous CPU copy of it) and
// `archive/version` ("3\n"). Every record's data starts on a 64-byte boundary, padded with
// an "FB" extra field as PyTorch's writer does, and carries its CRC-32; zip64 fields are
// written where sizes or offsets need them, so files past 4 GiB work.
//
// Tensors may live on any device and have any layout; each is copied to contiguous CPU
// memory only while it is written (no copy for tensors already contiguous on the CPU), so
// memory stays at one tensor beyond what the caller holds. Tensors that share memory are
// written as separate storages. requires_grad is written as False.
//
// Dtypes: float64, float32, float16, bfloat16, int64, int32, int16, int8, uint8, bool.
// The file is written as `<path>.partial` and renamed to `path` when complete, so `path` never
// holds a partial checkpoint and a reader that has the old file memory-mapped (as
// ReadTorchStateDict and ReadSafetensors do) keeps its data: overwriting the file a model was
// loaded from is safe.
//
// Errors: InvalidArgument naming the path and tensor for an undefined tensor, another dtype
// or a key that is not valid UTF-8; errno-derived codes when the file cannot be created,
// written or renamed (the partial file is removed).
absl::Status WriteTorchStateDict(const std::string& path, const TensorMap& tensors);

}  // namespace lgpt

#endif  // LGPT_CORE_IO_TORCH_PICKLE_WRITER_H_
