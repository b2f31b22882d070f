#include "core/io/torch_pickle_writer.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/base/output_dir.h"
#include "core/io/crc32.h"
#include "core/io/safetensors.h"

namespace lgpt {
namespace {

constexpr uint64_t kAlignment = 64;  // PyTorch's kFieldAlignment.
constexpr uint64_t kMax32 = 0xFFFFFFFF;
constexpr uint64_t kMax16 = 0xFFFF;
constexpr char kArchive[] = "archive/";

void PutLe(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

// ---------------------------------------------------------------------------------------
// A zip archive of stored records, written front to back.

class ZipWriter {
 public:
  explicit ZipWriter(std::FILE* file) : file_(file) {}

  // Appends a stored record whose data starts on a kAlignment boundary.
  bool AddRecord(const std::string& name, const void* data, uint64_t size) {
    const uint8_t* bytes = static_cast<const uint8_t*>(data);
    Entry entry{name, Crc32(bytes, size), size, offset_};
    const bool zip64 = size >= kMax32;
    std::string header;
    PutLe(header, 0x04034b50, 4);
    PutLe(header, zip64 ? 45 : 20, 2);  // Version needed to extract.
    PutLe(header, 0, 2);                // Flags.
    PutLe(header, 0, 2);                // Method: stored.
    PutLe(header, 0, 2);                // Time.
    PutLe(header, 0x21, 2);             // Date: 1980-01-01.
    PutLe(header, entry.crc, 4);
    PutLe(header, zip64 ? kMax32 : size, 4);  // Compressed size.
    PutLe(header, zip64 ? kMax32 : size, 4);  // Uncompressed size.
    std::string extra;
    if (zip64) {
      PutLe(extra, 0x0001, 2);
      PutLe(extra, 16, 2);
      PutLe(extra, size, 8);
      PutLe(extra, size, 8);
    }
    // PyTorch's padding: an "FB" extra field of 'Z's that ends where the data is aligned.
    const uint64_t start = offset_ + 30 + name.size() + extra.size() + 4;
    const uint64_t padding = (kAlignment - start % kAlignment) % kAlignment;
    extra += "FB";
    PutLe(extra, padding, 2);
    extra.append(padding, 'Z');
    PutLe(header, name.size(), 2);
    PutLe(header, extra.size(), 2);
    header += name;
    header += extra;
    if (!Write(header.data(), header.size()) || !Write(bytes, size)) return false;
    entries_.push_back(std::move(entry));
    return true;
  }

  // Writes the central directory and its end records.
  bool Finish() {
    const uint64_t cd_offset = offset_;
    std::string cd;
    for (const Entry& e : entries_) {
      std::string extra;
      if (e.size >= kMax32) {
        PutLe(extra, e.size, 8);  // Uncompressed.
        PutLe(extra, e.size, 8);  // Compressed.
      }
      if (e.local_offset >= kMax32) PutLe(extra, e.local_offset, 8);
      if (!extra.empty()) {
        std::string field;
        PutLe(field, 0x0001, 2);
        PutLe(field, extra.size(), 2);
        extra = field + extra;
      }
      const bool zip64 = !extra.empty();
      PutLe(cd, 0x02014b50, 4);
      PutLe(cd, zip64 ? 45 : 20, 2);  // Version made by.
      PutLe(cd, zip64 ? 45 : 20, 2);  // Version needed.
      PutLe(cd, 0, 2);                // Flags.
      PutLe(cd, 0, 2);                // Method.
      PutLe(cd, 0, 2);                // Time.
      PutLe(cd, 0x21, 2);             // Date.
      PutLe(cd, e.crc, 4);
      PutLe(cd, e.size >= kMax32 ? kMax32 : e.size, 4);
      PutLe(cd, e.size >= kMax32 ? kMax32 : e.size, 4);
      PutLe(cd, e.name.size(), 2);
      PutLe(cd, extra.size(), 2);
      PutLe(cd, 0, 2);  // Comment length.
      PutLe(cd, 0, 2);  // Disk.
      PutLe(cd, 0, 2);  // Internal attributes.
      PutLe(cd, 0, 4);  // External attributes.
      PutLe(cd, e.local_offset >= kMax32 ? kMax32 : e.local_offset, 4);
      cd += e.name;
      cd += extra;
    }
    const uint64_t cd_size = cd.size();
    const uint64_t n = entries_.size();
    std::string end;
    if (n >= kMax16 || cd_size >= kMax32 || cd_offset >= kMax32) {
      const uint64_t z64 = cd_offset + cd_size;
      PutLe(end, 0x06064b50, 4);
      PutLe(end, 44, 8);  // Size of the rest of this record.
      PutLe(end, 45, 2);
      PutLe(end, 45, 2);
      PutLe(end, 0, 4);
      PutLe(end, 0, 4);
      PutLe(end, n, 8);
      PutLe(end, n, 8);
      PutLe(end, cd_size, 8);
      PutLe(end, cd_offset, 8);
      PutLe(end, 0x07064b50, 4);  // Locator.
      PutLe(end, 0, 4);
      PutLe(end, z64, 8);
      PutLe(end, 1, 4);
    }
    PutLe(end, 0x06054b50, 4);
    PutLe(end, 0, 2);
    PutLe(end, 0, 2);
    PutLe(end, n >= kMax16 ? kMax16 : n, 2);
    PutLe(end, n >= kMax16 ? kMax16 : n, 2);
    PutLe(end, cd_size >= kMax32 ? kMax32 : cd_size, 4);
    PutLe(end, cd_offset >= kMax32 ? kMax32 : cd_offset, 4);
    PutLe(end, 0, 2);  // Comment length.
    return Write(cd.data(), cd.size()) && Write(end.data(), end.size());
  }

 private:
  struct Entry {
    std::string name;
    uint32_t crc;
    uint64_t size;
    uint64_t local_offset;
  };

  bool Write(const void* data, uint64_t size) {
    if (size > 0 && std::fwrite(data, 1, size, file_) != size) return false;
    offset_ += size;
    return true;
  }

  std::FILE* file_;
  uint64_t offset_ = 0;
  std::vector<Entry> entries_;
};

// ---------------------------------------------------------------------------------------
// The pickle (protocol 2, the subset torch.save emits for a state dict).

class Pickler {
 public:
  Pickler() { out_ += "\x80\x02"; }

  // Globals and the strings every tensor repeats are memoised, as Python's pickler does:
  // the first use is stored (BINPUT), later ones fetch it (BINGET), so the unpickler builds
  // each once.
  void Global(absl::string_view module, absl::string_view name) {
    const std::string key = absl::StrCat("c", module, "\n", name, "\n");
    if (Get(key)) return;
    out_ += key;
    Put(key);
  }
  void MemoStr(absl::string_view s) {
    const std::string key = absl::StrCat("X", s);
    if (Get(key)) return;
    Str(s);
    Put(key);
  }
  void Mark() { out_ += '('; }
  void EmptyTuple() { out_ += ')'; }
  void Reduce() { out_ += 'R'; }
  void SetItems() { out_ += 'u'; }
  void BinPersId() { out_ += 'Q'; }
  void False() { out_ += '\x89'; }
  void Stop() { out_ += '.'; }
  void Str(absl::string_view s) {
    out_ += 'X';
    PutLe(out_, s.size(), 4);
    out_.append(s.data(), s.size());
  }
  void Int(int64_t v) {
    if (v >= 0 && v < 256) {
      out_ += 'K';
      PutLe(out_, v, 1);
    } else if (v >= 0 && v < 65536) {
      out_ += 'M';
      PutLe(out_, v, 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';
      PutLe(out_, static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
    } else {  // LONG1: minimal little-endian two's complement.
      std::string bytes;
      int64_t rest = v;
      while (true) {
        const uint8_t byte = static_cast<uint8_t>(rest & 0xFF);
        bytes.push_back(static_cast<char>(byte));
        rest >>= 8;  // Arithmetic shift.
        if ((rest == 0 && !(byte & 0x80)) || (rest == -1 && (byte & 0x80))) break;
      }
      out_ += '\x8a';
      PutLe(out_, bytes.size(), 1);
      out_ += bytes;
    }
  }
  // A tuple of the ints in `values`.
  void IntTuple(at::IntArrayRef values) {
    if (values.empty()) return EmptyTuple();
    if (values.size() > 3) Mark();
    for (int64_t v : values) Int(v);
    static const char kTupleN[] = {'\x85', '\x86', '\x87'};
    out_ += values.size() > 3 ? 't' : kTupleN[values.size() - 1];
  }
  void Tuple() { out_ += 't'; }

  const std::string& bytes() const { return out_; }

 private:
  bool Get(const std::string& key) {
    const auto it = memo_.find(key);
    if (it == memo_.end()) return false;
    if (it->second < 256) {
      out_ += 'h';
      PutLe(out_, it->second, 1);
    } else {
      out_ += 'j';
      PutLe(out_, it->second, 4);
    }
    return true;
  }
  void Put(const std::string& key) {
    const uint32_t index = static_cast<uint32_t>(memo_.size());
    memo_.emplace(key, index);
    if (index < 256) {
      out_ += 'q';
      PutLe(out_, index, 1);
    } else {
      out_ += 'r';
      PutLe(out_, index, 4);
    }
  }

  std::string out_;
  std::map<std::string, uint32_t> memo_;
};

// torch.<name>Storage for the dtypes torch.save writes this way; nullptr for others.
const char* StorageName(c10::ScalarType type) {
  switch (type) {
    case c10::kDouble:
      return "DoubleStorage";
    case c10::kFloat:
      return "FloatStorage";
    case c10::kHalf:
      return "HalfStorage";
    case c10::kBFloat16:
      return "BFloat16Storage";
    case c10::kLong:
      return "LongStorage";
    case c10::kInt:
      return "IntStorage";
    case c10::kShort:
      return "ShortStorage";
    case c10::kChar:
      return "CharStorage";
    case c10::kByte:
      return "ByteStorage";
    case c10::kBool:
      return "BoolStorage";
    default:
      return nullptr;
  }
}

// Contiguous strides of `sizes`.
std::vector<int64_t> ContiguousStrides(at::IntArrayRef sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t stride = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(sizes[i], 1);
  }
  return strides;
}

std::string BuildPickle(const TensorMap& tensors) {
  Pickler p;
  p.Global("collections", "OrderedDict");
  p.EmptyTuple();
  p.Reduce();
  int64_t key = 0;
  int64_t batch = 0;
  for (const auto& [name, tensor] : tensors) {
    if (batch == 0) p.Mark();
    p.Str(name);
    // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, hooks)
    p.Global("torch._utils", "_rebuild_tensor_v2");
    p.Mark();
    p.Mark();  // The persistent id ('storage', type, key, location, numel).
    p.MemoStr("storage");
    p.Global("torch", StorageName(tensor.scalar_type()));
    p.Str(absl::StrCat(key++));
    p.MemoStr("cpu");
    p.Int(tensor.numel());
    p.Tuple();
    p.BinPersId();
    p.Int(0);
    p.IntTuple(tensor.sizes());
    p.IntTuple(ContiguousStrides(tensor.sizes()));
    p.False();
    p.Global("collections", "OrderedDict");
    p.EmptyTuple();
    p.Reduce();
    p.Tuple();
    p.Reduce();
    if (++batch == 1000) {  // Python's pickler batches SETITEMS by 1000 too.
      p.SetItems();
      batch = 0;
    }
  }
  if (batch > 0) p.SetItems();
  p.Stop();
  return p.bytes();
}

absl::Status WriteImpl(const std::string& path, const TensorMap& tensors) {
  for (const auto& [name, tensor] : tensors) {
    if (!IsValidUtf8(name)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": a tensor name is not valid UTF-8"));
    }
    if (!tensor.defined()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "' is undefined"));
    }
    if (StorageName(tensor.scalar_type()) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "' has dtype ",
                                                     c10::toString(tensor.scalar_type()),
                                                     ", which this writer does not handle"));
    }
  }
  const std::string pickle = BuildPickle(tensors);

  // Written under another name and renamed into place, so a reader that has the old file
  // mapped keeps seeing it whole, and `path` never holds a partial checkpoint.
  const std::string partial = path + ".partial";
  std::FILE* file = std::fopen(partial.c_str(), "wb");
  if (file == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open for writing"));
  }
  std::vector<char> buffer(1 << 20);
  std::setvbuf(file, buffer.data(), _IOFBF, buffer.size());
  errno = 0;
  ZipWriter zip(file);
  const std::string prefix = kArchive;
  bool ok = zip.AddRecord(prefix + "data.pkl", pickle.data(), pickle.size()) &&
            zip.AddRecord(prefix + "byteorder", "little", 6);
  int64_t key = 0;
  std::string copy_error;
  for (auto it = tensors.begin(); ok && it != tensors.end(); ++it) {
    try {
      // [numel] contiguous CPU data; no copy when it already is.
      const at::Tensor data = it->second.to(at::kCPU).contiguous();
      ok = zip.AddRecord(absl::StrCat(prefix, "data/", key++), data.data_ptr(),
                         static_cast<uint64_t>(data.numel()) * data.element_size());
    } catch (const std::exception& e) {
      copy_error = absl::StrCat("tensor '", it->first, "' cannot be copied to the CPU: ", e.what());
      ok = false;
    }
  }
  ok = ok && zip.AddRecord(prefix + "version", "3\n", 2) && zip.Finish();
  absl::Status finished = FinishPartialFile(file, partial, path, ok);
  if (!finished.ok() && !copy_error.empty()) {
    return absl::InternalError(absl::StrCat(path, ": ", copy_error));
  }
  return finished;
}

}  // namespace

absl::Status WriteTorchStateDict(const std::string& path, const TensorMap& tensors) {
  try {
    return WriteImpl(path, tensors);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(path, ": writing the checkpoint failed: ", e.what()));
  }
}

}  // namespace lgpt
