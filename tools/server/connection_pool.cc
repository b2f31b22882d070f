#include "tools/server/connection_pool.h"

#include <algorithm>
#include <utility>

namespace lgpt {

ConnectionPool::ConnectionPool(int base, int most, std::chrono::milliseconds idle_timeout)
    : base_(std::max(base, 1)),
      most_(std::max(most, std::max(base, 1))),
      idle_timeout_(idle_timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int i = 0; i < base_; ++i) {
    std::thread thread([this] { Work(); });
    threads_.emplace(thread.get_id(), std::move(thread));
  }
  peak_ = base_;
}

ConnectionPool::~ConnectionPool() { shutdown(); }

void ConnectionPool::enqueue(std::function<void()> job) {
  std::unique_lock<std::mutex> lock(mutex_);
  JoinEnded(lock);
  jobs_.push_back(std::move(job));
  // Every idle thread may already be promised to an earlier job: count the queue against them.
  const bool busy = static_cast<int>(jobs_.size()) > idle_;
  if (busy && static_cast<int>(threads_.size()) < most_ && !shutdown_) {
    std::thread thread([this] { Work(); });
    threads_.emplace(thread.get_id(), std::move(thread));
    peak_ = std::max(peak_, static_cast<int>(threads_.size()));
  }
  lock.unlock();
  work_.notify_one();
}

void ConnectionPool::JoinEnded(std::unique_lock<std::mutex>& lock) {
  std::vector<std::thread> ended;
  for (const std::thread::id id : ended_) {
    auto it = threads_.find(id);
    ended.push_back(std::move(it->second));
    threads_.erase(it);
  }
  ended_.clear();
  if (ended.empty()) return;
  lock.unlock();
  for (std::thread& thread : ended) thread.join();  // each has left Work already
  lock.lock();
}

void ConnectionPool::shutdown() {
  std::map<std::thread::id, std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shutdown_ = true;
  }
  work_.notify_all();
  // Threads end only by idleness or shutdown, and none starts after shutdown_.
  std::unique_lock<std::mutex> lock(mutex_);
  threads.swap(threads_);
  ended_.clear();
  lock.unlock();
  for (auto& [id, thread] : threads) thread.join();
}

int ConnectionPool::threads() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(threads_.size() - ended_.size());
}

int ConnectionPool::peak_threads() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_;
}

void ConnectionPool::Work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    ++idle_;
    const bool woken =
        work_.wait_for(lock, idle_timeout_, [this] { return shutdown_ || !jobs_.empty(); });
    --idle_;
    if (!woken) {
      // Idle for the timeout: threads beyond the base end (the base ones wait again).
      const int alive = static_cast<int>(threads_.size() - ended_.size());
      if (alive > base_) {
        ended_.push_back(std::this_thread::get_id());
        return;
      }
      continue;
    }
    if (jobs_.empty()) return;  // shut down with nothing left to run
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();
    lock.lock();
  }
}

}  // namespace lgpt
