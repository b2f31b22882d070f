#include "core/serving/kv_memory.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/device_memory.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "glog/logging.h"

namespace lgpt {

namespace {

// The geometry of the pool's blocks: the model's, with the entries' dtype.
KVCacheGeometry PoolGeometry(const KVCacheGeometry& geometry, const KVMemoryOptions& options) {
  KVCacheGeometry pool = geometry;
  if (options.entry_dtype != c10::ScalarType::Undefined) pool.dtype = options.entry_dtype;
  return pool;
}

}  // namespace

absl::StatusOr<KVPoolEntries> KVPoolEntriesFor(absl::string_view name, c10::ScalarType model_dtype,
                                               c10::Device device, absl::string_view field) {
  const auto dtype = [](c10::ScalarType d) { return KVPoolEntries{d, 16}; };
  if (name == "model") return dtype(model_dtype);
  if (name == "auto") {
    return dtype(model_dtype == c10::kFloat && device.is_cpu() ? c10::kBFloat16 : model_dtype);
  }
  if (name == "float32") return dtype(c10::kFloat);
  if (name == "bfloat16") return dtype(c10::kBFloat16);
  if (name == "float16") return dtype(c10::kHalf);
  if (name == "int8") return KVPoolEntries{model_dtype, 8};
  if (name == "int4") return KVPoolEntries{model_dtype, 4};
  return InvalidFieldError(field, absl::StrCat(field, " must be auto, model, float32, bfloat16, ",
                                               "float16, int8 or int4, got '", name, "'"));
}

absl::StatusOr<BlockPoolOptions> KVMemory::PoolFor(const KVCacheGeometry& model_geometry,
                                                   const KVMemoryOptions& options) {
  const KVCacheGeometry geometry = PoolGeometry(model_geometry, options);
  // Per entry first: entries_per_block times the bytes of an entry may overflow int64 (a block of
  // 2^52 entries wrapped to a size the pool accepted, and its first block threw).
  const int64_t bytes_per_entry = std::max<int64_t>(
      BlockPool::BytesPerBlock(geometry, 1, options.entry_bits, options.entry_group_size), 1);
  if (options.entries_per_block > options.pool_bytes / bytes_per_entry) {
    return InvalidFieldError(
        "SchedulerOptions.kv_pool_bytes",
        absl::StrCat("SchedulerOptions.kv_pool_bytes (", options.pool_bytes,
                     ") is less than one KV block of ", options.entries_per_block, " entries (",
                     bytes_per_entry, " bytes an entry for this model)"));
  }
  BlockPoolOptions pool;
  pool.entries_per_block = options.entries_per_block;
  pool.entry_bits = options.entry_bits;
  pool.group_size = options.entry_group_size;
  pool.num_blocks = options.pool_bytes / (bytes_per_entry * options.entries_per_block);
  // A CPU pool takes memory as requests fill it, a device pool all at once: one the machine
  // cannot back would end in the OOM killer, or in a failed allocation at the first request,
  // instead of this refusal (where the free memory cannot be read, nothing is checked).
  const absl::StatusOr<int64_t> available = FreeDeviceMemoryBytes(geometry.device);
  if (available.ok() && options.pool_bytes > *available) {
    return FieldError(
        absl::StatusCode::kResourceExhausted, "SchedulerOptions.kv_pool_bytes",
        absl::StrCat("SchedulerOptions.kv_pool_bytes (", options.pool_bytes >> 20,
                     " MiB) exceeds the ", *available >> 20, " MiB of memory available on ",
                     geometry.device.str(), " with the model loaded"));
  }
  return pool;
}

absl::StatusOr<std::unique_ptr<KVMemory>> KVMemory::Create(const KVCacheGeometry& geometry,
                                                           const KVMemoryOptions& options) {
  std::shared_ptr<BlockPool> pool;
  if (options.pool_bytes > 0) {
    ASSIGN_OR_RETURN(const BlockPoolOptions pool_options, PoolFor(geometry, options));
    ASSIGN_OR_RETURN(pool, BlockPool::Create(PoolGeometry(geometry, options), pool_options));
  }
  return std::make_unique<KVMemory>(std::move(pool), options.prefix_caching);
}

KVMemory::KVMemory(std::shared_ptr<BlockPool> pool, bool prefix_caching)
    : KVMemory(pool,
               pool != nullptr && prefix_caching ? std::make_shared<PrefixCache>(pool) : nullptr) {}

KVMemory::KVMemory(std::shared_ptr<BlockPool> pool, std::shared_ptr<PrefixCache> prefixes)
    : pool_(std::move(pool)), prefixes_(std::move(prefixes)) {
  CHECK(prefixes_ == nullptr || prefixes_->pool() == pool_) << "a prefix cache of another pool";
}

KVMemory::~KVMemory() {
  for (int64_t block : charge_blocks_) pool_->Release(block);
}

absl::StatusOr<std::unique_ptr<KVCache>> KVMemory::NewCache(const KVCacheSpec& spec,
                                                            const KVCacheGeometry& geometry,
                                                            int64_t length,
                                                            int64_t rollback_slots) const {
  KVCacheShape shape;
  static_cast<KVCacheGeometry&>(shape) = geometry;
  shape.batch_size = 1;
  shape.max_sequence_length = length;
  shape.rollback_slots = rollback_slots;
  if (pool_ == nullptr) return MakeKVCache(spec, shape);
  // Dense, sink, window, h2o, h2o-vlen and tova requests are paged in the pool's entries, whatever
  // they are (16-bit or quantised: the server's choice; with float32 entries they attend as the
  // policy cache of the spec); the others keep caches of their own, so that an explicit
  // int8/int4 spec decodes as lgpt::Generate with that spec does.
  ASSIGN_OR_RETURN(const std::optional<PagedEviction> paged_eviction,
                   PagedEvictionFor(spec, shape));
  if (!paged_eviction) {
    ASSIGN_OR_RETURN(const std::optional<EvictionPolicyOptions> scored,
                     ScoredPagedPolicyFor(spec, shape));
    if (scored) {
      ScoredPagedKVCacheOptions options;
      options.pool = pool_;
      options.max_sequence_length = length;
      options.policy = *scored;
      ASSIGN_OR_RETURN(std::unique_ptr<ScoredPagedKVCache> cache,
                       ScoredPagedKVCache::Create(options));
      return std::unique_ptr<KVCache>(std::move(cache));
    }
    // Own storage, grown a pool block at a time and charged to the pool as it grows.
    shape.growth_step = pool_->entries_per_block();
    return MakeKVCache(spec, shape);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<PagedKVCache> paged,
                   PagedKVCache::Create(pool_, length, *paged_eviction));
  return std::unique_ptr<KVCache>(std::move(paged));
}

absl::StatusOr<std::optional<PagedEviction>> PagedEvictionFor(const KVCacheSpec& spec,
                                                              const KVCacheGeometry& geometry) {
  RETURN_IF_ERROR(ValidateKVCacheSpec(spec));
  if (spec.bits != 16) return std::nullopt;
  if (spec.policy == "dense") return PagedEviction{};
  if (spec.policy != "window" && spec.policy != "sink") return std::nullopt;
  // One slot layout for every layer: a uniform budget, stream positions, and layers on which
  // it keeps what the policy keeps (a sliding-window layer's policy cache may evict sinks that
  // left its window).
  if (spec.budget_rule != "uniform" || UsesCachePositions(spec)) return std::nullopt;
  const PagedEviction eviction{spec.budget, spec.policy == "sink" ? spec.sink_tokens : 0};
  for (const KVLayerSpec& layer : geometry.layers) {
    const bool windowed =
        layer.sliding_window > 0 && layer.sliding_window < geometry.max_sequence_length;
    if (windowed && !PagedEvictionKeepsAsThePolicy(eviction, layer.sliding_window)) {
      return std::nullopt;
    }
  }
  return eviction;
}

absl::StatusOr<std::optional<EvictionPolicyOptions>> ScoredPagedPolicyFor(
    const KVCacheSpec& spec, const KVCacheGeometry& geometry) {
  RETURN_IF_ERROR(ValidateKVCacheSpec(spec));
  const bool model_dtype_kept = geometry.dtype == c10::kFloat || geometry.dtype == c10::kBFloat16 ||
                                geometry.dtype == c10::kHalf;
  if (spec.bits != 16 ||
      (spec.policy != "h2o" && spec.policy != "h2o-vlen" && spec.policy != "tova") ||
      UsesCachePositions(spec) || !model_dtype_kept) {
    return std::nullopt;
  }
  ASSIGN_OR_RETURN(EvictionPolicyOptions policy,
                   EvictionPolicyOf(spec, static_cast<int64_t>(geometry.layers.size())));
  if (!CheckScoredPagedPolicy(policy).ok()) return std::nullopt;
  return policy;
}

absl::StatusOr<KVLease> KVMemory::Lease(std::unique_ptr<KVCache> cache, int64_t entries,
                                        bool from_start) const {
  KVLease lease;
  if (pool_ != nullptr) {
    auto* pooled = dynamic_cast<KVPoolBlocks*>(cache.get());
    if (pooled != nullptr && pooled->pool() == pool_.get()) {
      const int64_t blocks = pooled->BlocksToHold(std::min(entries, cache->max_sequence_length()));
      if (blocks > pool_->num_blocks()) {
        return FieldError(
            absl::StatusCode::kResourceExhausted,
            FieldRef("GenerateOptions.max_new_tokens", "max_new_tokens"),
            absl::StrCat("the request needs ", blocks, " KV blocks of ", pool_->entries_per_block(),
                         " entries (prompt plus max_new_tokens) and the whole pool has ",
                         pool_->num_blocks()));
      }
      lease.use_ = KVLease::Use::kBlocks;
      lease.blocks_ = pooled;
      lease.paged_ = dynamic_cast<PagedKVCache*>(cache.get());
      lease.shares_prefixes_ =
          prefixes_ != nullptr && from_start && lease.paged_ != nullptr && !pooled->evicts();
    } else if (const KVStorageBound* bound = cache->storage_bound()) {
      // A cache with its own bounded storage: its bytes come out of the pool's budget.
      const int64_t budget = pool_->num_blocks() * pool_->BytesPerBlock();
      if (bound->MaxBytes() > budget) {
        return absl::ResourceExhaustedError(
            absl::StrCat("the request's KV cache (", cache->DebugName(), ") needs up to ",
                         bound->MaxBytes(), " bytes and the whole pool has ", budget));
      }
      lease.use_ = KVLease::Use::kBytes;
    }
  }
  lease.cache_ = std::move(cache);
  return lease;
}

int64_t KVMemory::ChargeFor(const KVLease& lease, int64_t steps) {
  return lease.cache_->storage_bound()->BytesAfterStep(steps);
}

int64_t KVMemory::BlocksForStep(const KVLease& lease, int64_t steps, bool started) const {
  switch (lease.use_) {
    case KVLease::Use::kNone:
      return 0;
    case KVLease::Use::kBlocks:
      return started ? lease.blocks_->BlocksNeeded(steps) : lease.blocks_->BlocksToHold(steps);
    case KVLease::Use::kBytes:
      return pool_->BlocksForBytes(std::max<int64_t>(0, ChargeFor(lease, steps) - lease.charge_));
  }
  return 0;
}

bool KVMemory::Bounded(const KVLease& lease) {
  return lease.use_ == KVLease::Use::kBytes ||
         (lease.blocks_ != nullptr && lease.blocks_->evicts());
}

bool KVMemory::Holds(const KVLease& lease) const {
  return lease.blocks_ != nullptr ? lease.blocks_->blocks_held() > 0 : lease.charge_ > 0;
}

absl::Status KVMemory::Reserve(KVLease& lease, int64_t steps) {
  switch (lease.use_) {
    case KVLease::Use::kNone:
      return absl::OkStatus();
    case KVLease::Use::kBlocks:
      return lease.blocks_->TakeBlocks(steps);
    case KVLease::Use::kBytes:
      break;
  }
  const int64_t needed = ChargeFor(lease, steps);
  if (needed <= lease.charge_) return absl::OkStatus();
  RETURN_IF_ERROR(Charge(needed - lease.charge_));
  lease.charge_ = needed;
  return absl::OkStatus();
}

absl::Status KVMemory::ReserveCopy(KVLease& target, const KVLease& source) {
  switch (target.use_) {
    case KVLease::Use::kNone:
      return absl::OkStatus();
    case KVLease::Use::kBlocks:
      // An evicting paged copy shares the source's blocks (copied as it writes into them, each
      // reserved before its step); a dense one shares prefix blocks instead.
      if (target.blocks_->evicts()) return absl::OkStatus();
      return absl::FailedPreconditionError(
          "a dense paged KV cache takes no copy (it shares prefix blocks instead)");
    case KVLease::Use::kBytes:
      break;
  }
  // The copy holds at most what the source holds (KVForker::CopyInto).
  const int64_t needed = source.cache_->AllocatedBytes() + source.cache_->IndexBytes();
  if (needed <= target.charge_) return absl::OkStatus();
  RETURN_IF_ERROR(Charge(needed - target.charge_));
  target.charge_ = needed;
  return absl::OkStatus();
}

void KVMemory::Settle(KVLease& lease) {
  if (lease.use_ != KVLease::Use::kBytes) return;
  // The prediction is an upper bound: give back what the step did not use.
  const int64_t used = lease.cache_->AllocatedBytes() + lease.cache_->IndexBytes();
  if (used < lease.charge_) {
    Uncharge(lease.charge_ - used);
    lease.charge_ = used;
  }
}

void KVMemory::Release(KVLease& lease) {
  lease.cache_->Release();
  if (lease.charge_ > 0) {
    Uncharge(lease.charge_);
    lease.charge_ = 0;
  }
}

void KVMemory::Close(KVLease& lease) {
  lease.blocks_ = nullptr;
  lease.paged_ = nullptr;
  lease.cache_.reset();
  if (lease.charge_ > 0) {
    Uncharge(lease.charge_);
    lease.charge_ = 0;
  }
}

int64_t KVMemory::AttachPrefix(KVLease& lease, absl::Span<const int64_t> tokens) {
  return lease.shares_prefixes_ ? lease.paged_->AttachPrefix(*prefixes_, tokens) : 0;
}

void KVMemory::Publish(KVLease& lease, absl::Span<const int64_t> tokens) {
  if (lease.shares_prefixes_) lease.paged_->PublishPrefix(*prefixes_, tokens);
}

int64_t KVMemory::free_blocks() const { return pool_ != nullptr ? pool_->free_blocks() : 0; }

int64_t KVMemory::entries_per_block() const {
  return pool_ != nullptr ? pool_->entries_per_block() : 0;
}

absl::Status KVMemory::Charge(int64_t bytes) {
  const int64_t held = static_cast<int64_t>(charge_blocks_.size());
  const int64_t wanted = pool_->BlocksForBytes(charged_bytes_ + bytes);
  const int64_t free = pool_->free_blocks();
  if (bytes < 0 || wanted - held > free) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the KV block pool cannot set aside ", bytes, " bytes: ", pool_->num_blocks(),
                     " blocks of ", pool_->BytesPerBlock(), " bytes, ",
                     pool_->num_blocks() - free - held, " in use, ", held, " reserved"));
  }
  while (static_cast<int64_t>(charge_blocks_.size()) < wanted) {
    absl::StatusOr<int64_t> block = pool_->Allocate();
    if (!block.ok()) {  // taken meanwhile by a cache outside this memory
      while (static_cast<int64_t>(charge_blocks_.size()) > held) {
        pool_->Release(charge_blocks_.back());
        charge_blocks_.pop_back();
      }
      return block.status();
    }
    charge_blocks_.push_back(*block);
  }
  charged_bytes_ += bytes;
  charged_blocks_.store(wanted);
  return absl::OkStatus();
}

void KVMemory::Uncharge(int64_t bytes) {
  CHECK(bytes >= 0 && bytes <= charged_bytes_) << bytes << " of " << charged_bytes_;
  charged_bytes_ -= bytes;
  const int64_t wanted = pool_->BlocksForBytes(charged_bytes_);
  while (static_cast<int64_t>(charge_blocks_.size()) > wanted) {
    pool_->Release(charge_blocks_.back());
    charge_blocks_.pop_back();
  }
  charged_blocks_.store(wanted);
}

KVMemoryStats KVMemory::Stats() const {
  KVMemoryStats stats;
  if (pool_ == nullptr) return stats;
  stats.blocks = pool_->num_blocks();
  stats.blocks_cached = pool_->idle_blocks();
  stats.blocks_used = pool_->num_blocks() - pool_->free_blocks();
  stats.block_bytes = pool_->BytesPerBlock();
  return stats;
}

}  // namespace lgpt
