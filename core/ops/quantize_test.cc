#include "core/ops/quantize.h"

#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "core/ops/gemv.h"

namespace lgpt {
namespace {

TEST(QuantizeInt8, ErrorWithinHalfAStepPerGroup) {
  at::manual_seed(0);
  const at::Tensor w = at::randn({37, 128}) * 0.05;
  for (const int64_t group : {0, 32, 64, 128}) {
    const Int8Weight q = QuantizeInt8(w, group);
    const int64_t g = group == 0 ? 128 : group;
    ASSERT_EQ(q.values.scalar_type(), at::kChar);
    ASSERT_EQ(q.scales.sizes(), (std::vector<int64_t>{37, 128 / g}));
    EXPECT_LE(q.values.abs().max().item<int>(), 127);
    const at::Tensor error = (DequantizeInt8(q) - w).abs().view({37, 128 / g, g});
    // Rounding to the nearest step: at most half a step (scale) per element.
    const at::Tensor bound = q.scales.unsqueeze(-1) * 0.5 + 1e-7;
    EXPECT_TRUE((error <= bound).all().item<bool>()) << "group " << group;
    // Each group's largest magnitude maps to ±127 exactly.
    EXPECT_EQ(q.values.abs().view({37, 128 / g, g}).amax(-1).min().item<int>(), 127);
  }
}

TEST(QuantizeInt8, ZeroRowsAndBadGroups) {
  at::Tensor w = at::randn({4, 16});
  w[1].zero_();
  const Int8Weight q = QuantizeInt8(w);
  EXPECT_TRUE(at::equal(DequantizeInt8(q)[1], at::zeros({16})));
  EXPECT_THROW(QuantizeInt8(w, 5), c10::Error);
  EXPECT_THROW(QuantizeInt8(w, 12), c10::Error);
}

class Int8GemvShapes
    : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, int64_t, bool>> {};

// The int8 GEMV equals at::linear with the dequantised weight.
TEST_P(Int8GemvShapes, EqualsDequantisedLinear) {
  const auto [rows, n_out, k, group, with_bias] = GetParam();
  at::manual_seed(rows + n_out + k);
  const Int8Weight q = QuantizeInt8(at::randn({n_out, k}), group);
  const at::Tensor b = with_bias ? at::randn({n_out}) : at::Tensor();
  const at::Tensor x = at::randn({rows, k});
  const at::Tensor expected = at::linear(x, DequantizeInt8(q), b);
  for (const bool avx2 : {false, true}) {
    if (avx2 && !CpuHasAvx2Fma()) continue;
    at::Tensor y = at::empty({rows, n_out});
    Int8Gemv(q, with_bias ? b.data_ptr<float>() : nullptr, x.data_ptr<float>(), y.data_ptr<float>(),
             rows, avx2);
    EXPECT_TRUE(at::allclose(y, expected, 1e-5, 1e-4))
        << (avx2 ? "avx2" : "portable") << " max diff " << (y - expected).abs().max().item<float>();
  }
}

// Every combination whose group size divides k (groups of 8 or 32 need k a multiple of them).
std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, bool>> GemvShapes() {
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, bool>> shapes;
  for (const int64_t rows : {1, 2, 3, 4, 5, 9, 32}) {
    for (const int64_t n_out : {1, 9, 70, 1031}) {
      for (const int64_t k : {8, 13, 64, 771}) {
        for (const int64_t group : {0, 8, 32}) {
          if (group > 0 && k % group != 0) continue;
          for (const bool with_bias : {false, true}) {
            shapes.emplace_back(rows, n_out, k, group, with_bias);
          }
        }
      }
    }
  }
  return shapes;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Int8GemvShapes, ::testing::ValuesIn(GemvShapes()));

}  // namespace
}  // namespace lgpt
