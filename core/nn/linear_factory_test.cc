#include "core/nn/linear_factory.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <tuple>

namespace lgpt {
namespace {

// |a - b| <= atol + rtol |b|, with atol scaled to the size of the dot products.
void ExpectClose(const at::Tensor& actual, const at::Tensor& expected, int64_t k) {
  ASSERT_EQ(actual.sizes(), expected.sizes());
  const double atol = 1e-5 * std::sqrt(static_cast<double>(k));
  EXPECT_TRUE(at::allclose(actual, expected, /*rtol=*/1e-5, atol))
      << "max abs diff " << (actual - expected).abs().max().item<float>();
}

TEST(DenseProjection, FastPathMatchesAndAutogradStillWorks) {
  at::manual_seed(2);
  LinearSpec spec;
  spec.in_features = 50;
  spec.out_features = 70;
  spec.bias = true;
  DenseProjectionImpl projection(spec);
  projection.bias.data().normal_();
  const at::Tensor x = at::randn({1, 1, 50});
  const at::Tensor reference = at::linear(x, projection.weight, projection.bias).detach();
  {
    at::NoGradGuard no_grad;
    ExpectClose(projection.forward(x), reference, 50);
  }
  // With grad mode on, parameters requiring grad take the autograd path.
  const at::Tensor y = projection.forward(x);
  ASSERT_TRUE(y.requires_grad());
  y.sum().backward();
  ASSERT_TRUE(projection.weight.grad().defined());
  ExpectClose(projection.weight.grad(), x.reshape({1, 50}).expand({70, 50}), 1);
}

}  // namespace
}  // namespace lgpt
