// OpenAIServer as a service links it, on the embedded default model: a greedy completion over a
// free TCP port and over a Unix socket equals Engine::Generate's; Stop from another thread ends
// the Serve call, and Stop again, before Serve or while destroying, is fine; bad options, ports
// and socket paths are errors naming what is wrong; a stale socket file is replaced, a live one
// refused.
#include "tools/server/openai_server.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tools/server/default_engine_test_base.h"
#include "tools/server/test_client.h"

namespace lgpt {
namespace {

using json = nlohmann::json;

constexpr char kPrompt[] = "And God said";
constexpr char kGreedyRequest[] =
    R"({"prompt": "And God said", "max_tokens": 20, "temperature": 0})";

// A directory for socket files: TEST_TMPDIR, unless a socket path in it would not fit a socket
// address (Bazel's may lie deep), then a fresh one under /tmp.
class SocketDir {
 public:
  SocketDir() {
    const char* test_tmp = std::getenv("TEST_TMPDIR");
    const std::string base = test_tmp != nullptr ? test_tmp : "/tmp";
    std::string pattern = absl::StrCat(base.size() < 60 ? base : "/tmp", "/sockets_XXXXXX");
    EXPECT_NE(mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
  }
  ~SocketDir() { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return absl::StrCat(dir_, "/", name); }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

bool Exists(const std::string& path) {
  struct stat info {};
  return ::lstat(path.c_str(), &info) == 0;
}

bool IsSocket(const std::string& path) {
  struct stat info {};
  return ::lstat(path.c_str(), &info) == 0 && S_ISSOCK(info.st_mode);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A POST over the Unix socket at `path`, through cpp-httplib's client.
HttpReply UnixPost(const std::string& path, const std::string& target, const std::string& body) {
  httplib::Client client(path);
  client.set_address_family(AF_UNIX);
  client.set_read_timeout(60, 0);
  HttpReply reply;
  if (httplib::Result result = client.Post(target.c_str(), body, "application/json")) {
    reply.status = result->status;
    reply.body = result->body;
  } else {
    reply.error = httplib::to_string(result.error());
  }
  return reply;
}

HttpReply UnixGet(const std::string& path, const std::string& target) {
  httplib::Client client(path);
  client.set_address_family(AF_UNIX);
  HttpReply reply;
  if (httplib::Result result = client.Get(target.c_str())) {
    reply.status = result->status;
    reply.body = result->body;
  } else {
    reply.error = httplib::to_string(result.error());
  }
  return reply;
}

// A socket file no server listens on: bound, then closed (a server that died).
void MakeStaleSocket(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0)
      << std::strerror(errno);
  ::close(fd);
  ASSERT_TRUE(IsSocket(path));
}

OpenAIServerOptions QuietOptions() {
  OpenAIServerOptions options;
  options.access_log = false;
  return options;
}

class OpenAIServerTest : public DefaultEngineTest {
 protected:
  static std::unique_ptr<OpenAIServer> NewServer(OpenAIServerOptions options = QuietOptions()) {
    absl::StatusOr<std::unique_ptr<OpenAIServer>> server =
        OpenAIServer::Create(engine(), std::move(options));
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  // Engine::Generate of kPrompt with what kGreedyRequest asks for.
  static std::string GreedyText() {
    RequestOptions options;
    options.max_new_tokens = 20;
    options.sampling = {0, 0, 1};
    absl::StatusOr<Completion> completion = engine()->Generate(kPrompt, options);
    EXPECT_TRUE(completion.ok()) << completion.status();
    return completion.ok() ? completion->text : "";
  }

  static std::string CompletionText(const HttpReply& reply) {
    EXPECT_EQ(reply.status, 200) << reply.body << reply.error;
    const json body = json::parse(reply.body, nullptr, false);
    if (body.is_discarded() || !body.contains("choices")) return "<" + reply.body + ">";
    return body["choices"][0]["text"].get<std::string>();
  }
};

TEST_F(OpenAIServerTest, ServesACompletionOnAFreePort) {
  std::string announced;
  OpenAIServerOptions options = QuietOptions();
  options.on_serving = [&announced](const std::string& address) { announced = address; };
  std::unique_ptr<OpenAIServer> server = NewServer(options);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->model_id(), engine()->config().name);
  EXPECT_EQ(server->port(), 0);
  absl::Status served = absl::UnknownError("not returned");
  std::thread serving([&] { served = server->ServeOnPort("127.0.0.1", 0); });
  ASSERT_TRUE(server->WaitUntilServing());
  const int port = server->port();
  ASSERT_GT(port, 0);
  EXPECT_EQ(announced, absl::StrCat("http://127.0.0.1:", port));
  // One Serve call at a time.
  EXPECT_EQ(server->ServeOnPort("127.0.0.1", 0).code(), absl::StatusCode::kFailedPrecondition);

  EXPECT_EQ(CompletionText(HttpPost(port, "/v1/completions", kGreedyRequest)), GreedyText());
  EXPECT_EQ(HttpGet(port, "/health").status, 200);

  server->Stop();
  serving.join();
  EXPECT_TRUE(served.ok()) << served;
  EXPECT_EQ(HttpGet(port, "/health").status, -1);  // no longer listening
  server->Stop();                                  // again: nothing happens
  // Stopped for good: a later Serve call returns at once, binding nothing.
  EXPECT_TRUE(server->ServeOnPort("127.0.0.1", 0).ok());
  EXPECT_FALSE(server->WaitUntilServing());
}

TEST_F(OpenAIServerTest, ServesACompletionOnAUnixSocket) {
  SocketDir dir;
  const std::string path = dir.Path("lgpt.sock");
  std::string announced;
  OpenAIServerOptions options = QuietOptions();
  options.on_serving = [&announced](const std::string& address) { announced = address; };
  std::unique_ptr<OpenAIServer> server = NewServer(options);
  ASSERT_NE(server, nullptr);
  absl::Status served = absl::UnknownError("not returned");
  std::thread serving([&] { served = server->ServeOnSocket(path); });
  ASSERT_TRUE(server->WaitUntilServing());
  EXPECT_EQ(announced, "unix:" + path);
  EXPECT_EQ(server->port(), 0);
  EXPECT_TRUE(IsSocket(path));

  EXPECT_EQ(CompletionText(UnixPost(path, "/v1/completions", kGreedyRequest)), GreedyText());
  const HttpReply health = UnixGet(path, "/health");
  EXPECT_EQ(health.status, 200) << health.error;

  // Stop from another thread ends the Serve call; Stop twice is fine.
  std::thread stopper([&] {
    server->Stop();
    server->Stop();
  });
  stopper.join();
  serving.join();
  EXPECT_TRUE(served.ok()) << served;
  EXPECT_FALSE(Exists(path)) << "the socket file outlives the server";
  EXPECT_EQ(UnixGet(path, "/health").status, -1);
}

TEST_F(OpenAIServerTest, StopFromAnotherThreadReturnsTheServeCall) {
  std::unique_ptr<OpenAIServer> server = NewServer();
  ASSERT_NE(server, nullptr);
  std::thread stopper([&] {
    if (server->WaitUntilServing()) {
      EXPECT_EQ(HttpGet(server->port(), "/health").status, 200);
    }
    server->Stop();
    server->Stop();
  });
  const absl::Status served = server->ServeOnPort("127.0.0.1", 0);  // here, until Stop
  stopper.join();
  EXPECT_TRUE(served.ok()) << served;
}

TEST_F(OpenAIServerTest, StopBeforeServeMakesServeReturnAtOnce) {
  SocketDir dir;
  std::unique_ptr<OpenAIServer> server = NewServer();
  ASSERT_NE(server, nullptr);
  server->Stop();
  EXPECT_FALSE(server->WaitUntilServing());
  EXPECT_TRUE(server->ServeOnPort("127.0.0.1", 0).ok());
  EXPECT_EQ(server->port(), 0);
  const std::string path = dir.Path("never.sock");
  EXPECT_TRUE(server->ServeOnSocket(path).ok());
  EXPECT_FALSE(Exists(path));
}

TEST_F(OpenAIServerTest, DestroyingStopsAServeCallInFlight) {
  std::unique_ptr<OpenAIServer> server = NewServer();
  ASSERT_NE(server, nullptr);
  absl::Status served = absl::UnknownError("not returned");
  OpenAIServer* raw = server.get();
  std::thread serving([&served, raw] { served = raw->ServeOnPort("127.0.0.1", 0); });
  ASSERT_TRUE(server->WaitUntilServing());
  const int port = server->port();
  server.reset();  // stops, and waits for the Serve call to return
  serving.join();
  EXPECT_TRUE(served.ok()) << served;
  EXPECT_EQ(HttpGet(port, "/health").status, -1);
}

TEST_F(OpenAIServerTest, BadSocketPathsAreInvalidArgumentNamingThePath) {
  SocketDir dir;
  std::unique_ptr<OpenAIServer> server = NewServer();
  ASSERT_NE(server, nullptr);
  const std::string file = dir.Path("not_a_socket");
  std::ofstream(file) << "keep me";
  const std::string too_long = dir.Path(std::string(200, 's'));
  for (const std::string& path :
       {std::string(), too_long, dir.Path("missing/lgpt.sock"), file, dir.dir() + "/",
        file + "/lgpt.sock", std::string("with\0nul", 8)}) {
    const absl::Status status = server->ServeOnSocket(path);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << path << ": " << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "ServeOnSocket path")) << status;
  }
  EXPECT_TRUE(absl::StrContains(server->ServeOnSocket(too_long).message(), "107")) << too_long;
  EXPECT_EQ(ReadFile(file), "keep me");  // never replaced

  // Failed calls leave the server as it was: it still serves a good path.
  const std::string good = dir.Path("good.sock");
  std::thread serving([&] { EXPECT_TRUE(server->ServeOnSocket(good).ok()); });
  ASSERT_TRUE(server->WaitUntilServing());
  EXPECT_EQ(UnixGet(good, "/health").status, 200);
  server->Stop();
  serving.join();
}

TEST_F(OpenAIServerTest, AStaleSocketIsReplacedALiveOneRefused) {
  SocketDir dir;
  const std::string path = dir.Path("lgpt.sock");
  MakeStaleSocket(path);
  EXPECT_EQ(UnixGet(path, "/health").status, -1);
  std::unique_ptr<OpenAIServer> first = NewServer();
  ASSERT_NE(first, nullptr);
  std::thread serving([&] { EXPECT_TRUE(first->ServeOnSocket(path).ok()); });
  ASSERT_TRUE(first->WaitUntilServing());
  EXPECT_EQ(UnixGet(path, "/health").status, 200);

  std::unique_ptr<OpenAIServer> second = NewServer();
  ASSERT_NE(second, nullptr);
  const absl::Status refused = second->ServeOnSocket(path);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), path)) << refused;
  EXPECT_EQ(UnixGet(path, "/health").status, 200);  // the first still serves

  first->Stop();
  serving.join();
  EXPECT_FALSE(Exists(path));
}

TEST_F(OpenAIServerTest, BadOptionsAndAddressesAreErrorsNamingTheField) {
  EXPECT_EQ(OpenAIServer::Create(nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  const auto refused = [](const std::string& field, OpenAIServerOptions options) {
    const absl::Status status = OpenAIServer::Create(engine(), options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field << ": " << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "OpenAIServerOptions." + field)) << status;
    EXPECT_EQ(options.Validate().ok(), field == "prompt_style") << field;
  };
  OpenAIServerOptions options;
  options.http_threads = -1;
  refused("http_threads", options);
  options = {};
  options.http_threads = 2000;  // above max_http_threads
  refused("http_threads", options);
  options = {};
  options.max_http_threads = 0;
  refused("max_http_threads", options);
  options = {};
  options.max_body_bytes = 0;
  refused("max_body_bytes", options);
  options = {};
  options.shutdown_s = -1;
  refused("shutdown_s", options);
  options = {};
  options.default_max_tokens = 0;
  refused("default_max_tokens", options);
  options = {};
  options.prompt_style = "no-such-style";
  refused("prompt_style", options);
  options = {};
  options.speculative.method = "ngram";
  options.speculative.num_speculative_tokens = 0;
  refused("speculative.num_speculative_tokens", options);
  options = {};
  options.speculative.method = "lookahead";
  refused("speculative.method", options);
  // A draft default needs the engine's draft model: the options alone are fine.
  options = {};
  options.speculative.method = "draft";
  EXPECT_TRUE(options.Validate().ok());
  const absl::Status no_draft = OpenAIServer::Create(engine(), options).status();
  EXPECT_EQ(no_draft.code(), absl::StatusCode::kFailedPrecondition) << no_draft;
  EXPECT_TRUE(absl::StrContains(no_draft.message(), "OpenAIServerOptions.speculative.method"))
      << no_draft;

  std::unique_ptr<OpenAIServer> server = NewServer();
  ASSERT_NE(server, nullptr);
  for (int port : {-1, 65536, 70000}) {
    const absl::Status status = server->ServeOnPort("127.0.0.1", port);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "ServeOnPort port")) << status;
  }
  EXPECT_EQ(server->ServeOnPort("", 0).code(), absl::StatusCode::kInvalidArgument);

  // A port another server holds is Unavailable; the call may be retried elsewhere.
  std::unique_ptr<OpenAIServer> holder = NewServer();
  ASSERT_NE(holder, nullptr);
  std::thread holding([&] { EXPECT_TRUE(holder->ServeOnPort("127.0.0.1", 0).ok()); });
  ASSERT_TRUE(holder->WaitUntilServing());
  const absl::Status taken = server->ServeOnPort("127.0.0.1", holder->port());
  EXPECT_EQ(taken.code(), absl::StatusCode::kUnavailable) << taken;
  holder->Stop();
  holding.join();
}

}  // namespace
}  // namespace lgpt
