// KV cache policies through whole models (random small models of several presets: GQA,
// sliding-window layers, softcapping, parallel residual):
// - every policy, with a budget covering the sequence, gives the dense cache's logits (1e-5)
//   for prefill chunks of 1, 3 and the whole prompt followed by token-by-token decoding;
// - a smaller budget changes them (the comparison has teeth), quantised entries stay close;
// - attending in place (UpdateAndAttend) equals the attention kernel over Update's view, at
//   the cache and through whole models;
// - a budgeted cache's bytes stay flat while decoding far past the budget.
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "cache/dense_kv_cache.h"
#include "cache/kv_cache_factory.h"
#include "cache/policy_kv_cache.h"
#include "core/base/device.h"
#include "core/config/config_presets.h"
#include "core/model/gpt.h"
#include "core/ops/attention.h"
#include "gtest/gtest.h"
#include "tests/test_models.h"

namespace lgpt {
namespace {

constexpr int64_t kBatch = 2, kPrompt = 9, kTotal = 20;

GPT RandomModel(const std::string& preset) {
  absl::StatusOr<Config> config = PresetFromName(preset);
  EXPECT_TRUE(config.ok()) << config.status();
  absl::StatusOr<Config> shrunk = ShrinkConfig(*config);
  EXPECT_TRUE(shrunk.ok()) << shrunk.status();
  absl::StatusOr<GPT> model = GPTImpl::Create(*shrunk);
  EXPECT_TRUE(model.ok()) << model.status();
  RandomizeWeights(**model, 1234);
  (*model)->To(DefaultDevice(), at::kFloat);
  (*model)->eval();
  return *model;
}

std::unique_ptr<PolicyKVCache> PolicyCache(GPTImpl& model, PolicyKind kind, int64_t budget,
                                           int bits) {
  PolicyKVCacheOptions options;
  options.batch_size = kBatch;
  options.max_sequence_length = model.config().block_size;
  options.layers = model.CacheLayout();
  options.dtype = model.dtype();
  options.device = model.device();
  options.policy.kind = kind;
  options.policy.budget = budget;
  options.policy.sink_tokens = 2;
  options.bits = bits;
  options.residual = 3;
  options.group_size = 8;
  auto cache = PolicyKVCache::Create(options);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return std::move(*cache);
}

// Logits [B, kTotal, vocab] of a prefill of kPrompt tokens in `chunk` pieces, then decoding.
at::Tensor CachedLogits(GPTImpl& model, KVCache& cache, const at::Tensor& tokens, int64_t chunk) {
  std::vector<at::Tensor> pieces;
  int64_t position = 0;
  while (position < kTotal) {
    const int64_t length = position < kPrompt ? std::min(chunk, kPrompt - position) : 1;
    ForwardOptions options;
    options.positions =
        at::arange(position, position + length, at::kLong).unsqueeze(0).expand({kBatch, length});
    absl::StatusOr<at::Tensor> logits =
        model.Forward(tokens.narrow(1, position, length), &cache, options);
    EXPECT_TRUE(logits.ok()) << logits.status();
    pieces.push_back(logits->cpu());
    position += length;
  }
  return at::cat(pieces, 1);
}

class KVPolicyEquivalenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(KVPolicyEquivalenceTest, EveryPolicyWithACoveringBudgetEqualsDense) {
  GPT model = RandomModel(GetParam());
  at::manual_seed(99);
  const at::Tensor tokens =
      at::randint(0, model->config().vocab_size, {kBatch, kTotal}, at::kLong).to(model->device());
  for (int64_t chunk : {int64_t{1}, int64_t{3}, kPrompt}) {
    auto dense = model->NewDenseCache(kBatch, kTotal);
    ASSERT_TRUE(dense.ok());
    const at::Tensor expected = CachedLogits(*model, **dense, tokens, chunk);
    ASSERT_GT(expected.abs().max().item<double>(), 0.1);
    for (PolicyKind kind : {PolicyKind::kDense, PolicyKind::kWindow, PolicyKind::kSink,
                            PolicyKind::kH2O, PolicyKind::kTova, PolicyKind::kH2OVlen}) {
      auto cache = PolicyCache(*model, kind, kTotal, 16);
      const at::Tensor got = CachedLogits(*model, *cache, tokens, chunk);
      EXPECT_LT((got - expected).abs().max().item<double>(), 1e-5)
          << GetParam() << " " << PolicyName(kind) << ", prefill chunk " << chunk;
      if (kind == PolicyKind::kDense) continue;
      // Under the sequence and under the shrunk models' window (4) less one (a budget of
      // window - 1 plus the step's own entry is the window itself): evictions that matter.
      auto small = PolicyCache(*model, kind, 2, 16);
      const at::Tensor evicted = CachedLogits(*model, *small, tokens, chunk);
      EXPECT_GT((evicted - expected).abs().max().item<double>(), 1e-3)
          << GetParam() << " " << PolicyName(kind) << ": a budget of 2 must change logits";
    }
    for (int bits : {8, 4}) {
      auto cache = PolicyCache(*model, PolicyKind::kH2O, kTotal, bits);
      const double diff =
          (CachedLogits(*model, *cache, tokens, chunk) - expected).abs().max().item<double>();
      const double scale = expected.abs().max().item<double>();
      EXPECT_GT(diff, 0) << bits << " bits";
      EXPECT_LT(diff, (bits == 8 ? 0.02 : 0.25) * scale) << GetParam() << ", " << bits << " bits";
    }
  }
}

TEST_P(KVPolicyEquivalenceTest, FactoryCachesAtFullBudgetEqualDense) {
  GPT model = RandomModel(GetParam());
  at::manual_seed(7);
  const at::Tensor tokens =
      at::randint(0, model->config().vocab_size, {kBatch, kTotal}, at::kLong).to(model->device());
  auto dense = model->NewDenseCache(kBatch, kTotal);
  ASSERT_TRUE(dense.ok());
  const at::Tensor expected = CachedLogits(*model, **dense, tokens, 4);
  KVCacheShape shape;
  shape.batch_size = kBatch;
  shape.max_sequence_length = model->config().block_size;
  shape.layers = model->CacheLayout();
  shape.dtype = model->dtype();
  shape.device = model->device();
  for (const char* policy : {"dense", "window", "sink", "h2o", "tova", "h2o-vlen"}) {
    // The dense cache takes no budget: it keeps everything.
    auto cache = MakeKVCache({policy, std::string(policy) == "dense" ? 0 : kTotal, 16}, shape);
    ASSERT_TRUE(cache.ok()) << cache.status();
    EXPECT_LT((CachedLogits(*model, **cache, tokens, 4) - expected).abs().max().item<double>(),
              1e-5)
        << policy;
  }
  // The score policies' options change nothing while nothing is evicted: grace periods,
  // normalised scores, pyramid budgets (whose smallest layer budget still covers the sequence).
  for (const char* policy : {"h2o", "tova", "h2o-vlen"}) {
    KVCacheSpec spec{policy, kTotal, 16};
    spec.grace_period = 3;
    spec.normalize_scores = true;
    auto cache = MakeKVCache(spec, shape);
    ASSERT_TRUE(cache.ok()) << cache.status();
    spec.budget = 2 * kTotal;
    spec.budget_rule = "pyramid";
    auto pyramid = MakeKVCache(spec, shape);
    ASSERT_TRUE(pyramid.ok()) << pyramid.status();
    for (KVCache* c : {cache->get(), pyramid->get()}) {
      EXPECT_LT((CachedLogits(*model, *c, tokens, 4) - expected).abs().max().item<double>(), 1e-5)
          << policy;
    }
  }
  // qh2o scores quantisation error, so it runs on int8/int4 storage: at full budget it equals
  // h2o on the same storage (itself within rounding of dense:
  // EveryPolicyWithACoveringBudgetEqualsDense), bit for bit.
  for (int bits : {8, 4}) {
    auto h2o = MakeKVCache({"h2o", kTotal, bits}, shape);
    auto qh2o = MakeKVCache({"qh2o", kTotal, bits}, shape);
    ASSERT_TRUE(h2o.ok() && qh2o.ok()) << qh2o.status();
    EXPECT_TRUE(
        at::equal(CachedLogits(*model, **qh2o, tokens, 4), CachedLogits(*model, **h2o, tokens, 4)))
        << bits << " bits";
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, KVPolicyEquivalenceTest,
                         ::testing::Values("Llama-3.2-1B", "Gemma-2-2b", "Mistral-7B-v0.1",
                                           "pythia-160m"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name;
                           for (char c : info.param) name += std::isalnum(c) ? c : '_';
                           return name;
                         });

// UpdateAndAttend (blockwise, in place) equals the attention kernel over Update's view, with
// the decisions that follow from the kernel's weights, for every policy and width.
TEST(KVPolicyInPlaceTest, InPlaceAttentionEqualsTheAttentionKernel) {
  const int64_t groups = 2, n_head = 6, head_size = 16, total = 40, prompt = 13;
  for (PolicyKind kind :
       {PolicyKind::kDense, PolicyKind::kWindow, PolicyKind::kSink, PolicyKind::kH2O,
        PolicyKind::kTova, PolicyKind::kH2OVlen, PolicyKind::kQH2O}) {
    for (int bits : {16, 8, 4}) {
      if (kind == PolicyKind::kQH2O && bits == 16) continue;  // refused: it needs 8 or 4 bits
      PolicyKVCacheOptions options;
      options.max_sequence_length = 64;
      options.layers = {{groups, head_size, 0}, {groups, head_size, 6}};
      options.policy.kind = kind;
      options.policy.budget = 10;
      options.bits = bits;
      options.residual = 3;
      options.read_chunk = 4;
      auto via_view = PolicyKVCache::Create(options);
      auto in_place = PolicyKVCache::Create(options);
      ASSERT_TRUE(via_view.ok() && in_place.ok());
      at::manual_seed(21);
      double max_diff = 0;
      int64_t position = 0;
      while (position < total) {
        const int64_t length = position == 0 ? prompt : 1;
        KVStep step;
        step.positions = at::arange(position, position + length, at::kLong).unsqueeze(0);
        step.min_position = position;
        step.max_position = position + length - 1;
        for (int64_t layer = 0; layer < 2; ++layer) {
          const at::Tensor k = at::randn({1, groups, length, head_size});
          const at::Tensor v = at::randn({1, groups, length, head_size});
          const at::Tensor q = at::randn({1, n_head, length, head_size});
          AttentionParams params;
          params.scale = 0.25;
          params.softcap = 3.0;
          params.sliding_window = layer == 1 ? 6 : 0;
          auto view = (*via_view)->Update(layer, step, k, v);
          ASSERT_TRUE(view.ok());
          at::Tensor weights;
          const at::Tensor expected = AttendByPositions(q, view->keys, view->values, step.positions,
                                                        view->positions, params, &weights);
          if ((*via_view)->WantsAttentionWeights(layer)) {
            (*via_view)->ObserveAttentionWeights(layer, weights);
          }
          auto got = (*in_place)->UpdateAndAttend(
              layer, step, q, k, v, {params.scale, params.softcap, params.sliding_window});
          ASSERT_TRUE(got.ok()) << got.status();
          max_diff = std::max(max_diff, (*got - expected).abs().max().item<double>());
        }
        position += length;
      }
      EXPECT_LT(max_diff, 1e-5) << PolicyName(kind) << " " << bits << " bits";
      for (int64_t g = 0; g < groups; ++g) {
        EXPECT_EQ((*via_view)->KeptPositions(0, 0, g), (*in_place)->KeptPositions(0, 0, g));
      }
    }
  }
}

// Delegates storage to a cache but keeps KVCache's default UpdateAndAttend, so the attention
// reads Update's views (decoded whole) instead of the cache's blockwise attention.
class ViewsOnly : public KVCache {
 public:
  explicit ViewsOnly(KVCache& inner) : inner_(inner) {}
  absl::StatusOr<KVView> Update(int64_t layer, const KVStep& step, const at::Tensor& keys,
                                const at::Tensor& values) override {
    return inner_.Update(layer, step, keys, values);
  }
  absl::Status CheckStep(const KVStep& step, int64_t batch_size) const override {
    return inner_.CheckStep(step, batch_size);
  }
  void Reset() override { inner_.Reset(); }
  int64_t AllocatedBytes() const override { return inner_.AllocatedBytes(); }
  int64_t IndexBytes() const override { return inner_.IndexBytes(); }
  int64_t max_sequence_length() const override { return inner_.max_sequence_length(); }
  int64_t batch_size() const override { return inner_.batch_size(); }
  int64_t num_layers() const override { return inner_.num_layers(); }
  KVAttentionScorer* attention_scorer() override { return inner_.attention_scorer(); }
  std::string DebugName() const override { return inner_.DebugName(); }

 private:
  KVCache& inner_;
};

// Quantised caches through whole models: the attention reading Update's views (decoded whole)
// and attending in place (block by block, the quantised cache's own UpdateAndAttend) give the
// same logits and decisions.
TEST(KVPolicyInPlaceTest, ModelLogitsAreTheSameFromViewsAndInPlace) {
  for (const char* preset : {"Gemma-2-2b", "Llama-3.2-1B"}) {
    GPT model = RandomModel(preset);
    at::manual_seed(3);
    const at::Tensor tokens =
        at::randint(0, model->config().vocab_size, {kBatch, kTotal}, at::kLong).to(model->device());
    for (PolicyKind kind : {PolicyKind::kSink, PolicyKind::kH2O, PolicyKind::kTova}) {
      for (int bits : {8, 4}) {
        auto direct = PolicyCache(*model, kind, 6, bits);
        auto inner = PolicyCache(*model, kind, 6, bits);
        ViewsOnly views(*inner);
        const at::Tensor a = CachedLogits(*model, *direct, tokens, 4);
        const at::Tensor b = CachedLogits(*model, views, tokens, 4);
        // Not bit-exact: blockwise sums round differently (1e-7), and a later layer's entry
        // that sits on a rounding boundary can quantise one step apart. Exactness is checked
        // at the cache (InPlaceAttentionEqualsTheAttentionKernel); here, wrong entries or
        // decisions would move logits by far more than 1e-3 of their scale.
        const double scale = std::max(1.0, a.abs().max().item<double>());
        EXPECT_LT((a - b).abs().max().item<double>(), 1e-3 * scale)
            << preset << " " << PolicyName(kind) << " " << bits << " bits";
        EXPECT_EQ(direct->KeptPositions(0, 1, 1), inner->KeptPositions(0, 1, 1));
      }
    }
  }
}

TEST(KVPolicyBytesTest, BudgetedBytesStayFlatWhileDecodingFarPastTheBudget) {
  GPT model = RandomModel("Gemma-2-2b");
  for (const char* policy : {"window", "sink", "h2o", "tova", "h2o-vlen", "qh2o"}) {
    for (int bits : {16, 8, 4}) {
      if (std::string(policy) == "qh2o" && bits == 16) continue;  // refused (8 or 4 bits only)
      KVCacheSpec spec{policy, 8, bits};
      spec.sink_tokens = 2;
      spec.residual = 2;
      KVCacheShape shape;
      shape.max_sequence_length = model->config().block_size;
      shape.layers = model->CacheLayout();
      shape.dtype = model->dtype();
      shape.device = model->device();
      auto cache = MakeKVCache(spec, shape);
      ASSERT_TRUE(cache.ok()) << cache.status();
      int64_t flat = -1;
      for (int64_t position = 0; position < 60; ++position) {
        ForwardOptions options;
        options.positions = at::full({1, 1}, position, at::kLong);
        ASSERT_TRUE(model
                        ->Forward(at::full({1, 1}, position % 90, at::kLong).to(model->device()),
                                  cache->get(), options)
                        .ok());
        if (position == 12) flat = (*cache)->AllocatedBytes();
        if (position > 12) {
          ASSERT_EQ((*cache)->AllocatedBytes(), flat)
              << policy << " " << bits << " bits, position " << position;
        }
      }
      EXPECT_GT(flat, 0);
    }
  }
}

}  // namespace
}  // namespace lgpt
