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
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "core/text/prompt_style.h"
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
  static const char* const kPaths[] = {"/v1/completions", "/v1/chat/completions", "/v1/models",
                                       "/health", "/metrics"};
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

// The request is one of the routes that read a body (POST /v1/completions, /v1/chat/completions).
bool ReadsBody(const httplib::Request& req) {
  const std::string endpoint = EndpointLabel(req.path);
  return req.method == "POST" &&
         (endpoint == "/v1/completions" || endpoint == "/v1/chat/completions");
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

// Pieces of text from the scheduler's thread to the worker thread that streams them.
struct StreamQueue {
  std::mutex mutex;
  std::condition_variable ready;
  std::deque<std::string> pieces;

  // Always true: a client that leaves cancels its request through Request::Cancel, so that
  // the scheduler counts it as cancelled.
  bool Push(absl::string_view piece) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      pieces.emplace_back(piece);
    }
    ready.notify_one();
    return true;
  }
  std::deque<std::string> Take(std::chrono::milliseconds wait) {
    std::unique_lock<std::mutex> lock(mutex);
    ready.wait_for(lock, wait, [this] { return !pieces.empty(); });
    std::deque<std::string> taken;
    taken.swap(pieces);
    return taken;
  }
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

// A request ready for Engine::Submit.
struct Prepared {
  ApiRequest api;
  std::vector<int64_t> prompt;
  ResponseHeader header;
};

}  // namespace

struct HttpServer::Impl {
  std::shared_ptr<const Engine> engine;
  ServerOptions options;
  std::string model_id;
  int64_t created = 0;
  std::optional<PromptStyle> style;
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
  // POST /v1/completions and /v1/chat/completions: parse, submit, reply or stream.
  void Generate(ApiEndpoint endpoint, const httplib::Request& req, const std::string& body,
                httplib::Response& res);
  // The request's prompt ids, options and response header; errors as API errors.
  absl::StatusOr<Prepared> Prepare(ApiEndpoint endpoint, const std::string& body);
  absl::StatusOr<std::vector<int64_t>> PromptIds(ApiRequest& api);
  absl::Status ApplyMaxTokens(ApiRequest& api, int64_t prompt_tokens) const;
  // A whole reply; a client that hangs up first cancels its request.
  void Reply(const Prepared& prepared, const std::shared_ptr<Request>& request, int socket,
             httplib::Response& res);
  // Writes the events of a streamed request as its pieces arrive; false when the client left
  // (the request is cancelled).
  bool Stream(const Prepared& prepared, const std::shared_ptr<Request>& request, StreamQueue& queue,
              httplib::DataSink& sink);
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
  model_id = options.model_id.empty() ? engine->config().name : options.model_id;
  created = static_cast<int64_t>(std::time(nullptr));
  if (const Tokenizer* tokenizer = engine->tokenizer()) {
    ASSIGN_OR_RETURN(style,
                     options.prompt_style.empty()
                         ? PromptStyleForCheckpoint(engine->checkpoint_dir(), engine->config())
                         : PromptStyleFromName(options.prompt_style));
    chat_stops = style->StopTokenIds(
        tokenizer->eos_id(), [tokenizer](absl::string_view token) -> std::optional<int64_t> {
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
    res.set_content(ModelsJson(model_id, created), kJson);
  });
  // [\s\S]: any byte, where `.` stops at a (percent-decoded) CR or LF in the id.
  server.Get(R"(/v1/models/([\s\S]+))",
             [this](const httplib::Request& req, httplib::Response& res) {
               if (req.matches[1] != model_id) {
                 SendStatus(res, absl::NotFoundError(absl::StrCat(
                                     "the model '", req.matches[1].str(), "' does not exist")));
                 return;
               }
               res.set_content(ModelJson(model_id, created), kJson);
             });
  // The bodies are read through a content reader: cpp-httplib parses a body it reads itself as
  // a form when its Content-Type says so (curl -d's default) and refuses such a body over
  // 8 KiB with a 413, whatever --max_body_bytes says. JSON is JSON whatever the header says.
  const auto post = [this](ApiEndpoint endpoint) {
    return [this, endpoint](const httplib::Request& req, httplib::Response& res,
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
      Generate(endpoint, req, body, res);
    };
  };
  server.Post("/v1/completions", post(ApiEndpoint::kCompletions));
  server.Post("/v1/chat/completions", post(ApiEndpoint::kChat));
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

absl::StatusOr<std::vector<int64_t>> HttpServer::Impl::PromptIds(ApiRequest& api) {
  const bool chat = api.endpoint == ApiEndpoint::kChat;
  if (!chat && !api.prompt_ids.empty()) return api.prompt_ids;
  if (!engine->tokenizer()) {
    return InvalidFieldError(chat ? "messages" : "prompt",
                             chat ? "the model has no tokenizer: chat needs one"
                                  : "the model has no tokenizer: give 'prompt' as a list of "
                                    "token ids");
  }
  std::string text = api.prompt;
  if (chat) {
    ASSIGN_OR_RETURN(text, ChatPromptText(*style, api.messages));
    if (!api.ignore_eos) api.options.stop_token_sequences = chat_stops;
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> ids, engine->Encode(text));
  if (ids.empty()) {
    const char* input = chat ? "messages" : "prompt";
    return InvalidFieldError(input, absl::StrCat("'", input, "' encodes to no tokens"));
  }
  return ids;
}

absl::Status HttpServer::Impl::ApplyMaxTokens(ApiRequest& api, int64_t prompt_tokens) const {
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
    api.options.max_new_tokens = *api.max_tokens;
    return absl::OkStatus();
  }
  api.options.max_new_tokens =
      api.endpoint == ApiEndpoint::kChat ? left : std::min(options.default_max_tokens, left);
  return absl::OkStatus();
}

absl::StatusOr<Prepared> HttpServer::Impl::Prepare(ApiEndpoint endpoint, const std::string& body) {
  Prepared prepared;
  ASSIGN_OR_RETURN(prepared.api, ParseApiRequest(endpoint, body));
  ApiRequest& api = prepared.api;
  if (!api.model.empty() && api.model != model_id) {
    return absl::NotFoundError(absl::StrCat(
        "the model '", api.model, "' does not exist; this server serves '", model_id, "'"));
  }
  ASSIGN_OR_RETURN(prepared.prompt, PromptIds(api));
  RETURN_IF_ERROR(ApplyMaxTokens(api, static_cast<int64_t>(prepared.prompt.size())));
  if (!api.seed_given) api.options.seed = Random();
  const bool chat = endpoint == ApiEndpoint::kChat;
  prepared.header.id = absl::StrFormat("%s-%016x", chat ? "chatcmpl" : "cmpl", Random());
  prepared.header.created = static_cast<int64_t>(std::time(nullptr));
  prepared.header.model = model_id;
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
  t_access.completion_tokens = generated;
  metrics.AddTokens(0, generated);
  if (generated > 0) metrics.ObserveTimeToFirstToken(completion.stats.time_to_first_token_s);
  for (double gap : request.inter_token_s()) metrics.ObserveInterToken(gap);
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
  t_access.prompt_tokens = static_cast<int64_t>(prepared->prompt.size());
  auto queue = std::make_shared<StreamQueue>();
  if (prepared->api.stream) {
    prepared->api.options.on_text = [queue](absl::string_view piece) { return queue->Push(piece); };
  }
  absl::StatusOr<std::shared_ptr<Request>> request =
      engine->Submit(prepared->prompt, prepared->api.options);
  if (!request.ok()) {
    SendStatus(res, request.status());
    return;
  }
  metrics.AddTokens(t_access.prompt_tokens, 0);
  if (!prepared->api.stream) {
    Reply(*prepared, *request, BoundedServer::ConnectionSocket(), res);
    return;
  }
  const uint64_t key = Track(*request);
  auto shared = std::make_shared<Prepared>(*std::move(prepared));
  std::shared_ptr<Request> held = *request;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      kEventStream,
      [this, shared, held, queue](size_t, httplib::DataSink& sink) {
        return Stream(*shared, held, *queue, sink);
      },
      [this, held, key](bool) {
        if (!held->Done()) held->Cancel();
        Untrack(key);
      });
}

void HttpServer::Impl::Reply(const Prepared& prepared, const std::shared_ptr<Request>& request,
                             int socket, httplib::Response& res) {
  const uint64_t key = Track(request);
  const bool connected = WaitWhileConnected(*request, socket);
  absl::StatusOr<Completion> completion = request->Wait();
  Untrack(key);
  if (!connected) {
    // The client is gone: nobody reads the reply. Its tokens still count.
    t_access.outcome = "cancelled";
    if (completion.ok()) Account(*request, *completion);
    return;
  }
  if (!completion.ok()) {
    SendStatus(res, completion.status());
    return;
  }
  Account(*request, *completion);
  if (completion->finish_reason == FinishReason::kCancelled) {
    SendStatus(res, absl::UnavailableError(
                        "the server shut down before the request finished (cancelled)"));
    return;
  }
  const Usage usage{static_cast<int64_t>(prepared.prompt.size()),
                    static_cast<int64_t>(completion->tokens.size())};
  const char* finish = ApiFinishReason(completion->finish_reason);
  res.set_content(prepared.api.endpoint == ApiEndpoint::kChat
                      ? ChatCompletionJson(prepared.header, completion->text, finish, usage)
                      : CompletionJson(prepared.header, completion->text, finish, usage),
                  kJson);
}

bool HttpServer::Impl::Stream(const Prepared& prepared, const std::shared_ptr<Request>& request,
                              StreamQueue& queue, httplib::DataSink& sink) {
  const bool chat = prepared.api.endpoint == ApiEndpoint::kChat;
  const ResponseHeader& header = prepared.header;
  auto send = [&](const std::string& payload) {
    return sink.write(payload.data(), payload.size());
  };
  auto piece_event = [&](absl::string_view text) {
    return SseEvent(chat ? ChatChunkJson(header, false, text, "")
                         : CompletionChunkJson(header, text, ""));
  };
  auto leave = [&] {
    // The client is gone: its request ends at the scheduler's next step.
    request->Cancel();
    t_access.outcome = "cancelled";
    return false;
  };
  if (chat && !send(SseEvent(ChatChunkJson(header, true, "", "")))) return leave();
  size_t streamed = 0;
  while (true) {
    const std::deque<std::string> pieces = queue.Take(std::chrono::milliseconds(20));
    for (const std::string& piece : pieces) {
      if (!send(piece_event(piece))) return leave();
      streamed += piece.size();
    }
    if (pieces.empty()) {
      if (request->Done()) break;
      if (!sink.is_writable()) return leave();
    }
  }
  absl::StatusOr<Completion> completion = request->Wait();
  if (!completion.ok()) {
    send(SseEvent(ApiErrorFromStatus(completion.status()).Json()));
  } else {
    Account(*request, *completion);
    // Text the stop-sequence filter held back until the end (Wait flushes it).
    if (completion->text.size() > streamed &&
        !send(piece_event(completion->text.substr(streamed)))) {
      return leave();
    }
    if (completion->finish_reason == FinishReason::kCancelled) {
      send(SseEvent(
          ApiErrorFromStatus(absl::UnavailableError(
                                 "the server shut down before the request finished (cancelled)"))
              .Json()));
    } else {
      const char* finish = ApiFinishReason(completion->finish_reason);
      send(SseEvent(chat ? ChatChunkJson(header, false, "", finish)
                         : CompletionChunkJson(header, "", finish)));
    }
    if (prepared.api.include_usage) {
      send(SseEvent(UsageChunkJson(header, chat,
                                   {static_cast<int64_t>(prepared.prompt.size()),
                                    static_cast<int64_t>(completion->tokens.size())})));
    }
  }
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
