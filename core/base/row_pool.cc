#include "core/base/row_pool.h"

#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace lgpt {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Waits for `done()` by spinning (a decode step's products come back to back, and on a loaded
// machine sched_yield can hand the core away for a whole time slice), then yielding once the
// wait has lasted long enough that the thread we wait for is probably not running.
template <typename Done>
void SpinUntil(int spins, Done done) {
  for (int spin = 0; !done(); ++spin) {
    if (spin < spins) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
}

}  // namespace

RowPool& RowPool::Get() {
  static RowPool* pool = new RowPool();
  return *pool;
}

RowPool::~RowPool() {
  std::lock_guard<std::mutex> busy(run_mu_);
  Stop();
}

int RowPool::workers() const { return worker_count_.load(std::memory_order_relaxed); }

void RowPool::Run(int threads, int64_t chunks, const std::function<void(int64_t)>& fn) {
  if (chunks <= kMaxChunks) return RunPooled(threads, chunks, fn);
  // Group consecutive chunks so that the claim word can count them.
  RunPooled(threads, kMaxChunks, [&](int64_t group) {
    const int64_t end = (group + 1) * chunks / kMaxChunks;
    for (int64_t c = group * chunks / kMaxChunks; c < end; ++c) fn(c);
  });
}

void RowPool::RunPooled(int threads, int64_t chunks, const std::function<void(int64_t)>& fn) {
  std::unique_lock<std::mutex> busy(run_mu_, std::try_to_lock);
  if (threads <= 1 || chunks <= 1 || !busy.owns_lock()) {
    for (int64_t c = 0; c < chunks; ++c) fn(c);
    return;
  }
  Resize(threads - 1);
  error_ = nullptr;
  fn_.store(&fn, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  const uint64_t generation = ++generation_ & ((uint64_t{1} << (64 - 2 * kCountBits)) - 1);
  // Publishes fn_ and done_ with the new tag. seq_cst pairs with the sleepers' count below:
  // either this thread sees a sleeper and wakes it, or the sleeper sees the new tag.
  claim_.store(MakeClaim(generation, chunks), std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lock(sleep_mu_);
    wake_.notify_all();
  }
  Work(generation);
  // Every chunk has been claimed; wait for those still running on workers.
  SpinUntil(spins_.load(std::memory_order_relaxed),
            [&] { return done_.load(std::memory_order_acquire) == chunks; });
  if (error_ != nullptr) std::rethrow_exception(std::exchange(error_, nullptr));
}

void RowPool::Work(uint64_t generation) {
  uint64_t claim = claim_.load(std::memory_order_acquire);
  while (GenerationOf(claim) == generation && IndexOf(claim) < ChunksOf(claim)) {
    // Fails if another thread took this chunk or a newer call replaced the word.
    if (claim_.compare_exchange_weak(claim, claim + 1, std::memory_order_acq_rel,
                                     std::memory_order_acquire)) {
      // The call cannot finish (nor fn_ change) before this chunk is counted done.
      RunChunk(*fn_.load(std::memory_order_relaxed), IndexOf(claim));
      done_.fetch_add(1, std::memory_order_release);
      claim = claim_.load(std::memory_order_acquire);
    }
  }
}

void RowPool::RunChunk(const std::function<void(int64_t)>& fn, int64_t chunk) {
  try {
    fn(chunk);
  } catch (...) {
    std::lock_guard<std::mutex> lock(error_mu_);
    if (error_ == nullptr) error_ = std::current_exception();
  }
}

void RowPool::WorkerLoop() {
  uint64_t seen = GenerationOf(claim_.load(std::memory_order_acquire));
  auto has_news = [&] {
    return GenerationOf(claim_.load(std::memory_order_seq_cst)) != seen ||
           stop_.load(std::memory_order_acquire);
  };
  while (true) {
    const int spins = spins_.load(std::memory_order_relaxed);
    for (int spin = 0; spin < spins && !has_news(); ++spin) CpuRelax();
    if (!has_news()) {
      std::unique_lock<std::mutex> lock(sleep_mu_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      wake_.wait(lock, has_news);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = GenerationOf(claim_.load(std::memory_order_acquire));
    Work(seen);
  }
}

void RowPool::Resize(int workers) {
  if (static_cast<int>(workers_.size()) == workers) return;
  Stop();
  stop_.store(false, std::memory_order_release);
  // About a millisecond of spinning covers the gaps between a decode step's products. With
  // more threads than cores a spinning thread only takes time from the one it waits for.
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  spins_.store(cores > 0 && workers + 1 > cores ? 64 : 20000, std::memory_order_relaxed);
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  worker_count_.store(workers, std::memory_order_relaxed);
}

void RowPool::Stop() {
  if (workers_.empty()) return;
  stop_.store(true, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(sleep_mu_);
    wake_.notify_all();
  }
  for (std::thread& t : workers_) t.join();
  workers_.clear();
  worker_count_.store(0, std::memory_order_relaxed);
}

}  // namespace lgpt
