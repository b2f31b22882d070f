#include "tools/model_memory.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include "core/base/system_memory.h"
#include "core/config/config_presets.h"
#include "core/model/gpt.h"

namespace lgpt {
namespace {

TEST(ModelMemory, CountsTheParametersOfTheInitialisedModel) {
  for (const char* name : {"pythia-14m", "Mixtral-8x7B-v0.1"}) {
    absl::StatusOr<Config> config = ConfigFromName(name);
    ASSERT_TRUE(config.ok()) << config.status();
    if (std::string(name) == "Mixtral-8x7B-v0.1") {  // a small one of its shape
      config->n_layer = 2;
      config->n_embd = 64;
      config->n_head = 4;
      config->head_size = 16;
      config->n_query_groups = 2;
      config->intermediate_size = 96;
      config->padded_vocab_size = config->vocab_size = 512;
    }
    const absl::StatusOr<int64_t> counted = CountParameters(*config);
    ASSERT_TRUE(counted.ok()) << counted.status();
    const std::shared_ptr<GPTImpl> model = *GPTImpl::Create(*config);
    int64_t expected = 0;
    for (const at::Tensor& p : model->parameters()) expected += p.numel();
    EXPECT_EQ(*counted, expected) << name;
  }
}

int64_t PeakRssBytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return int64_t{usage.ru_maxrss} << 10;
}

TEST(ModelMemory, CountingWritesNoWeights) {
  // A 4M-token embedding and head of 2 GiB each: counting must not initialise either.
  Config config = *ConfigFromName("pythia-14m");
  config.padded_vocab_size = config.vocab_size = int64_t{1} << 22;
  const int64_t before = PeakRssBytes();
  const absl::StatusOr<int64_t> counted = CountParameters(config);
  ASSERT_TRUE(counted.ok()) << counted.status();
  EXPECT_GT(*counted, 2 * config.PaddedVocabSize() * config.n_embd);
  EXPECT_LT(PeakRssBytes() - before, int64_t{256} << 20);
}

TEST(ModelMemory, RefusesWhatExceedsTheAvailableMemory) {
  if (!AvailableMemoryBytes()) GTEST_SKIP() << "no /proc/meminfo: the check does not apply";
  const Config config = *ConfigFromName("pythia-14m");
  EXPECT_TRUE(CheckParametersFitMemory(config, 4, "initialising them").ok());
  const absl::Status refused =
      CheckParametersFitMemory(config, int64_t{1} << 40, "initialising them");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("pythia-14m has"), absl::string_view::npos) << refused;
  EXPECT_NE(refused.message().find("MiB of memory are available"), absl::string_view::npos);
}

}  // namespace
}  // namespace lgpt
