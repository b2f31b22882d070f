// Tests for the torch.save checkpoint reader: the golden LitGPT checkpoints against their
// safetensors twins, Python-written fixtures (dtypes, wrapped, views, parameters, protocol
// 4), crafted pickles and zips, and hostile input (truncations, random bit flips of the file
// and of the pickle alone), which must give clean errors.
#include "core/io/torch_pickle.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_field.h"
#include "core/io/crc32.h"
#include "core/io/safetensors.h"
#include "core/io/torch_pickle_writer.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

const char* const kGoldenCases[] = {"llama2", "llama2_lora", "llama3_gqa", "pythia"};

std::string Golden(const std::string& name, const std::string& file) {
  return absl::StrCat("tests/testdata/golden/", name, "/", file);
}
std::string Fixture(const std::string& name) { return "core/io/testdata/" + name; }
std::string TempPath(const std::string& name) {
  return absl::StrCat(testing::TempDir(), "/torch_pickle_test_", name);
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

void ExpectError(const absl::Status& status, absl::StatusCode code, const std::string& path,
                 const std::string& detail = "") {
  ASSERT_FALSE(status.ok()) << path;
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_NE(status.message().find(path), std::string::npos) << status;
  if (!detail.empty()) {
    EXPECT_NE(status.message().find(detail), std::string::npos) << status;
  }
}
template <typename T>
void ExpectError(const absl::StatusOr<T>& result, absl::StatusCode code, const std::string& path,
                 const std::string& detail = "") {
  ExpectError(result.status(), code, path, detail);
}

// Same dtype, shape and bytes.
void ExpectBitEqual(const at::Tensor& actual, const at::Tensor& expected, const std::string& name) {
  SCOPED_TRACE(name);
  ASSERT_TRUE(actual.defined());
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type());
  ASSERT_EQ(actual.sizes(), expected.sizes());
  const at::Tensor a = actual.contiguous(), e = expected.contiguous();
  EXPECT_EQ(std::memcmp(a.data_ptr(), e.data_ptr(), a.numel() * a.element_size()), 0)
      << actual << "\nvs\n"
      << expected;
}

void TouchAll(const TensorMap& tensors) {
  for (const auto& [name, t] : tensors) (void)t.to(at::kDouble).sum().item<double>();
}

// Builds pickles opcode by opcode, for crafted checkpoints.
class Pickle {
 public:
  Pickle& Raw(const std::string& bytes) {
    s_ += bytes;
    return *this;
  }
  Pickle& Op(char op) {
    s_ += op;
    return *this;
  }
  Pickle& Proto() { return Raw(std::string("\x80\x02", 2)); }
  Pickle& Mark() { return Op('('); }
  Pickle& Stop() { return Op('.'); }
  Pickle& Str(const std::string& v) {
    Op('X');
    Le(v.size(), 4);
    return Raw(v);
  }
  Pickle& Int(int64_t v) {
    if (v >= 0 && v < 256) {
      Op('K');
      return Le(v, 1);
    }
    if (v >= INT32_MIN && v <= INT32_MAX) {
      Op('J');
      return Le(static_cast<uint32_t>(v), 4);
    }
    Op('\x8a');
    Le(8, 1);
    return Le(static_cast<uint64_t>(v), 8);
  }
  Pickle& Global(const std::string& module, const std::string& name) {
    return Op('c').Raw(module + "\n" + name + "\n");
  }
  Pickle& IntTuple(const std::vector<int64_t>& values) {
    Mark();
    for (int64_t v : values) Int(v);
    return Op('t');
  }
  // _rebuild_tensor_v2(persistent storage, offset, size, stride, False, OrderedDict()).
  Pickle& Tensor(const std::string& key, int64_t numel, int64_t offset,
                 const std::vector<int64_t>& size, const std::vector<int64_t>& stride,
                 const std::string& storage_type = "FloatStorage") {
    Global("torch._utils", "_rebuild_tensor_v2").Mark();
    Mark().Str("storage").Global("torch", storage_type).Str(key).Str("cpu").Int(numel).Op('t');
    Op('Q').Int(offset).IntTuple(size).IntTuple(stride).Op('\x89');
    Global("collections", "OrderedDict").Op(')').Op('R');
    return Op('t').Op('R');
  }
  const std::string& str() const { return s_; }

 private:
  Pickle& Le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) s_ += static_cast<char>(v >> (8 * i));
    return *this;
  }
  std::string s_;
};

// {name: tensor over storage "0" of `numel` floats}.
std::string OneTensorPickle(int64_t numel, int64_t offset, const std::vector<int64_t>& size,
                            const std::vector<int64_t>& stride) {
  Pickle p;
  p.Proto().Op('}').Mark().Str("w").Tensor("0", numel, offset, size, stride).Op('u').Stop();
  return p.str();
}

// Writes a torch.save-style archive with LibTorch's own zip writer.
void WriteArchive(const std::string& path, const std::string& pickle,
                  const std::map<std::string, std::string>& records) {
  caffe2::serialize::PyTorchStreamWriter writer(path);
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  for (const auto& [name, bytes] : records) writer.writeRecord(name, bytes.data(), bytes.size());
  writer.writeEndOfFile();
}

// A zip archive in which every size and offset goes through zip64 fields, as in checkpoints
// over 4 GiB (torch.save writes them only when needed), and whose data is not aligned.
// Without `crcs`, every CRC-32 is 0, as PyTorch writes after set_crc32_options(False).
std::string Zip64Archive(const std::vector<std::pair<std::string, std::string>>& records,
                         bool crcs = true) {
  auto le = [](std::string* out, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
  };
  std::string out = "x", central;  // One leading byte of padding misaligns everything.
  for (const auto& [name, data] : records) {
    const uint64_t local = out.size();
    const uint32_t crc = crcs ? Crc32(data.data(), data.size()) : 0;
    le(&out, 0x04034b50, 4);
    le(&out, 45, 2);  // Version needed.
    le(&out, 0, 2);   // Flags.
    le(&out, 0, 2);   // Stored.
    le(&out, 0, 4);   // Time, date.
    le(&out, crc, 4);
    le(&out, 0xFFFFFFFF, 4);
    le(&out, 0xFFFFFFFF, 4);
    le(&out, name.size(), 2);
    le(&out, 20, 2);
    out += name;
    le(&out, 1, 2);
    le(&out, 16, 2);
    le(&out, data.size(), 8);
    le(&out, data.size(), 8);
    out += data;

    le(&central, 0x02014b50, 4);
    le(&central, 45, 2);
    le(&central, 45, 2);
    le(&central, 0, 2);
    le(&central, 0, 2);
    le(&central, 0, 4);
    le(&central, crc, 4);
    le(&central, 0xFFFFFFFF, 4);
    le(&central, 0xFFFFFFFF, 4);
    le(&central, name.size(), 2);
    le(&central, 4 + 4 + 24, 2);  // An empty unknown extra field first, then zip64.
    le(&central, 0, 2);           // Comment.
    le(&central, 0, 2);           // Disk.
    le(&central, 0, 2);
    le(&central, 0, 4);
    le(&central, 0xFFFFFFFF, 4);
    central += name;
    le(&central, 0x5455, 2);
    le(&central, 0, 2);
    le(&central, 1, 2);
    le(&central, 24, 2);
    le(&central, data.size(), 8);
    le(&central, data.size(), 8);
    le(&central, local, 8);
  }
  const uint64_t cd_offset = out.size();
  out += central;
  const uint64_t z64 = out.size();
  le(&out, 0x06064b50, 4);
  le(&out, 44, 8);
  le(&out, 45, 2);
  le(&out, 45, 2);
  le(&out, 0, 4);
  le(&out, 0, 4);
  le(&out, records.size(), 8);
  le(&out, records.size(), 8);
  le(&out, central.size(), 8);
  le(&out, cd_offset, 8);
  le(&out, 0x07064b50, 4);
  le(&out, 0, 4);
  le(&out, z64, 8);
  le(&out, 1, 4);
  le(&out, 0x06054b50, 4);
  le(&out, 0, 4);
  le(&out, 0xFFFF, 2);
  le(&out, 0xFFFF, 2);
  le(&out, 0xFFFFFFFF, 4);
  le(&out, 0xFFFFFFFF, 4);
  le(&out, 0, 2);
  return out;
}

std::string Floats(int n) {
  std::string out(4 * n, '\0');
  for (int i = 0; i < n; ++i) {
    const float f = static_cast<float>(i);
    std::memcpy(&out[4 * i], &f, 4);
  }
  return out;
}

// The tensors core/io/testdata/make_fixtures.py saves, recomputed.
TensorMap FixtureDtypeTensors() {
  auto opts = [](at::ScalarType t) { return at::TensorOptions().dtype(t); };
  const at::Tensor half_src = at::arange(10, opts(at::kFloat)) / 4 - 1;
  return {
      {"f32", at::arange(12, opts(at::kFloat)).reshape({3, 4}) / 4},
      {"f64", at::arange(6, opts(at::kDouble)).reshape({2, 3}) / 8},
      {"f16", half_src.to(at::kHalf)},
      {"bf16", half_src.to(at::kBFloat16)},
      {"i64", at::arange(-3, 5, opts(at::kLong)) * int64_t{1000000007}},
      {"i32", at::arange(-4, 4, opts(at::kInt)) * 1000},
      {"i16", at::arange(-4, 4, opts(at::kShort)) * 100},
      {"i8", at::arange(-4, 4, opts(at::kChar))},
      {"u8", at::arange(0, 256, 37, opts(at::kByte))},
      {"bool", at::tensor(std::vector<uint8_t>{1, 0, 1, 1}).to(at::kBool)},
      {"scalar", at::scalar_tensor(3.5, opts(at::kFloat))},
      {"empty", at::zeros({0, 3}, opts(at::kFloat))},
  };
}

TEST(ReadTorchStateDictTest, GoldenCheckpointsMatchSafetensorsBitExactly) {
  for (const char* name : kGoldenCases) {
    SCOPED_TRACE(name);
    auto pth = ReadTorchStateDict(Golden(name, "lit_model.pth"));
    ASSERT_TRUE(pth.ok()) << pth.status();
    auto st = ReadSafetensors(Golden(name, "model.safetensors"));
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_EQ(pth->size(), st->size());
    for (const auto& [key, tensor] : *st) {
      ASSERT_EQ(pth->count(key), 1u) << key;
      ExpectBitEqual(pth->at(key), tensor, key);
      EXPECT_FALSE(pth->at(key).requires_grad());
    }
  }
}

TEST(ReadTorchStateDictTest, EveryDtypeMatchesPythonValues) {
  auto tensors = ReadTorchStateDict(Fixture("dtypes.pth"));
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  auto st = ReadSafetensors(Fixture("dtypes.safetensors"));
  ASSERT_TRUE(st.ok()) << st.status();
  const TensorMap expected = FixtureDtypeTensors();
  ASSERT_EQ(tensors->size(), expected.size());
  for (const auto& [name, tensor] : expected) {
    ASSERT_EQ(tensors->count(name), 1u) << name;
    ExpectBitEqual(tensors->at(name), tensor, name);
    ExpectBitEqual(tensors->at(name), st->at(name), name);
  }
}

TEST(ReadTorchStateDictTest, UnwrapsModelEntryOfTrainingCheckpoints) {
  // {"model": {...}, "iter_num": 7, "lr": 0.5, "list": [...], "optimizer": {...}, ...}
  auto tensors = ReadTorchStateDict(Fixture("wrapped.pth"));
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_EQ(tensors->size(), 2u);
  ExpectBitEqual(tensors->at("w"), at::arange(6, at::kFloat).reshape({2, 3}), "w");
  ExpectBitEqual(tensors->at("b"), at::ones({3}), "b");
}

TEST(ReadTorchStateDictTest, ViewsShareTheirStorageLikeTorchLoad) {
  auto tensors = ReadTorchStateDict(Fixture("views.pth"));
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  const at::Tensor base = at::arange(24, at::kFloat).reshape({4, 6});
  ExpectBitEqual(tensors->at("base"), base, "base");
  ExpectBitEqual(tensors->at("t"), base.t(), "t");
  ExpectBitEqual(tensors->at("slice"), base.slice(0, 1, 3).slice(1, 2, 5), "slice");
  ExpectBitEqual(tensors->at("row"), base[2], "row");
  ExpectBitEqual(tensors->at("flat"), base.view(-1), "flat");
  ExpectBitEqual(tensors->at("other_t"), at::arange(6, at::kFloat).reshape({2, 3}).t(), "other_t");
  EXPECT_FALSE(tensors->at("t").is_contiguous());
  EXPECT_FALSE(tensors->at("other_t").is_contiguous());
  EXPECT_EQ(tensors->at("row").storage_offset(), 12);
  // One storage for base and its views: a write through one shows through the others.
  const void* storage = tensors->at("base").storage().data();
  for (const char* name : {"t", "slice", "row", "flat"}) {
    EXPECT_EQ(tensors->at(name).storage().data(), storage) << name;
  }
  tensors->at("base").index_put_({1, 2}, -1.0f);
  EXPECT_EQ(tensors->at("t")[2][1].item<float>(), -1.0f);
  EXPECT_EQ(tensors->at("slice")[0][0].item<float>(), -1.0f);
  // The file is untouched (the mapping is copy-on-write).
  auto again = ReadTorchStateDict(Fixture("views.pth"));
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectBitEqual(again->at("base"), base, "base");
}

TEST(ReadTorchStateDictTest, ParametersAndProtocol4) {
  auto param = ReadTorchStateDict(Fixture("parameter.pth"));
  ASSERT_TRUE(param.ok()) << param.status();
  ExpectBitEqual(param->at("p"), at::arange(4, at::kFloat), "p");
  EXPECT_FALSE(param->at("p").requires_grad());
  auto proto4 = ReadTorchStateDict(Fixture("proto4.pth"));
  ASSERT_TRUE(proto4.ok()) << proto4.status();
  ExpectBitEqual(proto4->at("w"), at::arange(6, at::kFloat).reshape({2, 3}), "w");
  ExpectBitEqual(proto4->at("b"), at::ones({3}), "b");
}

TEST(ReadTorchStateDictTest, TensorsOutliveTheirSiblings) {
  at::Tensor kept;
  {
    auto tensors = ReadTorchStateDict(Golden("llama2", "lit_model.pth"));
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    kept = tensors->at("transformer.wte.weight");
  }
  auto st = ReadSafetensors(Golden("llama2", "model.safetensors"));
  ASSERT_TRUE(st.ok()) << st.status();
  ExpectBitEqual(kept, st->at("transformer.wte.weight"), "wte");
}

TEST(ReadTorchStateDictTest, NotStateDicts) {
  ExpectError(ReadTorchStateDict(Fixture("legacy.pth")), absl::StatusCode::kUnimplemented,
              Fixture("legacy.pth"), "legacy");
  ExpectError(ReadTorchStateDict(Fixture("bare_tensor.pth")), absl::StatusCode::kInvalidArgument,
              Fixture("bare_tensor.pth"), "not a state dict");
  ExpectError(ReadTorchStateDict(Fixture("dtypes.safetensors")), absl::StatusCode::kInvalidArgument,
              Fixture("dtypes.safetensors"), "zip");
}

TEST(ReadTorchStateDictTest, PathErrors) {
  const std::string missing = TempPath("does_not_exist.pth");
  ExpectError(ReadTorchStateDict(missing), absl::StatusCode::kNotFound, missing);
  const std::string dir = TempPath("a_directory");
  mkdir(dir.c_str(), 0755);
  ExpectError(ReadTorchStateDict(dir), absl::StatusCode::kFailedPrecondition, dir, "directory");
  const std::string empty = TempPath("empty.pth");
  WriteBytes(empty, "");
  ExpectError(ReadTorchStateDict(empty), absl::StatusCode::kInvalidArgument, empty);
}

TEST(ReadTorchStateDictTest, CraftedArchivesLoad) {
  const std::string path = TempPath("crafted.pth");
  WriteArchive(path, OneTensorPickle(6, 1, {2, 2}, {1, 2}), {{"data/0", Floats(6)}});
  auto tensors = ReadTorchStateDict(path);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  // Elements 1 + i + 2j of 0..5.
  ExpectBitEqual(tensors->at("w"), at::arange(1, 5, at::kFloat).reshape({2, 2}).t(), "w");

  // A huge memo index, DUP/POP, a plain DICT, LONG1 ints, and a byteorder record.
  Pickle p;
  p.Proto().Mark().Str("w").Op('r').Raw(std::string("\xff\xff\xff\xff", 4)).Op('2').Op('0');
  p.Tensor("0", 6, 0, {6}, {1}).Op('d').Stop();
  WriteArchive(path, p.str(), {{"data/0", Floats(6)}, {"byteorder", "little"}});
  tensors = ReadTorchStateDict(path);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ExpectBitEqual(tensors->at("w"), at::arange(6, at::kFloat), "w");

  // An empty view may start anywhere; a LONG1 8-byte offset.
  WriteArchive(path, OneTensorPickle(6, int64_t{1} << 40, {0, 3}, {3, 1}), {{"data/0", Floats(6)}});
  tensors = ReadTorchStateDict(path);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  EXPECT_EQ(tensors->at("w").sizes(), at::IntArrayRef({0, 3}));
}

TEST(ReadTorchStateDictTest, CraftedPicklesFailCleanly) {
  const std::string path = TempPath("hostile.pth");
  const std::map<std::string, std::string> data = {{"data/0", Floats(4)}};
  auto sd = [](const std::function<void(Pickle&)>& body) {
    Pickle p;
    p.Proto().Op('}').Mark();
    body(p);
    p.Op('u').Stop();
    return p.str();
  };
  struct Case {
    std::string pickle;
    absl::StatusCode code;
    std::string detail;
  } cases[] = {
      {Pickle().Proto().Global("os", "system").Stop().str(), absl::StatusCode::kUnimplemented,
       "'os.system'"},
      {Pickle().Proto().Op('\xff').str(), absl::StatusCode::kInvalidArgument, "0xff"},
      {Pickle().Proto().Raw("I1\n.").str(), absl::StatusCode::kUnimplemented, "INT"},
      {Pickle().Proto().Op('}').str(), absl::StatusCode::kInvalidArgument, "without STOP"},
      {Pickle().Proto().Op('s').Stop().str(), absl::StatusCode::kInvalidArgument, "underflow"},
      {Pickle().Proto().Op('.').str(), absl::StatusCode::kInvalidArgument, "underflow"},
      {Pickle().Proto().Op('}').Mark().Op('s').str(), absl::StatusCode::kInvalidArgument,
       "underflow"},  // SETITEM cannot reach below a MARK.
      {Pickle().Proto().Raw("h\x05").Stop().str(), absl::StatusCode::kInvalidArgument,
       "memo key 5"},
      {Pickle().Proto().Op('t').str(), absl::StatusCode::kInvalidArgument, "no MARK"},
      {Pickle().Proto().Raw(std::string(5000, '(')).str(), absl::StatusCode::kInvalidArgument,
       "nested"},
      {Pickle().Proto().Op('N').Raw(std::string(1100000, '2')).str(),
       absl::StatusCode::kInvalidArgument, "stack overflow"},
      {Pickle()
           .Proto()
           .Raw([] {
             std::string many;
             for (int i = 0; i < 1100000; ++i) many += "}0";  // Allocate a dict, drop it.
             return many;
           }())
           .str(),
       absl::StatusCode::kInvalidArgument, "more than 1048576 objects"},
      {Pickle().Raw(std::string("\x80\x09", 2)).str(), absl::StatusCode::kInvalidArgument,
       "protocol 9"},
      {Pickle().Proto().Raw(std::string("X\xff\xff\xff\x7f", 5)).str(),
       absl::StatusCode::kInvalidArgument, "truncated"},
      {Pickle().Proto().Raw(std::string("\x8a\x09", 2)).Raw(std::string(9, '\1')).str(),
       absl::StatusCode::kInvalidArgument, "exceeds int64"},
      {Pickle().Proto().Raw("ctorch\nFloatStorage").str(), absl::StatusCode::kInvalidArgument,
       "truncated"},
      {Pickle().Proto().Int(3).Stop().str(), absl::StatusCode::kInvalidArgument,
       "not a state dict"},
      {Pickle().Proto().Op('}').Op('N').Op('N').Op('s').Stop().str(),
       absl::StatusCode::kInvalidArgument, "key of type None"},
      {Pickle().Proto().Op('}').Op(']').Op('N').Op('s').Stop().str(),
       absl::StatusCode::kInvalidArgument, "unsupported dict key of type list"},
      {Pickle().Proto().Op('}').Str("x").Int(1).Op('s').Stop().str(),
       absl::StatusCode::kInvalidArgument, "'x' is a int, not a tensor"},
      {Pickle().Proto().Op('}').Str("\xff").Op('N').Op('s').Stop().str(),
       absl::StatusCode::kInvalidArgument, "UTF-8"},
      // A dict that contains itself: no crash, no leak, a clean error.
      {Pickle()
           .Proto()
           .Op('}')
           .Raw(std::string("q\x00", 2))
           .Str("self")
           .Raw(std::string("h\x00", 2))
           .Op('s')
           .Stop()
           .str(),
       absl::StatusCode::kInvalidArgument, "'self' is a dict"},
      {Pickle().Proto().Int(1).Op('}').Op('b').Stop().str(), absl::StatusCode::kInvalidArgument,
       "state of a int"},
      {Pickle().Proto().Op('N').Op(')').Op('R').str(), absl::StatusCode::kInvalidArgument,
       "calling a None"},
      {Pickle().Proto().Global("collections", "OrderedDict").Int(1).Op('R').str(),
       absl::StatusCode::kInvalidArgument, "not a tuple"},
      {Pickle().Proto().Global("collections", "OrderedDict").Int(1).Op('\x85').Op('R').str(),
       absl::StatusCode::kInvalidArgument, "takes 0 arguments"},
      {Pickle().Proto().Global("torch", "FloatStorage").Op(')').Op('R').str(),
       absl::StatusCode::kInvalidArgument, "calling torch.FloatStorage"},
      {Pickle().Proto().Op('N').Op('Q').str(), absl::StatusCode::kInvalidArgument, "persistent id"},
      {sd([](Pickle& p) { p.Str("w").Tensor("0", 5, 0, {5}, {1}); }),
       absl::StatusCode::kInvalidArgument, "holds 16 bytes"},
      {sd([](Pickle& p) { p.Str("w").Tensor("1", 4, 0, {4}, {1}); }),
       absl::StatusCode::kInvalidArgument, "hostile/data/1' is missing"},
      {sd([](Pickle& p) {
         p.Str("w").Tensor("0", 4, 1, {2, 2}, {2, 1});
       }),
       absl::StatusCode::kInvalidArgument, "reaches element 4 of a storage of 4"},
      {sd([](Pickle& p) {
         p.Str("w").Tensor("0", 4, 0, {int64_t{1} << 62, 4}, {1, 1});
       }),
       absl::StatusCode::kInvalidArgument, "overflows"},
      {sd([](Pickle& p) {
         p.Str("w").Tensor("0", 4, 0, {2, 2}, {-1, 1});
       }),
       absl::StatusCode::kInvalidArgument, "negative"},
      {sd([](Pickle& p) { p.Str("w").Tensor("0", 4, -1, {1}, {1}); }),
       absl::StatusCode::kInvalidArgument, "negative storage offset"},
      {sd([](Pickle& p) {
         p.Str("w").Tensor("0", 4, 0, {2, 2}, {1});
       }),
       absl::StatusCode::kInvalidArgument, "differ in rank"},
      {sd([](Pickle& p) {
         p.Str("a")
             .Tensor("0", 4, 0, {4}, {1})
             .Str("b")
             .Tensor("0", 2, 0, {2}, {1}, "DoubleStorage");
       }),
       absl::StatusCode::kInvalidArgument, "differing dtypes"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(absl::StrCat("case ", i, ": ", c.detail));
    WriteArchive(path, c.pickle, data);
    ExpectError(ReadTorchStateDict(path), c.code, path, c.detail);
  }
}

TEST(ReadTorchStateDictTest, ArchiveLevelErrors) {
  const std::string path = TempPath("archive.pth");
  // No data.pkl.
  {
    caffe2::serialize::PyTorchStreamWriter writer(path);
    writer.writeRecord("data/0", "abcd", 4);
    writer.writeEndOfFile();
  }
  ExpectError(ReadTorchStateDict(path), absl::StatusCode::kInvalidArgument, path, "data.pkl");
  // Big-endian data.
  WriteArchive(path, OneTensorPickle(4, 0, {4}, {1}),
               {{"data/0", Floats(4)}, {"byteorder", "big"}});
  ExpectError(ReadTorchStateDict(path), absl::StatusCode::kUnimplemented, path, "big");

  // Patch fields of a real file's central directory entries.
  const std::string original = ReadBytes(Fixture("views.pth"));
  const size_t eocd = original.rfind(std::string("PK\x05\x06", 4));
  ASSERT_NE(eocd, std::string::npos);
  uint32_t cd_offset;
  std::memcpy(&cd_offset, &original[eocd + 16], 4);
  ASSERT_EQ(original.compare(cd_offset, 4, std::string("PK\x01\x02", 4)), 0);
  auto patched = [&](size_t at, const std::string& bytes, const std::string& base = "") {
    std::string out = base.empty() ? original : base;
    out.replace(at, bytes.size(), bytes);
    return out;
  };
  // torch.save always ends with zip64 records (which take precedence): a locator 20 bytes
  // before the classic end record points at the zip64 end record.
  const size_t locator = eocd - 20;
  ASSERT_EQ(original.compare(locator, 4, std::string("PK\x06\x07", 4)), 0);
  uint64_t z64;
  std::memcpy(&z64, &original[locator + 8], 8);
  ASSERT_EQ(original.compare(z64, 4, std::string("PK\x06\x06", 4)), 0);
  const std::string no_locator = patched(locator, "XXXX");
  const size_t first = cd_offset;  // The data.pkl entry.
  struct Case {
    std::string bytes;
    absl::StatusCode code;
    const char* detail;
  } cases[] = {
      {patched(first + 10, std::string("\x08\x00", 2)), absl::StatusCode::kUnimplemented,
       "compressed"},
      {patched(first + 8, std::string("\x01\x00", 2)), absl::StatusCode::kUnimplemented,
       "encrypted"},
      {patched(first + 20, std::string("\xf0\xff\xff\x7f\xf0\xff\xff\x7f", 8)),
       absl::StatusCode::kInvalidArgument, "runs past"},
      {patched(first + 20, std::string("\x01\x00\x00\x00", 4)), absl::StatusCode::kInvalidArgument,
       "differing sizes"},
      {patched(first + 42, std::string("\xff\xff\xff\x7f", 4)), absl::StatusCode::kInvalidArgument,
       "local header"},
      {patched(first + 20, std::string("\xff\xff\xff\xff", 4)), absl::StatusCode::kInvalidArgument,
       "zip64 field"},  // Saturated, but no zip64 extra field to hold the real value.
      {patched(first, "XXXX"), absl::StatusCode::kInvalidArgument, "central directory entry 0"},
      {patched(z64 + 32, std::string("\xff\x00", 2)), absl::StatusCode::kInvalidArgument,
       "cannot fit"},
      {patched(z64 + 48, std::string("\xff\xff\xff\x00", 4)), absl::StatusCode::kInvalidArgument,
       "outside the file"},
      {patched(z64 + 40, std::string("\xff\xff\xff\xff\xff\xff\xff\xff", 8)),
       absl::StatusCode::kInvalidArgument, "outside the file"},
      {patched(z64, "XXXX"), absl::StatusCode::kInvalidArgument, "bad zip64"},
      {patched(locator + 8, std::string("\xff\xff\xff\xff\xff\xff\xff\xff", 8)),
       absl::StatusCode::kInvalidArgument, "bad zip64"},
      // Without the locator the classic record is used.
      {patched(eocd + 10, std::string("\xff\x00", 2), no_locator),
       absl::StatusCode::kInvalidArgument, "cannot fit"},
      {patched(eocd + 16, std::string("\xff\xff\xff\x00", 4), no_locator),
       absl::StatusCode::kInvalidArgument, "outside the file"},
      {patched(eocd + 16, std::string("\xff\xff\xff\xff", 4), no_locator),
       absl::StatusCode::kInvalidArgument, "zip64"},
      {patched(eocd + 4, std::string("\x01\x00", 2)), absl::StatusCode::kInvalidArgument,
       "multi-disk"},
      {patched(eocd, "XXXX"), absl::StatusCode::kInvalidArgument, "end-of-central-directory"},
      {original + "trailing", absl::StatusCode::kInvalidArgument, "end-of-central-directory"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(absl::StrCat("case ", i, ": ", c.detail));
    WriteBytes(path, c.bytes);
    ExpectError(ReadTorchStateDict(path), c.code, path, c.detail);
  }
  // The classic end record alone describes the same archive.
  WriteBytes(path, no_locator);
  auto tensors = ReadTorchStateDict(path);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  EXPECT_EQ(tensors->size(), 6u);
}

TEST(ReadTorchStateDictTest, Zip64ArchiveWithMisalignedRecords) {
  std::vector<std::pair<std::string, std::string>> records;
  {
    caffe2::serialize::PyTorchStreamReader reader(Fixture("views.pth"));
    for (const std::string& name : reader.getAllRecords()) {
      at::DataPtr ptr;
      size_t size;
      std::tie(ptr, size) = reader.getRecord(name);
      records.emplace_back("big/" + name, std::string(static_cast<const char*>(ptr.get()), size));
    }
  }
  const std::string path = TempPath("zip64.pth");
  WriteBytes(path, Zip64Archive(records));
  auto tensors = ReadTorchStateDict(path);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  auto expected = ReadTorchStateDict(Fixture("views.pth"));
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_EQ(tensors->size(), expected->size());
  for (const auto& [name, tensor] : *expected) {
    ExpectBitEqual(tensors->at(name), tensor, name);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(tensors->at(name).data_ptr()) % 4, 0u) << name;
  }
  // Shared storages stay shared even when copied for alignment.
  EXPECT_EQ(tensors->at("t").storage().data(), tensors->at("base").storage().data());

  // Written without checksums (every CRC-32 0, as PyTorch's set_crc32_options(False) does):
  // nothing to verify, so it loads, even with damaged data.
  WriteBytes(path, Zip64Archive(records, /*crcs=*/false));
  tensors = ReadTorchStateDict(path);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ExpectBitEqual(tensors->at("base"), expected->at("base"), "base");
}

// Offset of the bytes of `needle` in `haystack`, which must hold them exactly once.
size_t FindOnce(const std::string& haystack, const std::string& needle) {
  const size_t at = haystack.find(needle);
  EXPECT_NE(at, std::string::npos);
  EXPECT_EQ(haystack.find(needle, at + 1), std::string::npos) << "found twice";
  return at;
}

std::string Bytes(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
}

// The case: 40 bytes flipped inside one tensor's record of a lit_model.pth.
TEST(ReadTorchStateDictTest, FlippedTensorBytesFailTheCrcNamingTheTensor) {
  const TensorMap written = {
      {"transformer.h.0.attn.qkv.weight", at::arange(256, at::kFloat).reshape({16, 16}) / 7},
      {"transformer.h.0.norm_1.weight", at::arange(16, at::kFloat) + 1000},
      {"transformer.wte.weight", at::arange(64, at::kFloat) - 3000},
  };
  const std::string path = TempPath("flipped_tensor.pth");
  ASSERT_TRUE(WriteTorchStateDict(path, written).ok());
  ASSERT_TRUE(ReadTorchStateDict(path).ok());
  std::string bytes = ReadBytes(path);
  const std::string target = Bytes(written.at("transformer.h.0.attn.qkv.weight"));
  const size_t at = FindOnce(bytes, target) + 100;
  for (size_t i = 0; i < 40; ++i) bytes[at + i] = static_cast<char>(~bytes[at + i]);
  WriteBytes(path, bytes);

  const absl::StatusOr<TensorMap> failed = ReadTorchStateDict(path);
  ExpectError(failed, absl::StatusCode::kDataLoss, path,
              "(tensor transformer.h.0.attn.qkv.weight) fails its CRC-32 check (stored 0x");
  EXPECT_NE(failed.status().message().find("record archive/data/"), std::string::npos)
      << failed.status();
  EXPECT_NE(failed.status().message().find("corrupt or was modified"), std::string::npos);

  // Unverified, the file loads and the flipped bytes show.
  const absl::StatusOr<TensorMap> loaded = ReadTorchStateDict(path, /*verify_checksums=*/false);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::string got = Bytes(loaded->at("transformer.h.0.attn.qkv.weight"));
  ASSERT_EQ(got.size(), target.size());
  for (size_t i = 0; i < target.size(); ++i) {
    EXPECT_EQ(got[i], i >= 100 && i < 140 ? static_cast<char>(~target[i]) : target[i]) << i;
  }
  ExpectBitEqual(loaded->at("transformer.wte.weight"), written.at("transformer.wte.weight"), "wte");

  // The APIs above name their own option.
  const absl::Status named = WithVerifyChecksumsOption(failed.status(), "Opts.verify");
  EXPECT_EQ(named.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(named.message(), absl::StrCat(failed.status().message(),
                                          "; set Opts.verify = false to load it anyway"));
  const absl::Status other = absl::InvalidArgumentError("x");
  EXPECT_EQ(WithVerifyChecksumsOption(other, "Opts.verify"), other);
}

// A failed check carries the option that skips it, so a tool names its flag and the facade its
// own option (core/base/status_field.h).
TEST(ReadTorchStateDictTest, TheVerifyOptionTravelsWithAFailedCheck) {
  const absl::Status named =
      WithVerifyChecksumsOption(absl::DataLossError("x: fails its CRC-32 check"), "Opts.verify");
  EXPECT_EQ(ErrorField(named), "Opts.verify");
  EXPECT_EQ(ErrorField(WithVerifyChecksumsOption(absl::InvalidArgumentError("x"), "Opts.verify")),
            std::nullopt);
}

TEST(ReadTorchStateDictTest, DamagedPickleFailsItsCrcBeforeBeingInterpreted) {
  const std::string path = TempPath("flipped_pickle.pth");
  ASSERT_TRUE(WriteTorchStateDict(path, {{"some.weight", at::ones({4})}}).ok());
  std::string bytes = ReadBytes(path);
  bytes[FindOnce(bytes, "some.weight")] = 'S';
  WriteBytes(path, bytes);
  ExpectError(ReadTorchStateDict(path), absl::StatusCode::kDataLoss, path,
              "record archive/data.pkl fails its CRC-32 check");
  const absl::StatusOr<TensorMap> loaded = ReadTorchStateDict(path, /*verify_checksums=*/false);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->count("Some.weight"), 1u);
}

// A Python-written file (real CRCs from torch.save): a storage that five tensors view is
// checked once and named by its tensors; a CRC field zeroed among real ones is a mismatch.
TEST(ReadTorchStateDictTest, SharedStorageNamesItsTensors) {
  const std::string original = ReadBytes(Fixture("views.pth"));
  const std::string path = TempPath("flipped_views.pth");
  std::string bytes = original;
  bytes[FindOnce(bytes, Bytes(at::arange(24, at::kFloat))) + 50] ^= 0x10;
  WriteBytes(path, bytes);
  ExpectError(ReadTorchStateDict(path), absl::StatusCode::kDataLoss, path,
              "(tensors base, flat, row and 2 more) fails its CRC-32 check");
  ASSERT_TRUE(ReadTorchStateDict(path, /*verify_checksums=*/false).ok());

  // The central directory entry of the other storage (other_t's), its CRC field set to 0.
  const size_t eocd = original.rfind(std::string("PK\x05\x06", 4));
  ASSERT_NE(eocd, std::string::npos);
  uint32_t cd_offset;
  std::memcpy(&cd_offset, &original[eocd + 16], 4);
  const std::string other_data = Bytes(at::arange(6, at::kFloat));
  bytes = original;
  size_t entries = 0;
  for (size_t p = cd_offset; original.compare(p, 4, std::string("PK\x01\x02", 4)) == 0;) {
    uint16_t name_len, extra_len, comment_len;
    uint32_t size, local;
    std::memcpy(&size, &original[p + 20], 4);
    std::memcpy(&name_len, &original[p + 28], 2);
    std::memcpy(&extra_len, &original[p + 30], 2);
    std::memcpy(&comment_len, &original[p + 32], 2);
    std::memcpy(&local, &original[p + 42], 4);
    uint16_t local_name, local_extra;
    std::memcpy(&local_name, &original[local + 26], 2);
    std::memcpy(&local_extra, &original[local + 28], 2);
    const size_t data = local + 30 + local_name + local_extra;
    if (size == other_data.size() && original.compare(data, size, other_data) == 0) {
      bytes.replace(p + 16, 4, std::string(4, '\0'));
      ++entries;
    }
    p += 46 + name_len + extra_len + comment_len;
  }
  ASSERT_EQ(entries, 1u);
  WriteBytes(path, bytes);
  ExpectError(ReadTorchStateDict(path), absl::StatusCode::kDataLoss, path,
              "(tensor other_t) fails its CRC-32 check (stored 0x00000000, computed 0x");
}

TEST(ReadTorchStateDictTest, EveryTruncationIsAnError) {
  const std::string original = ReadBytes(Golden("llama2", "lit_model.pth"));
  const std::string path = TempPath("truncated.pth");
  WriteBytes(path, original);
  // Shrink one file in place: every length near both ends (local headers and data.pkl at the
  // start, the central directory at the end), a stride in between.
  int checked = 0;
  for (uint64_t len = original.size(); len-- > 0;) {
    if (len > 4096 && len + 4096 < original.size() && len % 499 != 0) continue;
    ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(len)), 0);
    ExpectError(ReadTorchStateDict(path), absl::StatusCode::kInvalidArgument, path);
    ++checked;
  }
  EXPECT_GT(checked, 8000);
}

void RandomBitFlips(bool verify) {
  std::mt19937 rng(1234);
  const std::string original = ReadBytes(Golden("llama2", "lit_model.pth"));
  const absl::StatusOr<TensorMap> expected = ReadTorchStateDict(Golden("llama2", "lit_model.pth"));
  ASSERT_TRUE(expected.ok()) << expected.status();
  const size_t eocd = original.rfind(std::string("PK\x05\x06", 4));
  ASSERT_NE(eocd, std::string::npos);
  uint32_t cd_offset;
  std::memcpy(&cd_offset, &original[eocd + 16], 4);
  const std::string path = TempPath("flipped.pth");
  int ok = 0, failed = 0;
  for (int trial = 0; trial < 500; ++trial) {
    std::string bytes = original;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) {
      size_t at;
      switch (rng() % 3) {
        case 0:
          at = rng() % 2900;
          break;  // Local header and data.pkl.
        case 1:
          at = cd_offset + rng() % (original.size() - cd_offset);
          break;
        default:
          at = rng() % original.size();
      }
      bytes[at] ^= static_cast<char>(1 << (rng() % 8));
    }
    WriteBytes(path, bytes);
    auto tensors = ReadTorchStateDict(path, verify);
    if (tensors.ok()) {
      ++ok;
      TouchAll(*tensors);
      if (verify) {
        ASSERT_EQ(tensors->size(), expected->size());
        for (const auto& [name, tensor] : *expected) ExpectBitEqual(tensors->at(name), tensor, name);
      }
    } else {
      ++failed;
      EXPECT_NE(tensors.status().message().find(path), std::string::npos) << tensors.status();
    }
  }
  if (!verify) {
    EXPECT_GT(ok, 0);
  }
  EXPECT_GT(failed, 0);
  std::cout << (verify ? "verified: " : "unverified: ") << ok << " flipped files loaded, "
            << failed << " rejected\n";
}

// Unverified, flips reach the zip and pickle parsers; verified, whatever loads despite the
// flips (they hit only bytes no check covers and nothing reads) is exactly the original.
TEST(ReadTorchStateDictTest, RandomBitFlipsOfTheFileNeverCrash) {
  for (const bool verify : {false, true}) {
    SCOPED_TRACE(verify ? "verified" : "unverified");
    RandomBitFlips(verify);
  }
}

// Mutates only data.pkl and repacks it with valid zip structure, so that every mutation
// reaches the pickle interpreter.
TEST(ReadTorchStateDictTest, PickleMutationsNeverCrash) {
  for (const std::string& source :
       {Fixture("wrapped.pth"), Fixture("views.pth"), Fixture("dtypes.pth")}) {
    SCOPED_TRACE(source);
    std::string pickle;
    std::map<std::string, std::string> records;
    {
      caffe2::serialize::PyTorchStreamReader reader(source);
      for (const std::string& name : reader.getAllRecords()) {
        at::DataPtr ptr;
        size_t size;
        std::tie(ptr, size) = reader.getRecord(name);
        std::string bytes(static_cast<const char*>(ptr.get()), size);
        if (name == "data.pkl") {
          pickle = bytes;
        } else if (name.rfind("data/", 0) == 0) {
          records[name] = bytes;
        }
      }
    }
    ASSERT_FALSE(pickle.empty());
    const std::string path = TempPath("mutated.pth");

    // Every proper prefix of the pickle lacks its STOP.
    for (size_t len = 0; len < pickle.size(); ++len) {
      WriteArchive(path, pickle.substr(0, len), records);
      ExpectError(ReadTorchStateDict(path), absl::StatusCode::kInvalidArgument, path);
    }
    WriteArchive(path, pickle, records);
    ASSERT_TRUE(ReadTorchStateDict(path).ok());

    std::mt19937 rng(99);
    int ok = 0, failed = 0;
    for (int trial = 0; trial < 500; ++trial) {
      std::string bytes = pickle;
      const int edits = 1 + static_cast<int>(rng() % 3);
      for (int e = 0; e < edits; ++e) {
        const size_t at = rng() % bytes.size();
        switch (rng() % 4) {
          case 0:
            bytes[at] ^= static_cast<char>(1 << (rng() % 8));
            break;
          case 1:
            bytes[at] = static_cast<char>(rng());
            break;
          case 2:
            bytes.erase(at, 1 + rng() % 4);
            break;
          default:
            bytes.insert(at, 1, "(}]).tsuqhRQbK\x85\x86\x88"[rng() % 18]);
        }
        if (bytes.empty()) bytes = ".";
      }
      WriteArchive(path, bytes, records);
      auto tensors = ReadTorchStateDict(path);
      if (tensors.ok()) {
        ++ok;
        TouchAll(*tensors);
      } else {
        ++failed;
        EXPECT_NE(tensors.status().message().find(path), std::string::npos) << tensors.status();
      }
    }
    EXPECT_GT(failed, 0);
    std::cout << source << ": " << ok << " mutated pickles loaded, " << failed << " rejected\n";
  }
}

}  // namespace
}  // namespace lgpt
