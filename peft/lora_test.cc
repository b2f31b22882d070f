#include "peft/lora.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <memory>

#include "core/nn/int8_linear.h"
#include "peft/adapter_v2.h"

namespace lgpt {
namespace {

LinearSpec Spec(LinearSite site, int64_t in, int64_t out, bool bias) {
  LinearSpec spec;
  spec.site = site;
  spec.in_features = in;
  spec.out_features = out;
  spec.bias = bias;
  return spec;
}

LoraOptions Options() {
  LoraOptions options;
  options.r = 4;
  options.alpha = 8;
  options.query = options.key = options.value = options.projection = options.mlp = true;
  return options;
}

// Gives the LoRA update non-zero weights (LitGPT starts B at zero).
void Randomise(LoraProjectionImpl& lora) {
  at::NoGradGuard no_grad;
  lora.lora_B.normal_();
}

// The same LoRA weights on a dense base holding `weight`.
std::shared_ptr<LoraProjectionImpl> DenseTwin(const LinearSpec& spec, const LoraProjectionImpl& lora,
                                              const at::Tensor& weight, const at::Tensor& bias) {
  auto twin = std::dynamic_pointer_cast<LoraProjectionImpl>(LoraLinearFactory(Options()).Make(spec));
  at::NoGradGuard no_grad;
  auto* dense = dynamic_cast<DenseProjectionImpl*>(twin->linear.get());
  dense->weight.copy_(weight);
  if (bias.defined()) dense->bias.copy_(bias);
  twin->lora_A.copy_(lora.lora_A);
  twin->lora_B.copy_(lora.lora_B);
  return twin;
}

TEST(LoraLinearFactory, DecoratesTheBaseFactorysProjections) {
  const LinearSpec spec = Spec(LinearSite::kMlpFc1, 32, 48, true);
  auto dense = LoraLinearFactory(Options()).Make(spec);
  auto int8 = LoraLinearFactory(Options(), std::make_shared<Int8LinearFactory>()).Make(spec);
  auto v2 = LoraLinearFactory(Options(), std::make_shared<AdapterV2LinearFactory>()).Make(spec);
  auto base_of = [](const ProjectionPtr& p) {
    return std::dynamic_pointer_cast<LoraProjectionImpl>(p)->linear.get();
  };
  EXPECT_EQ(typeid(*base_of(dense)), typeid(DenseProjectionImpl));
  EXPECT_NE(dynamic_cast<Int8ProjectionImpl*>(base_of(int8)), nullptr);
  EXPECT_NE(dynamic_cast<AdapterV2ProjectionImpl*>(base_of(v2)), nullptr);
  // LitGPT's names, the base's own under `linear.`.
  std::vector<std::string> names;
  for (const auto& item : v2->named_parameters()) names.push_back(item.key());
  EXPECT_EQ(names, (std::vector<std::string>{"lora_A", "lora_B", "linear.adapter_bias",
                                             "linear.adapter_scale", "linear.linear.weight",
                                             "linear.linear.bias"}));
}

// LoRA over int8 weights equals LoRA over the dequantised weights, in the forward pass and in
// the gradients of the LoRA parameters and of the input (the int8 autograd function).
class LoraOverInt8 : public ::testing::TestWithParam<bool> {};

TEST_P(LoraOverInt8, EqualsLoraOverTheDequantisedWeightsWithGradients) {
  at::manual_seed(7);
  const bool with_bias = GetParam();
  const LinearSpec spec = Spec(LinearSite::kMlpFc1, 64, 40, with_bias);
  auto lora = std::dynamic_pointer_cast<LoraProjectionImpl>(
      LoraLinearFactory(Options(), std::make_shared<Int8LinearFactory>()).Make(spec));
  Randomise(*lora);
  auto* int8 = dynamic_cast<Int8ProjectionImpl*>(lora->linear.get());
  if (with_bias) {
    at::NoGradGuard no_grad;
    int8->bias.normal_();
  }
  ASSERT_TRUE(int8->Quantize().ok());
  const at::Tensor dequantised = DequantizeInt8(int8->int8_weight());
  auto twin =
      DenseTwin(spec, *lora, dequantised, with_bias ? int8->bias.detach() : at::Tensor());
  for (auto* model : {lora.get(), twin.get()}) {
    for (auto& p : model->parameters()) p.set_requires_grad(false);
    model->lora_A.set_requires_grad(true);
    model->lora_B.set_requires_grad(true);
  }
  for (const int64_t rows : {1, 5}) {  // the GEMV path without autograd, and the matmul path
    const at::Tensor x = at::randn({2, rows, 64}).requires_grad_();
    const at::Tensor x_twin = x.detach().clone().requires_grad_();
    const at::Tensor y = lora->forward(x);
    const at::Tensor y_twin = twin->forward(x_twin);
    EXPECT_LT((y - y_twin).abs().max().item<double>(), 1e-4);
    const at::Tensor upstream = at::randn_like(y);
    (y * upstream).sum().backward();
    (y_twin * upstream).sum().backward();
    EXPECT_LT((x.grad() - x_twin.grad()).abs().max().item<double>(), 1e-4);
    EXPECT_LT((lora->lora_B.grad() - twin->lora_B.grad()).abs().max().item<double>(), 1e-3);
    EXPECT_GT(lora->lora_A.grad().abs().max().item<double>(), 0);
    for (auto* model : {lora.get(), twin.get()}) {
      model->lora_A.mutable_grad().reset();
      model->lora_B.mutable_grad().reset();
    }
    {
      at::NoGradGuard no_grad;  // decoding: the int8 GEMV
      EXPECT_LT((lora->forward(x) - twin->forward(x)).abs().max().item<double>(), 1e-4);
    }
  }
  // The int8 base stays frozen: no float weight appears.
  EXPECT_EQ(int8->weight.numel(), 0);
}

INSTANTIATE_TEST_SUITE_P(Bias, LoraOverInt8, ::testing::Bool());

TEST(LoraOverInt8Merge, MergeRefusesAndMergedStateDictDequantises) {
  at::manual_seed(8);
  const LinearSpec spec = Spec(LinearSite::kAttnProj, 32, 32, false);
  auto lora = std::dynamic_pointer_cast<LoraProjectionImpl>(
      LoraLinearFactory(Options(), std::make_shared<Int8LinearFactory>()).Make(spec));
  Randomise(*lora);
  ASSERT_TRUE(dynamic_cast<Int8ProjectionImpl*>(lora->linear.get())->Quantize().ok());
  const absl::Status merge = lora->Merge();
  EXPECT_EQ(merge.code(), absl::StatusCode::kFailedPrecondition) << merge;
  EXPECT_FALSE(lora->merged());
  const at::Tensor dequantised =
      DequantizeInt8(dynamic_cast<Int8ProjectionImpl*>(lora->linear.get())->int8_weight());
  EXPECT_TRUE(at::allclose(lora->DenseWeight(), dequantised + lora->DeltaWeight(), 1e-6, 1e-6));
}

TEST(LoraProjection, MergedEqualsUnmergedOnADenseBase) {
  at::manual_seed(9);
  LinearSpec spec = Spec(LinearSite::kQkv, 16, 16 + 2 * 8, true);
  spec.q_size = 16;
  spec.kv_size = 8;
  LoraOptions options = Options();
  options.key = false;  // a disabled part gets no update
  auto lora = std::dynamic_pointer_cast<LoraProjectionImpl>(LoraLinearFactory(options).Make(spec));
  Randomise(*lora);
  const at::Tensor x = at::randn({3, 16});
  at::NoGradGuard no_grad;
  const at::Tensor before = lora->forward(x);
  const at::Tensor delta = lora->DeltaWeight();
  EXPECT_EQ(delta.narrow(0, 16, 8).abs().max().item<double>(), 0.0);  // key rows
  EXPECT_GT(delta.narrow(0, 0, 16).abs().max().item<double>(), 0.0);
  ASSERT_TRUE(lora->Merge().ok());
  EXPECT_TRUE(lora->merged());
  EXPECT_TRUE(at::allclose(lora->forward(x), before, 1e-5, 1e-5));
}

// LoRA stacked on adapter v2: y = scale · (W x + b + adapter_bias) + scaling · B·A x.
TEST(LoraOverAdapterV2, ComposesBothUpdates) {
  at::manual_seed(10);
  const LinearSpec spec = Spec(LinearSite::kMlpProj, 24, 20, true);
  auto lora = std::dynamic_pointer_cast<LoraProjectionImpl>(
      LoraLinearFactory(Options(), std::make_shared<AdapterV2LinearFactory>()).Make(spec));
  Randomise(*lora);
  auto* v2 = dynamic_cast<AdapterV2ProjectionImpl*>(lora->linear.get());
  auto* dense = dynamic_cast<DenseProjectionImpl*>(v2->linear.get());
  at::NoGradGuard no_grad;
  v2->adapter_bias.normal_();
  v2->adapter_scale.uniform_(0.5, 1.5);
  dense->bias.normal_();
  const at::Tensor x = at::randn({4, 24});
  const at::Tensor expected =
      v2->adapter_scale * (at::linear(x, dense->weight, dense->bias) + v2->adapter_bias) +
      at::linear(at::linear(x, lora->lora_A), lora->lora_B) * (8.0 / 4.0);
  EXPECT_TRUE(at::allclose(lora->forward(x), expected, 1e-5, 1e-5));
}

}  // namespace
}  // namespace lgpt
