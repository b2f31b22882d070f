#include "tools/server/openai_server.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "core/text/prompt_style.h"
#include "tools/server/http_server.h"

namespace lgpt {
namespace {

// The longest path a Unix socket address holds, its terminating NUL aside (107 on Linux).
constexpr size_t kMostSocketPathBytes = sizeof(sockaddr_un::sun_path) - 1;

absl::Status BadSocketPath(const std::string& path, absl::string_view why) {
  return InvalidFieldError(FieldRef("ServeOnSocket.path", "ServeOnSocket path"),
                           absl::StrCat("ServeOnSocket path '", absl::CHexEscape(path), "' ", why));
}

// Whether a server accepts connections on the Unix socket at `path` (false: connection
// refused, a socket file its server left behind).
absl::StatusOr<bool> SocketIsLive(const std::string& path) {
  const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  int connected;
  do {
    connected = ::connect(probe, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  } while (connected != 0 && errno == EINTR);
  const int error = errno;
  ::close(probe);
  if (connected == 0 || error == EAGAIN) return true;  // EAGAIN: live, its backlog full
  if (error == ECONNREFUSED) return false;
  return BadSocketPath(path, absl::StrCat("cannot be probed: ", std::strerror(error)));
}

// A path a Unix socket can be bound to: one that fits a socket address, in a directory that
// exists, free or holding a socket file no server listens on any more (removed here).
absl::Status FreeSocketPath(const std::string& path) {
  if (path.empty()) return BadSocketPath(path, "is empty");
  if (path.find('\0') != std::string::npos) return BadSocketPath(path, "holds a NUL byte");
  if (path.size() > kMostSocketPathBytes) {
    return BadSocketPath(path, absl::StrCat("is ", path.size(), " bytes long; a Unix socket path ",
                                            "holds at most ", kMostSocketPathBytes));
  }
  if (path.back() == '/') return BadSocketPath(path, "names a directory");
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  struct stat info {};
  if (::stat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return BadSocketPath(path, absl::StrCat("is in '", dir, "', which is not a directory"));
  }
  if (::lstat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return BadSocketPath(path, absl::StrCat("cannot be read: ", std::strerror(errno)));
  }
  if (!S_ISSOCK(info.st_mode)) return BadSocketPath(path, "exists and is not a socket");
  ASSIGN_OR_RETURN(const bool live, SocketIsLive(path));
  if (live) {
    return absl::UnavailableError(
        absl::StrCat("ServeOnSocket path '", path, "': a server is listening on it"));
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return BadSocketPath(
        path, absl::StrCat("holds a stale socket that cannot be removed: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// The library's speculation errors (SpeculativeSpec.method, ...) naming this option's fields
// (OpenAIServerOptions.speculative.method, ...).
absl::Status InServerOptionTerms(absl::Status status) {
  for (const char* field :
       {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"}) {
    status = RenameField(status, absl::StrCat("SpeculativeSpec.", field),
                         absl::StrCat("OpenAIServerOptions.speculative.", field));
  }
  return status;
}

}  // namespace

absl::Status OpenAIServerOptions::Validate() const {
  if (max_http_threads < 1 || max_http_threads > kMostHttpThreads) {
    return InvalidFieldError("OpenAIServerOptions.max_http_threads",
                             absl::StrCat("OpenAIServerOptions.max_http_threads must be in [1, ",
                                          kMostHttpThreads, "], got ", max_http_threads));
  }
  if (http_threads < 0 || http_threads > max_http_threads) {
    return InvalidFieldError("OpenAIServerOptions.http_threads",
                             absl::StrCat("OpenAIServerOptions.http_threads must be in [0, ",
                                          max_http_threads, "], got ", http_threads));
  }
  if (max_body_bytes < 1 || max_body_bytes > kMostBodyBytes) {
    return InvalidFieldError("OpenAIServerOptions.max_body_bytes",
                             absl::StrCat("OpenAIServerOptions.max_body_bytes must be in [1, ",
                                          kMostBodyBytes, "], got ", max_body_bytes));
  }
  if (!(shutdown_s >= 0)) {
    return InvalidFieldError(
        "OpenAIServerOptions.shutdown_s",
        absl::StrCat("OpenAIServerOptions.shutdown_s must be >= 0, got ", shutdown_s));
  }
  if (default_max_tokens < 1) {
    return InvalidFieldError(
        "OpenAIServerOptions.default_max_tokens",
        absl::StrCat("OpenAIServerOptions.default_max_tokens must be >= 1, got ",
                     default_max_tokens));
  }
  return InServerOptionTerms(ValidateSpeculativeSpec(speculative));
}

struct OpenAIServer::Impl {
  std::shared_ptr<const Engine> engine;
  OpenAIServerOptions options;
  std::string model_id;

  mutable std::mutex mutex;  // guards what follows
  mutable std::condition_variable changed;
  bool stopped = false;          // Stop was called
  bool in_serve = false;         // a Serve call has not returned yet
  bool serving = false;          // it listens
  bool ended = false;            // a Serve call has returned (or failed)
  HttpServer* server = nullptr;  // while serving
  int port = 0;
};

OpenAIServer::OpenAIServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<OpenAIServer>> OpenAIServer::Create(
    std::shared_ptr<const Engine> engine, OpenAIServerOptions options) {
  if (engine == nullptr) return absl::InvalidArgumentError("OpenAIServer::Create: no engine");
  RETURN_IF_ERROR(options.Validate());
  RETURN_IF_ERROR(InServerOptionTerms(CheckServerSpeculation(options.speculative, *engine)));
  // The chat framing, checked now rather than when serving begins.
  if (engine->tokenizer() != nullptr) {
    absl::StatusOr<PromptStyle> style =
        options.prompt_style.empty()
            ? PromptStyleForCheckpoint(engine->checkpoint_dir(), engine->config())
            : PromptStyleFromName(options.prompt_style);
    if (!style.ok() && !options.prompt_style.empty()) {
      return InvalidFieldError(
          "OpenAIServerOptions.prompt_style",
          absl::StrCat("OpenAIServerOptions.prompt_style: ", style.status().message()));
    }
    RETURN_IF_ERROR(style.status());
  }
  if (options.http_threads == 0) {
    const SchedulerOptions& serving = engine->serving_options();
    options.http_threads = static_cast<int>(
        std::min<int64_t>(serving.max_running + serving.max_waiting + 8, options.max_http_threads));
  }
  auto impl = std::make_unique<Impl>();
  impl->model_id = options.model_id.empty() ? engine->config().name : options.model_id;
  impl->engine = std::move(engine);
  impl->options = std::move(options);
  return std::unique_ptr<OpenAIServer>(new OpenAIServer(std::move(impl)));
}

OpenAIServer::~OpenAIServer() {
  Stop();
  std::unique_lock<std::mutex> lock(impl_->mutex);
  impl_->changed.wait(lock, [this] { return !impl_->in_serve; });
}

absl::Status OpenAIServer::ServeOnPort(const std::string& host, int port) {
  if (host.empty()) {
    return InvalidFieldError(FieldRef("ServeOnPort.host", "ServeOnPort host"),
                             "ServeOnPort host is empty");
  }
  if (port < 0 || port > 65535) {
    return InvalidFieldError(FieldRef("ServeOnPort.port", "ServeOnPort port"),
                             absl::StrCat("ServeOnPort port must be in [0, 65535], got ", port));
  }
  return Serve(host, port, "");
}

absl::Status OpenAIServer::ServeOnSocket(const std::string& path) {
  RETURN_IF_ERROR(FreeSocketPath(path));
  return Serve("", 0, path);
}

absl::Status OpenAIServer::Serve(const std::string& host, int port,
                                 const std::string& unix_socket) {
  Impl& impl = *impl_;
  {
    std::lock_guard<std::mutex> lock(impl.mutex);
    if (impl.in_serve) {
      return absl::FailedPreconditionError("OpenAIServer: another Serve call is serving");
    }
    if (impl.stopped) return absl::OkStatus();
    impl.in_serve = true;
  }
  // Whatever happens next, the Serve call ends here: waiters wake, the destructor may go on.
  const auto finish = [&impl](absl::Status status) {
    std::lock_guard<std::mutex> lock(impl.mutex);
    impl.server = nullptr;
    impl.serving = false;
    impl.in_serve = false;
    impl.ended = true;
    impl.changed.notify_all();  // under the lock: the destructor waits for in_serve
    return status;
  };
  ServerOptions options;
  options.host = host;
  options.port = port;
  options.unix_socket = unix_socket;
  options.api_key = impl.options.api_key;
  options.model_id = impl.model_id;
  options.prompt_style = impl.options.prompt_style;
  options.max_body_bytes = impl.options.max_body_bytes;
  options.http_threads = impl.options.http_threads;
  options.max_http_threads = impl.options.max_http_threads;
  options.shutdown_s = impl.options.shutdown_s;
  options.default_max_tokens = impl.options.default_max_tokens;
  options.access_log = impl.options.access_log;
  options.cors_allow_origin = impl.options.cors_allow_origin;
  options.embedding_pooling = impl.options.embedding_pooling;
  options.speculative = impl.options.speculative;
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Create(impl.engine, options);
  if (!server.ok()) return finish(server.status());
  {
    std::lock_guard<std::mutex> lock(impl.mutex);
    impl.port = (*server)->port();  // on_serving may ask
  }
  if (impl.options.on_serving) {
    impl.options.on_serving(unix_socket.empty()
                                ? absl::StrCat("http://", host, ":", (*server)->port())
                                : absl::StrCat("unix:", unix_socket));
  }
  // A Stop that came while binding finds no server to shut down: nothing is served then.
  bool publish;
  {
    std::lock_guard<std::mutex> lock(impl.mutex);
    publish = !impl.stopped;
    if (publish) {
      impl.server = server->get();
      impl.serving = true;
      impl.changed.notify_all();
    }
  }
  if (!publish) return finish(absl::OkStatus());
  (*server)->Run();
  {
    std::lock_guard<std::mutex> lock(impl.mutex);
    impl.server = nullptr;  // Stop no longer reaches it
  }
  server->reset();  // waits for the shutdown sequence; removes the socket file
  return finish(absl::OkStatus());
}

void OpenAIServer::Stop() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->stopped = true;
  if (impl_->server != nullptr) impl_->server->Shutdown();  // returns at once
  impl_->changed.notify_all();
}

bool OpenAIServer::WaitUntilServing() const {
  std::unique_lock<std::mutex> lock(impl_->mutex);
  impl_->changed.wait(lock, [this] {
    return impl_->serving || impl_->stopped || (impl_->ended && !impl_->in_serve);
  });
  return impl_->serving;
}

int OpenAIServer::port() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->port;
}

const std::string& OpenAIServer::model_id() const { return impl_->model_id; }

}  // namespace lgpt
