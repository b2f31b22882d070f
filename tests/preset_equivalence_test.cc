// For every preset (shrunken, random weights): logits of a prefill in chunks followed by
// token-by-token decoding through the KV cache equal the full forward pass, for chunk
// sizes 1, 2, 3, the window size, longer than the window, and the whole prompt. Presets that
// shrink to the same structure run once, under the name of the first (tests/preset_groups.h).
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "core/base/device.h"
#include "core/config/config_presets.h"
#include "core/model/gpt.h"
#include "gtest/gtest.h"
#include "tests/preset_groups.h"
#include "tests/test_models.h"

namespace lgpt {
namespace {

constexpr double kTolerance = 1e-5;
constexpr int64_t kBatch = 2, kPrompt = 9, kTotal = 14;

class PresetEquivalenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PresetEquivalenceTest, CachedDecodingEqualsFullForward) {
  const ShrunkPresetGroup* group = ShrunkPresetGroupOf(GetParam());
  ASSERT_NE(group, nullptr) << GetParam();
  RecordProperty("presets", absl::StrJoin(group->presets, ","));
  absl::StatusOr<Config> preset = PresetFromName(GetParam());
  ASSERT_TRUE(preset.ok()) << preset.status();
  absl::StatusOr<Config> config = ShrinkConfig(*preset);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<GPT> created = GPTImpl::Create(*config);
  ASSERT_TRUE(created.ok()) << created.status();
  GPT model = *created;
  RandomizeWeights(*model, /*seed=*/1234);
  model->To(DefaultDevice(), at::kFloat);
  model->eval();

  at::manual_seed(99);
  const at::Tensor tokens = at::randint(0, config->vocab_size, {kBatch, kTotal}, at::kLong);
  absl::StatusOr<at::Tensor> full = model->Forward(tokens);
  ASSERT_TRUE(full.ok()) << full.status();
  const at::Tensor expected = full->cpu();

  const int64_t window = config->sliding_window_size.value_or(4);
  for (int64_t chunk : {int64_t{1}, int64_t{2}, int64_t{3}, window, window + 2, kPrompt}) {
    auto cache = model->NewDenseCache(kBatch, kTotal);
    ASSERT_TRUE(cache.ok()) << cache.status();
    std::vector<at::Tensor> pieces;
    int64_t position = 0;
    while (position < kTotal) {
      const int64_t length = position < kPrompt ? std::min(chunk, kPrompt - position) : 1;
      ForwardOptions options;
      options.positions =
          at::arange(position, position + length, at::kLong).unsqueeze(0).expand({kBatch, length});
      absl::StatusOr<at::Tensor> logits =
          model->Forward(tokens.narrow(1, position, length), cache->get(), options);
      ASSERT_TRUE(logits.ok()) << logits.status();
      pieces.push_back(logits->cpu());
      position += length;
    }
    const at::Tensor got = at::cat(pieces, 1);
    const double diff = (got - expected).abs().max().item<double>();
    EXPECT_LT(diff, kTolerance) << GetParam() << ", prefill chunk " << chunk;
    EXPECT_GT(expected.abs().max().item<double>(), 0.1) << "logits are too small to compare";
    // Windowed layers hold window-sized storage, whatever the chunking.
    for (int64_t layer = 0; layer < config->n_layer; ++layer) {
      if (config->IsSlidingWindowLayer(layer)) {
        EXPECT_EQ((*cache)->capacity(layer), window) << "layer " << layer;
      }
    }
  }
}

std::string TestName(const ::testing::TestParamInfo<std::string>& info) {
  std::string name;
  for (char c : info.param) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(AllPresets, PresetEquivalenceTest,
                         ::testing::ValuesIn(ShrunkPresetRepresentatives()), TestName);

TEST(PresetCoverageTest, EveryRequiredFamilyHasPresets) {
  for (const char* family :
       {"pythia", "falcon-7b", "Falcon3", "Llama-2", "Llama-3", "CodeLlama", "tiny-llama",
        "Mistral", "Mixtral", "gemma-", "gemma-2", "gemma-3", "phi-2", "Phi-3", "Qwen2.5", "Qwen3",
        "SmolLM2", "OLMo-2", "stablelm"}) {
    bool found = false;
    for (const std::string& name : PresetNames()) {
      found =
          found || absl::StrContains(absl::AsciiStrToLower(name), absl::AsciiStrToLower(family));
    }
    EXPECT_TRUE(found) << "no preset for " << family;
  }
}

}  // namespace
}  // namespace lgpt
