// The threads that serve the HTTP server's connections. cpp-httplib serves a connection on one
// thread until it closes, and its own pool has a fixed number of them: a few hundred clients
// that trickle in their headers or body held every thread for the read timeout while /health
// and every other client waited. This pool keeps `base` threads and starts another, up to
// `most`, whenever a connection arrives and none is idle; threads beyond `base` end after
// `idle_timeout` without work.
#ifndef LGPT_TOOLS_SERVER_CONNECTION_POOL_H_
#define LGPT_TOOLS_SERVER_CONNECTION_POOL_H_

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "httplib.h"

namespace lgpt {

class ConnectionPool : public httplib::TaskQueue {
 public:
  // base >= 1, most >= base (both clamped so).
  ConnectionPool(int base, int most, std::chrono::milliseconds idle_timeout);
  ~ConnectionPool() override;
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  void enqueue(std::function<void()> job) override;
  // Runs the jobs already queued, then joins every thread.
  void shutdown() override;

  int threads() const;  // alive now
  int peak_threads() const;

 private:
  void Work();
  // Joins threads that ended for idleness (they are only collected here, not by themselves).
  void JoinEnded(std::unique_lock<std::mutex>& lock);

  const int base_, most_;
  const std::chrono::milliseconds idle_timeout_;
  mutable std::mutex mutex_;
  std::condition_variable work_;
  std::deque<std::function<void()>> jobs_;
  std::map<std::thread::id, std::thread> threads_;
  std::vector<std::thread::id> ended_;
  int idle_ = 0;
  int peak_ = 0;
  bool shutdown_ = false;
};

}  // namespace lgpt

#endif  // LGPT_TOOLS_SERVER_CONNECTION_POOL_H_
