// Cache positions (KVCacheSpec.positions = "cache"): window and sink caches that shift their
// entries down when the stream reaches the context, so generation goes past block_size.
// - One-layer models (the keys of a layer-0 cache are a function of the token and its position
//   alone): every decode step's logits equal an uncached forward pass over the kept tokens at
//   their cache positions plus the query, across several shift points, for window and sink at
//   16, 8 and 4 bits, on presets with different RoPE (Llama 3 frequency adjustment, partial
//   rotary, Gemma 3's local base with qk norms).
// - Whole models: a window cache with cache positions equals the same cache with stream
//   positions (shifting keeps every query-key distance), through every layer.
// - The library: Engine::Generate, GenerateBatch and Session go past block_size with flat
//   bytes; bad combinations are refused naming KVCacheSpec.positions.
#include "core/model/cache_positions.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "cache/kv_cache_factory.h"
#include "cache/policy_kv_cache.h"
#include "core/base/device.h"
#include "core/config/config_presets.h"
#include "core/model/gpt.h"
#include "gtest/gtest.h"
#include "lgpt.h"
#include "tests/test_models.h"

namespace lgpt {
namespace {

constexpr int64_t kContext = 24;  // the caches' context (max_sequence_length); block size 64
constexpr int64_t kBudget = 10, kSinks = 2;

// "NAME+interleave": the preset with LitGPT's interleaved RoPE layout.
GPT RandomModel(const std::string& preset, int64_t layers) {
  const bool interleave = absl::EndsWith(preset, "+interleave");
  absl::StatusOr<Config> config =
      PresetFromName(interleave ? preset.substr(0, preset.size() - 11) : preset);
  EXPECT_TRUE(config.ok()) << config.status();
  if (layers > 0) config->n_layer = layers;
  if (interleave) config->rope_interleave = true;
  absl::StatusOr<Config> shrunk = ShrinkConfig(*config);
  EXPECT_TRUE(shrunk.ok()) << shrunk.status();
  absl::StatusOr<GPT> model = GPTImpl::Create(*shrunk);
  EXPECT_TRUE(model.ok()) << model.status();
  RandomizeWeights(**model, 4321);
  (*model)->To(DefaultDevice(), at::kFloat);
  (*model)->eval();
  return *model;
}

std::unique_ptr<PolicyKVCache> Cache(GPTImpl& model, PolicyKind kind, int bits, bool shifting,
                                     int64_t context = kContext) {
  PolicyKVCacheOptions options;
  options.max_sequence_length = context;
  options.layers = model.CacheLayout();
  options.dtype = model.dtype();
  options.device = model.device();
  options.policy.kind = kind;
  options.policy.budget = kBudget;
  options.policy.sink_tokens = kSinks;
  options.bits = bits;
  options.residual = 3;
  options.group_size = 8;
  options.read_chunk = 4;  // shifts decode quantised entries in several blocks
  options.cache_positions = shifting;
  auto cache = PolicyKVCache::Create(options);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return std::move(*cache);
}

double Tolerance(int bits, double scale) {
  return bits == 16 ? 1e-4 * std::max(1.0, scale) : (bits == 8 ? 0.03 : 0.3) * scale;
}

class OneLayerReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(OneLayerReferenceTest, DecodeStepsEqualAnUncachedPassOverTheKeptTokensAtCachePositions) {
  GPT model = RandomModel(GetParam(), 1);
  ASSERT_EQ(model->config().n_layer, 1);
  constexpr int64_t kPrompt = 7, kTotal = 90;
  at::manual_seed(5);
  const at::Tensor tokens = at::randint(0, model->config().vocab_size, {kTotal}, at::kLong);
  const int64_t* ids = tokens.data_ptr<int64_t>();
  at::NoGradGuard no_grad;
  for (PolicyKind kind : {PolicyKind::kWindow, PolicyKind::kSink}) {
    for (int bits : {16, 8, 4}) {
      SCOPED_TRACE(GetParam() + " " + PolicyName(kind) + " " + std::to_string(bits) + " bits");
      std::unique_ptr<PolicyKVCache> cache = Cache(*model, kind, bits, true);
      const int64_t sinks = cache->plan(0).sink_tokens;
      CachePositions stream(*model, *cache);
      int64_t shifts = 0, checked = 0, last_shift = 0;
      double worst = 0;
      for (int64_t fed = 0; fed < kTotal;) {
        const int64_t wanted = fed == 0 ? kPrompt : 1;
        absl::StatusOr<int64_t> length = stream.MakeRoom(wanted);
        ASSERT_TRUE(length.ok()) << length.status();
        ASSERT_EQ(*length, wanted);
        if (stream.shifted() != last_shift) ++shifts, last_shift = stream.shifted();
        // The entries this step attends to besides its own: the same for every group.
        const std::vector<int64_t> kept = cache->KeptPositions(0, 0, 0);
        if (model->config().QueryGroups() > 1) {
          EXPECT_EQ(kept, cache->KeptPositions(0, 0, 1));
        }
        const int64_t query_position = stream.next();
        ForwardOptions options;
        options.positions = stream.Take(*length);
        options.last_logits_only = true;
        absl::StatusOr<at::Tensor> logits = model->Forward(
            tokens.narrow(0, fed, *length).unsqueeze(0).to(model->device()), cache.get(), options);
        ASSERT_TRUE(logits.ok()) << logits.status();
        ASSERT_LT(query_position, kContext);
        if (fed > 0) {
          // Cache position -> stream position: sinks stay, the rest moved down by shifted().
          std::vector<int64_t> ref_ids, ref_positions;
          for (int64_t p : kept) {
            const int64_t stream_position = p < sinks ? p : p + stream.shifted();
            ASSERT_LT(stream_position, fed);
            ref_ids.push_back(ids[stream_position]);
            ref_positions.push_back(p);
          }
          ref_ids.push_back(ids[fed]);
          ref_positions.push_back(query_position);
          ForwardOptions ref_options;
          ref_options.positions = at::tensor(ref_positions, at::kLong).unsqueeze(0);
          ref_options.last_logits_only = true;
          absl::StatusOr<at::Tensor> expected =
              model->Forward(at::tensor(ref_ids, at::kLong).unsqueeze(0).to(model->device()),
                             nullptr, ref_options);
          ASSERT_TRUE(expected.ok()) << expected.status();
          const double diff = (*logits - *expected).abs().max().item<double>();
          const double scale = expected->abs().max().item<double>();
          ASSERT_GT(scale, 0.1);
          EXPECT_LT(diff, Tolerance(bits, scale)) << "token " << fed << " at " << query_position;
          worst = std::max(worst, diff / scale);
          ++checked;
        }
        fed += *length;
      }
      EXPECT_GE(shifts, 4);
      EXPECT_EQ(checked, kTotal - kPrompt);
      RecordProperty(PolicyName(kind) + std::to_string(bits), std::to_string(worst));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, OneLayerReferenceTest,
                         ::testing::Values("Llama-3.2-1B", "phi-2", "Gemma-3-1b-it",
                                           "Llama-3.2-1B+interleave"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name;
                           for (char c : info.param) name += std::isalnum(c) ? c : '_';
                           return name;
                         });

// A window keeps every query-key distance when it shifts: cache positions give the logits of
// stream positions (a context wide enough for the whole stream), through every layer, with the
// same step boundaries (a prompt longer than the room left is split by CachePositions).
TEST(CachePositionsTest, WholeModelWindowEqualsStreamPositions) {
  for (const char* preset : {"Llama-3.2-1B", "Gemma-3-1b-it", "Gemma-2-2b"}) {
    GPT model = RandomModel(preset, 0);
    constexpr int64_t kPrompt = 30, kTotal = 62;  // block size 64
    at::manual_seed(8);
    const at::Tensor tokens =
        at::randint(0, model->config().vocab_size, {1, kTotal}, at::kLong).to(model->device());
    at::NoGradGuard no_grad;
    for (int bits : {16, 8, 4}) {
      SCOPED_TRACE(std::string(preset) + " " + std::to_string(bits) + " bits");
      auto shifting = Cache(*model, PolicyKind::kWindow, bits, true);
      auto plain = Cache(*model, PolicyKind::kWindow, bits, false, model->config().block_size);
      CachePositions stream(*model, *shifting);
      double worst = 0, scale = 0;
      int64_t steps = 0;
      for (int64_t fed = 0; fed < kTotal; ++steps) {
        absl::StatusOr<int64_t> length = stream.MakeRoom(fed == 0 ? kPrompt : 1);
        ASSERT_TRUE(length.ok()) << length.status();
        ForwardOptions options;
        options.positions = stream.Take(*length);
        absl::StatusOr<at::Tensor> got =
            model->Forward(tokens.narrow(1, fed, *length), shifting.get(), options);
        options.positions = at::arange(fed, fed + *length, at::kLong).unsqueeze(0);
        absl::StatusOr<at::Tensor> want =
            model->Forward(tokens.narrow(1, fed, *length), plain.get(), options);
        ASSERT_TRUE(got.ok() && want.ok());
        worst = std::max(worst, (*got - *want).abs().max().item<double>());
        scale = std::max(scale, want->abs().max().item<double>());
        fed += *length;
      }
      EXPECT_GT(steps, kTotal - kPrompt + 1) << "the prompt was split";
      EXPECT_GE(stream.shifted(), 2 * (kContext - kBudget));
      EXPECT_LT(worst, bits == 16 ? 1e-4 * std::max(1.0, scale) : (bits == 8 ? 0.02 : 0.2) * scale);
    }
  }
}

TEST(CachePositionsTest, SpecsNameTheField) {
  for (const char* policy : {"dense", "h2o", "tova"}) {
    KVCacheSpec spec{policy, 16, 16};
    spec.positions = "cache";
    const absl::Status status = ValidateKVCacheSpec(spec);
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << policy;
    EXPECT_NE(status.message().find("KVCacheSpec.positions"), std::string::npos) << status;
    EXPECT_NE(status.message().find("KVCacheSpec.positions=cache"), std::string::npos) << status;
  }
  KVCacheSpec spec{"sink", 16, 8};
  spec.positions = "relative";
  EXPECT_NE(ValidateKVCacheSpec(spec).message().find("KVCacheSpec.positions"), std::string::npos);
  spec.positions = "cache";
  EXPECT_TRUE(ValidateKVCacheSpec(spec).ok());
  // A budget that fills the context leaves no room to shift into.
  KVCacheShape shape;
  shape.max_sequence_length = 16;
  shape.layers = {{2, 16, 0}};
  const auto cache = MakeKVCache(spec, shape);
  ASSERT_FALSE(cache.ok());
  EXPECT_NE(cache.status().message().find(
                "KVCacheSpec.positions=cache needs KVCacheSpec.budget below the context"),
            std::string::npos)
      << cache.status();
}

std::shared_ptr<const Engine> RandomEngine() {
  return Engine::FromModel(RandomModel("Llama-3.2-1B", 2), nullptr);
}

TEST(CachePositionsTest, EngineGeneratesPastTheBlockSizeInFlatMemory) {
  std::shared_ptr<const Engine> engine = RandomEngine();
  const int64_t block = engine->config().block_size;
  RequestOptions options;
  options.max_new_tokens = 4 * block;
  options.sampling = {0, 0, 1.0};
  options.kv_cache = {"sink", 16, 8};
  options.kv_cache.positions = "absolute";
  EXPECT_TRUE(absl::IsOutOfRange(engine->Generate({1, 2, 3}, options).status()));
  options.kv_cache.positions = "cache";
  for (int bits : {16, 8, 4}) {
    for (const char* policy : {"window", "sink"}) {
      options.kv_cache.policy = policy;
      options.kv_cache.bits = bits;
      absl::StatusOr<Completion> done = engine->Generate({1, 2, 3}, options);
      ASSERT_TRUE(done.ok()) << done.status();
      EXPECT_EQ(static_cast<int64_t>(done->tokens.size()), 4 * block);
      EXPECT_GT(done->stats.position_shift, 3 * block - 2 * 16);
      // Bytes: those of `budget` entries, whatever the length.
      RequestOptions shorter = options;
      shorter.max_new_tokens = block / 2;
      absl::StatusOr<Completion> short_done = engine->Generate({1, 2, 3}, shorter);
      ASSERT_TRUE(short_done.ok());
      EXPECT_EQ(done->stats.kv_cache_bytes, short_done->stats.kv_cache_bytes) << policy << bits;
      // Within the context nothing shifts: the same tokens as stream positions.
      shorter.kv_cache.positions = "absolute";
      absl::StatusOr<Completion> absolute = engine->Generate({1, 2, 3}, shorter);
      ASSERT_TRUE(absolute.ok());
      EXPECT_EQ(absolute->tokens, short_done->tokens);
    }
  }
  // A prompt longer than the context is prefilled in pieces that fit.
  std::vector<int64_t> long_prompt(2 * block);
  for (size_t i = 0; i < long_prompt.size(); ++i) long_prompt[i] = static_cast<int64_t>(i % 90);
  options.max_new_tokens = 5;
  EXPECT_TRUE(engine->Generate(long_prompt, options).ok());
  // Batches advance in lockstep: one shift serves every row.
  absl::StatusOr<std::vector<Completion>> batch = engine->GenerateBatch({{1, 2, 3}, {4, 5}}, [&] {
    RequestOptions o = options;
    o.max_new_tokens = 2 * block;
    return o;
  }());
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(static_cast<int64_t>((*batch)[1].tokens.size()), 2 * block);
  RequestOptions single = options;
  single.max_new_tokens = 2 * block;
  absl::StatusOr<Completion> alone = engine->Generate({4, 5}, single);
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ((*batch)[1].tokens, alone->tokens);
}

TEST(CachePositionsTest, SessionTurnsGoPastTheBlockSize) {
  std::shared_ptr<const Engine> engine = RandomEngine();
  const int64_t block = engine->config().block_size;
  KVCacheSpec spec{"sink", 16, 4};
  spec.positions = "cache";
  auto session = engine->NewSession(spec);
  ASSERT_TRUE(session.ok()) << session.status();
  RequestOptions options;
  options.max_new_tokens = 40;
  options.sampling = {0, 0, 1.0};
  int64_t bytes = -1;
  for (int turn = 0; turn < 8; ++turn) {
    absl::StatusOr<Completion> reply = (*session)->Send(std::vector<int64_t>{5, 6, 7}, options);
    ASSERT_TRUE(reply.ok()) << "turn " << turn << ": " << reply.status();
    EXPECT_EQ(reply->finish_reason, FinishReason::kMaxTokens);
    if (turn == 2) bytes = (*session)->kv_cache_bytes();
    if (turn > 2) {
      EXPECT_EQ((*session)->kv_cache_bytes(), bytes);
    }
  }
  EXPECT_GT((*session)->context_tokens(), 4 * block);
  // The same conversation through Generate: a session's turns continue one stream.
  std::vector<int64_t> last;
  (*session)->Reset();
  for (int turn = 0; turn < 2; ++turn) {
    absl::StatusOr<Completion> reply = (*session)->Send(std::vector<int64_t>{5, 6, 7}, options);
    ASSERT_TRUE(reply.ok());
    last = reply->tokens;
  }
  EXPECT_FALSE(last.empty());
}

}  // namespace
}  // namespace lgpt
