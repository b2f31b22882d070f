// Cache-aware training (core/train/chunked_backward.h): the cell-by-cell gradient equals
// autograd through the same chunked computation kept whole, with and without evictions, for
// full fine-tuning and LoRA, on families with GQA, sliding windows, soft-capping and parallel
// residuals.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "cache/kv_cache_factory.h"
#include "core/base/device.h"
#include "core/config/config_presets.h"
#include "core/model/gpt.h"
#include "core/train/chunked_backward.h"
#include "core/train/replay_kv_cache.h"
#include "peft/lora.h"
#include "tests/test_models.h"

namespace lgpt {
namespace {

constexpr int64_t kBatch = 2, kLength = 23, kFirst = 7, kChunk = 4;

GPT Model(const std::string& preset, bool lora) {
  absl::StatusOr<Config> config = PresetFromName(preset);
  EXPECT_TRUE(config.ok()) << config.status();
  absl::StatusOr<Config> shrunk = ShrinkConfig(*config);
  EXPECT_TRUE(shrunk.ok()) << shrunk.status();
  if (lora) {
    shrunk->lora_r = 2;
    shrunk->lora_alpha = 4;
    shrunk->lora_query = shrunk->lora_value = shrunk->lora_mlp = true;
  }
  absl::StatusOr<GPT> model = lora ? CreateLoraGPT(*shrunk) : GPTImpl::Create(*shrunk);
  EXPECT_TRUE(model.ok()) << model.status();
  RandomizeWeights(**model, 77);
  (*model)->To(DefaultDevice(), at::kDouble);  // float64: differences are the method's
  for (auto& p : (*model)->named_parameters()) {
    p.value().set_requires_grad(!lora || absl::StrContains(p.key(), "lora_"));
  }
  return *model;
}

// Token ids and SFT labels: the first three positions of each row do not count.
std::pair<at::Tensor, at::Tensor> Batch(const GPTImpl& model) {
  at::manual_seed(5);
  const at::Tensor ids = at::randint(0, model.config().vocab_size, {kBatch, kLength}, at::kLong);
  at::Tensor labels = ids.clone();
  labels.narrow(1, 0, 3).fill_(-100);
  return {ids, labels};
}

std::map<std::string, at::Tensor> TakeGrads(GPTImpl& model) {
  std::map<std::string, at::Tensor> grads;
  for (auto& p : model.named_parameters()) {
    if (!p.value().requires_grad()) continue;
    EXPECT_TRUE(p.value().grad().defined()) << p.key();
    if (!p.value().grad().defined()) continue;
    grads[p.key()] = p.value().grad().clone();
    p.value().mutable_grad() = at::Tensor();
  }
  return grads;
}

void ExpectGradsNear(const std::map<std::string, at::Tensor>& got,
                     const std::map<std::string, at::Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double largest = 0;
  for (const auto& [name, w] : want) largest = std::max(largest, w.abs().max().item<double>());
  ASSERT_GT(largest, 1e-4) << what << ": gradients vanish, the test would prove nothing";
  for (const auto& [name, w] : want) {
    const double diff = (got.at(name) - w).abs().max().item<double>();
    EXPECT_LT(diff, 1e-5 * std::max(1.0, largest)) << what << " " << name;
  }
}

KVCacheShape ShapeOf(GPTImpl& model) {
  KVCacheShape shape;
  shape.batch_size = kBatch;
  shape.max_sequence_length = model.config().block_size;
  shape.layers = model.CacheLayout();
  shape.dtype = model.dtype();
  shape.device = model.device();
  return shape;
}

std::vector<std::pair<int64_t, int64_t>> Chunks() {
  std::vector<std::pair<int64_t, int64_t>> chunks;
  for (int64_t begin = 0; begin < kLength;) {
    const int64_t end = std::min(kLength, begin + (begin == 0 ? kFirst : kChunk));
    chunks.push_back({begin, end});
    begin = end;
  }
  return chunks;
}

at::Tensor ChunkPositions(int64_t begin, int64_t end) {
  return at::arange(begin, end, at::kLong).unsqueeze(0).expand({kBatch, end - begin});
}

// The replay log of a forward pass through `spec`'s cache, chunk after chunk (as ChunkedLoss
// runs it).
std::vector<std::vector<at::Tensor>> RecordDecisions(GPTImpl& model, const KVCacheSpec& spec,
                                                     const at::Tensor& ids) {
  at::NoGradGuard no_grad;
  auto inner = MakeKVCache(spec, ShapeOf(model));
  EXPECT_TRUE(inner.ok()) << inner.status();
  RecordingKVCache cache(std::move(*inner));
  for (const auto& [begin, end] : Chunks()) {
    ForwardOptions options;
    options.positions = ChunkPositions(begin, end);
    EXPECT_TRUE(model.Forward(ids.narrow(1, begin, end - begin), &cache, options).ok());
  }
  return cache.log();
}

// The naive reference: every key and value ever computed stays in the autograd graph; each
// step attends to what the log says each (row, group) attended to.
class NaiveReplayCache : public KVCache {
 public:
  NaiveReplayCache(std::vector<std::vector<at::Tensor>> log, int64_t layers, int64_t context)
      : log_(std::move(log)),
        keys_(layers),
        values_(layers),
        steps_(layers, 0),
        context_(context) {}

  absl::StatusOr<KVView> Update(int64_t layer, const KVStep& step, const at::Tensor& keys,
                                const at::Tensor& values) override {
    keys_[layer].push_back(keys);
    values_[layer].push_back(values);
    const at::Tensor all_keys = at::cat(keys_[layer], 2);  // [B, G, S, hs]
    const int64_t groups = keys.size(1), entries = all_keys.size(2);
    const at::Tensor attended = log_[layer][steps_[layer]++];  // [B, 1 or G, S']
    at::Tensor positions = at::full({kBatch, groups, entries}, -1, at::kLong);
    for (int64_t b = 0; b < kBatch; ++b) {
      for (int64_t g = 0; g < groups; ++g) {
        const at::Tensor mine = attended[b][attended.size(1) == 1 ? 0 : g];
        for (int64_t s = 0; s < mine.size(0); ++s) {
          const int64_t p = mine[s].item<int64_t>();
          if (p >= 0) positions[b][g][p] = p;  // entry p sits in slot p here
        }
      }
    }
    return KVView{all_keys, at::cat(values_[layer], 2), positions.to(keys.device())};
  }
  absl::Status CheckStep(const KVStep&, int64_t) const override { return absl::OkStatus(); }
  void Reset() override {}
  int64_t AllocatedBytes() const override { return 0; }
  int64_t IndexBytes() const override { return 0; }
  int64_t max_sequence_length() const override { return context_; }
  int64_t batch_size() const override { return kBatch; }
  int64_t num_layers() const override { return static_cast<int64_t>(keys_.size()); }
  std::string DebugName() const override { return "naive-replay"; }

 private:
  std::vector<std::vector<at::Tensor>> log_;
  std::vector<std::vector<at::Tensor>> keys_, values_;
  std::vector<int64_t> steps_;
  int64_t context_;
};

// Autograd through the chunked computation kept whole; returns the loss.
double NaiveChunkedBackward(GPTImpl& model, const KVCacheSpec& spec, const at::Tensor& ids,
                            const at::Tensor& labels) {
  NaiveReplayCache cache(RecordDecisions(model, spec, ids), model.config().n_layer,
                         model.config().block_size);
  at::Tensor targets = at::full_like(labels, -100);
  targets.narrow(1, 0, kLength - 1).copy_(labels.narrow(1, 1, kLength - 1));
  at::Tensor total = at::zeros({}, at::kDouble);
  for (const auto& [begin, end] : Chunks()) {
    ForwardOptions options;
    options.positions = ChunkPositions(begin, end);
    absl::StatusOr<at::Tensor> logits =
        model.Forward(ids.narrow(1, begin, end - begin), &cache, options);
    EXPECT_TRUE(logits.ok()) << logits.status();
    total = total + at::cross_entropy_loss(logits->reshape({-1, logits->size(-1)}).to(at::kFloat),
                                           targets.narrow(1, begin, end - begin).reshape(-1), {},
                                           at::Reduction::Sum, -100)
                        .to(at::kDouble);
  }
  const at::Tensor loss = total / (targets != -100).sum().to(at::kDouble);
  loss.backward();
  return loss.item<double>();
}

ChunkedTrainingOptions Options(const KVCacheSpec& spec) {
  ChunkedTrainingOptions options;
  options.cache = spec;
  options.chunk_size = kChunk;
  options.first_chunk = kFirst;
  return options;
}

class ChunkedTrainingTest : public ::testing::TestWithParam<std::string> {};

// Nothing evicted: the chunked gradient is plain autograd over the whole sequence.
TEST_P(ChunkedTrainingTest, WithoutEvictionsEqualsPlainAutograd) {
  for (bool lora : {false, true}) {
    GPT model = Model(GetParam(), lora);
    const auto [ids, labels] = Batch(*model);
    absl::StatusOr<at::Tensor> logits = model->Forward(ids);
    ASSERT_TRUE(logits.ok());
    at::Tensor targets = at::full_like(labels, -100);
    targets.narrow(1, 0, kLength - 1).copy_(labels.narrow(1, 1, kLength - 1));
    const at::Tensor loss =
        at::cross_entropy_loss(logits->reshape({-1, logits->size(-1)}).to(at::kFloat),
                               targets.reshape(-1), {}, at::Reduction::Mean, -100);
    loss.backward();
    const auto want = TakeGrads(*model);
    for (const char* policy : {"dense", "h2o", "sink"}) {
      // The dense cache takes no budget: it keeps everything.
      KVCacheSpec spec{policy, std::string(policy) == "dense" ? 0 : kLength, 16};
      spec.sink_tokens = 2;
      absl::StatusOr<ChunkedLossResult> got =
          ChunkedLoss(*model, ids, labels, Options(spec), /*grad_scale=*/1.0);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_NEAR(got->loss, loss.item<double>(), 1e-6) << policy;
      EXPECT_EQ(got->chunks, 5);
      ExpectGradsNear(TakeGrads(*model), want,
                      GetParam() + " " + policy + (lora ? " lora" : " full"));
    }
  }
}

// Budgets far below the sequence: the cells' gradient equals autograd through the same
// chunked computation with the same decisions.
TEST_P(ChunkedTrainingTest, WithEvictionsEqualsAutogradThroughTheSameChunks) {
  for (bool lora : {false, true}) {
    GPT model = Model(GetParam(), lora);
    const auto [ids, labels] = Batch(*model);
    for (const char* policy : {"h2o", "tova", "sink", "window", "h2o-vlen"}) {
      KVCacheSpec spec{policy, 5, 16};
      spec.sink_tokens = 2;
      const std::string what = GetParam() + " " + policy + (lora ? " lora" : " full");
      const double naive_loss = NaiveChunkedBackward(*model, spec, ids, labels);
      const auto want = TakeGrads(*model);
      absl::StatusOr<ChunkedLossResult> got =
          ChunkedLoss(*model, ids, labels, Options(spec), /*grad_scale=*/1.0);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_NEAR(got->loss, naive_loss, 1e-6) << what;  // the loss sums in float32
      ExpectGradsNear(TakeGrads(*model), want, what);
      // The cells held at most the budget's entries per group plus a chunk (first: the prefill).
      EXPECT_LE(got->peak_cell_rows, 5 * model->config().QueryGroups() + kFirst) << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, ChunkedTrainingTest,
                         ::testing::Values("Llama-3.2-1B", "Gemma-2-2b", "pythia-160m"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name;
                           for (char c : info.param) name += std::isalnum(c) ? c : '_';
                           return name;
                         });

// An evicting cache changes the loss (the test above compares like with like), and a grad
// scale scales the gradients.
TEST(ChunkedTrainingMore, EvictionsMatterAndGradScaleScales) {
  GPT model = Model("Llama-3.2-1B", false);
  const auto [ids, labels] = Batch(*model);
  auto dense = ChunkedLoss(*model, ids, labels, Options({"dense", 0, 16}), std::nullopt);
  auto h2o = ChunkedLoss(*model, ids, labels, Options({"h2o", 4, 16}), 1.0);
  ASSERT_TRUE(dense.ok() && h2o.ok());
  EXPECT_GT(std::abs(dense->loss - h2o->loss), 1e-4);
  const auto once = TakeGrads(*model);
  ASSERT_TRUE(ChunkedLoss(*model, ids, labels, Options({"h2o", 4, 16}), 3.0).ok());
  std::map<std::string, at::Tensor> scaled;
  for (const auto& [name, g] : once) scaled[name] = 3 * g;
  ExpectGradsNear(TakeGrads(*model), scaled, "grad_scale 3");
  // int8 storage: the backward treats quantisation as the identity; the loss is close.
  auto int8 = ChunkedLoss(*model, ids, labels, Options({"h2o", 4, 8}), 1.0);
  ASSERT_TRUE(int8.ok()) << int8.status();
  EXPECT_NEAR(int8->loss, h2o->loss, 0.05 * h2o->loss);
  for (const auto& [name, g] : TakeGrads(*model)) {
    EXPECT_TRUE(at::isfinite(g).all().item<bool>()) << name;
  }
}

// The classification head: one target per row scored over the class tokens' logits only,
// equal to plain autograd over the whole sequence when nothing is evicted.
TEST(ChunkedTrainingMore, ClassificationHeadEqualsPlainAutograd) {
  GPT model = Model("Gemma-2-2b", false);
  at::manual_seed(9);
  const at::Tensor ids = at::randint(0, model->config().vocab_size, {kBatch, kLength}, at::kLong);
  const std::vector<int64_t> classes = {11, 12, 13, 14};
  // Row 0's answer (its first counted label) is class 2 at position 15, row 1's class 0 at 20;
  // later labels (say an EOS) count for nothing.
  at::Tensor labels = at::full({kBatch, kLength}, -100, at::kLong);
  labels[0][15] = 13;
  labels[0][16] = 2;
  labels[1][20] = 11;
  ChunkedTrainingOptions options = Options({"dense", 0, 16});
  options.class_tokens = classes;
  auto got = ChunkedLoss(*model, ids, labels, options, 1.0);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->target_tokens, 2);
  const auto chunked = TakeGrads(*model);
  absl::StatusOr<at::Tensor> logits = model->Forward(ids);
  ASSERT_TRUE(logits.ok());
  const at::Tensor class_ids = at::tensor(classes, at::kLong);
  const at::Tensor scored = at::stack(
      {(*logits)[0][14].index_select(0, class_ids), (*logits)[1][19].index_select(0, class_ids)});
  const at::Tensor loss =
      at::cross_entropy_loss(scored.to(at::kFloat), at::tensor({2, 0}, at::kLong));
  loss.backward();
  EXPECT_NEAR(got->loss, loss.item<double>(), 1e-6);
  ExpectGradsNear(chunked, TakeGrads(*model), "classification");
  // A first counted label that is not a class token is an error naming the row.
  labels[1][20] = 50;
  auto bad = ChunkedLoss(*model, ids, labels, options, 1.0);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "row 1")) << bad.status();
}

// int8 checkpoints: about a quarter of the float32 bytes (here float64: an eighth), the same
// loss (the forward does not read them) and a gradient close to the exact one.
TEST(ChunkedTrainingMore, Int8CheckpointsGiveAGradientCloseToTheExactOne) {
  GPT model = Model("Llama-3.2-1B", false);
  const auto [ids, labels] = Batch(*model);
  ChunkedTrainingOptions options = Options({"h2o", 5, 16});
  auto exact = ChunkedLoss(*model, ids, labels, options, 1.0);
  ASSERT_TRUE(exact.ok()) << exact.status();
  const auto want = TakeGrads(*model);
  options.checkpoint_bits = 8;
  auto packed = ChunkedLoss(*model, ids, labels, options, 1.0);
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ(packed->loss, exact->loss);
  const int64_t width = model->config().n_embd;
  EXPECT_EQ(packed->checkpoint_bytes * 8 * width,
            exact->checkpoint_bytes * (width + 2 * width / std::gcd<int64_t>(32, width)));
  double error = 0, norm = 0;
  for (const auto& [name, g] : TakeGrads(*model)) {
    error += (g - want.at(name)).pow(2).sum().item<double>();
    norm += want.at(name).pow(2).sum().item<double>();
  }
  EXPECT_GT(error, 0);                                  // the rounding reaches the gradient...
  EXPECT_LT(std::sqrt(error), 0.05 * std::sqrt(norm));  // ...and changes it little
  options.checkpoint_bits = 4;
  auto bad = ChunkedLoss(*model, ids, labels, options, 1.0);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "ChunkedTrainingOptions.checkpoint_bits"))
      << bad.status();
}

TEST(ChunkedTrainingMore, BadInputsNameWhatIsWrong) {
  GPT model = Model("Llama-3.2-1B", false);
  const auto [ids, labels] = Batch(*model);
  ChunkedTrainingOptions options = Options({"h2o", 4, 16});
  options.chunk_size = 0;
  auto bad = ChunkedLoss(*model, ids, labels, options, 1.0);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "ChunkedTrainingOptions.chunk_size"));
  options = Options({"sink", 8, 16});
  options.cache.positions = "cache";
  bad = ChunkedLoss(*model, ids, labels, options, 1.0);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "positions must be absolute"));
  options = Options({"h2o", 0, 16});
  bad = ChunkedLoss(*model, ids, labels, options, 1.0);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "KVCacheSpec.budget"));
  const at::Tensor long_ids = at::zeros({1, model->config().block_size + 1}, at::kLong);
  bad = ChunkedLoss(*model, long_ids, long_ids, Options({"dense", 0, 16}), 1.0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kOutOfRange);
  bad = ChunkedLoss(*model, ids, labels.narrow(1, 0, 5), Options({"dense", 0, 16}), 1.0);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "labels"));
}

}  // namespace
}  // namespace lgpt
