#include "core/dist/launcher.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace lgpt {
namespace {

void WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

struct Rank {
  pid_t pid = -1;
  int out_fd = -1;  // rank 0 only
  int err_fd = -1;
  std::string err_partial;  // stderr text after the last newline
  bool exited = false;
  int exit_code = 0;
};

std::string Describe(int status, int* code) {
  if (WIFEXITED(status)) {
    *code = WEXITSTATUS(status);
    return absl::StrCat("exited with status ", *code);
  }
  if (WIFSIGNALED(status)) {
    *code = 128 + WTERMSIG(status);
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  *code = 1;
  return "ended";
}

}  // namespace

absl::StatusOr<int> FreeLocalPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string error = strerror(errno);
    close(fd);
    return absl::InternalError(absl::StrCat("finding a free port: ", error));
  }
  close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

absl::StatusOr<int> LaunchRanks(const LaunchSpec& spec) {
  if (spec.world_size < 1) return absl::InvalidArgumentError("world size must be >= 1");
  if (spec.argv.empty()) return absl::InvalidArgumentError("argv must hold argv[0]");
  auto say = [&](const std::string& line) {
    WriteAll(spec.stderr_fd, "[launcher] " + line + "\n");
  };

  // Everything the children need is built before fork: between fork and exec only
  // async-signal-safe calls are made (the parent may run threads).
  std::vector<std::string> base_env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool overridden = false;
    for (const char* key : {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE="}) {
      if (absl::StartsWith(entry, key)) overridden = true;
    }
    for (const auto& [key, value] : spec.env) {
      if (absl::StartsWith(entry, key + "=")) overridden = true;
    }
    if (!overridden) base_env.push_back(entry);
  }
  for (const auto& [key, value] : spec.env) base_env.push_back(key + "=" + value);
  // Local ranks share the machine's cores: without an explicit OMP_NUM_THREADS each would
  // start a thread per core, and N ranks would then oversubscribe the cores N times (every
  // all-reduce waiting on descheduled threads).
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    base_env.push_back(
        absl::StrCat("OMP_NUM_THREADS=", std::max(1, cores / std::max(1, spec.world_size))));
  }
  std::vector<char*> argv;
  for (const std::string& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  // SIGTERM, SIGINT and SIGHUP sent to the launcher go to every rank (a server's rank 0 then
  // shuts down gracefully and the others follow it); the ranks start with the launcher's
  // previous signal mask.
  struct ForwardedSignals {
    sigset_t set, previous;
    int fd = -1;
    ForwardedSignals() {
      sigemptyset(&set);
      for (int signal : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&set, signal);
      pthread_sigmask(SIG_BLOCK, &set, &previous);
      fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    }
    ~ForwardedSignals() {
      if (fd >= 0) close(fd);
      pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    }
  } forwarded;
  std::vector<Rank> ranks(spec.world_size);
  auto kill_all = [&](int signal) {
    for (Rank& r : ranks) {
      // Each rank leads its own process group: its children (a shell's sleep, a helper) go too.
      if (r.pid > 0 && !r.exited) kill(-r.pid, signal);
    }
  };
  for (int rank = 0; rank < spec.world_size; ++rank) {
    std::vector<std::string> env_strings = base_env;
    env_strings.push_back(absl::StrCat("RANK=", rank));
    env_strings.push_back(absl::StrCat("LOCAL_RANK=", rank));
    env_strings.push_back(absl::StrCat("WORLD_SIZE=", spec.world_size));
    env_strings.push_back(absl::StrCat("LOCAL_WORLD_SIZE=", spec.world_size));
    std::vector<char*> envp;
    for (const std::string& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);

    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    if ((rank == 0 && pipe2(out_pipe, O_CLOEXEC) != 0) || pipe2(err_pipe, O_CLOEXEC) != 0) {
      kill_all(SIGKILL);
      return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
    }
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
      kill_all(SIGKILL);
      return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
    }
    if (pid == 0) {
      // A rank must not outlive its launcher (a killed test, a closed terminal).
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      sigprocmask(SIG_SETMASK, &forwarded.previous, nullptr);
      setpgid(0, 0);
      if (rank == 0) {
        dup2(out_pipe[1], STDOUT_FILENO);
      } else {
        const int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, STDOUT_FILENO);
      }
      dup2(err_pipe[1], STDERR_FILENO);
      execve(spec.executable.c_str(), argv.data(), envp.data());
      const char message[] = "[launcher] exec failed\n";
      (void)!write(STDERR_FILENO, message, sizeof(message) - 1);
      _exit(127);
    }
    setpgid(pid, pid);  // also here, so kill_all cannot race the child's own setpgid
    ranks[rank].pid = pid;
    if (rank == 0) {
      close(out_pipe[1]);
      ranks[rank].out_fd = out_pipe[0];
    }
    close(err_pipe[1]);
    ranks[rank].err_fd = err_pipe[0];
  }

  const absl::Time deadline = absl::Now() + spec.timeout;
  absl::Time kill_at = absl::InfiniteFuture();
  int result = 0;
  int running = spec.world_size;
  bool failed = false;
  auto fail = [&](int code, const std::string& why) {
    if (failed) return;
    failed = true;
    result = code == 0 ? 1 : code;
    say(why);
    if (running > 0 && spec.stop_on_failure) {
      say("stopping the other ranks");
      kill_all(SIGTERM);
      kill_at = absl::Now() + spec.grace;
    }
  };
  char buffer[1 << 14];
  absl::Time all_exited = absl::InfiniteFuture();
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<std::pair<int, bool>> owners;  // rank, is stdout
    for (int r = 0; r < spec.world_size; ++r) {
      if (ranks[r].out_fd >= 0) {
        fds.push_back({ranks[r].out_fd, POLLIN, 0});
        owners.push_back({r, true});
      }
      if (ranks[r].err_fd >= 0) {
        fds.push_back({ranks[r].err_fd, POLLIN, 0});
        owners.push_back({r, false});
      }
    }
    if (running == 0 && fds.empty()) break;
    // Output pipes a rank's leftover children still hold must not keep the launcher waiting.
    if (running == 0 && absl::Now() > all_exited + absl::Seconds(1)) {
      for (Rank& r : ranks) {
        if (r.out_fd >= 0) close(r.out_fd);
        if (r.err_fd >= 0) close(r.err_fd);
        r.out_fd = r.err_fd = -1;
      }
      break;
    }
    if (forwarded.fd >= 0) {
      fds.push_back({forwarded.fd, POLLIN, 0});
      owners.push_back({-1, false});
    }
    if (!fds.empty()) {
      poll(fds.data(), fds.size(), 50);
    } else {
      usleep(50 * 1000);
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      if (owners[i].first < 0) {  // a signal for the ranks
        signalfd_siginfo info;
        while (read(forwarded.fd, &info, sizeof(info)) == sizeof(info)) {
          say(absl::StrCat("passing ", strsignal(static_cast<int>(info.ssi_signo)),
                           " to the ranks"));
          kill_all(static_cast<int>(info.ssi_signo));
        }
        continue;
      }
      Rank& rank = ranks[owners[i].first];
      const ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (owners[i].second) {
        if (n > 0) {
          WriteAll(spec.stdout_fd, std::string(buffer, n));
        } else {
          close(rank.out_fd);
          rank.out_fd = -1;
        }
        continue;
      }
      const std::string prefix = absl::StrCat("[rank ", owners[i].first, "] ");
      if (n > 0) {
        rank.err_partial.append(buffer, n);
        size_t newline;
        while ((newline = rank.err_partial.find('\n')) != std::string::npos) {
          WriteAll(spec.stderr_fd, prefix + rank.err_partial.substr(0, newline + 1));
          rank.err_partial.erase(0, newline + 1);
        }
      } else {
        if (!rank.err_partial.empty()) WriteAll(spec.stderr_fd, prefix + rank.err_partial + "\n");
        rank.err_partial.clear();
        close(rank.err_fd);
        rank.err_fd = -1;
      }
    }
    for (int r = 0; r < spec.world_size; ++r) {
      Rank& rank = ranks[r];
      if (rank.exited) continue;
      int status = 0;
      if (waitpid(rank.pid, &status, WNOHANG) != rank.pid) continue;
      rank.exited = true;
      if (--running == 0) all_exited = absl::Now();
      const std::string how = Describe(status, &rank.exit_code);
      if (rank.exit_code != 0) {
        if (failed) {
          say(absl::StrCat("rank ", r, " ", how));
        } else {
          fail(rank.exit_code, absl::StrCat("rank ", r, " ", how));
        }
      }
    }
    const absl::Time now = absl::Now();
    if (running > 0 && now >= kill_at) {
      kill_all(SIGKILL);
      kill_at = absl::InfiniteFuture();
    }
    if (running > 0 && now >= deadline && !failed) {
      fail(124, absl::StrCat("timed out after ", absl::FormatDuration(spec.timeout)));
    }
  }
  if (!failed) return 0;
  return result;
}

std::optional<int> LaunchIfRequested(int tensor_parallel, int argc, char** argv) {
  if (tensor_parallel <= 1 || std::getenv("RANK") != nullptr) return std::nullopt;
  absl::StatusOr<int> port = FreeLocalPort();
  if (!port.ok()) {
    std::cerr << "[launcher] " << port.status().message() << "\n";
    return 1;
  }
  LaunchSpec spec;
  spec.world_size = tensor_parallel;
  spec.argv.assign(argv, argv + argc);
  spec.env = {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", absl::StrCat(*port)}};
  absl::StatusOr<int> code = LaunchRanks(spec);
  if (!code.ok()) {
    std::cerr << "[launcher] " << code.status().message() << "\n";
    return 1;
  }
  return *code;
}

}  // namespace lgpt
