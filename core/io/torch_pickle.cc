#include "core/io/torch_pickle.h"

#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>  // at::get_num_threads

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "core/base/row_pool.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "core/io/crc32.h"
#include "core/io/safetensors.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the checkpoint reader assumes a little-endian host");

namespace lgpt {
namespace {

// Bounds on what a hostile file can make the reader allocate or do. A real state dict needs
// about 12 pickle objects and 150 bytes of data.pkl per tensor.
constexpr uint64_t kMaxPickleBytes = 64 << 20;
constexpr size_t kMaxObjects = 1 << 20;
constexpr size_t kMaxMemo = 1 << 20;
constexpr size_t kMaxStack = 1 << 20;
constexpr size_t kMaxMarks = 1000;
constexpr size_t kMaxRank = 64;
constexpr size_t kMaxGlobalLine = 256;

absl::Status Invalid(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

uint64_t Le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// ---------------------------------------------------------------------------------------
// Zip: just enough to find stored records, zip64 included. Offsets come from the central
// directory, sizes are checked against the file before anything is read.

struct ZipEntry {
  uint64_t data_offset = 0;
  uint64_t size = 0;
  uint32_t crc = 0;  // As the central directory stores it.
  uint16_t method = 0;
  uint16_t flags = 0;
};

class ZipArchive {
 public:
  // `file` must outlive the archive.
  static absl::StatusOr<ZipArchive> Parse(const MappedFile& file);

  // The bytes of record `<archive>/<name>`: InvalidArgument when absent, Unimplemented when
  // compressed or encrypted.
  absl::StatusOr<absl::string_view> Record(const std::string& name) const;
  bool Has(const std::string& name) const { return entries_.count(prefix_ + name) != 0; }
  std::string FullName(const std::string& name) const { return prefix_ + name; }
  // The CRC-32 stored for record `<archive>/<name>`, which must exist.
  uint32_t StoredCrc(const std::string& name) const { return entries_.at(prefix_ + name).crc; }
  // False when every stored CRC-32 is 0: the writer computed none (PyTorch does so after
  // torch.serialization.set_crc32_options(False)), so there is nothing to verify.
  bool HasChecksums() const { return has_checksums_; }

 private:
  explicit ZipArchive(const MappedFile* file) : file_(file) {}

  const MappedFile* file_;
  std::string prefix_;  // "<archive>/"
  std::map<std::string, ZipEntry> entries_;
  bool has_checksums_ = false;
};

absl::StatusOr<ZipArchive> ZipArchive::Parse(const MappedFile& file) {
  const std::string& path = file.path();
  const uint8_t* data = file.data();
  const uint64_t size = file.size();
  auto bad = [&](absl::string_view what) {
    return Invalid(path, absl::StrCat("not a valid torch.save zip archive: ", what));
  };
  if (size >= 2 && data[0] == 0x80 && data[1] <= 5) {
    return absl::UnimplementedError(
        absl::StrCat(path,
                     ": legacy (non-zip) torch.save format, as written by PyTorch < 1.6 or with "
                     "_use_new_zipfile_serialization=False; re-save it with a newer PyTorch"));
  }
  if (size < 22) return bad(absl::StrCat("file is only ", size, " bytes"));

  // End of central directory record: the last one whose comment reaches the end exactly.
  uint64_t eocd = 0;
  bool found = false;
  const uint64_t lowest = size - 22 > 0xFFFF ? size - 22 - 0xFFFF : 0;
  for (uint64_t pos = size - 22 + 1; pos-- > lowest;) {
    if (Le(data + pos, 4) == 0x06054b50 && pos + 22 + Le(data + pos + 20, 2) == size) {
      eocd = pos;
      found = true;
      break;
    }
  }
  if (!found) return bad("no end-of-central-directory record");
  uint64_t num_entries = Le(data + eocd + 10, 2);
  uint64_t cd_size = Le(data + eocd + 12, 4);
  uint64_t cd_offset = Le(data + eocd + 16, 4);
  const uint64_t disk = Le(data + eocd + 4, 2), cd_disk = Le(data + eocd + 6, 2);
  if ((disk != 0 && disk != 0xFFFF) || (cd_disk != 0 && cd_disk != 0xFFFF)) {
    return bad("multi-disk archives are not supported");
  }
  // Zip64: a locator right before the record points at the zip64 end record.
  if (eocd >= 20 && Le(data + eocd - 20, 4) == 0x07064b50) {
    const uint64_t z64 = Le(data + eocd - 20 + 8, 8);
    if (z64 > eocd - 20 || eocd - 20 - z64 < 56 || Le(data + z64, 4) != 0x06064b50) {
      return bad("bad zip64 end-of-central-directory record");
    }
    num_entries = Le(data + z64 + 32, 8);
    cd_size = Le(data + z64 + 40, 8);
    cd_offset = Le(data + z64 + 48, 8);
  } else if (num_entries == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) {
    return bad("zip64 fields without a zip64 end-of-central-directory record");
  }
  if (cd_offset > eocd || cd_size > eocd - cd_offset) {
    return bad("central directory lies outside the file");
  }
  if (num_entries == 0) return bad("archive holds no records");
  if (num_entries > cd_size / 46 || num_entries > kMaxObjects) {
    return bad(
        absl::StrCat(num_entries, " entries cannot fit the ", cd_size, "-byte central directory"));
  }

  ZipArchive archive(&file);
  uint64_t p = cd_offset;
  const uint64_t cd_end = cd_offset + cd_size;
  for (uint64_t i = 0; i < num_entries; ++i) {
    if (cd_end - p < 46 || Le(data + p, 4) != 0x02014b50) {
      return bad(absl::StrCat("central directory entry ", i, " is malformed"));
    }
    ZipEntry entry;
    entry.flags = static_cast<uint16_t>(Le(data + p + 8, 2));
    entry.method = static_cast<uint16_t>(Le(data + p + 10, 2));
    entry.crc = static_cast<uint32_t>(Le(data + p + 16, 4));
    archive.has_checksums_ |= entry.crc != 0;
    uint64_t comp_size = Le(data + p + 20, 4);
    uint64_t uncomp_size = Le(data + p + 24, 4);
    const uint64_t name_len = Le(data + p + 28, 2);
    const uint64_t extra_len = Le(data + p + 30, 2);
    const uint64_t comment_len = Le(data + p + 32, 2);
    uint64_t local = Le(data + p + 42, 4);
    if (cd_end - p - 46 < name_len + extra_len + comment_len) {
      return bad(absl::StrCat("central directory entry ", i, " runs past the directory"));
    }
    std::string name(reinterpret_cast<const char*>(data + p + 46), name_len);
    // The zip64 extra field holds, in this order, whichever 32-bit fields are saturated.
    const uint8_t* extra = data + p + 46 + name_len;
    const uint8_t* extra_end = extra + extra_len;
    bool saw_zip64 = false;
    while (extra_end - extra >= 4) {
      const uint64_t id = Le(extra, 2), len = Le(extra + 2, 2);
      if (static_cast<uint64_t>(extra_end - extra - 4) < len) {
        return bad(absl::StrCat("extra field of entry '", name, "' is truncated"));
      }
      if (id == 0x0001) {
        saw_zip64 = true;
        const uint8_t* q = extra + 4;
        const uint8_t* q_end = q + len;
        for (uint64_t* field : {&uncomp_size, &comp_size, &local}) {
          if (*field != 0xFFFFFFFF) continue;
          if (q_end - q < 8) return bad(absl::StrCat("zip64 field of '", name, "' is short"));
          *field = Le(q, 8);
          q += 8;
        }
      }
      extra += 4 + len;
    }
    if (!saw_zip64 &&
        (comp_size == 0xFFFFFFFF || uncomp_size == 0xFFFFFFFF || local == 0xFFFFFFFF)) {
      return bad(absl::StrCat("entry '", name, "' has saturated sizes but no zip64 field"));
    }
    p += 46 + name_len + extra_len + comment_len;

    if (local > size || size - local < 30 || Le(data + local, 4) != 0x04034b50) {
      return bad(absl::StrCat("local header of '", name, "' is missing or malformed"));
    }
    const uint64_t data_offset = local + 30 + Le(data + local + 26, 2) + Le(data + local + 28, 2);
    if (data_offset > size || comp_size > size - data_offset) {
      return bad(absl::StrCat("data of '", name, "' runs past the end of the file"));
    }
    if (entry.method == 0 && comp_size != uncomp_size) {
      return bad(absl::StrCat("stored entry '", name, "' has differing sizes"));
    }
    entry.data_offset = data_offset;
    entry.size = comp_size;
    if (i == 0) {
      const size_t slash = name.find('/');
      if (slash == std::string::npos) {
        return bad(absl::StrCat("first entry '", name, "' is not inside an archive folder"));
      }
      archive.prefix_ = name.substr(0, slash + 1);
    }
    if (!archive.entries_.emplace(std::move(name), entry).second) {
      return bad("duplicate entry names");
    }
  }
  return archive;
}

absl::StatusOr<absl::string_view> ZipArchive::Record(const std::string& name) const {
  const std::string full = prefix_ + name;
  const auto it = entries_.find(full);
  if (it == entries_.end()) {
    return Invalid(file_->path(), absl::StrCat("archive has no record '", full, "'"));
  }
  const ZipEntry& entry = it->second;
  if (entry.flags & 1) {
    return absl::UnimplementedError(
        absl::StrCat(file_->path(), ": record '", full, "' is encrypted"));
  }
  if (entry.method != 0) {
    return absl::UnimplementedError(absl::StrCat(file_->path(), ": record '", full,
                                                 "' is compressed (method ", entry.method,
                                                 "); torch.save stores records uncompressed"));
  }
  return absl::string_view(reinterpret_cast<const char*>(file_->data()) + entry.data_offset,
                           entry.size);
}

// ---------------------------------------------------------------------------------------
// Pickle values. All live in an arena owned by the unpickler and point at each other with
// raw pointers, so reference cycles a hostile pickle builds cannot leak, and nothing is
// freed or traversed recursively.

enum class Kind : uint8_t {
  kNone,
  kBool,
  kInt,
  kFloat,
  kStr,
  kBytes,
  kTuple,
  kList,
  kDict,
  kGlobal,
  kStorage,
  kTensor
};

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kStr:
      return "str";
    case Kind::kBytes:
      return "bytes";
    case Kind::kTuple:
      return "tuple";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kGlobal:
      return "global";
    case Kind::kStorage:
      return "storage";
    case Kind::kTensor:
      return "tensor";
  }
  return "?";
}

// The globals the interpreter knows.
enum class Global : uint8_t {
  kOrderedDict,
  kRebuildTensor,
  kRebuildTensorV2,
  kRebuildParameter,
  kRebuildParameterWithState,
  kStorageType,
};

struct Value;

struct Dict {
  std::vector<std::pair<Value*, Value*>> entries;   // Insertion order, as Python keeps it.
  std::map<std::pair<int, int64_t>, size_t> index;  // Key identity -> position in entries.
};

struct Value {
  explicit Value(Kind k) : kind(k) {}
  Kind kind;
  Global global = Global::kOrderedDict;  // kGlobal
  at::ScalarType dtype = at::kFloat;     // kGlobal kStorageType
  int32_t intern_id = -1;                // kStr, kBytes: set once used as a dict key
  int64_t i = 0;                         // kBool, kInt
  double f = 0;                          // kFloat
  std::string s;                         // kStr, kBytes; kGlobal: "module.name"
  std::vector<Value*> items;             // kTuple, kList
  std::unique_ptr<Dict> dict;            // kDict
  at::Tensor tensor;                     // kStorage (flat), kTensor
};

const char* OpcodeName(uint8_t op) {
  switch (op) {
    case '(':
      return "MARK";
    case '.':
      return "STOP";
    case '0':
      return "POP";
    case '1':
      return "POP_MARK";
    case '2':
      return "DUP";
    case 'F':
      return "FLOAT";
    case 'I':
      return "INT";
    case 'J':
      return "BININT";
    case 'K':
      return "BININT1";
    case 'L':
      return "LONG";
    case 'M':
      return "BININT2";
    case 'N':
      return "NONE";
    case 'P':
      return "PERSID";
    case 'Q':
      return "BINPERSID";
    case 'R':
      return "REDUCE";
    case 'S':
      return "STRING";
    case 'T':
      return "BINSTRING";
    case 'U':
      return "SHORT_BINSTRING";
    case 'V':
      return "UNICODE";
    case 'X':
      return "BINUNICODE";
    case 'a':
      return "APPEND";
    case 'b':
      return "BUILD";
    case 'c':
      return "GLOBAL";
    case 'd':
      return "DICT";
    case '}':
      return "EMPTY_DICT";
    case 'e':
      return "APPENDS";
    case 'g':
      return "GET";
    case 'h':
      return "BINGET";
    case 'i':
      return "INST";
    case 'j':
      return "LONG_BINGET";
    case 'l':
      return "LIST";
    case ']':
      return "EMPTY_LIST";
    case 'o':
      return "OBJ";
    case 'p':
      return "PUT";
    case 'q':
      return "BINPUT";
    case 'r':
      return "LONG_BINPUT";
    case 's':
      return "SETITEM";
    case 't':
      return "TUPLE";
    case ')':
      return "EMPTY_TUPLE";
    case 'u':
      return "SETITEMS";
    case 'G':
      return "BINFLOAT";
    case 0x80:
      return "PROTO";
    case 0x81:
      return "NEWOBJ";
    case 0x82:
      return "EXT1";
    case 0x83:
      return "EXT2";
    case 0x84:
      return "EXT4";
    case 0x85:
      return "TUPLE1";
    case 0x86:
      return "TUPLE2";
    case 0x87:
      return "TUPLE3";
    case 0x88:
      return "NEWTRUE";
    case 0x89:
      return "NEWFALSE";
    case 0x8a:
      return "LONG1";
    case 0x8b:
      return "LONG4";
    case 'B':
      return "BINBYTES";
    case 'C':
      return "SHORT_BINBYTES";
    case 0x8c:
      return "SHORT_BINUNICODE";
    case 0x8d:
      return "BINUNICODE8";
    case 0x8e:
      return "BINBYTES8";
    case 0x8f:
      return "EMPTY_SET";
    case 0x90:
      return "ADDITEMS";
    case 0x91:
      return "FROZENSET";
    case 0x92:
      return "NEWOBJ_EX";
    case 0x93:
      return "STACK_GLOBAL";
    case 0x94:
      return "MEMOIZE";
    case 0x95:
      return "FRAME";
    case 0x96:
      return "BYTEARRAY8";
    case 0x97:
      return "NEXT_BUFFER";
    case 0x98:
      return "READONLY_BUFFER";
    default:
      return nullptr;
  }
}

// Loads storages (the data/<key> records) on first reference, once per key.
class StorageLoader {
 public:
  StorageLoader(std::shared_ptr<MappedFile> file, const ZipArchive* archive)
      : file_(std::move(file)), archive_(archive) {}

  // A flat tensor of `numel` elements of `dtype` over record data/<key>; the error message
  // does not name the path (the caller adds context).
  absl::StatusOr<at::Tensor> Load(const std::string& key, at::ScalarType dtype, int64_t numel) {
    const auto cached = cache_.find(key);
    if (cached != cache_.end()) {
      if (cached->second.scalar_type() != dtype || cached->second.numel() != numel) {
        return absl::InvalidArgumentError(
            absl::StrCat("storage '", key, "' is referenced with differing dtypes or sizes"));
      }
      return cached->second;
    }
    const std::string name = "data/" + key;
    if (!archive_->Has(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("storage record '", archive_->FullName(name), "' is missing"));
    }
    ASSIGN_OR_RETURN(const absl::string_view bytes, archive_->Record(name));
    const int64_t elem_size = static_cast<int64_t>(at::elementSize(dtype));
    int64_t nbytes;
    if (numel < 0 || __builtin_mul_overflow(numel, elem_size, &nbytes) ||
        static_cast<uint64_t>(nbytes) != bytes.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "storage record '", archive_->FullName(name), "' holds ", bytes.size(), " bytes, but ",
          numel, " elements of ", c10::toString(dtype), " were declared"));
    }
    void* ptr = const_cast<char*>(bytes.data());
    const auto options = at::TensorOptions().dtype(dtype);
    at::Tensor storage;
    if (numel == 0) {
      storage = at::empty({0}, options);
    } else if (dtype == at::kBool) {
      // Bytes other than 0/1 are not valid bools: normalise into memory of its own.
      storage = at::from_blob(ptr, {numel}, at::TensorOptions().dtype(at::kByte)).ne(0);
    } else if (reinterpret_cast<uintptr_t>(ptr) % elem_size != 0) {
      storage = at::empty({numel}, options);  // Kernels may assume aligned elements.
      std::memcpy(storage.data_ptr(), ptr, nbytes);
    } else {
      std::shared_ptr<MappedFile> file = file_;
      const size_t size = static_cast<size_t>(nbytes);
      storage = at::from_blob(
          ptr, {numel}, [file, size](void* p) { file->Release(p, size); }, options);
    }
    cache_.emplace(key, storage);
    return storage;
  }

  // Storage key -> flat tensor, for every storage loaded.
  const std::map<std::string, at::Tensor>& storages() const { return cache_; }

 private:
  std::shared_ptr<MappedFile> file_;
  const ZipArchive* archive_;
  std::map<std::string, at::Tensor> cache_;
};

// Interprets data.pkl. Mirrors Python's pickle._Unpickler: MARK starts a new frame of the
// stack, and ops other than those that pop the mark cannot reach below it.
class Unpickler {
 public:
  Unpickler(const std::string& path, absl::string_view pickle, StorageLoader* loader)
      : path_(path), data_(pickle), loader_(loader) {}

  absl::StatusOr<Value*> Run() {
    while (true) {
      op_offset_ = pos_;
      if (pos_ >= data_.size()) return Error("pickle ends without STOP");
      op_ = static_cast<uint8_t>(data_[pos_++]);
      if (op_ == '.') {
        ASSIGN_OR_RETURN(Value * result, Pop());
        return result;
      }
      RETURN_IF_ERROR(Step());
    }
  }

  // The state dict: the root dict, or its "model" entry when that is a dict.
  absl::StatusOr<TensorMap> ToStateDict(Value* root) {
    if (root->kind != Kind::kDict) {
      return Invalid(
          path_, absl::StrCat("checkpoint holds a ", KindName(root->kind), ", not a state dict"));
    }
    for (const auto& [key, value] : root->dict->entries) {
      if (key->kind == Kind::kStr && key->s == "model" && value->kind == Kind::kDict) {
        root = value;
        break;
      }
    }
    TensorMap tensors;
    for (const auto& [key, value] : root->dict->entries) {
      if (key->kind != Kind::kStr) {
        return Invalid(path_, absl::StrCat("state dict has a key of type ", KindName(key->kind)));
      }
      if (!IsValidUtf8(key->s)) {
        return Invalid(path_, "state dict has a key that is not valid UTF-8");
      }
      if (value->kind != Kind::kTensor) {
        return Invalid(path_, absl::StrCat("state dict entry '", key->s, "' is a ",
                                           KindName(value->kind), ", not a tensor"));
      }
      tensors.emplace(key->s, value->tensor);
    }
    return tensors;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    const char* name = OpcodeName(op_);
    return Invalid(path_, absl::StrFormat("data.pkl byte %d (opcode %s): %s", op_offset_,
                                          name ? name : absl::StrFormat("0x%02x", op_), what));
  }
  absl::Status Unsupported(absl::string_view what) const {
    return absl::UnimplementedError(
        absl::StrCat(path_, ": data.pkl byte ", op_offset_, ": ", what));
  }

  absl::StatusOr<absl::string_view> Take(uint64_t n) {
    if (n > data_.size() - pos_) return Error("pickle is truncated");
    const absl::string_view out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  absl::StatusOr<uint64_t> TakeLe(int n) {
    ASSIGN_OR_RETURN(const absl::string_view bytes, Take(n));
    return Le(reinterpret_cast<const uint8_t*>(bytes.data()), n);
  }
  absl::StatusOr<std::string> TakeLine() {
    const size_t limit = std::min<size_t>(data_.size() - pos_, kMaxGlobalLine + 1);
    const size_t nl = data_.substr(pos_, limit).find('\n');
    if (nl == absl::string_view::npos) return Error("GLOBAL line is truncated or too long");
    std::string line(data_.substr(pos_, nl));
    pos_ += nl + 1;
    return line;
  }

  absl::StatusOr<Value*> New(Kind kind) {
    if (arena_.size() >= kMaxObjects) {
      return Error(absl::StrCat("more than ", kMaxObjects, " objects"));
    }
    return &arena_.emplace_back(kind);
  }
  absl::Status Push(Value* value) {
    if (stack_.size() >= kMaxStack) return Error("stack overflow");
    stack_.push_back(value);
    return absl::OkStatus();
  }
  absl::Status PushNew(Kind kind, Value** out = nullptr) {
    ASSIGN_OR_RETURN(Value * value, New(kind));
    if (out != nullptr) *out = value;
    return Push(value);
  }
  size_t Floor() const { return marks_.empty() ? 0 : marks_.back(); }
  absl::StatusOr<Value*> Pop() {
    if (stack_.size() <= Floor()) return Error("stack underflow");
    Value* value = stack_.back();
    stack_.pop_back();
    return value;
  }
  absl::StatusOr<Value*> Top() {
    if (stack_.size() <= Floor()) return Error("stack underflow");
    return stack_.back();
  }
  // The item right below the (already popped) mark at `start`: the target of APPENDS and
  // SETITEMS.
  absl::StatusOr<Value*> BelowMark(size_t start) {
    if (start <= Floor()) return Error("stack underflow");
    return stack_[start - 1];
  }
  // Pops the innermost mark; the items above it are stack_[start, end).
  absl::StatusOr<size_t> PopMark() {
    if (marks_.empty()) return Error("no MARK on the stack");
    const size_t start = marks_.back();
    marks_.pop_back();
    return start;
  }

  absl::StatusOr<Value*> Memo(uint64_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) return Error(absl::StrCat("memo key ", index, " is not set"));
    return it->second;
  }
  absl::Status Memoize(uint64_t index) {
    ASSIGN_OR_RETURN(Value * value, Top());
    if (memo_.size() >= kMaxMemo && memo_.count(index) == 0) {
      return Error(absl::StrCat("more than ", kMaxMemo, " memo entries"));
    }
    memo_[index] = value;
    return absl::OkStatus();
  }

  // Dict keys are compared by identity of content: strings are interned the first time they
  // are used as a key (so each is compared once, in O(log n)), ints by value.
  absl::StatusOr<std::pair<int, int64_t>> KeyOf(Value* key) {
    switch (key->kind) {
      case Kind::kStr:
      case Kind::kBytes:
        if (key->intern_id < 0) {
          const auto [it, inserted] =
              interned_.emplace(absl::string_view(key->s), static_cast<int32_t>(interned_.size()));
          key->intern_id = it->second;
        }
        return std::make_pair(key->kind == Kind::kStr ? 1 : 2, int64_t{key->intern_id});
      case Kind::kInt:
      case Kind::kBool:
        return std::make_pair(3, key->i);  // As in Python, True == 1.
      case Kind::kNone:
        return std::make_pair(4, int64_t{0});
      default:
        return Error(absl::StrCat("unsupported dict key of type ", KindName(key->kind)));
    }
  }
  absl::Status SetItem(Value* dict, Value* key, Value* value) {
    if (dict->kind != Kind::kDict) {
      return Error(absl::StrCat("setting an item on a ", KindName(dict->kind)));
    }
    ASSIGN_OR_RETURN(const auto id, KeyOf(key));
    const auto [it, inserted] = dict->dict->index.emplace(id, dict->dict->entries.size());
    if (inserted) {
      dict->dict->entries.emplace_back(key, value);
    } else {
      dict->dict->entries[it->second].second = value;
    }
    return absl::OkStatus();
  }
  absl::StatusOr<Value*> NewDict() {
    ASSIGN_OR_RETURN(Value * dict, New(Kind::kDict));
    dict->dict = std::make_unique<Dict>();
    return dict;
  }
  absl::Status PushTuple(size_t start) {
    ASSIGN_OR_RETURN(Value * tuple, New(Kind::kTuple));
    tuple->items.assign(stack_.begin() + start, stack_.end());
    stack_.resize(start);
    return Push(tuple);
  }
  absl::Status PushString(Kind kind, uint64_t len) {
    ASSIGN_OR_RETURN(const absl::string_view bytes, Take(len));
    Value* value = nullptr;
    RETURN_IF_ERROR(PushNew(kind, &value));
    value->s.assign(bytes.data(), bytes.size());
    return absl::OkStatus();
  }
  absl::Status PushInt(int64_t i) {
    Value* value = nullptr;
    RETURN_IF_ERROR(PushNew(Kind::kInt, &value));
    value->i = i;
    return absl::OkStatus();
  }
  // LONG1 / LONG4 payload: little-endian two's complement; only int64 values are supported.
  absl::Status PushLong(uint64_t len) {
    if (len > 8) return Error(absl::StrCat(len, "-byte integer exceeds int64"));
    ASSIGN_OR_RETURN(const absl::string_view bytes, Take(len));
    uint64_t v = Le(reinterpret_cast<const uint8_t*>(bytes.data()), static_cast<int>(len));
    if (len > 0 && len < 8 && (static_cast<uint8_t>(bytes[len - 1]) & 0x80)) {
      v |= ~uint64_t{0} << (8 * len);  // Sign-extend.
    }
    return PushInt(static_cast<int64_t>(v));
  }

  absl::Status PushGlobal(const std::string& module, const std::string& name) {
    static const struct {
      const char* module;
      const char* name;
      Global global;
      at::ScalarType dtype;
    } kGlobals[] = {
        {"collections", "OrderedDict", Global::kOrderedDict, at::kFloat},
        {"torch._utils", "_rebuild_tensor", Global::kRebuildTensor, at::kFloat},
        {"torch._utils", "_rebuild_tensor_v2", Global::kRebuildTensorV2, at::kFloat},
        {"torch._utils", "_rebuild_parameter", Global::kRebuildParameter, at::kFloat},
        {"torch._utils", "_rebuild_parameter_with_state", Global::kRebuildParameterWithState,
         at::kFloat},
        {"torch", "DoubleStorage", Global::kStorageType, at::kDouble},
        {"torch", "FloatStorage", Global::kStorageType, at::kFloat},
        {"torch", "HalfStorage", Global::kStorageType, at::kHalf},
        {"torch", "BFloat16Storage", Global::kStorageType, at::kBFloat16},
        {"torch", "LongStorage", Global::kStorageType, at::kLong},
        {"torch", "IntStorage", Global::kStorageType, at::kInt},
        {"torch", "ShortStorage", Global::kStorageType, at::kShort},
        {"torch", "CharStorage", Global::kStorageType, at::kChar},
        {"torch", "ByteStorage", Global::kStorageType, at::kByte},
        {"torch", "BoolStorage", Global::kStorageType, at::kBool},
    };
    for (const auto& g : kGlobals) {
      if (module == g.module && name == g.name) {
        Value* value = nullptr;
        RETURN_IF_ERROR(PushNew(Kind::kGlobal, &value));
        value->global = g.global;
        value->dtype = g.dtype;
        value->s = absl::StrCat(module, ".", name);
        return absl::OkStatus();
      }
    }
    return Unsupported(
        absl::StrCat("unsupported global '", module, ".", name, "' (not part of a state dict)"));
  }

  // Checks that `value` is an int (bool excluded) and returns it.
  absl::StatusOr<int64_t> IntArg(Value* value, absl::string_view what) {
    if (value->kind != Kind::kInt) {
      return Error(absl::StrCat(what, " is a ", KindName(value->kind), ", not an int"));
    }
    return value->i;
  }
  absl::StatusOr<std::vector<int64_t>> IntTuple(Value* value, absl::string_view what) {
    if (value->kind != Kind::kTuple) {
      return Error(absl::StrCat(what, " is a ", KindName(value->kind), ", not a tuple"));
    }
    if (value->items.size() > kMaxRank) return Error(absl::StrCat(what, " exceeds rank 64"));
    std::vector<int64_t> out;
    for (Value* item : value->items) {
      ASSIGN_OR_RETURN(const int64_t i, IntArg(item, what));
      if (i < 0) return Error(absl::StrCat(what, " holds the negative value ", i));
      out.push_back(i);
    }
    return out;
  }

  // torch._utils._rebuild_tensor(_v2): a strided view of a storage, checked to lie in it.
  absl::StatusOr<at::Tensor> RebuildTensor(Value* storage, Value* offset_value, Value* size_value,
                                           Value* stride_value) {
    if (storage->kind != Kind::kStorage) {
      return Error(absl::StrCat("tensor storage is a ", KindName(storage->kind)));
    }
    ASSIGN_OR_RETURN(const int64_t offset, IntArg(offset_value, "storage offset"));
    ASSIGN_OR_RETURN(const std::vector<int64_t> size, IntTuple(size_value, "tensor size"));
    ASSIGN_OR_RETURN(const std::vector<int64_t> stride, IntTuple(stride_value, "tensor stride"));
    if (offset < 0) return Error("negative storage offset");
    if (size.size() != stride.size()) return Error("size and stride differ in rank");
    int64_t numel = 1, stride_bound = 1, last = offset;
    for (size_t d = 0; d < size.size(); ++d) {
      int64_t span;
      if (__builtin_mul_overflow(numel, size[d], &numel) ||
          __builtin_mul_overflow(stride_bound, std::max<int64_t>(size[d], 1), &stride_bound) ||
          __builtin_mul_overflow(std::max<int64_t>(size[d] - 1, 0), stride[d], &span) ||
          __builtin_add_overflow(last, span, &last)) {
        return Error("tensor size or stride overflows int64");
      }
    }
    const at::Tensor& base = storage->tensor;
    if (numel == 0) return at::empty(size, base.options());
    if (last >= base.numel()) {
      return Error(
          absl::StrCat("tensor view reaches element ", last, " of a storage of ", base.numel()));
    }
    return base.as_strided(size, stride, offset);
  }

  absl::Status Reduce(Value* callable, Value* args) {
    if (callable->kind != Kind::kGlobal) {
      return Error(absl::StrCat("calling a ", KindName(callable->kind)));
    }
    if (args->kind != Kind::kTuple) {
      return Error(absl::StrCat("arguments are a ", KindName(args->kind), ", not a tuple"));
    }
    const std::vector<Value*>& a = args->items;
    auto arity = [&](size_t lo, size_t hi) -> absl::Status {
      if (a.size() < lo || a.size() > hi) {
        return Error(absl::StrCat(callable->s, " takes ", lo,
                                  lo == hi ? "" : absl::StrCat(" to ", hi), " arguments, got ",
                                  a.size()));
      }
      return absl::OkStatus();
    };
    switch (callable->global) {
      case Global::kOrderedDict: {
        RETURN_IF_ERROR(arity(0, 0));
        ASSIGN_OR_RETURN(Value * dict, NewDict());
        return Push(dict);
      }
      case Global::kRebuildTensor:
      case Global::kRebuildTensorV2: {
        // (storage, storage_offset, size, stride[, requires_grad, backward_hooks[, metadata]])
        if (callable->global == Global::kRebuildTensor) {
          RETURN_IF_ERROR(arity(4, 4));
        } else {
          RETURN_IF_ERROR(arity(6, 7));
          if (a[4]->kind != Kind::kBool) return Error("requires_grad is not a bool");
        }
        ASSIGN_OR_RETURN(at::Tensor tensor, RebuildTensor(a[0], a[1], a[2], a[3]));
        Value* value = nullptr;
        RETURN_IF_ERROR(PushNew(Kind::kTensor, &value));
        value->tensor = std::move(tensor);
        return absl::OkStatus();
      }
      case Global::kRebuildParameter:
      case Global::kRebuildParameterWithState:
        // (data, requires_grad, backward_hooks[, state]): the data is the tensor.
        if (callable->global == Global::kRebuildParameter) {
          RETURN_IF_ERROR(arity(3, 3));
        } else {
          RETURN_IF_ERROR(arity(4, 4));
        }
        if (a[0]->kind != Kind::kTensor) return Error("parameter data is not a tensor");
        return Push(a[0]);
      case Global::kStorageType:
        return Error(absl::StrCat("calling ", callable->s));
    }
    return Error("unknown callable");
  }

  // torch.save's persistent id: ('storage', storage_type, key, location, numel).
  absl::Status PersistentLoad(Value* pid) {
    if (pid->kind != Kind::kTuple || pid->items.size() != 5) {
      return Error("persistent id is not a 5-tuple");
    }
    const std::vector<Value*>& t = pid->items;
    if (t[0]->kind != Kind::kStr || t[0]->s != "storage") {
      return Error("persistent id does not start with 'storage'");
    }
    if (t[1]->kind != Kind::kGlobal || t[1]->global != Global::kStorageType) {
      return Error("persistent id names no storage type");
    }
    if (t[2]->kind != Kind::kStr) return Error("storage key is not a str");
    if (t[3]->kind != Kind::kStr) return Error("storage location is not a str");
    ASSIGN_OR_RETURN(const int64_t numel, IntArg(t[4], "storage size"));
    auto storage = loader_->Load(t[2]->s, t[1]->dtype, numel);
    if (!storage.ok()) {
      if (storage.status().code() == absl::StatusCode::kInvalidArgument) {
        return Error(storage.status().message());
      }
      return storage.status();
    }
    Value* value = nullptr;
    RETURN_IF_ERROR(PushNew(Kind::kStorage, &value));
    value->tensor = *std::move(storage);
    return absl::OkStatus();
  }

  absl::Status Step() {
    switch (op_) {
      case 0x80: {  // PROTO
        ASSIGN_OR_RETURN(const uint64_t proto, TakeLe(1));
        if (proto > 5) return Error(absl::StrCat("unsupported pickle protocol ", proto));
        return absl::OkStatus();
      }
      case 0x95: {  // FRAME: framing only groups opcodes; the length needs no action.
        ASSIGN_OR_RETURN(const uint64_t len, TakeLe(8));
        if (len > data_.size() - pos_) return Error("frame runs past the end of the pickle");
        return absl::OkStatus();
      }
      case '(':  // MARK
        if (marks_.size() >= kMaxMarks) return Error("MARKs nested too deeply");
        marks_.push_back(stack_.size());
        return absl::OkStatus();
      case '0': {  // POP: an item, or the mark when the current frame is empty.
        if (stack_.size() > Floor()) {
          stack_.pop_back();
          return absl::OkStatus();
        }
        ASSIGN_OR_RETURN(const size_t start, PopMark());
        stack_.resize(start);
        return absl::OkStatus();
      }
      case '1': {  // POP_MARK
        ASSIGN_OR_RETURN(const size_t start, PopMark());
        stack_.resize(start);
        return absl::OkStatus();
      }
      case '2': {  // DUP
        ASSIGN_OR_RETURN(Value * top, Top());
        return Push(top);
      }
      case 'N':
        return PushNew(Kind::kNone);
      case 0x88:
      case 0x89: {  // NEWTRUE, NEWFALSE
        Value* value = nullptr;
        RETURN_IF_ERROR(PushNew(Kind::kBool, &value));
        value->i = op_ == 0x88;
        return absl::OkStatus();
      }
      case 'J': {  // BININT
        ASSIGN_OR_RETURN(const uint64_t v, TakeLe(4));
        return PushInt(static_cast<int32_t>(static_cast<uint32_t>(v)));
      }
      case 'K': {  // BININT1
        ASSIGN_OR_RETURN(const uint64_t v, TakeLe(1));
        return PushInt(static_cast<int64_t>(v));
      }
      case 'M': {  // BININT2
        ASSIGN_OR_RETURN(const uint64_t v, TakeLe(2));
        return PushInt(static_cast<int64_t>(v));
      }
      case 0x8a: {  // LONG1
        ASSIGN_OR_RETURN(const uint64_t len, TakeLe(1));
        return PushLong(len);
      }
      case 0x8b: {  // LONG4
        ASSIGN_OR_RETURN(const uint64_t len, TakeLe(4));
        return PushLong(len);
      }
      case 'G': {  // BINFLOAT: big-endian double.
        ASSIGN_OR_RETURN(const absl::string_view bytes, Take(8));
        uint64_t bits = 0;
        for (char c : bytes) bits = (bits << 8) | static_cast<uint8_t>(c);
        Value* value = nullptr;
        RETURN_IF_ERROR(PushNew(Kind::kFloat, &value));
        std::memcpy(&value->f, &bits, 8);
        return absl::OkStatus();
      }
      case 'X': {  // BINUNICODE
        ASSIGN_OR_RETURN(const uint64_t len, TakeLe(4));
        return PushString(Kind::kStr, len);
      }
      case 0x8c: {  // SHORT_BINUNICODE
        ASSIGN_OR_RETURN(const uint64_t len, TakeLe(1));
        return PushString(Kind::kStr, len);
      }
      case 0x8d: {  // BINUNICODE8
        ASSIGN_OR_RETURN(const uint64_t len, TakeLe(8));
        return PushString(Kind::kStr, len);
      }
      case 'B': {  // BINBYTES
        ASSIGN_OR_RETURN(const uint64_t len, TakeLe(4));
        return PushString(Kind::kBytes, len);
      }
      case 'C': {  // SHORT_BINBYTES
        ASSIGN_OR_RETURN(const uint64_t len, TakeLe(1));
        return PushString(Kind::kBytes, len);
      }
      case 0x8e: {  // BINBYTES8
        ASSIGN_OR_RETURN(const uint64_t len, TakeLe(8));
        return PushString(Kind::kBytes, len);
      }
      case ')':  // EMPTY_TUPLE
        return PushTuple(stack_.size());
      case 't': {  // TUPLE
        ASSIGN_OR_RETURN(const size_t start, PopMark());
        return PushTuple(start);
      }
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1, TUPLE2, TUPLE3
        const size_t n = op_ - 0x84;
        if (stack_.size() - Floor() < n) return Error("stack underflow");
        return PushTuple(stack_.size() - n);
      }
      case ']':  // EMPTY_LIST
        return PushNew(Kind::kList);
      case 'l': {  // LIST
        ASSIGN_OR_RETURN(const size_t start, PopMark());
        ASSIGN_OR_RETURN(Value * list, New(Kind::kList));
        list->items.assign(stack_.begin() + start, stack_.end());
        stack_.resize(start);
        return Push(list);
      }
      case 'a': {  // APPEND
        ASSIGN_OR_RETURN(Value * value, Pop());
        ASSIGN_OR_RETURN(Value * list, Top());
        if (list->kind != Kind::kList) {
          return Error(absl::StrCat("appending to a ", KindName(list->kind)));
        }
        list->items.push_back(value);
        return absl::OkStatus();
      }
      case 'e': {  // APPENDS
        ASSIGN_OR_RETURN(const size_t start, PopMark());
        ASSIGN_OR_RETURN(Value * list, BelowMark(start));
        if (list->kind != Kind::kList) {
          return Error(absl::StrCat("appending to a ", KindName(list->kind)));
        }
        list->items.insert(list->items.end(), stack_.begin() + start, stack_.end());
        stack_.resize(start);
        return absl::OkStatus();
      }
      case '}': {  // EMPTY_DICT
        ASSIGN_OR_RETURN(Value * dict, NewDict());
        return Push(dict);
      }
      case 'd': {  // DICT
        ASSIGN_OR_RETURN(const size_t start, PopMark());
        if ((stack_.size() - start) % 2 != 0) return Error("odd number of items for a dict");
        ASSIGN_OR_RETURN(Value * dict, NewDict());
        for (size_t k = start; k < stack_.size(); k += 2) {
          RETURN_IF_ERROR(SetItem(dict, stack_[k], stack_[k + 1]));
        }
        stack_.resize(start);
        return Push(dict);
      }
      case 's': {  // SETITEM
        ASSIGN_OR_RETURN(Value * value, Pop());
        ASSIGN_OR_RETURN(Value * key, Pop());
        ASSIGN_OR_RETURN(Value * dict, Top());
        return SetItem(dict, key, value);
      }
      case 'u': {  // SETITEMS
        ASSIGN_OR_RETURN(const size_t start, PopMark());
        if ((stack_.size() - start) % 2 != 0) return Error("odd number of items for a dict");
        ASSIGN_OR_RETURN(Value * dict, BelowMark(start));
        for (size_t k = start; k < stack_.size(); k += 2) {
          RETURN_IF_ERROR(SetItem(dict, stack_[k], stack_[k + 1]));
        }
        stack_.resize(start);
        return absl::OkStatus();
      }
      case 'c': {  // GLOBAL
        ASSIGN_OR_RETURN(const std::string module, TakeLine());
        ASSIGN_OR_RETURN(const std::string name, TakeLine());
        return PushGlobal(module, name);
      }
      case 0x93: {  // STACK_GLOBAL
        ASSIGN_OR_RETURN(Value * name, Pop());
        ASSIGN_OR_RETURN(Value * module, Pop());
        if (name->kind != Kind::kStr || module->kind != Kind::kStr) {
          return Error("module and name are not strs");
        }
        return PushGlobal(module->s, name->s);
      }
      case 'R':     // REDUCE
      case 0x81: {  // NEWOBJ: cls.__new__(cls, *args); only OrderedDict gets this far.
        ASSIGN_OR_RETURN(Value * args, Pop());
        ASSIGN_OR_RETURN(Value * callable, Pop());
        if (op_ == 0x81 &&
            !(callable->kind == Kind::kGlobal && callable->global == Global::kOrderedDict)) {
          return Error("NEWOBJ of something other than OrderedDict");
        }
        return Reduce(callable, args);
      }
      case 'b': {  // BUILD: sets an object's state. Only dicts (OrderedDict._metadata) get one.
        ASSIGN_OR_RETURN(Value * state, Pop());
        (void)state;
        ASSIGN_OR_RETURN(Value * target, Top());
        if (target->kind != Kind::kDict) {
          return Error(absl::StrCat("setting the state of a ", KindName(target->kind)));
        }
        return absl::OkStatus();
      }
      case 'Q': {  // BINPERSID
        ASSIGN_OR_RETURN(Value * pid, Pop());
        return PersistentLoad(pid);
      }
      case 'q': {  // BINPUT
        ASSIGN_OR_RETURN(const uint64_t index, TakeLe(1));
        return Memoize(index);
      }
      case 'r': {  // LONG_BINPUT
        ASSIGN_OR_RETURN(const uint64_t index, TakeLe(4));
        return Memoize(index);
      }
      case 0x94:  // MEMOIZE
        return Memoize(memo_.size());
      case 'h': {  // BINGET
        ASSIGN_OR_RETURN(const uint64_t index, TakeLe(1));
        ASSIGN_OR_RETURN(Value * value, Memo(index));
        return Push(value);
      }
      case 'j': {  // LONG_BINGET
        ASSIGN_OR_RETURN(const uint64_t index, TakeLe(4));
        ASSIGN_OR_RETURN(Value * value, Memo(index));
        return Push(value);
      }
      default: {
        const char* name = OpcodeName(op_);
        if (name == nullptr) return Error("unknown opcode");
        return Unsupported(absl::StrFormat("unsupported pickle opcode %s (0x%02x)", name, op_));
      }
    }
  }

  const std::string& path_;
  const absl::string_view data_;
  StorageLoader* loader_;
  size_t pos_ = 0;
  size_t op_offset_ = 0;
  uint8_t op_ = 0;
  std::deque<Value> arena_;
  std::vector<Value*> stack_;
  std::vector<size_t> marks_;  // Stack sizes at each MARK.
  std::map<uint64_t, Value*> memo_;
  std::map<absl::string_view, int32_t> interned_;  // Views of strings in arena_.
};

// ---------------------------------------------------------------------------------------
// CRC-32 verification.

// A record to check against its stored CRC-32.
struct RecordCheck {
  std::string record;  // The full name, as "archive/data/3".
  absl::string_view bytes;
  uint32_t stored = 0;
  std::string tensors;  // What the record holds, for the message: "tensor x", or empty.
};

// Checks `checks` against their stored CRC-32s; DataLoss names the first record (in order)
// that fails. The bytes are split into pieces of at most 1 MiB, which as many threads as
// LibTorch's intra-op setting claim one at a time from RowPool (whole records would leave one
// thread alone with the largest; at::parallel_for is an OpenMP pragma in a header, serial in
// code built without -fopenmp); each record's pieces are then combined in order. Most of the
// time goes to first touching the mapped pages, which two threads do ~1.5x faster than one.
absl::Status VerifyRecords(const std::string& path, const std::vector<RecordCheck>& checks) {
  constexpr size_t kPiece = size_t{1} << 20;
  struct Piece {
    size_t check;
    size_t offset;
    size_t size;
  };
  std::vector<Piece> pieces;
  for (size_t i = 0; i < checks.size(); ++i) {
    const size_t size = checks[i].bytes.size();
    for (size_t offset = 0; offset < size; offset += kPiece) {
      pieces.push_back({i, offset, std::min(kPiece, size - offset)});
    }
  }
  std::vector<uint32_t> crcs(pieces.size());
  RowPool::Get().Run(at::get_num_threads(), static_cast<int64_t>(pieces.size()), [&](int64_t i) {
    const Piece& piece = pieces[i];
    crcs[i] = Crc32(checks[piece.check].bytes.data() + piece.offset, piece.size);
  });
  std::vector<uint32_t> computed(checks.size(), 0);
  for (size_t i = 0; i < pieces.size(); ++i) {
    uint32_t& crc = computed[pieces[i].check];
    crc = pieces[i].offset == 0 ? crcs[i] : Crc32Combine(crc, crcs[i], pieces[i].size);
  }
  for (size_t i = 0; i < checks.size(); ++i) {
    if (computed[i] == checks[i].stored) continue;
    const RecordCheck& check = checks[i];
    return absl::DataLossError(absl::StrFormat(
        "%s: record %s%s fails its CRC-32 check (stored 0x%08x, computed 0x%08x): the file is "
        "corrupt or was modified",
        path, check.record, check.tensors.empty() ? "" : absl::StrCat(" (", check.tensors, ")"),
        check.stored, computed[i]));
  }
  return absl::OkStatus();
}

// "tensor a", "tensors a, b", "tensors a, b, c and 4 more".
std::string TensorList(const std::vector<const std::string*>& names) {
  constexpr size_t kShown = 3;
  std::string text = names.size() == 1 ? "tensor " : "tensors ";
  for (size_t i = 0; i < names.size() && i < kShown; ++i) {
    absl::StrAppend(&text, i ? ", " : "", *names[i]);
  }
  if (names.size() > kShown) absl::StrAppend(&text, " and ", names.size() - kShown, " more");
  return text;
}

// Verifies the storage records that back `tensors` (those of other entries of a training
// checkpoint are not used, so not checked), each once however many tensors view it, in the
// order of the first tensor (by name) over each.
absl::Status VerifyStorages(const std::string& path, const ZipArchive& archive,
                            const StorageLoader& loader, const TensorMap& tensors) {
  std::map<const c10::StorageImpl*, const std::string*> key_of;
  for (const auto& [key, storage] : loader.storages()) {
    key_of.emplace(storage.storage().unsafeGetStorageImpl(), &key);
  }
  std::vector<const std::string*> keys;  // In order of first use.
  std::map<const std::string*, std::vector<const std::string*>> names;
  for (const auto& [name, tensor] : tensors) {
    const auto it = key_of.find(tensor.storage().unsafeGetStorageImpl());
    if (it == key_of.end()) continue;  // Every tensor views a loaded storage.
    std::vector<const std::string*>& of_key = names[it->second];
    if (of_key.empty()) keys.push_back(it->second);
    of_key.push_back(&name);
  }
  std::vector<RecordCheck> checks;
  checks.reserve(keys.size());
  for (const std::string* key : keys) {
    const std::string record = "data/" + *key;
    ASSIGN_OR_RETURN(const absl::string_view bytes, archive.Record(record));
    checks.push_back(
        {archive.FullName(record), bytes, archive.StoredCrc(record), TensorList(names[key])});
  }
  return VerifyRecords(path, checks);
}

absl::StatusOr<TensorMap> ReadTorchStateDictImpl(const std::string& path, bool verify_checksums) {
  ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> file, MappedFile::Open(path));
  ASSIGN_OR_RETURN(const ZipArchive archive, ZipArchive::Parse(*file));
  if (!archive.Has("data.pkl")) {
    return Invalid(path, absl::StrCat("archive has no '", archive.FullName("data.pkl"),
                                      "' (not written by torch.save?)"));
  }
  ASSIGN_OR_RETURN(const absl::string_view pickle, archive.Record("data.pkl"));
  if (pickle.size() > kMaxPickleBytes) {
    return Invalid(path, absl::StrCat("data.pkl is ", pickle.size(), " bytes, over the limit of ",
                                      kMaxPickleBytes));
  }
  verify_checksums = verify_checksums && archive.HasChecksums();
  if (verify_checksums) {
    // Before interpreting them: a damaged pickle is reported as damage, not as a bad opcode.
    std::vector<RecordCheck> checks = {
        {archive.FullName("data.pkl"), pickle, archive.StoredCrc("data.pkl"), ""}};
    if (archive.Has("byteorder")) {
      ASSIGN_OR_RETURN(const absl::string_view order, archive.Record("byteorder"));
      checks.push_back({archive.FullName("byteorder"), order, archive.StoredCrc("byteorder"), ""});
    }
    RETURN_IF_ERROR(VerifyRecords(path, checks));
  }
  if (archive.Has("byteorder")) {
    ASSIGN_OR_RETURN(const absl::string_view order, archive.Record("byteorder"));
    if (order != "little") {
      return absl::UnimplementedError(absl::StrCat(path, ": byte order '", order.substr(0, 16),
                                                   "' is not supported (only little)"));
    }
  }
  StorageLoader loader(file, &archive);
  Unpickler unpickler(path, pickle, &loader);
  ASSIGN_OR_RETURN(Value * root, unpickler.Run());
  ASSIGN_OR_RETURN(TensorMap tensors, unpickler.ToStateDict(root));
  if (verify_checksums) RETURN_IF_ERROR(VerifyStorages(path, archive, loader, tensors));
  return tensors;
}

}  // namespace

absl::StatusOr<TensorMap> ReadTorchStateDict(const std::string& path, bool verify_checksums) {
  try {
    return ReadTorchStateDictImpl(path, verify_checksums);
  } catch (const std::exception& e) {  // c10::Error derives from std::exception.
    return absl::InternalError(absl::StrCat(path, ": reading the checkpoint failed: ", e.what()));
  }
}

absl::Status WithVerifyChecksumsOption(const absl::Status& status, absl::string_view option) {
  if (status.code() != absl::StatusCode::kDataLoss) return status;
  return FieldError(absl::StatusCode::kDataLoss, option,
                    absl::StrCat(status.message(), "; set ", option, " = false to load it anyway"));
}

}  // namespace lgpt
