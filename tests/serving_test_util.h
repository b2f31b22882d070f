// Helpers of the serving tests: small random models and batch-1 caches of any kind.
#ifndef LGPT_TESTS_SERVING_TEST_UTIL_H_
#define LGPT_TESTS_SERVING_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/block_pool.h"
#include "cache/kv_cache.h"
#include "cache/kv_cache_factory.h"
#include "core/model/generate.h"
#include "core/model/gpt.h"

namespace lgpt {

// The preset shrunk (tests/test_models.h) with random weights, in eval mode.
GPT RandomModel(const std::string& preset, uint64_t seed);

// A batch-1 cache of `spec` for `length` positions of `model` (growth_step:
// KVCacheShape.growth_step).
std::unique_ptr<KVCache> BatchOneCache(GPTImpl& model, const KVCacheSpec& spec, int64_t length,
                                       int64_t growth_step = 0);

// A cache spec with small quantisation groups and residual, so tiny models quantise too.
KVCacheSpec TestSpec(const std::string& policy, int64_t budget, int bits);

// A checkpoint of tests/testdata ("golden/llama2").
GPT GoldenModel(const std::string& name);

// The checkpoint in `dir` (relative to the runfiles: "tools/default_model").
GPT LoadModel(const std::string& dir);

// The model with noise on its weights (10% of each tensor's spread, fixed seed): a draft that
// agrees with it often but not always (speculative decoding's blocks end at every position).
GPT NoisyCopy(const GPTImpl& model);

// A block pool of `blocks` blocks of `entries_per_block` entries of `dtype` for the model's
// cache layout (a float32 model's pool may hold 16-bit entries), or int8 / int4 entries
// (`entry_bits` 8 or 4, BlockPoolOptions).
std::shared_ptr<BlockPool> TestPool(GPTImpl& model, int64_t blocks, int64_t entries_per_block,
                                    at::ScalarType dtype = at::kFloat, int entry_bits = 16);

// A request of the serving tests.
struct Job {
  std::vector<int64_t> prompt;
  GenerateOptions options;
  KVCacheSpec spec;
};

// `count` jobs for `model`: prompts of 1..19 tokens, 6..14 new tokens, greedy and sampled
// decoding, whole-prompt and 5-token prefill chunks, dense, budgeted and quantised caches.
std::vector<Job> Jobs(GPTImpl& model, int count, uint64_t seed);

// The job's tokens from lgpt::Generate with its own batch-1 cache.
std::vector<int64_t> Alone(GPTImpl& model, const Job& job);

// Whether the model computes tanh (soft-capping, tanh GELU) through ATen's elementwise kernels.
bool UsesAtenTanh(const Config& config);

// Whether ATen's tanh and GELU give an element the same bits wherever it lies in a tensor.
// Debian's LibTorch 1.13 does; PyPI's (2.x, AVX-512) computes whole vectors with SLEEF and a
// tensor's last partial vectors with the scalar function, so a row's values depend on the rows
// beside it there.
bool AtenTanhIsPositionInvariant();

}  // namespace lgpt

#endif  // LGPT_TESTS_SERVING_TEST_UTIL_H_
