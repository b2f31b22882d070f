#include "cache/policy_kv_cache.h"

#include <ATen/ATen.h>

#include <cmath>
#include <functional>
#include <optional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cache/dense_kv_cache.h"
#include "cache/kv_cache_factory.h"
#include "cache/rollback_test_util.h"
#include "core/base/status_field.h"
#include "core/ops/attention.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

constexpr int64_t kGroups = 2, kHeads = 4, kHeadSize = 32;

PolicyKVCacheOptions Options(PolicyKind kind, int64_t budget, int bits,
                             std::vector<int64_t> windows = {0}, int64_t batch = 1) {
  PolicyKVCacheOptions options;
  options.batch_size = batch;
  options.max_sequence_length = 512;
  for (int64_t w : windows) options.layers.push_back({kGroups, kHeadSize, w});
  options.policy.kind = kind;
  options.policy.budget = budget;
  options.policy.sink_tokens = 2;
  options.bits = bits;
  options.residual = 4;
  options.read_chunk = 8;
  return options;
}

std::unique_ptr<PolicyKVCache> MakeCache(const PolicyKVCacheOptions& options) {
  auto cache = PolicyKVCache::Create(options);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return std::move(*cache);
}

KVStep Step(int64_t batch, int64_t start, int64_t length) {
  KVStep step;
  step.positions = at::arange(start, start + length, at::kLong)
                       .unsqueeze(0)
                       .expand({batch, length})
                       .contiguous();
  step.min_position = start;
  step.max_position = start + length - 1;
  return step;
}

// Deterministic random entries for positions [start, start + length): the same position always
// gets the same keys and values, so caches fed in different chunks see the same data.
std::pair<at::Tensor, at::Tensor> Entries(int64_t batch, int64_t start, int64_t length) {
  std::vector<at::Tensor> k, v;
  for (int64_t p = start; p < start + length; ++p) {
    at::manual_seed(1000 + p);
    k.push_back(at::randn({batch, kGroups, 1, kHeadSize}));
    v.push_back(at::randn({batch, kGroups, 1, kHeadSize}));
  }
  return {at::cat(k, 2), at::cat(v, 2)};
}

at::Tensor Queries(int64_t batch, int64_t start, int64_t length) {
  at::manual_seed(5000 + start);
  return at::randn({batch, kHeads, length, kHeadSize});
}

// Runs `total` positions through every layer of `cache` (a prefill of `prompt` tokens in
// `chunk` pieces, then decoding), attending with BlockwiseAttention over the returned views (or
// in place) and reporting weights when asked. Layers 1, 2, ... use a sliding window of
// `window`. Starts at position `from` (a cache holding [0, from) already). Returns the attention
// outputs of every layer [B, nh, n_layer · (total - from), hs].
at::Tensor Drive(KVCache& cache, int64_t total, int64_t prompt, int64_t chunk, bool in_place,
                 int64_t batch = 1, int64_t window = 0, int64_t from = 0) {
  std::vector<at::Tensor> outputs;
  AttentionParams params;
  params.scale = 1.0 / std::sqrt(static_cast<double>(kHeadSize));
  int64_t position = from;
  while (position < total) {
    const int64_t length = position < prompt ? std::min(chunk, prompt - position) : 1;
    const KVStep step = Step(batch, position, length);
    auto [k, v] = Entries(batch, position, length);
    const at::Tensor q = Queries(batch, position, length);
    for (int64_t layer = 0; layer < cache.num_layers(); ++layer) {
      params.sliding_window = layer == 0 ? 0 : window;
      if (in_place) {
        auto y = cache.UpdateAndAttend(layer, step, q, k, v, params);
        EXPECT_TRUE(y.ok()) << y.status();
        outputs.push_back(*y);
        continue;
      }
      auto view = cache.Update(layer, step, k, v);
      EXPECT_TRUE(view.ok()) << view.status();
      at::Tensor weights;
      const at::Tensor y =
          AttendBlockwise(q, kGroups, {TensorSource(view->keys, view->values, view->positions)},
                          step.positions, params, &weights);
      KVAttentionScorer* scorer = cache.attention_scorer();
      if (scorer != nullptr && scorer->WantsAttentionWeights(layer)) {
        scorer->ObserveAttentionWeights(layer, weights);
      }
      outputs.push_back(y);
    }
    position += length;
  }
  return at::cat(outputs, 2);
}

std::vector<int64_t> Range(int64_t begin, int64_t end) {
  std::vector<int64_t> r;
  for (int64_t i = begin; i < end; ++i) r.push_back(i);
  return r;
}

TEST(PolicyKVCacheTest, EveryPolicyWithABudgetCoveringTheSequenceEqualsDense) {
  const int64_t total = 30, prompt = 11;
  DenseKVCacheOptions dense_options;
  dense_options.batch_size = 2;
  dense_options.max_sequence_length = 512;
  dense_options.layers = {{kGroups, kHeadSize, 0}, {kGroups, kHeadSize, 6}};
  for (int64_t chunk : {1, 3, 11}) {
    auto dense = DenseKVCache::Create(dense_options);
    ASSERT_TRUE(dense.ok());
    const at::Tensor expected = Drive(**dense, total, prompt, chunk, false, 2, 6);
    for (PolicyKind kind : {PolicyKind::kDense, PolicyKind::kWindow, PolicyKind::kSink,
                            PolicyKind::kH2O, PolicyKind::kTova}) {
      for (bool in_place : {false, true}) {
        auto cache = MakeCache(Options(kind, total, 16, {0, 6}, 2));
        const at::Tensor got = Drive(*cache, total, prompt, chunk, in_place, 2, 6);
        EXPECT_LT((got - expected).abs().max().item<double>(), 1e-6)
            << PolicyName(kind) << " chunk " << chunk << " in place " << in_place;
        if (kind == PolicyKind::kDense) continue;
        // The comparison has teeth: a budget under the sequence changes the outputs.
        auto small = MakeCache(Options(kind, 8, 16, {0, 6}, 2));
        const at::Tensor evicted = Drive(*small, total, prompt, chunk, in_place, 2, 6);
        EXPECT_GT((evicted - expected).abs().max().item<double>(), 1e-3) << PolicyName(kind);
      }
    }
  }
}

TEST(PolicyKVCacheTest, WindowKeepsTheMostRecentEntries) {
  for (int64_t chunk : {1, 5}) {
    auto cache = MakeCache(Options(PolicyKind::kWindow, 6, 16));
    Drive(*cache, 20, 10, chunk, false);
    EXPECT_EQ(cache->KeptPositions(0, 0, 1), Range(14, 20)) << "chunk " << chunk;
  }
}

TEST(PolicyKVCacheTest, SinkKeepsTheFirstTokensAndTheRecentOnes) {
  for (int64_t chunk : {1, 4, 13}) {
    for (int bits : {16, 8}) {
      auto cache = MakeCache(Options(PolicyKind::kSink, 6, bits));
      Drive(*cache, 20, 13, chunk, false);
      const std::vector<int64_t> expected = {0, 1, 16, 17, 18, 19};
      EXPECT_EQ(cache->KeptPositions(0, 0, 0), expected) << "chunk " << chunk << " bits " << bits;
    }
  }
}

// Hand-made attention weights: every head of group g puts weight 1 on the positions in
// heavy[g] and 0.01 elsewhere.
void DecodeWithWeights(PolicyKVCache& cache, int64_t total,
                       const std::vector<std::set<int64_t>>& heavy) {
  for (int64_t p = 0; p < total; ++p) {
    auto [k, v] = Entries(1, p, 1);
    auto view = cache.Update(0, Step(1, p, 1), k, v);
    ASSERT_TRUE(view.ok()) << view.status();
    ASSERT_TRUE(cache.WantsAttentionWeights(0));
    const at::Tensor positions = view->positions.expand({1, kGroups, view->positions.size(2)});
    at::Tensor weights = at::zeros({1, kHeads, 1, positions.size(2)});
    for (int64_t h = 0; h < kHeads; ++h) {
      const int64_t g = h / (kHeads / kGroups);
      for (int64_t s = 0; s < positions.size(2); ++s) {
        const int64_t pos = positions[0][g][s].item<int64_t>();
        if (pos < 0) continue;
        weights[0][h][0][s] = heavy[g].count(pos) ? 1.0 : 0.01;
      }
    }
    cache.ObserveAttentionWeights(0, weights);
  }
}

TEST(PolicyKVCacheTest, H2OKeepsTheHeaviestEntriesPerGroup) {
  for (int bits : {16, 4}) {
    // Budget 6: the 3 most recent plus the 3 heaviest; each group has its own heavy hitters.
    auto cache = MakeCache(Options(PolicyKind::kH2O, 6, bits));
    DecodeWithWeights(*cache, 12, {{1, 4, 6}, {2, 3, 5}});
    EXPECT_EQ(cache->KeptPositions(0, 0, 0), (std::vector<int64_t>{1, 4, 6, 9, 10, 11})) << bits;
    EXPECT_EQ(cache->KeptPositions(0, 0, 1), (std::vector<int64_t>{2, 3, 5, 9, 10, 11})) << bits;
  }
}

TEST(PolicyKVCacheTest, TovaKeepsWhatTheLatestQueryAttends) {
  auto cache = MakeCache(Options(PolicyKind::kTova, 4, 16));
  for (int64_t p = 0; p < 10; ++p) {
    auto [k, v] = Entries(1, p, 1);
    auto view = cache->Update(0, Step(1, p, 1), k, v);
    ASSERT_TRUE(view.ok());
    const at::Tensor positions = view->positions.expand({1, kGroups, view->positions.size(2)});
    // Weight on positions 0 and 2, the newest and (less) the one before it.
    const at::Tensor w = (positions == 0).to(at::kFloat) + (positions == 2).to(at::kFloat) +
                         0.5 * (positions == p).to(at::kFloat) +
                         0.25 * (positions == p - 1).to(at::kFloat);
    cache->ObserveAttentionWeights(0, w.unsqueeze(2)
                                          .unsqueeze(3)
                                          .expand({1, kGroups, 2, 1, positions.size(2)})
                                          .reshape({1, kHeads, 1, positions.size(2)}));
  }
  EXPECT_EQ(cache->KeptPositions(0, 0, 0), (std::vector<int64_t>{0, 2, 8, 9}));
}

TEST(PolicyKVCacheTest, InPlaceAttentionEqualsAttentionOverTheView) {
  // Budgets below the sequence, so entries are evicted and (4 bits) quantised. In place, 16-bit
  // decoding steps take the host loops (DecodeOnHost); over the view, the tensor operations.
  struct Variant {
    PolicyKind kind;
    bool normalize = false;
    int64_t grace = -1;
  };
  for (const Variant variant :
       {Variant{PolicyKind::kDense}, Variant{PolicyKind::kWindow}, Variant{PolicyKind::kSink},
        Variant{PolicyKind::kH2O}, Variant{PolicyKind::kTova}, Variant{PolicyKind::kH2O, true},
        Variant{PolicyKind::kH2O, false, 2}, Variant{PolicyKind::kTova, true, 3},
        Variant{PolicyKind::kH2OVlen}}) {
    for (int bits : {16, 8, 4}) {
      for (int64_t batch : {1, 2}) {
        PolicyKVCacheOptions options = Options(variant.kind, 9, bits, {0, 5}, batch);
        options.policy.normalize_scores = variant.normalize;
        options.policy.grace_period = variant.grace;
        auto a = MakeCache(options);
        auto b = MakeCache(options);
        const at::Tensor via_view = Drive(*a, 40, 12, 5, false, batch, 5);
        const at::Tensor in_place = Drive(*b, 40, 12, 5, true, batch, 5);
        const std::string name =
            absl::StrCat(PolicyName(variant.kind), " normalize ", variant.normalize, " grace ",
                         variant.grace, " bits ", bits, " batch ", batch);
        EXPECT_LT((via_view - in_place).abs().max().item<double>(), 1e-5) << name;
        for (int64_t layer : {0, 1}) {
          for (int64_t row = 0; row < batch; ++row) {
            for (int64_t g : {0, 1}) {
              EXPECT_EQ(a->KeptPositions(layer, row, g), b->KeptPositions(layer, row, g))
                  << name << " layer " << layer << " row " << row << " group " << g;
            }
          }
        }
      }
    }
  }
}

// Decoding steps read keys and values of any layout (the serving engine's rows are views with
// other strides): the same as contiguous ones.
TEST(PolicyKVCacheTest, DecodingStepsTakeKeysAndValuesOfAnyLayout) {
  for (int bits : {16, 4}) {
    auto plain = MakeCache(Options(PolicyKind::kH2O, 6, bits, {0}, 2));
    auto strided = MakeCache(Options(PolicyKind::kH2O, 6, bits, {0}, 2));
    AttentionParams params;
    params.scale = 0.2;
    for (int64_t p = 0; p < 20; ++p) {
      auto [k, v] = Entries(2, p, 1);
      const at::Tensor q = Queries(2, p, 1);
      // Keys inside a wider buffer: another group stride than the values'.
      at::Tensor wide = at::zeros({2, kGroups, 1, 3 * kHeadSize});
      wide.narrow(3, kHeadSize, kHeadSize).copy_(k);
      const at::Tensor k_view = wide.narrow(3, kHeadSize, kHeadSize);
      auto want = plain->UpdateAndAttend(0, Step(2, p, 1), q, k, v, params);
      auto got = strided->UpdateAndAttend(0, Step(2, p, 1), q, k_view, v, params);
      ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
      EXPECT_TRUE(at::equal(*want, *got)) << "bits " << bits << " position " << p;
    }
    for (int64_t row : {0, 1}) {
      for (int64_t g : {0, 1}) {
        EXPECT_EQ(plain->KeptPositions(0, row, g), strided->KeptPositions(0, row, g));
      }
    }
  }
}

TEST(PolicyKVCacheTest, QuantisedCachesKeepTheRecentEntriesInFullPrecision) {
  EXPECT_EQ(MakeCache(Options(PolicyKind::kWindow, 12, 16))->residual(0), 0);
  auto cache = MakeCache(Options(PolicyKind::kWindow, 12, 4));
  EXPECT_EQ(cache->residual(0), 4);
  Drive(*cache, 19, 0, 1, false);
  auto [k, v] = Entries(1, 19, 1);
  auto view = cache->Update(0, Step(1, 19, 1), k, v);
  ASSERT_TRUE(view.ok());
  auto [all_k, all_v] = Entries(1, 0, 20);
  int exact = 0, quantised = 0;
  for (int64_t s = 0; s < view->positions.size(2); ++s) {
    const int64_t pos = view->positions[0][0][s].item<int64_t>();
    if (pos < 0) continue;
    const at::Tensor stored = view->keys[0][0][s];
    const at::Tensor original = all_k[0][0][pos];
    const double error = (stored - original).abs().max().item<double>();
    if (pos >= 16) {
      EXPECT_EQ(error, 0) << "position " << pos << " is recent: full precision";
      ++exact;
    } else {
      EXPECT_GT(error, 0) << "position " << pos;
      EXPECT_LT(error, 0.5 * original.abs().max().item<double>());
      ++quantised;
    }
  }
  EXPECT_EQ(exact, 4);
  EXPECT_EQ(quantised, 9);  // 12 kept + the new entry
}

TEST(PolicyKVCacheTest, ScorePolicyOptionsThroughTheCache) {
  AttentionParams params;
  // Per-layer budgets: each layer keeps its own number of entries.
  PolicyKVCacheOptions options = Options(PolicyKind::kH2OVlen, 12, 8, {0, 0});
  options.policy.layer_budgets = {12, 6};
  options.policy.grace_period = 2;
  options.policy.normalize_scores = true;
  auto cache = MakeCache(options);
  EXPECT_EQ(cache->plan(0).budget, 12);
  EXPECT_EQ(cache->plan(1).budget, 6);
  EXPECT_EQ(cache->plan(1).recent, 2);
  for (int64_t p = 0; p < 30; p += p == 0 ? 5 : 1) {
    const int64_t length = p == 0 ? 5 : 1;
    auto [k, v] = Entries(1, p, length);
    for (int64_t layer = 0; layer < 2; ++layer) {
      ASSERT_TRUE(
          cache->UpdateAndAttend(layer, Step(1, p, length), Queries(1, p, length), k, v, params)
              .ok());
    }
    const int64_t newest = p + length - 1;
    for (int64_t layer = 0; layer < 2; ++layer) {
      for (int64_t group = 0; group < kGroups; ++group) {
        const std::vector<int64_t> kept = cache->KeptPositions(layer, 0, group);
        ASSERT_EQ(static_cast<int64_t>(kept.size()),
                  std::min(newest + 1, cache->plan(layer).budget));
        // The grace period: the two newest positions always stay.
        ASSERT_EQ(kept.back(), newest);
        if (newest > 0) {
          ASSERT_EQ(kept[kept.size() - 2], newest - 1);
        }
      }
    }
  }
}

TEST(PolicyKVCacheTest, RefusesImpossibleScorePolicyOptions) {
  PolicyKVCacheOptions options = Options(PolicyKind::kQH2O, 8, 16);
  auto qh2o = PolicyKVCache::Create(options);
  ASSERT_FALSE(qh2o.ok());
  EXPECT_TRUE(absl::StrContains(qh2o.status().message(), "bits must be 8 or 4 for policy qh2o"));
  options = Options(PolicyKind::kH2O, 8, 16, {0, 0});
  options.policy.layer_budgets = {8, 8, 8};
  auto mismatch = PolicyKVCache::Create(options);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_TRUE(absl::StrContains(mismatch.status().message(), "layer_budgets has 3 entries for 2"));
  KVCacheSpec spec{"qh2o", 8, 16};
  EXPECT_TRUE(absl::StrContains(ValidateKVCacheSpec(spec).message(), "KVCacheSpec.bits 8 or 4"));
  spec = KVCacheSpec{"h2o", 8, 16};
  spec.budget_rule = "cone";
  EXPECT_TRUE(absl::StrContains(ValidateKVCacheSpec(spec).message(),
                                "KVCacheSpec.budget_rule must be uniform or pyramid"));
}

TEST(PolicyKVCacheTest, BytesFollowTheFormula) {
  // 2 layers, batch 2, budget 40 reached: main holds budget - residual + 1 slots.
  for (int bits : {16, 8, 4}) {
    PolicyKVCacheOptions options = Options(PolicyKind::kWindow, 40, bits, {0, 0}, 2);
    options.dtype = at::kBFloat16;
    auto cache = MakeCache(options);
    for (int64_t p = 0; p < 100; ++p) {
      auto [k, v] = Entries(2, p, 1);
      for (int64_t layer = 0; layer < 2; ++layer) {
        ASSERT_TRUE(cache->Update(layer, Step(2, p, 1), k, v).ok());
      }
    }
    const int64_t residual = bits == 16 ? 0 : 4;
    const int64_t main_slots = 40 - residual + 1;
    const int64_t entry_bytes =
        bits == 16 ? 2 * kHeadSize * 2 : 2 * (kHeadSize * bits / 8 + 2 * (kHeadSize / 32));
    const int64_t expected =
        2 * 2 * kGroups * (main_slots * entry_bytes + residual * 2 * kHeadSize * 2);
    EXPECT_EQ(cache->AllocatedBytes(), expected) << bits;
    EXPECT_EQ(cache->slots(0), main_slots + residual);
    // Window decisions do not differ by group: one int32 position per slot of a row.
    EXPECT_EQ(cache->IndexBytes(), 2 * 2 * (main_slots + residual) * 4);
  }
}

TEST(PolicyKVCacheTest, ScoringPoliciesKeepPositionsAndScoresPerGroup) {
  for (PolicyKind kind : {PolicyKind::kH2O, PolicyKind::kTova}) {
    auto cache = MakeCache(Options(kind, 16, 8));
    AttentionParams params;
    for (int64_t p = 0; p < 40; ++p) {
      auto [k, v] = Entries(1, p, 1);
      ASSERT_TRUE(cache->UpdateAndAttend(0, Step(1, p, 1), Queries(1, p, 1), k, v, params).ok());
    }
    // int32 position and float32 score per slot and group, main and ring.
    EXPECT_EQ(cache->IndexBytes(), kGroups * cache->slots(0) * 8) << PolicyName(kind);
    // The groups decide apart: their kept positions differ somewhere.
    EXPECT_NE(cache->KeptPositions(0, 0, 0), cache->KeptPositions(0, 0, 1)) << PolicyName(kind);
  }
}

// Bytes an entry of one (row, group) costs in main, bookkeeping included, against a 16-bit
// entry: the bound is 0.55 (int8) and 0.30 (int4) with groups of 32 channels.
TEST(PolicyKVCacheTest, QuantisedEntriesWithTheirIndexAgainstA16BitEntry) {
  struct Geometry {
    int64_t groups, head_size;
  };
  // The default model's layers (2 groups of 32 channels) and a Llama-7B-like layer.
  for (const Geometry g : {Geometry{2, 32}, Geometry{8, 128}, Geometry{32, 128}}) {
    for (PolicyKind kind : {PolicyKind::kDense, PolicyKind::kWindow, PolicyKind::kSink,
                            PolicyKind::kH2O, PolicyKind::kTova}) {
      for (int bits : {8, 4}) {
        PolicyKVCacheOptions options;
        options.max_sequence_length = 4096;
        options.layers = {{g.groups, g.head_size, 0}};
        options.dtype = at::kBFloat16;
        options.policy.kind = kind;
        options.policy.budget = 1024;
        options.bits = bits;
        options.residual = 0;
        auto cache = MakeCache(options);
        // MaxBytes: (budget + 1) slots of one row, entries and index.
        const int64_t slots = kind == PolicyKind::kDense ? 4096 : 1025;
        const double per_entry = static_cast<double>(cache->MaxBytes()) / (slots * g.groups);
        const double ratio = per_entry / (2 * g.head_size * 2);
        const bool scores = kind == PolicyKind::kH2O || kind == PolicyKind::kTova;
        std::printf("%s int%d, %lld groups of %lld: %.2f bytes an entry, %.4f of 16 bits\n",
                    PolicyName(kind).c_str(), bits, static_cast<long long>(g.groups),
                    static_cast<long long>(g.head_size), per_entry, ratio);
        const double bound = bits == 8 ? 0.55 : 0.30;
        if (!scores || g.head_size >= 128) {
          EXPECT_LE(ratio, bound) << PolicyName(kind) << " int" << bits << " hs " << g.head_size;
        } else {
          // A scoring policy's 8 bytes (position and score per group) exceed what a 32-channel
          // entry leaves (2.4 bytes): the price of per-group decisions at small head sizes.
          EXPECT_GT(ratio, bound);
        }
      }
    }
  }
}

TEST(PolicyKVCacheTest, QuantisedBytesAgainstA16BitDenseCacheHoldingTheSameEntries) {
  // A Llama-like layer (head_size 128) holding 1024 entries: 1025 slots of 16-bit keys and
  // values in the dense cache, against int8/int4 main slots plus the full-precision residual,
  // index bytes included.
  const int64_t budget = 1024, head_size = 128;
  DenseKVCacheOptions dense_options;
  dense_options.max_sequence_length = budget + 1;
  dense_options.initial_capacity = budget + 1;
  dense_options.layers = {{kGroups, head_size, 0}, {kGroups, head_size, 0}};
  dense_options.dtype = at::kBFloat16;
  auto dense = DenseKVCache::Create(dense_options);
  ASSERT_TRUE(dense.ok());
  const double dense_bytes = static_cast<double>((*dense)->AllocatedBytes());
  for (PolicyKind kind : {PolicyKind::kWindow, PolicyKind::kH2O}) {
    for (int bits : {8, 4}) {
      for (int64_t residual : {0, 16}) {
        PolicyKVCacheOptions options;
        options.max_sequence_length = 1 << 20;
        options.layers = dense_options.layers;
        options.dtype = at::kBFloat16;
        options.policy.kind = kind;
        options.policy.budget = budget;
        options.bits = bits;
        options.residual = residual;
        auto cache = MakeCache(options);
        const at::Tensor k = at::randn({1, kGroups, budget + 20, head_size});
        for (int64_t layer = 0; layer < 2; ++layer) {
          ASSERT_TRUE(cache->Update(layer, Step(1, 0, budget + 20), k, k).ok());
          ASSERT_TRUE(
              cache->Update(layer, Step(1, budget + 20, 1), k.narrow(2, 0, 1), k.narrow(2, 0, 1))
                  .ok());
        }
        ASSERT_EQ(cache->slots(0), budget + 1);
        const double ratio = (cache->AllocatedBytes() + cache->IndexBytes()) / dense_bytes;
        std::printf("%s int%d, residual %lld: %.4f of the 16-bit dense cache\n",
                    PolicyName(kind).c_str(), bits, static_cast<long long>(residual), ratio);
        // h2o's per-group index plus a 16-entry full-precision ring passes the bound by a hair;
        // its entries alone are within it (previous test).
        const double slack = kind == PolicyKind::kH2O && residual > 0 ? 0.01 : 0.0;
        EXPECT_LE(ratio, (bits == 8 ? 0.55 : 0.30) + slack)
            << PolicyName(kind) << " " << bits << " bits, residual " << residual;
      }
    }
  }
}

TEST(PolicyKVCacheTest, BytesStayFlatOnceTheBudgetIsReached) {
  for (PolicyKind kind :
       {PolicyKind::kWindow, PolicyKind::kSink, PolicyKind::kH2O, PolicyKind::kTova}) {
    for (int bits : {16, 8, 4}) {
      auto cache = MakeCache(Options(kind, 32, bits, {0, 8}));
      int64_t flat_bytes = -1;
      AttentionParams params;
      for (int64_t p = 0; p < 200; p += p < 10 ? 10 : 1) {
        const int64_t length = p < 10 ? 10 : 1;
        auto [k, v] = Entries(1, p, length);
        for (int64_t layer = 0; layer < 2; ++layer) {
          ASSERT_TRUE(
              cache->UpdateAndAttend(layer, Step(1, p, length), Queries(1, p, length), k, v, params)
                  .ok());
        }
        if (p == 40) flat_bytes = cache->AllocatedBytes();
        if (p > 40) {
          ASSERT_EQ(cache->AllocatedBytes(), flat_bytes)
              << PolicyName(kind) << " " << bits << " at position " << p;
        }
        // MaxBytes bounds what the cache holds at every step.
        ASSERT_LE(cache->AllocatedBytes() + cache->IndexBytes(), cache->MaxBytes());
      }
      // ... and is reached once the budget is (no reservation wasted beyond a spare slot).
      EXPECT_EQ(cache->AllocatedBytes() + cache->IndexBytes(), cache->MaxBytes())
          << PolicyName(kind) << " " << bits;
      EXPECT_LE(cache->slots(0), 33);
      EXPECT_LE(cache->slots(1), 9);  // the windowed layer keeps its window (8) plus one
      EXPECT_EQ(cache->KeptPositions(0, 0, 0).size(), 32u);
    }
  }
}

// BytesAfterStep, which a serving pool charges before each step, bounds the bytes the step
// leaves (and MaxBytes bounds it); with a growth step, main grows in whole steps and a budgeted
// layer never holds more than budget + 1 slots: budget / step + 1 blocks of `step` entries.
TEST(PolicyKVCacheTest, BytesAfterStepBoundsWhatEveryStepLeaves) {
  for (PolicyKind kind : {PolicyKind::kDense, PolicyKind::kWindow, PolicyKind::kSink,
                          PolicyKind::kH2O, PolicyKind::kTova}) {
    for (int bits : {16, 8, 4}) {
      for (int64_t growth_step : {0, 4}) {
        if (kind == PolicyKind::kDense && bits == 16) continue;
        SCOPED_TRACE(absl::StrCat(PolicyName(kind), " bits ", bits, " growth ", growth_step));
        PolicyKVCacheOptions options = Options(kind, 32, bits, {0, 8});
        options.growth_step = growth_step;
        auto cache = MakeCache(options);
        AttentionParams params;
        int64_t predicted_total = 0, actual_total = 0;
        for (int64_t p = 0; p < 120;) {
          const int64_t length = p < 30 ? 7 : (p % 17 == 0 ? 5 : 1);  // chunks between decodes
          const std::optional<int64_t> predicted = cache->BytesAfterStep(length);
          ASSERT_TRUE(predicted.has_value());
          ASSERT_LE(*predicted, cache->MaxBytes());
          auto [k, v] = Entries(1, p, length);
          for (int64_t layer = 0; layer < 2; ++layer) {
            ASSERT_TRUE(cache
                            ->UpdateAndAttend(layer, Step(1, p, length), Queries(1, p, length), k,
                                              v, params)
                            .ok());
          }
          const int64_t actual = cache->AllocatedBytes() + cache->IndexBytes();
          ASSERT_LE(actual, *predicted) << "at position " << p;
          predicted_total += *predicted;
          actual_total += actual;
          if (growth_step > 0 && kind != PolicyKind::kDense) {
            ASSERT_LE(cache->slots(0), 33) << "at position " << p;
            ASSERT_LE(cache->slots(1), 9) << "at position " << p;
          }
          p += length;
        }
        // The bound is tight: a pool charging it holds little more than the cache uses.
        EXPECT_LE(predicted_total, actual_total + actual_total / 8);
      }
    }
  }
}

TEST(PolicyKVCacheTest, ReleaseFreesTheStorageAndTheCacheStartsAgain) {
  for (int bits : {16, 4}) {
    auto cache = MakeCache(Options(PolicyKind::kH2O, 8, bits));
    const at::Tensor first = Drive(*cache, 20, 5, 5, true);
    EXPECT_GT(cache->AllocatedBytes(), 0);
    cache->Release();
    EXPECT_EQ(cache->AllocatedBytes(), 0);
    EXPECT_EQ(cache->IndexBytes(), 0);
    EXPECT_EQ(cache->slots(0), 0);
    EXPECT_TRUE(cache->KeptPositions(0, 0, 0).empty());
    const at::Tensor again = Drive(*cache, 20, 5, 5, true);
    EXPECT_TRUE(at::equal(first, again)) << "bits " << bits;
  }
}

// A fork (core/serving's n choices): a copy of a cache after its prompt goes on as the cache
// itself does, and as a cache that read the prompt itself, to the bit: entries, scales,
// positions, scores and the eviction the last chunk left pending are all copied.
TEST(PolicyKVCacheTest, ACopyGoesOnAsTheOriginalDoes) {
  const int64_t total = 30, prompt = 12, layers = 2;
  for (PolicyKind kind :
       {PolicyKind::kWindow, PolicyKind::kSink, PolicyKind::kH2O, PolicyKind::kTova,
        PolicyKind::kH2OVlen, PolicyKind::kQH2O, PolicyKind::kDense}) {
    for (int bits : {16, 8, 4}) {
      if ((kind == PolicyKind::kQH2O || kind == PolicyKind::kDense) && bits == 16) continue;
      for (bool in_place : {true, false}) {
        SCOPED_TRACE(absl::StrCat(PolicyName(kind), " bits ", bits, " in place ", in_place));
        const PolicyKVCacheOptions options = Options(kind, 9, bits, {0, 5});
        auto alone = MakeCache(options);
        const at::Tensor expected = Drive(*alone, total, prompt, 5, in_place, 1, 5);
        auto leader = MakeCache(options);
        Drive(*leader, prompt, prompt, 5, in_place, 1, 5);
        // Another context: only the layers' plans need agree.
        PolicyKVCacheOptions longer = options;
        longer.max_sequence_length = 600;
        auto copy = MakeCache(longer);
        ASSERT_TRUE(leader->forker()->CheckCopyInto(*copy).ok());
        ASSERT_TRUE(leader->forker()->CopyInto(*copy).ok());
        EXPECT_EQ(copy->AllocatedBytes(), leader->AllocatedBytes());
        EXPECT_EQ(copy->IndexBytes(), leader->IndexBytes());
        EXPECT_EQ(copy->BytesAfterStep(1), leader->BytesAfterStep(1));
        const at::Tensor rest = Drive(*copy, total, prompt, 5, in_place, 1, 5, prompt);
        EXPECT_TRUE(
            at::equal(rest, expected.narrow(2, layers * prompt, layers * (total - prompt))));
        // The original goes on unchanged by the copy.
        EXPECT_TRUE(at::equal(Drive(*leader, total, prompt, 5, in_place, 1, 5, prompt), rest));
        for (int64_t layer = 0; layer < layers; ++layer) {
          for (int64_t g = 0; g < kGroups; ++g) {
            EXPECT_EQ(copy->KeptPositions(layer, 0, g), alone->KeptPositions(layer, 0, g));
          }
        }
      }
    }
  }
}

TEST(PolicyKVCacheTest, ACopyNeedsACacheThatDecidesAlike) {
  auto cache = MakeCache(Options(PolicyKind::kH2O, 8, 8));
  Drive(*cache, 6, 6, 6, true);
  const KVForker& forker = *cache->forker();
  struct Case {
    std::string field;
    std::function<void(PolicyKVCacheOptions&)> change;
  };
  for (const Case& c : std::vector<Case>{
           {"PolicyKVCacheOptions.policy.budget", [](auto& o) { o.policy.budget = 9; }},
           {"PolicyKVCacheOptions.policy.kind", [](auto& o) { o.policy.kind = PolicyKind::kTova; }},
           {"PolicyKVCacheOptions.bits", [](auto& o) { o.bits = 4; }},
           {"PolicyKVCacheOptions.read_chunk", [](auto& o) { o.read_chunk = 16; }},
           // A context the budget covers: the layer keeps everything (a dense plan).
           {"PolicyKVCacheOptions.max_sequence_length", [](auto& o) { o.max_sequence_length = 8; }},
       }) {
    PolicyKVCacheOptions options = Options(PolicyKind::kH2O, 8, 8);
    c.change(options);
    auto target = MakeCache(options);
    const absl::Status status = forker.CopyInto(*target);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << c.field;
    EXPECT_EQ(ErrorField(status), c.field) << status;
    EXPECT_EQ(target->AllocatedBytes(), 0) << "left unchanged";
  }
  // The same plans, but a context too short for the positions the cache holds.
  PolicyKVCacheOptions short_context = Options(PolicyKind::kH2O, 3, 8);
  auto small = MakeCache(short_context);
  Drive(*small, 6, 6, 6, true);
  short_context.max_sequence_length = 5;
  auto too_short = MakeCache(short_context);
  const absl::Status short_status = small->forker()->CopyInto(*too_short);
  EXPECT_EQ(short_status.code(), absl::StatusCode::kFailedPrecondition) << short_status;
  EXPECT_EQ(ErrorField(short_status), "PolicyKVCacheOptions.max_sequence_length");
  EXPECT_EQ(forker.CopyInto(*cache).code(), absl::StatusCode::kFailedPrecondition);
  DenseKVCacheOptions dense;
  dense.max_sequence_length = 512;
  dense.layers = {{kGroups, kHeadSize, 0}};
  auto other = DenseKVCache::Create(dense);
  ASSERT_TRUE(other.ok());
  const absl::Status status = forker.CopyInto(**other);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(status.message(), "into a dense cache")) << status;
}

TEST(PolicyKVCacheTest, WindowedLayersKeepTheirWindowWhenTheBudgetCoversIt) {
  auto cache = MakeCache(Options(PolicyKind::kH2O, 16, 16, {0, 5}));
  EXPECT_EQ(cache->plan(1).kind, PolicyKind::kWindow);
  EXPECT_EQ(cache->plan(1).budget, 5);
  EXPECT_FALSE(cache->WantsAttentionWeights(1));
  EXPECT_TRUE(cache->WantsAttentionWeights(0));
  Drive(*cache, 30, 9, 4, false);
  EXPECT_EQ(cache->KeptPositions(1, 0, 0), Range(25, 30));
  // A budget under the window: the policy runs inside it.
  auto small = MakeCache(Options(PolicyKind::kSink, 3, 16, {0, 5}));
  EXPECT_EQ(small->plan(1).kind, PolicyKind::kSink);
  Drive(*small, 30, 9, 4, false);
  // Sinks fell out of the window: the layer keeps the most recent entries.
  EXPECT_EQ(small->KeptPositions(1, 0, 0), Range(27, 30));
  EXPECT_EQ(small->KeptPositions(0, 0, 0), (std::vector<int64_t>{0, 1, 29}));
}

TEST(PolicyKVCacheTest, ARewindForgetsLaterEntries) {
  auto cache = MakeCache(Options(PolicyKind::kWindow, 50, 8));
  Drive(*cache, 20, 20, 20, false);
  auto [k, v] = Entries(1, 8, 1);
  ASSERT_TRUE(cache->Update(0, Step(1, 8, 1), k, v).ok());
  EXPECT_EQ(cache->KeptPositions(0, 0, 0), Range(0, 9));
}

TEST(PolicyKVCacheTest, ResetForgetsEverythingAndKeepsStorage) {
  auto cache = MakeCache(Options(PolicyKind::kSink, 8, 4));
  Drive(*cache, 20, 5, 5, false);
  const int64_t bytes = cache->AllocatedBytes();
  cache->Reset();
  EXPECT_TRUE(cache->KeptPositions(0, 0, 0).empty());
  EXPECT_EQ(cache->AllocatedBytes(), bytes);
  Drive(*cache, 3, 3, 3, false);
  EXPECT_EQ(cache->KeptPositions(0, 0, 0), Range(0, 3));
}

TEST(PolicyKVCacheTest, BadShapesAndPositionsAreErrors) {
  auto cache = MakeCache(Options(PolicyKind::kWindow, 8, 8));
  auto [k, v] = Entries(1, 0, 3);
  EXPECT_FALSE(cache->Update(0, Step(1, 0, 2), k, v).ok());
  EXPECT_FALSE(cache->Update(3, Step(1, 0, 3), k, v).ok());
  EXPECT_EQ(cache->Update(0, Step(1, 510, 3), k, v).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_FALSE(cache
                   ->Update(0, Step(2, 0, 3), k.expand({2, kGroups, 3, kHeadSize}),
                            v.expand({2, kGroups, 3, kHeadSize}))
                   .ok());
  EXPECT_FALSE(
      cache->UpdateAndAttend(0, Step(1, 0, 3), at::zeros({1, kHeads, 2, kHeadSize}), k, v, {})
          .ok());
  // A failed step left nothing behind.
  EXPECT_TRUE(cache->KeptPositions(0, 0, 0).empty());
}

// Speculative decoding on quantised storage: a sequential step attends as one-token steps (its
// own entries read encoded where decoding reads them so), and Truncate puts the entries the
// step moved out of the full-precision ring back, so the cache attends from then on as one that
// decoded only the kept entries, bit for bit.
TEST(PolicyKVCacheTest, TruncateForgetsRejectedEntriesOfQuantisedStorage) {
  for (const int bits : {16, 8, 4}) {
    for (const int64_t residual : {int64_t{0}, int64_t{3}}) {
      for (int64_t step = 1; step <= 6; ++step) {
        for (int64_t keep = 1; keep <= step; ++keep) {
          PolicyKVCacheOptions options = Options(PolicyKind::kDense, 0, bits, {0, 0});
          options.residual = residual;
          std::unique_ptr<PolicyKVCache> speculating = MakeCache(options);
          std::unique_ptr<PolicyKVCache> plain = MakeCache(options);
          ASSERT_EQ(speculating->rollback(), speculating.get());
          RollbackStream stream;
          stream.geometry = options;
          stream.step = step;
          stream.keep = keep;
          // 16 bits take a step as a chunk (FlashAttention's sums, not the decode kernel's).
          EXPECT_LE(RollbackDifference(*speculating, *plain, stream), bits == 16 ? 1e-5 : 0.0)
              << bits << " bits, residual " << residual << ", step " << step << ", keep " << keep;
          EXPECT_EQ(speculating->KeptPositions(1, 0, 1), plain->KeptPositions(1, 0, 1));
        }
      }
    }
  }
}

TEST(PolicyKVCacheTest, QuantisedChunksAttendOtherwiseThanSequentialSteps) {
  // What the sequential flag is for: a chunk reads its own entries in full precision.
  PolicyKVCacheOptions options = Options(PolicyKind::kDense, 0, 4, {0});
  options.residual = 0;
  std::unique_ptr<PolicyKVCache> chunked = MakeCache(options);
  std::unique_ptr<PolicyKVCache> sequential = MakeCache(options);
  Drive(*chunked, 8, 8, 8, true);
  Drive(*sequential, 8, 8, 8, true);
  auto [k, v] = Entries(1, 8, 4);
  const at::Tensor q = Queries(1, 8, 4);
  KVStep step = Step(1, 8, 4);
  AttentionParams params;
  params.scale = 1.0 / std::sqrt(static_cast<double>(kHeadSize));
  const at::Tensor a = *chunked->UpdateAndAttend(0, step, q, k, v, params);
  step.sequential = true;
  const at::Tensor b = *sequential->UpdateAndAttend(0, step, q, k, v, params);
  EXPECT_GT((a - b).abs().max().item<double>(), 1e-4);
}

TEST(PolicyKVCacheTest, OnlyCachesThatNeverEvictRollBack) {
  EXPECT_EQ(MakeCache(Options(PolicyKind::kH2O, 8, 16))->rollback(), nullptr);
  EXPECT_EQ(MakeCache(Options(PolicyKind::kWindow, 8, 8))->rollback(), nullptr);
  EXPECT_EQ(MakeCache(Options(PolicyKind::kSink, 8, 4))->rollback(), nullptr);
  EXPECT_EQ(MakeCache(Options(PolicyKind::kTova, 8, 16))->rollback(), nullptr);
  // A budget covering the sequence keeps everything: exact, so it rolls back.
  EXPECT_NE(MakeCache(Options(PolicyKind::kH2O, 512, 16))->rollback(), nullptr);
  // A windowed layer's plan drops what its window no longer sees: no rollback.
  EXPECT_EQ(MakeCache(Options(PolicyKind::kDense, 0, 8, {0, 6}))->rollback(), nullptr);
}

TEST(PolicyKVCacheTest, TruncateRefusesWhatOnlyASequentialStepCanUndo) {
  PolicyKVCacheOptions options = Options(PolicyKind::kDense, 0, 8, {0});
  std::unique_ptr<PolicyKVCache> cache = MakeCache(options);  // residual 4
  Drive(*cache, 12, 12, 12, true);
  // The last step was a chunk: its ring's oldest entries went to main encoded.
  const absl::Status status = cache->Truncate(10);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_EQ(cache->KeptPositions(0, 0, 0), Range(0, 12));  // unchanged
  EXPECT_TRUE(cache->Truncate(12).ok());                   // nothing to forget
}

TEST(KVCacheFactoryTest, BadSpecsNameTheFieldAndTheValue) {
  KVCacheShape shape;
  shape.max_sequence_length = 64;
  shape.layers = {{kGroups, kHeadSize, 0}};
  struct Bad {
    KVCacheSpec spec;
    std::vector<std::string> words;
  };
  std::vector<Bad> bad;
  bad.push_back({{"lru", 8, 16}, {"KVCacheSpec.policy", "lru", "h2o"}});
  bad.push_back({{"window", 0, 16}, {"KVCacheSpec.budget", "0", "window"}});
  bad.push_back({{"h2o", -3, 8}, {"KVCacheSpec.budget", "-3"}});
  bad.push_back({{"sink", 16, 3}, {"KVCacheSpec.bits", "3"}});
  KVCacheSpec sink{"sink", 4, 16};
  sink.sink_tokens = 8;
  bad.push_back({sink, {"KVCacheSpec.sink_tokens=8", "KVCacheSpec.budget=4"}});
  KVCacheSpec residual{"window", 4, 8};
  residual.residual = -1;
  bad.push_back({residual, {"KVCacheSpec.residual", "-1"}});
  KVCacheSpec group{"window", 4, 8};
  group.group_size = 0;
  bad.push_back({group, {"KVCacheSpec.group_size", "0"}});
  for (const Bad& b : bad) {
    auto cache = MakeKVCache(b.spec, shape);
    ASSERT_FALSE(cache.ok()) << DescribeKVCacheSpec(b.spec);
    EXPECT_EQ(cache.status().code(), absl::StatusCode::kInvalidArgument);
    for (const std::string& word : b.words) {
      EXPECT_TRUE(absl::StrContains(cache.status().message(), word)) << cache.status();
    }
  }
}

// Every rule's error carries the field at fault (core/base/status_field.h), and the other fields
// its message names, so tools and the server name them in their own terms.
TEST(KVCacheFactoryTest, EveryRuleCarriesItsField) {
  struct Bad {
    KVCacheSpec spec;
    std::string field;
    std::vector<std::string> others;
  };
  auto spec = [](const std::string& policy, int64_t budget, int bits) {
    KVCacheSpec s;
    s.policy = policy;
    s.budget = budget;
    s.bits = bits;
    return s;
  };
  std::vector<Bad> bad;
  bad.push_back({spec("lru", 8, 16), "KVCacheSpec.policy", {}});
  bad.push_back({spec("window", 0, 16), "KVCacheSpec.budget", {}});
  bad.push_back({spec("sink", 16, 3), "KVCacheSpec.bits", {}});
  KVCacheSpec s = spec("sink", 4, 16);
  s.sink_tokens = 8;  // the budget falls short of the sink tokens
  bad.push_back({s, "KVCacheSpec.budget", {"KVCacheSpec.sink_tokens"}});
  s.sink_tokens = -1;
  bad.push_back({s, "KVCacheSpec.sink_tokens", {}});
  s = spec("h2o", 8, 16);
  s.recent_fraction = 2;
  bad.push_back({s, "KVCacheSpec.recent_fraction", {}});
  s = spec("h2o", 8, 16);
  s.grace_period = -2;
  bad.push_back({s, "KVCacheSpec.grace_period", {}});
  s = spec("qh2o", 8, 8);
  s.quant_weight = 2;
  bad.push_back({s, "KVCacheSpec.quant_weight", {}});
  s = spec("window", 8, 8);
  s.residual = -1;
  bad.push_back({s, "KVCacheSpec.residual", {}});
  s = spec("window", 8, 8);
  s.group_size = 0;
  bad.push_back({s, "KVCacheSpec.group_size", {}});
  s = spec("window", 8, 8);
  s.read_chunk = 0;
  bad.push_back({s, "KVCacheSpec.read_chunk", {}});
  s = spec("sink", 8, 16);
  s.positions = "sideways";
  bad.push_back({s, "KVCacheSpec.positions", {}});
  bad.push_back({spec("qh2o", 8, 16), "KVCacheSpec.bits", {"KVCacheSpec.policy"}});
  s = spec("h2o", 8, 16);
  s.budget_rule = "cone";
  bad.push_back({s, "KVCacheSpec.budget_rule", {}});
  s = spec("sink", 8, 16);
  s.positions = "cache";
  s.budget_rule = "pyramid";
  bad.push_back({s, "KVCacheSpec.positions", {"KVCacheSpec.budget_rule"}});
  s = spec("h2o", 8, 16);
  s.positions = "cache";
  bad.push_back({s, "KVCacheSpec.positions", {"KVCacheSpec.policy"}});
  bad.push_back({spec("dense", 8, 16), "KVCacheSpec.budget", {"KVCacheSpec.policy"}});
  bad.push_back({spec("dense", -5, 8), "KVCacheSpec.budget", {"KVCacheSpec.policy"}});
  for (const Bad& b : bad) {
    const absl::Status status = ValidateKVCacheSpec(b.spec);
    SCOPED_TRACE(status.ToString());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ErrorField(status), b.field);
    std::vector<std::string> others;
    for (const FieldRef& field : ErrorFields(status)) others.push_back(field.path);
    others.erase(others.begin());
    EXPECT_EQ(others, b.others);
    // The message names the field as the library writes it.
    EXPECT_TRUE(absl::StrContains(status.message(), b.field));
  }
  // The dense cache's budget is 0; a sink budget may equal its sink tokens.
  EXPECT_TRUE(ValidateKVCacheSpec(spec("dense", 0, 8)).ok());
  s = spec("sink", 4, 16);
  s.sink_tokens = 4;
  EXPECT_TRUE(ValidateKVCacheSpec(s).ok());
  const absl::Status dense = ValidateKVCacheSpec(spec("dense", 8, 16));
  EXPECT_TRUE(absl::StrContains(dense.message(),
                                "KVCacheSpec.budget=8 needs a budgeted "
                                "KVCacheSpec.policy"))
      << dense;

  // The rule that needs the shape: cache positions need a budget below the context.
  KVCacheShape shape;
  shape.max_sequence_length = 16;
  shape.layers = {{kGroups, kHeadSize, 0}};
  s = spec("sink", 16, 16);
  s.positions = "cache";
  const absl::Status full = MakeKVCache(s, shape).status();
  EXPECT_EQ(ErrorField(full), "KVCacheSpec.budget") << full;

  // PolicyKVCache::Create checks the same rules in its own options' names.
  const absl::Status qh2o = PolicyKVCache::Create(Options(PolicyKind::kQH2O, 8, 16)).status();
  EXPECT_EQ(ErrorField(qh2o), "PolicyKVCacheOptions.bits") << qh2o;
  PolicyKVCacheOptions options = Options(PolicyKind::kH2O, 8, 16);
  options.cache_positions = true;
  const absl::Status positions = PolicyKVCache::Create(options).status();
  EXPECT_EQ(ErrorField(positions), "PolicyKVCacheOptions.cache_positions") << positions;
  options = Options(PolicyKind::kSink, 600, 16);
  options.cache_positions = true;
  const absl::Status context = PolicyKVCache::Create(options).status();
  EXPECT_EQ(ErrorField(context), "PolicyKVCacheOptions.policy.budget") << context;
  options = Options(PolicyKind::kH2O, 8, 16, {0, 0});
  options.policy.layer_budgets = {8, 8, 8};
  const absl::Status layers = PolicyKVCache::Create(options).status();
  EXPECT_EQ(ErrorField(layers), "PolicyKVCacheOptions.policy.layer_budgets") << layers;
  options = Options(PolicyKind::kH2O, 0, 16);
  const absl::Status budget = PolicyKVCache::Create(options).status();
  EXPECT_EQ(ErrorField(budget), "PolicyKVCacheOptions.policy.budget") << budget;
}

TEST(KVCacheFactoryTest, DenseAt16BitsIsTheExactDenseCache) {
  KVCacheShape shape;
  shape.max_sequence_length = 64;
  shape.layers = {{kGroups, kHeadSize, 0}};
  auto dense = MakeKVCache({"dense", 0, 16}, shape);
  ASSERT_TRUE(dense.ok());
  EXPECT_NE(dynamic_cast<DenseKVCache*>(dense->get()), nullptr);
  for (const char* policy : {"dense", "window", "sink", "h2o", "tova"}) {
    const bool dense = std::string(policy) == "dense";  // no budget there: it keeps everything
    auto cache = MakeKVCache({policy, dense ? 0 : 16, dense ? 8 : 16}, shape);
    ASSERT_TRUE(cache.ok()) << cache.status();
    EXPECT_NE(dynamic_cast<PolicyKVCache*>(cache->get()), nullptr) << policy;
  }
}

}  // namespace
}  // namespace lgpt
