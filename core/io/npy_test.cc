// Tests for the .npy reader and writer: NumPy-written files, round trips, and hostile input
// (truncations, header mutations, random bit flips), which must give clean errors.
#include "core/io/npy.h"

#include <sys/stat.h>

#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

const char* const kGoldenCases[] = {"llama2", "llama2_lora", "llama3_gqa", "pythia"};

std::string Fixture(const std::string& name) { return "core/io/testdata/" + name; }

std::string TempPath(const std::string& name) {
  return absl::StrCat(testing::TempDir(), "/npy_test_", name);
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

// A .npy file with the given header text (padded like NumPy's) and data bytes.
std::string NpyBytes(const std::string& dict, const std::string& data, int major = 1) {
  std::string header = dict;
  const size_t prefix = major == 1 ? 10 : 12;
  header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back(0);
  for (size_t i = 0; i < prefix - 8; ++i)
    out.push_back(static_cast<char>(header.size() >> (8 * i)));
  return out + header + data;
}

// Expects `status` to be an error with `code` whose message names `path` (and `detail`).
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

void ExpectSame(const at::Tensor& actual, const at::Tensor& expected) {
  ASSERT_TRUE(actual.defined());
  EXPECT_EQ(actual.scalar_type(), expected.scalar_type());
  EXPECT_EQ(actual.sizes(), expected.sizes());
  EXPECT_TRUE(actual.is_contiguous());
  EXPECT_TRUE(at::equal(actual, expected)) << actual << "\nvs\n" << expected;
}

TEST(ReadNpyTest, GoldenFiles) {
  for (const char* name : kGoldenCases) {
    SCOPED_TRACE(name);
    const std::string dir = absl::StrCat("tests/testdata/golden/", name, "/");
    auto tokens = ReadNpy(dir + "tokens.npy");
    auto prompt = ReadNpy(dir + "prompt.npy");
    auto greedy = ReadNpy(dir + "greedy.npy");
    auto logits = ReadNpy(dir + "logits.npy");
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    ASSERT_TRUE(prompt.ok()) << prompt.status();
    ASSERT_TRUE(greedy.ok()) << greedy.status();
    ASSERT_TRUE(logits.ok()) << logits.status();
    EXPECT_EQ(tokens->scalar_type(), at::kLong);
    EXPECT_EQ(tokens->sizes(), at::IntArrayRef({20}));
    EXPECT_EQ(prompt->sizes(), at::IntArrayRef({8}));
    EXPECT_EQ(greedy->sizes(), at::IntArrayRef({12}));
    EXPECT_EQ(logits->scalar_type(), at::kFloat);
    ASSERT_EQ(logits->dim(), 2);
    EXPECT_EQ(logits->size(0), 20);
    // The prompt is the first P tokens.
    EXPECT_TRUE(at::equal(*prompt, tokens->slice(0, 0, 8)));
    EXPECT_TRUE(at::isfinite(*logits).all().item<bool>());
  }
}

TEST(ReadNpyTest, NumpyWrittenFixtures) {
  auto f4 = at::TensorOptions().dtype(at::kFloat);
  struct Case {
    const char* file;
    at::Tensor expected;
  } cases[] = {
      {"fortran_f4.npy", at::arange(6, f4).reshape({2, 3})},
      {"v2_i2.npy", at::arange(-3, 3, at::TensorOptions().dtype(at::kShort))},
      {"v3_u1.npy", at::arange(0, 256, 51, at::TensorOptions().dtype(at::kByte)).reshape({2, 3})},
      {"scalar_f8.npy", at::scalar_tensor(2.25, at::TensorOptions().dtype(at::kDouble))},
      {"bool.npy", at::eye(2, at::TensorOptions().dtype(at::kBool))},
      {"f16.npy", (at::arange(5, f4) / 4 - 1).to(at::kHalf)},
      {"i1.npy", at::arange(-4, 4, at::TensorOptions().dtype(at::kChar))},
      {"i4_3d.npy", at::arange(24, at::TensorOptions().dtype(at::kInt)).reshape({2, 3, 4})},
      {"empty_f4.npy", at::zeros({0, 5}, f4)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file);
    auto tensor = ReadNpy(Fixture(c.file));
    ASSERT_TRUE(tensor.ok()) << tensor.status();
    ExpectSame(*tensor, c.expected);
  }
  ExpectError(ReadNpy(Fixture("big_endian.npy")), absl::StatusCode::kUnimplemented,
              Fixture("big_endian.npy"), "big-endian");
}

TEST(WriteNpyTest, RoundTripsEveryDtype) {
  const std::vector<at::Tensor> tensors = {
      at::randn({7, 33}),
      at::randn({3, 4, 5}, at::TensorOptions().dtype(at::kDouble)),
      at::randn({9}).to(at::kHalf),
      at::arange(-50, 50, at::TensorOptions().dtype(at::kLong)) * int64_t{123456789012},
      at::arange(-5, 5, at::TensorOptions().dtype(at::kInt)),
      at::arange(-5, 5, at::TensorOptions().dtype(at::kShort)),
      at::arange(-5, 5, at::TensorOptions().dtype(at::kChar)),
      at::arange(0, 250, 7, at::TensorOptions().dtype(at::kByte)),
      at::rand({4, 4}) > 0.5,
      at::scalar_tensor(1.5),
      at::zeros({0, 3}),
      at::arange(12.).reshape({3, 4}).t(),  // Non-contiguous: written in C order.
  };
  for (size_t i = 0; i < tensors.size(); ++i) {
    SCOPED_TRACE(i);
    const std::string path = TempPath(absl::StrCat("roundtrip_", i, ".npy"));
    ASSERT_TRUE(WriteNpy(path, tensors[i]).ok());
    const std::string bytes = ReadBytes(path);
    ASSERT_GE(bytes.size(), 10u);
    EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
    const size_t header_len =
        static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
    EXPECT_EQ((10 + header_len) % 64, 0u);
    EXPECT_EQ(bytes[10 + header_len - 1], '\n');
    auto back = ReadNpy(path);
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSame(*back, tensors[i].contiguous());
  }
}

TEST(WriteNpyTest, HeaderIsWhatNumpyWrites) {
  const std::string path = TempPath("header.npy");
  ASSERT_TRUE(WriteNpy(path, at::zeros({20, 256})).ok());
  const std::string bytes = ReadBytes(path);
  const std::string expected = "{'descr': '<f4', 'fortran_order': False, 'shape': (20, 256), }";
  EXPECT_EQ(bytes.substr(10, expected.size()), expected);
  ASSERT_TRUE(WriteNpy(path, at::zeros({5}, at::TensorOptions().dtype(at::kLong))).ok());
  EXPECT_NE(ReadBytes(path).find("'shape': (5,), }"), std::string::npos);
  ASSERT_TRUE(WriteNpy(path, at::scalar_tensor(true, at::TensorOptions().dtype(at::kBool))).ok());
  EXPECT_NE(ReadBytes(path).find("{'descr': '|b1', 'fortran_order': False, 'shape': (), }"),
            std::string::npos);
}

TEST(WriteNpyTest, RejectsWhatNumpyCannotHold) {
  const std::string path = TempPath("rejected.npy");
  ExpectError(WriteNpy(path, at::zeros({2}, at::kBFloat16)), absl::StatusCode::kInvalidArgument,
              path, "BFloat16");
  ExpectError(WriteNpy(path, at::Tensor()), absl::StatusCode::kInvalidArgument, path, "undefined");
  const std::string missing_dir = TempPath("no/such/dir/x.npy");
  ExpectError(WriteNpy(missing_dir, at::zeros({2})), absl::StatusCode::kNotFound, missing_dir);
}

TEST(ReadNpyTest, PathErrors) {
  const std::string missing = TempPath("does_not_exist.npy");
  ExpectError(ReadNpy(missing), absl::StatusCode::kNotFound, missing);
  const std::string dir = TempPath("a_directory");
  mkdir(dir.c_str(), 0755);
  ExpectError(ReadNpy(dir), absl::StatusCode::kFailedPrecondition, dir, "directory");
  const std::string fifo = TempPath("a_fifo");
  mkfifo(fifo.c_str(), 0644);
  ExpectError(ReadNpy(fifo), absl::StatusCode::kFailedPrecondition, fifo, "regular");
  const std::string empty = TempPath("empty.npy");
  WriteBytes(empty, "");
  ExpectError(ReadNpy(empty), absl::StatusCode::kInvalidArgument, empty);
}

TEST(ReadNpyTest, EveryTruncationAndExtensionIsAnError) {
  for (const std::string& source : {Fixture("i4_3d.npy"), Fixture("scalar_f8.npy"),
                                    std::string("tests/testdata/golden/llama2/tokens.npy")}) {
    const std::string bytes = ReadBytes(source);
    ASSERT_FALSE(bytes.empty()) << source;
    const std::string path = TempPath("truncated.npy");
    for (size_t len = 0; len < bytes.size(); ++len) {
      WriteBytes(path, bytes.substr(0, len));
      ExpectError(ReadNpy(path), absl::StatusCode::kInvalidArgument, path);
    }
    WriteBytes(path, bytes + "x");
    ExpectError(ReadNpy(path), absl::StatusCode::kInvalidArgument, path, "holds");
  }
}

TEST(ReadNpyTest, MalformedHeaders) {
  const std::string path = TempPath("malformed.npy");
  const std::string f4x2(8, '\0');
  struct Case {
    std::string bytes;
    absl::StatusCode code;
    const char* detail;
  } cases[] = {
      {std::string("\x93NUMPZ\x01\x00", 8) + NpyBytes("{}", "").substr(8),
       absl::StatusCode::kInvalidArgument, "magic"},
      {"\x93NUMPY\x04" +
           NpyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", f4x2).substr(7),
       absl::StatusCode::kUnimplemented, "version 4.0"},
      {std::string("\x93NUMPY\x01\x00\xff\xff{}", 12), absl::StatusCode::kInvalidArgument,
       "runs past"},
      {std::string("\x93NUMPY\x02\x00\xff\xff\xff\xff{}", 14), absl::StatusCode::kInvalidArgument,
       "exceeds the limit"},
      {NpyBytes("{'descr': '<f4', 'shape': (2,), }", f4x2), absl::StatusCode::kInvalidArgument,
       "lacks"},
      {NpyBytes("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", f4x2),
       absl::StatusCode::kInvalidArgument, "duplicate"},
      {NpyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", f4x2),
       absl::StatusCode::kInvalidArgument, "unexpected key"},
      {NpyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", f4x2),
       absl::StatusCode::kInvalidArgument, "non-negative"},
      {NpyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2.0,), }", f4x2),
       absl::StatusCode::kInvalidArgument, "shape"},
      {NpyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }",
                f4x2),
       absl::StatusCode::kInvalidArgument, "overflows"},
      {NpyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
                f4x2),
       absl::StatusCode::kInvalidArgument, "overflows"},
      {NpyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4294967296, "
                "4294967296), }",
                ""),
       absl::StatusCode::kInvalidArgument, "overflows"},
      {NpyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", f4x2),
       absl::StatusCode::kInvalidArgument, "needs 12"},
      {NpyBytes("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", f4x2),
       absl::StatusCode::kUnimplemented, "<c8"},
      {NpyBytes("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", f4x2),
       absl::StatusCode::kUnimplemented, "big-endian"},
      {NpyBytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", f4x2),
       absl::StatusCode::kInvalidArgument, "structured"},
      {NpyBytes("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,), }", f4x2),
       absl::StatusCode::kInvalidArgument, "fortran_order"},
      {NpyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", f4x2),
       absl::StatusCode::kInvalidArgument, "expected"},
      {NpyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } junk", f4x2),
       absl::StatusCode::kInvalidArgument, "trailing"},
      {NpyBytes("{'descr: '<f4', 'fortran_order': False, 'shape': (2,), }", f4x2),
       absl::StatusCode::kInvalidArgument, ""},
      {NpyBytes("['descr', '<f4']", f4x2), absl::StatusCode::kInvalidArgument, "'{'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.detail);
    WriteBytes(path, c.bytes);
    ExpectError(ReadNpy(path), c.code, path, c.detail);
  }
  // Sanity: the same helper makes valid files, including version 2.0 and fortran order.
  WriteBytes(path, NpyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", f4x2, 2));
  EXPECT_TRUE(ReadNpy(path).ok());
  WriteBytes(path, NpyBytes("{'fortran_order': True, 'shape': (2, 1), 'descr': '|u1'}", "ab"));
  auto bytes = ReadNpy(path);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->sizes(), at::IntArrayRef({2, 1}));
}

TEST(ReadNpyTest, BoolsAreNormalised) {
  const std::string path = TempPath("bools.npy");
  WriteBytes(path, NpyBytes("{'descr': '|b1', 'fortran_order': False, 'shape': (4,), }",
                            std::string("\x00\x01\x02\xff", 4)));
  auto tensor = ReadNpy(path);
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  ExpectSame(*tensor, at::tensor(std::vector<uint8_t>{0, 1, 1, 1}).to(at::kBool));
}

TEST(ReadNpyTest, RandomBitFlipsNeverCrash) {
  std::mt19937 rng(20240611);
  const std::string sources[] = {Fixture("i4_3d.npy"), Fixture("fortran_f4.npy"),
                                 Fixture("bool.npy"), "tests/testdata/golden/llama2/tokens.npy",
                                 "tests/testdata/golden/llama2/logits.npy"};
  const std::string path = TempPath("flipped.npy");
  int ok = 0, failed = 0;
  for (const std::string& source : sources) {
    const std::string original = ReadBytes(source);
    ASSERT_FALSE(original.empty()) << source;
    for (int trial = 0; trial < 500; ++trial) {
      std::string bytes = original;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) {
        // Mostly within the 128-byte prefix, where the structure is.
        const size_t limit = rng() % 4 == 0 ? bytes.size() : std::min<size_t>(bytes.size(), 128);
        bytes[rng() % limit] ^= static_cast<char>(1 << (rng() % 8));
      }
      WriteBytes(path, bytes);
      auto tensor = ReadNpy(path);
      if (tensor.ok()) {
        ++ok;
        // Touch every element.
        EXPECT_GE(tensor->numel(), 0);
        (void)tensor->to(at::kDouble).sum().item<double>();
      } else {
        ++failed;
        EXPECT_NE(tensor.status().message().find(path), std::string::npos) << tensor.status();
      }
    }
  }
  EXPECT_GT(ok, 0);
  EXPECT_GT(failed, 0);
}

}  // namespace
}  // namespace lgpt
