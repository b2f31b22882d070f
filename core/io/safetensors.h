// Reads and writes safetensors files (https://github.com/huggingface/safetensors): the
// checkpoint format weights are loaded from. Reading memory-maps the file so that weights are
// not copied. Also holds MappedFile, the mapping the PyTorch checkpoint reader shares.
#ifndef LGPT_CORE_IO_SAFETENSORS_H_
#define LGPT_CORE_IO_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/io/tensor_map.h"

namespace lgpt {

// A whole regular file mapped into memory, private and copy-on-write: the file is opened
// read-only and never modified, yet tensors over the mapping may be written to in place
// (the pages written become private copies). The mapping is released when the last
// shared_ptr goes away; tensors built over it hold one. A file truncated by another process
// while mapped makes later reads of the lost pages fault (SIGBUS), as with any mmap.
class MappedFile {
 public:
  // Errors: NotFound / PermissionDenied (from errno) naming the path, FailedPrecondition for
  // a directory or other non-regular file, and errno-derived codes for mmap failures.
  static absl::StatusOr<std::shared_ptr<MappedFile>> Open(const std::string& path);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  // The mapped bytes; nullptr when the file is empty.
  uint8_t* data() const { return data_; }
  // Gives back the resident pages that lie wholly inside [begin, begin + bytes) (a tensor's
  // data whose last holder is gone): they leave the process's RSS at once instead of when
  // the whole file is unmapped, so a model quantised at load never holds the float32 file
  // and the quantised weights beside each other. Reading them again would fault them back
  // from the file; callers pass ranges that nothing else reads (tensors do not overlap).
  void Release(const void* begin, size_t bytes) const;
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::string path_;
  uint8_t* data_;
  size_t size_;
};

// One tensor entry of a safetensors header.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // As spelled in the file: "F32", "BF16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // Byte range within the data section, which starts at data_offset.
  uint64_t end = 0;
};

// A validated safetensors header.
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;        // Sorted by name.
  std::map<std::string, std::string> metadata;  // The optional "__metadata__" object.
  uint64_t data_offset = 0;                     // 8 + header length.
};

// Reads and validates only the header (no tensor data is read or mapped): the checks of
// ReadSafetensors that do not need the data, including the data size.
absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path);

// Reads all tensors of a safetensors file as CPU tensors. Dtypes: F64 F32 F16 BF16 I64 I32
// I16 I8 U8 BOOL. Tensors are zero-copy views of a MappedFile (valid after this returns; the
// mapping lives until the last of them dies) except where that is unsafe, in which case the
// tensor is copied into memory of its own: data misaligned for its dtype, and BOOL data (which
// is normalised, any non-zero byte reading as true). Empty tensors own their (empty) memory.
//
// Validation: the header length against the file size and a 100 MB cap; the JSON (strictly,
// with a streaming parser: no duplicate keys at any level, no unknown fields in an entry,
// names are valid UTF-8, "__metadata__" must map strings to strings); each dtype; each shape
// (non-negative integers, no int64 overflow, rank <= 64); each data_offsets pair (begin <=
// end <= data section size, end - begin == numel * element size); and that no two non-empty
// byte ranges overlap. Gaps between ranges are tolerated.
//
// Errors: those of MappedFile::Open; InvalidArgument for a malformed file; Unimplemented for a
// valid dtype this reader does not handle (U16, U32, U64, F8_*...). Messages name the path.
absl::StatusOr<TensorMap> ReadSafetensors(const std::string& path);

// Writes `tensors` (any device or layout; each is copied to contiguous CPU memory one at a
// time) as a safetensors file: header keys sorted, "__metadata__" holding `metadata`
// ({"format": "pt"} by default, which Hugging Face loaders expect), the header padded with
// spaces to a multiple of 8 bytes, and the data ordered by decreasing element size and then
// name so that every tensor is aligned to its element size. Names must be valid UTF-8 and not
// "__metadata__"; tensors must be defined and of a dtype the reader supports.
absl::Status WriteSafetensors(const std::string& path, const TensorMap& tensors,
                              const std::map<std::string, std::string>& metadata = {
                                  {"format", "pt"}});

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF).
bool IsValidUtf8(const std::string& s);

}  // namespace lgpt

#endif  // LGPT_CORE_IO_SAFETENSORS_H_
