// ForwardChunks (core/model/batch_forward.h) against one batch-1 forward pass per chunk: golden
// LitGPT checkpoints and small random models of the soft-capping and mixture-of-experts
// families, prompt chunks and decode rows through dense, budgeted, quantised and paged caches.
#include "core/model/batch_forward.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cctype>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/block_pool.h"
#include "cache/kv_cache_factory.h"
#include "cache/paged_kv_cache.h"
#include "core/model/cache_positions.h"
#include "core/model/gpt.h"
#include "core/ops/gemv.h"
#include "gtest/gtest.h"
#include "tests/serving_test_util.h"

namespace lgpt {
namespace {

// ForwardChunks against one forward pass per chunk: chunks of different lengths at different
// positions, through dense, budgeted, quantised and paged caches (one holding a prefix found
// in the pool), two rounds so the caches' contents after the shared pass are checked too.
class ForwardChunksTest : public ::testing::TestWithParam<std::string> {
 protected:
  GPT Model() const {
    return GetParam().rfind("golden/", 0) == 0 ? GoldenModel(GetParam())
                                               : RandomModel(GetParam(), 6);
  }
  // Row-invariant kernels (float32 on a CPU with the AVX-512 GEMV, which takes every product
  // of these passes: core/ops/gemv.h) make each row's logits its batch-1 pass's bit for bit:
  // every other layer works token by token (norms, rotations and activations as host loops,
  // attention per chunk). Elsewhere (BLAS past 32 rows, GPUs, ATen elementwise functions
  // whose result depends on where an element lies) they agree to rounding.
  static void ExpectSameLogits(const GPTImpl& model, const at::Tensor& row,
                               const at::Tensor& expected) {
    const double diff = (row - expected).abs().max().item<double>();
    if (model.device().is_cpu() && model.dtype() == at::kFloat &&
        BestGemvKernel() == GemvKernel::kAvx512 &&
        (!UsesAtenTanh(model.config()) || AtenTanhIsPositionInvariant())) {
      EXPECT_TRUE(at::equal(row, expected)) << "max difference " << diff;
    } else {
      EXPECT_LE(diff, 1e-4);
    }
  }
  // Dense, windowed, score-based and quantised caches.
  static std::vector<KVCacheSpec> Specs() {
    return {TestSpec("dense", 0, 16), TestSpec("window", 8, 16), TestSpec("h2o", 8, 16),
            TestSpec("dense", 0, 8),  TestSpec("tova", 8, 4),    TestSpec("sink", 8, 16)};
  }
};

TEST_P(ForwardChunksTest, EachChunkEqualsItsBatchOnePass) {
  GPT model = Model();
  at::NoGradGuard no_grad;
  const int64_t vocab = model->config().PaddedVocabSize();
  const int64_t length = 48;
  KVCacheGeometry geometry;
  geometry.layers = model->CacheLayout();
  BlockPoolOptions pool_options;
  pool_options.entries_per_block = 4;
  pool_options.num_blocks = 64;
  std::shared_ptr<BlockPool> pool = *BlockPool::Create(geometry, pool_options);
  PrefixCache prefixes(pool);
  at::manual_seed(12);
  const at::Tensor prefix = at::randint(0, vocab, {12}, at::kLong);

  struct Pair {
    std::unique_ptr<KVCache> batched, alone;
    std::unique_ptr<CachePositions> batched_stream, alone_stream;
    std::vector<int64_t> ids;
    int64_t done = 0;
  };
  std::vector<Pair> pairs;
  const std::vector<KVCacheSpec> specs = Specs();
  for (const KVCacheSpec& spec : specs) {
    Pair pair;
    pair.batched = BatchOneCache(*model, spec, length);
    pair.alone = BatchOneCache(*model, spec, length);
    pairs.push_back(std::move(pair));
  }
  {
    // A paged cache that finds the first 12 ids cached (published by another request).
    std::unique_ptr<PagedKVCache> publisher = *PagedKVCache::Create(pool, length);
    CachePositions stream(*model, *publisher);
    ForwardOptions forward;
    forward.positions = stream.Take(12);
    ASSERT_TRUE(model->Forward(prefix.unsqueeze(0), publisher.get(), forward).ok());
    const std::vector<int64_t> ids(prefix.data_ptr<int64_t>(), prefix.data_ptr<int64_t>() + 12);
    publisher->PublishPrefix(prefixes, ids);
    Pair pair;
    std::vector<int64_t> prompt = ids;
    for (int64_t j = 0; j < 20; ++j) prompt.push_back((5 * j + 1) % vocab);
    std::unique_ptr<PagedKVCache> batched = *PagedKVCache::Create(pool, length);
    std::unique_ptr<PagedKVCache> alone = *PagedKVCache::Create(pool, length);
    ASSERT_EQ(batched->AttachPrefix(prefixes, prompt), 12);
    ASSERT_EQ(alone->AttachPrefix(prefixes, prompt), 12);
    pair.batched = std::move(batched);
    pair.alone = std::move(alone);
    pair.ids = prompt;
    pair.done = 12;
    pairs.push_back(std::move(pair));
  }
  for (size_t i = 0; i < pairs.size(); ++i) {
    Pair& pair = pairs[i];
    if (pair.ids.empty()) {
      const at::Tensor ids = at::randint(0, vocab, {32}, at::kLong);
      pair.ids.assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + 32);
    }
    pair.batched_stream = std::make_unique<CachePositions>(*model, *pair.batched, pair.done);
    pair.alone_stream = std::make_unique<CachePositions>(*model, *pair.alone, pair.done);
  }
  // Round 2 feeds one token per cache: decode rows, as the scheduler's mixed passes run them.
  for (int round = 0; round < 3; ++round) {
    std::vector<SequenceChunk> chunks;
    std::vector<at::Tensor> expected;
    for (size_t i = 0; i < pairs.size(); ++i) {
      Pair& pair = pairs[i];
      const int64_t steps = round == 2 ? 1 : 1 + (static_cast<int64_t>(i) * 5 + round * 3) % 9;
      const at::Tensor ids = at::tensor(std::vector<int64_t>(pair.ids.begin() + pair.done,
                                                             pair.ids.begin() + pair.done + steps),
                                        at::kLong)
                                 .unsqueeze(0);
      ASSERT_EQ(*pair.alone_stream->MakeRoom(steps), steps);
      ASSERT_EQ(*pair.batched_stream->MakeRoom(steps), steps);
      ForwardOptions forward;
      forward.positions = pair.alone_stream->Take(steps);
      forward.last_logits_only = true;
      absl::StatusOr<at::Tensor> logits = model->Forward(ids, pair.alone.get(), forward);
      ASSERT_TRUE(logits.ok()) << logits.status();
      expected.push_back(logits->reshape({1, -1}));
      chunks.push_back({pair.batched.get(), ids, pair.batched_stream->Take(steps)});
      pair.done += steps;
    }
    absl::StatusOr<at::Tensor> logits = ForwardChunks(*model, chunks);
    ASSERT_TRUE(logits.ok()) << logits.status();
    ASSERT_EQ(logits->size(0), static_cast<int64_t>(pairs.size()));
    for (size_t i = 0; i < pairs.size(); ++i) {
      SCOPED_TRACE(absl::StrCat("round ", round, " chunk ", i, " ",
                                i < specs.size() ? DescribeKVCacheSpec(specs[i]) : "paged"));
      const at::Tensor row = logits->narrow(0, static_cast<int64_t>(i), 1);
      ExpectSameLogits(*model, row, expected[i]);
      EXPECT_EQ(row.argmax(-1).item<int64_t>(), expected[i].argmax(-1).item<int64_t>());
    }
  }
}

// The scheduler's mixed passes: decode rows (one-token chunks) behind a prompt chunk of another
// request. Each cache is filled by a batch-1 pass first, so both sides start from the same
// entries and each row's logits are its batch-1 decode step's (ExpectSameLogits).
TEST_P(ForwardChunksTest, DecodeRowsInAPromptPassMatchTheirBatchOneStep) {
  GPT model = Model();
  at::NoGradGuard no_grad;
  const int64_t vocab = model->config().PaddedVocabSize();
  const int64_t length = 40;
  const std::vector<KVCacheSpec> specs = Specs();
  at::manual_seed(21);
  std::vector<std::unique_ptr<KVCache>> batched, alone;
  std::vector<std::unique_ptr<CachePositions>> batched_stream, alone_stream;
  std::vector<SequenceChunk> chunks;
  // The prompt chunk: another request's first 24 tokens.
  std::unique_ptr<KVCache> prompt_cache = BatchOneCache(*model, specs[0], length);
  CachePositions prompt_stream(*model, *prompt_cache);
  ASSERT_TRUE(prompt_stream.MakeRoom(24).ok());
  chunks.push_back(
      {prompt_cache.get(), at::randint(0, vocab, {1, 24}, at::kLong), prompt_stream.Take(24)});
  std::vector<at::Tensor> expected;
  for (size_t i = 0; i < specs.size(); ++i) {
    const int64_t filled = 5 + 3 * static_cast<int64_t>(i);
    const at::Tensor prompt = at::randint(0, vocab, {1, filled}, at::kLong);
    const at::Tensor next = at::randint(0, vocab, {1, 1}, at::kLong);
    for (auto* side : {&batched, &alone}) {
      side->push_back(BatchOneCache(*model, specs[i], length));
      auto& streams = side == &batched ? batched_stream : alone_stream;
      streams.push_back(std::make_unique<CachePositions>(*model, *side->back()));
      ASSERT_TRUE(streams.back()->MakeRoom(filled + 1).ok());
      ForwardOptions forward;
      forward.positions = streams.back()->Take(filled);
      ASSERT_TRUE(model->Forward(prompt, side->back().get(), forward).ok());
    }
    ForwardOptions step;
    step.positions = alone_stream.back()->Take(1);
    step.last_logits_only = true;
    absl::StatusOr<at::Tensor> logits = model->Forward(next, alone.back().get(), step);
    ASSERT_TRUE(logits.ok()) << logits.status();
    expected.push_back(logits->reshape({1, -1}));
    chunks.push_back({batched.back().get(), next, batched_stream.back()->Take(1)});
  }
  absl::StatusOr<at::Tensor> logits = ForwardChunks(*model, chunks);
  ASSERT_TRUE(logits.ok()) << logits.status();
  ASSERT_EQ(logits->size(0), static_cast<int64_t>(specs.size()) + 1);
  for (size_t i = 0; i < specs.size(); ++i) {
    SCOPED_TRACE(DescribeKVCacheSpec(specs[i]));
    const at::Tensor row = logits->narrow(0, static_cast<int64_t>(i) + 1, 1);
    ExpectSameLogits(*model, row, expected[i]);
    EXPECT_EQ(row.argmax(-1).item<int64_t>(), expected[i].argmax(-1).item<int64_t>());
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ForwardChunksTest,
                         ::testing::Values("golden/llama2", "golden/pythia", "Gemma-2-2b",
                                           "Mixtral-8x7B-v0.1"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace lgpt
