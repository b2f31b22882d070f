#include "core/ops/block_quant_device.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "core/base/device.h"
#include "core/ops/block_quant.h"
#include "core/ops/block_quant_layout.h"

namespace lgpt {
namespace {

struct Shape {
  int64_t rows, n_out, k;
};

// Decoding's row counts, groups with padding rows (15, 17, 100), fewer blocks than parts and
// more (K = 544 is 17 blocks, K = 1024 32), q8 and q4.
const Shape kShapes[] = {{1, 1, 32},   {3, 15, 64},    {8, 17, 544}, {9, 100, 1024},
                         {16, 33, 96}, {1, 512, 2048}, {2, 48, 544}};
const BlockFormat kFormats[] = {BlockFormat::kQ8_0, BlockFormat::kQ4_0};

BlockQuantWeight RandomWeight(int64_t n_out, int64_t k, BlockFormat format) {
  at::Tensor w = at::randn({n_out, k});  // [N, K]
  // Blocks of very different scales, and an all-zero block, as trained weights have.
  w.mul_(
      at::exp(at::randn({n_out, k / 32, 1}) * 2).expand({n_out, k / 32, 32}).reshape({n_out, k}));
  if (k >= 64) w.narrow(1, 32, 32).zero_();
  return *QuantizeBlocks(w, format);
}

// Activations with an all-zero block, a tiny one and exact halves (ties when quantised).
at::Tensor RandomRows(int64_t rows, int64_t k) {
  at::Tensor x = at::randn({rows, k});  // [rows, K]
  if (k >= 64) {
    x.narrow(1, 0, 32).zero_();
    x.narrow(1, 32, 32).mul_(1e-32f);
  }
  if (rows > 1) {
    // 127 levels over [-127, 127] x 0.5 steps: every other code is a tie.
    x[1].narrow(0, k - 32, 32).copy_(at::arange(-15.5, 16.5, 1.0).to(at::kFloat));
  }
  return x;
}

// Where the layout says each code and scale lives, they decode to DequantizeBlocks' values.
TEST(BlockQuantLayout, CodesAndScalesWhereTheDequantiserReadsThem) {
  at::manual_seed(1);
  for (BlockFormat format : kFormats) {
    const BlockQuantWeight w = RandomWeight(37, 96, format);
    const at::Tensor dense = DequantizeBlocks(w);  // [N, K]
    const bool q4 = format == BlockFormat::kQ4_0;
    const auto* tiles = w.values.data_ptr<uint8_t>();
    const auto* scales = reinterpret_cast<const uint16_t*>(w.scales.data_ptr<at::Half>());
    const int64_t blocks = w.in_features / 32;
    for (int64_t n = 0; n < w.out_features; ++n) {
      const int64_t g = n / 16, lane = n % 16;
      for (int64_t e = 0; e < w.in_features; ++e) {
        const int64_t b = e / 32;
        const uint8_t* tile = tiles + (g * blocks + b) * block_quant::TileBytes(q4);
        const float scale = paged::HalfToFloat(scales[(g * blocks + b) * 16 + lane]);
        const float decoded =
            static_cast<float>(block_quant::CodeInTile(tile, q4, lane, e % 32)) * scale;
        ASSERT_EQ(decoded, dense[n][e].item<float>())
            << BlockFormatName(format) << " row " << n << " element " << e;
      }
    }
  }
}

// The shared activation quantisation gives QuantizeRows' bytes, scales and sums on both of its
// kernels, ties and tiny blocks included.
TEST(BlockQuantLayout, ActivationQuantisationIsQuantizeRows) {
  at::manual_seed(2);
  const at::Tensor x = RandomRows(3, 256);
  const int64_t blocks = 3 * 256 / 32;
  std::vector<int8_t> codes(3 * 256);
  std::vector<float> scales(blocks);
  std::vector<int32_t> sums(blocks);
  for (int64_t i = 0; i < blocks; ++i) {
    scales[i] = block_quant::QuantizeActivationBlock(x.data_ptr<float>() + i * 32,
                                                     codes.data() + i * 32, &sums[i]);
  }
  for (QuantKernel kernel : {QuantKernel::kPortable, BestQuantKernel()}) {
    QuantizedRows rows;
    QuantizeRows(x.data_ptr<float>(), 3, 256, &rows, kernel);
    EXPECT_EQ(rows.values, codes) << QuantKernelName(kernel);
    EXPECT_EQ(rows.scales, scales) << QuantKernelName(kernel);
    EXPECT_EQ(rows.sums, sums) << QuantKernelName(kernel);
  }
}

// The twin's parts order differs from BlockQuantGemv's single chain: equal to rounding.
TEST(BlockQuantGemvByParts, TwinAgreesWithTheCpuKernelsToRounding) {
  at::manual_seed(3);
  for (BlockFormat format : kFormats) {
    for (const Shape& s : kShapes) {
      const BlockQuantWeight w = RandomWeight(s.n_out, s.k, format);
      const at::Tensor x = RandomRows(s.rows, s.k);
      const at::Tensor bias = at::randn({s.n_out});
      at::Tensor expected = at::empty({s.rows, s.n_out});
      BlockQuantGemv(w, bias.data_ptr<float>(), x.data_ptr<float>(), expected.data_ptr<float>(),
                     s.rows);
      const absl::StatusOr<at::Tensor> y = BlockQuantGemvByParts(w, x, bias);
      ASSERT_TRUE(y.ok()) << y.status();
      // Each output is a sum of K / 32 block products: a few ulps of their magnitudes.
      const at::Tensor magnitude =
          at::matmul(x.abs(), DequantizeBlocks(w).abs().t()) + bias.abs();  // [rows, N]
      const at::Tensor error = (*y - expected).abs();
      EXPECT_TRUE(at::all(error <= magnitude * 1e-5f).item<bool>())
          << BlockFormatName(format) << " " << s.rows << "x" << s.n_out << "x" << s.k
          << ": max error " << error.max().item<float>();
      // Not a copy of the same chain: where a row has more blocks than parts, the orders differ.
    }
  }
}

// The twin against the dequantised weight in float64 (independent of both kernels' code): the
// error is the activations' int8 rounding, at most half a step per element.
TEST(BlockQuantGemvByParts, TwinIsTheProductWithQuantisedActivations) {
  at::manual_seed(4);
  for (BlockFormat format : kFormats) {
    const BlockQuantWeight w = RandomWeight(48, 544, format);
    const at::Tensor x = RandomRows(4, 544);
    const at::Tensor y = *BlockQuantGemvByParts(w, x, at::Tensor());
    const at::Tensor dense = DequantizeBlocks(w).to(at::kDouble);  // [N, K]
    const at::Tensor exact = at::matmul(x.to(at::kDouble), dense.t());
    // Per block the activation step is amax / 127; half of it times the row's weights.
    const at::Tensor step = x.view({4, 17, 32})
                                .abs()
                                .amax(-1, true)
                                .expand({4, 17, 32})
                                .reshape({4, 544})
                                .to(at::kDouble) /
                            254.0;
    const at::Tensor bound = at::matmul(step, dense.abs().t()) * 1.001 + 1e-6;
    EXPECT_TRUE(at::all((y.to(at::kDouble) - exact).abs() <= bound).item<bool>())
        << BlockFormatName(format);
  }
}

// A row's output never depends on the other rows of the call (batched == alone), to the bit.
TEST(BlockQuantGemvByParts, RowsAreBatchInvariant) {
  at::manual_seed(5);
  for (BlockFormat format : kFormats) {
    const BlockQuantWeight w = RandomWeight(100, 1024, format);
    const at::Tensor x = RandomRows(9, 1024);
    const at::Tensor batched = *BlockQuantGemvByParts(w, x, at::Tensor());
    for (int64_t m = 0; m < 9; ++m) {
      const at::Tensor alone =
          *BlockQuantGemvByParts(w, x.narrow(0, m, 1).contiguous(), at::Tensor());
      EXPECT_TRUE(at::equal(alone[0], batched[m])) << BlockFormatName(format) << " row " << m;
    }
  }
}

TEST(BlockQuantGemvByParts, BadArgumentsNameTheTensor) {
  const BlockQuantWeight w = RandomWeight(16, 64, BlockFormat::kQ8_0);
  const auto message = [&](const at::Tensor& x, const at::Tensor& bias) {
    const absl::StatusOr<at::Tensor> y = BlockQuantGemvByParts(w, x, bias);
    EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(y.status().message());
  };
  EXPECT_NE(message(at::randn({2, 32}), at::Tensor()).find("x must be"), std::string::npos);
  EXPECT_NE(message(at::randn({2, 64}).to(at::kDouble), at::Tensor()).find("x must be"),
            std::string::npos);
  EXPECT_NE(message(at::randn({64}), at::Tensor()).find("x must be"), std::string::npos);
  EXPECT_NE(message(at::randn({2, 64}), at::randn({15})).find("bias must be"), std::string::npos);
  BlockQuantWeight broken = w;
  broken.scales = broken.scales.to(at::kFloat);
  const absl::StatusOr<at::Tensor> y = BlockQuantGemvByParts(broken, at::randn({1, 64}), {});
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(y.status().message()).find("weight"), std::string::npos);
}

const at::ScalarType kOutputTypes[] = {at::kFloat, at::kBFloat16, at::kHalf};

// The twin writes DequantizeBlocks' values rounded once to the dtype, to the bit.
TEST(DequantizeBlocksTo, TheDequantisedWeightInEachDtype) {
  at::manual_seed(8);
  for (BlockFormat format : kFormats) {
    const BlockQuantWeight w = RandomWeight(37, 544, format);
    const at::Tensor dense = DequantizeBlocks(w);  // [N, K] float32
    for (at::ScalarType dtype : kOutputTypes) {
      const absl::StatusOr<at::Tensor> out = DequantizeBlocksTo(w, dtype);
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(out->scalar_type(), dtype);
      EXPECT_TRUE(at::equal(*out, dense.to(dtype)))
          << BlockFormatName(format) << " " << c10::toString(dtype);
    }
  }
  // Rounding to bfloat16 and float16 as LibTorch does, ties and overflow included.
  const at::Tensor edges = at::tensor({1.00390625f, 1.01171875f, 65520.0f, -65504.0f, 3e-8f,
                                       -1e-40f, 3.0e38f, std::numeric_limits<float>::infinity()});
  for (int64_t i = 0; i < edges.numel(); ++i) {
    const float v = edges[i].item<float>();
    EXPECT_EQ(block_quant::FloatToBFloat16(v), c10::BFloat16(v).x) << v;
  }
  EXPECT_EQ(
      DequantizeBlocksTo(RandomWeight(16, 32, BlockFormat::kQ8_0), at::kDouble).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(BlockQuantWeightTo, TheSameTensorsWhereTheyAlreadyAre) {
  const BlockQuantWeight w = RandomWeight(16, 64, BlockFormat::kQ4_0);
  const BlockQuantWeight moved = BlockQuantWeightTo(w, c10::Device(c10::kCPU));
  EXPECT_TRUE(moved.values.is_same(w.values));
  EXPECT_TRUE(moved.scales.is_same(w.scales));
}

bool SkipWithoutCuda() {
  if (!BlockQuantHasCudaKernel()) {
    std::cout << "skipped: built against a CPU-only LibTorch\n";
    return true;
  }
  if (!CudaAvailable()) {
    std::cout << "skipped: no CUDA device\n";
    return true;
  }
  return false;
}

// The CUDA kernel equals its CPU twin bit for bit on every shape (same integer dots, same float
// operations in the same order).
TEST(BlockQuantGemvByParts, CudaKernelMatchesTheTwin) {
  if (SkipWithoutCuda()) GTEST_SKIP() << "no CUDA kernel or device";
  const c10::Device cuda(c10::kCUDA, 0);
  at::manual_seed(6);
  for (BlockFormat format : kFormats) {
    for (const Shape& s : kShapes) {
      const BlockQuantWeight w = RandomWeight(s.n_out, s.k, format);
      const at::Tensor x = RandomRows(s.rows, s.k), bias = at::randn({s.n_out});
      const at::Tensor twin = *BlockQuantGemvByParts(w, x, bias);
      const absl::StatusOr<at::Tensor> kernel =
          BlockQuantGemvByParts(BlockQuantWeightTo(w, cuda), x.to(cuda), bias.to(cuda));
      ASSERT_TRUE(kernel.ok()) << kernel.status();
      EXPECT_TRUE(at::equal(kernel->cpu(), twin))
          << BlockFormatName(format) << " " << s.rows << "x" << s.n_out << "x" << s.k
          << ": max difference " << (kernel->cpu() - twin).abs().max().item<float>();
    }
  }
}

// Dequantising on the device (prefill's path, and embedding rows) gives the CPU's values.
TEST(BlockQuantGemvByParts, CudaDequantisationMatchesTheCpu) {
  if (SkipWithoutCuda()) GTEST_SKIP() << "no CUDA kernel or device";
  const c10::Device cuda(c10::kCUDA, 0);
  at::manual_seed(7);
  for (BlockFormat format : kFormats) {
    const BlockQuantWeight w = RandomWeight(100, 544, format);
    const BlockQuantWeight on_device = BlockQuantWeightTo(w, cuda);
    EXPECT_TRUE(at::equal(DequantizeBlocks(on_device).cpu(), DequantizeBlocks(w)));
    for (at::ScalarType dtype : kOutputTypes) {
      const absl::StatusOr<at::Tensor> kernel = DequantizeBlocksTo(on_device, dtype);
      ASSERT_TRUE(kernel.ok()) << kernel.status();
      EXPECT_TRUE(at::equal(kernel->cpu(), *DequantizeBlocksTo(w, dtype))) << c10::toString(dtype);
    }
    for (int64_t count : {3, 40}) {
      const at::Tensor rows = at::randint(0, 100, {count}, at::kLong);
      EXPECT_TRUE(at::equal(DequantizeBlockRows(on_device, rows.to(cuda)).cpu(),
                            DequantizeBlockRows(w, rows)))
          << count << " rows";
    }
  }
}

}  // namespace
}  // namespace lgpt
