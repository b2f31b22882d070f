#include "tests/serving_test_util.h"

#include <utility>

#include "core/config/config_presets.h"
#include "gtest/gtest.h"
#include "tests/test_models.h"

namespace lgpt {

GPT RandomModel(const std::string& preset, uint64_t seed) {
  absl::StatusOr<Config> config = ShrinkConfig(*PresetFromName(preset));
  EXPECT_TRUE(config.ok()) << config.status();
  absl::StatusOr<GPT> model = GPTImpl::Create(*config);
  EXPECT_TRUE(model.ok()) << model.status();
  RandomizeWeights(**model, seed);
  (*model)->eval();
  return *model;
}

std::unique_ptr<KVCache> BatchOneCache(GPTImpl& model, const KVCacheSpec& spec, int64_t length) {
  KVCacheShape shape;
  shape.batch_size = 1;
  shape.max_sequence_length = length;
  shape.layers = model.CacheLayout();
  absl::StatusOr<std::unique_ptr<KVCache>> cache = MakeKVCache(spec, shape);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return cache.ok() ? *std::move(cache) : nullptr;
}

KVCacheSpec TestSpec(const std::string& policy, int64_t budget, int bits) {
  KVCacheSpec spec;
  spec.policy = policy;
  spec.budget = budget;
  spec.bits = bits;
  spec.residual = 2;
  spec.group_size = 8;
  return spec;
}

}  // namespace lgpt
