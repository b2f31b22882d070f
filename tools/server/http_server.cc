#include "tools/server/http_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "core/constrain/grammar.h"
#include "core/constrain/json_schema.h"
#include "core/constrain/matcher.h"
#include "core/constrain/regex.h"
#include "core/serving/grammar_constraint.h"
#include "core/text/chat_template.h"
#include "core/text/prompt_style.h"
#include "core/text/tool_call_stream.h"
#include "core/text/tool_calls.h"
#include "httplib.h"
#include "tools/server/bounded_connection.h"
#include "tools/server/chat_prompt.h"
#include "tools/server/connection_pool.h"
#include "tools/server/metrics.h"
#include "tools/server/openai_api.h"

namespace lgpt {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kJson[] = "application/json";
// Exactly this type: cpp-httplib never compresses it, so every event leaves at once.
constexpr char kEventStream[] = "text/event-stream";

// What the access log and the request metrics learn of one request. The handler, the stream
// and the logger of a request all run on the same worker thread.
struct AccessRecord {
  Clock::time_point start;
  bool started = false;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  std::string outcome;  // overrides the HTTP status in logs and metrics ("cancelled")
};
thread_local AccessRecord t_access;

// Time depends on the secret's length only, never on where the strings differ.
bool ConstantTimeEquals(absl::string_view given, absl::string_view secret) {
  volatile unsigned char diff = given.size() != secret.size();
  for (size_t i = 0; i < secret.size(); ++i) {
    const unsigned char a = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff = diff | (a ^ static_cast<unsigned char>(secret[i]));
  }
  return diff == 0;
}

std::string EndpointLabel(const std::string& path) {
  static const char* const kPaths[] = {
      "/v1/completions", "/v1/chat/completions", "/v1/models",    "/health", "/metrics",
      "/tokenize",       "/detokenize",          "/v1/embeddings"};
  for (const char* known : kPaths) {
    if (path == known) return known;
  }
  if (absl::StartsWith(path, "/v1/models/")) return "/v1/models/{id}";
  return "other";
}

// The methods a known path answers ("GET", "POST"), empty for an unknown path.
std::string AllowedMethods(const std::string& path) {
  const std::string endpoint = EndpointLabel(path);
  if (endpoint == "other") return "";
  return absl::StartsWith(endpoint, "/v1/models") || endpoint == "/health" || endpoint == "/metrics"
             ? "GET"
             : "POST";
}

// The body comes in chunked transfer encoding.
bool IsChunked(const httplib::Request& req) {
  return absl::StrContains(absl::AsciiStrToLower(req.get_header_value("Transfer-Encoding")),
                           "chunked");
}

// A request that says it has a body (POST, PUT, PATCH) without Content-Length or chunked
// transfer encoding: cpp-httplib would read its body until the client closes the connection.
bool BodyWithoutLength(const httplib::Request& req) {
  if (req.method != "POST" && req.method != "PUT" && req.method != "PATCH") return false;
  return !req.has_header("Content-Length") && !IsChunked(req);
}

// The request is one of the routes that read a body (the POST routes).
bool ReadsBody(const httplib::Request& req) {
  return req.method == "POST" && AllowedMethods(req.path) == "POST";
}

// The request announces a body: a Content-Length above 0, or chunked transfer encoding.
bool AnnouncesBody(const httplib::Request& req) {
  return (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0") ||
         IsChunked(req);
}

// Content-Length as a number of bytes; nullopt unless it is 1 to 18 decimal digits (no sign,
// no space: cpp-httplib reads "-1" as 2^64 - 1 and then waits for that many bytes).
std::optional<int64_t> ContentLength(const std::string& value) {
  if (value.empty() || value.size() > 18 ||
      !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::strtoll(value.c_str(), nullptr, 10);
}

// Content-Encoding values a body may have: none, or one that cpp-httplib inflates.
bool KnownContentEncoding(const std::string& encoding) {
  return encoding.empty() || encoding == "identity" || encoding == "gzip" ||
         encoding == "deflate" || encoding == "br";
}

void SendError(httplib::Response& res, const ApiError& error) {
  res.status = error.http_status;
  res.set_content(error.Json(), kJson);
  if (error.http_status == 429) res.set_header("Retry-After", "1");
}

void SendStatus(httplib::Response& res, const absl::Status& status) {
  SendError(res, ApiErrorFromStatus(status));
}

// A piece of one choice's text, with the log-probabilities of the tokens it completes.
struct ChoiceEvent {
  int64_t index = 0;
  std::string text;
  std::vector<TokenLogprob> logprobs;
};

// The choices' pieces from the scheduler's thread to the worker thread that streams them.
struct StreamQueue {
  std::mutex mutex;
  std::condition_variable ready;
  std::deque<ChoiceEvent> events;

  // Always true: a client that leaves cancels its requests through Request::Cancel, so that
  // the scheduler counts them as cancelled.
  bool Push(ChoiceEvent event) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      events.push_back(std::move(event));
    }
    ready.notify_one();
    return true;
  }
  std::deque<ChoiceEvent> Take(std::chrono::milliseconds wait) {
    std::unique_lock<std::mutex> lock(mutex);
    ready.wait_for(lock, wait, [this] { return !events.empty(); });
    std::deque<ChoiceEvent> taken;
    taken.swap(events);
    return taken;
  }
};

// One choice of a request: its index in the response, its prompt, its scheduler request, and
// (streaming) the log-probabilities of tokens whose text has not been sent yet.
struct Choice {
  int64_t index = 0;
  size_t prompt = 0;
  std::shared_ptr<Request> request;
  std::shared_ptr<std::vector<TokenLogprob>> pending =
      std::make_shared<std::vector<TokenLogprob>>();
  // A streamed reply read for tool calls: its content goes out until a call may start.
  std::shared_ptr<ToolCallStream> tool_stream;
};

// Waits until `request` is done; cancels it and returns false if the client hangs up first. A
// whole (non-streamed) reply writes nothing before the end, so no failed write would tell.
// A client that shuts down its sending side while waiting counts as gone.
bool WaitWhileConnected(Request& request, int socket) {
  if (socket < 0) return true;
  pollfd connection{socket, POLLRDHUP, 0};
  while (!request.Done()) {
    connection.revents = 0;
    if (poll(&connection, 1, 50) > 0 &&
        (connection.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
      request.Cancel();
      return false;
    }
  }
  return true;
}

// A finished choice's speculative decoding into the request's usage (set when it speculated).
void AddSpeculativeUsage(const Completion& completion, Usage& usage) {
  if (!usage.speculative) return;
  usage.speculative->proposed_tokens += completion.stats.proposed_tokens;
  usage.speculative->accepted_tokens += completion.stats.accepted_tokens;
  usage.speculative->verify_steps += completion.stats.verify_steps;
}

// vLLM's truncate_prompt_tokens: the last `keep` tokens stay.
void KeepLastTokens(std::optional<int64_t> keep, std::vector<int64_t>& ids) {
  if (keep && static_cast<int64_t>(ids.size()) > *keep) ids.erase(ids.begin(), ids.end() - *keep);
}

// A request ready for Engine::SubmitChoices: its prompts' ids and options (max_new_tokens
// differs by prompt length).
struct Prepared {
  ApiRequest api;
  std::vector<std::vector<int64_t>> prompts;
  std::vector<RequestOptions> options;  // one per prompt
  ResponseHeader header;

  int64_t PromptTokens() const {
    int64_t tokens = 0;
    for (const std::vector<int64_t>& prompt : prompts) tokens += prompt.size();
    return tokens;
  }

  // The usage before any choice is counted: the prompts' tokens, and the speculative
  // statistics' zeros when the request decodes speculatively.
  Usage EmptyUsage() const {
    Usage usage;
    usage.prompt_tokens = PromptTokens();
    if (api.options.speculative.enabled()) usage.speculative = SpeculativeUsage();
    return usage;
  }
};

}  // namespace

absl::Status CheckServerSpeculation(const SpeculativeSpec& spec, const Engine& engine) {
  RETURN_IF_ERROR(ValidateSpeculativeSpec(spec));
  if (spec.method == "draft" && engine.draft_model() == nullptr) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "SpeculativeSpec.method",
                      "SpeculativeSpec.method=draft needs a draft model, and the engine has none "
                      "(EngineOptions.draft_checkpoint_dir)",
                      {"EngineOptions.draft_checkpoint_dir"});
  }
  return absl::OkStatus();
}

struct HttpServer::Impl {
  std::shared_ptr<const Engine> engine;
  ServerOptions options;
  std::string model_id;
  int64_t created = 0;
  // How chat messages become a prompt (the checkpoint's chat template, else its prompt style)
  // and the stop tokens of its turns; set when the engine has a tokenizer.
  std::optional<ChatRenderer> chat;
  std::vector<std::vector<int64_t>> chat_stops;
  BoundedServer server;
  int port = 0;
  int listen_socket = -1;
  // The Unix socket file bound (device and inode): the destructor removes it if still there.
  std::optional<std::pair<dev_t, ino_t>> socket_file;
  ServerMetrics metrics;

  std::mutex mutex;  // guards what follows
  std::condition_variable idle;
  std::map<uint64_t, std::shared_ptr<Request>> active;
  uint64_t next_active = 0;
  bool stopping = false;
  std::thread shutdown_thread;
  std::mt19937_64 random{std::random_device{}()};
  std::atomic<bool> run_done{false};
  // Constrained decoding's state: vocabularies (end tokens without and with the chat stops)
  // and the matchers of grammars seen, at most kCachedGrammars (then the cache starts over).
  std::mutex constrain_mutex;
  std::shared_ptr<const TokenVocabulary> vocabularies[2];
  std::map<std::string, GrammarMatcher> matchers[2];
  std::atomic<bool> destroying{false};

  // The prompt style, the thread pool, limits and routes; binds.
  absl::Status Init();
  void Route();
  // Before routing: starts the request's access record; the API key on /v1/.
  httplib::Server::HandlerResponse PreRoute(const httplib::Request& req, httplib::Response& res);
  // Answers at once (true) a request whose body is not to be read: no length, a path that takes
  // none, a malformed or too large Content-Length, an unknown Content-Encoding. Otherwise sets
  // the body's budget on the wire.
  bool RefuseBody(const httplib::Request& req, httplib::Response& res) const;
  // After the last byte: the access-log line and the request metrics.
  void Log(const httplib::Request& req, const httplib::Response& res);
  // POST /tokenize and /detokenize (vLLM's).
  void Tokenize(const std::string& body, httplib::Response& res);
  void Detokenize(const std::string& body, httplib::Response& res);
  // POST /v1/embeddings: pooled final hidden states (Engine::Embed), batched.
  void Embeddings(const std::string& body, httplib::Response& res);
  // A request naming a model this server does not serve: NotFound.
  // A request naming a model this server does not serve: NotFound; an adapter's name
  // (EngineOptions.adapters) is one where `adapters` (generation, tokenizing).
  absl::Status CheckModel(const std::string& model, bool adapters = true) const;
  // CORS (ServerOptions.cors_allow_origin): the allow-origin header on every answer to an
  // allowed origin; a preflight OPTIONS request answered here (true).
  bool Cors(const httplib::Request& req, httplib::Response& res) const;
  // POST /v1/completions and /v1/chat/completions: parse, submit, reply or stream.
  void Generate(ApiEndpoint endpoint, const httplib::Request& req, const std::string& body,
                httplib::Response& res);
  // The request's prompts' ids, options and response header; errors as API errors.
  absl::StatusOr<Prepared> Prepare(ApiEndpoint endpoint, const std::string& body);
  absl::StatusOr<std::vector<std::vector<int64_t>>> PromptIds(ApiRequest& api);
  // Completions' prompts or embeddings' inputs (`name`): given ids, or text encoded as the
  // engine encodes it; errors name name or name[i].
  absl::StatusOr<std::vector<std::vector<int64_t>>> InputIds(const std::vector<PromptInput>& inputs,
                                                             const std::string& name) const;
  // max_new_tokens of a prompt of `prompt_tokens`: max_tokens, or what is left of the context.
  absl::StatusOr<int64_t> MaxNewTokens(const ApiRequest& api, int64_t prompt_tokens) const;
  // Submits every prompt's n choices (streaming: each choice's pieces into `queue`); on an
  // error none stays submitted.
  absl::StatusOr<std::vector<Choice>> SubmitAll(const Prepared& prepared,
                                                const std::shared_ptr<StreamQueue>& queue);
  // A whole reply; a client that hangs up first cancels the requests.
  void Reply(const Prepared& prepared, const std::vector<Choice>& choices, int socket,
             httplib::Response& res);
  // Writes the events of a streamed request as its pieces arrive; false when the client left
  // (the requests are cancelled).
  bool Stream(const Prepared& prepared, const std::vector<Choice>& choices, StreamQueue& queue,
              httplib::DataSink& sink);
  // Constrained decoding: the request's output format (response_format, guided_*) or its
  // forced tool call (tool_choice required or named) as a TokenConstraint; null for none.
  absl::StatusOr<std::shared_ptr<TokenConstraint>> OutputConstraint(const ApiRequest& api);
  // The GBNF of a forced call to the request's named tool, or to any of its tools, in the
  // checkpoint's tool-call format.
  absl::StatusOr<std::string> ForcedToolCallGbnf(const ApiRequest& api) const;
  // A matcher for the grammar `key` names (compiled by `compile` the first time; later
  // requests fork it and find its tables filled), over the vocabulary whose end tokens are
  // EOS (and, `chat`, the chat format's end-of-turn tokens).
  absl::StatusOr<GrammarMatcher> MatcherFor(
      const std::string& key, bool chat,
      const std::function<absl::StatusOr<std::shared_ptr<const Grammar>>()>& compile);
  // A finished choice as the response shows it: its text, or (tools offered and a call in
  // the reply) its content and tool calls with finish_reason "tool_calls".
  ChoiceJson FinishedChoice(const Prepared& prepared, const Choice& choice,
                            const Completion& completion, int64_t text_offset);
  // A choice's logprobs object in the endpoint's shape (null when none were asked).
  nlohmann::json LogprobsJson(const Prepared& prepared, const std::vector<TokenLogprob>& logprobs,
                              int64_t text_offset) const;
  // Tokens and latencies of a finished request into the metrics and the access log.
  void Account(const Request& request, const Completion& completion);
  // Requests in flight, for the shutdown deadline.
  uint64_t Track(std::shared_ptr<Request> request);
  void Untrack(uint64_t key);
  uint64_t Random();
  void Shutdown();
  // Stops accepting, waits for the requests in flight up to shutdown_s, cancels the rest.
  void ShutdownSequence();
};

absl::Status HttpServer::Impl::Init() {
  // Threads start eagerly up to http_threads: an impossible count would end Run with the
  // thread library's error long after Create said yes.
  if (options.max_http_threads < 1 || options.max_http_threads > kMostHttpThreads ||
      options.http_threads < 0 || options.http_threads > options.max_http_threads) {
    return absl::InvalidArgumentError(
        absl::StrCat("ServerOptions.http_threads (", options.http_threads,
                     ") must lie in [0, ServerOptions.max_http_threads], and max_http_threads (",
                     options.max_http_threads, ") in [1, ", kMostHttpThreads, "]"));
  }
  if (options.max_body_bytes < 1 || options.max_body_bytes > kMostBodyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("ServerOptions.max_body_bytes (",
                                                   options.max_body_bytes, ") must lie in [1, ",
                                                   kMostBodyBytes, "]"));
  }
  RETURN_IF_ERROR(CheckServerSpeculation(options.speculative, *engine));
  model_id = options.model_id.empty() ? engine->config().name : options.model_id;
  created = static_cast<int64_t>(std::time(nullptr));
  if (const Tokenizer* tokenizer = engine->tokenizer()) {
    ASSIGN_OR_RETURN(PromptStyle style,
                     options.prompt_style.empty()
                         ? PromptStyleForCheckpoint(engine->checkpoint_dir(), engine->config())
                         : PromptStyleFromName(options.prompt_style));
    // The checkpoint's chat template, unless a prompt style was asked for by name.
    std::optional<ChatTemplate> chat_template;
    if (options.prompt_style.empty()) {
      absl::StatusOr<ChatTemplate> loaded = ChatTemplate::Load(engine->checkpoint_dir());
      if (loaded.ok()) {
        chat_template = *std::move(loaded);
      } else if (!absl::IsNotFound(loaded.status())) {
        std::fprintf(stderr,
                     "serve: the checkpoint's chat template is not usable (%s); chat "
                     "uses the %s prompt style\n",
                     std::string(loaded.status().message()).c_str(), style.name().c_str());
      }
    }
    chat.emplace(std::move(chat_template), style);
    chat_stops = style.StopTokenIds(tokenizer->eos_id(),
                                    [tokenizer](absl::string_view token) -> std::optional<int64_t> {
                                      absl::StatusOr<int64_t> id = tokenizer->TokenToId(token);
                                      return id.ok() ? std::optional<int64_t>(*id) : std::nullopt;
                                    });
  }
  const int threads = std::max(4, options.http_threads);
  const int most = std::max(threads, options.max_http_threads);
  server.new_task_queue = [threads, most] {
    return new ConnectionPool(threads, most, std::chrono::seconds(30));
  };
  server.set_payload_max_length(static_cast<size_t>(options.max_body_bytes));
  // curl asks before sending a body over 1 MiB: one over the limit is refused before it is sent.
  server.set_expect_100_continue_handler(
      [this](const httplib::Request& req, httplib::Response& res) {
        const std::optional<int64_t> length = ContentLength(req.get_header_value("Content-Length"));
        if (!length || *length <= options.max_body_bytes) return 100;
        BoundedServer::CloseAfterResponse();
        res.set_header("Connection", "close");
        return res.status = 413;
      });
  server.set_keep_alive_max_count(1000);
  server.set_keep_alive_timeout(5);
  // cpp-httplib listens with a backlog of 5: a burst of new connections overflows it, and a
  // connection whose first packets were dropped there may reach its worker after the
  // keep-alive timeout and be closed unanswered. The socket is listened on again, deeper.
  // SO_REUSEADDR alone (a port left in TIME_WAIT binds at once): cpp-httplib's default adds
  // SO_REUSEPORT, with which a second server of the same user binds a port in use and takes
  // half its connections instead of being refused.
  server.set_socket_options([this](int socket) {
    const int yes = 1;
    ::setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_socket = socket;
  });
  server.set_read_timeout(30, 0);
  server.set_write_timeout(10, 0);
  Route();
  if (!options.unix_socket.empty()) {
    // cpp-httplib takes the path as the host; the port means nothing to a Unix socket.
    server.set_address_family(AF_UNIX);
    if (!server.bind_to_port(options.unix_socket, 80)) {
      return absl::UnavailableError(absl::StrCat("cannot listen on the Unix socket ",
                                                 options.unix_socket, ": ", std::strerror(errno)));
    }
    struct stat bound {};
    if (::stat(options.unix_socket.c_str(), &bound) == 0) {
      socket_file = std::make_pair(bound.st_dev, bound.st_ino);
    }
  } else {
    port = options.port == 0
               ? server.bind_to_any_port(options.host)
               : (server.bind_to_port(options.host, options.port) ? options.port : -1);
    if (port <= 0) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", options.host, ":",
                                                 options.port,
                                                 " (in use, or not an address here)"));
    }
  }
  if (listen_socket >= 0 && ::listen(listen_socket, SOMAXCONN) != 0) {
    return absl::InternalError(absl::StrCat("listen: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

void HttpServer::Impl::Route() {
  server.set_pre_routing_handler(
      [this](const httplib::Request& req, httplib::Response& res) { return PreRoute(req, res); });
  server.set_logger(
      [this](const httplib::Request& req, const httplib::Response& res) { Log(req, res); });
  server.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        ApiError error = ApiErrorFromStatus(absl::InvalidArgumentError("malformed HTTP request"));
        error.http_status = res.status;
        const std::string allowed = AllowedMethods(req.path);
        // A known path asked with the method it takes but still unrouted (a path no route
        // pattern matches) is a 404, not "takes GET, not GET".
        if (res.status == 404 && !allowed.empty() && req.method != allowed &&
            !(allowed == "GET" && req.method == "HEAD")) {
          res.status = error.http_status = 405;
          res.set_header("Allow", allowed);
          error.message = absl::StrCat(req.path, " takes ", allowed, ", not ", req.method);
          error.code = "method_not_allowed";
        } else if (res.status == 404) {
          error.message = absl::StrCat("no route for ", req.method, " ", req.path);
          error.code = "not_found";
        } else if (res.status == 413) {
          error.message = absl::StrCat("the request body exceeds ", options.max_body_bytes,
                                       " bytes (--max_body_bytes)");
          error.code = "request_too_large";
        } else if (res.status == 400 && BoundedServer::HeadTooLarge()) {
          BoundedServer::CloseAfterResponse();  // the rest of the head stays unread
          res.set_header("Connection", "close");
          res.status = error.http_status = 431;
          error.message =
              absl::StrCat("the request line and headers exceed ", kMaxRequestHeadBytes, " bytes");
          error.code = "request_header_fields_too_large";
        } else if (res.status >= 500) {
          error.type = "server_error";
          error.message = "internal error";
        }
        res.set_content(error.Json(), kJson);
        return httplib::Server::HandlerResponse::Handled;
      }));
  server.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr error) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        SendStatus(res, absl::InternalError(what));
      });
  server.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mutex);
    res.status = stopping ? 503 : 200;
    res.set_content(stopping ? R"({"status":"shutting_down"})" : R"({"status":"ok"})", kJson);
  });
  server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.Render(engine->ServingStats()), "text/plain; version=0.0.4");
  });
  server.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(ModelsJson(model_id, engine->adapter_names(), created), kJson);
  });
  // [\s\S]: any byte, where `.` stops at a (percent-decoded) CR or LF in the id.
  server.Get(
      R"(/v1/models/([\s\S]+))", [this](const httplib::Request& req, httplib::Response& res) {
        const std::string id = req.matches[1];
        const std::vector<std::string>& adapters = engine->adapter_names();
        const bool adapter = std::find(adapters.begin(), adapters.end(), id) != adapters.end();
        if (id != model_id && !adapter) {
          SendStatus(res, absl::NotFoundError(absl::StrCat("the model '", id, "' does not exist")));
          return;
        }
        res.set_content(ModelJson(id, created, adapter ? model_id : ""), kJson);
      });
  // The bodies are read through a content reader: cpp-httplib parses a body it reads itself as
  // a form when its Content-Type says so (curl -d's default) and refuses such a body over
  // 8 KiB with a 413, whatever --max_body_bytes says. JSON is JSON whatever the header says.
  using BodyHandler =
      std::function<void(const httplib::Request&, const std::string& body, httplib::Response&)>;
  const auto post = [this](BodyHandler handle) {
    return [this, handle](const httplib::Request& req, httplib::Response& res,
                          const httplib::ContentReader& reader) {
      // Counted as it arrives, after inflation (cpp-httplib inflates 16 KiB at a time and
      // stops when this returns false).
      std::string body;
      bool too_large = false;
      if (!reader([&](const char* data, size_t size) {
            too_large = static_cast<int64_t>(body.size() + size) > options.max_body_bytes;
            if (!too_large) body.append(data, size);
            return !too_large;
          })) {
        res.status = too_large || BoundedServer::BodyOverBudget() ? 413 : 400;
        res.set_header("Connection", "close");
        BoundedServer::CloseAfterResponse();  // the rest of the body stays unread
        return;                               // the error handler writes the reply
      }
      handle(req, body, res);
    };
  };
  const auto generate = [this](ApiEndpoint endpoint) -> BodyHandler {
    return [this, endpoint](const httplib::Request& req, const std::string& body,
                            httplib::Response& res) { Generate(endpoint, req, body, res); };
  };
  server.Post("/v1/completions", post(generate(ApiEndpoint::kCompletions)));
  server.Post("/v1/chat/completions", post(generate(ApiEndpoint::kChat)));
  server.Post("/v1/embeddings", post([this](const httplib::Request&, const std::string& body,
                                            httplib::Response& res) { Embeddings(body, res); }));
  server.Post("/tokenize", post([this](const httplib::Request&, const std::string& body,
                                       httplib::Response& res) { Tokenize(body, res); }));
  server.Post("/detokenize", post([this](const httplib::Request&, const std::string& body,
                                         httplib::Response& res) { Detokenize(body, res); }));
}

httplib::Server::HandlerResponse HttpServer::Impl::PreRoute(const httplib::Request& req,
                                                            httplib::Response& res) {
  t_access = AccessRecord();
  t_access.start = Clock::now();
  t_access.started = true;
  // cpp-httplib applies a Range header to every response, a POST's included: a completion
  // would come back as 206 with a slice of its JSON. Ranges mean nothing here (RFC 9110 lets
  // a server ignore them), so they are dropped. The request is cpp-httplib's own non-const
  // object, handed to this hook as const.
  const_cast<httplib::Request&>(req).ranges.clear();
  if (RefuseBody(req, res)) {
    res.set_header("Connection", "close");
    BoundedServer::CloseAfterResponse();  // the body stays unread
    return httplib::Server::HandlerResponse::Handled;
  }
  if (Cors(req, res)) return httplib::Server::HandlerResponse::Handled;
  if (options.api_key.empty() || !absl::StartsWith(req.path, "/v1/")) {
    return httplib::Server::HandlerResponse::Unhandled;
  }
  const std::string header = req.get_header_value("Authorization");
  const bool bearer = absl::StartsWith(header, "Bearer ");
  const absl::string_view given = bearer ? absl::string_view(header).substr(7) : "";
  if (bearer && ConstantTimeEquals(given, options.api_key)) {
    return httplib::Server::HandlerResponse::Unhandled;
  }
  SendStatus(
      res, absl::UnauthenticatedError(
               bearer ? "incorrect API key" : "missing API key: send 'Authorization: Bearer KEY'"));
  res.set_header("WWW-Authenticate", "Bearer");
  return httplib::Server::HandlerResponse::Handled;
}

bool HttpServer::Impl::Cors(const httplib::Request& req, httplib::Response& res) const {
  const std::string& allowed = options.cors_allow_origin;
  const std::string origin = req.get_header_value("Origin");
  if (allowed.empty() || origin.empty() || (allowed != "*" && origin != allowed)) return false;
  res.set_header("Access-Control-Allow-Origin", allowed == "*" ? "*" : origin);
  if (allowed != "*") res.set_header("Vary", "Origin");
  if (req.method != "OPTIONS" || !req.has_header("Access-Control-Request-Method")) return false;
  res.status = 204;
  res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
  const std::string headers = req.get_header_value("Access-Control-Request-Headers");
  res.set_header("Access-Control-Allow-Headers",
                 headers.empty() ? "Authorization, Content-Type" : headers.substr(0, 1024));
  res.set_header("Access-Control-Max-Age", "600");
  return true;
}

absl::Status HttpServer::Impl::CheckModel(const std::string& model, bool adapters) const {
  if (model.empty() || model == model_id) return absl::OkStatus();
  const std::vector<std::string>& names = engine->adapter_names();
  if (std::find(names.begin(), names.end(), model) != names.end()) {
    if (adapters) return absl::OkStatus();
    return InvalidFieldError("model", absl::StrCat("'", model,
                                                   "' is a LoRA adapter; this "
                                                   "endpoint serves the base model '",
                                                   model_id, "'"));
  }
  return absl::NotFoundError(
      absl::StrCat("the model '", model, "' does not exist; this server serves '", model_id, "'"));
}

void HttpServer::Impl::Tokenize(const std::string& body, httplib::Response& res) {
  absl::StatusOr<TokenizeRequest> request = ParseTokenizeRequest(body);
  absl::Status status = request.ok() ? CheckModel(request->model) : request.status();
  if (status.ok() && !engine->tokenizer()) {
    status = absl::FailedPreconditionError("the model has no tokenizer");
  }
  if (!status.ok()) return SendStatus(res, status);
  absl::StatusOr<std::vector<int64_t>> ids;
  if (request->prompt) {
    ids = engine->tokenizer()->Encode(*request->prompt, request->add_special_tokens);
  } else {
    absl::StatusOr<std::string> text =
        chat->Render(request->messages, request->message_json, nullptr);
    // A template's text carries its own special tokens.
    const bool bos = request->add_special_tokens && !chat->has_template();
    ids = text.ok() ? engine->tokenizer()->Encode(*text, bos) : text.status();
  }
  if (!ids.ok()) return SendStatus(res, ids.status());
  res.set_content(TokenizeJson(*ids, engine->config().block_size), kJson);
}

void HttpServer::Impl::Detokenize(const std::string& body, httplib::Response& res) {
  absl::StatusOr<DetokenizeRequest> request = ParseDetokenizeRequest(body);
  absl::Status status = request.ok() ? CheckModel(request->model) : request.status();
  if (status.ok() && !engine->tokenizer()) {
    status = absl::FailedPreconditionError("the model has no tokenizer");
  }
  if (!status.ok()) return SendStatus(res, status);
  absl::StatusOr<std::string> text = engine->tokenizer()->Decode(request->tokens);
  if (!text.ok()) return SendStatus(res, WithFields(text.status(), FieldRef("tokens")));
  res.set_content(DetokenizeJson(*text), kJson);
}

void HttpServer::Impl::Embeddings(const std::string& body, httplib::Response& res) {
  absl::StatusOr<EmbeddingsRequest> request = ParseEmbeddingsRequest(body);
  absl::Status status =
      request.ok() ? CheckModel(request->model, /*adapters=*/false) : request.status();
  const int64_t width = engine->config().n_embd;
  if (status.ok() && request->dimensions && *request->dimensions != width) {
    status = InvalidFieldError("dimensions", absl::StrCat("'dimensions' can only be the model's "
                                                          "own, ",
                                                          width, ", got ", *request->dimensions));
  }
  if (!status.ok()) return SendStatus(res, status);
  absl::StatusOr<std::vector<std::vector<int64_t>>> encoded = InputIds(request->inputs, "input");
  if (!encoded.ok()) return SendStatus(res, encoded.status());
  std::vector<std::vector<int64_t>>& inputs = *encoded;
  for (std::vector<int64_t>& ids : inputs) {
    KeepLastTokens(request->truncate_prompt_tokens, ids);
    t_access.prompt_tokens += static_cast<int64_t>(ids.size());
  }
  // Batches of a bounded size: one forward pass each.
  constexpr size_t kBatch = 32;
  std::vector<std::vector<float>> vectors;
  for (size_t begin = 0; begin < inputs.size(); begin += kBatch) {
    const size_t end = std::min(inputs.size(), begin + kBatch);
    absl::StatusOr<at::Tensor> pooled = engine->Embed(
        std::vector<std::vector<int64_t>>(inputs.begin() + begin, inputs.begin() + end),
        options.embedding_pooling);
    if (!pooled.ok()) {
      // The library names inputs[k] of the batch: the request's input[begin + k].
      absl::Status error = pooled.status();
      if (std::optional<std::string> field = ErrorField(error)) {
        absl::string_view rest = *field;
        int64_t k = 0;
        if (absl::ConsumePrefix(&rest, "inputs[") && absl::ConsumeSuffix(&rest, "]") &&
            absl::SimpleAtoi(rest, &k)) {
          error = RenameField(error, *field, absl::StrCat("input[", begin + k, "]"));
        }
      }
      return SendStatus(res, error);
    }
    for (int64_t row = 0; row < pooled->size(0); ++row) {
      const float* values = pooled->data_ptr<float>() + row * pooled->size(1);
      vectors.emplace_back(values, values + pooled->size(1));
    }
  }
  metrics.AddTokens(t_access.prompt_tokens, 0);
  res.set_content(EmbeddingsJson(vectors, request->base64, model_id, t_access.prompt_tokens),
                  kJson);
}

bool HttpServer::Impl::RefuseBody(const httplib::Request& req, httplib::Response& res) const {
  if (BodyWithoutLength(req)) {
    ApiError error = ApiErrorFromStatus(absl::InvalidArgumentError(
        absl::StrCat(req.method, " without Content-Length (or chunked Transfer-Encoding)")));
    error.http_status = 411;
    error.code = "length_required";
    SendError(res, error);
    return true;
  }
  if (!AnnouncesBody(req)) return false;
  if (!ReadsBody(req)) {
    res.status = 404;  // the error handler makes it 405 where the path takes another method
    return true;
  }
  std::optional<int64_t> length;
  if (!IsChunked(req)) {
    length = ContentLength(req.get_header_value("Content-Length"));
    if (!length) {
      SendStatus(res, absl::InvalidArgumentError(
                          absl::StrCat("Content-Length must be a number of bytes, got '",
                                       req.get_header_value("Content-Length").substr(0, 40), "'")));
      return true;
    }
    if (*length > options.max_body_bytes) {
      res.status = 413;  // the error handler names the limit
      return true;
    }
  }
  const std::string encoding = absl::AsciiStrToLower(req.get_header_value("Content-Encoding"));
  if (!KnownContentEncoding(encoding)) {
    ApiError error = ApiErrorFromStatus(absl::InvalidArgumentError(absl::StrCat(
        "Content-Encoding '", encoding.substr(0, 40), "' is not one of gzip, deflate, br")));
    error.http_status = 415;
    error.code = "unsupported_media_type";
    SendError(res, error);
    return true;
  }
  // The body is JSON whatever Content-Type says: cpp-httplib would parse multipart/form-data.
  const_cast<httplib::Request&>(req).headers.erase("Content-Type");
  // Chunked framing and trailers may take as much again as the body, and a head's worth more;
  // the inflated body is counted by the handler.
  BoundedServer::SetBodyBudget(length ? *length
                                      : 2 * options.max_body_bytes + kMaxRequestHeadBytes);
  return false;
}

void HttpServer::Impl::Log(const httplib::Request& req, const httplib::Response& res) {
  const double seconds =
      t_access.started ? std::chrono::duration<double>(Clock::now() - t_access.start).count() : 0;
  const std::string status =
      t_access.outcome.empty() ? std::to_string(res.status) : t_access.outcome;
  metrics.RecordRequest(EndpointLabel(req.path), status);
  metrics.ObserveRequestDuration(seconds);
  if (options.access_log) {
    std::fprintf(stderr, "%s %s %s %s prompt_tokens=%lld completion_tokens=%lld %.3fs\n",
                 req.remote_addr.c_str(), req.method.c_str(), req.path.c_str(), status.c_str(),
                 static_cast<long long>(t_access.prompt_tokens),
                 static_cast<long long>(t_access.completion_tokens), seconds);
  }
  t_access = AccessRecord();
}

uint64_t HttpServer::Impl::Random() {
  std::lock_guard<std::mutex> lock(mutex);
  return random();
}

absl::StatusOr<std::vector<std::vector<int64_t>>> HttpServer::Impl::InputIds(
    const std::vector<PromptInput>& inputs, const std::string& name) const {
  std::vector<std::vector<int64_t>> encoded;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string field = inputs.size() == 1 ? name : absl::StrCat(name, "[", i, "]");
    if (!inputs[i].ids.empty()) {
      encoded.push_back(inputs[i].ids);
      continue;
    }
    if (!engine->tokenizer()) {
      return InvalidFieldError(field, absl::StrCat("the model has no tokenizer: give '", name,
                                                   "' as a list of token ids"));
    }
    ASSIGN_OR_RETURN(std::vector<int64_t> ids, engine->Encode(inputs[i].text));
    if (ids.empty()) {
      return InvalidFieldError(field, absl::StrCat("'", field, "' encodes to no tokens"));
    }
    encoded.push_back(std::move(ids));
  }
  return encoded;
}

absl::StatusOr<std::vector<std::vector<int64_t>>> HttpServer::Impl::PromptIds(ApiRequest& api) {
  const bool is_chat = api.endpoint == ApiEndpoint::kChat;
  std::vector<std::vector<int64_t>> prompts;
  if (is_chat) {
    if (!engine->tokenizer()) {
      return InvalidFieldError("messages", "the model has no tokenizer: chat needs one");
    }
    ASSIGN_OR_RETURN(const std::string text,
                     chat->Render(api.messages, api.message_json, api.tools));
    if (!api.ignore_eos) api.options.stop_token_sequences = chat_stops;
    // A template's text carries its own special tokens (transformers: add_special_tokens off).
    ASSIGN_OR_RETURN(std::vector<int64_t> ids, chat->has_template()
                                                   ? engine->tokenizer()->Encode(text, false)
                                                   : engine->Encode(text));
    if (ids.empty()) return InvalidFieldError("messages", "'messages' encodes to no tokens");
    prompts.push_back(std::move(ids));
  }
  ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> listed, InputIds(api.prompts, "prompt"));
  for (std::vector<int64_t>& ids : listed) prompts.push_back(std::move(ids));
  for (std::vector<int64_t>& ids : prompts) KeepLastTokens(api.truncate_prompt_tokens, ids);
  return prompts;
}

absl::StatusOr<int64_t> HttpServer::Impl::MaxNewTokens(const ApiRequest& api,
                                                       int64_t prompt_tokens) const {
  const int64_t context = engine->config().block_size;
  const int64_t left = context - prompt_tokens;
  if (left < 1) {
    return absl::OutOfRangeError(absl::StrCat("the prompt (", prompt_tokens,
                                              " tokens) fills the model's context of ", context,
                                              " tokens: send a shorter prompt"));
  }
  if (api.max_tokens) {
    // Compared by subtraction: the prompt plus max_tokens may overflow.
    if (*api.max_tokens > left) {
      return absl::OutOfRangeError(
          absl::StrCat("the prompt (", prompt_tokens, " tokens) plus max_tokens (", *api.max_tokens,
                       ") exceeds the model's context of ", context,
                       " tokens: lower max_tokens to at most ", left, " or send a shorter prompt"));
    }
    return *api.max_tokens;
  }
  return api.endpoint == ApiEndpoint::kChat ? left : std::min(options.default_max_tokens, left);
}

absl::StatusOr<Prepared> HttpServer::Impl::Prepare(ApiEndpoint endpoint, const std::string& body) {
  Prepared prepared;
  ASSIGN_OR_RETURN(prepared.api, ParseApiRequest(endpoint, body));
  ApiRequest& api = prepared.api;
  RETURN_IF_ERROR(CheckModel(api.model));
  ASSIGN_OR_RETURN(api.options.speculative,
                   ResolveSpeculative(api, options.speculative, engine->draft_model() != nullptr));
  // vLLM's convention: a request picks a LoRA adapter by naming it as its model.
  if (api.model != model_id) api.options.adapter = api.model;
  ASSIGN_OR_RETURN(prepared.prompts, PromptIds(api));
  if (!api.seed_given) api.options.seed = Random();
  // One constraint in its first state: SubmitChoices gives each choice its own copy.
  ASSIGN_OR_RETURN(api.options.constraint, OutputConstraint(api));
  for (const std::vector<int64_t>& prompt : prepared.prompts) {
    RequestOptions options = api.options;
    ASSIGN_OR_RETURN(options.max_new_tokens,
                     MaxNewTokens(api, static_cast<int64_t>(prompt.size())));
    prepared.options.push_back(std::move(options));
  }
  const bool chat = endpoint == ApiEndpoint::kChat;
  prepared.header.id = absl::StrFormat("%s-%016x", chat ? "chatcmpl" : "cmpl", Random());
  prepared.header.created = static_cast<int64_t>(std::time(nullptr));
  prepared.header.model = api.model.empty() ? model_id : api.model;
  return prepared;
}

uint64_t HttpServer::Impl::Track(std::shared_ptr<Request> request) {
  std::lock_guard<std::mutex> lock(mutex);
  active.emplace(next_active, std::move(request));
  return next_active++;
}

void HttpServer::Impl::Untrack(uint64_t key) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    active.erase(key);
  }
  idle.notify_all();
}

void HttpServer::Impl::Account(const Request& request, const Completion& completion) {
  const int64_t generated = static_cast<int64_t>(completion.tokens.size());
  t_access.completion_tokens += generated;
  metrics.AddTokens(0, generated);
  if (generated > 0) metrics.ObserveTimeToFirstToken(completion.stats.time_to_first_token_s);
  for (double gap : request.inter_token_s()) metrics.ObserveInterToken(gap);
}

constexpr size_t kCachedGrammars = 256;

absl::StatusOr<GrammarMatcher> HttpServer::Impl::MatcherFor(
    const std::string& key, bool chat,
    const std::function<absl::StatusOr<std::shared_ptr<const Grammar>>()>& compile) {
  const Tokenizer* tokenizer = engine->tokenizer();
  if (tokenizer == nullptr) {
    return absl::FailedPreconditionError("constrained output needs the model's tokenizer");
  }
  std::lock_guard<std::mutex> lock(constrain_mutex);
  std::shared_ptr<const TokenVocabulary>& vocabulary = vocabularies[chat];
  if (vocabulary == nullptr) {
    std::vector<int64_t> ends;
    if (tokenizer->eos_id()) ends.push_back(*tokenizer->eos_id());
    if (chat) {
      for (const std::vector<int64_t>& stop : chat_stops) {
        if (stop.size() == 1 && stop[0] < tokenizer->vocab_size()) ends.push_back(stop[0]);
      }
    }
    std::sort(ends.begin(), ends.end());
    ends.erase(std::unique(ends.begin(), ends.end()), ends.end());
    ASSIGN_OR_RETURN(vocabulary, TokenVocabulary::Create(tokenizer->VocabularyBytes(), ends));
  }
  std::map<std::string, GrammarMatcher>& cache = matchers[chat];
  if (auto found = cache.find(key); found != cache.end()) return found->second.Fork();
  ASSIGN_OR_RETURN(std::shared_ptr<const Grammar> grammar, compile());
  if (cache.size() >= kCachedGrammars) cache.clear();
  return cache.emplace(key, GrammarMatcher(grammar, vocabulary)).first->second.Fork();
}

absl::StatusOr<std::string> HttpServer::Impl::ForcedToolCallGbnf(const ApiRequest& api) const {
  const ToolCallFormat format = chat->tool_format();
  std::string gbnf = "root ::= ";
  std::string rules;
  bool first = true;
  for (size_t i = 0; i < api.tools.size(); ++i) {
    const nlohmann::ordered_json& function = api.tools[i]["function"];
    const std::string name = function["name"].get<std::string>();
    if (api.tool_choice.kind == ToolChoice::kNamed && name != api.tool_choice.name) continue;
    const nlohmann::ordered_json parameters = function.contains("parameters")
                                                  ? function["parameters"]
                                                  : nlohmann::ordered_json{{"type", "object"}};
    ASSIGN_OR_RETURN(
        const std::string arguments,
        JsonSchemaToGbnf(parameters, absl::StrCat("tools[", i, "].function.parameters")));
    const std::string prefix = absl::StrCat("tool", i, "-");
    const ForcedToolCall call = ForcedToolCallText(format, name);
    absl::StrAppend(&gbnf, first ? "" : " | ", prefix, "call");
    absl::StrAppend(&rules, prefix, "call ::= ", GbnfLiteral(call.prefix), " ", prefix, "root ",
                    GbnfLiteral(call.suffix), "\n", PrefixGbnfRuleNames(arguments, prefix), "\n");
    first = false;
  }
  return absl::StrCat(gbnf, "\n", rules);
}

absl::StatusOr<std::shared_ptr<TokenConstraint>> HttpServer::Impl::OutputConstraint(
    const ApiRequest& api) {
  const bool is_chat = api.endpoint == ApiEndpoint::kChat;
  const OutputFormat& format = api.output_format;
  const bool forced =
      api.tool_choice.kind == ToolChoice::kRequired || api.tool_choice.kind == ToolChoice::kNamed;
  if (forced && format.kind != OutputFormat::kText) {
    return InvalidFieldError("tool_choice",
                             absl::StrCat("'tool_choice' forces a tool call and '", format.field,
                                          "' constrains the output: give one"));
  }
  if (!forced && format.kind == OutputFormat::kText) return nullptr;
  // Compiler errors without a field are about the field that gave the grammar.
  const auto named =
      [](absl::StatusOr<std::shared_ptr<const Grammar>> grammar,
         const std::string& field) -> absl::StatusOr<std::shared_ptr<const Grammar>> {
    if (grammar.ok() || ErrorField(grammar.status())) return grammar;
    return InvalidFieldError(field, absl::StrCat("'", field, "': ", grammar.status().message()));
  };
  std::string key;
  std::function<absl::StatusOr<std::shared_ptr<const Grammar>>()> compile;
  if (forced) {
    ASSIGN_OR_RETURN(std::string gbnf, ForcedToolCallGbnf(api));
    key = "gbnf:" + gbnf;
    compile = [gbnf, named] { return named(CompileGbnf(gbnf), "tools"); };
  } else if (format.kind == OutputFormat::kJsonObject) {
    key = "json_object";
    compile = [] { return absl::StatusOr<std::shared_ptr<const Grammar>>(AnyJsonObjectGrammar()); };
  } else if (format.kind == OutputFormat::kJsonSchema) {
    key = "schema:" + format.schema.dump();
    compile = [&format] { return CompileJsonSchema(format.schema, format.field); };
  } else if (format.kind == OutputFormat::kRegex) {
    key = "regex:" + format.text;
    compile = [&format, named] {
      return named(CompileRegex(format.text, format.field), format.field);
    };
  } else if (format.kind == OutputFormat::kGrammar) {
    key = "gbnf:" + format.text;
    compile = [&format, named] { return named(CompileGbnf(format.text), format.field); };
  } else {
    std::string gbnf = "root ::= ";
    for (size_t i = 0; i < format.choices.size(); ++i) {
      absl::StrAppend(&gbnf, i == 0 ? "" : " | ", GbnfLiteral(format.choices[i]));
    }
    key = "gbnf:" + gbnf;
    compile = [gbnf, &format, named] { return named(CompileGbnf(gbnf), format.field); };
  }
  ASSIGN_OR_RETURN(GrammarMatcher matcher, MatcherFor(key, is_chat, compile));
  return std::make_shared<GrammarConstraint>(std::move(matcher));
}

// Whether replies are read for tool calls: chat with tools, tool_choice other than none.
bool ParsesToolCalls(const ApiRequest& api) { return api.tool_choice.kind != ToolChoice::kNone; }

ChoiceJson HttpServer::Impl::FinishedChoice(const Prepared& prepared, const Choice& choice,
                                            const Completion& completion, int64_t text_offset) {
  ChoiceJson json{choice.index, completion.text, ApiFinishReason(completion.finish_reason),
                  LogprobsJson(prepared, completion.logprobs, text_offset)};
  if (!ParsesToolCalls(prepared.api)) return json;
  ParsedToolCalls parsed = ParseToolCalls(completion.text, chat->tool_format());
  if (parsed.calls.empty()) return json;
  if (!prepared.api.parallel_tool_calls) parsed.calls.resize(1);
  json.text = parsed.content;
  json.tool_calls = ToolCallsJson(parsed.calls, [this] { return Random(); });
  json.finish_reason = "tool_calls";
  return json;
}

nlohmann::json HttpServer::Impl::LogprobsJson(const Prepared& prepared,
                                              const std::vector<TokenLogprob>& logprobs,
                                              int64_t text_offset) const {
  if (prepared.api.logprobs < 0) return nullptr;
  const Tokenizer* tokenizer = engine->tokenizer();
  const TokenText text = [tokenizer, as_ids = prepared.api.tokens_as_ids](int64_t id) {
    if (tokenizer == nullptr || as_ids) return absl::StrCat("token_id:", id);
    // The token's exact bytes mid-text (a SentencePiece word's leading space included, so
    // text_offset adds up); a special token's text as decoding shows it.
    if (std::optional<std::string> bytes = tokenizer->TokenBytes(id); bytes && !bytes->empty()) {
      return *bytes;
    }
    absl::StatusOr<std::string> decoded = tokenizer->Decode({id});
    return decoded.ok() ? *decoded : absl::StrCat("token_id:", id);
  };
  return prepared.api.endpoint == ApiEndpoint::kChat
             ? ChatLogprobs(logprobs, text)
             : CompletionLogprobs(logprobs, text, text_offset);
}

absl::StatusOr<std::vector<Choice>> HttpServer::Impl::SubmitAll(
    const Prepared& prepared, const std::shared_ptr<StreamQueue>& queue) {
  const int64_t n = prepared.api.n;
  std::vector<Choice> choices;
  for (size_t p = 0; p < prepared.prompts.size(); ++p) {
    const size_t first = choices.size();
    for (int64_t i = 0; i < n; ++i) {
      Choice choice;
      choice.index = static_cast<int64_t>(p) * n + i;
      choice.prompt = p;
      choices.push_back(choice);
    }
    const auto per_choice = [&](int64_t i, RequestOptions& options) {
      if (!prepared.api.stream) return;
      Choice& choice = choices[first + static_cast<size_t>(i)];
      std::shared_ptr<std::vector<TokenLogprob>> pending = choice.pending;
      options.on_logprob = [pending](const TokenLogprob& logprob) { pending->push_back(logprob); };
      if (ParsesToolCalls(prepared.api)) {
        // Its content streams until a call may start; the rest goes out once it is done.
        choice.tool_stream = std::make_shared<ToolCallStream>(chat->tool_format());
        options.on_text = [queue, pending, stream = choice.tool_stream,
                           index = choice.index](absl::string_view piece) {
          std::string content = stream->Feed(piece);
          if (content.empty()) return true;
          return queue->Push({index, std::move(content), std::exchange(*pending, {})});
        };
        return;
      }
      options.on_text = [queue, pending, index = choice.index](absl::string_view piece) {
        return queue->Push({index, std::string(piece), std::exchange(*pending, {})});
      };
    };
    absl::StatusOr<std::vector<std::shared_ptr<Request>>> submitted =
        engine->SubmitChoices(prepared.prompts[p], prepared.options[p], n, per_choice);
    if (!submitted.ok()) {
      for (const Choice& choice : choices) {
        if (choice.request) choice.request->Cancel();
      }
      return submitted.status();
    }
    for (int64_t i = 0; i < n; ++i) {
      choices[first + static_cast<size_t>(i)].request = (*submitted)[static_cast<size_t>(i)];
    }
  }
  return choices;
}

void HttpServer::Impl::Generate(ApiEndpoint endpoint, const httplib::Request& req,
                                const std::string& body, httplib::Response& res) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (stopping) {
      SendStatus(res, absl::UnavailableError("the server is shutting down"));
      return;
    }
  }
  absl::StatusOr<Prepared> prepared = Prepare(endpoint, body);
  if (!prepared.ok()) {
    SendStatus(res, prepared.status());
    return;
  }
  t_access.prompt_tokens = prepared->PromptTokens();
  auto queue = std::make_shared<StreamQueue>();
  absl::StatusOr<std::vector<Choice>> choices = SubmitAll(*prepared, queue);
  if (!choices.ok()) {
    SendStatus(res, choices.status());
    return;
  }
  metrics.AddTokens(t_access.prompt_tokens, 0);
  if (!prepared->api.stream) {
    Reply(*prepared, *choices, BoundedServer::ConnectionSocket(), res);
    return;
  }
  auto keys = std::make_shared<std::vector<uint64_t>>();
  for (const Choice& choice : *choices) keys->push_back(Track(choice.request));
  auto shared = std::make_shared<Prepared>(*std::move(prepared));
  auto held = std::make_shared<std::vector<Choice>>(*std::move(choices));
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      kEventStream,
      [this, shared, held, queue](size_t, httplib::DataSink& sink) {
        return Stream(*shared, *held, *queue, sink);
      },
      [this, held, keys](bool) {
        for (const Choice& choice : *held) {
          if (!choice.request->Done()) choice.request->Cancel();
        }
        for (const uint64_t key : *keys) Untrack(key);
      });
}

void HttpServer::Impl::Reply(const Prepared& prepared, const std::vector<Choice>& choices,
                             int socket, httplib::Response& res) {
  std::vector<uint64_t> keys;
  for (const Choice& choice : choices) keys.push_back(Track(choice.request));
  bool connected = true;
  for (const Choice& choice : choices) {
    connected = connected && WaitWhileConnected(*choice.request, socket);
    if (!connected) choice.request->Cancel();
  }
  std::vector<absl::StatusOr<Completion>> completions;
  for (const Choice& choice : choices) completions.push_back(choice.request->Wait());
  for (const uint64_t key : keys) Untrack(key);
  absl::Status failed;
  bool cancelled = false;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (!completions[i].ok()) {
      failed.Update(completions[i].status());
      continue;
    }
    Account(*choices[i].request, *completions[i]);
    cancelled = cancelled || completions[i]->finish_reason == FinishReason::kCancelled;
  }
  if (!connected) {
    // The client is gone: nobody reads the reply. Its tokens still count.
    t_access.outcome = "cancelled";
    return;
  }
  if (!failed.ok()) {
    SendStatus(res, failed);
    return;
  }
  if (cancelled) {
    SendStatus(res, absl::UnavailableError(
                        "the server shut down before the request finished (cancelled)"));
    return;
  }
  Usage usage = prepared.EmptyUsage();
  std::vector<ChoiceJson> json_choices;
  for (size_t i = 0; i < choices.size(); ++i) {
    const Completion& completion = *completions[i];
    usage.completion_tokens += static_cast<int64_t>(completion.tokens.size());
    AddSpeculativeUsage(completion, usage);
    json_choices.push_back(FinishedChoice(prepared, choices[i], completion, 0));
  }
  res.set_content(prepared.api.endpoint == ApiEndpoint::kChat
                      ? ChatCompletionJson(prepared.header, json_choices, usage)
                      : CompletionJson(prepared.header, json_choices, usage),
                  kJson);
}

bool HttpServer::Impl::Stream(const Prepared& prepared, const std::vector<Choice>& choices,
                              StreamQueue& queue, httplib::DataSink& sink) {
  const bool chat = prepared.api.endpoint == ApiEndpoint::kChat;
  const ResponseHeader& header = prepared.header;
  auto send = [&](const std::string& payload) {
    return sink.write(payload.data(), payload.size());
  };
  std::map<int64_t, int64_t> offsets;  // text sent per choice (completions' text_offset)
  auto chunk = [&](const ChoiceJson& choice, bool role = false) {
    return SseEvent(chat ? ChatChunkJson(header, role, choice)
                         : CompletionChunkJson(header, choice));
  };
  auto event_chunk = [&](const ChoiceEvent& event) {
    int64_t& offset = offsets[event.index];
    const std::string payload =
        chunk({event.index, event.text, "", LogprobsJson(prepared, event.logprobs, offset)});
    offset += static_cast<int64_t>(event.text.size());
    return payload;
  };
  auto leave = [&] {
    // The client is gone: its requests end at the scheduler's next step.
    for (const Choice& choice : choices) choice.request->Cancel();
    t_access.outcome = "cancelled";
    return false;
  };
  // A reply read for tool calls, once done: the content its stream held, then each call as
  // OpenAI streams one (index, id, type and name with empty arguments, then the arguments),
  // then the finish reason.
  auto send_tool_calls = [&](const Choice& choice, const Completion& rest) {
    ParsedToolCalls held = choice.tool_stream->Finish();
    if (!prepared.api.parallel_tool_calls && held.calls.size() > 1) held.calls.resize(1);
    const nlohmann::json logprobs = LogprobsJson(prepared, rest.logprobs, 0);
    if (!held.content.empty() || !logprobs.is_null()) {
      if (!send(chunk({choice.index, held.content, "", logprobs}))) return false;
    }
    const nlohmann::json calls = ToolCallsJson(held.calls, [this] { return Random(); });
    for (size_t i = 0; i < calls.size(); ++i) {
      nlohmann::json head = calls[i];
      head["index"] = i;
      head["function"]["arguments"] = "";
      const nlohmann::json arguments = {
          {"index", i}, {"function", {{"arguments", calls[i]["function"]["arguments"]}}}};
      if (!send(chunk({choice.index, "", "", nullptr, nlohmann::json::array({head})})) ||
          !send(chunk({choice.index, "", "", nullptr, nlohmann::json::array({arguments})}))) {
        return false;
      }
    }
    const std::string finish =
        calls.empty() ? ApiFinishReason(rest.finish_reason) : std::string("tool_calls");
    return send(chunk({choice.index, "", finish, nullptr}));
  };
  auto all_done = [&] {
    return std::all_of(choices.begin(), choices.end(),
                       [](const Choice& choice) { return choice.request->Done(); });
  };
  if (chat) {
    for (const Choice& choice : choices) {
      if (!send(chunk({choice.index, "", "", nullptr}, /*role=*/true))) return leave();
    }
  }
  while (true) {
    const std::deque<ChoiceEvent> events = queue.Take(std::chrono::milliseconds(20));
    for (const ChoiceEvent& event : events) {
      if (!send(event_chunk(event))) return leave();
    }
    if (events.empty()) {
      if (all_done()) break;
      if (!sink.is_writable()) return leave();
    }
  }
  // Wait flushes the text the stop-sequence filter held back into the queue.
  std::vector<absl::StatusOr<Completion>> completions;
  for (const Choice& choice : choices) completions.push_back(choice.request->Wait());
  for (const ChoiceEvent& event : queue.Take(std::chrono::milliseconds(0))) {
    if (!send(event_chunk(event))) return leave();
  }
  Usage usage = prepared.EmptyUsage();
  for (size_t i = 0; i < choices.size(); ++i) {
    const Choice& choice = choices[i];
    if (!completions[i].ok()) {
      send(SseEvent(ApiErrorFromStatus(completions[i].status()).Json()));
      continue;
    }
    const Completion& completion = *completions[i];
    Account(*choice.request, completion);
    usage.completion_tokens += static_cast<int64_t>(completion.tokens.size());
    AddSpeculativeUsage(completion, usage);
    if (completion.finish_reason == FinishReason::kCancelled) {
      send(SseEvent(
          ApiErrorFromStatus(absl::UnavailableError(
                                 "the server shut down before the request finished (cancelled)"))
              .Json()));
      continue;
    }
    // Tokens whose text never came (a stop token, text held back and cut, a reply's held
    // tool calls): their logprobs, with the rest of the choice and its finish reason.
    Completion rest = completion;
    rest.logprobs = std::exchange(*choice.pending, {});
    if (choice.tool_stream) {
      if (!send_tool_calls(choice, rest)) return leave();
      continue;
    }
    ChoiceJson last = FinishedChoice(prepared, choice, rest, offsets[choice.index]);
    last.text.clear();  // its pieces went out already
    if (!send(chunk(last))) return leave();
  }
  if (prepared.api.include_usage) send(SseEvent(UsageChunkJson(header, chat, usage)));
  if (!send(SseEvent("[DONE]"))) return leave();
  sink.done();
  return true;
}

void HttpServer::Impl::Shutdown() {
  std::lock_guard<std::mutex> lock(mutex);
  if (stopping) return;
  stopping = true;
  shutdown_thread = std::thread([this] { ShutdownSequence(); });
}

void HttpServer::Impl::ShutdownSequence() {
  // Run may not be listening yet; the listening socket closes once it is.
  while (!server.is_running() && !run_done && !destroying) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (server.is_running()) server.stop();
  std::unique_lock<std::mutex> lock(mutex);
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(std::max(0.0, options.shutdown_s)));
  if (!idle.wait_until(lock, deadline, [this] { return active.empty(); })) {
    std::fprintf(stderr, "serve: cancelling %zu requests still running after %.1f s\n",
                 active.size(), options.shutdown_s);
    for (auto& [key, request] : active) request->Cancel();
  }
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Create(std::shared_ptr<const Engine> engine,
                                                               const ServerOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->engine = std::move(engine);
  impl->options = options;
  RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::~HttpServer() {
  impl_->destroying = true;
  Shutdown();
  impl_->idle.notify_all();
  if (impl_->shutdown_thread.joinable()) impl_->shutdown_thread.join();
  if (impl_->socket_file) {
    // Only the file this server bound: another may have taken the path since.
    struct stat now {};
    if (::stat(impl_->options.unix_socket.c_str(), &now) == 0 && S_ISSOCK(now.st_mode) &&
        std::make_pair(now.st_dev, now.st_ino) == *impl_->socket_file) {
      ::unlink(impl_->options.unix_socket.c_str());
    }
  }
}

int HttpServer::port() const { return impl_->port; }

const std::string& HttpServer::model_id() const { return impl_->model_id; }

void HttpServer::Run() {
  impl_->server.listen_after_bind();
  impl_->run_done = true;
  impl_->idle.notify_all();
}

void HttpServer::Shutdown() { impl_->Shutdown(); }

}  // namespace lgpt
