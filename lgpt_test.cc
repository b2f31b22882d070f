#include "lgpt.h"

#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/device_memory.h"
#include "core/base/status_field.h"
#include "core/io/torch_pickle_writer.h"
#include "core/model/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "peft/lora.h"

namespace lgpt {
namespace {

using ::testing::HasSubstr;

constexpr char kDefaultModel[] = "tools/default_model";

const Engine& DefaultEngine() {
  static const std::shared_ptr<const Engine>* engine = [] {
    absl::StatusOr<std::shared_ptr<const Engine>> loaded = Engine::Load(kDefaultModel);
    CHECK(loaded.ok()) << loaded.status();
    return new std::shared_ptr<const Engine>(*loaded);
  }();
  return **engine;
}

RequestOptions Greedy(int64_t max_new_tokens) {
  RequestOptions options;
  options.max_new_tokens = max_new_tokens;
  options.sampling.temperature = 0;
  options.stop_at_eos = false;
  return options;
}

RequestOptions Sampled(int64_t max_new_tokens, uint64_t seed) {
  RequestOptions options;
  options.max_new_tokens = max_new_tokens;
  options.sampling = {0.9, 40, 0.95};
  options.seed = seed;
  options.stop_at_eos = false;
  return options;
}

TEST(EngineTest, GenerateMatchesTheModelLoopAndStreamsItsText) {
  const Engine& engine = DefaultEngine();
  const std::vector<int64_t> prompt = *engine.Encode("And God said");
  std::unique_ptr<DenseKVCache> cache = *engine.model().NewDenseCache(1, 64);
  GenerateOptions direct;
  direct.max_new_tokens = 20;
  const std::vector<int64_t> expected = *lgpt::Generate(engine.model(), *cache, prompt, direct);

  std::string streamed;
  std::vector<int64_t> streamed_tokens;
  RequestOptions options = Greedy(20);
  options.echo_prompt = true;
  options.on_text = [&](absl::string_view piece) {
    streamed.append(piece.data(), piece.size());
    return true;
  };
  options.on_token = [&](int64_t token) {
    streamed_tokens.push_back(token);
    return true;
  };
  absl::StatusOr<Completion> result = engine.Generate("And God said", options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->tokens, expected);
  EXPECT_EQ(streamed_tokens, expected);
  EXPECT_EQ(result->finish_reason, FinishReason::kMaxTokens);
  EXPECT_FALSE(result->text.empty());
  // The echoed prompt and the pieces continue each other exactly; the text is the reply's.
  std::vector<int64_t> all = prompt;
  all.insert(all.end(), expected.begin(), expected.end());
  EXPECT_EQ(streamed, *engine.tokenizer()->Decode(all));
  EXPECT_EQ(*engine.tokenizer()->Decode(prompt) + result->text, *engine.tokenizer()->Decode(all));
  EXPECT_GT(result->stats.kv_cache_bytes, 0);
}

TEST(EngineTest, ConcurrentRequestsEqualTheirSingleThreadedRuns) {
  const Engine& engine = DefaultEngine();
  const std::vector<std::string> prompts = {"In the beginning", "And Jesus answered",
                                            "The LORD is my shepherd", "Blessed are"};
  std::vector<Completion> expected;
  for (size_t i = 0; i < prompts.size(); ++i) {
    expected.push_back(*engine.Generate(prompts[i], Sampled(24, 100 + i)));
  }
  std::vector<absl::StatusOr<Completion>> got(prompts.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back([&, i] { got[i] = engine.Generate(prompts[i], Sampled(24, 100 + i)); });
  }
  for (std::thread& thread : threads) thread.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status();
    EXPECT_EQ(got[i]->tokens, expected[i].tokens) << prompts[i];
    EXPECT_EQ(got[i]->text, expected[i].text) << prompts[i];
  }
}

TEST(EngineTest, SameSeedSameTextDifferentSeedDifferentText) {
  const Engine& engine = DefaultEngine();
  const Completion a = *engine.Generate("And he said", Sampled(30, 7));
  const Completion b = *engine.Generate("And he said", Sampled(30, 7));
  const Completion c = *engine.Generate("And he said", Sampled(30, 8));
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_NE(a.tokens, c.tokens);
}

TEST(EngineTest, CallbackCancels) {
  const Engine& engine = DefaultEngine();
  int pieces = 0;
  RequestOptions options = Greedy(40);
  options.on_token = [&](int64_t) { return ++pieces < 3; };
  const Completion result = *engine.Generate("And God said", options);
  EXPECT_EQ(result.finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(result.tokens.size(), 3u);
}

TEST(EngineTest, ThrowingCallbacksAreErrorsOfTheirRequest) {
  const Engine& engine = DefaultEngine();
  RequestOptions on_token = Greedy(20);
  on_token.on_token = [](int64_t) -> bool { throw std::runtime_error("token sink broke"); };
  RequestOptions on_text = Greedy(20);
  on_text.on_text = [](absl::string_view) -> bool { throw 7; };
  for (const RequestOptions& options : {on_token, on_text}) {
    const absl::StatusOr<Completion> result = engine.Generate("And God said", options);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal) << result.status();
    EXPECT_NE(result.status().message().find("callback threw"), absl::string_view::npos);
  }
  EXPECT_NE(engine.Generate("And God said", on_token).status().message().find("token sink broke"),
            absl::string_view::npos);
  // The engine goes on, and a session keeps working after a throwing turn.
  EXPECT_TRUE(engine.Generate("And God said", Greedy(4)).ok());
  absl::StatusOr<std::unique_ptr<Session>> session = engine.NewSession();
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_FALSE((*session)->Send("And God said", on_text).ok());
  EXPECT_TRUE((*session)->Send("And God said", Greedy(4)).ok());
}

TEST(EngineTest, StopSequenceCutsTheTextAndIsNeverStreamed) {
  const Engine& engine = DefaultEngine();
  const Completion full = *engine.Generate("And God said", Greedy(40));
  ASSERT_GT(full.text.size(), 20u);
  // A stop sequence taken from the middle of the greedy reply.
  const std::string stop = full.text.substr(full.text.size() / 2, 5);
  const size_t cut = full.text.find(stop);
  RequestOptions options = Greedy(40);
  options.stop_sequences = {"never appears in the text", stop};
  std::string streamed;
  options.on_text = [&](absl::string_view piece) {
    streamed.append(piece.data(), piece.size());
    return true;
  };
  const Completion result = *engine.Generate("And God said", options);
  EXPECT_EQ(result.finish_reason, FinishReason::kStopSequence);
  EXPECT_EQ(result.text, full.text.substr(0, cut));
  EXPECT_EQ(streamed, result.text);
  EXPECT_LT(result.tokens.size(), full.tokens.size());
}

// Continuous batching: submitted requests (text, streaming, stop sequences, sampling, budgeted
// caches) complete exactly as Generate does, batched with each other.
TEST(EngineServingTest, SubmittedRequestsEqualGenerate) {
  const Engine& engine = DefaultEngine();
  const std::vector<std::string> prompts = {
      "In the beginning", "And Jesus answered", "The LORD is my shepherd",
      "Blessed are",      "And God said",       "Now the serpent"};
  std::vector<RequestOptions> options;
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestOptions o = i % 2 == 0 ? Greedy(20 + i) : Sampled(20 + i, 50 + i);
    if (i == 2) o.stop_sequences = {"the"};
    if (i == 3) {
      o.kv_cache.policy = "h2o";
      o.kv_cache.budget = 12;
    }
    options.push_back(o);
  }
  std::vector<Completion> expected;
  for (size_t i = 0; i < prompts.size(); ++i) {
    expected.push_back(*engine.Generate(prompts[i], options[i]));
  }
  std::vector<std::string> streamed(prompts.size());
  std::vector<std::shared_ptr<Request>> requests;
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestOptions o = options[i];
    o.on_text = [&streamed, i](absl::string_view piece) {
      streamed[i].append(piece.data(), piece.size());
      return true;
    };
    absl::StatusOr<std::shared_ptr<Request>> request = engine.Submit(prompts[i], o);
    ASSERT_TRUE(request.ok()) << request.status();
    requests.push_back(*request);
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(prompts[i]);
    absl::StatusOr<Completion> got = requests[i]->Wait();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->tokens, expected[i].tokens);
    EXPECT_EQ(got->text, expected[i].text);
    EXPECT_EQ(streamed[i], got->text);
    EXPECT_EQ(got->finish_reason, expected[i].finish_reason);
    EXPECT_GT(got->stats.time_to_first_token_s, 0);
    EXPECT_EQ(requests[i]->inter_token_s().size() + 1, got->tokens.size());
  }
  EXPECT_EQ(expected[2].finish_reason, FinishReason::kStopSequence);
  const SchedulerStats stats = engine.ServingStats();
  EXPECT_GE(stats.completed, static_cast<int64_t>(prompts.size()));
  EXPECT_GT(stats.decode_rows, stats.decode_passes);
}

TEST(EngineServingTest, CancelAndBadRequests) {
  const Engine& engine = DefaultEngine();
  int tokens = 0;
  RequestOptions options = Greedy(200);
  options.on_token = [&tokens](int64_t) {
    ++tokens;
    return true;
  };
  std::shared_ptr<Request> request = *engine.Submit("And God said", options);
  while (tokens < 2) std::this_thread::yield();
  request->Cancel();
  const Completion cancelled = *request->Wait();
  EXPECT_EQ(cancelled.finish_reason, FinishReason::kCancelled);
  EXPECT_LT(cancelled.tokens.size(), 200u);
  EXPECT_EQ(engine.Submit(std::vector<int64_t>{}, Greedy(4)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.Submit("And", Greedy(1 << 20)).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(engine.Submit(std::vector<int64_t>{-1}, Greedy(4)).status().code(),
            absl::StatusCode::kOutOfRange);
}

// EngineOptions.kv_pool_memory_fraction sizes the KV pool from the memory the model's device has
// free once the weights are loaded, and requests are served from it; fractions outside (0, 1),
// a fraction beside kv_pool_bytes, and one over tensor-parallel ranks are refused before
// anything loads, naming the field.
TEST(EngineServingTest, PoolFromAFractionOfFreeMemory) {
  if (!std::ifstream("/proc/meminfo").good()) GTEST_SKIP() << "skipped: no /proc/meminfo";
  EngineOptions options;
  options.kv_pool_memory_fraction = 0.01;
  const absl::StatusOr<std::shared_ptr<const Engine>> engine = Engine::Load(kDefaultModel, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const absl::StatusOr<int64_t> free = FreeDeviceMemoryBytes(c10::Device(c10::kCPU));
  ASSERT_TRUE(free.ok()) << free.status();
  std::shared_ptr<Request> request = *(*engine)->Submit("And God said", Greedy(8));
  ASSERT_TRUE(request->Wait().ok());
  const SchedulerStats stats = (*engine)->ServingStats();
  ASSERT_GT(stats.pool_blocks, 0);
  // 1% of the free memory at load; other processes (tests beside this one) move it by tens or
  // hundreds of MiB between that read and this one.
  const double pool = static_cast<double>(stats.pool_blocks * stats.pool_block_bytes);
  EXPECT_GT(pool, 0.005 * static_cast<double>(*free));
  EXPECT_LT(pool, 0.015 * static_cast<double>(*free));
  EXPECT_EQ(stats.pool_blocks_used, 0);

  for (const double fraction : {-0.5, 1.0, 1.5, std::nan("")}) {
    EngineOptions bad;
    bad.kv_pool_memory_fraction = fraction;
    const absl::Status status = Engine::Load("/nonexistent", bad).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << fraction;
    EXPECT_THAT(status.message(), HasSubstr("kv_pool_memory_fraction must be in (0, 1)"));
    EXPECT_EQ(ErrorField(status).value_or(""), "EngineOptions.kv_pool_memory_fraction") << status;
  }
  EngineOptions both;
  both.kv_pool_memory_fraction = 0.5;
  both.serving.kv_pool_bytes = 8 << 20;
  const absl::Status status = Engine::Load("/nonexistent", both).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("not with SchedulerOptions.kv_pool_bytes"));
}

// With a KV pool (SchedulerOptions.kv_pool_bytes) dense requests draw from it and reuse
// each other's prompt prefixes; tokens stay those of Generate, the pool shows in the
// statistics and is free afterwards. A pool below one block is refused with the field's name.
TEST(EngineServingTest, PooledRequestsEqualGenerateAndShareTheirPrefix) {
  EngineOptions engine_options;
  engine_options.serving.kv_pool_bytes = 8 << 20;
  engine_options.serving.kv_block_size = 16;
  engine_options.serving.prefill_chunk = 1 << 20;  // whole prompts, as Generate by default
  std::shared_ptr<const Engine> engine = *Engine::Load(kDefaultModel, engine_options);
  const std::string shared =
      "In the beginning God created the heaven and the earth. And the earth was without form, "
      "and void; and darkness was upon the face of the deep.";
  const std::vector<std::string> endings = {" And God said", " And the Spirit", " Let there be"};
  std::shared_ptr<Request> first = *engine->Submit(shared + endings[0], Greedy(12));
  ASSERT_TRUE(first->Wait().ok());
  std::vector<std::shared_ptr<Request>> later;
  for (const std::string& ending : endings) {
    later.push_back(*engine->Submit(shared + ending, Greedy(12)));
  }
  for (size_t i = 0; i < endings.size(); ++i) {
    absl::StatusOr<Completion> got = later[i]->Wait();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->tokens, engine->Generate(shared + endings[i], Greedy(12))->tokens);
    EXPECT_GE(later[i]->prefix_hit_tokens(), 16) << endings[i];
  }
  const SchedulerStats stats = engine->ServingStats();
  EXPECT_GT(stats.pool_blocks, 0);
  EXPECT_EQ(stats.pool_blocks_used, 0);
  EXPECT_GT(stats.pool_blocks_cached, 0);
  EXPECT_EQ(stats.prefix_hits, 3);

  // Impossible pools are refused when the engine loads, naming the field.
  EngineOptions tiny;
  tiny.serving.kv_pool_bytes = 100;
  const absl::Status status = Engine::Load(kDefaultModel, tiny).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("kv_pool_bytes"), std::string::npos) << status;
  if (std::ifstream("/proc/meminfo").good()) {
    EngineOptions huge;
    huge.serving.kv_pool_bytes = int64_t{1} << 52;  // 4 PiB
    const absl::Status beyond = Engine::Load(kDefaultModel, huge).status();
    EXPECT_EQ(beyond.code(), absl::StatusCode::kResourceExhausted) << beyond;
    EXPECT_NE(beyond.message().find("MiB of memory available"), std::string::npos) << beyond;
  }
  // A block so large that its bytes overflow int64 is less than one block, not a pool whose
  // first block throws (2^52 entries of 2048 bytes wrapped around).
  for (const int64_t block : {int64_t{1} << 52, std::numeric_limits<int64_t>::max()}) {
    EngineOptions overflow;
    overflow.serving.kv_pool_bytes = 16 << 20;
    overflow.serving.kv_block_size = block;
    const absl::Status refused = Engine::Load(kDefaultModel, overflow).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    EXPECT_THAT(refused.message(), HasSubstr("less than one KV block"));
  }
  // An engine wrapped around a model (no Load) refuses at Submit.
  std::shared_ptr<const Engine> wrapped =
      Engine::FromModel(GPT(std::static_pointer_cast<GPTImpl>(engine->model().shared_from_this())),
                        nullptr, tiny.serving);
  EXPECT_EQ(wrapped->Submit(std::vector<int64_t>{1, 2}, Greedy(4)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// An engine destroyed with requests in flight cancels them and returns.
TEST(EngineServingTest, DestroyingTheEngineCancelsItsRequests) {
  std::vector<std::shared_ptr<Request>> requests;
  {
    std::shared_ptr<const Engine> engine = *Engine::Load(kDefaultModel);
    for (int i = 0; i < 4; ++i) requests.push_back(*engine->Submit("And God said", Greedy(200)));
  }
  for (auto& request : requests) {
    ASSERT_TRUE(request->Done());
    absl::StatusOr<Completion> result = request->Wait();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->finish_reason, FinishReason::kCancelled);
  }
}

TEST(EngineTest, BatchOfDifferentLengthsEqualsEachRowAlone) {
  const Engine& engine = DefaultEngine();
  const std::vector<std::vector<int64_t>> prompts = {
      *engine.Encode("And God said"),
      *engine.Encode("In the beginning God created the heaven and the earth. And the earth"),
      *engine.Encode("Jesus wept."),
  };
  ASSERT_NE(prompts[0].size(), prompts[1].size());
  for (const RequestOptions& options : {Greedy(16), Sampled(16, 3)}) {
    absl::StatusOr<std::vector<Completion>> batch = engine.GenerateBatch(prompts, options);
    ASSERT_TRUE(batch.ok()) << batch.status();
    ASSERT_EQ(batch->size(), prompts.size());
    for (size_t row = 0; row < prompts.size(); ++row) {
      const Completion alone = *engine.Generate(prompts[row], options);
      EXPECT_EQ((*batch)[row].tokens, alone.tokens) << "row " << row;
      EXPECT_EQ((*batch)[row].text, alone.text) << "row " << row;
    }
  }
}

TEST(EngineTest, BatchThroughABudgetedQuantisedCacheEqualsEachRowAlone) {
  const Engine& engine = DefaultEngine();
  const std::vector<std::vector<int64_t>> prompts = {*engine.Encode("And it came to pass"),
                                                     *engine.Encode("Jesus wept.")};
  RequestOptions options = Greedy(12);
  options.kv_cache.policy = "sink";
  options.kv_cache.budget = 12;
  options.kv_cache.bits = 8;
  const std::vector<Completion> batch = *engine.GenerateBatch(prompts, options);
  for (size_t row = 0; row < prompts.size(); ++row) {
    EXPECT_EQ(batch[row].tokens, engine.Generate(prompts[row], options)->tokens) << row;
  }
}

TEST(EngineTest, BudgetedCacheAtFullBudgetEqualsDense) {
  const Engine& engine = DefaultEngine();
  const Completion dense = *engine.Generate("And God said", Greedy(24));
  for (const std::string policy : {"window", "sink", "h2o"}) {
    RequestOptions options = Greedy(24);
    options.kv_cache.policy = policy;
    options.kv_cache.budget = 64;
    absl::StatusOr<Completion> result = engine.Generate("And God said", options);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->tokens, dense.tokens) << policy;
  }
}

TEST(SessionTest, TurnsEqualOneShotGenerationOfTheWholeConversation) {
  const Engine& engine = DefaultEngine();
  std::unique_ptr<Session> session = *engine.NewSession();
  const std::vector<int64_t> first = *engine.Encode("And God said");
  const Completion reply1 = *session->Send(first, Greedy(8));
  const std::vector<int64_t> second = *engine.tokenizer()->Encode(" And Moses said", false);
  const Completion reply2 = *session->Send(second, Greedy(8));

  std::vector<int64_t> whole = first;
  whole.insert(whole.end(), reply1.tokens.begin(), reply1.tokens.end());
  whole.insert(whole.end(), second.begin(), second.end());
  const Completion one_shot = *engine.Generate(whole, Greedy(8));
  EXPECT_EQ(reply2.tokens, one_shot.tokens);
  EXPECT_EQ(session->context_tokens(), static_cast<int64_t>(whole.size() + reply2.tokens.size()));
}

TEST(SessionTest, SaysWhenTheContextIsFull) {
  const Engine& engine = DefaultEngine();
  std::unique_ptr<Session> session = *engine.NewSession();
  const int64_t context = engine.config().block_size;
  FinishReason last = FinishReason::kMaxTokens;
  int turns = 0;
  while (last != FinishReason::kContextFull && turns < 100) {
    absl::StatusOr<Completion> reply = session->Send(*engine.Encode("And"), Greedy(60));
    ASSERT_TRUE(reply.ok()) << reply.status();
    last = reply->finish_reason;
    ++turns;
  }
  EXPECT_EQ(last, FinishReason::kContextFull);
  EXPECT_EQ(session->context_tokens(), context);
  const int64_t before = session->context_tokens();
  absl::StatusOr<Completion> overflow = session->Send(*engine.Encode("And"), Greedy(4));
  EXPECT_EQ(overflow.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(overflow.status().message(), HasSubstr("context full"));
  EXPECT_EQ(session->context_tokens(), before);  // unchanged
  session->Reset();
  EXPECT_TRUE(session->Send(*engine.Encode("And"), Greedy(4)).ok());
}

// Options the generation would refuse are refused before it: a failed generation resets the
// session, and a NaN temperature cost the whole conversation.
TEST(SessionTest, BadOptionsLeaveTheConversation) {
  const Engine& engine = DefaultEngine();
  std::unique_ptr<Session> session = *engine.NewSession();
  ASSERT_TRUE(session->Send(*engine.Encode("And God said"), Greedy(4)).ok());
  const int64_t before = session->context_tokens();
  RequestOptions nan = Greedy(4);
  nan.sampling.temperature = std::nan("");
  RequestOptions top_p = Greedy(4);
  top_p.sampling.top_p = 2;
  RequestOptions chunk = Greedy(4);
  chunk.prefill_chunk = -1;
  for (const RequestOptions& bad : {nan, top_p, chunk}) {
    const absl::Status status = session->Send(std::vector<int64_t>{5}, bad).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), ::testing::Not(HasSubstr("reset")));
    EXPECT_EQ(session->context_tokens(), before);
  }
}

TEST(EngineTest, Int8WeightsGenerateTheSameGreedyTextAlmostEverywhere) {
  EngineOptions options;
  options.quantize_int8 = true;
  absl::StatusOr<std::shared_ptr<const Engine>> int8 = Engine::Load(kDefaultModel, options);
  ASSERT_TRUE(int8.ok()) << int8.status();
  const Completion f32 = *DefaultEngine().Generate("And God said", Greedy(12));
  const Completion q8 = *(*int8)->Generate("And God said", Greedy(12));
  ASSERT_EQ(q8.tokens.size(), f32.tokens.size());
  // Per-channel int8 moves logits by ~1e-3: the first greedy tokens agree.
  EXPECT_EQ(std::vector<int64_t>(q8.tokens.begin(), q8.tokens.begin() + 4),
            std::vector<int64_t>(f32.tokens.begin(), f32.tokens.begin() + 4));
  options.dtype = c10::kBFloat16;
  EXPECT_EQ(Engine::Load(kDefaultModel, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// EngineOptions.quantize: int4 (q4_0-like) weights load, generate, and batch like float;
// the options' errors name the fields. Quality bounds: core/model/quantize_model_test.
TEST(EngineTest, Int4WeightsGenerateAndOptionErrorsNameTheField) {
  EngineOptions options;
  options.quantize = WeightQuantization::kInt4;
  absl::StatusOr<std::shared_ptr<const Engine>> int4 = Engine::Load(kDefaultModel, options);
  ASSERT_TRUE(int4.ok()) << int4.status();
  const Completion q4 = *(*int4)->Generate("And God said", Greedy(12));
  EXPECT_EQ(q4.tokens.size(), 12u);
  // A batch of rows decodes each row as it would alone (the integer GEMV's rows do not
  // depend on the batch).
  const std::vector<int64_t> a = *(*int4)->Encode("And God said");
  const std::vector<int64_t> b = *(*int4)->Encode("In the beginning");
  absl::StatusOr<std::vector<Completion>> batch = (*int4)->GenerateBatch({a, b}, Greedy(8));
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ((*batch)[0].tokens, (*int4)->Generate(a, Greedy(8))->tokens);
  EXPECT_EQ((*batch)[1].tokens, (*int4)->Generate(b, Greedy(8))->tokens);

  options.quantize_int8 = true;
  const absl::Status both = Engine::Load(kDefaultModel, options).status();
  EXPECT_EQ(both.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(both.message(), HasSubstr("EngineOptions.quantize_int8"));
  options.quantize_int8 = false;
  options.dtype = c10::kBFloat16;
  const absl::Status bf16 = Engine::Load(kDefaultModel, options).status();
  EXPECT_EQ(bf16.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bf16.message(), HasSubstr("EngineOptions.quantize int4"));
}

TEST(EngineTest, BadInputsAreClearErrors) {
  const Engine& engine = DefaultEngine();
  EXPECT_EQ(Engine::Load("/nonexistent/checkpoint").status().code(), absl::StatusCode::kNotFound);
  const int64_t vocab = engine.config().PaddedVocabSize();
  absl::StatusOr<Completion> bad_id = engine.Generate(std::vector<int64_t>{1, vocab}, Greedy(4));
  EXPECT_EQ(bad_id.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(bad_id.status().message(), HasSubstr("outside the vocabulary"));
  EXPECT_EQ(engine.Generate(std::vector<int64_t>{1, -3}, Greedy(4)).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(engine.Generate(std::vector<int64_t>{}, Greedy(4)).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<int64_t> too_long(engine.config().block_size, 5);
  EXPECT_EQ(engine.Generate(too_long, Greedy(4)).status().code(), absl::StatusCode::kOutOfRange);
  RequestOptions bad_cache = Greedy(4);
  bad_cache.kv_cache.policy = "lru";
  EXPECT_EQ(engine.Generate("And", bad_cache).status().code(), absl::StatusCode::kInvalidArgument);
  RequestOptions zero = Greedy(0);
  EXPECT_EQ(engine.Generate("And", zero).status().code(), absl::StatusCode::kInvalidArgument);
  // GenerateBatch names max_new_tokens, not the cache length computed from it.
  for (const int64_t max_new_tokens : {int64_t{0}, std::numeric_limits<int64_t>::min()}) {
    const absl::Status batch =
        engine.GenerateBatch({*engine.Encode("And")}, Greedy(max_new_tokens)).status();
    EXPECT_EQ(batch.code(), absl::StatusCode::kInvalidArgument) << batch;
    EXPECT_THAT(batch.message(), HasSubstr("max_new_tokens must be >= 1")) << batch;
  }
}

// A LoRA fine-tune of the default model as `finetune` writes it (random LoRA weights, no
// tokenizer of its own: the base's serves).
std::string MakeDefaultModelLora(const std::string& name, uint64_t seed) {
  Config config = LoadConfigFile(std::string(kDefaultModel) + "/model_config.yaml").value();
  config.lora_r = 4;
  config.lora_alpha = 8;
  config.lora_query = config.lora_value = config.lora_mlp = true;
  GPT model = CreateLoraGPT(config).value();
  at::manual_seed(seed);
  TensorMap lora;
  for (const auto& [tensor_name, tensor] : LoraStateDict(*model)) {
    lora[tensor_name] = at::randn(tensor.sizes()) * 0.05;
  }
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/model_config.yaml") << ConfigToYaml(config);
  std::ofstream(dir + "/hyperparameters.yaml")
      << "checkpoint_dir: " << std::filesystem::absolute(kDefaultModel).string() << "\n";
  CHECK(WriteTorchStateDict(dir + "/lit_model.pth.lora", lora).ok());
  return dir;
}

at::Tensor EngineLogits(const Engine& engine, const std::vector<int64_t>& ids) {
  at::NoGradGuard no_grad;
  return engine.model().Forward(at::tensor(ids, at::kLong).unsqueeze(0)).value();
}

TEST(EngineTest, LoadsLoraFinetunesAtRunTime) {
  const std::string lora = MakeDefaultModelLora("engine_lora", 5);
  absl::StatusOr<std::shared_ptr<const Engine>> finetune = Engine::Load(lora);
  ASSERT_TRUE(finetune.ok()) << finetune.status();
  EXPECT_EQ((*finetune)->checkpoint_dir(), lora);
  ASSERT_NE((*finetune)->tokenizer(), nullptr);  // the base's
  EngineOptions options;
  options.loras = {{lora, 1.0}};
  absl::StatusOr<std::shared_ptr<const Engine>> over_base = Engine::Load(kDefaultModel, options);
  ASSERT_TRUE(over_base.ok()) << over_base.status();

  const std::vector<int64_t> prompt = *DefaultEngine().Encode("And God said");
  const at::Tensor logits = EngineLogits(**finetune, prompt);
  EXPECT_EQ((logits - EngineLogits(**over_base, prompt)).abs().max().item<double>(), 0.0);
  EXPECT_GT((logits - EngineLogits(DefaultEngine(), prompt)).abs().max().item<double>(), 1e-2);
  // The merged model generates the same text.
  GPT merged = GPTImpl::Create(DefaultEngine().config()).value();
  ASSERT_TRUE(LoadStateDict(*merged, MergedBaseStateDict((*finetune)->model()), "merged").ok());
  merged->eval();
  const std::shared_ptr<const Engine> merged_engine = Engine::FromModel(merged, nullptr);
  EXPECT_EQ((*finetune)->Generate(prompt, Greedy(12))->tokens,
            merged_engine->Generate(prompt, Greedy(12))->tokens);
  EXPECT_EQ((*finetune)->Generate("And God said", Greedy(12))->text,
            (*over_base)->Generate("And God said", Greedy(12))->text);

  // Over an int8 base: the base's rounding only.
  options.quantize_int8 = true;
  absl::StatusOr<std::shared_ptr<const Engine>> int8 = Engine::Load(kDefaultModel, options);
  ASSERT_TRUE(int8.ok()) << int8.status();
  EXPECT_LT((EngineLogits(**int8, prompt) - logits).abs().max().item<double>(),
            0.05 * logits.abs().max().item<double>());

  // Errors name the field.
  options.quantize_int8 = false;
  options.loras = {{lora, 1.0}, {lora, std::nan("")}};
  const absl::Status nan = Engine::Load(kDefaultModel, options).status();
  EXPECT_EQ(nan.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(nan.message(), HasSubstr("EngineOptions.loras[1].scale"));
  options.loras = {{"/nonexistent/lora"}};
  const absl::Status missing = Engine::Load(kDefaultModel, options).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("EngineOptions.loras[0] /nonexistent/lora"));
}

// The facade's errors carry the option at fault (core/base/status_field.h), which tools show as
// their flag and the server as its request field; messages stay in the library's names.
TEST(EngineTest, OptionErrorsCarryTheirField) {
  auto fields_of = [](const absl::Status& status) {
    std::vector<std::string> paths;
    for (const FieldRef& field : ErrorFields(status)) paths.push_back(field.path);
    return paths;
  };
  // Refused before the checkpoint is read.
  EngineOptions options;
  options.serving.max_running = 0;
  EXPECT_EQ(ErrorField(Engine::Load("/nonexistent", options).status()),
            "SchedulerOptions.max_running");
  options = EngineOptions();
  options.serving.kv_block_size = 0;
  EXPECT_EQ(ErrorField(Engine::Load("/nonexistent", options).status()),
            "SchedulerOptions.kv_block_size");
  options = EngineOptions();
  options.quantize = WeightQuantization::kInt4;
  options.quantize_int8 = true;
  const absl::Status both = Engine::Load("/nonexistent", options).status();
  EXPECT_EQ(fields_of(both),
            (std::vector<std::string>{"EngineOptions.quantize_int8", "EngineOptions.quantize"}));
  options.quantize_int8 = false;
  options.dtype = c10::kBFloat16;
  const absl::Status bf16 = Engine::Load("/nonexistent", options).status();
  // On the CPU quantised weights need float32 activations (a CUDA device takes any dtype).
  EXPECT_EQ(fields_of(bf16),
            (std::vector<std::string>{"EngineOptions.quantize", "EngineOptions.dtype"}));
  options = EngineOptions();
  options.loras = {{""}};
  EXPECT_EQ(ErrorField(Engine::Load(kDefaultModel, options).status()), "EngineOptions.loras");
  options.loras = {{"/nonexistent/lora"}};
  const absl::Status missing = Engine::Load(kDefaultModel, options).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_EQ(ErrorField(missing), "EngineOptions.loras") << missing;
  // The pool's sizing, when the engine loads.
  options = EngineOptions();
  options.serving.kv_pool_bytes = 100;
  EXPECT_EQ(ErrorField(Engine::Load(kDefaultModel, options).status()),
            "SchedulerOptions.kv_pool_bytes");

  // Requests.
  const Engine& engine = DefaultEngine();
  const absl::Status zero = engine.Generate("And", Greedy(0)).status();
  EXPECT_EQ(ErrorField(zero), "RequestOptions.max_new_tokens");
  EXPECT_EQ(ErrorFields(zero)[0].text(), "max_new_tokens");
  EXPECT_EQ(ErrorField(engine.GenerateBatch({*engine.Encode("And")}, Greedy(0)).status()),
            "RequestOptions.max_new_tokens");
  std::vector<int64_t> too_long(engine.config().block_size, 5);
  const absl::Status context = engine.Generate(too_long, Greedy(4)).status();
  EXPECT_EQ(context.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(fields_of(context),
            (std::vector<std::string>{"RequestOptions.max_new_tokens", "KVCacheSpec.positions"}));
  RequestOptions dense_budget = Greedy(4);
  dense_budget.kv_cache.budget = 8;  // the dense cache keeps everything: refused, not ignored
  const absl::Status dense = engine.Generate("And", dense_budget).status();
  EXPECT_EQ(dense.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorField(dense), "KVCacheSpec.budget");
  EXPECT_EQ(ErrorField(engine.Submit("And", dense_budget).status()), "KVCacheSpec.budget");
  RequestOptions cold = Greedy(4);
  cold.sampling.temperature = -1;
  EXPECT_EQ(ErrorField(engine.Generate("And", cold).status()), "SamplingOptions.temperature");
}

// A lit_model.pth with flipped bytes is refused naming the tensor and EngineOptions' field
// (not LoadOptions'); verify_checksums = false loads it.
TEST(EngineTest, CorruptCheckpointNamesTheEngineOption) {
  const std::string golden = "tests/testdata/golden/llama2";
  const std::string name = "transformer.h.0.mlp.proj.weight";
  absl::StatusOr<std::shared_ptr<const Engine>> intact = Engine::Load(golden);
  ASSERT_TRUE(intact.ok()) << intact.status();
  const at::Tensor weight = (*intact)->model().named_parameters()[name].contiguous();
  const std::string dir = testing::TempDir() + "/engine_corrupt";
  ::mkdir(dir.c_str(), 0755);
  for (const char* file : {"model_config.yaml", "lit_model.pth"}) {
    std::ifstream in(golden + "/" + file, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (std::string(file) == "lit_model.pth") {
      const size_t at = bytes.find(std::string(static_cast<const char*>(weight.data_ptr()),
                                               weight.numel() * weight.element_size()));
      ASSERT_NE(at, std::string::npos);
      for (size_t i = 0; i < 40; ++i) bytes[at + 4 * i] ^= 1;  // Low mantissa bits: finite.
    }
    std::ofstream(dir + "/" + file, std::ios::binary | std::ios::trunc) << bytes;
  }
  const absl::Status status = Engine::Load(dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("(tensor ", name, ")")));
  EXPECT_THAT(status.message(), HasSubstr("set EngineOptions.verify_checksums = false"));
  EngineOptions options;
  options.verify_checksums = false;
  const absl::StatusOr<std::shared_ptr<const Engine>> unverified = Engine::Load(dir, options);
  EXPECT_TRUE(unverified.ok()) << unverified.status();
}

// Speculative decoding through the Engine: greedy replies equal the plain ones with prompt
// lookup and with a draft checkpoint (the model itself: every proposal accepted), in a session
// too, through the scheduler (Submit, n choices); the draft's tokenizer is checked at load;
// GenerateBatch refuses it.
TEST(EngineTest, SpeculativeDecodingKeepsGreedyRepliesAndCountsProposals) {
  EngineOptions engine_options;
  engine_options.draft_checkpoint_dir = kDefaultModel;
  absl::StatusOr<std::shared_ptr<const Engine>> engine =
      Engine::Load(kDefaultModel, engine_options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::string prompt =
      "And God said, Let there be light: and there was light. And God saw the light, that it "
      "was good. And God said, Let there be";
  const Completion plain = *(*engine)->Generate(prompt, Greedy(40));
  for (const std::string method : {"ngram", "draft"}) {
    RequestOptions options = Greedy(40);
    options.speculative.method = method;
    options.speculative.num_speculative_tokens = 5;
    std::string streamed;
    options.on_text = [&streamed](absl::string_view piece) {
      streamed.append(piece.data(), piece.size());
      return true;
    };
    absl::StatusOr<Completion> reply = (*engine)->Generate(prompt, options);
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->tokens, plain.tokens) << method;
    EXPECT_EQ(reply->text, plain.text) << method;
    EXPECT_EQ(streamed, plain.text) << method;
    EXPECT_GT(reply->stats.proposed_tokens, 0) << method;
    if (method == "draft") {
      EXPECT_EQ(reply->stats.acceptance_rate(), 1.0);
    }
    // A conversation: two turns alike with and without speculation.
    std::unique_ptr<Session> with = *(*engine)->NewSession();
    std::unique_ptr<Session> without = *(*engine)->NewSession();
    RequestOptions plain_options = Greedy(24);
    options.max_new_tokens = 24;
    options.on_text = nullptr;
    for (const std::string turn : {"And God said", " and the evening and the morning were"}) {
      const Completion a = *without->Send(turn, plain_options);
      absl::StatusOr<Completion> b = with->Send(turn, options);
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ(b->tokens, a.tokens) << method << ": " << turn;
    }
    EXPECT_EQ(with->context_tokens(), without->context_tokens());
    // Through the scheduler: the same reply, streamed alike; n choices each the same.
    RequestOptions submitted = options;
    submitted.max_new_tokens = 40;
    std::string served_text;
    submitted.on_text = [&served_text](absl::string_view piece) {
      served_text.append(piece.data(), piece.size());
      return true;
    };
    absl::StatusOr<std::shared_ptr<Request>> request = (*engine)->Submit(prompt, submitted);
    ASSERT_TRUE(request.ok()) << request.status();
    absl::StatusOr<Completion> served = (*request)->Wait();
    ASSERT_TRUE(served.ok()) << served.status();
    EXPECT_EQ(served->tokens, plain.tokens) << method;
    EXPECT_EQ(served_text, plain.text) << method;
    EXPECT_GT(served->stats.proposed_tokens, 0) << method;
    submitted.on_text = nullptr;
    absl::StatusOr<std::vector<std::shared_ptr<Request>>> choices =
        (*engine)->SubmitChoices(*(*engine)->Encode(prompt), submitted, 2);
    ASSERT_TRUE(choices.ok()) << choices.status();
    for (const std::shared_ptr<Request>& choice : *choices) {
      EXPECT_EQ(choice->Wait()->tokens, plain.tokens) << method;
    }
    // GenerateBatch does not speculate.
    const absl::Status refused =
        (*engine)->GenerateBatch({*(*engine)->Encode(prompt)}, options).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kUnimplemented) << refused;
    EXPECT_EQ(ErrorField(refused), "SpeculativeSpec.method");
  }
  // A budgeted cache cannot take rejected entries back: refused naming the speculation.
  RequestOptions budgeted = Greedy(8);
  budgeted.speculative.method = "ngram";
  budgeted.kv_cache.policy = "h2o";
  budgeted.kv_cache.budget = 16;
  const absl::Status status = (*engine)->Generate(prompt, budgeted).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_EQ(ErrorField(status), "SpeculativeSpec.method") << status;
  const absl::Status submitted = (*engine)->Submit(prompt, budgeted).status();
  EXPECT_EQ(submitted.code(), absl::StatusCode::kFailedPrecondition) << submitted;
  EXPECT_EQ(ErrorField(submitted), "SpeculativeSpec.method") << submitted;
  // Without a draft checkpoint "draft" is refused.
  RequestOptions draft = Greedy(8);
  draft.speculative.method = "draft";
  EXPECT_EQ(ErrorField(DefaultEngine().Generate(prompt, draft).status()), "SpeculativeSpec.method");
}

TEST(EngineTest, ADraftMustShareTheTokenizer) {
  EngineOptions options;
  options.draft_checkpoint_dir = "tests/testdata/golden/llama2";  // 250 tokens, not 4096
  absl::Status status = Engine::Load(kDefaultModel, options).status();
  EXPECT_EQ(ErrorField(status), "EngineOptions.draft_checkpoint_dir") << status;
  EXPECT_THAT(status.message(), HasSubstr("vocab_size")) << status;
  // The same shape and vocabulary size with another tokenizer, and with none.
  const std::string dir = testing::TempDir() + "/other_tokenizer_draft";
  std::filesystem::create_directories(dir);
  for (const char* file : {"model_config.yaml", "model.safetensors"}) {
    std::filesystem::copy_file(std::string(kDefaultModel) + "/" + file, dir + "/" + file,
                               std::filesystem::copy_options::overwrite_existing);
  }
  options.draft_checkpoint_dir = dir;
  status = Engine::Load(kDefaultModel, options).status();
  EXPECT_EQ(ErrorField(status), "EngineOptions.draft_checkpoint_dir") << status;
  EXPECT_THAT(status.message(), HasSubstr("no tokenizer")) << status;
  std::string vocab;
  for (int id = 0; id < DefaultEngine().config().vocab_size; ++id) {
    absl::StrAppend(&vocab, id == 0 ? "" : ", ", "\"t", id, "\": ", id);
  }
  std::ofstream(dir + "/tokenizer.json")
      << R"({"model": {"type": "BPE", "vocab": {)" << vocab << R"(}, "merges": []}})";
  status = Engine::Load(kDefaultModel, options).status();
  EXPECT_EQ(ErrorField(status), "EngineOptions.draft_checkpoint_dir") << status;
  EXPECT_THAT(status.message(), HasSubstr("tokenizer differs")) << status;
}

}  // namespace
}  // namespace lgpt
