#include "core/io/npy.h"

#include <ATen/ATen.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "core/base/output_dir.h"
#include "core/base/status_macros.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the .npy reader and writer assume a little-endian host");

namespace lgpt {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
// NumPy itself refuses headers over 10000 bytes by default; this cap only bounds memory.
constexpr uint32_t kMaxHeaderLen = 1 << 20;
constexpr size_t kMaxRank = 64;

absl::Status Invalid(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": invalid .npy file: ", what));
}

// Owns a file descriptor.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Opens `path` for reading and checks that it is a regular file. O_NONBLOCK keeps a FIFO
// from blocking the open; it has no effect on reads from regular files.
absl::StatusOr<int> OpenRegularFile(const std::string& path, uint64_t* size) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open"));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return absl::ErrnoToStatus(err, absl::StrCat(path, ": cannot stat"));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(path, S_ISDIR(st.st_mode) ? ": is a directory" : ": not a regular file"));
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

// Reads exactly `n` bytes at `offset`.
absl::Status ReadAt(int fd, const std::string& path, uint64_t offset, void* buf, size_t n) {
  char* out = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t got = pread(fd, out, n, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat(path, ": read failed"));
    }
    if (got == 0) return absl::DataLossError(absl::StrCat(path, ": file shrank while reading"));
    out += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return absl::OkStatus();
}

struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// Parses the Python dict literal NumPy writes, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// Only what NumPy emits is accepted: string keys, a string, a bool and a tuple of ints.
class HeaderParser {
 public:
  explicit HeaderParser(absl::string_view text) : text_(text) {}

  // Returns an error description, or nullopt on success.
  std::optional<std::string> Parse(NpyHeader* header) {
    SkipSpace();
    if (!Consume('{')) return "header does not start with '{'";
    bool have_descr = false, have_order = false, have_shape = false;
    while (true) {
      SkipSpace();
      if (Consume('}')) break;
      std::string key;
      if (!ParseString(&key)) return "expected a quoted key in the header dict";
      SkipSpace();
      if (!Consume(':')) return absl::StrCat("expected ':' after key '", key, "'");
      SkipSpace();
      if (key == "descr") {
        if (have_descr) return "duplicate key 'descr'";
        have_descr = true;
        if (!ParseString(&header->descr)) {
          return "'descr' is not a string (structured dtypes are not supported)";
        }
      } else if (key == "fortran_order") {
        if (have_order) return "duplicate key 'fortran_order'";
        have_order = true;
        if (ConsumeWord("True")) {
          header->fortran_order = true;
        } else if (ConsumeWord("False")) {
          header->fortran_order = false;
        } else {
          return "'fortran_order' is not True or False";
        }
      } else if (key == "shape") {
        if (have_shape) return "duplicate key 'shape'";
        have_shape = true;
        if (auto err = ParseShape(&header->shape)) return err;
      } else {
        return absl::StrCat("unexpected key '", key, "' in the header dict");
      }
      SkipSpace();
      if (Consume(',')) continue;
      if (Consume('}')) break;
      return "expected ',' or '}' in the header dict";
    }
    SkipSpace();
    if (pos_ != text_.size()) return "trailing characters after the header dict";
    if (!have_descr || !have_order || !have_shape) {
      return "header dict lacks one of 'descr', 'fortran_order', 'shape'";
    }
    return std::nullopt;
  }

 private:
  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool ConsumeWord(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  // A '...' or "..." string without escapes (NumPy never writes any in these fields).
  bool ParseString(std::string* out) {
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) return false;
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == absl::string_view::npos) return false;
    const absl::string_view body = text_.substr(pos_, end - pos_);
    if (body.find('\\') != absl::string_view::npos) return false;
    out->assign(body.data(), body.size());
    pos_ = end + 1;
    return true;
  }
  std::optional<std::string> ParseShape(std::vector<int64_t>* shape) {
    if (!Consume('(')) return "'shape' is not a tuple";
    while (true) {
      SkipSpace();
      if (Consume(')')) return std::nullopt;
      if (pos_ >= text_.size() || text_[pos_] < '0' || text_[pos_] > '9') {
        return "'shape' holds something other than a non-negative integer";
      }
      int64_t value = 0;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        if (__builtin_mul_overflow(value, int64_t{10}, &value) ||
            __builtin_add_overflow(value, int64_t{text_[pos_] - '0'}, &value)) {
          return "a 'shape' dimension overflows int64";
        }
        ++pos_;
      }
      Consume('L');  // Python 2 longs, as old NumPy versions wrote them.
      if (shape->size() >= kMaxRank) return absl::StrCat("rank exceeds ", kMaxRank);
      shape->push_back(value);
      SkipSpace();
      if (Consume(',')) continue;
      if (Consume(')')) return std::nullopt;
      return "expected ',' or ')' in 'shape'";
    }
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

// Maps a NumPy type string to a torch dtype. Multi-byte types must be little-endian.
absl::StatusOr<at::ScalarType> DtypeFromDescr(const std::string& path, const std::string& d) {
  if (d.size() == 3 && (d[0] == '|' || d[0] == '<' || d[0] == '>' || d[0] == '=') && d[2] == '1') {
    if (d[1] == 'i') return at::kChar;
    if (d[1] == 'u') return at::kByte;
    if (d[1] == 'b') return at::kBool;
  }
  if (d == "<f8") return at::kDouble;
  if (d == "<f4") return at::kFloat;
  if (d == "<f2") return at::kHalf;
  if (d == "<i8") return at::kLong;
  if (d == "<i4") return at::kInt;
  if (d == "<i2") return at::kShort;
  if (!d.empty() && d[0] == '>') {
    return absl::UnimplementedError(
        absl::StrCat(path, ": big-endian .npy data ('", d, "') is not supported"));
  }
  return absl::UnimplementedError(absl::StrCat(path, ": unsupported .npy dtype '", d, "'"));
}

absl::StatusOr<at::Tensor> ReadNpyImpl(const std::string& path) {
  uint64_t file_size = 0;
  ASSIGN_OR_RETURN(const int raw_fd, OpenRegularFile(path, &file_size));
  Fd fd(raw_fd);

  if (file_size < 10) {
    return Invalid(path, absl::StrCat("file is ", file_size, " bytes, too short for a header"));
  }
  unsigned char prefix[12] = {};
  RETURN_IF_ERROR(ReadAt(fd.get(), path, 0, prefix, file_size < 12 ? 10 : 12));
  if (std::memcmp(prefix, kMagic, kMagicLen) != 0) return Invalid(path, "bad magic string");
  const int major = prefix[6], minor = prefix[7];
  if (minor != 0 || major < 1 || major > 3) {
    return absl::UnimplementedError(
        absl::StrCat(path, ": unsupported .npy format version ", major, ".", minor));
  }
  uint64_t header_len;
  uint64_t prefix_len;
  if (major == 1) {
    header_len = prefix[8] | (uint32_t{prefix[9]} << 8);
    prefix_len = 10;
  } else {
    if (file_size < 12) return Invalid(path, "file too short for a version 2/3 header");
    header_len = prefix[8] | (uint32_t{prefix[9]} << 8) | (uint32_t{prefix[10]} << 16) |
                 (uint32_t{prefix[11]} << 24);
    prefix_len = 12;
  }
  if (header_len > kMaxHeaderLen) {
    return Invalid(
        path, absl::StrCat("header length ", header_len, " exceeds the limit of ", kMaxHeaderLen));
  }
  if (prefix_len + header_len > file_size) {
    return Invalid(path, absl::StrCat("header length ", header_len,
                                      " runs past the end of the file (", file_size, " bytes)"));
  }
  std::string header_text(header_len, '\0');
  RETURN_IF_ERROR(ReadAt(fd.get(), path, prefix_len, header_text.data(), header_len));

  NpyHeader header;
  if (auto err = HeaderParser(header_text).Parse(&header)) return Invalid(path, *err);
  ASSIGN_OR_RETURN(const at::ScalarType dtype, DtypeFromDescr(path, header.descr));

  // numel, and the product of all non-zero dimensions: the latter bounds every stride torch
  // computes for the shape, so shapes like (0, 2**40, 2**40) are rejected too.
  int64_t numel = 1, stride_bound = 1;
  for (const int64_t dim : header.shape) {
    if (__builtin_mul_overflow(numel, dim, &numel) ||
        __builtin_mul_overflow(stride_bound, std::max<int64_t>(dim, 1), &stride_bound)) {
      return Invalid(path, "shape product overflows int64");
    }
  }
  const int64_t item_size = static_cast<int64_t>(at::elementSize(dtype));
  int64_t data_bytes;
  if (__builtin_mul_overflow(numel, item_size, &data_bytes)) {
    return Invalid(path, "data size overflows int64");
  }
  const uint64_t data_offset = prefix_len + header_len;
  if (file_size - data_offset != static_cast<uint64_t>(data_bytes)) {
    return Invalid(path, absl::StrCat("shape (", absl::StrJoin(header.shape, ", "), ") of '",
                                      header.descr, "' needs ", data_bytes,
                                      " data bytes but the file holds ", file_size - data_offset));
  }

  // Fortran order: the bytes are the C-order data of the reversed shape.
  std::vector<int64_t> stored_shape = header.shape;
  if (header.fortran_order) std::reverse(stored_shape.begin(), stored_shape.end());
  // Bools are read as bytes and normalised, since bytes other than 0/1 are not valid bools.
  const at::ScalarType stored_dtype = dtype == at::kBool ? at::kByte : dtype;
  at::Tensor tensor = at::empty(stored_shape, at::TensorOptions().dtype(stored_dtype));
  if (data_bytes > 0) {
    RETURN_IF_ERROR(
        ReadAt(fd.get(), path, data_offset, tensor.data_ptr(), static_cast<size_t>(data_bytes)));
  }
  if (dtype == at::kBool) tensor = tensor.ne(0);
  if (header.fortran_order && tensor.dim() > 1) {
    std::vector<int64_t> reversed_dims(tensor.dim());
    for (int64_t i = 0; i < tensor.dim(); ++i) reversed_dims[i] = tensor.dim() - 1 - i;
    tensor = tensor.permute(reversed_dims).contiguous();
  }
  return tensor;
}

absl::StatusOr<std::string> DescrForDtype(const std::string& path, at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble:
      return std::string("<f8");
    case at::kFloat:
      return std::string("<f4");
    case at::kHalf:
      return std::string("<f2");
    case at::kLong:
      return std::string("<i8");
    case at::kInt:
      return std::string("<i4");
    case at::kShort:
      return std::string("<i2");
    case at::kChar:
      return std::string("|i1");
    case at::kByte:
      return std::string("|u1");
    case at::kBool:
      return std::string("|b1");
    default:
      return absl::InvalidArgumentError(absl::StrCat(path, ": cannot write dtype ",
                                                     c10::toString(dtype),
                                                     " to .npy (no NumPy equivalent"
                                                     " supported here)"));
  }
}

absl::Status WriteNpyImpl(const std::string& path, const at::Tensor& tensor) {
  if (!tensor.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot write an undefined tensor"));
  }
  ASSIGN_OR_RETURN(const std::string descr, DescrForDtype(path, tensor.scalar_type()));
  const at::Tensor data = tensor.to(at::kCPU).contiguous();

  std::string shape;
  for (const int64_t dim : data.sizes()) absl::StrAppend(&shape, dim, ", ");
  if (data.dim() > 1) shape.resize(shape.size() - 2);  // (3, 4); but (3,) and ().
  if (data.dim() == 1) shape.resize(shape.size() - 1);
  std::string header =
      absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (", shape, "), }");
  // Pad with spaces and end with '\n' so that magic + version + length + header is a multiple
  // of 64 bytes, as NumPy does; version 2.0 only if the header does not fit a uint16.
  const size_t base = header.size() + 1;
  const bool v2 = base + 64 > 0xFFFF;
  const size_t prefix_len = v2 ? 12 : 10;
  header.append((64 - (prefix_len + base) % 64) % 64, ' ');
  header.push_back('\n');
  std::string prefix(kMagic, kMagicLen);
  prefix.push_back(static_cast<char>(v2 ? 2 : 1));
  prefix.push_back(0);
  const uint32_t len = static_cast<uint32_t>(header.size());
  for (size_t i = 0; i < prefix_len - 8; ++i) prefix.push_back(static_cast<char>(len >> (8 * i)));

  // Written as `path.partial`, fsynced, then renamed: `path` is never seen truncated.
  const std::string partial = path + ".partial";
  FILE* file = std::fopen(partial.c_str(), "wb");
  if (file == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open for writing"));
  }
  const size_t nbytes = data.numel() * data.element_size();
  errno = 0;
  bool ok = std::fwrite(prefix.data(), 1, prefix.size(), file) == prefix.size() &&
            std::fwrite(header.data(), 1, header.size(), file) == header.size() &&
            (nbytes == 0 || std::fwrite(data.data_ptr(), 1, nbytes, file) == nbytes);
  return FinishPartialFile(file, partial, path, ok);
}

}  // namespace

absl::StatusOr<at::Tensor> ReadNpy(const std::string& path) {
  try {
    return ReadNpyImpl(path);
  } catch (const std::exception& e) {  // c10::Error derives from std::exception.
    return absl::InternalError(absl::StrCat(path, ": reading .npy failed: ", e.what()));
  }
}

absl::Status WriteNpy(const std::string& path, const at::Tensor& tensor) {
  try {
    return WriteNpyImpl(path, tensor);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(path, ": writing .npy failed: ", e.what()));
  }
}

}  // namespace lgpt
