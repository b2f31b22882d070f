// Small block pools for the cache tests: two layers (a global one and a window of 5 entries),
// 2 query groups of head size 8, float32 on the CPU; and four layers with grouped queries over
// pools of every entry kind, for the evicting caches' tests.
#ifndef LGPT_CACHE_TEST_POOLS_H_
#define LGPT_CACHE_TEST_POOLS_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>

#include "cache/block_pool.h"
#include "cache/kv_cache.h"

namespace lgpt {

// Batch 1, 64 positions, the two layers.
KVCacheGeometry TestPoolGeometry();
// A pool of `blocks` blocks of `entries_per_block` entries over TestPoolGeometry() (a failure
// to make it fails the calling test).
std::shared_ptr<BlockPool> TestPool(int64_t blocks, int64_t entries_per_block = 4);

// Four layers with grouped queries (kFourLayerQueriesPerGroup query heads per group): a global
// layer, a window of 5 entries, a global layer of 4 groups and a window of 16 entries, head
// size 8; kFourLayerContext positions.
constexpr int64_t kFourLayerContext = 128;
constexpr int64_t kFourLayerQueriesPerGroup = 3;
constexpr int64_t kFourLayers = 4;
KVCacheGeometry FourLayerGeometry();

// Entries a pool stores: the model's float32, bfloat16 entries of the float32 model, or int8 /
// int4 codes (head size 8: one scale an entry).
struct PoolKind {
  const char* name;
  at::ScalarType dtype;
  int bits;
};
constexpr PoolKind kFloat32Entries{"float32", at::kFloat, 16};
constexpr PoolKind kBFloat16Entries{"bfloat16", at::kBFloat16, 16};
constexpr PoolKind kInt8Entries{"int8", at::kFloat, 8};
constexpr PoolKind kInt4Entries{"int4", at::kFloat, 4};

// A pool of `blocks` blocks of `kind` entries over FourLayerGeometry().
std::shared_ptr<BlockPool> FourLayerPool(int64_t blocks, const PoolKind& kind = kFloat32Entries,
                                         int64_t entries_per_block = 4);

// Float32 entries [1, G, T, hs] as a pool of `kind` stores them, read back as float32.
at::Tensor StoredAs(const PoolKind& kind, const at::Tensor& x);

// A step of positions [begin, begin + length) on one row.
KVStep ContiguousStep(int64_t begin, int64_t length);

// Random queries, keys and values of a FourLayerGeometry() layer's step of `length` entries.
struct LayerInputs {
  at::Tensor q, k, v;
};
LayerInputs RandomInputs(int64_t layer, int64_t length);

// Attention parameters of a FourLayerGeometry() layer (its window, a fixed scale).
AttentionParams FourLayerParams(int64_t layer);

// max |a - b|, or HUGE_VAL when the shapes differ.
double MaxDifference(const at::Tensor& a, const at::Tensor& b);

}  // namespace lgpt

#endif  // LGPT_CACHE_TEST_POOLS_H_
