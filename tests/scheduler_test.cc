// Continuous batching (core/serving/scheduler.h) against batch-1 generation: every request's
// tokens equal lgpt::Generate's for its own prompt, options, seed and kind of cache, whatever
// else runs in the same steps: golden LitGPT checkpoints and small random models of the
// sliding-window / soft-capping families, dense, budgeted and quantised caches, greedy and
// sampled decoding, prompts of every length (chunked prefill). Then cancellation, callbacks that
// stop or throw, shutdown with requests in flight, and refused submissions.
#include "core/serving/scheduler.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <atomic>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/block_pool.h"
#include "cache/kv_cache_factory.h"
#include "cache/paged_kv_cache.h"
#include "core/config/config_presets.h"
#include "core/model/batch_forward.h"
#include "core/model/cache_positions.h"
#include "core/model/checkpoint.h"
#include "core/model/generate.h"
#include "core/model/gpt.h"
#include "core/ops/gemv.h"
#include "gtest/gtest.h"
#include "tests/serving_test_util.h"
#include "tests/test_models.h"

namespace lgpt {
namespace {

// The scheduler's statistics after the requests (for checks of how they were batched).
SchedulerStats ExpectBatchedEqualsAlone(GPT model, int count, SchedulerOptions options) {
  const std::vector<Job> jobs = Jobs(*model, count, 7);
  Scheduler scheduler(model, options);
  std::vector<std::vector<int64_t>> expected;
  for (Job job : jobs) {
    job.options.prefill_chunk = scheduler.EffectiveChunk(job.options);
    expected.push_back(Alone(*model, job));
  }

  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (const Job& job : jobs) {
    absl::StatusOr<std::shared_ptr<RequestHandle>> handle = scheduler.Submit(
        job.prompt, job.options,
        BatchOneCache(*model, job.spec,
                 static_cast<int64_t>(job.prompt.size()) + job.options.max_new_tokens));
    EXPECT_TRUE(handle.ok()) << handle.status();
    if (!handle.ok()) return scheduler.Stats();
    handles.push_back(*handle);
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i, " ", DescribeKVCacheSpec(jobs[i].spec)));
    absl::StatusOr<RequestResult> result = handles[i]->Wait();
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) continue;
    EXPECT_FALSE(result->cancelled);
    EXPECT_EQ(result->tokens, expected[i]);
    EXPECT_EQ(result->stats.new_tokens, static_cast<int64_t>(expected[i].size()));
    EXPECT_EQ(result->inter_token_s.size() + 1, expected[i].size());
  }
  const SchedulerStats stats = scheduler.Stats();
  EXPECT_EQ(stats.completed, count);
  EXPECT_EQ(stats.failed, 0);
  EXPECT_GT(stats.decode_rows, stats.decode_passes);  // Steps really were batched.
  EXPECT_GE(stats.prefill_chunks, stats.prefill_passes);
  // Staggered prompts: decode rows rode along with prompt chunks in some steps.
  EXPECT_GT(stats.mixed_passes, 0);
  EXPECT_LE(stats.mixed_passes, std::min(stats.prefill_passes, stats.decode_passes));
  return stats;
}

class SchedulerGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SchedulerGoldenTest, EveryRequestEqualsItsBatchOneRun) {
  SchedulerOptions options;
  options.max_running = 5;
  options.prefill_chunk = 6;
  options.step_prefill_tokens = 9;
  ExpectBatchedEqualsAlone(GoldenModel(GetParam()), 14, options);
}

// A step budget of several chunks: the prompt chunks of several requests (different lengths
// and positions, whole prompts and 5-token chunks, dense, budgeted and quantised caches) run in
// one forward pass, and every request still equals its batch-1 run.
TEST_P(SchedulerGoldenTest, PromptChunksOfSeveralRequestsShareAPass) {
  SchedulerOptions options;
  options.max_running = 8;
  options.prefill_chunk = 7;
  options.step_prefill_tokens = 40;
  const SchedulerStats stats = ExpectBatchedEqualsAlone(GoldenModel(GetParam()), 14, options);
  EXPECT_GT(stats.prefill_chunks, stats.prefill_passes);
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, SchedulerGoldenTest,
                         ::testing::Values("golden/llama2", "golden/llama3_gqa", "golden/pythia"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param.substr(info.param.find('/') + 1);
                         });

class SchedulerFamilyTest : public ::testing::TestWithParam<std::string> {};

// Sliding windows, soft-capping, local RoPE, MoE: the families whose attention differs.
TEST_P(SchedulerFamilyTest, EveryRequestEqualsItsBatchOneRun) {
  SchedulerOptions options;
  options.max_running = 4;
  ExpectBatchedEqualsAlone(RandomModel(GetParam(), 3), 10, options);
}

TEST_P(SchedulerFamilyTest, PromptChunksOfSeveralRequestsShareAPass) {
  SchedulerOptions options;
  options.max_running = 6;
  options.prefill_chunk = 9;
  options.step_prefill_tokens = 32;
  const SchedulerStats stats = ExpectBatchedEqualsAlone(RandomModel(GetParam(), 4), 10, options);
  EXPECT_GT(stats.prefill_chunks, stats.prefill_passes);
}

INSTANTIATE_TEST_SUITE_P(Presets, SchedulerFamilyTest,
                         ::testing::Values("Gemma-2-2b", "Gemma-3-1b-it", "Mixtral-8x7B-v0.1",
                                           "phi-2"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

// Requests whose caches are pages of one shared BlockPool: each equals its batch-1 run with
// its own dense cache, the pool holds what is in use, and it is entirely free afterwards.
TEST(SchedulerTest, PagedCachesOverOneSharedPool) {
  GPT model = GoldenModel("golden/llama2");
  std::vector<Job> jobs = Jobs(*model, 12, 21);
  KVCacheGeometry geometry;
  geometry.layers = model->CacheLayout();
  BlockPoolOptions pool_options;
  pool_options.block_size = 4;
  pool_options.num_blocks = 96;
  std::shared_ptr<BlockPool> pool = *BlockPool::Create(geometry, pool_options);
  SchedulerOptions options;
  options.max_running = 6;
  options.prefill_chunk = 5;
  Scheduler scheduler(model, options);
  std::vector<std::vector<int64_t>> expected;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (Job& job : jobs) {
    job.spec = TestSpec("dense", 0, 16);
    job.options.prefill_chunk = scheduler.EffectiveChunk(job.options);
    expected.push_back(Alone(*model, job));
    const int64_t length = static_cast<int64_t>(job.prompt.size()) + job.options.max_new_tokens;
    absl::StatusOr<std::unique_ptr<PagedKVCache>> cache = PagedKVCache::Create(pool, length);
    ASSERT_TRUE(cache.ok()) << cache.status();
    handles.push_back(*scheduler.Submit(job.prompt, job.options, *std::move(cache)));
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    absl::StatusOr<RequestResult> result = handles[i]->Wait();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->tokens, expected[i]) << "request " << i;
    EXPECT_GT(result->stats.kv_cache_bytes, 0);
  }
  EXPECT_EQ(pool->free_blocks(), pool->num_blocks());
}

TEST(SchedulerTest, CancelAndCallbacksEndOnlyTheirOwnRequest) {
  GPT model = GoldenModel("golden/llama2");
  std::vector<Job> jobs = Jobs(*model, 4, 11);
  for (Job& job : jobs) {
    job.options.max_new_tokens = 12;
    job.options.sampling = {0.0, 0, 1.0};
    job.spec = TestSpec("dense", 0, 16);
  }
  std::vector<std::vector<int64_t>> expected;
  for (const Job& job : jobs) expected.push_back(Alone(*model, job));

  SchedulerOptions options;
  options.max_running = 4;
  Scheduler scheduler(model, options);
  std::atomic<int> seen{0};
  std::shared_ptr<RequestHandle> cancelled_handle;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (size_t i = 0; i < jobs.size(); ++i) {
    GenerateOptions o = jobs[i].options;
    if (i == 1) o.on_token = [](int64_t) { return false; };  // stops after one token
    if (i == 2) o.on_token = [](int64_t) -> bool { throw std::runtime_error("boom"); };
    if (i == 3) {
      o.on_token = [&seen](int64_t) {
        ++seen;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        return true;
      };
    }
    absl::StatusOr<std::shared_ptr<RequestHandle>> handle =
        scheduler.Submit(jobs[i].prompt, o, BatchOneCache(*model, jobs[i].spec, 64));
    ASSERT_TRUE(handle.ok()) << handle.status();
    handles.push_back(*handle);
  }
  while (seen < 3) std::this_thread::yield();
  handles[3]->Cancel();

  absl::StatusOr<RequestResult> full = handles[0]->Wait();
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->tokens, expected[0]);
  absl::StatusOr<RequestResult> stopped = handles[1]->Wait();
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->tokens, std::vector<int64_t>{expected[1][0]});
  absl::StatusOr<RequestResult> threw = handles[2]->Wait();
  ASSERT_FALSE(threw.ok());
  EXPECT_NE(threw.status().message().find("boom"), std::string::npos) << threw.status();
  absl::StatusOr<RequestResult> cancelled = handles[3]->Wait();
  ASSERT_TRUE(cancelled.ok());
  EXPECT_TRUE(cancelled->cancelled);
  ASSERT_LT(cancelled->tokens.size(), expected[3].size());
  EXPECT_EQ(cancelled->tokens,
            std::vector<int64_t>(expected[3].begin(), expected[3].begin() + cancelled->tokens.size()));
  const SchedulerStats stats = scheduler.Stats();
  EXPECT_EQ(stats.completed, 2);
  EXPECT_EQ(stats.failed, 1);
  EXPECT_EQ(stats.cancelled, 1);
}

TEST(SchedulerTest, DestroyingTheSchedulerCancelsRequestsInFlight) {
  GPT model = GoldenModel("golden/llama2");
  std::vector<std::shared_ptr<RequestHandle>> handles;
  {
    SchedulerOptions options;
    options.max_running = 2;
    Scheduler scheduler(model, options);
    for (int i = 0; i < 6; ++i) {
      GenerateOptions o;
      o.max_new_tokens = 40;
      absl::StatusOr<std::shared_ptr<RequestHandle>> handle =
          scheduler.Submit({1, 2, 3}, o, BatchOneCache(*model, TestSpec("dense", 0, 16), 64));
      ASSERT_TRUE(handle.ok());
      handles.push_back(*handle);
    }
  }
  int cancelled = 0;
  for (auto& handle : handles) {
    ASSERT_TRUE(handle->Done());
    absl::StatusOr<RequestResult> result = handle->Wait();
    ASSERT_TRUE(result.ok());
    cancelled += result->cancelled;
  }
  EXPECT_GT(cancelled, 0);
}

TEST(SchedulerTest, SubmissionsThatCanNeverRunAreRefused) {
  GPT model = GoldenModel("golden/llama2");
  SchedulerOptions options;
  options.max_waiting = 0;
  Scheduler scheduler(model, options);
  GenerateOptions o;
  o.max_new_tokens = 4;
  auto code = [&](std::vector<int64_t> prompt, GenerateOptions opts,
                  std::unique_ptr<KVCache> cache) {
    return scheduler.Submit(std::move(prompt), opts, std::move(cache)).status().code();
  };
  EXPECT_EQ(code({}, o, BatchOneCache(*model, TestSpec("dense", 0, 16), 8)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({1, 2, 3}, o, nullptr), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({1, 2, 3, 4, 5}, o, BatchOneCache(*model, TestSpec("dense", 0, 16), 8)),
            absl::StatusCode::kOutOfRange);  // 5 + 4 tokens in a cache of 8
  EXPECT_EQ(code({1, 1 << 30}, o, BatchOneCache(*model, TestSpec("dense", 0, 16), 8)),
            absl::StatusCode::kOutOfRange);
  GenerateOptions negative = o;
  negative.max_new_tokens = -1;
  EXPECT_EQ(code({1}, negative, BatchOneCache(*model, TestSpec("dense", 0, 16), 8)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({1}, o, BatchOneCache(*model, TestSpec("dense", 0, 16), 8)),
            absl::StatusCode::kResourceExhausted);  // max_waiting 0
}

// Whether the model computes tanh (soft-capping, tanh GELU) through ATen's elementwise kernels.
bool UsesAtenTanh(const Config& config) {
  return config.final_logit_softcapping.has_value() || config.gelu_approximate == "tanh" ||
         config.mlp_class == MlpClass::kGemmaMLP || config.mlp_class == MlpClass::kGptNeoxMLP;
}

// Whether ATen's tanh and GELU give an element the same bits wherever it lies in a tensor.
// Debian's LibTorch 1.13 does; PyPI's (2.x, AVX-512) computes whole vectors with SLEEF and a
// tensor's last partial vectors with the scalar function, so a row's values depend on the rows
// beside it there.
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
  pool_options.block_size = 4;
  pool_options.num_blocks = 64;
  std::shared_ptr<BlockPool> pool = *BlockPool::Create(geometry, pool_options);
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
    publisher->PublishPrefix(ids);
    Pair pair;
    std::vector<int64_t> prompt = ids;
    for (int64_t j = 0; j < 20; ++j) prompt.push_back((5 * j + 1) % vocab);
    std::unique_ptr<PagedKVCache> batched = *PagedKVCache::Create(pool, length);
    std::unique_ptr<PagedKVCache> alone = *PagedKVCache::Create(pool, length);
    ASSERT_EQ(batched->AttachPrefix(prompt), 12);
    ASSERT_EQ(alone->AttachPrefix(prompt), 12);
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
      ASSERT_EQ(*pair.alone_stream->Reserve(steps), steps);
      ASSERT_EQ(*pair.batched_stream->Reserve(steps), steps);
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
  ASSERT_TRUE(prompt_stream.Reserve(24).ok());
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
      ASSERT_TRUE(streams.back()->Reserve(filled + 1).ok());
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
