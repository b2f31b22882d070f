// OpenAIServer: lgpt's OpenAI-compatible HTTP server (tools/server/http_server.h: completions,
// chat, streaming, /v1/models, /health, /metrics) as a library a service links
// (//tools/server:openai_server) to serve an Engine it loaded itself, on a TCP port or on a
// Unix-domain socket; //tools:serve is this class behind flags.
//
//   std::shared_ptr<const lgpt::Engine> engine = lgpt::Engine::Load(dir).value();
//   auto server = lgpt::OpenAIServer::Create(engine, {}).value();
//   std::thread stopper([&] { WaitForSignal(); server->Stop(); });
//   absl::Status served = server->ServeOnPort("127.0.0.1", 8000);  // until Stop
//   // or server->ServeOnSocket("/run/lgpt.sock"): clients connect to the path instead
//   stopper.join();
//
// A server serves once, on one port or socket, until Stop (any thread, any number of times,
// before or during Serve): it stops accepting, lets requests in flight finish within
// OpenAIServerOptions.shutdown_s and cancels the rest; the Serve call then returns once every
// request has ended. A Serve call that fails (a bad address, one in use) may be retried.
#ifndef LGPT_TOOLS_SERVER_OPENAI_SERVER_H_
#define LGPT_TOOLS_SERVER_OPENAI_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lgpt.h"

namespace lgpt {

struct OpenAIServerOptions {
  std::string api_key;       // non-empty: /v1/ needs 'Authorization: Bearer KEY'
  std::string model_id;      // the model's id in the API; empty: the checkpoint's model name
  std::string prompt_style;  // how chat messages are framed; empty: the checkpoint's own
  // The largest request body (after inflation; 413 beyond), in [1, 1 GiB].
  int64_t max_body_bytes = 1 << 20;
  // Connection threads kept (each open connection holds one; more start while all are busy, up
  // to max_http_threads), in [0, max_http_threads]. 0: the engine's SchedulerOptions
  // max_running + max_waiting + 8 (at most max_http_threads), so that a full queue answers 429
  // rather than keeping connections waiting for a thread.
  int http_threads = 0;
  int max_http_threads = 1024;      // in [1, 16384]
  double shutdown_s = 10;           // after Stop, how long requests in flight may still run; >= 0
  int64_t default_max_tokens = 16;  // /v1/completions without max_tokens (OpenAI's 16); >= 1
  bool access_log = true;           // one line per request on stderr
  // CORS: "*" or one origin gets Access-Control-Allow-Origin and preflight answers; empty: off.
  std::string cors_allow_origin;
  // How /v1/embeddings pools a sequence's final hidden states.
  Engine::Pooling embedding_pooling = Engine::Pooling::kLast;
  // Speculative decoding (core/speculative/README.md) of requests that give no
  // speculative_config: none by default, or "ngram" / "draft" (the engine's draft model,
  // EngineOptions.draft_checkpoint_dir) with its num_speculative_tokens and n-gram sizes. A
  // request's speculative_config fields override it; {"method": "none"} turns it off.
  SpeculativeSpec speculative;
  // Called once, on the thread of the Serve call, when the server listens (connections queue
  // from then on), before it answers any: `address` is "http://HOST:PORT" (the port bound) or
  // "unix:PATH".
  std::function<void(const std::string& address)> on_serving;

  // The checks that need no engine (Create makes them too); errors name the field
  // ("OpenAIServerOptions.http_threads must be in [0, 1024], got -1").
  absl::Status Validate() const;
};

class OpenAIServer {
 public:
  // Checks the options and the engine (the chat prompt style, when it has a tokenizer; the
  // draft model of a "draft" speculative default); binds nothing yet. The engine needs a tokenizer
  // for text prompts and chat.
  static absl::StatusOr<std::unique_ptr<OpenAIServer>> Create(std::shared_ptr<const Engine> engine,
                                                              OpenAIServerOptions options = {});
  // Stops (as Stop) and waits for a Serve call in flight on another thread to return.
  ~OpenAIServer();
  OpenAIServer(const OpenAIServer&) = delete;
  OpenAIServer& operator=(const OpenAIServer&) = delete;

  // Binds host:port (port 0: a free port, see port()) and serves until Stop; returns once the
  // requests in flight have ended. OK after Stop (at once, binding nothing, when Stop came
  // first); InvalidArgument for a port outside [0, 65535] or an empty host, Unavailable when
  // the address is in use or not one of this machine's, FailedPrecondition while another
  // Serve call serves.
  absl::Status ServeOnPort(const std::string& host, int port);
  // As ServeOnPort, on a Unix-domain socket at `path` (removed again when serving ends).
  // InvalidArgument, naming the path, for an empty path, one longer than a socket address
  // holds (107 bytes), a directory that does not exist, or a path that exists and is not a
  // socket. A socket file left by a server that has gone is replaced; Unavailable when a server
  // still listens on it.
  absl::Status ServeOnSocket(const std::string& path);
  // Stops accepting; requests in flight run up to shutdown_s, then are cancelled. Returns at
  // once; any thread, any number of times; before Serve, the Serve call returns at once.
  void Stop();

  // Blocks until a Serve call listens (true); false once Stop was called before it did, a
  // Serve call failed, or serving has ended. For a service that serves on another thread and
  // must know when to connect.
  bool WaitUntilServing() const;
  // The TCP port ServeOnPort bound (the one chosen for port 0); 0 before, and on a socket.
  int port() const;
  // The model's id in the API (OpenAIServerOptions.model_id or the checkpoint's name).
  const std::string& model_id() const;

 private:
  struct Impl;  // cpp-httplib stays out of this header
  explicit OpenAIServer(std::unique_ptr<Impl> impl);
  absl::Status Serve(const std::string& host, int port, const std::string& unix_socket);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lgpt

#endif  // LGPT_TOOLS_SERVER_OPENAI_SERVER_H_
