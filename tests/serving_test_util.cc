#include "tests/serving_test_util.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <functional>
#include <utility>
#include <vector>

#include "core/config/config_presets.h"
#include "core/model/checkpoint.h"
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

std::unique_ptr<KVCache> BatchOneCache(GPTImpl& model, const KVCacheSpec& spec, int64_t length,
                                       int64_t growth_step) {
  KVCacheShape shape;
  shape.growth_step = growth_step;
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

GPT GoldenModel(const std::string& name) { return LoadModel("tests/testdata/" + name); }

GPT LoadModel(const std::string& dir) {
  absl::StatusOr<LoadedModel> loaded = LoadCheckpoint(dir);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return loaded->model;
}

GPT NoisyCopy(const GPTImpl& model) {
  absl::StatusOr<GPT> copy = GPTImpl::Create(model.config());
  EXPECT_TRUE(copy.ok()) << copy.status();
  at::NoGradGuard no_grad;
  at::manual_seed(77);
  const auto source = model.named_parameters();
  for (auto& item : (*copy)->named_parameters()) {
    const at::Tensor& original = source[item.key()];
    item.value().copy_(original);
    if (original.numel() > 1) {
      item.value().add_(at::randn_like(original) * original.std().item<double>() * 0.1);
    }
  }
  (*copy)->eval();
  return *copy;
}

std::shared_ptr<BlockPool> TestPool(GPTImpl& model, int64_t blocks, int64_t entries_per_block,
                                    at::ScalarType dtype, int entry_bits) {
  KVCacheGeometry geometry;
  geometry.layers = model.CacheLayout();
  geometry.dtype = dtype;
  BlockPoolOptions options;
  options.entries_per_block = entries_per_block;
  options.num_blocks = blocks;
  options.entry_bits = entry_bits;
  absl::StatusOr<std::shared_ptr<BlockPool>> pool = BlockPool::Create(geometry, options);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? *pool : nullptr;
}

std::vector<Job> Jobs(GPTImpl& model, int count, uint64_t seed) {
  const std::vector<KVCacheSpec> specs = {
      TestSpec("dense", 0, 16), TestSpec("window", 8, 16), TestSpec("sink", 8, 16),
      TestSpec("h2o", 8, 16),   TestSpec("dense", 0, 8),   TestSpec("tova", 8, 4),
  };
  at::manual_seed(seed);
  const int64_t vocab = model.config().PaddedVocabSize();
  std::vector<Job> jobs;
  for (int i = 0; i < count; ++i) {
    Job job;
    const int64_t length = 1 + (i * 7) % 19;
    const at::Tensor ids = at::randint(0, vocab, {length}, at::kLong);
    job.prompt.assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + length);
    job.options.max_new_tokens = 6 + i % 9;
    job.options.seed = 100 + i;
    if (i % 3 == 2) {
      job.options.sampling = {1.0, 20, 1.0};  // sampled: each request's own generator
    } else {
      job.options.sampling = {0.0, 0, 1.0};  // greedy
    }
    job.options.prefill_chunk = i % 4 == 3 ? 5 : 0;
    job.spec = specs[i % specs.size()];
    jobs.push_back(job);
  }
  return jobs;
}

std::vector<int64_t> Alone(GPTImpl& model, const Job& job) {
  std::unique_ptr<KVCache> cache = BatchOneCache(
      model, job.spec, static_cast<int64_t>(job.prompt.size()) + job.options.max_new_tokens);
  absl::StatusOr<std::vector<int64_t>> tokens = Generate(model, *cache, job.prompt, job.options);
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  return tokens.ok() ? *tokens : std::vector<int64_t>();
}

bool UsesAtenTanh(const Config& config) {
  return config.final_logit_softcapping.has_value() || config.gelu_approximate == "tanh" ||
         config.mlp_class == MlpClass::kGemmaMLP || config.mlp_class == MlpClass::kGptNeoxMLP;
}

bool AtenTanhIsPositionInvariant() {
  const at::Tensor x = at::linspace(-4.0, 4.0, 48);
  const at::Tensor shifted = at::cat({at::zeros({7}), x, at::zeros({3})});
  for (const auto& op : std::vector<std::function<at::Tensor(const at::Tensor&)>>{
           [](const at::Tensor& t) { return at::tanh(t); },
           [](const at::Tensor& t) { return at::gelu(t, "tanh"); },
           [](const at::Tensor& t) { return at::gelu(t); }}) {
    if (!at::equal(op(shifted).narrow(0, 7, 48), op(x))) return false;
  }
  return true;
}

}  // namespace lgpt
