#include "core/base/row_pool.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace lgpt {
namespace {

using Clock = std::chrono::steady_clock;

// Aborts the test binary, naming what hung, when no call has returned for `limit`: a hang
// fails in bounded time instead of waiting for Bazel's timeout.
class Watchdog {
 public:
  explicit Watchdog(std::chrono::seconds limit) : limit_(limit), thread_([this] { Watch(); }) {}
  ~Watchdog() {
    stop_.store(true);
    thread_.join();
  }
  void Progress(int64_t calls) { calls_.store(calls, std::memory_order_relaxed); }

 private:
  void Watch() {
    int64_t last = -1;
    Clock::time_point last_change = Clock::now();
    while (!stop_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const int64_t now = calls_.load(std::memory_order_relaxed);
      if (now != last) {
        last = now;
        last_change = Clock::now();
      } else if (Clock::now() - last_change > limit_) {
        std::fprintf(stderr, "RowPool hang: no call returned for %lld s after %lld calls\n",
                     static_cast<long long>(limit_.count()), static_cast<long long>(now));
        std::abort();
      }
    }
  }

  const std::chrono::seconds limit_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> calls_{0};
  std::thread thread_;
};

// Busy work of a given length that the compiler cannot drop.
void Spin(int iterations) {
  volatile int sink = 0;
  for (int i = 0; i < iterations; ++i) sink = sink + i;
}

// Runs one call and checks that each chunk ran exactly once.
void RunAndCheck(RowPool& pool, int threads, int64_t chunks, std::mt19937& rng,
                 std::vector<std::atomic<int>>& counts) {
  std::uniform_int_distribution<int> work(0, 3);
  std::vector<int> lengths(chunks);
  for (int& length : lengths) {
    const int kind = work(rng);  // Mostly short chunks, some long, some that yield.
    length = kind == 0 ? 0 : kind == 1 ? 50 : kind == 2 ? 2000 : -1;
  }
  for (int64_t c = 0; c < chunks; ++c) counts[c].store(0, std::memory_order_relaxed);
  pool.Run(threads, chunks, [&](int64_t c) {
    counts[c].fetch_add(1, std::memory_order_relaxed);
    if (lengths[c] < 0) {
      std::this_thread::yield();
    } else {
      Spin(lengths[c]);
    }
  });
  for (int64_t c = 0; c < chunks; ++c) {
    ASSERT_EQ(counts[c].load(std::memory_order_relaxed), 1)
        << "chunk " << c << " of " << chunks << " with " << threads << " threads";
  }
}

int64_t StressCalls() {
  // LGPT_ROW_POOL_STRESS_CALLS lets a developer run longer; the default runs in seconds.
  const char* env = std::getenv("LGPT_ROW_POOL_STRESS_CALLS");
  return env != nullptr ? std::atoll(env) : 200000;
}

TEST(RowPoolTest, EveryChunkRunsOnceUnderOversubscription) {
  RowPool pool;
  Watchdog watchdog(std::chrono::seconds(60));
  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> threads_dist(2, 8);  // Up to 4x the cores here.
  std::uniform_int_distribution<int64_t> chunks_dist(2, 64);
  std::vector<std::atomic<int>> counts(64);
  const int64_t calls = StressCalls();
  // Thread counts change rarely (each change restarts the workers), chunk counts every call.
  int threads = threads_dist(rng);
  for (int64_t call = 0; call < calls; ++call) {
    if (call % 5000 == 0) threads = threads_dist(rng);
    RunAndCheck(pool, threads, chunks_dist(rng), rng, counts);
    if (HasFatalFailure()) return;
    watchdog.Progress(call + 1);
  }
  EXPECT_EQ(pool.workers(), threads - 1);
}

// Callers that sleep between calls let the workers fall asleep; a call must wake them (or run
// without them) and never wait for a sleeping worker.
TEST(RowPoolTest, CallsAfterWorkersSleep) {
  RowPool pool;
  Watchdog watchdog(std::chrono::seconds(60));
  std::mt19937 rng(7);
  std::vector<std::atomic<int>> counts(16);
  for (int call = 0; call < 200; ++call) {
    if (call % 4 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
    RunAndCheck(pool, 3, 16, rng, counts);
    if (HasFatalFailure()) return;
    watchdog.Progress(call + 1);
  }
}

// Several threads share one pool: one owns it, the others run their chunks themselves.
TEST(RowPoolTest, ConcurrentCallersEachGetAllTheirChunks) {
  RowPool pool;
  Watchdog watchdog(std::chrono::seconds(60));
  constexpr int kCallers = 4;
  constexpr int kCalls = 5000;
  std::atomic<int64_t> finished{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < kCallers; ++t) {
    callers.emplace_back([&, t] {
      std::mt19937 rng(100 + t);
      std::uniform_int_distribution<int64_t> chunks_dist(2, 32);
      for (int call = 0; call < kCalls; ++call) {
        const int64_t chunks = chunks_dist(rng);
        std::vector<std::atomic<int>> counts(chunks);
        pool.Run(3, chunks, [&](int64_t c) { counts[c].fetch_add(1); });
        for (int64_t c = 0; c < chunks; ++c) {
          if (counts[c].load() != 1) failures.fetch_add(1);
        }
        watchdog.Progress(finished.fetch_add(1) + 1);
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(finished.load(), kCallers * kCalls);
}

TEST(RowPoolTest, ExceptionReachesTheCallerAfterAllChunksRan) {
  RowPool pool;
  for (int round = 0; round < 100; ++round) {
    std::vector<std::atomic<int>> counts(32);
    const int64_t throwing = round % 32;
    try {
      pool.Run(3, 32, [&](int64_t c) {
        counts[c].fetch_add(1);
        if (c == throwing) throw std::runtime_error("chunk failed");
      });
      FAIL() << "no exception in round " << round;
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "chunk failed");
    }
    for (int64_t c = 0; c < 32; ++c) ASSERT_EQ(counts[c].load(), 1) << "chunk " << c;
  }
  // The pool still works afterwards.
  std::atomic<int> sum{0};
  pool.Run(3, 10, [&](int64_t c) { sum.fetch_add(static_cast<int>(c)); });
  EXPECT_EQ(sum.load(), 45);
}

TEST(RowPoolTest, SerialCasesRunOnTheCaller) {
  RowPool pool;
  const std::thread::id caller = std::this_thread::get_id();
  for (const auto& [threads, chunks] : {std::pair<int, int64_t>{1, 8}, {4, 1}, {4, 0}}) {
    int64_t ran = 0;
    pool.Run(threads, chunks, [&](int64_t) {
      EXPECT_EQ(std::this_thread::get_id(), caller);
      ++ran;
    });
    EXPECT_EQ(ran, chunks);
  }
  EXPECT_EQ(pool.workers(), 0);
}

TEST(RowPoolTest, MoreChunksThanTheClaimWordCountsRunInGroups) {
  RowPool pool;
  for (const int64_t chunks : {RowPool::kMaxChunks, RowPool::kMaxChunks + 1, int64_t{100000}}) {
    std::vector<std::atomic<int>> counts(chunks);
    pool.Run(3, chunks, [&](int64_t c) { counts[c].fetch_add(1); });
    for (int64_t c = 0; c < chunks; ++c) ASSERT_EQ(counts[c].load(), 1) << c << " of " << chunks;
  }
}

TEST(RowPoolTest, DestroyedWhileWorkersSleepOrSpin) {
  for (int round = 0; round < 50; ++round) {
    auto pool = std::make_unique<RowPool>();
    std::atomic<int> ran{0};
    pool->Run(2 + round % 4, 8, [&](int64_t) { ran.fetch_add(1); });
    EXPECT_EQ(ran.load(), 8);
    if (round % 2 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    pool.reset();  // Joins the workers; must neither hang nor touch freed state.
  }
}

}  // namespace
}  // namespace lgpt
