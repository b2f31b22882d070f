#include "core/nn/block_quant_linear.h"

#include <memory>
#include <string>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include "core/ops/gemv.h"

namespace lgpt {
namespace {

LinearSpec Spec(LinearSite site, int64_t in, int64_t out, bool bias) {
  LinearSpec spec;
  spec.site = site;
  spec.layer = 0;
  spec.in_features = in;
  spec.out_features = out;
  spec.bias = bias;
  return spec;
}

std::shared_ptr<BlockQuantProjectionImpl> Make(const LinearSpec& spec, BlockFormat format) {
  auto p = std::dynamic_pointer_cast<BlockQuantProjectionImpl>(
      BlockQuantLinearFactory({format, true}).Make(spec));
  EXPECT_NE(p, nullptr);
  return p;
}

double RelativeError(const at::Tensor& a, const at::Tensor& b) {
  return ((a - b).norm() / b.norm()).item<double>();
}

TEST(BlockQuantProjection, DecodeAndPrefillPathsMatchTheDenseProjection) {
  at::NoGradGuard no_grad;
  at::manual_seed(0);
  for (BlockFormat format : {BlockFormat::kQ8_0, BlockFormat::kQ4_0}) {
    auto p = Make(Spec(LinearSite::kQkv, 128, 96, true), format);
    p->bias.normal_();
    const at::Tensor x_decode = at::randn({2, 3, 128});   // 6 rows
    const at::Tensor x_prefill = at::randn({1, 50, 128});  // 50 rows
    const at::Tensor dense_decode = p->forward(x_decode);
    const at::Tensor dense_prefill = p->forward(x_prefill);
    ASSERT_TRUE(p->Quantize().ok());
    ASSERT_TRUE(p->quantized());
    EXPECT_EQ(p->weight.numel(), 0);  // the float weight is freed
    ASSERT_TRUE(p->Quantize().ok());  // a no-op
    const at::Tensor decode = p->forward(x_decode);
    const at::Tensor prefill = p->forward(x_prefill);
    EXPECT_EQ(decode.sizes(), dense_decode.sizes());
    // Weight rounding only: q8_0 ~0.4%, q4_0 ~8% of the output norm for Gaussian weights;
    // the decode path adds activation rounding (~0.4%).
    const double bound = format == BlockFormat::kQ8_0 ? 0.02 : 0.15;
    EXPECT_LT(RelativeError(decode, dense_decode), bound) << BlockFormatName(format);
    EXPECT_LT(RelativeError(prefill, dense_prefill), bound) << BlockFormatName(format);
    // Both differ from the dequantised weight's product by the int8 activation rounding only.
    EXPECT_LT(RelativeError(decode, at::linear(x_decode, p->DenseWeight(), p->bias)), 0.02);
    EXPECT_LT(RelativeError(prefill, at::linear(x_prefill, p->DenseWeight(), p->bias)), 0.02);
    // A row's result is the same whether it comes with 49 other rows or alone.
    for (int64_t t : {0, 17, 49}) {
      EXPECT_TRUE(at::equal(p->forward(x_prefill.narrow(1, t, 1))[0][0], prefill[0][t]));
    }
  }
}

TEST(BlockQuantProjection, GradientsFlowThroughTheQuantisedWeight) {
  auto p = Make(Spec(LinearSite::kMlpFc1, 64, 32, false), BlockFormat::kQ4_0);
  ASSERT_TRUE(p->Quantize().ok());
  const at::Tensor x = at::randn({3, 64}).requires_grad_(true);
  p->forward(x).sum().backward();
  const at::Tensor expected = p->DenseWeight().sum(0).expand({3, 64});
  EXPECT_TRUE(at::allclose(x.grad(), expected, 1e-5, 1e-5));
  // With autograd the forward is the dequantised weight's product exactly.
  const at::Tensor x2 = at::randn({3, 64}).requires_grad_(true);
  EXPECT_TRUE(at::allclose(p->forward(x2), at::linear(x2, p->DenseWeight()), 1e-5, 1e-5));
}

TEST(BlockQuantLinearFactory, SitesThatStayDense) {
  const BlockQuantLinearFactory factory({BlockFormat::kQ4_0, false});
  auto is_quantisable = [](const ProjectionPtr& p) {
    return dynamic_cast<BlockQuantProjectionImpl*>(p.get()) != nullptr;
  };
  EXPECT_TRUE(is_quantisable(factory.Make(Spec(LinearSite::kMlpProj, 64, 16, false))));
  // in_features not a multiple of 32: left float (the stated fallback).
  EXPECT_FALSE(is_quantisable(factory.Make(Spec(LinearSite::kMlpProj, 48, 16, false))));
  EXPECT_FALSE(is_quantisable(factory.Make(Spec(LinearSite::kMoeGate, 64, 8, false))));
  EXPECT_FALSE(is_quantisable(factory.Make(Spec(LinearSite::kHead, 64, 100, false))));
  EXPECT_TRUE(is_quantisable(
      BlockQuantLinearFactory({BlockFormat::kQ8_0, true}).Make(Spec(LinearSite::kHead, 64, 100,
                                                                    false))));
}

TEST(BlockQuantProjection, InFeaturesNotAMultipleOf32IsAnError) {
  BlockQuantProjectionImpl p(Spec(LinearSite::kAttnProj, 40, 8, false), {});
  const absl::Status status = p.Quantize();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("attn.proj"), std::string::npos) << status;
  EXPECT_NE(status.message().find("in_features"), std::string::npos) << status;
  EXPECT_FALSE(p.quantized());
  EXPECT_EQ(p.weight.numel(), 320);  // untouched
}

}  // namespace
}  // namespace lgpt
