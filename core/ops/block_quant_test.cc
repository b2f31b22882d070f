#include "core/ops/block_quant.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "core/ops/gemv.h"

namespace lgpt {
namespace {

constexpr BlockFormat kFormats[] = {BlockFormat::kQ8_0, BlockFormat::kQ4_0};

std::vector<QuantKernel> AvailableKernels() {
  std::vector<QuantKernel> kernels;
  for (QuantKernel k :
       {QuantKernel::kPortable, QuantKernel::kAvx2, QuantKernel::kAvx512Vnni, QuantKernel::kAmx}) {
    if (QuantKernelAvailable(k)) kernels.push_back(k);
  }
  return kernels;
}

BlockQuantWeight Quantize(const at::Tensor& w, BlockFormat format) {
  absl::StatusOr<BlockQuantWeight> q = QuantizeBlocks(w, format);
  EXPECT_TRUE(q.ok()) << q.status();
  return *std::move(q);
}

// The activation rows as the kernels see them: dequantised from QuantizeRows.
at::Tensor DequantizedRows(const at::Tensor& x) {
  const int64_t rows = x.size(0), k = x.size(1);
  QuantizedRows q;
  QuantizeRows(x.data_ptr<float>(), rows, k, &q);
  const at::Tensor values =
      at::from_blob(q.values.data(), {rows, k / kQuantBlock, kQuantBlock}, at::kChar)
          .to(at::kFloat);
  const at::Tensor scales = at::from_blob(q.scales.data(), {rows, k / kQuantBlock, 1}, at::kFloat);
  return (values * scales).view({rows, k});
}

// Per-row scales [N, K / 32] out of the tiles' [G, K / 32, 16].
at::Tensor RowScales(const BlockQuantWeight& q) {
  return q.scales.permute({0, 2, 1})
      .reshape({-1, q.in_features / kQuantBlock})
      .narrow(0, 0, q.out_features)
      .to(at::kFloat);
}

at::Tensor RunGemv(const BlockQuantWeight& q, const at::Tensor& x, const at::Tensor& bias,
                   QuantKernel kernel) {
  at::Tensor y = at::empty({x.size(0), q.out_features});
  BlockQuantGemv(q, bias.defined() ? bias.data_ptr<float>() : nullptr, x.data_ptr<float>(),
                 y.data_ptr<float>(), x.size(0), kernel);
  return y;
}

// The AMX kernel on every shape, not only where it pays (AmxDispatch), so that its partial
// tiles and q4 over narrow matrices are compared with the other kernels too.
class AmxEverywhere : public ::testing::Environment {
 public:
  void SetUp() override { SetAmxDispatchForTesting({1, 0}); }
};
::testing::Environment* const kAmxEverywhere =
    ::testing::AddGlobalTestEnvironment(new AmxEverywhere);

TEST(BlockQuantKernels, AmxDispatchDefaultsToWhereTilesPay) {
  const AmxDispatch everywhere = SetAmxDispatchForTesting(AmxDispatch());
  EXPECT_EQ(everywhere.min_rows, 1);
  const AmxDispatch defaults = SetAmxDispatchForTesting(everywhere);
  EXPECT_EQ(defaults.min_rows, 16);
  EXPECT_EQ(defaults.q4_min_outputs, 8192);
}

TEST(QuantizeBlocks, RoundingErrorAndExtremes) {
  at::manual_seed(0);
  const at::Tensor w = at::randn({9, 128}) * 0.05;
  for (BlockFormat format : kFormats) {
    const BlockQuantWeight q = Quantize(w, format);
    // One row group (9 rows padded to 16), 4 blocks.
    ASSERT_EQ(q.scales.sizes(), (std::vector<int64_t>{1, 4, 16}));
    EXPECT_EQ(q.scales.scalar_type(), at::kHalf);
    EXPECT_TRUE(at::equal(q.scales.narrow(2, 9, 7), at::zeros({1, 4, 7}, at::kHalf)));  // padding
    EXPECT_EQ(q.values.scalar_type(), at::kByte);
    const at::Tensor dequantised = DequantizeBlocks(q);
    ASSERT_EQ(dequantised.sizes(), w.sizes());
    const at::Tensor error = (dequantised - w).abs().view({9, 4, 32});
    const at::Tensor step = RowScales(q).unsqueeze(-1);
    if (format == BlockFormat::kQ8_0) {
      EXPECT_EQ(q.values.sizes(), (std::vector<int64_t>{1, 4, 512}));
      EXPECT_GE(q.values.min().item<int>(), 1);  // q + 128 with q in [-127, 127]
      // Nearest of 255 levels: at most half a step.
      EXPECT_TRUE((error <= step * 0.5 + 1e-7).all().item<bool>());
    } else {
      EXPECT_EQ(q.values.sizes(), (std::vector<int64_t>{1, 4, 256}));
      // Nearest level, but +8 steps clamps to +7 when the extreme is negative: one step.
      EXPECT_TRUE((error <= step + 1e-7).all().item<bool>());
      EXPECT_GT((error <= step * 0.5 + 1e-7).to(at::kFloat).mean().item<double>(), 0.99);
    }
    // Each block's largest magnitude is represented to the half scale's rounding (up, by at
    // most 2^-10 relative).
    const at::Tensor largest = w.abs().view({9, 4, 32}).argmax(-1, true);
    const at::Tensor at_largest = error.gather(-1, largest);
    const at::Tensor magnitude = w.abs().view({9, 4, 32}).gather(-1, largest);
    EXPECT_TRUE((at_largest <= magnitude * std::ldexp(1.0, -10)).all().item<bool>())
        << BlockFormatName(format);
  }
}

// A decode step's few rows take a loop over their bytes, more take LibTorch's indexing: both
// equal the full dequantisation's rows.
TEST(QuantizeBlocks, DequantizedRowsEqualTheFullTablesRowsForFewAndManyIds) {
  at::manual_seed(3);
  const at::Tensor w = at::randn({41, 96});
  for (BlockFormat format : kFormats) {
    const BlockQuantWeight q = Quantize(w, format);
    const at::Tensor full = DequantizeBlocks(q);
    for (const int64_t count : {1, 5, 16, 17, 40}) {
      const at::Tensor rows = at::randint(0, 41, {count}, at::kLong);
      EXPECT_TRUE(at::equal(DequantizeBlockRows(q, rows), full.index_select(0, rows)))
          << BlockFormatName(format) << " " << count;
    }
    EXPECT_THROW(DequantizeBlockRows(q, at::tensor({41}, at::kLong)), c10::Error);
  }
}

TEST(QuantizeBlocks, ZeroBlocksRowsAndErrors) {
  at::Tensor w = at::randn({4, 64});
  w[1].zero_();
  for (BlockFormat format : kFormats) {
    const BlockQuantWeight q = Quantize(w, format);
    EXPECT_TRUE(at::equal(DequantizeBlocks(q)[1], at::zeros({64})));
    const at::Tensor rows = at::tensor({3, 0, 3}, at::kLong);
    EXPECT_TRUE(at::equal(DequantizeBlockRows(q, rows), DequantizeBlocks(q).index_select(0, rows)));
    const absl::StatusOr<BlockQuantWeight> bad = QuantizeBlocks(at::randn({4, 48}), format);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find("in_features"), std::string::npos);
    EXPECT_NE(bad.status().message().find("48"), std::string::npos);
    EXPECT_FALSE(QuantizeBlocks(at::randn({64}), format).ok());
    // Non-finite or beyond the half scales' range: refused, naming the element.
    for (float v : {std::nanf(""), INFINITY, -1e12f}) {
      at::Tensor odd = at::randn({4, 64});
      odd[2][37] = v;
      const absl::StatusOr<BlockQuantWeight> refused = QuantizeBlocks(odd, format);
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << v;
      EXPECT_NE(refused.status().message().find("[2, 37]"), std::string::npos) << refused.status();
    }
  }
}

// The stored layout is a contract (quantised checkpoints hold it): check the documented byte
// positions of chosen elements against their levels.
TEST(QuantizeBlocks, TileLayoutIsTheDocumentedOne) {
  const int64_t n = 20, k = 64;  // two row groups (the second half padding), two blocks
  // Weight n, element e: level ((n * 7 + e * 3) % 15) - 7, times a per-row scale, with one
  // element per block at -8 / -127 levels' extreme so every block's scale is exact.
  for (BlockFormat format : kFormats) {
    const bool q4 = format == BlockFormat::kQ4_0;
    const int top = q4 ? 7 : 127;
    at::Tensor levels = at::empty({n, k}, at::kInt);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t e = 0; e < k; ++e) {
        levels[r][e] = e % kQuantBlock == 0 ? top : ((r * 7 + e * 3) % 15) - 7;
      }
    }
    const BlockQuantWeight q = Quantize(levels.to(at::kFloat) * 0.25, format);
    const at::Tensor bytes = q.values.contiguous();
    const uint8_t* tiles = bytes.data_ptr<uint8_t>();
    for (int64_t r = 0; r < n; ++r) {
      const int64_t g = r / 16, lane = r % 16;
      for (int64_t e = 0; e < k; ++e) {
        const int64_t b = e / 32, i = e % 32;
        const int level = levels[r][e].item<int>();
        if (q4) {
          const uint8_t byte = tiles[(g * 2 + b) * 256 + (i / 8) * 64 + lane * 4 + i % 4];
          const int stored = (i % 8) < 4 ? byte & 15 : byte >> 4;
          ASSERT_EQ(stored, level + 8) << "row " << r << " element " << e;
        } else {
          ASSERT_EQ(tiles[(g * 2 + b) * 512 + (i / 4) * 64 + lane * 4 + i % 4], level + 128)
              << "row " << r << " element " << e;
        }
      }
    }
    EXPECT_TRUE(at::allclose(RowScales(q), at::full({n, 2}, 0.25f * top / (q4 ? 7 : 127))));
  }
}

TEST(QuantizeRows, HalfAStepPerBlock) {
  at::manual_seed(1);
  const at::Tensor x = at::randn({3, 96}) * 3;
  x[1].narrow(0, 32, 32).zero_();
  QuantizedRows q;
  QuantizeRows(x.data_ptr<float>(), 3, 96, &q);
  const at::Tensor error = (DequantizedRows(x) - x).abs().view({3, 3, 32});
  const at::Tensor scales = at::from_blob(q.scales.data(), {3, 3, 1}, at::kFloat);
  EXPECT_TRUE((error <= scales * 0.5 + 1e-6).all().item<bool>());
  EXPECT_EQ(q.scales[4], 0.0f);  // the zero block
  for (int64_t i = 0; i < 9; ++i) {
    int sum = 0;
    for (int j = 0; j < 32; ++j) sum += q.values[i * 32 + j];
    EXPECT_EQ(q.sums[i], sum);
  }
}

// Every kernel quantises activations to the same bytes, ties (exact halves) to even, and
// blocks too small to invert to zeros.
TEST(QuantizeRows, KernelsAgreeBitForBit) {
  at::manual_seed(2);
  at::Tensor x = at::randn({5, 256}) * 4;
  x[0].narrow(0, 0, 32).copy_(at::arange(-16, 16, at::kFloat) + 0.5);  // -15.5 .. 15.5
  x[0][0] = 127;  // amax 127: inverse 1, so the .5 values are exact ties
  x[1].narrow(0, 32, 32).fill_(1e-35f);
  x[2].narrow(0, 64, 32).zero_();
  QuantizedRows portable;
  QuantizeRows(x.data_ptr<float>(), 5, 256, &portable, QuantKernel::kPortable);
  EXPECT_EQ(portable.values[1], -14);  // -14.5 -> -14 (even)
  EXPECT_EQ(portable.values[2], -14);  // -13.5 -> -14
  EXPECT_EQ(portable.values[17], 2);   // 1.5 -> 2
  EXPECT_EQ(portable.values[18], 2);   // 2.5 -> 2
  for (int j = 0; j < 32; ++j) EXPECT_EQ(portable.values[256 + 32 + j], 0);
  for (QuantKernel kernel : AvailableKernels()) {
    QuantizedRows q;
    QuantizeRows(x.data_ptr<float>(), 5, 256, &q, kernel);
    EXPECT_EQ(q.values, portable.values) << QuantKernelName(kernel);
    EXPECT_EQ(q.scales, portable.scales) << QuantKernelName(kernel);
    EXPECT_EQ(q.sums, portable.sums) << QuantKernelName(kernel);
  }
}

class BlockQuantGemvShapes
    : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, bool>> {};

// Every kernel against (a) the exact product of the dequantised weight and the quantised
// activations, computed in float64: the integer block sums are exact, so the only error is
// float32 accumulation, bounded by 1e-5 of sum |w||x| (~blocks * 2^-24 with margin); and
// (b) the dequantised weight times the unquantised x: the activation rounding adds at most
// half a step (scale / 2) per element, so |y - w x| <= sum_j |w_j| scale_block(j) / 2.
TEST_P(BlockQuantGemvShapes, KernelsMatchReferences) {
  const auto [rows, n_out, k, with_bias] = GetParam();
  at::manual_seed(rows * 131 + n_out * 7 + k);
  const at::Tensor w = at::randn({n_out, k}) * 0.1;
  const at::Tensor x = at::randn({rows, k});
  const at::Tensor bias = with_bias ? at::randn({n_out}) : at::Tensor();
  for (BlockFormat format : kFormats) {
    const BlockQuantWeight q = Quantize(w, format);
    const at::Tensor wd = DequantizeBlocks(q).to(at::kDouble);
    const at::Tensor xd = DequantizedRows(x).to(at::kDouble);
    at::Tensor exact = at::matmul(xd, wd.t());
    at::Tensor unquantised_x = at::matmul(x.to(at::kDouble), wd.t());
    if (with_bias) {
      exact = exact + bias.to(at::kDouble);
      unquantised_x = unquantised_x + bias.to(at::kDouble);
    }
    const at::Tensor magnitude = at::matmul(xd.abs(), wd.abs().t());  // [rows, N]
    QuantizedRows qx;
    QuantizeRows(x.data_ptr<float>(), rows, k, &qx);
    const at::Tensor half_steps =
        at::from_blob(qx.scales.data(), {rows, k / kQuantBlock, 1}, at::kFloat)
            .expand({rows, k / kQuantBlock, kQuantBlock})
            .reshape({rows, k})
            .to(at::kDouble) *
        0.5;
    const at::Tensor rounding = at::matmul(half_steps, wd.abs().t());
    at::Tensor portable;
    for (QuantKernel kernel : AvailableKernels()) {
      const at::Tensor y = RunGemv(q, x, bias, kernel).to(at::kDouble);
      const std::string what = std::string(BlockFormatName(format)) + " " + QuantKernelName(kernel);
      EXPECT_TRUE(((y - exact).abs() <= magnitude * 1e-5 + 1e-6).all().item<bool>())
          << what << " max diff " << (y - exact).abs().max().item<double>();
      EXPECT_TRUE(
          ((y - unquantised_x).abs() <= rounding + magnitude * 1e-5 + 1e-6).all().item<bool>())
          << what;
      if (kernel == QuantKernel::kPortable) {
        portable = y;
      } else {
        // The same float operations in the same order: the same bits as the portable kernel.
        EXPECT_TRUE(at::equal(y, portable))
            << what << " vs portable: " << (y - portable).abs().max().item<double>();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, BlockQuantGemvShapes,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 9, 16, 17, 32, 67),
                                            ::testing::Values(1, 7, 64, 301),
                                            ::testing::Values(32, 96, 1024), ::testing::Bool()));

// The serving engine batches decoding rows: a row's output must be bit-identical whatever
// rows share its call (and however many), for every kernel and format.
TEST(BlockQuantGemv, RowResultsDoNotDependOnTheBatch) {
  at::manual_seed(3);
  const int64_t n_out = 203, k = 352;  // odd row count, odd block count (11)
  const at::Tensor w = at::randn({n_out, k}) * 0.1;
  const at::Tensor bias = at::randn({n_out});
  const at::Tensor x = at::randn({kGemvMaxRows, k});
  for (BlockFormat format : kFormats) {
    const BlockQuantWeight q = Quantize(w, format);
    for (QuantKernel kernel : AvailableKernels()) {
      const at::Tensor full = RunGemv(q, x, bias, kernel);
      for (int64_t rows : {1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 31}) {
        for (int64_t start : {int64_t{0}, kGemvMaxRows - rows}) {
          const at::Tensor part = RunGemv(q, x.narrow(0, start, rows).contiguous(), bias, kernel);
          ASSERT_EQ(std::memcmp(part.data_ptr<float>(), full[start].data_ptr<float>(),
                                rows * n_out * sizeof(float)),
                    0)
              << BlockFormatName(format) << " " << QuantKernelName(kernel) << " rows " << rows
              << " from " << start;
        }
      }
      // The same row beside different companions.
      at::Tensor other = at::randn({kGemvMaxRows, k}) * 10;
      other[5].copy_(x[5]);
      EXPECT_TRUE(at::equal(RunGemv(q, other, bias, kernel)[5], full[5]));
    }
  }
}

// The AMX kernel runs in the tests above (every available kernel against the portable one,
// bit for bit); where the CPU or the OS lacks it, this says so.
TEST(BlockQuantKernels, AmxWhereTheCpuHasIt) {
  if (!QuantKernelAvailable(QuantKernel::kAmx)) {
    GTEST_SKIP() << "this CPU (or its kernel) has no AMX-INT8: the AMX kernel is not tested here";
  }
  EXPECT_EQ(BestQuantKernel(), QuantKernel::kAmx);
  EXPECT_STREQ(QuantKernelName(QuantKernel::kAmx), "amx");
}

TEST(BlockQuantKernels, DispatchPicksAnAvailableKernel) {
  EXPECT_TRUE(QuantKernelAvailable(QuantKernel::kPortable));
  EXPECT_TRUE(QuantKernelAvailable(BestQuantKernel()));
  if (CpuHasAvx2Fma()) {
    EXPECT_NE(BestQuantKernel(), QuantKernel::kPortable);
  }
}

}  // namespace
}  // namespace lgpt
