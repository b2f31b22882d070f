#include "core/nn/int8_linear.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <tuple>

#include "core/ops/gemv.h"

namespace lgpt {
namespace {

TEST(Int8Projection, DenseUntilQuantisedThenClose) {
  at::manual_seed(3);
  LinearSpec spec;
  spec.in_features = 96;
  spec.out_features = 40;
  spec.bias = true;
  Int8ProjectionImpl projection(spec, Int8Options{32, true});
  const at::Tensor w = projection.weight.detach().clone();
  const at::Tensor x = at::randn({1, 6, 96});  // prefill-sized: the dequantising path
  const at::Tensor step = at::randn({1, 1, 96});
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::allclose(projection.forward(x), at::linear(x, w, projection.bias), 1e-5, 1e-5));
  ASSERT_TRUE(projection.Quantize().ok());
  ASSERT_TRUE(projection.quantized());
  EXPECT_EQ(projection.weight.numel(), 0);
  const at::Tensor dq = DequantizeInt8(projection.int8_weight());
  EXPECT_TRUE(at::allclose(projection.forward(x), at::linear(x, dq, projection.bias), 1e-5, 1e-4));
  EXPECT_TRUE(
      at::allclose(projection.forward(step), at::linear(step, dq, projection.bias), 1e-5, 1e-4));
  // Close to the float projection: relative error of a few tenths of a percent.
  const at::Tensor exact = at::linear(x, w, projection.bias);
  EXPECT_LT(((projection.forward(x) - exact).norm() / exact.norm()).item<float>(), 0.01);
  EXPECT_TRUE(projection.Quantize().ok());  // again: a no-op
}

TEST(Int8Projection, RejectsGroupsThatDoNotDivide) {
  LinearSpec spec;
  spec.in_features = 100;
  spec.out_features = 4;
  Int8ProjectionImpl projection(spec, Int8Options{64, true});
  EXPECT_FALSE(projection.Quantize().ok());
}

TEST(Int8LinearFactory, HeadStaysDenseWhenAsked) {
  LinearSpec spec;
  spec.site = LinearSite::kHead;
  spec.in_features = 8;
  spec.out_features = 8;
  EXPECT_NE(dynamic_cast<Int8ProjectionImpl*>(Int8LinearFactory().Make(spec).get()), nullptr);
  EXPECT_EQ(
      dynamic_cast<Int8ProjectionImpl*>(Int8LinearFactory(Int8Options{0, false}).Make(spec).get()),
      nullptr);
}

}  // namespace
}  // namespace lgpt
