// lgpt's OpenAI-compatible HTTP server over an Engine's continuous batching (Engine::Submit),
// on Debian's cpp-httplib:
//   POST /v1/completions, POST /v1/chat/completions   (JSON, or server-sent events with
//                                                        "stream": true, flushed per piece)
//   GET  /v1/models, /v1/models/{id}, /health, /metrics (Prometheus text)
//   POST /v1/embeddings (pooled final hidden states, unit length; float or base64)
//   POST /tokenize, /detokenize (vLLM's shapes; no API key, as vLLM)
// Errors are OpenAI's {"error": {"message", "type", "code"}} (tools/server/openai_api.h): 400
// for malformed or unsupported requests and prompts beyond the context, 401 without the API
// key (when one is set; /v1/ only), 404 for an unknown model or path, 413 for a body over the
// limit however it is framed or encoded (tools/server/bounded_connection.h: refused at the first
// byte past it), 431 for a request head over 64 KiB, 429 with Retry-After when the scheduler's
// queue is full. A streaming client that
// disconnects cancels its request. Shutdown() stops accepting, lets requests in flight finish
// within ServerOptions.shutdown_s, then cancels them. One access-log line per request on
// stderr.
//
//   auto server = HttpServer::Create(engine, options);   // binds
//   std::thread stopper([&] { WaitForSignal(); (*server)->Shutdown(); });
//   (*server)->Run();                                    // until Shutdown's requests ended
#ifndef LGPT_TOOLS_SERVER_HTTP_SERVER_H_
#define LGPT_TOOLS_SERVER_HTTP_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "lgpt.h"

namespace lgpt {

// The most connection threads a server may be given (each reserves a stack).
inline constexpr int kMostHttpThreads = 1 << 14;

// The largest request body a server may be set to take (1 GiB).
inline constexpr int64_t kMostBodyBytes = int64_t{1} << 30;

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback only by default
  int port = 8000;                 // 0: any free port (port() tells which)
  // Non-empty: listen on this Unix-domain socket instead of host:port. The path must be free
  // (OpenAIServer::ServeOnSocket checks it); the destructor removes the socket file.
  std::string unix_socket;
  std::string api_key;       // empty: no authentication
  std::string model_id;      // the served model's name; empty: the checkpoint's name
  std::string prompt_style;  // chat framing; empty: the checkpoint's own
  // Request bodies, counted as read after inflation (Content-Encoding gzip, deflate, br);
  // chunked framing and trailers may take up to max_body_bytes + 64 KiB more on the wire. In
  // [1, kMostBodyBytes].
  int64_t max_body_bytes = 1 << 20;
  // Threads kept for connections (each open connection holds one while it lasts): at least
  // the scheduler's max_running + max_waiting, so that a full queue answers 429 rather than
  // stalling. More start when every one is busy (clients trickling in requests must not hold
  // the server), up to max_http_threads, and end after a while without work.
  int http_threads = 64;            // in [0, max_http_threads]
  int max_http_threads = 1024;      // in [1, kMostHttpThreads]
  double shutdown_s = 10;           // how long Shutdown lets requests in flight run
  int64_t default_max_tokens = 16;  // /v1/completions without max_tokens (OpenAI's 16)
  bool access_log = true;
  // CORS for browser clients: "*" or one origin ("https://app.example") gets
  // Access-Control-Allow-Origin on every answer and preflight OPTIONS requests answered (204);
  // empty (the default): no CORS headers.
  std::string cors_allow_origin;
  // How /v1/embeddings pools a sequence's final hidden states (Engine::Pooling).
  Engine::Pooling embedding_pooling = Engine::Pooling::kLast;
  // Speculative decoding of requests that give no speculative_config (none by default); a
  // request's speculative_config fields override it (ResolveSpeculative). "draft" needs the
  // engine's draft model (EngineOptions.draft_checkpoint_dir).
  SpeculativeSpec speculative;
};

// A server's default speculation (ServerOptions.speculative): one ValidateSpeculativeSpec
// takes, and "draft" only over an engine with a draft model (FailedPrecondition naming
// SpeculativeSpec.method otherwise).
absl::Status CheckServerSpeculation(const SpeculativeSpec& spec, const Engine& engine);

class HttpServer {
 public:
  // Binds host:port (or unix_socket); the engine needs a tokenizer for text prompts and chat.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Create(std::shared_ptr<const Engine> engine,
                                                            const ServerOptions& options);
  // Shuts down (as Shutdown) and waits for Run to return.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;  // 0 on a Unix socket
  const std::string& model_id() const;
  // Serves until Shutdown; returns once every request in flight has ended.
  void Run();
  // Stops accepting connections; requests in flight run up to shutdown_s, then are cancelled.
  // Returns at once; any thread, any number of times.
  void Shutdown();

 private:
  struct Impl;  // cpp-httplib stays out of this header
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lgpt

#endif  // LGPT_TOOLS_SERVER_HTTP_SERVER_H_
