// Reads and writes NumPy .npy files: the format the golden reference outputs (tokens,
// logits) come in and the format tools write logits back in for comparison with NumPy.
#ifndef LGPT_CORE_IO_NPY_H_
#define LGPT_CORE_IO_NPY_H_

#include <string>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lgpt {

// Reads a .npy file (format versions 1.0, 2.0 and 3.0) into a new CPU tensor that owns its
// memory. Supported dtypes: '<f8' '<f4' '<f2' '<i8' '<i4' '<i2' '|i1' '|u1' '|b1' (for the
// one-byte types any byte-order character is accepted). Any rank, including 0-d.
// fortran_order True is supported: the data is transposed into a C-contiguous tensor of the
// declared shape. Booleans are normalised (any non-zero byte reads as true).
//
// Errors (never exceptions): NotFound / PermissionDenied / FailedPrecondition for a path that
// cannot be opened or is not a regular file; InvalidArgument for a malformed file (bad magic,
// header, shape, or a file size that does not match header + data exactly); Unimplemented for
// valid NumPy files this reader does not handle (big-endian, structured, other dtypes). Every
// message names the path.
absl::StatusOr<at::Tensor> ReadNpy(const std::string& path);

// Writes `tensor` as a .npy version 1.0 file (C order, little-endian, header padded so the
// data starts at a multiple of 64 bytes), readable by numpy.load. The tensor may live on any
// device and have any layout; a contiguous CPU copy is written. Supported dtypes: float64,
// float32, float16, int64, int32, int16, int8, uint8, bool (NumPy has no bfloat16).
absl::Status WriteNpy(const std::string& path, const at::Tensor& tensor);

}  // namespace lgpt

#endif  // LGPT_CORE_IO_NPY_H_
