#include "tools/server/connection_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace lgpt {
namespace {

using std::chrono::milliseconds;

// Jobs that hold their thread until Release, as a slow client holds its connection's.
class Gate {
 public:
  void Wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    ++waiting_;
    changed_.notify_all();
    changed_.wait(lock, [this] { return open_; });
  }
  // Whether `n` jobs are inside Wait within a few seconds.
  bool AwaitWaiting(int n) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, std::chrono::seconds(10), [&] { return waiting_ >= n; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int waiting_ = 0;
  bool open_ = false;
};

bool Eventually(const std::function<bool()>& done) {
  for (int i = 0; i < 1000 && !done(); ++i) std::this_thread::sleep_for(milliseconds(10));
  return done();
}

TEST(ConnectionPool, GrowsPastItsBaseWhileEveryThreadIsHeld) {
  ConnectionPool pool(2, 16, milliseconds(100));
  Gate gate;
  for (int i = 0; i < 10; ++i) pool.enqueue([&] { gate.Wait(); });
  // Ten held jobs run at once on a base of two; one more still runs at once.
  EXPECT_TRUE(gate.AwaitWaiting(10));
  std::atomic<bool> ran{false};
  pool.enqueue([&] { ran = true; });
  EXPECT_TRUE(Eventually([&] { return ran.load(); }));
  EXPECT_GE(pool.peak_threads(), 11);
  gate.Release();
  // The extra threads end once idle; the base stays.
  EXPECT_TRUE(Eventually([&] { return pool.threads() == 2; })) << pool.threads();
  pool.shutdown();
}

TEST(ConnectionPool, NeverExceedsItsMostAndRunsTheRestLater) {
  ConnectionPool pool(1, 4, milliseconds(50));
  Gate gate;
  std::atomic<int> done{0};
  for (int i = 0; i < 12; ++i) {
    pool.enqueue([&] {
      gate.Wait();
      ++done;
    });
  }
  EXPECT_TRUE(gate.AwaitWaiting(4));
  EXPECT_EQ(pool.threads(), 4);
  gate.Release();
  EXPECT_TRUE(Eventually([&] { return done.load() == 12; })) << done.load();
  EXPECT_LE(pool.peak_threads(), 4);
  pool.shutdown();
}

TEST(ConnectionPool, ShutdownRunsWhatIsQueuedAndJoins) {
  std::atomic<int> done{0};
  {
    ConnectionPool pool(1, 1, milliseconds(1000));
    for (int i = 0; i < 50; ++i) pool.enqueue([&] { ++done; });
    pool.shutdown();
    EXPECT_EQ(done.load(), 50);
    pool.shutdown();  // again, as the destructor does
  }
  EXPECT_EQ(done.load(), 50);
}

}  // namespace
}  // namespace lgpt
