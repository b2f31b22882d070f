// Decode-step cost of one attention layer's KV cache, per policy and width, at equal context:
// store one token and attend over what the cache keeps (Update + attention over the returned
// view, as the attention layer does today, or UpdateAndAttend, which reads quantised storage
// block by block).
//
//   bazel run -c opt //cache:kv_cache_benchmark
//
// Geometry of Llama-3.2-1B's attention (32 query heads, 8 key/value groups, head size 64),
// batch 1, float32. The context is filled with 4096 tokens; budgeted caches keep 1024 of them.
// Tokens/s counters are per layer: divide by the layer count for a whole model's share.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <benchmark/benchmark.h>

#include <cmath>
#include <memory>
#include <string>

#include "cache/kv_cache_factory.h"
#include "core/ops/attention.h"

namespace lgpt {
namespace {

constexpr int64_t kGroups = 8, kHeads = 32, kHeadSize = 64, kContext = 4096, kBudget = 1024;

KVStep Step(int64_t start, int64_t length) {
  KVStep step;
  step.positions = at::arange(start, start + length, at::kLong).unsqueeze(0);
  step.min_position = start;
  step.max_position = start + length - 1;
  return step;
}

// state.range(0): policy index; range(1): bits; range(2): 1 to attend in place.
void DecodeStep(benchmark::State& state) {
  static const char* kPolicies[] = {"dense", "window", "sink", "h2o", "tova"};
  at::NoGradGuard no_grad;
  KVCacheSpec spec;
  spec.policy = kPolicies[state.range(0)];
  spec.budget = spec.policy == "dense" ? 0 : kBudget;  // the dense cache takes none
  spec.bits = static_cast<int>(state.range(1));
  const bool in_place = state.range(2) == 1;
  KVCacheShape shape;
  shape.max_sequence_length = 1 << 20;
  shape.layers = {{kGroups, kHeadSize, 0}};
  std::unique_ptr<KVCache> cache = *MakeKVCache(spec, shape);
  at::manual_seed(0);
  AttentionParams params;
  params.scale = 1.0 / std::sqrt(static_cast<double>(kHeadSize));
  // Fill the context in prefill chunks of 512.
  for (int64_t start = 0; start < kContext; start += 512) {
    const at::Tensor kv = at::randn({1, kGroups, 512, kHeadSize});
    const at::Tensor q = at::randn({1, kHeads, 512, kHeadSize});
    if (!cache->UpdateAndAttend(0, Step(start, 512), q, kv, kv, params).ok()) {
      (void)*cache->Update(0, Step(start, 512), kv, kv);
    }
  }
  const at::Tensor k = at::randn({1, kGroups, 1, kHeadSize});
  const at::Tensor q = at::randn({1, kHeads, 1, kHeadSize});
  int64_t position = kContext;
  for (auto _ : state) {
    const KVStep step = Step(position++, 1);
    if (in_place) {
      benchmark::DoNotOptimize(*cache->UpdateAndAttend(0, step, q, k, k, params));
    } else {
      const KVView view = *cache->Update(0, step, k, k);
      at::Tensor weights;
      KVAttentionScorer* scorer = cache->attention_scorer();
      const bool scored = scorer != nullptr && scorer->WantsAttentionWeights(0);
      benchmark::DoNotOptimize(
          AttendBlockwise(q, kGroups, {TensorSource(view.keys, view.values, view.positions)},
                          step.positions, params, scored ? &weights : nullptr));
      if (scored) scorer->ObserveAttentionWeights(0, weights);
    }
  }
  state.SetLabel(DescribeKVCacheSpec(spec) + (in_place ? " in-place" : " view"));
  state.counters["tokens_per_s"] =
      benchmark::Counter(1, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["kv_bytes"] = static_cast<double>(cache->AllocatedBytes());
}

void Arguments(benchmark::internal::Benchmark* b) {
  for (int64_t policy = 0; policy < 5; ++policy) {
    for (int64_t bits : {16, 8, 4}) {
      // Full-precision storage reads as a view either way; the in-place path matters for
      // quantised storage (dense at 16 bits is DenseKVCache, which does not attend in place).
      b->Args({policy, bits, 0});
      if (bits < 16) b->Args({policy, bits, 1});
    }
  }
}

BENCHMARK(DecodeStep)->Apply(Arguments)->Unit(benchmark::kMicrosecond)->MinTime(0.5);

}  // namespace
}  // namespace lgpt

BENCHMARK_MAIN();
