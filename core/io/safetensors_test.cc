// Tests for the safetensors reader and writer: golden checkpoints, a Python-written fixture,
// round trips, zero-copy lifetime, and hostile input (truncations, crafted headers, random
// bit flips), which must give clean errors.
#include "core/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
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

std::string Golden(const std::string& name) {
  return absl::StrCat("tests/testdata/golden/", name, "/model.safetensors");
}

std::string TempPath(const std::string& name) {
  return absl::StrCat(testing::TempDir(), "/safetensors_test_", name);
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

// A safetensors file with the given header text and data bytes.
std::string FileBytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t len = header.size();
  std::memcpy(out.data(), &len, 8);
  return out + header + data;
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

TEST(ReadSafetensorsTest, GoldenCheckpointsAreZeroCopyViews) {
  for (const char* name : kGoldenCases) {
    SCOPED_TRACE(name);
    const std::string path = Golden(name);
    auto header = ReadSafetensorsHeader(path);
    ASSERT_TRUE(header.ok()) << header.status();
    auto tensors = ReadSafetensors(path);
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    ASSERT_EQ(tensors->size(), header->tensors.size());
    EXPECT_GT(tensors->size(), 5u);
    EXPECT_EQ(tensors->count("transformer.wte.weight"), 1u);
    EXPECT_EQ(tensors->count("lm_head.weight") + tensors->count("lm_head.linear.weight"), 1u);
    const SafetensorsEntry& first = header->tensors.front();
    const char* base = static_cast<const char*>(tensors->at(first.name).data_ptr());
    for (const SafetensorsEntry& entry : header->tensors) {
      const at::Tensor& t = tensors->at(entry.name);
      EXPECT_EQ(entry.dtype, "F32");
      EXPECT_EQ(t.scalar_type(), at::kFloat);
      EXPECT_EQ(t.sizes(), at::IntArrayRef(entry.shape));
      EXPECT_TRUE(t.is_contiguous());
      // All tensors point into one mapping, at their offsets: nothing was copied.
      EXPECT_EQ(static_cast<const char*>(t.data_ptr()) - base,
                static_cast<int64_t>(entry.begin) - static_cast<int64_t>(first.begin))
          << entry.name;
      EXPECT_TRUE(at::isfinite(t).all().item<bool>()) << entry.name;
    }
  }
}

TEST(ReadSafetensorsTest, TensorsOutliveTheMapAndAreCopyOnWrite) {
  const std::string path = TempPath("lifetime.safetensors");
  WriteBytes(path, ReadBytes(Golden("llama2")));
  at::Tensor kept, copy;
  {
    auto tensors = ReadSafetensors(path);
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    kept = tensors->at("lm_head.weight");
    copy = kept.clone();
  }  // Every other tensor dies here; the mapping must stay for `kept`.
  EXPECT_TRUE(at::equal(kept, copy));
  kept.mul_(2);  // Writes go to private pages, not to the file.
  EXPECT_TRUE(at::equal(kept, copy * 2));
  auto again = ReadSafetensors(path);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(at::equal(again->at("lm_head.weight"), copy));
}

// A tensor's pages are given back (MappedFile::Release) when its last holder dies; pages it
// shares with a neighbour stay, so the survivors, modified in place or not, read the same.
TEST(ReadSafetensorsTest, ReleasingDeadTensorsKeepsTheSurvivorsWhole) {
  const std::string path = TempPath("release.safetensors");
  at::manual_seed(0);
  TensorMap written;
  // Odd sizes, so tensors share pages with their neighbours.
  for (const char* name : {"a", "b", "c", "d", "e"}) written.emplace(name, at::randn({3001}));
  ASSERT_TRUE(WriteSafetensors(path, written).ok());
  at::Tensor b, d;
  {
    auto tensors = ReadSafetensors(path);
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    b = tensors->at("b");
    d = tensors->at("d");
    d.add_(1);  // a private (copy-on-write) page beside released ones
    for (const char* name : {"a", "c"}) {
      const at::Tensor expected = written.at(name);
      EXPECT_TRUE(at::equal(tensors->at(name), expected));
    }
  }  // a, c and e die here: their whole pages are released.
  EXPECT_TRUE(at::equal(b, written.at("b")));
  EXPECT_TRUE(at::equal(d, written.at("d") + 1));
}

TEST(ReadSafetensorsTest, PythonWrittenFixtureWithMisalignedTensors) {
  const std::string path = "core/io/testdata/dtypes.safetensors";
  auto header = ReadSafetensorsHeader(path);
  ASSERT_TRUE(header.ok()) << header.status();
  auto tensors = ReadSafetensors(path);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  const TensorMap expected = FixtureDtypeTensors();
  ASSERT_EQ(tensors->size(), expected.size());
  int misaligned = 0;
  for (const SafetensorsEntry& entry : header->tensors) {
    const at::Tensor& t = tensors->at(entry.name);
    ExpectBitEqual(t, expected.at(entry.name), entry.name);
    if (entry.begin % t.element_size() != 0) ++misaligned;
    // Whatever the file offset, the data handed out is aligned for its dtype.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % t.element_size(), 0u) << entry.name;
  }
  EXPECT_GT(misaligned, 0);  // The fixture exercises the copying path.
}

TEST(WriteSafetensorsTest, RoundTripsEveryDtype) {
  TensorMap tensors = FixtureDtypeTensors();
  tensors["noncontiguous"] = at::arange(20.).reshape({4, 5}).t();
  tensors["random"] = at::randn({17, 3});
  tensors["odd_f16"] = at::randn({3}).to(at::kHalf);  // Odd byte sizes before aligned data.
  tensors["odd_u8"] = at::arange(5, at::TensorOptions().dtype(at::kByte));
  const std::string path = TempPath("roundtrip.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());

  const std::string bytes = ReadBytes(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
  const std::string text = bytes.substr(8, header_len);
  EXPECT_EQ(text.front(), '{');
  // Keys appear in sorted order.
  size_t last = 0;
  for (const auto& [name, tensor] : tensors) {
    const size_t at = text.find(absl::StrCat("\"", name, "\":"));
    ASSERT_NE(at, std::string::npos) << name;
    EXPECT_GT(at, last) << name;
    last = at;
  }

  auto header = ReadSafetensorsHeader(path);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  for (const SafetensorsEntry& entry : header->tensors) {
    const size_t elem = tensors.at(entry.name).element_size();
    EXPECT_EQ((header->data_offset + entry.begin) % elem, 0u) << entry.name;
  }
  auto back = ReadSafetensors(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), tensors.size());
  for (const auto& [name, tensor] : tensors) ExpectBitEqual(back->at(name), tensor, name);

  // Custom metadata, and an empty map.
  ASSERT_TRUE(WriteSafetensors(path, {}, {{"a", "b"}, {"format", "pt"}}).ok());
  header = ReadSafetensorsHeader(path);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_TRUE(header->tensors.empty());
  EXPECT_EQ(header->metadata.at("a"), "b");
}

TEST(WriteSafetensorsTest, Rejects) {
  const std::string path = TempPath("rejected.safetensors");
  ExpectError(WriteSafetensors(path, {{"x", at::Tensor()}}), absl::StatusCode::kInvalidArgument,
              path, "undefined");
  ExpectError(WriteSafetensors(path, {{"__metadata__", at::zeros({1})}}),
              absl::StatusCode::kInvalidArgument, path, "__metadata__");
  ExpectError(WriteSafetensors(path, {{"bad\xff", at::zeros({1})}}),
              absl::StatusCode::kInvalidArgument, path, "UTF-8");
  ExpectError(WriteSafetensors(path, {{"c", at::zeros({1}, at::kComplexFloat)}}),
              absl::StatusCode::kInvalidArgument, path, "dtype");
  ExpectError(WriteSafetensors(path, {}, {{"k", "\xc0\xaf"}}), absl::StatusCode::kInvalidArgument,
              path, "UTF-8");
  const std::string missing = TempPath("no/such/dir.safetensors");
  ExpectError(WriteSafetensors(missing, {}), absl::StatusCode::kNotFound, missing);
}

TEST(ReadSafetensorsTest, PathErrors) {
  const std::string missing = TempPath("does_not_exist.safetensors");
  ExpectError(ReadSafetensors(missing), absl::StatusCode::kNotFound, missing);
  ExpectError(ReadSafetensorsHeader(missing), absl::StatusCode::kNotFound, missing);
  const std::string dir = TempPath("a_directory");
  mkdir(dir.c_str(), 0755);
  ExpectError(ReadSafetensors(dir), absl::StatusCode::kFailedPrecondition, dir, "directory");
  const std::string fifo = TempPath("a_fifo");
  mkfifo(fifo.c_str(), 0644);
  ExpectError(ReadSafetensors(fifo), absl::StatusCode::kFailedPrecondition, fifo, "regular");
  const std::string empty = TempPath("empty.safetensors");
  WriteBytes(empty, "");
  ExpectError(ReadSafetensors(empty), absl::StatusCode::kInvalidArgument, empty, "too short");
}

TEST(ReadSafetensorsTest, MalformedHeaders) {
  const std::string path = TempPath("malformed.safetensors");
  const std::string f32x2(8, '\0');
  // A file whose only entry is "a" with the given fields, followed by `data`.
  auto one = [](const std::string& fields, const std::string& data) {
    return FileBytes(absl::StrCat(R"({"a":{)", fields, "}}"), data);
  };
  const std::string ok_a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  struct Case {
    std::string bytes;
    absl::StatusCode code;
    const char* detail;
  } cases[] = {
      {std::string("\x10\0\0\0", 4), kInvalid, "too short"},
      {FileBytes("{}", "").substr(0, 8) + "{", kInvalid, "runs past"},
      {std::string("\x01\xe1\xf5\x05\x00\x00\x00\x00{}", 10), kInvalid, "exceeds the limit"},
      {std::string("\xff\xff\xff\xff\xff\xff\xff\xff{}", 10), kInvalid, "exceeds the limit"},
      {FileBytes("", ""), kInvalid, "JSON"},
      {FileBytes("{\"a\":", ""), kInvalid, "JSON"},
      {FileBytes("[]", ""), kInvalid, "not a JSON object"},
      {FileBytes("{} {}", ""), kInvalid, "JSON"},
      {FileBytes("{\"a\":1}", ""), kInvalid, "not an object"},
      {FileBytes("{" + ok_a + "," + ok_a + "}", f32x2), kInvalid, "duplicate key 'a'"},
      {one(R"("dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8])", f32x2), kInvalid,
       "duplicate field"},
      {one(R"("dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1)", f32x2), kInvalid,
       "unknown field 'x'"},
      {one(R"("dtype":"F32","shape":[2])", f32x2), kInvalid, "lacks"},
      {one(R"("dtype":"F33","shape":[2],"data_offsets":[0,8])", f32x2), kInvalid,
       "unknown dtype 'F33'"},
      {one(R"("dtype":"U16","shape":[4],"data_offsets":[0,8])", f32x2),
       absl::StatusCode::kUnimplemented, "U16"},
      {one(R"("dtype":7,"shape":[2],"data_offsets":[0,8])", f32x2), kInvalid,
       "unexpected a number"},
      {one(R"("dtype":"F32","shape":[-2],"data_offsets":[0,8])", f32x2), kInvalid, "negative"},
      {one(R"("dtype":"F32","shape":[2.0],"data_offsets":[0,8])", f32x2), kInvalid, "non-integer"},
      {one(R"("dtype":"F32","shape":[[2]],"data_offsets":[0,8])", f32x2), kInvalid, "array"},
      {one(R"("dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,8])", f32x2), kInvalid,
       "exceeds int64"},
      {one(R"("dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8])", f32x2),
       kInvalid, "overflow"},
      {one(R"("dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0])", ""), kInvalid,
       "overflow"},
      {one(R"("dtype":"F32","shape":[2],"data_offsets":[0,8,9])", f32x2), kInvalid, "more than 2"},
      {one(R"("dtype":"F32","shape":[2],"data_offsets":[0])", f32x2), kInvalid, "needs 2"},
      {one(R"("dtype":"F32","shape":[2],"data_offsets":[0,8])", "1234"), kInvalid, "not within"},
      {one(R"("dtype":"F32","shape":[2],"data_offsets":[8,0])", f32x2), kInvalid, "not within"},
      {one(R"("dtype":"F32","shape":[2],"data_offsets":[9223372036854775800,)"
           R"(9223372036854775807])",
           f32x2),
       kInvalid, "not within"},
      {one(R"("dtype":"F32","shape":[2],"data_offsets":[18446744073709551000,0])", f32x2), kInvalid,
       "exceeds int64"},
      {one(R"("dtype":"F32","shape":[2],"data_offsets":[0,4])", f32x2), kInvalid, "needs 8"},
      {FileBytes(
           absl::StrCat("{", ok_a, R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})"),
           f32x2),
       kInvalid, "overlap"},
      {FileBytes("{\"bad\xff\":{}}", f32x2), kInvalid, "UTF-8"},
      {FileBytes("{\"bad\xed\xa0\x80\":{}}", f32x2), kInvalid, "UTF-8"},  // A raw surrogate.
      {FileBytes(R"({"\ud800":{}})", f32x2), kInvalid, "JSON"},           // An escaped lone one.
      {FileBytes(R"({"__metadata__":{"k":1}})", ""), kInvalid, "not a string"},
      {FileBytes(R"({"__metadata__":{"k":"v","k":"w"}})", ""), kInvalid,
       "duplicate key 'k' in __metadata__"},
      {FileBytes(R"({"__metadata__":{},"__metadata__":{}})", ""), kInvalid, "duplicate"},
      {FileBytes(R"({"__metadata__":[]})", ""), kInvalid, "not an object"},
      {FileBytes(R"({"a":{"shape":)" + std::string(100000, '['), ""), kInvalid,
       "unexpected an array"},  // Deep nesting stops at the first level the schema forbids.
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(absl::StrCat("case ", i, ": ", c.detail));
    WriteBytes(path, c.bytes);
    ExpectError(ReadSafetensors(path), c.code, path, c.detail);
    ExpectError(ReadSafetensorsHeader(path), c.code, path, c.detail);
  }
}

TEST(ReadSafetensorsTest, AcceptsMetadataGapsEmptyTensorsAndPadding) {
  const std::string path = TempPath("lenient.safetensors");
  std::string data(16, '\0');
  const float one = 1.0f;
  std::memcpy(&data[8], &one, 4);
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
      R"("e":{"data_offsets":[3,3],"shape":[0,5],"dtype":"I64"}}    )";
  WriteBytes(path, FileBytes(header, data));
  auto tensors = ReadSafetensors(path);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  EXPECT_EQ(tensors->at("a").item<float>(), 1.0f);
  EXPECT_EQ(tensors->at("e").sizes(), at::IntArrayRef({0, 5}));
  EXPECT_EQ(tensors->at("e").scalar_type(), at::kLong);
}

TEST(ReadSafetensorsTest, MisalignedDataIsCopiedAndBoolsNormalised) {
  const std::string path = TempPath("misaligned.safetensors");
  std::string data = "x";
  const double value = 2.5;
  data.append(reinterpret_cast<const char*>(&value), 8);
  data.append("\x00\x01\x02\xff", 4);
  WriteBytes(path, FileBytes(R"({"pad":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                             R"("d":{"dtype":"F64","shape":[],"data_offsets":[1,9]},)"
                             R"("b":{"dtype":"BOOL","shape":[2,2],"data_offsets":[9,13]}})",
                             data));
  auto tensors = ReadSafetensors(path);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  const at::Tensor& d = tensors->at("d");
  EXPECT_EQ(d.dim(), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(d.data_ptr()) % 8, 0u);
  EXPECT_EQ(d.item<double>(), 2.5);
  ExpectBitEqual(tensors->at("b"),
                 at::tensor(std::vector<uint8_t>{0, 1, 1, 1}).to(at::kBool).reshape({2, 2}), "b");
}

TEST(ReadSafetensorsTest, EveryTruncationIsAnError) {
  const std::string original = ReadBytes(Golden("llama2"));
  uint64_t header_len = 0;
  std::memcpy(&header_len, original.data(), 8);
  const std::string path = TempPath("truncated.safetensors");
  WriteBytes(path, original);
  // Shrink one file in place: every length through the header, then a stride.
  int checked = 0;
  for (uint64_t len = original.size(); len-- > 0;) {
    if (len > 8 + header_len + 256 && len % 997 != 0 && len + 8 < original.size()) continue;
    ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(len)), 0);
    ExpectError(ReadSafetensors(path), absl::StatusCode::kInvalidArgument, path);
    ++checked;
  }
  EXPECT_GT(checked, 1000);
}

TEST(ReadSafetensorsTest, RandomBitFlipsNeverCrash) {
  std::mt19937 rng(7);
  const std::string original = ReadBytes(Golden("llama2"));
  uint64_t header_len = 0;
  std::memcpy(&header_len, original.data(), 8);
  const std::string path = TempPath("flipped.safetensors");
  int ok = 0, failed = 0;
  for (int trial = 0; trial < 500; ++trial) {
    std::string bytes = original;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) {
      // Mostly in the length and header, where the structure is.
      const size_t limit = rng() % 8 == 0 ? bytes.size() : 8 + header_len;
      bytes[rng() % limit] ^= static_cast<char>(1 << (rng() % 8));
    }
    WriteBytes(path, bytes);
    auto tensors = ReadSafetensors(path);
    if (tensors.ok()) {
      ++ok;
      for (const auto& [name, t] : *tensors) (void)t.to(at::kDouble).sum().item<double>();
    } else {
      ++failed;
      EXPECT_NE(tensors.status().message().find(path), std::string::npos) << tensors.status();
    }
  }
  EXPECT_GT(ok, 0);
  EXPECT_GT(failed, 0);
}

TEST(IsValidUtf8Test, Cases) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("transformer.h.0.attn"));
  EXPECT_TRUE(IsValidUtf8("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));  // é € 😀
  EXPECT_FALSE(IsValidUtf8("\xff"));
  EXPECT_FALSE(IsValidUtf8("\xc3"));              // Truncated.
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // Overlong.
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // Surrogate.
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // Past U+10FFFF.
  EXPECT_FALSE(IsValidUtf8("a\x80"));             // Lone continuation.
}

}  // namespace
}  // namespace lgpt
