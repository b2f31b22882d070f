#include "core/io/safetensors.h"

#include <ATen/ATen.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/base/output_dir.h"
#include "core/base/status_macros.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the safetensors reader and writer assume a little-endian host");

namespace lgpt {
namespace {

using json = nlohmann::json;

// The reference implementation's limit; real headers are far smaller (about 150 bytes per
// tensor).
constexpr uint64_t kMaxHeaderLen = 100'000'000;
constexpr size_t kMaxRank = 64;
constexpr char kMetadataKey[] = "__metadata__";

absl::Status Invalid(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": invalid safetensors file: ", what));
}

struct DtypeInfo {
  const char* name;
  at::ScalarType type;
};

constexpr DtypeInfo kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16},
    {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
    {"U8", at::kByte},    {"BOOL", at::kBool},
};

// Dtypes the format defines that this reader does not load.
constexpr const char* kUnsupportedDtypes[] = {"U16",     "U32",     "U64",     "F8_E4M3", "F8_E5M2",
                                              "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",      "C64"};

const DtypeInfo* FindDtype(absl::string_view name) {
  for (const DtypeInfo& info : kDtypes) {
    if (name == info.name) return &info;
  }
  return nullptr;
}

const char* DtypeName(at::ScalarType type) {
  for (const DtypeInfo& info : kDtypes) {
    if (type == info.type) return info.name;
  }
  return nullptr;
}

// Streaming (SAX) handler that checks the header against the schema as it is parsed:
//   {"<name>": {"dtype": str, "shape": [uint...], "data_offsets": [uint, uint]}, ...,
//    "__metadata__": {str: str, ...}}
// Nothing but the entries themselves is stored, so memory stays proportional to the header,
// and duplicate keys, which a DOM parser would silently merge, are caught.
class HeaderSax {
 public:
  explicit HeaderSax(SafetensorsHeader* header) : header_(header) {}

  const std::string& error() const { return error_; }

  bool null() { return Unexpected("null"); }
  bool boolean(bool) { return Unexpected("a boolean"); }
  bool number_integer(json::number_integer_t value) {
    if (where_ == kShape || where_ == kOffsets) {
      return Fail(absl::StrCat(EntryContext(), "negative number ", value, " in '",
                               where_ == kShape ? "shape" : "data_offsets", "'"));
    }
    return Unexpected("a number");
  }
  bool number_unsigned(json::number_unsigned_t value) {
    if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Fail(absl::StrCat(EntryContext(), "number ", value, " exceeds int64"));
    }
    if (where_ == kShape) {
      if (entry_.shape.size() >= kMaxRank) {
        return Fail(absl::StrCat(EntryContext(), "rank exceeds ", kMaxRank));
      }
      entry_.shape.push_back(static_cast<int64_t>(value));
      return true;
    }
    if (where_ == kOffsets) {
      if (num_offsets_ >= 2) return Fail(absl::StrCat(EntryContext(), "more than 2 data_offsets"));
      (num_offsets_++ == 0 ? entry_.begin : entry_.end) = value;
      return true;
    }
    return Unexpected("a number");
  }
  bool number_float(json::number_float_t, const json::string_t& text) {
    return Unexpected(absl::StrCat("the non-integer number ", text));
  }
  bool string(json::string_t& value) {
    if (where_ == kEntry && field_ == kDtype) {
      entry_.dtype = std::move(value);
      return true;
    }
    if (where_ == kMetadata) {
      header_->metadata[metadata_key_] = std::move(value);
      return true;
    }
    return Unexpected("a string");
  }
  bool binary(json::binary_t&) { return Unexpected("binary data"); }

  bool start_object(std::size_t) {
    switch (where_) {
      case kStart:
        where_ = kTop;
        return true;
      case kTop:
        if (entry_.name == kMetadataKey) {
          where_ = kMetadata;
        } else {
          where_ = kEntry;
          seen_dtype_ = seen_shape_ = seen_offsets_ = false;
          field_ = kNone;
        }
        return true;
      default:
        return Unexpected("an object");
    }
  }
  bool key(json::string_t& key) {
    switch (where_) {
      case kTop:
        if (!IsValidUtf8(key)) return Fail("a tensor name is not valid UTF-8");
        if (!names_.insert(key).second) {
          return Fail(absl::StrCat("duplicate key '", key, "' in the header"));
        }
        entry_ = SafetensorsEntry();
        entry_.name = std::move(key);
        return true;
      case kEntry: {
        bool* seen;
        if (key == "dtype") {
          field_ = kDtype;
          seen = &seen_dtype_;
        } else if (key == "shape") {
          field_ = kShapeField;
          seen = &seen_shape_;
        } else if (key == "data_offsets") {
          field_ = kOffsetsField;
          seen = &seen_offsets_;
        } else {
          return Fail(absl::StrCat(EntryContext(), "unknown field '", key, "'"));
        }
        if (*seen) return Fail(absl::StrCat(EntryContext(), "duplicate field '", key, "'"));
        *seen = true;
        return true;
      }
      case kMetadata:
        if (header_->metadata.count(key) != 0) {
          return Fail(absl::StrCat("duplicate key '", key, "' in __metadata__"));
        }
        metadata_key_ = std::move(key);
        return true;
      default:
        return Unexpected("a key");
    }
  }
  bool end_object() {
    switch (where_) {
      case kEntry:
        if (!seen_dtype_ || !seen_shape_ || !seen_offsets_) {
          return Fail(absl::StrCat(EntryContext(), "lacks one of dtype, shape, data_offsets"));
        }
        header_->tensors.push_back(std::move(entry_));
        entry_ = SafetensorsEntry();
        where_ = kTop;
        return true;
      case kMetadata:
        entry_ = SafetensorsEntry();
        where_ = kTop;
        return true;
      case kTop:
        where_ = kDone;
        return true;
      default:
        return Unexpected("the end of an object");
    }
  }
  bool start_array(std::size_t) {
    if (where_ == kEntry && field_ == kShapeField) {
      where_ = kShape;
      return true;
    }
    if (where_ == kEntry && field_ == kOffsetsField) {
      where_ = kOffsets;
      num_offsets_ = 0;
      return true;
    }
    return Unexpected("an array");
  }
  bool end_array() {
    if (where_ == kShape) {
      where_ = kEntry;
      return true;
    }
    if (where_ == kOffsets) {
      if (num_offsets_ != 2) return Fail(absl::StrCat(EntryContext(), "needs 2 data_offsets"));
      where_ = kEntry;
      return true;
    }
    return Unexpected("the end of an array");
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    return Fail(absl::StrCat("header is not valid JSON (byte ", position, "): ", e.what()));
  }

 private:
  enum Where { kStart, kTop, kEntry, kShape, kOffsets, kMetadata, kDone };
  enum Field { kNone, kDtype, kShapeField, kOffsetsField };

  std::string EntryContext() const { return absl::StrCat("tensor '", entry_.name, "': "); }

  bool Unexpected(absl::string_view what) {
    switch (where_) {
      case kStart:
        return Fail("header is not a JSON object");
      case kTop:
        return Fail(absl::StrCat("value of '", entry_.name, "' is not an object"));
      case kMetadata:
        return Fail(absl::StrCat("__metadata__ value of '", metadata_key_, "' is ", what,
                                 ", not a string"));
      default:
        return Fail(absl::StrCat(EntryContext(), "unexpected ", what));
    }
  }
  bool Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }

  SafetensorsHeader* header_;
  Where where_ = kStart;
  Field field_ = kNone;
  SafetensorsEntry entry_;
  bool seen_dtype_ = false, seen_shape_ = false, seen_offsets_ = false;
  int num_offsets_ = 0;
  std::string metadata_key_;
  std::set<std::string> names_;
  std::string error_;
};

// Parses and validates the header found in `file` (which is at least 8 bytes).
absl::StatusOr<SafetensorsHeader> ParseHeader(const MappedFile& file) {
  const std::string& path = file.path();
  if (file.size() < 8) {
    return Invalid(path, absl::StrCat("file is ", file.size(),
                                      " bytes, too short for the 8-byte header length"));
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, file.data(), 8);
  if (header_len > kMaxHeaderLen) {
    return Invalid(
        path, absl::StrCat("header length ", header_len, " exceeds the limit of ", kMaxHeaderLen));
  }
  if (header_len > file.size() - 8) {
    return Invalid(path, absl::StrCat("header length ", header_len, " runs past the end of the ",
                                      file.size(), "-byte file"));
  }
  SafetensorsHeader header;
  header.data_offset = 8 + header_len;
  const uint64_t data_size = file.size() - header.data_offset;

  HeaderSax sax(&header);
  const char* text = reinterpret_cast<const char*>(file.data()) + 8;
  const bool parsed = json::sax_parse(text, text + header_len, &sax);
  if (!parsed || !sax.error().empty()) {
    return Invalid(path, sax.error().empty() ? "header is not valid JSON" : sax.error());
  }

  std::vector<std::pair<uint64_t, const SafetensorsEntry*>> ranges;
  for (const SafetensorsEntry& entry : header.tensors) {
    const std::string context = absl::StrCat("tensor '", entry.name, "': ");
    const DtypeInfo* dtype = FindDtype(entry.dtype);
    if (dtype == nullptr) {
      for (const char* name : kUnsupportedDtypes) {
        if (entry.dtype == name) {
          return absl::UnimplementedError(
              absl::StrCat(path, ": ", context, "dtype ", entry.dtype, " is not supported"));
        }
      }
      return Invalid(path, absl::StrCat(context, "unknown dtype '", entry.dtype, "'"));
    }
    // numel, and the product of the non-zero dimensions, which bounds every stride.
    int64_t numel = 1, stride_bound = 1, nbytes = 0;
    for (const int64_t dim : entry.shape) {
      if (__builtin_mul_overflow(numel, dim, &numel) ||
          __builtin_mul_overflow(stride_bound, std::max<int64_t>(dim, 1), &stride_bound)) {
        return Invalid(path, absl::StrCat(context, "shape product overflows int64"));
      }
    }
    if (__builtin_mul_overflow(numel, static_cast<int64_t>(at::elementSize(dtype->type)),
                               &nbytes)) {
      return Invalid(path, absl::StrCat(context, "byte size overflows int64"));
    }
    if (entry.begin > entry.end || entry.end > data_size) {
      return Invalid(path, absl::StrCat(context, "data_offsets [", entry.begin, ", ", entry.end,
                                        "] are not within the ", data_size, "-byte data section"));
    }
    if (entry.end - entry.begin != static_cast<uint64_t>(nbytes)) {
      return Invalid(path, absl::StrCat(context, "data_offsets [", entry.begin, ", ", entry.end,
                                        "] span ", entry.end - entry.begin, " bytes but ",
                                        entry.dtype, " of this shape needs ", nbytes));
    }
    if (nbytes > 0) ranges.emplace_back(entry.begin, &entry);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    const SafetensorsEntry& prev = *ranges[i - 1].second;
    const SafetensorsEntry& cur = *ranges[i].second;
    if (cur.begin < prev.end) {
      return Invalid(
          path, absl::StrCat("data of tensors '", prev.name, "' and '", cur.name, "' overlap"));
    }
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.name < b.name; });
  return header;
}

absl::StatusOr<TensorMap> ReadSafetensorsImpl(const std::string& path) {
  ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> file, MappedFile::Open(path));
  ASSIGN_OR_RETURN(SafetensorsHeader header, ParseHeader(*file));
  TensorMap tensors;
  for (const SafetensorsEntry& entry : header.tensors) {
    const at::ScalarType dtype = FindDtype(entry.dtype)->type;
    const auto options = at::TensorOptions().dtype(dtype);
    uint8_t* data = file->data() + header.data_offset + entry.begin;
    const size_t nbytes = entry.end - entry.begin;
    at::Tensor tensor;
    if (nbytes == 0) {
      tensor = at::empty(entry.shape, options);
    } else if (dtype == at::kBool) {
      tensor = at::from_blob(data, entry.shape, at::TensorOptions().dtype(at::kByte)).ne(0);
    } else if (reinterpret_cast<uintptr_t>(data) % at::elementSize(dtype) != 0) {
      // Kernels may assume naturally aligned elements: give this tensor aligned memory.
      tensor = at::empty(entry.shape, options);
      std::memcpy(tensor.data_ptr(), data, nbytes);
    } else {
      tensor = at::from_blob(
          data, entry.shape, [file, nbytes](void* p) { file->Release(p, nbytes); }, options);
    }
    tensors.emplace(entry.name, std::move(tensor));
  }
  return tensors;
}

// The order tensors are laid out in: decreasing element size keeps each one aligned.
bool DataOrder(const std::pair<const std::string, at::Tensor>* a,
               const std::pair<const std::string, at::Tensor>* b) {
  const size_t sa = a->second.element_size(), sb = b->second.element_size();
  if (sa != sb) return sa > sb;
  return a->first < b->first;
}

absl::Status WriteSafetensorsImpl(const std::string& path, const TensorMap& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  std::vector<const std::pair<const std::string, at::Tensor>*> order;
  for (const auto& item : tensors) {
    const std::string& name = item.first;
    const at::Tensor& tensor = item.second;
    if (!IsValidUtf8(name)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": a tensor name is not valid UTF-8"));
    }
    if (name == kMetadataKey) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": '", kMetadataKey, "' cannot name a tensor"));
    }
    if (!tensor.defined()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "' is undefined"));
    }
    if (DtypeName(tensor.scalar_type()) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "' has dtype ",
                                                     c10::toString(tensor.scalar_type()),
                                                     ", which safetensors cannot hold here"));
    }
    order.push_back(&item);
  }
  for (const auto& [key, value] : metadata) {
    if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": metadata is not valid UTF-8"));
    }
  }
  std::sort(order.begin(), order.end(), DataOrder);

  json header = json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const auto* item : order) {
    const at::Tensor& tensor = item->second;
    const uint64_t nbytes = tensor.numel() * tensor.element_size();
    header[item->first] = {{"dtype", DtypeName(tensor.scalar_type())},
                           {"shape", tensor.sizes().vec()},
                           {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_len = text.size();

  // Written under another name and renamed into place: a model whose parameters are mapped
  // from `path` (LoadCheckpoint adopts mapped storage) must never see the file truncated.
  const std::string partial = path + ".partial";
  FILE* file = std::fopen(partial.c_str(), "wb");
  if (file == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat(partial, ": cannot open for writing"));
  }
  errno = 0;
  bool ok = std::fwrite(&header_len, 8, 1, file) == 1 &&
            std::fwrite(text.data(), 1, text.size(), file) == text.size();
  for (size_t i = 0; ok && i < order.size(); ++i) {
    const at::Tensor data = order[i]->second.to(at::kCPU).contiguous();
    const size_t nbytes = data.numel() * data.element_size();
    ok = nbytes == 0 || std::fwrite(data.data_ptr(), 1, nbytes, file) == nbytes;
  }
  return FinishPartialFile(file, partial, path, ok);
}

}  // namespace

absl::StatusOr<std::shared_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  // O_NONBLOCK keeps a FIFO from blocking the open; it does not affect regular files.
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
  const size_t size = static_cast<size_t>(st.st_size);
  uint8_t* data = nullptr;
  if (size > 0) {
    // Private and writable: copy-on-write, so in-place tensor ops cannot fault or reach the
    // file. MAP_NORESERVE: the pages are backed by the file until written.
    void* mapped = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd, 0);
    if (mapped == MAP_FAILED) {
      const int err = errno;
      close(fd);
      return absl::ErrnoToStatus(err, absl::StrCat(path, ": mmap failed"));
    }
    data = static_cast<uint8_t*>(mapped);
  }
  close(fd);  // The mapping keeps its own reference to the file.
  return std::shared_ptr<MappedFile>(new MappedFile(path, data, size));
}

void MappedFile::Release(const void* begin, size_t bytes) const {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(begin);
  const uintptr_t first = (start + page - 1) / page * page;  // whole pages only
  const uintptr_t last = (start + bytes) / page * page;
  const uintptr_t mapped = reinterpret_cast<uintptr_t>(data_);
  if (data_ == nullptr || first >= last || first < mapped || last > mapped + size_) return;
  madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) munmap(data_, size_);
}

bool IsValidUtf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    const unsigned char c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    int extra;
    uint32_t code;
    uint32_t min;
    if ((c & 0xE0) == 0xC0) {
      extra = 1, code = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2, code = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3, code = c & 0x07, min = 0x10000;
    } else {
      return false;
    }
    if (end - p <= extra) return false;
    for (int i = 1; i <= extra; ++i) {
      if ((p[i] & 0xC0) != 0x80) return false;
      code = (code << 6) | (p[i] & 0x3F);
    }
    if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return false;
    p += extra + 1;
  }
  return true;
}

absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path) {
  try {
    ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> file, MappedFile::Open(path));
    return ParseHeader(*file);
  } catch (const std::exception& e) {  // c10::Error derives from std::exception.
    return absl::InternalError(absl::StrCat(path, ": reading safetensors failed: ", e.what()));
  }
}

absl::StatusOr<TensorMap> ReadSafetensors(const std::string& path) {
  try {
    return ReadSafetensorsImpl(path);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(path, ": reading safetensors failed: ", e.what()));
  }
}

absl::Status WriteSafetensors(const std::string& path, const TensorMap& tensors,
                              const std::map<std::string, std::string>& metadata) {
  try {
    return WriteSafetensorsImpl(path, tensors, metadata);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(path, ": writing safetensors failed: ", e.what()));
  }
}

}  // namespace lgpt
