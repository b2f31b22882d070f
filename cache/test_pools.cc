#include "cache/test_pools.h"

#include <cmath>

#include "cache/kv_codec.h"
#include "gtest/gtest.h"

namespace lgpt {

KVCacheGeometry TestPoolGeometry() {
  KVCacheGeometry g;
  g.batch_size = 1;
  g.max_sequence_length = 64;
  g.layers = {{2, 8, 0}, {2, 8, 5}};  // a global layer and a windowed one
  return g;
}

std::shared_ptr<BlockPool> TestPool(int64_t blocks, int64_t entries_per_block) {
  BlockPoolOptions options;
  options.entries_per_block = entries_per_block;
  options.num_blocks = blocks;
  absl::StatusOr<std::shared_ptr<BlockPool>> pool = BlockPool::Create(TestPoolGeometry(), options);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? *pool : nullptr;
}

KVCacheGeometry FourLayerGeometry() {
  KVCacheGeometry g;
  g.batch_size = 1;
  g.max_sequence_length = kFourLayerContext;
  g.layers = {{2, 8, 0}, {2, 8, 5}, {4, 8, 0}, {2, 8, 16}};
  return g;
}

std::shared_ptr<BlockPool> FourLayerPool(int64_t blocks, const PoolKind& kind,
                                         int64_t entries_per_block) {
  KVCacheGeometry geometry = FourLayerGeometry();
  geometry.dtype = kind.dtype;
  BlockPoolOptions options;
  options.entries_per_block = entries_per_block;
  options.num_blocks = blocks;
  options.entry_bits = kind.bits;
  absl::StatusOr<std::shared_ptr<BlockPool>> pool = BlockPool::Create(geometry, options);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? *pool : nullptr;
}

at::Tensor StoredAs(const PoolKind& kind, const at::Tensor& x) {
  if (kind.bits != 16) {
    const QuantizedGroups codes = QuantizeGroups(x, kind.bits, 8);
    return DequantizeGroups(codes.data, codes.scales, kind.bits, 8, at::kFloat);
  }
  return x.to(kind.dtype).to(at::kFloat);
}

KVStep ContiguousStep(int64_t begin, int64_t length) {
  KVStep step;
  step.positions = at::arange(begin, begin + length, at::kLong).unsqueeze(0);
  step.min_position = begin;
  step.max_position = begin + length - 1;
  return step;
}

LayerInputs RandomInputs(int64_t layer, int64_t length) {
  const KVLayerSpec spec = FourLayerGeometry().layers[layer];
  LayerInputs in;
  in.k = at::randn({1, spec.n_query_groups, length, spec.head_size});
  in.v = at::randn({1, spec.n_query_groups, length, spec.head_size});
  in.q = at::randn({1, kFourLayerQueriesPerGroup * spec.n_query_groups, length, spec.head_size});
  return in;
}

AttentionParams FourLayerParams(int64_t layer) {
  AttentionParams params;
  params.scale = 0.35;
  params.sliding_window = FourLayerGeometry().layers[layer].sliding_window;
  return params;
}

double MaxDifference(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) return HUGE_VAL;
  return (a - b).abs().max().item<double>();
}

}  // namespace lgpt
