// Serving over ranks across two "hosts": two network namespaces joined by a veth pair
// (iproute2), rank 0 of `serve --tp=2` in one and rank 1 in the other, started as torchrun
// starts them (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GLOO_SOCKET_IFNAME). A completion
// over HTTP equals the same request through one process; rank 1 killed mid-stream, the
// streaming client gets an error and rank 0's server exits non-zero, within 30 s. Needs root and
// `ip netns` (skipped, saying so, without them).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lgpt.h"

namespace lgpt {
namespace {

int Shell(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str());
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class TwoHosts : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string id = absl::StrCat(getpid() % 100000);
    a_ = "lgpt-a-" + id;
    b_ = "lgpt-b-" + id;
    veth_a_ = "lga" + id;
    veth_b_ = "lgb" + id;
    if (geteuid() != 0 || Shell("ip netns add " + a_) != 0) {
      GTEST_SKIP() << "needs root and iproute2's `ip netns` (network namespaces): not tested here";
    }
    made_ = true;
    const std::vector<std::string> setup = {
        "ip netns add " + b_,
        absl::StrCat("ip link add ", veth_a_, " type veth peer name ", veth_b_),
        absl::StrCat("ip link set ", veth_a_, " netns ", a_),
        absl::StrCat("ip link set ", veth_b_, " netns ", b_),
        absl::StrCat("ip -n ", a_, " addr add 10.231.0.1/24 dev ", veth_a_),
        absl::StrCat("ip -n ", b_, " addr add 10.231.0.2/24 dev ", veth_b_),
        absl::StrCat("ip -n ", a_, " link set ", veth_a_, " up"),
        absl::StrCat("ip -n ", b_, " link set ", veth_b_, " up"),
        absl::StrCat("ip -n ", a_, " link set lo up"),
        absl::StrCat("ip -n ", b_, " link set lo up")};
    for (const std::string& step : setup) ASSERT_EQ(Shell(step), 0) << step;
  }
  void TearDown() override {
    for (pid_t pid : {rank0_, rank1_}) {
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
    if (made_) {
      Shell("ip netns delete " + a_);
      Shell("ip netns delete " + b_);
    }
  }

  // `serve --tp=2` as rank `rank` in namespace `ns`, its stderr in `log`.
  pid_t StartRank(int rank, const std::string& ns, const std::string& veth,
                  const std::string& log) {
    const pid_t pid = fork();
    if (pid == 0) {
      setenv("RANK", absl::StrCat(rank).c_str(), 1);
      setenv("WORLD_SIZE", "2", 1);
      setenv("MASTER_ADDR", "10.231.0.1", 1);
      setenv("MASTER_PORT", "29613", 1);
      setenv("GLOO_SOCKET_IFNAME", veth.c_str(), 1);
      setenv("OMP_NUM_THREADS", "1", 1);
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, STDERR_FILENO);
      execlp("ip", "ip", "netns", "exec", ns.c_str(), "tools/serve", "--tp=2", "--host=10.231.0.1",
             "--port=8199", "--access_log=false", "--tp_timeout_s=10", static_cast<char*>(nullptr));
      _exit(127);
    }
    return pid;
  }

  std::string a_, b_, veth_a_, veth_b_;
  bool made_ = false;
  pid_t rank0_ = -1, rank1_ = -1;
};

TEST_F(TwoHosts, ServesOverRanksInTwoNamespacesAndExitsWhenARankDies) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::string log0 = dir + "/rank0.log", log1 = dir + "/rank1.log";
  rank1_ = StartRank(1, b_, veth_b_, log1);
  rank0_ = StartRank(0, a_, veth_a_, log0);
  bool listening = false;
  for (int i = 0; i < 600 && !listening; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    listening = ReadFile(log0).find("listening on") != std::string::npos;
  }
  ASSERT_TRUE(listening) << ReadFile(log0) << ReadFile(log1);
  const std::string reply = dir + "/reply.json";
  const std::string request = absl::StrCat(
      "ip netns exec ", a_,
      " python3 -c \"import json,urllib.request as u; r=u.urlopen(u.Request("
      "'http://10.231.0.1:8199/v1/completions', data=json.dumps({'prompt': 'In the beginning', "
      "'max_tokens': 12, 'temperature': 0}).encode(), headers={'Content-Type': "
      "'application/json'}), timeout=60); open('",
      reply, "', 'w').write(json.loads(r.read())['choices'][0]['text'])\"");
  ASSERT_EQ(Shell(request), 0) << ReadFile(log0) << ReadFile(log1);
  // The same request through one process.
  absl::StatusOr<std::shared_ptr<const Engine>> engine = Engine::Load("tools/default_model");
  ASSERT_TRUE(engine.ok()) << engine.status();
  RequestOptions options;
  options.max_new_tokens = 12;
  options.sampling.temperature = 0;
  absl::StatusOr<Completion> alone = (*engine)->Generate("In the beginning", options);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(ReadFile(reply), alone->text);

  // Rank 1 dies mid-stream: the client's stream ends with an error, not the reply's end, and
  // rank 0's server stops and exits non-zero, all within 30 s.
  const std::string started = dir + "/started", outcome = dir + "/outcome";
  const std::string stream_client = absl::StrCat(
      "ip netns exec ", a_, " python3 -c \"", "import json,urllib.request as u\n",
      "out = 'completed'\n", "try:\n",
      "  r = u.urlopen(u.Request('http://10.231.0.1:8199/v1/completions', data=json.dumps(",
      "{'prompt': 'In the beginning', 'max_tokens': 240, 'temperature': 0, 'ignore_eos': True, ",
      "'stream': True}).encode(), headers={'Content-Type': 'application/json'}), timeout=30)\n",
      "  chunks = 0\n", "  for line in r:\n", "    line = line.decode().strip()\n",
      "    if not line.startswith('data: '): continue\n", "    if line == 'data: [DONE]': break\n",
      "    event = json.loads(line[6:])\n",
      "    if 'error' in event: out = 'error: ' + json.dumps(event['error']); break\n",
      "    chunks += 1\n", "    if chunks == 1: open('", started, "', 'w').write('1')\n",
      "  else:\n", "    out = 'error: the stream ended early'\n", "except Exception as e:\n",
      "  out = 'error: ' + repr(e)\n", "open('", outcome, "', 'w').write(out)\n\"");
  std::thread client([&] { Shell(stream_client); });
  for (int i = 0; i < 300 && ReadFile(started).empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto killed = std::chrono::steady_clock::now();
  kill(rank1_, SIGKILL);
  waitpid(rank1_, nullptr, 0);
  rank1_ = -1;
  int status = 0;
  bool exited = false;
  for (int i = 0; i < 300 && !exited; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    exited = waitpid(rank0_, &status, WNOHANG) == rank0_;
  }
  client.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count(), 30);
  EXPECT_EQ(ReadFile(outcome).rfind("error", 0), 0u) << ReadFile(outcome);
  ASSERT_TRUE(exited) << "rank 0 still serving 30 s after rank 1 died\n" << ReadFile(log0);
  rank0_ = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << ReadFile(log0);
  EXPECT_NE(ReadFile(log0).find("serving over ranks failed"), std::string::npos) << ReadFile(log0);
}

}  // namespace
}  // namespace lgpt
