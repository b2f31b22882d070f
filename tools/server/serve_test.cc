// //tools:serve as a user runs it, on the embedded default model, over loopback: greedy replies
// equal //tools:generate's, a load of 200 requests 16 at a time where every reply equals its
// request served alone and the server's open files and memory come back to where they were,
// and SIGTERM with streams in flight (they finish, or are cancelled at the deadline; exit 0).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tools/server/test_client.h"

extern char** environ;

namespace lgpt {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir ? dir : "/tmp", "/", name);
}

// The serve binary, its stderr in a file, on a port it chose (or on the Unix socket
// `unix_socket`).
class ServeProcess {
 public:
  explicit ServeProcess(const std::vector<std::string>& flags,
                        const std::string& unix_socket = "") {
    log_ = TempPath(absl::StrCat("serve_", ++count_, ".log"));
    std::vector<std::string> args = {
        "tools/serve", unix_socket.empty() ? "--port=0" : "--unix_socket=" + unix_socket,
        "--threads=2"};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 2, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    EXPECT_EQ(posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    if (!unix_socket.empty()) {
      const std::string marker = absl::StrCat("listening on unix:", unix_socket, " ");
      for (int i = 0; i < 1200 && !listening_; ++i) {
        listening_ = absl::StrContains(ReadFile(log_), marker);
        if (!listening_) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      EXPECT_TRUE(listening_) << ReadFile(log_);
      return;
    }
    const std::string marker = "listening on http://127.0.0.1:";
    for (int i = 0; i < 1200 && port_ == 0; ++i) {
      const std::string log = ReadFile(log_);
      const size_t at = log.find(marker);
      if (at != std::string::npos) {
        const size_t end = log.find(' ', at + marker.size());
        if (end != std::string::npos) {
          EXPECT_TRUE(
              absl::SimpleAtoi(log.substr(at + marker.size(), end - at - marker.size()), &port_));
        }
      }
      if (port_ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_GT(port_, 0) << ReadFile(log_);
  }
  ~ServeProcess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string log() const { return ReadFile(log_); }

  // The exit status after a wait of at most `seconds`; -1 if still running.
  int WaitExit(double seconds) {
    const Clock::time_point end =
        Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
    while (Clock::now() < end) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

  int64_t OpenFiles() const {
    int64_t count = 0;
    for (const auto& entry :
         std::filesystem::directory_iterator(absl::StrCat("/proc/", pid_, "/fd"))) {
      (void)entry;
      ++count;
    }
    return count;
  }

  int64_t RssKb() const {
    std::istringstream status(ReadFile(absl::StrCat("/proc/", pid_, "/status")));
    std::string line;
    while (std::getline(status, line)) {
      if (absl::StartsWith(line, "VmRSS:")) return std::atoll(line.c_str() + 6);
    }
    return -1;
  }

 private:
  static inline int count_ = 0;
  std::string log_;
  pid_t pid_ = -1;
  int port_ = 0;
  bool listening_ = false;  // on the Unix socket
  bool exited_ = false;
};

std::string RunCommand(const std::string& command) {
  const std::string out = TempPath("generate.out");
  EXPECT_EQ(std::system(absl::StrCat(command, " > ", out, " 2>/dev/null").c_str()), 0) << command;
  return ReadFile(out);
}

std::string CompletionText(const HttpReply& reply) {
  EXPECT_EQ(reply.status, 200) << reply.body << reply.error;
  const json body = json::parse(reply.body, nullptr, false);
  if (!body.is_object() || !body.contains("choices")) return "<no choices: " + reply.body + ">";
  const json& choice = body["choices"][0];
  return choice.contains("text") ? choice["text"].get<std::string>()
                                 : choice["message"]["content"].get<std::string>();
}

TEST(ServeTest, GreedyRepliesEqualTheGenerateTool) {
  ServeProcess serve({});
  for (const std::string cache : {"", "--kv_cache=sink --kv_budget=16 --kv_bits=8"}) {
    // generate echoes an unframed prompt, then streams the reply, then a newline.
    const std::string generated = RunCommand(absl::StrCat(
        "tools/generate --prompt='And God said' --temperature=0 --max_new_tokens=40 ", cache));
    const std::string fields =
        cache.empty() ? "" : R"(, "kv_cache": "sink", "kv_budget": 16, "kv_bits": 8)";
    const std::string completion = CompletionText(
        HttpPost(serve.port(), "/v1/completions",
                 absl::StrCat(R"({"prompt": "And God said", "max_tokens": 40, "temperature": 0)",
                              fields, "}")));
    EXPECT_EQ(absl::StrCat("And God said", completion, "\n"), generated) << cache;
    // The default model's prompt style frames a lone user message as itself.
    const std::string chat = CompletionText(
        HttpPost(serve.port(), "/v1/chat/completions",
                 absl::StrCat(R"({"messages": [{"role": "user", "content": "And God said"}],
                                  "max_tokens": 40, "temperature": 0)",
                              fields, "}")));
    EXPECT_EQ(chat, completion) << cache;
  }
}

// One request of the load: a body, streamed or not.
struct LoadRequest {
  std::string body;
  bool stream = false;
};

std::string Serve(int port, const LoadRequest& request) {
  if (!request.stream) return CompletionText(HttpPost(port, "/v1/completions", request.body));
  const StreamReply reply =
      HttpPostStream(port, "/v1/completions",
                     request.body.substr(0, request.body.size() - 1) + R"(, "stream": true})");
  EXPECT_EQ(reply.status, 200) << reply.body << reply.error;
  EXPECT_FALSE(reply.events.empty());
  if (reply.events.empty() || reply.events.back() != "[DONE]") return "<unfinished stream>";
  return StreamedText(reply.events);
}

// Runs `requests` from `clients` threads at once; each reply against `expected`.
void RunLoad(int port, const std::vector<LoadRequest>& requests,
             const std::vector<std::string>& expected, int clients, int64_t total) {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> mismatches{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      for (int64_t i = next++; i < total; i = next++) {
        const size_t k = static_cast<size_t>(i) % requests.size();
        const std::string text = Serve(port, requests[k]);
        if (text != expected[k]) {
          ++mismatches;
          ADD_FAILURE() << "request " << i << " (" << requests[k].body << ") gave '" << text
                        << "', alone '" << expected[k] << "'";
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// Polls until `done` or `seconds` passed.
template <typename F>
bool Eventually(double seconds, F done) {
  const Clock::time_point end =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  while (Clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return done();
}

TEST(ServeTest, LoadOf200RequestsAt16AtOnce) {
  ServeProcess serve({"--access_log=false"});
  const int port = serve.port();
  const std::vector<std::string> prompts = {
      "And God said", "In the beginning",    "The LORD is my shepherd",
      "Blessed are",  "And it came to pass", "Thou shalt"};
  std::vector<LoadRequest> requests;
  for (size_t p = 0; p < prompts.size(); ++p) {
    const std::string greedy =
        absl::StrCat(R"({"prompt": ")", prompts[p], R"(", "max_tokens": 24, "temperature": 0})");
    const std::string sampled = absl::StrCat(
        R"({"prompt": ")", prompts[p],
        R"(", "max_tokens": 24, "temperature": 0.8, "top_k": 50, "seed": )", p + 1, "}");
    requests.push_back({greedy, false});
    requests.push_back({sampled, p % 2 == 0});
    requests.push_back({greedy, true});
  }
  std::vector<std::string> expected;
  for (const LoadRequest& request : requests) expected.push_back(Serve(port, request));
  // A first concurrent round brings the server to its working size (threads' arenas, the
  // scheduler's batch buffers); files and memory are measured from there.
  RunLoad(port, requests, expected, 16, 32);
  auto idle = [&] {
    return MetricValue(HttpGet(port, "/metrics").body, "lgpt_requests_running") == 0;
  };
  ASSERT_TRUE(Eventually(10, idle));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int64_t files_before = serve.OpenFiles();
  const int64_t rss_before = serve.RssKb();

  const Clock::time_point start = Clock::now();
  RunLoad(port, requests, expected, 16, 200);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_LT(seconds, 60);
  std::fprintf(stderr, "200 requests, 16 at once: %.1f s\n", seconds);

  ASSERT_TRUE(Eventually(10, idle));
  // A request is counted after its last byte is sent: the client may see it first.
  std::string metrics;
  const std::string served =
      "lgpt_http_requests_total{endpoint=\"/v1/completions\",status=\"200\"}";
  EXPECT_TRUE(Eventually(10, [&] {
    metrics = HttpGet(port, "/metrics").body;
    return MetricValue(metrics, served) == 232 + static_cast<double>(requests.size());
  })) << metrics;
  EXPECT_EQ(MetricValue(metrics, "lgpt_scheduler_requests_failed_total"), 0);
  EXPECT_TRUE(Eventually(10, [&] { return serve.OpenFiles() <= files_before; }))
      << serve.OpenFiles() << " open files, " << files_before << " before";
  const int64_t rss_after = serve.RssKb();
  std::fprintf(stderr, "RSS %lld kB before, %lld kB after\n", static_cast<long long>(rss_before),
               static_cast<long long>(rss_after));
  EXPECT_LE(rss_after, rss_before + rss_before / 10 + 16 * 1024);
}

// Opens `count` long streams and returns once each has its first event.
std::vector<std::thread> OpenStreams(int port, int count, std::vector<StreamReply>& replies,
                                     std::atomic<int>& started) {
  replies.resize(static_cast<size_t>(count));
  std::vector<std::thread> threads;
  for (int i = 0; i < count; ++i) {
    threads.emplace_back([&, i] {
      bool first = true;
      replies[static_cast<size_t>(i)] =
          HttpPostStream(port, "/v1/chat/completions",
                         absl::StrCat(R"({"messages": [{"role": "user", "content": "And God said"}],
                          "stream": true, "temperature": 5, "max_tokens": 200, "seed": )",
                                      i + 1, "}"),
                         [&](const std::string&) {
                           if (first) ++started;
                           first = false;
                           return true;
                         });
      if (first) ++started;
    });
  }
  Eventually(60, [&] { return started.load() == count; });
  return threads;
}

TEST(ServeTest, SigtermLetsStreamsInFlightFinishThenExitsZero) {
  ServeProcess serve({"--shutdown_s=30"});
  std::vector<StreamReply> replies;
  std::atomic<int> started{0};
  std::vector<std::thread> streams = OpenStreams(serve.port(), 4, replies, started);
  ASSERT_EQ(started.load(), 4);
  ASSERT_EQ(kill(serve.pid(), SIGTERM), 0);
  // No new connections once the signal is handled.
  EXPECT_TRUE(Eventually(5, [&] { return HttpGet(serve.port(), "/health").status == -1; }));
  for (std::thread& stream : streams) stream.join();
  EXPECT_EQ(serve.WaitExit(30), 0) << serve.log();
  for (const StreamReply& reply : replies) {
    ASSERT_FALSE(reply.events.empty());
    EXPECT_EQ(reply.events.back(), "[DONE]");
    const std::string finish = StreamedFinishReason(reply.events);
    EXPECT_TRUE(finish == "length" || finish == "stop") << finish;
  }
  EXPECT_TRUE(absl::StrContains(serve.log(), "serve: stopped")) << serve.log();
}

TEST(ServeTest, SigtermDeadlineCancelsStreamsThenExitsZero) {
  ServeProcess serve({"--shutdown_s=0"});
  std::vector<StreamReply> replies;
  std::atomic<int> started{0};
  std::vector<std::thread> streams = OpenStreams(serve.port(), 3, replies, started);
  ASSERT_EQ(started.load(), 3);
  ASSERT_EQ(kill(serve.pid(), SIGINT), 0);
  for (std::thread& stream : streams) stream.join();
  EXPECT_EQ(serve.WaitExit(30), 0) << serve.log();
  int cancelled = 0;
  for (const StreamReply& reply : replies) {
    ASSERT_GE(reply.events.size(), 2u);
    EXPECT_EQ(reply.events.back(), "[DONE]");
    cancelled += absl::StrContains(reply.events[reply.events.size() - 2], "shut down");
  }
  EXPECT_GE(cancelled, 1) << serve.log();
  EXPECT_TRUE(absl::StrContains(serve.log(), "cancelling")) << serve.log();
}

// A socket path that fits a socket address: in TEST_TMPDIR unless Bazel's lies too deep.
std::string SocketPath(const std::string& name) {
  const std::string path = TempPath(name);
  return path.size() < 100 ? path : absl::StrCat("/tmp/", getpid(), "_", name);
}

TEST(ServeTest, ServesOnAUnixSocket) {
  const std::string path = SocketPath("serve.sock");
  ServeProcess serve({}, path);
  httplib::Client client(path);
  client.set_address_family(AF_UNIX);
  client.set_read_timeout(60, 0);
  const std::string generated =
      RunCommand("tools/generate --prompt='And God said' --temperature=0 --max_new_tokens=20");
  const httplib::Result reply = client.Post(
      "/v1/completions", R"({"prompt": "And God said", "max_tokens": 20, "temperature": 0})",
      "application/json");
  ASSERT_TRUE(reply) << httplib::to_string(reply.error()) << serve.log();
  HttpReply http;
  http.status = reply->status;
  http.body = reply->body;
  EXPECT_EQ(absl::StrCat("And God said", CompletionText(http), "\n"), generated);
  EXPECT_TRUE(Eventually(5, [&] {
    return absl::StrContains(serve.log(), "unix POST /v1/completions 200");
  })) << serve.log();
  ASSERT_EQ(kill(serve.pid(), SIGTERM), 0);
  EXPECT_EQ(serve.WaitExit(30), 0) << serve.log();
  struct stat info {};
  EXPECT_NE(::lstat(path.c_str(), &info), 0) << "the socket file outlives serve";
}

TEST(ServeTest, UnixSocketExcludesPortAndHostAndChecksItsPath) {
  const std::string file = TempPath("not_a_socket");
  std::ofstream(file) << "keep me";
  for (const std::string& flags :
       {absl::StrCat("--unix_socket=", SocketPath("x.sock"), " --port=8000"),
        absl::StrCat("--unix_socket=", SocketPath("x.sock"), " --host=127.0.0.1"),
        absl::StrCat("--unix_socket=", file), std::string("--unix_socket=/no/such/dir/x.sock"),
        absl::StrCat("--unix_socket=/tmp/", std::string(120, 's'))}) {
    const std::string err = TempPath("bad_socket.err");
    const int status =
        std::system(absl::StrCat("tools/serve ", flags, " 2>", err, " >/dev/null").c_str());
    EXPECT_EQ(WEXITSTATUS(status), 1) << flags;
    const std::string message = ReadFile(err);
    EXPECT_TRUE(absl::StrContains(message, "serve: error: --unix_socket")) << message;
    EXPECT_FALSE(absl::StrContains(message, "ServeOnSocket")) << message;
  }
  EXPECT_EQ(ReadFile(file), "keep me");
}

TEST(ServeTest, BadFlagsAreOneLine) {
  for (const std::string flag :
       {"--port=70000", "--max_running=0", "--max_waiting=-1", "--max_waiting=0", "--quantize=int3",
        "--pool_mb=-1", "--pool_mb=99999999999999", "--http_threads=-1", "--http_threads=100000000",
        "--speculative=eagle", "--speculative=draft", "--speculative_k=0", "--speculative_k=65",
        "--ngram_min=0"}) {
    const std::string err = TempPath("bad_flag.err");
    const int status =
        std::system(absl::StrCat("tools/serve ", flag, " 2>", err, " >/dev/null").c_str());
    EXPECT_EQ(WEXITSTATUS(status), 1) << flag;
    const std::string message = ReadFile(err);
    EXPECT_TRUE(absl::StrContains(message, "serve: error: ")) << message;
    // The flag by its name, never the options field behind it.
    const std::string name = flag.substr(0, flag.find('='));
    EXPECT_TRUE(absl::StrContains(message, name)) << message;
    EXPECT_FALSE(absl::StrContains(message, "Options.")) << message;
  }
}

}  // namespace
}  // namespace lgpt
