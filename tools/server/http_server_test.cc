// The HTTP server in process, on the embedded default model, over loopback: every endpoint,
// every error, streaming, greedy replies equal to Engine::Generate's, authentication, a full
// queue, a client leaving mid-stream, and shutdown with streams in flight.
#include "tools/server/http_server.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/text/prompt_style.h"
#include "nlohmann/json.hpp"
#include "tools/server/chat_prompt.h"
#include "tools/server/test_client.h"

namespace lgpt {
namespace {

using json = nlohmann::json;

constexpr char kDefaultModel[] = "tools/default_model";
// Sampling this hot almost never draws EOS: a reply that runs to max_tokens.
constexpr char kLongReply[] = R"("temperature": 5, "seed": 7, "max_tokens": 240)";

std::shared_ptr<const Engine> LoadEngine(SchedulerOptions serving = {}) {
  EngineOptions options;
  options.serving = serving;
  absl::StatusOr<std::shared_ptr<const Engine>> engine = Engine::Load(kDefaultModel, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return *engine;
}

// A server on a free port, serving on its own thread until destroyed.
class RunningServer {
 public:
  explicit RunningServer(std::shared_ptr<const Engine> engine, ServerOptions options = {}) {
    options.port = 0;
    options.access_log = false;
    absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Create(engine, options);
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    thread_ = std::thread([this] { server_->Run(); });
  }
  ~RunningServer() { Stop(); }
  void Stop() {
    server_->Shutdown();
    if (thread_.joinable()) thread_.join();
  }
  HttpServer& server() { return *server_; }
  int port() const { return server_->port(); }

 private:
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
};

json Parse(const std::string& body) {
  json value = json::parse(body, nullptr, false);
  EXPECT_FALSE(value.is_discarded()) << body;
  return value;
}

// The error's message, after checking OpenAI's shape and the status.
std::string ExpectError(const HttpReply& reply, int status) {
  EXPECT_EQ(reply.status, status) << reply.body;
  const json body = Parse(reply.body);
  EXPECT_TRUE(body.contains("error")) << reply.body;
  if (!body.contains("error")) return "";
  const json& error = body["error"];
  EXPECT_TRUE(error["message"].is_string());
  EXPECT_TRUE(error["type"].is_string());
  EXPECT_TRUE(error.contains("code"));
  return error["message"].get<std::string>();
}

class HttpServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { engine_ = new std::shared_ptr<const Engine>(LoadEngine()); }
  static void TearDownTestSuite() { delete engine_; }
  static const std::shared_ptr<const Engine>& engine() { return *engine_; }

  // Engine::Generate of `prompt` with the server's options for a greedy request.
  static std::string GenerateGreedy(const std::string& prompt, int64_t max_tokens,
                                    std::vector<std::vector<int64_t>> stops = {}) {
    RequestOptions options;
    options.max_new_tokens = max_tokens;
    options.sampling = {0, 0, 1};
    options.stop_token_sequences = std::move(stops);
    absl::StatusOr<Completion> completion = engine()->Generate(prompt, options);
    EXPECT_TRUE(completion.ok()) << completion.status();
    return completion.ok() ? completion->text : "";
  }

  static std::shared_ptr<const Engine>* engine_;
};
std::shared_ptr<const Engine>* HttpServerTest::engine_ = nullptr;

TEST_F(HttpServerTest, HealthModelsAndMetrics) {
  RunningServer server(engine());
  const HttpReply health = HttpGet(server.port(), "/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(Parse(health.body)["status"], "ok");

  const HttpReply models = HttpGet(server.port(), "/v1/models");
  ASSERT_EQ(models.status, 200);
  const json list = Parse(models.body);
  EXPECT_EQ(list["object"], "list");
  ASSERT_EQ(list["data"].size(), 1u);
  EXPECT_EQ(list["data"][0]["id"], engine()->config().name);
  EXPECT_EQ(list["data"][0]["object"], "model");

  const HttpReply model = HttpGet(server.port(), "/v1/models/" + engine()->config().name);
  EXPECT_EQ(model.status, 200);
  EXPECT_EQ(Parse(model.body)["id"], engine()->config().name);
  ExpectError(HttpGet(server.port(), "/v1/models/gpt-4"), 404);

  // A request is counted after its last byte is sent: the client may ask before that.
  HttpReply metrics;
  for (int i = 0; i < 200; ++i) {
    metrics = HttpGet(server.port(), "/metrics");
    if (absl::StrContains(metrics.body, "endpoint=\"/v1/models/{id}\",status=\"404\"")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(metrics.status, 200);
  EXPECT_TRUE(absl::StartsWith(metrics.content_type, "text/plain"));
  for (const char* series :
       {"lgpt_requests_running", "lgpt_requests_waiting", "lgpt_kv_blocks_used",
        "lgpt_kv_blocks_free", "lgpt_prefix_cache_hits_total", "lgpt_preemptions_total",
        "lgpt_prompt_tokens_total", "lgpt_generation_tokens_total",
        "lgpt_time_to_first_token_seconds_count", "lgpt_inter_token_latency_seconds_count",
        "lgpt_http_requests_total{endpoint=\"/health\",status=\"200\"}",
        "lgpt_http_requests_total{endpoint=\"/v1/models/{id}\",status=\"404\"}"}) {
    EXPECT_GE(MetricValue(metrics.body, series), 0) << series << "\n" << metrics.body;
  }
  EXPECT_TRUE(
      absl::StrContains(metrics.body, "lgpt_time_to_first_token_seconds_bucket{le=\"+Inf\"}"));
}

TEST_F(HttpServerTest, GreedyCompletionEqualsGenerate) {
  RunningServer server(engine());
  const HttpReply reply = HttpPost(
      server.port(), "/v1/completions",
      R"({"model": "lgpt-kjv-3m", "prompt": "And God said", "max_tokens": 30, "temperature": 0})");
  ASSERT_EQ(reply.status, 200) << reply.body;
  const json body = Parse(reply.body);
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_TRUE(absl::StartsWith(body["id"].get<std::string>(), "cmpl-"));
  EXPECT_EQ(body["model"], engine()->config().name);
  const json& choice = body["choices"][0];
  EXPECT_EQ(choice["text"], GenerateGreedy("And God said", 30));
  const std::string finish = choice["finish_reason"];
  EXPECT_TRUE(finish == "stop" || finish == "length") << finish;
  const json& usage = body["usage"];
  EXPECT_EQ(usage["prompt_tokens"], engine()->Encode("And God said")->size());
  EXPECT_EQ(usage["total_tokens"].get<int64_t>(),
            usage["prompt_tokens"].get<int64_t>() + usage["completion_tokens"].get<int64_t>());

  // Token ids as the prompt, and a list of one string.
  const std::vector<int64_t> ids = *engine()->Encode("And God said");
  const HttpReply by_ids = HttpPost(
      server.port(), "/v1/completions",
      absl::StrCat(R"({"prompt": )", json(ids).dump(), R"(, "max_tokens": 30, "temperature": 0})"));
  ASSERT_EQ(by_ids.status, 200) << by_ids.body;
  EXPECT_EQ(Parse(by_ids.body)["choices"][0]["text"], choice["text"]);
  const HttpReply listed =
      HttpPost(server.port(), "/v1/completions",
               R"({"prompt": ["And God said"], "max_tokens": 30, "temperature": 0})");
  EXPECT_EQ(Parse(listed.body)["choices"][0]["text"], choice["text"]);
}

TEST_F(HttpServerTest, LengthAndStopFinishReasons) {
  RunningServer server(engine());
  const json length =
      Parse(HttpPost(server.port(), "/v1/completions",
                     R"({"prompt": "And God said", "max_tokens": 3, "temperature": 0})")
                .body);
  EXPECT_EQ(length["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(length["usage"]["completion_tokens"], 3);
  // " unto him" is how the greedy reply starts: a stop sequence cuts the text before it.
  const std::string full = GenerateGreedy("And God said", 12);
  const std::string stop = full.substr(5, 4);
  const json stopped = Parse(HttpPost(server.port(), "/v1/completions",
                                      absl::StrCat(R"({"prompt": "And God said", "max_tokens": 12,
                                                      "temperature": 0, "stop": [")",
                                                   stop, R"(", "zzz"]})"))
                                 .body);
  EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(stopped["choices"][0]["text"], full.substr(0, full.find(stop)));
}

TEST_F(HttpServerTest, ChatEqualsGenerateWithThePromptStyle) {
  RunningServer server(engine());
  const std::vector<ChatMessage> messages = {{"system", "Be brief."},
                                             {"user", "Who made the heaven?"},
                                             {"assistant", "God."},
                                             {"user", "And the earth?"}};
  json request = {{"model", engine()->config().name}, {"max_tokens", 24}, {"temperature", 0}};
  for (const ChatMessage& message : messages) {
    request["messages"].push_back({{"role", message.role}, {"content", message.content}});
  }
  const HttpReply reply = HttpPost(server.port(), "/v1/chat/completions", request.dump());
  ASSERT_EQ(reply.status, 200) << reply.body;
  const json body = Parse(reply.body);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_TRUE(absl::StartsWith(body["id"].get<std::string>(), "chatcmpl-"));
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");

  const PromptStyle style = *PromptStyleForCheckpoint(kDefaultModel, engine()->config());
  const Tokenizer& tokenizer = *engine()->tokenizer();
  const std::string prompt = *ChatPromptText(style, messages);
  const auto stops = style.StopTokenIds(tokenizer.eos_id(), [&](absl::string_view token) {
    absl::StatusOr<int64_t> id = tokenizer.TokenToId(token);
    return id.ok() ? std::optional<int64_t>(*id) : std::nullopt;
  });
  EXPECT_EQ(body["choices"][0]["message"]["content"], GenerateGreedy(prompt, 24, stops));
  EXPECT_EQ(body["usage"]["prompt_tokens"], engine()->Encode(prompt)->size());
}

TEST_F(HttpServerTest, StreamsEqualTheWholeReply) {
  RunningServer server(engine());
  for (const std::string path : {"/v1/completions", "/v1/chat/completions"}) {
    const bool chat = path == "/v1/chat/completions";
    const std::string input = chat ? R"("messages": [{"role": "user", "content": "And God said"}])"
                                   : R"("prompt": "And God said")";
    const std::string request = absl::StrCat("{", input, R"(, "max_tokens": 40, "temperature": 0)");
    const HttpReply whole = HttpPost(server.port(), path, request + "}");
    ASSERT_EQ(whole.status, 200) << whole.body;
    const json body = Parse(whole.body);
    const StreamReply stream =
        HttpPostStream(server.port(), path,
                       request + R"(, "stream": true, "stream_options": {"include_usage": true}})");
    ASSERT_EQ(stream.status, 200) << stream.body;
    EXPECT_EQ(stream.content_type, "text/event-stream");
    ASSERT_GE(stream.events.size(), 4u);
    EXPECT_EQ(stream.events.back(), "[DONE]");
    const json first = Parse(stream.events[0]);
    EXPECT_EQ(first["object"], chat ? "chat.completion.chunk" : "text_completion");
    if (chat) {
      EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
    }
    EXPECT_EQ(StreamedText(stream.events),
              chat ? body["choices"][0]["message"]["content"] : body["choices"][0]["text"]);
    EXPECT_EQ(StreamedFinishReason(stream.events), body["choices"][0]["finish_reason"]);
    const json usage = Parse(stream.events[stream.events.size() - 2]);
    EXPECT_TRUE(usage["choices"].empty());
    EXPECT_EQ(usage["usage"], body["usage"]);
  }
}

TEST_F(HttpServerTest, SeededSamplingRepeatsAndKvCacheFieldsWork) {
  RunningServer server(engine());
  const std::string request =
      R"({"prompt": "In the beginning", "max_tokens": 20, "temperature": 0.9, "top_k": 40,
          "top_p": 0.95, "seed": 11})";
  const HttpReply a = HttpPost(server.port(), "/v1/completions", request);
  const HttpReply b = HttpPost(server.port(), "/v1/completions", request);
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(Parse(a.body)["choices"], Parse(b.body)["choices"]);
  // A sink cache whose budget holds the whole sequence equals the dense cache.
  const HttpReply dense = HttpPost(server.port(), "/v1/completions",
                                   R"({"prompt": "In the beginning", "max_tokens": 20,
                                       "temperature": 0})");
  const HttpReply sink = HttpPost(server.port(), "/v1/completions",
                                  R"({"prompt": "In the beginning", "max_tokens": 20,
                                      "temperature": 0, "kv_cache": "sink", "kv_budget": 64,
                                      "kv_bits": 16})");
  ASSERT_EQ(sink.status, 200) << sink.body;
  EXPECT_EQ(Parse(sink.body)["choices"][0]["text"], Parse(dense.body)["choices"][0]["text"]);
  const HttpReply int8 = HttpPost(server.port(), "/v1/completions",
                                  R"({"prompt": "In the beginning", "max_tokens": 8,
                                      "kv_cache": "h2o", "kv_budget": 32, "kv_bits": 8})");
  EXPECT_EQ(int8.status, 200) << int8.body;
}

TEST_F(HttpServerTest, BadRequestsAre400NamingTheField) {
  RunningServer server(engine());
  const int port = server.port();
  auto post = [port](const std::string& body, const std::string& path = "/v1/completions") {
    return HttpPost(port, path, body);
  };
  EXPECT_TRUE(absl::StrContains(ExpectError(post(R"({"prompt": )"), 400), "malformed JSON"));
  EXPECT_TRUE(absl::StrContains(ExpectError(post(R"([1, 2])"), 400), "JSON object"));
  EXPECT_TRUE(absl::StrContains(ExpectError(post(R"({"max_tokens": 3})"), 400), "'prompt'"));
  EXPECT_TRUE(absl::StrContains(ExpectError(post(R"({"prompt": "x", "max_tokens": "3"})"), 400),
                                "'max_tokens'"));
  EXPECT_TRUE(absl::StrContains(ExpectError(post(R"({"prompt": "x", "temperature": "hot"})"), 400),
                                "'temperature'"));
  EXPECT_TRUE(absl::StrContains(ExpectError(post(R"({"prompt": "x", "temperature": -1})"), 400),
                                "temperature"));
  EXPECT_TRUE(absl::StrContains(ExpectError(post(R"({"prompt": "x", "stop": 3})"), 400), "'stop'"));
  EXPECT_TRUE(
      absl::StrContains(ExpectError(post(R"({"prompt": "x", "stream": 1})"), 400), "'stream'"));
  EXPECT_TRUE(absl::StrContains(
      ExpectError(post(R"({"prompt": "x", "kv_cache": "h2o", "kv_budget": 0})"), 400),
      "kv_budget"));
  EXPECT_TRUE(
      absl::StrContains(ExpectError(post(R"({"prompt": "x", "kv_bits": 3})"), 400), "kv_bits"));
  EXPECT_TRUE(absl::StrContains(ExpectError(post(R"({"prompt": "x", "kv_cache": "lru"})"), 400),
                                "kv_cache"));
  EXPECT_TRUE(absl::StrContains(
      ExpectError(
          post(R"({"messages": [{"role": "robot", "content": "x"}]})", "/v1/chat/completions"),
          400),
      "role"));
  EXPECT_TRUE(absl::StrContains(
      ExpectError(
          post(R"({"messages": [{"role": "assistant", "content": "x"}]})", "/v1/chat/completions"),
          400),
      "messages"));
  // Unsupported features are refused, never ignored.
  for (const std::string field :
       {R"("echo": true)", R"("best_of": 2)", R"("suffix": "x")", R"("frobnicate": 1)"}) {
    EXPECT_TRUE(
        absl::StrContains(ExpectError(post(absl::StrCat(R"({"prompt": "x", )", field, "}")), 400),
                          "not supported") ||
        absl::StrContains(post(absl::StrCat(R"({"prompt": "x", )", field, "}")).body,
                          "unsupported"))
        << field;
  }
  for (const std::string field : {R"("functions": [{"name": "f"}])"}) {
    const std::string body =
        absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], )", field, "}");
    const std::string message = ExpectError(post(body, "/v1/chat/completions"), 400);
    EXPECT_TRUE(absl::StrContains(message, "not supported")) << field << ": " << message;
  }
  // Neutral values of those fields are fine.
  EXPECT_EQ(post(R"({"prompt": "x", "max_tokens": 2, "n": 1, "logprobs": null, "echo": false,
                    "presence_penalty": 0, "user": "u1"})")
                .status,
            200);
}

TEST_F(HttpServerTest, ContextModelPathAndBodyErrors) {
  ServerOptions options;
  options.max_body_bytes = 4096;
  RunningServer server(engine(), options);
  const int port = server.port();
  const int64_t context = engine()->config().block_size;
  // A prompt beyond the context, and a reply that cannot fit after it.
  std::vector<int64_t> long_prompt(static_cast<size_t>(context) + 10, 5);
  const std::string too_long =
      ExpectError(HttpPost(port, "/v1/completions",
                           absl::StrCat(R"({"prompt": )", json(long_prompt).dump(), "}")),
                  400);
  EXPECT_TRUE(absl::StrContains(too_long, "context")) << too_long;
  EXPECT_TRUE(absl::StrContains(too_long, "shorter prompt")) << too_long;
  const std::string reply_too_long = ExpectError(
      HttpPost(port, "/v1/completions", R"({"prompt": "And God said", "max_tokens": 100000})"),
      400);
  EXPECT_TRUE(absl::StrContains(reply_too_long, "max_tokens")) << reply_too_long;
  // What the client can change, not a cache setting no request field reaches.
  EXPECT_TRUE(absl::StrContains(reply_too_long, "lower max_tokens to at most")) << reply_too_long;
  EXPECT_FALSE(absl::StrContains(reply_too_long, "cache positions")) << reply_too_long;
  EXPECT_TRUE(absl::StrContains(
      HttpPost(port, "/v1/completions", R"({"prompt": "x", "max_tokens": 100000})").body,
      "context_length_exceeded"));
  EXPECT_TRUE(absl::StrContains(
      ExpectError(HttpPost(port, "/v1/completions", R"({"model": "gpt-4", "prompt": "x"})"), 404),
      "gpt-4"));
  ExpectError(HttpGet(port, "/v2/nothing"), 404);
  ExpectError(HttpPost(port, "/v1/moderations", R"({"input": "x"})"), 404);
  // A known path with another method: 405 and the method it takes.
  const HttpReply get_completions = HttpGet(port, "/v1/completions");
  EXPECT_TRUE(absl::StrContains(ExpectError(get_completions, 405), "POST"));
  EXPECT_EQ(get_completions.allow, "POST");
  EXPECT_EQ(HttpRequest(port, "DELETE", "/v1/models").allow, "GET");
  // A POST that announces no body length is answered at once (411), not read until the client
  // closes the connection.
  const HttpReply no_length = HttpRawExchange(
      port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_TRUE(absl::StrContains(ExpectError(no_length, 411), "Content-Length")) << no_length.error;
  const std::string big(8000, 'a');
  const std::string message = ExpectError(
      HttpPost(port, "/v1/completions", absl::StrCat(R"({"prompt": ")", big, R"("})")), 413);
  EXPECT_TRUE(absl::StrContains(message, "4096")) << message;
}

// A model id with a percent-encoded line break matched no route: the error handler called it
// 405 "takes GET, not GET".
TEST_F(HttpServerTest, AnUnroutedPathAskedWithItsMethodIs404) {
  RunningServer server(engine(), ServerOptions());
  const int port = server.port();
  for (const char* id : {"a%0d%0ab", "a%0ab", "%0d"}) {
    const HttpReply reply = HttpRawExchange(
        port,
        absl::StrCat("GET /v1/models/", id, " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    const std::string message = ExpectError(reply, 404);
    EXPECT_TRUE(absl::StrContains(message, "does not exist")) << id << ": " << message;
  }
}

// cpp-httplib applied Range to every response: a completion came back as 206 with a slice of
// its JSON.
TEST_F(HttpServerTest, RangeHeadersAreIgnored) {
  RunningServer server(engine(), ServerOptions());
  const int port = server.port();
  const std::string body = R"({"prompt": "And God said", "max_tokens": 3, "temperature": 0})";
  const HttpReply reply = HttpRawExchange(
      port, absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                         "Range: bytes=0-5\r\nContent-Type: application/json\r\n"
                         "Content-Length: ",
                         body.size(), "\r\n\r\n", body));
  EXPECT_EQ(reply.status, 200) << reply.body << reply.error;
  EXPECT_EQ(Parse(reply.body)["usage"]["completion_tokens"], 3) << reply.body;
  const HttpReply models = HttpRawExchange(
      port, "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\nRange: bytes=2-4\r\n\r\n");
  EXPECT_EQ(models.status, 200) << models.body;
  EXPECT_EQ(Parse(models.body)["object"], "list") << models.body;
}

// curl -d labels JSON as a form: a body over cpp-httplib's 8 KiB form limit is still read.
TEST_F(HttpServerTest, JsonLabelledAsAFormIsRead) {
  RunningServer server(engine(), ServerOptions());
  const int port = server.port();
  const std::string padded = absl::StrCat(R"({"prompt": "x",)", std::string(9000, ' '),
                                          R"("max_tokens": 2, "temperature": 0})");
  const HttpReply form = HttpRawExchange(
      port, absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                         "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: ",
                         padded.size(), "\r\n\r\n", padded));
  EXPECT_EQ(form.status, 200) << form.body << form.error;
  EXPECT_EQ(Parse(form.body)["usage"]["completion_tokens"], 2) << form.body;
}

TEST_F(HttpServerTest, ApiKeyIsRequiredOnV1Only) {
  ServerOptions options;
  options.api_key = "sk-test-123";
  RunningServer server(engine(), options);
  const int port = server.port();
  const std::string body = R"({"prompt": "x", "max_tokens": 2})";
  EXPECT_TRUE(absl::StrContains(ExpectError(HttpPost(port, "/v1/completions", body), 401),
                                "missing API key"));
  EXPECT_TRUE(absl::StrContains(
      ExpectError(HttpPost(port, "/v1/completions", body, "sk-test-124"), 401), "incorrect"));
  ExpectError(HttpPost(port, "/v1/completions", body, "sk-test-12"), 401);
  ExpectError(HttpGet(port, "/v1/models", "sk-test-1234"), 401);
  EXPECT_EQ(HttpPost(port, "/v1/completions", body, "sk-test-123").status, 200);
  EXPECT_EQ(HttpGet(port, "/v1/models", "sk-test-123").status, 200);
  EXPECT_EQ(HttpGet(port, "/health").status, 200);
  EXPECT_EQ(HttpGet(port, "/metrics").status, 200);
}

// Thread counts the machine cannot start are refused when the server is made (before, Run
// ended with the thread library's "Resource temporarily unavailable").
TEST_F(HttpServerTest, ImpossibleThreadCountsAreRefusedAtCreate) {
  for (const auto& [threads, most] : std::vector<std::pair<int, int>>{
           {100000000, 1024}, {-1, 1024}, {8, 0}, {8, kMostHttpThreads + 1}}) {
    ServerOptions options;
    options.port = 0;
    options.http_threads = threads;
    options.max_http_threads = most;
    const absl::Status status = HttpServer::Create(engine(), options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << threads << " " << most;
    EXPECT_TRUE(absl::StrContains(status.message(), "ServerOptions.http_threads")) << status;
  }
}

TEST_F(HttpServerTest, SlowClientsDoNotHoldTheServer) {
  // Four kept threads; forty clients that trickle in headers or a body hold one each for the
  // read timeout (30 s). The server starts threads for the rest: /health answers at once.
  ServerOptions options;
  options.http_threads = 4;
  RunningServer server(LoadEngine(), options);
  const int port = server.port();
  std::vector<int> slow;
  for (int i = 0; i < 40; ++i) {
    slow.push_back(SendOnNewConnection(
        port, i % 2 == 0 ? "GET /health HTTP/1.1\r\nHost: x\r\n"
                         : "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                           "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"));
    ASSERT_GE(slow.back(), 0);
  }
  const HttpReply health =
      HttpRawExchange(port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                      /*timeout_s=*/5);
  EXPECT_EQ(health.status, 200) << health.error;
  const HttpReply completion = HttpPost(
      port, "/v1/completions", R"({"prompt": "And God said", "max_tokens": 4, "temperature": 0})");
  EXPECT_EQ(completion.status, 200) << completion.body;
  for (const int fd : slow) ::close(fd);
}

TEST_F(HttpServerTest, FullQueueIs429WithRetryAfter) {
  SchedulerOptions serving;
  serving.max_running = 1;
  serving.max_waiting = 1;
  RunningServer server(LoadEngine(serving));
  const int port = server.port();
  const std::string long_request = absl::StrCat(R"({"prompt": "And God said", )", kLongReply, "}");
  bool saw_429 = false;
  // The queue is full only while the first request runs: try a few times on a busy machine.
  for (int attempt = 0; attempt < 3 && !saw_429; ++attempt) {
    std::promise<void> started;
    std::future<void> first_token = started.get_future();
    bool signalled = false;
    std::thread running([&] {
      HttpPostStream(
          port, "/v1/completions",
          absl::StrCat(R"({"prompt": "And God said", "stream": true, )", kLongReply, "}"),
          [&](const std::string&) {
            if (!signalled) started.set_value();
            signalled = true;
            return true;
          });
      if (!signalled) started.set_value();
    });
    first_token.wait();
    std::thread waiting([&] { HttpPost(port, "/v1/completions", long_request); });
    for (int i = 0; i < 200; ++i) {
      if (MetricValue(HttpGet(port, "/metrics").body, "lgpt_requests_waiting") >= 1) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    const HttpReply third = HttpPost(port, "/v1/completions", long_request);
    if (third.status == 429) {
      saw_429 = true;
      EXPECT_EQ(third.retry_after, "1");
      EXPECT_TRUE(absl::StrContains(third.body, "rate_limit_exceeded")) << third.body;
    }
    running.join();
    waiting.join();
  }
  EXPECT_TRUE(saw_429);
}

// After a client left its one /v1/completions request: the request was cancelled, not
// completed, its KV blocks are free, the metrics say "cancelled", and the server goes on.
void ExpectOneCancelledCompletion(int port) {
  std::string metrics;
  for (int i = 0; i < 500; ++i) {
    metrics = HttpGet(port, "/metrics").body;
    if (MetricValue(metrics, "lgpt_scheduler_requests_cancelled_total") == 1 &&
        MetricValue(metrics, "lgpt_requests_running") == 0 &&
        absl::StrContains(metrics, "status=\"cancelled\"")) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(MetricValue(metrics, "lgpt_scheduler_requests_cancelled_total"), 1) << metrics;
  EXPECT_EQ(MetricValue(metrics, "lgpt_scheduler_requests_completed_total"), 0) << metrics;
  EXPECT_EQ(MetricValue(metrics, "lgpt_requests_running"), 0) << metrics;
  EXPECT_EQ(MetricValue(metrics, "lgpt_kv_blocks_used"), 0) << metrics;
  EXPECT_EQ(
      MetricValue(metrics,
                  "lgpt_http_requests_total{endpoint=\"/v1/completions\",status=\"cancelled\"}"),
      1)
      << metrics;
  EXPECT_EQ(HttpPost(port, "/v1/completions", R"({"prompt": "x", "max_tokens": 2})").status, 200);
}

TEST_F(HttpServerTest, ClientLeavingMidStreamCancelsItsRequest) {
  SchedulerOptions serving;
  serving.kv_pool_bytes = 8 << 20;
  RunningServer server(LoadEngine(serving));
  const int port = server.port();
  int events = 0;
  const StreamReply stream = HttpPostStream(
      port, "/v1/completions",
      absl::StrCat(R"({"prompt": "And God said", "stream": true, )", kLongReply, "}"),
      [&](const std::string&) { return ++events < 3; });
  EXPECT_EQ(stream.status, 200);
  EXPECT_EQ(events, 3);
  ExpectOneCancelledCompletion(port);
}

TEST_F(HttpServerTest, ClientLeavingAWholeReplyCancelsItsRequest) {
  SchedulerOptions serving;
  serving.kv_pool_bytes = 8 << 20;
  RunningServer server(LoadEngine(serving));
  const int port = server.port();
  const std::string body = absl::StrCat(R"({"prompt": "And God said", )", kLongReply, "}");
  const int client = SendOnNewConnection(
      port, absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                         "application/json\r\nContent-Length: ",
                         body.size(), "\r\n\r\n", body));
  ASSERT_GE(client, 0);
  std::string metrics;
  for (int i = 0; i < 500 && MetricValue(metrics, "lgpt_requests_running") < 1; ++i) {
    metrics = HttpGet(port, "/metrics").body;
  }
  ::close(client);  // while its 240 tokens are being generated
  ExpectOneCancelledCompletion(port);
}

TEST_F(HttpServerTest, ShutdownLetsStreamsFinishThenRefuses) {
  RunningServer server(engine());
  const int port = server.port();
  std::promise<void> started;
  std::future<void> first_token = started.get_future();
  bool signalled = false;
  StreamReply reply;
  std::thread client([&] {
    reply = HttpPostStream(
        port, "/v1/completions",
        absl::StrCat(R"({"prompt": "And God said", "stream": true, )", kLongReply, "}"),
        [&](const std::string&) {
          if (!signalled) started.set_value();
          signalled = true;
          return true;
        });
    if (!signalled) started.set_value();
  });
  first_token.wait();
  server.server().Shutdown();
  client.join();
  server.Stop();
  EXPECT_EQ(reply.status, 200);
  ASSERT_FALSE(reply.events.empty());
  EXPECT_EQ(reply.events.back(), "[DONE]");
  EXPECT_EQ(StreamedFinishReason(reply.events), "length");
  EXPECT_EQ(HttpGet(port, "/health").status, -1);  // nothing listens any more
}

TEST_F(HttpServerTest, ShutdownDeadlineCancelsWhatStillRuns) {
  ServerOptions options;
  options.shutdown_s = 0;
  RunningServer server(engine(), options);
  const int port = server.port();
  std::promise<void> started;
  std::future<void> first_token = started.get_future();
  bool signalled = false;
  StreamReply reply;
  std::thread client([&] {
    reply = HttpPostStream(
        port, "/v1/completions",
        absl::StrCat(R"({"prompt": "And God said", "stream": true, )", kLongReply, "}"),
        [&](const std::string&) {
          if (!signalled) started.set_value();
          signalled = true;
          return true;
        });
    if (!signalled) started.set_value();
  });
  first_token.wait();
  server.Stop();
  client.join();
  ASSERT_FALSE(reply.events.empty());
  EXPECT_EQ(reply.events.back(), "[DONE]");
  EXPECT_TRUE(absl::StrContains(reply.events[reply.events.size() - 2], "shut down"))
      << reply.events[reply.events.size() - 2];
}

}  // namespace
}  // namespace lgpt
