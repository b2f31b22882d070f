// Tests for the torch.save writer: bit-exact round trips through ReadTorchStateDict and
// LibTorch's own zip reader, Python's torch.load reading the files back equal (skipped, with
// a message, where /usr/bin/python3 has no torch), the zip64 end records, and rejections.
#include "core/io/torch_pickle_writer.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/io/torch_pickle.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

constexpr char kPython[] = "/usr/bin/python3";

std::string TempPath(const std::string& name) {
  return absl::StrCat(testing::TempDir(), "/torch_pickle_writer_test_", name);
}

void ExpectBitEqual(const at::Tensor& actual, const at::Tensor& expected, const std::string& name) {
  SCOPED_TRACE(name);
  ASSERT_TRUE(actual.defined());
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type());
  ASSERT_EQ(actual.sizes(), expected.sizes());
  const at::Tensor a = actual.contiguous(), e = expected.contiguous();
  EXPECT_EQ(std::memcmp(a.data_ptr(), e.data_ptr(), a.numel() * a.element_size()), 0);
}

// Every dtype the writer handles, with shapes that exercise each pickle int and tuple form
// (0-d, empty, rank 5, a dimension past 65535) and inputs that are not contiguous.
TensorMap EveryDtype() {
  at::manual_seed(7);
  TensorMap t;
  t["f32"] = at::randn({3, 5});
  t["f32.transposed"] = at::randn({4, 6}).t();  // Not contiguous.
  t["f32.slice"] = at::randn({8, 8}).slice(1, 2, 5);
  t["f32.scalar"] = at::full({}, -2.5f);
  t["f32.empty"] = at::empty({0, 3});
  t["f32.special"] = at::tensor({std::numeric_limits<float>::infinity(), -0.0f, 1e-40f, 3e38f});
  t["f64"] = at::randn({2, 3}, at::kDouble);
  t["f16"] = at::randn({7}).to(at::kHalf);
  t["bf16"] = at::randn({2, 2, 2, 2, 3}).to(at::kBFloat16);
  t["i64"] = at::tensor({int64_t{0}, int64_t{-1}, int64_t{1} << 40, int64_t{-(int64_t{1} << 53)}});
  t["i32"] = at::tensor({1, -70000, 2147483647}, at::kInt);
  t["i16"] = at::tensor({-32768, 5, 32767}, at::kShort);
  t["i8"] = at::randint(-128, 127, {70000}, at::kChar);
  t["u8"] = at::arange(0, 256, at::kByte).reshape({16, 16});
  t["bool"] = at::tensor({1, 0, 0, 1, 1}, at::kInt).to(at::kBool);
  t["model.layers.0.self_attn.q_proj.weight"] = at::randn({16, 16});
  return t;
}

TEST(WriteTorchStateDictTest, RoundTripsEveryDtypeBitExactly) {
  const TensorMap tensors = EveryDtype();
  const std::string path = TempPath("dtypes.pth");
  ASSERT_TRUE(WriteTorchStateDict(path, tensors).ok());
  auto read = ReadTorchStateDict(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    ASSERT_EQ(read->count(name), 1u) << name;
    const at::Tensor& back = read->at(name);
    ExpectBitEqual(back, tensor, name);
    EXPECT_TRUE(back.is_contiguous()) << name;
    // Records are 64-byte aligned, so the reader maps them without copying.
    if (back.numel() > 0 && back.scalar_type() != at::kBool) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(back.data_ptr()) % 64, 0u) << name;
    }
  }
}

TEST(WriteTorchStateDictTest, LibTorchZipReaderAgrees) {
  const TensorMap tensors = EveryDtype();
  const std::string path = TempPath("libtorch.pth");
  ASSERT_TRUE(WriteTorchStateDict(path, tensors).ok());
  caffe2::serialize::PyTorchStreamReader reader(path);
  EXPECT_EQ(reader.version(), 3u);
  std::vector<std::string> records = reader.getAllRecords();
  EXPECT_EQ(records.size(), tensors.size() + 3);  // data.pkl, byteorder, version.
  ASSERT_TRUE(reader.hasRecord("byteorder"));
  auto [order, order_size] = reader.getRecord("byteorder");
  EXPECT_EQ(std::string(static_cast<const char*>(order.get()), order_size), "little");
  int64_t key = 0;
  for (const auto& [name, tensor] : tensors) {
    const std::string record = absl::StrCat("data/", key++);
    ASSERT_TRUE(reader.hasRecord(record)) << record;
    EXPECT_EQ(reader.getRecordOffset(record) % 64, 0u) << record;
    auto [data, size] = reader.getRecord(record);
    const at::Tensor c = tensor.contiguous();
    ASSERT_EQ(size, static_cast<size_t>(c.numel() * c.element_size())) << name;
    EXPECT_EQ(size == 0 || std::memcmp(data.get(), c.data_ptr(), size) == 0, true) << name;
  }
}

// Runs `command`, returning its stdout and setting `status` to its exit status.
std::string RunCommand(const std::string& command, int* status) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    *status = -1;
    return out;
  }
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  *status = pclose(pipe);
  return out;
}

bool PythonHasTorch(std::string* why) {
  int status = 0;
  const std::string out =
      RunCommand(absl::StrCat(kPython, " -c 'import torch, zipfile' 2>&1"), &status);
  if (status != 0) *why = absl::StrCat(kPython, " cannot import torch: ", out);
  return status == 0;
}

// Prints, per tensor: name, dtype, shape, contiguity and its values (exact: floats as the
// repr of their float64 value, integers and bools as integers), tab-separated.
constexpr char kLoadScript[] = R"PY(
import sys, collections, zipfile, torch
path = sys.argv[1]
bad = zipfile.ZipFile(path).testzip()
assert bad is None, 'bad CRC in ' + str(bad)
sd = torch.load(path, map_location='cpu')
print(type(sd).__name__)
for k, t in sd.items():
    v = t.flatten()
    if t.dtype.is_floating_point:
        vals = v.double().tolist()
    elif t.dtype == torch.bool:
        vals = v.int().tolist()
    else:
        vals = v.tolist()
    print('\t'.join([k, str(t.dtype).replace('torch.', ''), ','.join(map(str, t.shape)),
                     str(t.is_contiguous()), ' '.join(repr(x) for x in vals)]))
)PY";

const char* PythonDtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    case at::kShort:
      return "int16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    default:
      return "?";
  }
}

TEST(WriteTorchStateDictTest, PythonTorchLoadReadsItBackEqual) {
  std::string why;
  if (!PythonHasTorch(&why)) GTEST_SKIP() << "SKIPPED, Python check not run: " << why;
  const TensorMap tensors = EveryDtype();
  const std::string path = TempPath("python.pth");
  const std::string script = TempPath("load.py");
  ASSERT_TRUE(WriteTorchStateDict(path, tensors).ok());
  {
    FILE* f = std::fopen(script.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(kLoadScript, f);
    std::fclose(f);
  }
  int status = 0;
  const std::string out =
      RunCommand(absl::StrCat(kPython, " ", script, " ", path, " 2>&1"), &status);
  ASSERT_EQ(status, 0) << out;
  std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), tensors.size() + 1) << out;
  EXPECT_EQ(lines[0], "OrderedDict");
  auto it = tensors.begin();  // Python keeps the written (sorted) order.
  for (size_t i = 1; i < lines.size(); ++i, ++it) {
    const std::vector<std::string> fields = absl::StrSplit(lines[i], '\t');
    ASSERT_EQ(fields.size(), 5u) << lines[i];
    const std::string& name = it->first;
    const at::Tensor& tensor = it->second;
    SCOPED_TRACE(name);
    EXPECT_EQ(fields[0], name);
    EXPECT_EQ(fields[1], PythonDtype(tensor.scalar_type()));
    std::vector<std::string> shape;
    for (int64_t d : tensor.sizes()) shape.push_back(absl::StrCat(d));
    EXPECT_EQ(fields[2], absl::StrJoin(shape, ","));
    EXPECT_EQ(fields[3], "True");
    const std::vector<std::string> values = absl::StrSplit(fields[4], ' ', absl::SkipEmpty());
    ASSERT_EQ(static_cast<int64_t>(values.size()), tensor.numel());
    const at::Tensor flat = tensor.contiguous().flatten();
    if (at::isFloatingType(tensor.scalar_type())) {
      const at::Tensor d = flat.to(at::kDouble);
      for (size_t j = 0; j < values.size(); ++j) {
        const double expected = d[j].item<double>();
        const double actual = std::strtod(values[j].c_str(), nullptr);
        EXPECT_TRUE(actual == expected && std::signbit(actual) == std::signbit(expected))
            << j << ": " << values[j] << " vs " << expected;
      }
    } else {
      const at::Tensor l = flat.to(at::kLong);
      for (size_t j = 0; j < values.size(); ++j) {
        int64_t actual = 0;
        ASSERT_TRUE(absl::SimpleAtoi(values[j], &actual)) << values[j];
        EXPECT_EQ(actual, l[j].item<int64_t>()) << j;
      }
    }
  }
}

// Over 65535 records: the zip64 end-of-central-directory records are needed.
TEST(WriteTorchStateDictTest, ManyRecordsUseZip64EndRecords) {
  TensorMap tensors;
  for (int i = 0; i < 66000; ++i) tensors[absl::StrCat("t", i)] = at::full({1}, i, at::kInt);
  const std::string path = TempPath("many.pth");
  ASSERT_TRUE(WriteTorchStateDict(path, tensors).ok());
  caffe2::serialize::PyTorchStreamReader reader(path);
  EXPECT_EQ(reader.getAllRecords().size(), tensors.size() + 3);
  auto [data, size] = reader.getRecord("data/65999");
  ASSERT_EQ(size, 4u);
  int32_t value;
  std::memcpy(&value, data.get(), 4);
  EXPECT_EQ(value, 9999);  // Keys follow the sorted names; "t9999" sorts last.
  auto read = ReadTorchStateDict(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), tensors.size());
  EXPECT_EQ(read->at("t12345").item<int32_t>(), 12345);
}

TEST(WriteTorchStateDictTest, Rejects) {
  const std::string path = TempPath("rejected.pth");
  auto expect = [&](const TensorMap& tensors, absl::StatusCode code, const std::string& detail,
                    const std::string& where) {
    const absl::Status status = WriteTorchStateDict(where, tensors);
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_NE(status.message().find(where), std::string::npos) << status;
    EXPECT_NE(status.message().find(detail), std::string::npos) << status;
    struct stat st;
    EXPECT_NE(stat(where.c_str(), &st), 0) << "nothing is left behind";
    EXPECT_NE(stat((where + ".partial").c_str(), &st), 0) << "nothing is left behind";
  };
  expect({{"a", at::Tensor()}}, absl::StatusCode::kInvalidArgument, "'a' is undefined", path);
  expect({{"c", at::zeros({2}, at::kComplexFloat)}}, absl::StatusCode::kInvalidArgument, "dtype",
         path);
  expect({{"\xff", at::zeros({2})}}, absl::StatusCode::kInvalidArgument, "UTF-8", path);
  expect({{"a", at::zeros({2})}}, absl::StatusCode::kNotFound, "cannot open",
         TempPath("no_such_dir/x.pth"));
}

// The old file stays intact for readers that have it mapped: the new one is renamed over it.
TEST(WriteTorchStateDictTest, OverwritingAMappedFileKeepsItsReadersWhole) {
  const std::string path = TempPath("overwrite.pth");
  const at::Tensor original = at::arange(0, 100000, at::kFloat);
  ASSERT_TRUE(WriteTorchStateDict(path, {{"w", original}}).ok());
  auto mapped = ReadTorchStateDict(path);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  ASSERT_TRUE(WriteTorchStateDict(path, {{"w", at::zeros({10})}}).ok());
  EXPECT_TRUE(at::equal(mapped->at("w"), original));  // Would fault or read zeros if truncated.
  auto reread = ReadTorchStateDict(path);
  ASSERT_TRUE(reread.ok()) << reread.status();
  EXPECT_TRUE(at::equal(reread->at("w"), at::zeros({10})));
  struct stat st;
  EXPECT_NE(stat((path + ".partial").c_str(), &st), 0) << "no partial file is left";
}

TEST(WriteTorchStateDictTest, EmptyDictRoundTrips) {
  const std::string path = TempPath("empty.pth");
  ASSERT_TRUE(WriteTorchStateDict(path, {}).ok());
  auto read = ReadTorchStateDict(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->empty());
}

}  // namespace
}  // namespace lgpt
