// Compares lgpt with LitGPT's own outputs (tests/testdata/golden, made by LitGPT 0.5.13):
// full-forward logits within 1e-4, and greedy continuations token for token, with and
// without the KV cache and for every prefill chunking.
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "core/base/device.h"
#include "core/model/checkpoint.h"
#include "core/model/gpt.h"
#include "core/io/npy.h"
#include "core/io/torch_pickle.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

constexpr double kLogitTolerance = 1e-4;

std::string CaseDir(const std::string& name) { return "tests/testdata/" + name; }

at::Tensor Npy(const std::string& path) {
  absl::StatusOr<at::Tensor> tensor = ReadNpy(path);
  EXPECT_TRUE(tensor.ok()) << tensor.status();
  return tensor.ok() ? *tensor : at::Tensor();
}

class GoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    LoadOptions options;
    options.device = DefaultDevice();
    absl::StatusOr<LoadedModel> loaded = LoadCheckpoint(CaseDir(GetParam()), options);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    model_ = loaded->model;
    tokens_ = Npy(CaseDir(GetParam()) + "/tokens.npy").unsqueeze(0);
    logits_ = Npy(CaseDir(GetParam()) + "/logits.npy");
    prompt_ = Npy(CaseDir(GetParam()) + "/prompt.npy").unsqueeze(0);
    greedy_ = Npy(CaseDir(GetParam()) + "/greedy.npy");
  }

  // Logits of `tokens` [1, T] computed through a cache in chunks of `chunk` tokens.
  at::Tensor ChunkedLogits(int64_t chunk) {
    auto cache = model_->NewDenseCache(1, tokens_.size(1));
    EXPECT_TRUE(cache.ok()) << cache.status();
    std::vector<at::Tensor> pieces;
    for (int64_t start = 0; start < tokens_.size(1); start += chunk) {
      const int64_t length = std::min(chunk, tokens_.size(1) - start);
      ForwardOptions options;
      options.positions = at::arange(start, start + length, at::kLong).unsqueeze(0);
      auto logits = model_->Forward(tokens_.narrow(1, start, length), cache->get(), options);
      EXPECT_TRUE(logits.ok()) << logits.status();
      pieces.push_back(logits->squeeze(0).cpu());
    }
    return at::cat(pieces, 0);
  }

  // Greedy continuation of the prompt: prefill in chunks of `chunk`, then one token a step.
  std::vector<int64_t> GreedyCached(int64_t chunk) {
    const int64_t new_tokens = greedy_.size(0);
    const int64_t prompt_length = prompt_.size(1);
    auto cache = model_->NewDenseCache(1, prompt_length + new_tokens);
    EXPECT_TRUE(cache.ok()) << cache.status();
    at::Tensor last;
    for (int64_t start = 0; start < prompt_length; start += chunk) {
      const int64_t length = std::min(chunk, prompt_length - start);
      ForwardOptions options;
      options.positions = at::arange(start, start + length, at::kLong).unsqueeze(0);
      options.last_logits_only = true;
      auto logits = model_->Forward(prompt_.narrow(1, start, length), cache->get(), options);
      EXPECT_TRUE(logits.ok()) << logits.status();
      last = *logits;
    }
    std::vector<int64_t> out;
    for (int64_t i = 0; i < new_tokens; ++i) {
      const int64_t next = last.reshape({-1}).argmax().item<int64_t>();
      out.push_back(next);
      ForwardOptions options;
      options.positions = at::full({1, 1}, prompt_length + i, at::kLong);
      auto logits = model_->Forward(at::full({1, 1}, next, at::kLong), cache->get(), options);
      EXPECT_TRUE(logits.ok()) << logits.status();
      last = *logits;
    }
    return out;
  }

  std::vector<int64_t> Expected() const {
    const at::Tensor g = greedy_.contiguous();
    return std::vector<int64_t>(g.data_ptr<int64_t>(), g.data_ptr<int64_t>() + g.numel());
  }

  GPT model_;
  at::Tensor tokens_, logits_, prompt_, greedy_;
};

TEST_P(GoldenTest, FullForwardMatchesLitGptLogits) {
  auto logits = model_->Forward(tokens_);
  ASSERT_TRUE(logits.ok()) << logits.status();
  const at::Tensor got = logits->squeeze(0).cpu();
  ASSERT_EQ(got.sizes(), logits_.sizes());
  EXPECT_LT((got - logits_).abs().max().item<double>(), kLogitTolerance);
}

TEST_P(GoldenTest, ChunkedPrefillMatchesLitGptLogits) {
  for (int64_t chunk : {1, 2, 3, 7, 20}) {
    const at::Tensor got = ChunkedLogits(chunk);
    EXPECT_LT((got - logits_).abs().max().item<double>(), kLogitTolerance) << "chunk " << chunk;
  }
}

TEST_P(GoldenTest, GreedyWithoutCacheMatchesLitGpt) {
  at::Tensor sequence = prompt_.clone();
  std::vector<int64_t> out;
  for (int64_t i = 0; i < greedy_.size(0); ++i) {
    ForwardOptions options;
    options.last_logits_only = true;
    auto logits = model_->Forward(sequence, nullptr, options);
    ASSERT_TRUE(logits.ok()) << logits.status();
    const int64_t next = logits->reshape({-1}).argmax().item<int64_t>();
    out.push_back(next);
    sequence = at::cat({sequence, at::full({1, 1}, next, at::kLong)}, 1);
  }
  EXPECT_EQ(out, Expected());
}

TEST_P(GoldenTest, GreedyWithCacheMatchesLitGptForEveryChunking) {
  for (int64_t chunk : {1, 2, 3, 8}) {
    EXPECT_EQ(GreedyCached(chunk), Expected()) << "prefill chunk " << chunk;
  }
}

// Cases that also carry LitGPT's lit_model.pth.
using GoldenPthTest = GoldenTest;

TEST_P(GoldenPthTest, PthAndSafetensorsHoldTheSameWeights) {
  auto pth = ReadTorchStateDict(CaseDir(GetParam()) + "/lit_model.pth");
  ASSERT_TRUE(pth.ok()) << pth.status();
  GPT reloaded = *GPTImpl::Create(model_->config());
  ASSERT_TRUE(LoadStateDict(*reloaded, *pth, "lit_model.pth").ok());
  reloaded->To(model_->device(), model_->dtype());
  auto a = model_->Forward(tokens_);
  auto b = reloaded->Forward(tokens_);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(at::equal(*a, *b));
}

std::string CaseName(const ::testing::TestParamInfo<std::string>& info) {
  return info.param.substr(info.param.find('/') + 1);
}

INSTANTIATE_TEST_SUITE_P(LitGpt, GoldenTest,
                         ::testing::Values("golden/llama2", "golden/llama3_gqa", "golden/pythia",
                                           "golden_extra/gemma2", "golden_extra/gemma3",
                                           "golden_extra/phi2", "golden_extra/falcon",
                                           "golden_extra/mixtral", "golden_extra/qwen3",
                                           "golden_extra/olmo2", "golden_extra/llama31_yarn",
                                           "golden_extra/linear_rope", "golden_extra/interleave",
                                           "golden_extra/qwen25", "golden_extra/stablelm"),
                         CaseName);

INSTANTIATE_TEST_SUITE_P(LitGpt, GoldenPthTest,
                         ::testing::Values("golden/llama2", "golden/llama3_gqa", "golden/pythia"),
                         CaseName);

}  // namespace
}  // namespace lgpt
