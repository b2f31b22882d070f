// A persistent thread pool for the short parallel loops of CPU decoding (GEMV rows, quantised
// GEMV rows). A decode step issues hundreds of such loops back to back, each a few tens of
// microseconds long, so the pool's cost per call matters more than its generality.
//
// Unlike an OpenMP team (a static split and a barrier per call), chunks are claimed from a
// shared counter, so a worker that the OS has descheduled (2 cores shared with other work)
// delays a call by at most one chunk: the caller takes over the rest.
//
// Each call is tagged with a generation, and a chunk is claimed by one compare-and-swap of the
// word (generation, next chunk). A worker that wakes late for an earlier call cannot claim a
// chunk of the current one: its swap fails on the tag. The counters are therefore never reset
// under a running worker, and a call returns exactly when all of its chunks have run.
#ifndef LGPT_CORE_BASE_ROW_POOL_H_
#define LGPT_CORE_BASE_ROW_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lgpt {

class RowPool {
 public:
  // The process-wide pool the kernels share (never destroyed: workers may outlive main).
  static RowPool& Get();

  RowPool() = default;
  ~RowPool();
  RowPool(const RowPool&) = delete;
  RowPool& operator=(const RowPool&) = delete;

  // Runs fn(chunk) for every chunk in [0, chunks) exactly once, on the calling thread and up to
  // `threads - 1` workers, and returns when all have run. A call made while another caller
  // holds the pool (or with threads <= 1) runs its chunks on the calling thread. If fn throws,
  // the remaining chunks still run to completion on other threads and the first exception is
  // rethrown to the caller.
  void Run(int threads, int64_t chunks, const std::function<void(int64_t)>& fn);

  // Number of worker threads started so far (threads - 1 of the last pooled call).
  int workers() const;

  // A call's chunk count and next chunk are stored in 12 bits each of the claim word; calls
  // with more chunks run them in groups of consecutive chunks.
  static constexpr int kCountBits = 12;
  static constexpr int64_t kMaxChunks = (int64_t{1} << kCountBits) - 1;

 private:
  // The claim word: generation (40 bits) | chunk count (12) | next chunk (12). One word, so a
  // claim validates all three in one swap. A stale worker could only be fooled by a word that
  // recurs, which takes 2^40 calls while it sleeps between one load and one swap.
  static uint64_t MakeClaim(uint64_t generation, int64_t chunks) {
    return (generation << (2 * kCountBits)) | (static_cast<uint64_t>(chunks) << kCountBits);
  }
  static uint64_t GenerationOf(uint64_t claim) { return claim >> (2 * kCountBits); }
  static int64_t ChunksOf(uint64_t claim) {
    return static_cast<int64_t>((claim >> kCountBits) & kMaxChunks);
  }
  static int64_t IndexOf(uint64_t claim) { return static_cast<int64_t>(claim & kMaxChunks); }

  void RunPooled(int threads, int64_t chunks, const std::function<void(int64_t)>& fn);
  // Claims and runs chunks of call `generation` until none is left or a newer call began.
  void Work(uint64_t generation);
  void RunChunk(const std::function<void(int64_t)>& fn, int64_t chunk);
  void WorkerLoop();
  void Resize(int workers);
  void Stop();

  std::mutex run_mu_;                  // Held by the caller that owns the pool.
  uint64_t generation_ = 0;            // Last generation issued; guarded by run_mu_.
  std::vector<std::thread> workers_;   // Guarded by run_mu_.
  std::atomic<int> worker_count_{0};

  // The current call, published by the release store of claim_.
  std::atomic<const std::function<void(int64_t)>*> fn_{nullptr};
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> done_{0};    // Chunks of the current call that have run.

  std::mutex error_mu_;
  std::exception_ptr error_;  // First exception of the current call.

  std::atomic<int> spins_{20000};  // How long a waiting thread spins before it yields or sleeps.
  std::atomic<bool> stop_{false};
  std::atomic<int> sleepers_{0};
  std::mutex sleep_mu_;
  std::condition_variable wake_;
};

}  // namespace lgpt

#endif  // LGPT_CORE_BASE_ROW_POOL_H_
