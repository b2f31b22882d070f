// An OpenAI-compatible HTTP server over the engine's continuous batching
// (tools/server/http_server.h), the embedded default model when --checkpoint_dir is not given:
//   bazel run //tools:serve -- [--checkpoint_dir=DIR] [--host=127.0.0.1 --port=8000]
//       [--api_key=KEY] [--pool_mb=M] [--max_running=N --max_waiting=N] [--quantize=int8]
// Prints "serve: listening on http://HOST:PORT" on stderr once it accepts connections
// (--port=0 takes a free port), then one access-log line per request. SIGTERM or SIGINT: stops
// accepting, lets requests in flight finish within --shutdown_s, cancels the rest, exits 0.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/base/device.h"
#include "core/base/status_macros.h"
#include "lgpt.h"
#include "tools/load_flags.h"
#include "tools/server/http_server.h"
#include "tools/tool_util.h"

ABSL_FLAG(std::string, checkpoint_dir, "",
          "LitGPT checkpoint or fine-tune directory; empty: the embedded default model");
ABSL_FLAG(std::string, host, "127.0.0.1", "address to listen on (0.0.0.0: every interface)");
ABSL_FLAG(int32_t, port, 8000, "port to listen on; 0: any free port");
ABSL_FLAG(std::string, api_key, "",
          "require 'Authorization: Bearer KEY' on /v1/ (empty: no authentication)");
ABSL_FLAG(std::string, served_model_name, "",
          "the model's id in the API; empty: the checkpoint's model name");
ABSL_FLAG(std::string, prompt_style, "",
          "how chat messages are framed (llama3, chatml, ...); empty: the checkpoint's own");
ABSL_FLAG(int64_t, pool_mb, 0, "shared paged KV pool in MiB; 0: each request its own cache");
ABSL_FLAG(int64_t, max_running, 16, "requests decoding at once (rows of a decode step)");
ABSL_FLAG(int64_t, max_waiting, 64, "queued requests; beyond, 429 with Retry-After");
ABSL_FLAG(int64_t, max_body_bytes, 1 << 20, "largest request body; beyond, 413");
ABSL_FLAG(int32_t, http_threads, 0,
          "connections served at once, at most 1024; 0: --max_running + --max_waiting + 8 "
          "(at most 1024)");
ABSL_FLAG(double, shutdown_s, 10, "on SIGTERM/SIGINT, seconds requests in flight may still run");
ABSL_FLAG(bool, access_log, true, "one line per request on stderr");
ABSL_FLAG(std::string, precision, "32-true", "32-true, bf16-true or 16-true");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda[:N]");
ABSL_FLAG(std::string, quantize, "none",
          "none, or int8: int8 weight-only projections (CPU, --precision=32-true)");

namespace lgpt {
namespace {

absl::StatusOr<EngineOptions> EngineOptionsFromServeFlags() {
  EngineOptions options;
  ASSIGN_OR_RETURN(options.dtype, ParsePrecision(absl::GetFlag(FLAGS_precision)));
  ASSIGN_OR_RETURN(options.device, ParseDevice(absl::GetFlag(FLAGS_device)));
  const std::string quantize = absl::GetFlag(FLAGS_quantize);
  if (quantize != "none" && quantize != "int8") {
    return absl::InvalidArgumentError(
        absl::StrCat("--quantize must be none or int8, got '", quantize, "'"));
  }
  options.quantize_int8 = quantize == "int8";
  options.verify_checksums = VerifyChecksumsFlag();
  options.progress = PrintProgress;
  ASSIGN_OR_RETURN(options.serving.kv_pool_bytes, PoolBytesFromFlag(absl::GetFlag(FLAGS_pool_mb)));
  options.serving.max_running = absl::GetFlag(FLAGS_max_running);
  options.serving.max_waiting = absl::GetFlag(FLAGS_max_waiting);
  // Every request waits for the scheduler's next step: with no room to wait, all are 429s.
  if (options.serving.max_waiting < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_waiting must be >= 1 (each request waits for the next step), got ",
                     options.serving.max_waiting));
  }
  RETURN_IF_ERROR(options.serving.Validate());  // Die names the flags (InFlagTerms)
  return options;
}

absl::StatusOr<ServerOptions> ServerOptionsFromFlags(const EngineOptions& engine) {
  ServerOptions options;
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--port must be in [0, 65535], got ", options.port));
  }
  options.api_key = absl::GetFlag(FLAGS_api_key);
  options.model_id = absl::GetFlag(FLAGS_served_model_name);
  options.prompt_style = absl::GetFlag(FLAGS_prompt_style);
  options.max_body_bytes = absl::GetFlag(FLAGS_max_body_bytes);
  if (options.max_body_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_body_bytes must be >= 1, got ", options.max_body_bytes));
  }
  options.http_threads = absl::GetFlag(FLAGS_http_threads);
  if (options.http_threads < 0 || options.http_threads > options.max_http_threads) {
    return absl::InvalidArgumentError(absl::StrCat("--http_threads must be in [0, ",
                                                   options.max_http_threads, "], got ",
                                                   options.http_threads));
  }
  if (options.http_threads == 0) {
    // Beyond max_http_threads, connections past it wait for a thread instead of a 429.
    options.http_threads = static_cast<int>(std::min<int64_t>(
        engine.serving.max_running + engine.serving.max_waiting + 8, options.max_http_threads));
  }
  options.shutdown_s = absl::GetFlag(FLAGS_shutdown_s);
  if (!(options.shutdown_s >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shutdown_s must be >= 0, got ", options.shutdown_s));
  }
  options.access_log = absl::GetFlag(FLAGS_access_log);
  return options;
}

// SIGTERM and SIGINT are blocked in every thread (set before any starts) and taken here.
void WaitForSignalThenShutdown(const sigset_t& signals, HttpServer* server) {
  int signal = 0;
  if (sigwait(&signals, &signal) != 0) return;
  std::fprintf(stderr, "serve: %s: no new connections; finishing requests in flight\n",
               strsignal(signal));
  server->Shutdown();
  if (sigwait(&signals, &signal) != 0) return;
  std::fprintf(stderr, "serve: %s again: exiting now\n", strsignal(signal));
  std::_Exit(1);
}

}  // namespace
}  // namespace lgpt

int main(int argc, char** argv) {
  using namespace lgpt;
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  InitTool(argc, argv,
           "serve [--checkpoint_dir=DIR] [--host=127.0.0.1 --port=8000] [--api_key=KEY] "
           "[--pool_mb=M] [--max_running=N --max_waiting=N] [--quantize=int8]");
  std::string checkpoint_dir = ResolvePath(absl::GetFlag(FLAGS_checkpoint_dir));
  if (checkpoint_dir.empty()) checkpoint_dir = DefaultModelDir();
  const EngineOptions engine_options = ValueOrDie(EngineOptionsFromServeFlags());
  const ServerOptions server_options = ValueOrDie(ServerOptionsFromFlags(engine_options));
  std::shared_ptr<const Engine> engine = ValueOrDie(Engine::Load(checkpoint_dir, engine_options));
  for (const std::string& warning : engine->warnings()) {
    std::fprintf(stderr, "serve: note: %s\n", warning.c_str());
  }
  std::unique_ptr<HttpServer> server = ValueOrDie(HttpServer::Create(engine, server_options));
  std::thread(WaitForSignalThenShutdown, signals, server.get()).detach();
  std::fprintf(stderr, "serve: listening on http://%s:%d (model %s, %s)\n",
               server_options.host.c_str(), server->port(), server->model_id().c_str(),
               server_options.api_key.empty() ? "no API key" : "API key required");
  std::fflush(stderr);
  server->Run();
  std::fprintf(stderr, "serve: stopped\n");
  return 0;
}
