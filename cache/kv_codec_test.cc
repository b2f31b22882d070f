#include "cache/kv_codec.h"

#include <ATen/ATen.h>

#include <cstring>
#include <vector>

#include "core/ops/paged_attention_layout.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

// Normal entries with a few outlier channels, as keys after RoPE have.
at::Tensor Entries(int64_t n, int64_t head_size) {
  at::manual_seed(7);
  at::Tensor x = at::randn({2, 3, n, head_size});
  x.select(-1, 3).mul_(20);
  x.select(-1, head_size - 5).mul_(-12);
  return x;
}

TEST(KVCodecTest, RoundTripErrorIsAtMostHalfAStepOfItsGroup) {
  const at::Tensor x = Entries(17, 64);
  for (int bits : {8, 4}) {
    const QuantizedGroups q = QuantizeGroups(x, bits, 32);
    EXPECT_EQ(q.scales.scalar_type(), at::kHalf);
    EXPECT_EQ(q.data.size(-1), 64 * bits / 8);
    const at::Tensor back = DequantizeGroups(q.data, q.scales, bits, 32, at::kFloat);
    const at::Tensor error = (back - x).abs().view({2, 3, 17, 2, 32});
    const at::Tensor step = q.scales.to(at::kFloat).unsqueeze(-1);  // [2, 3, 17, 2, 1]
    // Within half a step (plus float rounding) everywhere...
    EXPECT_TRUE((error <= step * 0.5 + 1e-5).all().item<bool>()) << bits << " bits";
    // ...a step being absmax / levels of the group (float16-rounded).
    const double levels = bits == 8 ? 127 : 7;
    const at::Tensor absmax = x.view({2, 3, 17, 2, 32}).abs().amax(-1, true);
    EXPECT_LT((step - absmax / levels).abs().max().item<double>(),
              1e-3 * absmax.max().item<double>() / levels);
    EXPECT_GT(error.max().item<double>(), 0) << "quantisation cannot be exact here";
  }
}

TEST(KVCodecTest, HostRowsAreTheTensorCodecsBits) {
  at::Tensor x = Entries(9, 64).reshape({-1, 64});  // [54, 64] rows
  // Values on rounding boundaries (x · inverse = k + 0.5), zeros and huge values.
  x[0].fill_(0.0f);
  x[1].copy_(at::arange(64, at::kFloat).sub_(32).mul_(0.5f));
  x[2].fill_(1e6f);
  x[3].copy_(at::linspace(-1, 1, 64));
  for (int bits : {8, 4}) {
    for (int64_t group : {32, 16, 64}) {
      const QuantizedGroups q = QuantizeGroups(x, bits, group);
      const at::Tensor expected = DequantizeGroups(q.data, q.scales, bits, group, at::kFloat);
      at::Tensor data = at::full_like(q.data, 99), scales = at::zeros_like(q.scales);
      at::Tensor back = at::empty_like(x);
      for (int64_t r = 0; r < x.size(0); ++r) {
        QuantizeRow(x[r].data_ptr<float>(), 64, bits, group, data[r].data_ptr(),
                    scales[r].data_ptr<at::Half>());
        DequantizeRow(q.data[r].data_ptr(), q.scales[r].data_ptr<at::Half>(), 64, bits, group,
                      back[r].data_ptr<float>());
      }
      EXPECT_TRUE(at::equal(data, q.data)) << bits << " bits, groups of " << group;
      EXPECT_TRUE(at::equal(scales, q.scales)) << bits << " bits, groups of " << group;
      EXPECT_TRUE(at::equal(back, expected)) << bits << " bits, groups of " << group;
    }
  }
}

// The pool block layout's encoder and reader (core/ops/paged_attention_layout.h, shared with
// the CUDA kernel) are QuantizeRow / DequantizeRow bit for bit: codes, then the scales.
TEST(KVCodecTest, PagedEntriesAreQuantizeRowsBitForBit) {
  at::Tensor x = Entries(9, 64).reshape({-1, 64});
  x[0].fill_(0.0f);
  x[1].copy_(at::arange(64, at::kFloat).sub_(32).mul_(0.5f));
  x[2].fill_(1e6f);
  for (int bits : {8, 4}) {
    for (int32_t group : {32, 16, 64}) {
      const paged::EntryFormat format{bits == 8 ? paged::EntryKind::kInt8 : paged::EntryKind::kInt4,
                                      64, group};
      const QuantizedGroups q = QuantizeGroups(x, bits, group);
      const at::Tensor expected = DequantizeGroups(q.data, q.scales, bits, group, at::kFloat);
      std::vector<uint8_t> entry(paged::EntryBytes(format));
      for (int64_t r = 0; r < x.size(0); ++r) {
        paged::QuantizeEntry(x[r].data_ptr<float>(), format, entry.data());
        const int64_t code_bytes = q.data.size(-1);
        ASSERT_EQ(std::memcmp(entry.data(), q.data[r].data_ptr(), code_bytes), 0) << r;
        ASSERT_EQ(std::memcmp(entry.data() + paged::CodeBytes(format), q.scales[r].data_ptr(),
                              2 * (64 / group)),
                  0)
            << r;
        for (int64_t d = 0; d < 64; ++d) {
          ASSERT_EQ(paged::EntryElement(entry.data(), format, d), expected[r][d].item<float>())
              << bits << " bits, row " << r << ", channel " << d;
        }
      }
    }
  }
}

TEST(KVCodecTest, Int8IsFarMoreAccurateThanInt4) {
  at::manual_seed(11);
  const at::Tensor x = at::randn({2, 3, 64, 64});
  double mean_error[2];
  int i = 0;
  for (int bits : {8, 4}) {
    const QuantizedGroups q = QuantizeGroups(x, bits, 32);
    mean_error[i++] =
        (DequantizeGroups(q.data, q.scales, bits, 32, at::kFloat) - x).abs().mean().item<double>();
  }
  EXPECT_LT(mean_error[0] * 10, mean_error[1]);
  EXPECT_LT(mean_error[1], 0.2 * x.abs().mean().item<double>());
}

TEST(KVCodecTest, Int4PacksTwoChannelsPerByteLowNibbleFirst) {
  // absmax 7 in each group of 4 makes the scale exactly 1, so q equals x.
  const at::Tensor x = at::tensor({7.f, -7.f, 3.f, 0.f, -2.f, 5.f, 1.f, 7.f}).view({1, 1, 1, 8});
  const QuantizedGroups q = QuantizeGroups(x, 4, 4);
  ASSERT_EQ(q.data.scalar_type(), at::kByte);
  const at::Tensor expected = at::tensor(
      {(7 + 8) + 16 * (-7 + 8), (3 + 8) + 16 * 8, (-2 + 8) + 16 * (5 + 8), (1 + 8) + 16 * (7 + 8)},
      at::kInt);
  EXPECT_TRUE(at::equal(q.data.view({4}).to(at::kInt), expected)) << q.data;
  EXPECT_TRUE(at::equal(DequantizeGroups(q.data, q.scales, 4, 4, at::kFloat), x));
}

TEST(KVCodecTest, ZerosStayZeros) {
  const at::Tensor x = at::zeros({1, 2, 3, 32});
  for (int bits : {8, 4}) {
    const QuantizedGroups q = QuantizeGroups(x, bits, 32);
    const at::Tensor back = DequantizeGroups(q.data, q.scales, bits, 32, at::kFloat);
    EXPECT_TRUE(at::equal(back, x));
  }
}

TEST(KVCodecTest, BytesPerEntryMatchTheStorage) {
  const c10::Device cpu(c10::kCPU);
  auto int8 = MakeQuantCodec(8, 128, 32, at::kBFloat16, cpu);
  auto int4 = MakeQuantCodec(4, 128, 32, at::kBFloat16, cpu);
  ASSERT_TRUE(int8.ok() && int4.ok());
  const auto full = MakeFullCodec(128, at::kBFloat16, cpu);
  EXPECT_EQ(full->BytesPerEntry(), 2 * 128 * 2);
  EXPECT_EQ((*int8)->BytesPerEntry(), 2 * (128 + 2 * 4));
  EXPECT_EQ((*int4)->BytesPerEntry(), 2 * (64 + 2 * 4));
  for (const EntryCodec* codec : {full.get(), int8->get(), int4->get()}) {
    int64_t bytes = 0;
    for (const at::Tensor& t : codec->Allocate(2, 3, 5)) bytes += t.numel() * t.element_size();
    EXPECT_EQ(bytes, 2 * 3 * 5 * codec->BytesPerEntry()) << codec->bits();
  }
  // Per entry, scales included: int8 0.53 and int4 0.28 of a 16-bit entry.
  EXPECT_LE((*int8)->BytesPerEntry(), 0.55 * full->BytesPerEntry());
  EXPECT_LE((*int4)->BytesPerEntry(), 0.30 * full->BytesPerEntry());
}

TEST(KVCodecTest, CodecsRoundTripThroughTheirStorage) {
  const at::Tensor k = Entries(5, 80), v = Entries(5, 80) * 0.5;
  const c10::Device cpu(c10::kCPU);
  for (int bits : {8, 4}) {
    // 32 does not divide 80: groups of gcd(32, 80) = 16 channels.
    auto codec = MakeQuantCodec(bits, 80, 32, at::kFloat, cpu);
    ASSERT_TRUE(codec.ok()) << codec.status();
    const std::vector<at::Tensor> parts = (*codec)->Encode(k, v);
    ASSERT_EQ(parts.size(), 4u);
    EXPECT_EQ(parts[1].size(-1), 5);
    at::Tensor k2, v2;
    (*codec)->Decode(parts, &k2, &v2);
    const double tolerance = bits == 8 ? 0.01 : 0.15;
    EXPECT_LT((k2 - k).abs().max().item<double>(), tolerance * k.abs().max().item<double>());
    EXPECT_LT((v2 - v).abs().max().item<double>(), tolerance * v.abs().max().item<double>());
  }
  const auto full = MakeFullCodec(80, at::kBFloat16, cpu);
  at::Tensor k3;
  full->Decode(full->Encode(k, v), &k3, nullptr);
  EXPECT_EQ(k3.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(k3, k.to(at::kBFloat16)));
}

TEST(KVCodecTest, BadCodecsAreErrors) {
  const c10::Device cpu(c10::kCPU);
  EXPECT_FALSE(MakeQuantCodec(3, 64, 32, at::kFloat, cpu).ok());
  EXPECT_FALSE(MakeQuantCodec(4, 63, 32, at::kFloat, cpu).ok());
  EXPECT_FALSE(MakeQuantCodec(8, 64, 0, at::kFloat, cpu).ok());
}

}  // namespace
}  // namespace lgpt
