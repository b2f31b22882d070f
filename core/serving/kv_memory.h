// The serving engine's KV memory (the role of vLLM's KV cache manager): one budget, the
// shared block pool (cache/block_pool.h), for every running request's cache, whatever its
// kind. The scheduler (core/serving/scheduler.h) decides who runs, who waits and who is
// preempted; KVMemory says what each decision costs and carries it out:
//   - sizing: the pool SchedulerOptions.kv_pool_bytes buys for a model's cache geometry;
//   - the cache kind a request gets (NewCache): paged blocks of the pool for dense requests
//     (prefixes shared), for sink and window requests (a fixed set of slots in blocks,
//     cache/paged_kv_cache.h's PagedEviction) and for h2o, h2o-vlen and tova requests (budget +
//     1 slots in blocks, cache/scored_paged_kv_cache.h), in the pool's entries; own storage
//     grown a block at a time and charged to the pool as it grows for the others (qh2o,
//     explicit int8/int4 specs, cache positions, some sliding-window models), a plain cache of
//     its own without a pool;
//   - a request's memory through one lease: Reserve before a step (blocks or bytes), Settle
//     after it (an over-estimate given back), Release (preempted: its memory back, the cache
//     kept for recomputing), Close (finished); ReserveCopy before another request's cache is
//     copied into it (a forked choice is charged what the copy holds, then as it grows);
//   - prefix reuse: AttachPrefix at a request's first prefill, Publish as blocks fill (its
//     prefix cache, cache/prefix_cache.h, over the pool);
//   - the bytes charged for caches with storage of their own: summed, and held as whole pool
//     blocks (no rounding up per cache), so the pool itself knows only blocks.
// Used by the scheduler's thread; Stats is safe from any thread.
#ifndef LGPT_CORE_SERVING_KV_MEMORY_H_
#define LGPT_CORE_SERVING_KV_MEMORY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "cache/block_pool.h"
#include "cache/kv_cache.h"
#include "cache/kv_cache_factory.h"
#include "cache/paged_kv_cache.h"
#include "cache/prefix_cache.h"
#include "cache/scored_paged_kv_cache.h"

namespace lgpt {

struct KVMemoryOptions {
  int64_t pool_bytes = 0;  // 0: no pool (each request allocates its own cache as it grows)
  int64_t entries_per_block = 16;
  bool prefix_caching = true;  // paged requests from position 0 share cached prompt blocks
  // The dtype of the pool's entries: Undefined = the model's (the geometry's). A float32 model
  // may keep bfloat16 or float16 entries (rounded to nearest even as they are written, widened
  // as attention reads them): twice the blocks in the same bytes, and half the bytes each
  // decoding step reads. KVPoolEntriesFor parses the serving option.
  c10::ScalarType entry_dtype = c10::ScalarType::Undefined;
  // 8 or 4: int8 / int4 entries instead (codes and float16 scales per entry_group_size channels
  // inside the block, BlockPoolOptions.entry_bits): dense requests' entries are written
  // quantised, and their full blocks join prefix reuse as 16-bit ones do (requests with a
  // quantised KVCacheSpec keep their policy caches, whose recent entries stay in full
  // precision).
  int entry_bits = 16;
  int64_t entry_group_size = 32;
};

// The eviction a paged cache of `spec` keeps in a pool (dense: budget 0), or nullopt when the
// spec needs a cache of its own: a scoring policy (h2o, tova, ...), explicit int8/int4 entries,
// cache positions, a pyramid budget, or sliding-window layers on which the paged cache would keep
// other entries than the policy (PagedEvictionKeepsAsThePolicy). The spec's errors
// (ValidateKVCacheSpec).
absl::StatusOr<std::optional<PagedEviction>> PagedEvictionFor(const KVCacheSpec& spec,
                                                              const KVCacheGeometry& geometry);

// The scoring policy a ScoredPagedKVCache (cache/scored_paged_kv_cache.h) keeps for `spec` in
// a pool's blocks (on any device, whatever its entries, its layers' score reducers included),
// or nullopt when the spec needs a cache of its own: a policy other than h2o, h2o-vlen and tova,
// explicit int8/int4 entries, cache positions, a model in another dtype than float32, bfloat16
// or float16. The spec's errors.
absl::StatusOr<std::optional<EvictionPolicyOptions>> ScoredPagedPolicyFor(
    const KVCacheSpec& spec, const KVCacheGeometry& geometry);

// What the pool's entries are: a dtype, or int8 / int4 codes.
struct KVPoolEntries {
  c10::ScalarType dtype = c10::ScalarType::Undefined;  // with bits 16
  int bits = 16;
};

// The pool entries that the serving option `name` asks for a model of `model_dtype` on
// `device`: "model" (the model's dtype), "auto" (the serving default: bfloat16 for float32 models
// on the CPU, the model's dtype otherwise), "float32", "bfloat16", "float16", "int8" or "int4".
// InvalidArgument naming `field` otherwise.
absl::StatusOr<KVPoolEntries> KVPoolEntriesFor(absl::string_view name, c10::ScalarType model_dtype,
                                               c10::Device device, absl::string_view field);

struct KVMemoryStats {
  // Blocks in all, held by requests (or reserved for their own storage), and unreferenced
  // blocks the prefix cache keeps; zeros without a pool.
  int64_t blocks = 0, blocks_used = 0, blocks_cached = 0;
  int64_t block_bytes = 0;
};

// A request's cache and what it holds of the pool. Movable; made by KVMemory::Lease.
class KVLease {
 public:
  // How its memory counts against the pool.
  enum class Use {
    kNone,    // no pool, or a cache that allocates on its own
    kBlocks,  // a paged cache drawing its blocks from the pool
    kBytes,   // bounded storage of its own (KVCache::storage_bound), charged as it grows
  };

  KVCache* cache() const { return cache_.get(); }
  Use use() const { return use_; }
  // Whether it shares prefix blocks: paged, dense, prefix caching on, fed from position 0.
  bool shares_prefixes() const { return shares_prefixes_; }
  int64_t charged_bytes() const { return charge_; }

 private:
  friend class KVMemory;
  std::unique_ptr<KVCache> cache_;
  Use use_ = Use::kNone;
  KVPoolBlocks* blocks_ = nullptr;  // cache_, with Use::kBlocks
  PagedKVCache* paged_ = nullptr;   // cache_ when it is a PagedKVCache (prefix sharing)
  bool shares_prefixes_ = false;
  int64_t charge_ = 0;  // bytes reserved in the pool now, with Use::kBytes
};

class KVMemory {
 public:
  // The pool options `pool_bytes` buys for caches of `geometry` (its layers, dtype, device) with
  // entries of options.entry_dtype: InvalidArgument below one block of `entries_per_block`
  // entries, ResourceExhausted beyond the memory available on the CPU.
  static absl::StatusOr<BlockPoolOptions> PoolFor(const KVCacheGeometry& geometry,
                                                  const KVMemoryOptions& options);
  // Memory for caches of `geometry`: a pool of options.pool_bytes (PoolFor) with entries of
  // options.entry_dtype, or none.
  static absl::StatusOr<std::unique_ptr<KVMemory>> Create(const KVCacheGeometry& geometry,
                                                          const KVMemoryOptions& options);
  // Over an existing pool (null: none), with a prefix cache of its own when prefix_caching.
  KVMemory(std::shared_ptr<BlockPool> pool, bool prefix_caching);
  // Over an existing pool and the prefix cache over it (null: no prefix sharing), which may
  // outlive this memory: a later KVMemory over the same two finds what this one published.
  KVMemory(std::shared_ptr<BlockPool> pool, std::shared_ptr<PrefixCache> prefixes);
  ~KVMemory();
  KVMemory(const KVMemory&) = delete;
  KVMemory& operator=(const KVMemory&) = delete;

  // A batch-1 cache of `spec` for `length` entries, of the kind this memory serves it with;
  // `rollback_slots` as KVCacheShape's (speculative decoding on sliding-window layers of a
  // dense cache). The factory's errors.
  absl::StatusOr<std::unique_ptr<KVCache>> NewCache(const KVCacheSpec& spec,
                                                    const KVCacheGeometry& geometry, int64_t length,
                                                    int64_t rollback_slots = 0) const;
  // Takes a request's batch-1 cache, to hold at most `entries` entries; `from_start` when the
  // request starts at position 0. ResourceExhausted when its blocks, or its cache's MaxBytes,
  // exceed the whole pool.
  absl::StatusOr<KVLease> Lease(std::unique_ptr<KVCache> cache, int64_t entries,
                                bool from_start) const;

  // Pool blocks the lease's next step of `steps` entries takes beyond what it holds; for a
  // paged cache not yet `started`, those of its first `steps` entries. An estimate for
  // admission (byte reservations are summed in bytes).
  int64_t BlocksForStep(const KVLease& lease, int64_t steps, bool started) const;
  // Whether the request's memory is bounded whatever its length (storage of its own, charged
  // to the pool, or an evicting paged cache): the scheduler admits it by what it holds at its
  // bound.
  static bool Bounded(const KVLease& lease);
  // Whether the lease holds pool memory now (a preemption would free some).
  bool Holds(const KVLease& lease) const;
  // Takes the pool memory the lease's next step of `steps` entries needs: its blocks (paged)
  // or the growth of its own storage (charged); ResourceExhausted, taking nothing, when the
  // pool lacks it.
  absl::Status Reserve(KVLease& lease, int64_t steps);
  // Before `source`'s cache is copied into `target`'s (KVForker::CopyInto, a fork of n
  // choices): takes the pool memory the copy will hold, at most the source cache's
  // AllocatedBytes() + IndexBytes() (Settle gives back the rest), beyond what `target` is
  // charged; ResourceExhausted, taking nothing, when the
  // pool lacks it. Nothing for an evicting paged target (the copy shares the source's blocks);
  // FailedPrecondition for a dense paged one (those share prefix blocks instead).
  absl::Status ReserveCopy(KVLease& target, const KVLease& source);
  // After a forward pass: a charged lease gives back what its step's bound over-counted.
  void Settle(KVLease& lease);
  // Frees the lease's memory and forgets its cache's entries (a preempted request recomputes).
  void Release(KVLease& lease);
  // Frees the lease's memory and its cache (a finished request).
  void Close(KVLease& lease);

  // At a request's first prefill: cached blocks that start `tokens` join its cache; the
  // number of entries they hold (0 without prefix sharing).
  int64_t AttachPrefix(KVLease& lease, absl::Span<const int64_t> tokens);
  // The cache holds the entries of `tokens`: its full blocks become reusable by others.
  void Publish(KVLease& lease, absl::Span<const int64_t> tokens);

  // Blocks Reserve can still take (cached prefix blocks count as free); 0 without a pool.
  int64_t free_blocks() const;
  // Blocks held for the charged bytes of caches with storage of their own.
  int64_t charged_blocks() const { return charged_blocks_.load(); }
  int64_t entries_per_block() const;
  KVMemoryStats Stats() const;
  const std::shared_ptr<BlockPool>& pool() const { return pool_; }

 private:
  // The bytes a charged lease's storage will have after a step of `steps` entries.
  static int64_t ChargeFor(const KVLease& lease, int64_t steps);
  // Adds `bytes` to the charged bytes, taking the whole blocks they now need (recycling cached
  // prefix blocks as needed); ResourceExhausted, taking nothing, when they are not free.
  absl::Status Charge(int64_t bytes);
  // Takes `bytes` off the charged bytes, giving back the blocks they no longer need.
  void Uncharge(int64_t bytes);

  const std::shared_ptr<BlockPool> pool_;
  const std::shared_ptr<PrefixCache> prefixes_;  // null: no prefix sharing
  int64_t charged_bytes_ = 0;
  std::vector<int64_t> charge_blocks_;      // BlocksForBytes(charged_bytes_) of them
  std::atomic<int64_t> charged_blocks_{0};  // charge_blocks_.size(), for any thread
};

}  // namespace lgpt

#endif  // LGPT_CORE_SERVING_KV_MEMORY_H_
