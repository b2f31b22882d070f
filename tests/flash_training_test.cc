// Training through the trainable flash attention (core/ops/flash_attention_grad.h): the
// default model's architecture at a sequence length that is no multiple of the kernel's tiles,
// float32, gives the loss gradient of every parameter that float64 autograd through the
// generic attention path gives.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>

#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/model/gpt.h"

namespace lgpt {
namespace {

constexpr char kConfig[] = "tools/default_model/model_config.yaml";
constexpr int64_t kSteps = 300;

// The autograd nodes named `name` in the graph that made `t`.
int CountNodes(const at::Tensor& t, const std::string& name) {
  std::vector<torch::autograd::Node*> stack = {t.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  int count = 0;
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    if (node->name().find(name) != std::string::npos) ++count;
    for (const torch::autograd::Edge& edge : node->next_edges())
      stack.push_back(edge.function.get());
  }
  return count;
}

TEST(FlashTrainingTest, DefaultModelLossGradientMatchesTheGenericPath) {
  absl::StatusOr<Config> config = LoadConfigFile(kConfig);
  ASSERT_TRUE(config.ok()) << config.status();
  config->block_size = 512;
  at::manual_seed(11);
  absl::StatusOr<GPT> flash = GPTImpl::Create(*config);
  ASSERT_TRUE(flash.ok()) << flash.status();
  absl::StatusOr<GPT> reference = GPTImpl::Create(*config);
  ASSERT_TRUE(reference.ok()) << reference.status();
  {
    at::NoGradGuard no_grad;
    auto from = (*flash)->named_parameters();
    for (auto& p : (*reference)->named_parameters()) p.value().copy_(from[p.key()]);
  }
  // float64 takes the generic path (the flash kernels are float32 only).
  (*reference)->To(at::kCPU, at::kDouble);
  const at::Tensor ids = at::randint(0, config->vocab_size, {2, kSteps + 1}, at::kLong);
  const at::Tensor inputs = ids.narrow(1, 0, kSteps), targets = ids.narrow(1, 1, kSteps);
  for (GPT* model : {&*flash, &*reference}) {
    absl::StatusOr<at::Tensor> logits = (*model)->Forward(inputs);
    ASSERT_TRUE(logits.ok()) << logits.status();
    const at::Tensor loss =
        at::cross_entropy_loss(logits->reshape({-1, logits->size(-1)}), targets.reshape({-1}));
    // One trainable flash node per layer in float32, none in float64.
    EXPECT_EQ(CountNodes(loss, "FlashAttentionFunction"), model == &*flash ? config->n_layer : 0);
    loss.backward();
  }
  const auto want = (*reference)->named_parameters();
  int compared = 0;
  double worst = 0;
  for (const auto& p : (*flash)->named_parameters()) {
    const at::Tensor got = p.value().grad();
    const at::Tensor expected = want[p.key()].grad();
    ASSERT_TRUE(got.defined() && expected.defined()) << p.key();
    const double scale = expected.abs().max().item<double>();
    ASSERT_GT(scale, 0) << p.key();
    const double diff = (got.to(at::kDouble) - expected).abs().max().item<double>();
    EXPECT_LE(diff, 1e-4 * scale) << p.key() << ": diff " << diff << ", max " << scale;
    worst = std::max(worst, diff / scale);
    ++compared;
  }
  EXPECT_GT(compared, 10);
  std::cout << "largest difference / largest gradient: " << worst << "\n";
}

}  // namespace
}  // namespace lgpt
