// An OpenAI-compatible HTTP server over the engine's continuous batching
// (tools/server/openai_server.h), the embedded default model when --checkpoint_dir is not given:
//   bazel run //tools:serve -- [--checkpoint_dir=DIR] [--host=127.0.0.1 --port=8000 |
//       --unix_socket=PATH] [--api_key=KEY] [--pool_mb=M | --kv_memory_fraction=F]
//       [--kv_pool_dtype=auto]
//       [--max_running=N --max_waiting=N] [--quantize=int8]
//       [--speculative=ngram|draft:DIR --speculative_k=K --speculative_max_rows=N]
// Prints "serve: listening on http://HOST:PORT" (or "unix:PATH") on stderr once it accepts
// connections (--port=0 takes a free port), then one access-log line per request. SIGTERM or
// SIGINT: stops accepting, lets requests in flight finish within --shutdown_s, cancels the rest,
// exits 0. --speculative (with --speculative_k, --ngram_min, --ngram_max) is the speculative
// decoding of requests that give no speculative_config (tools/speculative_flags.h);
// draft:DIR loads the draft model beside the model.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/base/device.h"
#include "core/base/status_macros.h"
#include "lgpt.h"
#include "tools/load_flags.h"
#include "tools/peft_flags.h"
#include "tools/server/openai_server.h"
#include "tools/speculative_flags.h"
#include "tools/tool_util.h"
#include "tools/tp_flags.h"

ABSL_FLAG(std::string, checkpoint_dir, "",
          "LitGPT checkpoint or fine-tune directory; empty: the embedded default model");
ABSL_FLAG(std::string, host, "127.0.0.1", "address to listen on (0.0.0.0: every interface)");
ABSL_FLAG(int32_t, port, 8000, "port to listen on; 0: any free port");
ABSL_FLAG(std::string, unix_socket, "",
          "serve on this Unix-domain socket instead of --host:--port (a stale socket file left "
          "by a server that has gone is replaced)");
ABSL_FLAG(std::string, api_key, "",
          "require 'Authorization: Bearer KEY' on /v1/ (empty: no authentication)");
ABSL_FLAG(std::string, served_model_name, "",
          "the model's id in the API; empty: the checkpoint's model name");
ABSL_FLAG(std::string, prompt_style, "",
          "how chat messages are framed (llama3, chatml, ...); empty: the checkpoint's own");
ABSL_FLAG(int64_t, pool_mb, 0, "shared paged KV pool in MiB; 0: each request its own cache");
ABSL_FLAG(double, kv_memory_fraction, 0,
          "instead of --pool_mb: a pool of this fraction of the device's memory free once the "
          "model is loaded, in (0, 1) (as vLLM's gpu_memory_utilization, of the free memory); "
          "0: off");
ABSL_FLAG(std::string, kv_pool_dtype, "auto",
          "the pool's KV entries: auto (bfloat16 for float32 models on the CPU), model, float32, "
          "bfloat16, float16, int8 or int4 (codes and a float16 scale per 32 channels)");
ABSL_FLAG(int64_t, max_running, 16, "requests decoding at once (rows of a decode step)");
ABSL_FLAG(int64_t, max_waiting, 64, "queued requests; beyond, 429 with Retry-After");
ABSL_FLAG(int64_t, speculative_max_rows, 0,
          "with --speculative: speculate only in steps of at most this many decode rows "
          "(vLLM's speculative_disable_by_batch_size); 0: any number");
ABSL_FLAG(int64_t, max_body_bytes, 1 << 20, "largest request body; beyond, 413");
ABSL_FLAG(int32_t, http_threads, 0,
          "connections served at once, at most 1024; 0: --max_running + --max_waiting + 8 "
          "(at most 1024)");
ABSL_FLAG(double, shutdown_s, 10, "on SIGTERM/SIGINT, seconds requests in flight may still run");
ABSL_FLAG(bool, access_log, true, "one line per request on stderr");
ABSL_FLAG(std::string, embedding_pooling, "last",
          "how /v1/embeddings pools the final hidden states: last (token) or mean");
ABSL_FLAG(std::string, cors_allow_origin, "",
          "CORS for browser clients: \"*\" or one origin (https://app.example); empty: off");
ABSL_FLAG(std::string, precision, "32-true", "32-true, bf16-true or 16-true");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda[:N]");
ABSL_FLAG(std::string, quantize, "none",
          "none, or int8: int8 weight-only projections (CPU, --precision=32-true)");

namespace lgpt {
namespace {

absl::StatusOr<EngineOptions> EngineOptionsFromServeFlags(int argc, char** argv) {
  EngineOptions options;
  ASSIGN_OR_RETURN(ServeLoraFlags loras, ServeLoras(argc, argv));
  options.loras = std::move(loras.loras);
  options.adapters = std::move(loras.adapters);
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
  options.kv_pool_memory_fraction = absl::GetFlag(FLAGS_kv_memory_fraction);
  options.kv_pool_dtype = absl::GetFlag(FLAGS_kv_pool_dtype);
  options.serving.max_running = absl::GetFlag(FLAGS_max_running);
  options.serving.max_waiting = absl::GetFlag(FLAGS_max_waiting);
  options.serving.speculative_max_rows = absl::GetFlag(FLAGS_speculative_max_rows);
  // Every request waits for the scheduler's next step: with no room to wait, all are 429s.
  if (options.serving.max_waiting < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_waiting must be >= 1 (each request waits for the next step), got ",
                     options.serving.max_waiting));
  }
  RETURN_IF_ERROR(options.serving.Validate());  // Die names the flags (InFlagTerms)
  return options;
}

absl::StatusOr<OpenAIServerOptions> ServerOptionsFromFlags() {
  OpenAIServerOptions options;
  options.api_key = absl::GetFlag(FLAGS_api_key);
  options.model_id = absl::GetFlag(FLAGS_served_model_name);
  options.prompt_style = absl::GetFlag(FLAGS_prompt_style);
  options.max_body_bytes = absl::GetFlag(FLAGS_max_body_bytes);
  options.http_threads = absl::GetFlag(FLAGS_http_threads);
  options.shutdown_s = absl::GetFlag(FLAGS_shutdown_s);
  options.access_log = absl::GetFlag(FLAGS_access_log);
  options.cors_allow_origin = absl::GetFlag(FLAGS_cors_allow_origin);
  const std::string pooling = absl::GetFlag(FLAGS_embedding_pooling);
  if (pooling != "last" && pooling != "mean") {
    return absl::InvalidArgumentError(
        absl::StrCat("--embedding_pooling must be last or mean, got '", pooling, "'"));
  }
  options.embedding_pooling = pooling == "mean" ? Engine::Pooling::kMean : Engine::Pooling::kLast;
  RETURN_IF_ERROR(options.Validate());  // Die names the flags (InFlagTerms)
  return options;
}

// Whether the command line sets flag `name` (--name=V, --name V, -name=V, ...) before "--".
bool FlagGiven(int argc, char** argv, absl::string_view name) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "--")) absl::ConsumePrefix(&arg, "-");
    if (arg == name || absl::StartsWith(arg, absl::StrCat(name, "="))) return true;
  }
  return false;
}

// Where to serve: --unix_socket, or --host and --port (which it excludes).
absl::Status CheckListenFlags(int argc, char** argv) {
  if (!absl::GetFlag(FLAGS_unix_socket).empty()) {
    for (const char* flag : {"port", "host"}) {
      if (FlagGiven(argc, argv, flag)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--unix_socket and --", flag,
                         " exclude each other: serve on a Unix socket or on ", "--host:--port"));
      }
    }
    return absl::OkStatus();
  }
  const int port = absl::GetFlag(FLAGS_port);
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--port must be in [0, 65535], got ", port));
  }
  return absl::OkStatus();
}

// SIGTERM and SIGINT are blocked in every thread (set before any starts) and taken here.
void WaitForSignalThenStop(const sigset_t& signals, OpenAIServer* server) {
  int signal = 0;
  if (sigwait(&signals, &signal) != 0) return;
  std::fprintf(stderr, "serve: %s: no new connections; finishing requests in flight\n",
               strsignal(signal));
  server->Stop();
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
           "serve [--checkpoint_dir=DIR] [--host=127.0.0.1 --port=8000 | --unix_socket=PATH] "
           "[--api_key=KEY] [--pool_mb=M | --kv_memory_fraction=F] [--kv_pool_dtype=auto] "
           "[--max_running=N --max_waiting=N] "
           "[--quantize=int8] [--lora=NAME=DIR ...] [--tp=N] "
           "[--speculative=ngram|draft:DIR --speculative_k=K --speculative_max_rows=N]");
  // --tp=N: N local ranks of this command (or one rank of a torchrun-style world); rank 0
  // serves HTTP, the others follow its steps on their shards.
  if (std::optional<int> code = ValueOrDie(LaunchTensorParallel(argc, argv))) return *code;
  const std::shared_ptr<ProcessGroup> group =
      ValueOrDie(JoinTensorParallel(ValueOrDie(ParseDevice(absl::GetFlag(FLAGS_device)))));
  DieIfError(CheckListenFlags(argc, argv));
  std::string checkpoint_dir = ResolvePath(absl::GetFlag(FLAGS_checkpoint_dir));
  if (checkpoint_dir.empty()) checkpoint_dir = DefaultModelDir();
  const std::string unix_socket = ResolvePath(absl::GetFlag(FLAGS_unix_socket));
  EngineOptions engine_options = ValueOrDie(EngineOptionsFromServeFlags(argc, argv));
  engine_options.tensor_parallel = group;
  OpenAIServerOptions server_options = ValueOrDie(ServerOptionsFromFlags());
  // The requests' default speculation; draft:DIR loads the draft model with the engine.
  RequestOptions speculative;
  DieIfError(ApplySpeculativeFlags(speculative, engine_options));
  server_options.speculative = speculative.speculative;
  std::shared_ptr<const Engine> engine = ValueOrDie(Engine::Load(checkpoint_dir, engine_options));
  if (group != nullptr && group->rank() != 0) {
    const absl::Status followed = engine->FollowServing();
    if (followed.ok()) return 0;
    std::fprintf(stderr, "serve: rank %d: %s\n", group->rank(), followed.ToString().c_str());
    return 1;
  }
  for (const std::string& warning : engine->warnings()) {
    std::fprintf(stderr, "serve: note: %s\n", warning.c_str());
  }
  const OpenAIServer* listening = nullptr;  // set before serving begins
  const bool api_key = !server_options.api_key.empty();
  server_options.on_serving = [&listening, api_key](const std::string& address) {
    std::fprintf(stderr, "serve: listening on %s (model %s, %s)\n", address.c_str(),
                 listening->model_id().c_str(), api_key ? "API key required" : "no API key");
    std::fflush(stderr);
  };
  std::unique_ptr<OpenAIServer> server = ValueOrDie(OpenAIServer::Create(engine, server_options));
  listening = server.get();
  std::thread(WaitForSignalThenStop, signals, server.get()).detach();
  std::atomic<bool> serving_done{false};
  std::thread watcher;
  if (group != nullptr) {
    // A rank gone ends serving: requests in flight fail with the error, and the server exits
    // non-zero rather than answer without its ranks.
    watcher = std::thread([&engine, &serving_done, server = server.get()] {
      while (!serving_done && engine->ServingStatus().ok()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
      if (serving_done) return;
      std::fprintf(stderr, "serve: serving over ranks failed: %s; stopping\n",
                   engine->ServingStatus().ToString().c_str());
      server->Stop();
    });
  }
  DieIfError(unix_socket.empty()
                 ? server->ServeOnPort(absl::GetFlag(FLAGS_host), absl::GetFlag(FLAGS_port))
                 : server->ServeOnSocket(unix_socket));
  serving_done = true;
  if (watcher.joinable()) watcher.join();
  const int code = engine->ServingStatus().ok() ? 0 : 1;
  // The engine goes last: over ranks its scheduler tells the other ranks to stop.
  server.reset();
  engine.reset();
  std::fprintf(stderr, "serve: stopped\n");
  return code;
}
