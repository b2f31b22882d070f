// The KV cache contract between attention and storage.
//
// A cache is a plain object owned by the caller (one per generation session); the model
// takes it as an argument, so one set of weights serves many sessions. For each layer, the
// attention calls UpdateAndAttend(), which stores the step's keys and values and attends to
// what the step's queries may see; Update() stores them and returns those entries as views
// with the token position each holds. The mask follows from those positions (causality, sliding
// windows and evicted entries all follow from them), so a cache may keep any subset of entries in
// any slot order.
#ifndef LGPT_CACHE_KV_CACHE_H_
#define LGPT_CACHE_KV_CACHE_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/ops/attention.h"
#include "core/ops/decode_attention.h"
#include "core/ops/paged_attention.h"

namespace lgpt {

// What the attention layer of one model step tells the cache.
struct KVStep {
  at::Tensor positions;      // [B, T] int64: token position of each new entry
  int64_t min_position = 0;  // min over `positions`, computed once per model step on the host
  int64_t max_position = 0;  // max over `positions`
  // Attend as T one-token steps would, in order (speculative verification: the step's tokens
  // must see what decoding them one at a time sees). Only caches whose chunk path attends to
  // other entries than their decode path (quantised storage: a decode step reads its own
  // entry encoded) do anything different; the others take the step as a chunk.
  bool sequential = false;
};

// Entries a step attends to. Slots whose position is negative are empty.
struct KVView {
  at::Tensor keys;       // [B, n_query_groups, S, head_size]
  at::Tensor values;     // [B, n_query_groups, S, head_size]
  at::Tensor positions;  // [B, 1, S] or [B, n_query_groups, S], int64 or int32
};

// Moves keys that a layer's RoPE rotated at positions p to positions p - shift (RoPE is a
// rotation whose angle is linear in the position, so R(p - shift) = R(-shift) · R(p) exactly):
// keys [B, G, S, head_size] of `layer` -> [B, G, S, head_size]. The model provides it
// (GPTImpl::ShiftKeys), with its rotary dims, base frequencies (local or global) and scaling.
using KeyShifter = std::function<at::Tensor(int64_t layer, const at::Tensor& keys, int64_t shift)>;

// Per-layer geometry a cache is built for.
// Combines a layer's eviction scores over processes that hold copies of the same query
// groups (tensor parallelism with fewer KV groups than ranks: each copy sees the attention of
// its own query heads only). Reduce turns scores [B, G, S] from this process's heads into the
// scores of all the group's heads, the same on every copy, so the copies evict alike and as
// one process would.
class KVScoreReducer {
 public:
  virtual ~KVScoreReducer() = default;
  virtual void Reduce(at::Tensor& scores) const = 0;
};

struct KVLayerSpec {
  int64_t n_query_groups = 0;
  int64_t head_size = 0;
  int64_t sliding_window = 0;  // 0: global attention; else the layer's window size
  // Scoring policies (h2o, tova) pass their step scores through it; null: this process's
  // heads are all of each group's heads.
  std::shared_ptr<const KVScoreReducer> score_reducer;
};

// What every cache is built for: rows, context, per-layer geometry, dtype and device of the
// full-precision entries. The options of each cache extend it.
struct KVCacheGeometry {
  int64_t batch_size = 1;
  int64_t max_sequence_length = 0;
  std::vector<KVLayerSpec> layers;
  c10::ScalarType dtype = c10::kFloat;  // the model's dtype
  c10::Device device = c10::Device(c10::kCPU);
};

// Checks every cache makes; errors name what is wrong and where.
// A new cache's geometry: batch_size >= 1, max_sequence_length >= 1, at least one layer,
// each with n_query_groups >= 1, head_size >= 1, sliding_window >= 0. `owner` names the
// options struct in errors ("DenseKVCacheOptions").
absl::Status CheckCacheGeometry(absl::string_view owner, const KVCacheGeometry& geometry);
// The bounds of a step: 1 <= batch_size <= max_batch_size, positions in
// [0, max_sequence_length).
absl::Status CheckStepBounds(const KVStep& step, int64_t batch_size, int64_t max_batch_size,
                             int64_t max_sequence_length);
// One layer's step: the layer exists, keys and values are [B, n_query_groups, T, head_size]
// with positions [B, T], within the bounds above.
absl::Status CheckLayerStep(int64_t layer, const std::vector<KVLayerSpec>& layers,
                            const KVStep& step, const at::Tensor& keys, const at::Tensor& values,
                            int64_t max_batch_size, int64_t max_sequence_length);
// Queries of UpdateAndAttend: q [B, n_head, T, head_size] matching keys [B, G, T, head_size],
// n_head a multiple of G.
absl::Status CheckQueries(int64_t layer, const at::Tensor& q, const at::Tensor& keys);
// "[2, 4, 7, 64]".
std::string ShapeString(const at::Tensor& t);
// Slots to allocate for `needed` entries when `current` are allocated: doubling (at least 64),
// never above `limit`, so growth costs O(1) amortised per entry.
int64_t GrownCapacity(int64_t needed, int64_t current, int64_t limit);

// What a serving engine's KV budget asks of a cache whose storage is its own and bounded by its
// options (budgeted and quantised caches): it charges that storage to the budget as it grows
// rather than all of it up front, and refuses a request that could outgrow the budget.
class KVStorageBound {
 public:
  virtual ~KVStorageBound() = default;
  // The most AllocatedBytes() + IndexBytes() the cache can ever reach.
  virtual int64_t MaxBytes() const = 0;
  // AllocatedBytes() + IndexBytes() after the cache's next step of `tokens` entries (an upper
  // bound; at most MaxBytes()).
  virtual int64_t BytesAfterStep(int64_t tokens) const = 0;
};

// Batched decoding (cache/routing_kv_cache.h): a cache whose rows can attend together with
// other caches' in one DecodeAttentionRows pass (a batched step then attends to each row
// exactly as the row's UpdateAndAttend would, to the bit).
class KVDecodeRows {
 public:
  virtual ~KVDecodeRows() = default;
  // Stores the step's keys/values for `layer` as Update does and returns where the layer's
  // entries now lie. nullopt when this layer or step cannot (storage that is not float32 rows
  // on the CPU, windows): then nothing is stored and the caller uses UpdateAndAttend. Batch
  // size 1; keys/values as for Update, copied before it returns (the caller may pass views
  // that do not own their memory).
  virtual absl::StatusOr<std::optional<DecodeRow>> UpdateForDecode(int64_t layer,
                                                                   const KVStep& step,
                                                                   const at::Tensor& keys,
                                                                   const at::Tensor& values) = 0;
};

// Batched decoding over a device pool (cache/routing_kv_cache.h): a cache whose rows attend
// together with other caches' rows of the same pool in one PagedDecodeRows launch
// (core/ops/paged_attention.h: the CUDA paged decode kernel).
class KVTableRows {
 public:
  virtual ~KVTableRows() = default;
  // A decoding step's row as the paged kernel reads it: the pool's layer and the request's
  // blocks, length and query position.
  struct Row {
    PagedKVLayer layer;
    PagedDecodeRow row;
  };
  // Stores the step's keys/values for `layer` as Update does and returns the row; nullopt when
  // this step cannot (not one token): then nothing is stored and the caller uses
  // UpdateAndAttend. Batch size 1.
  virtual absl::StatusOr<std::optional<Row>> UpdateForTable(int64_t layer, const KVStep& step,
                                                            const at::Tensor& keys,
                                                            const at::Tensor& values) = 0;
};

// Policies that score entries by the attention they receive.
class KVAttentionScorer {
 public:
  virtual ~KVAttentionScorer() = default;
  // Whether the step of `layer` should hand over its attention weights.
  virtual bool WantsAttentionWeights(int64_t layer) const = 0;
  // weights [B, n_head, T, S] over the entries of the last KVView of `layer`.
  virtual void ObserveAttentionWeights(int64_t layer, const at::Tensor& weights) = 0;
};

// Cache positions: positions are places in the cache, not in the stream, so a stream of any
// length stays below max_sequence_length(). The caller calls MakeRoom before every step and
// feeds the positions it leaves (core/model/cache_positions.h does this).
class KVPositionShifter {
 public:
  virtual ~KVPositionShifter() = default;
  // Before a step of `steps` tokens starting at cache position `next`: when next + steps would
  // pass max_sequence_length(), moves every kept entry except the sinks down by the returned
  // shift (keys re-rotated by `shift_keys`), so the stream continues at next - shift; 0 when
  // nothing moved.
  virtual absl::StatusOr<int64_t> MakeRoom(int64_t next, int64_t steps,
                                           const KeyShifter& shift_keys) = 0;
};

class KVCache;

// Forking (the n choices of one prompt, core/serving/scheduler.h): a cache whose state copies
// into another cache of the same kind and options, so a prompt prefilled once goes on in
// several caches, each as if it had taken the prompt's steps itself. For caches outside
// prefix sharing (budgeted and quantised: their entries depend on the steps, not on the
// tokens alone).
class KVForker {
 public:
  virtual ~KVForker() = default;
  // OK when CopyInto(target) can give `target` this cache's state: a cache of the same kind
  // whose options make the same decisions (capacity aside, which need only hold what this cache
  // holds). FailedPrecondition naming what differs otherwise.
  virtual absl::Status CheckCopyInto(const KVCache& target) const = 0;
  // Replaces `target`'s state with a copy of this cache's (entries, quantisation scales,
  // positions, policy scores, an eviction still pending), so that every later step of `target`
  // equals this cache's own to the bit. Copies the filled slots only; `target` then holds at
  // most this cache's AllocatedBytes() + IndexBytes() (what a serving engine charges it before
  // the copy). Errors as CheckCopyInto leave `target` unchanged.
  virtual absl::Status CopyInto(KVCache& target) const = 0;
};

// Speculative decoding (core/model/generate.h, core/speculative/): a step writes the last
// accepted token and k proposed ones, then the cache forgets the entries of the proposals the
// model rejected. After Truncate(length) the cache attends exactly as one that never held the
// entries at positions >= length (their storage, scores and precision included).
class KVRollback {
 public:
  virtual ~KVRollback() = default;
  // The most of a step's newest entries a Truncate may forget (a step of k + 1 tokens whose
  // first is kept needs k); kUnlimited for any.
  static constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();
  virtual int64_t max_rollback() const = 0;
  // Forgets every entry at a position >= `length`, in every row. FailedPrecondition when the
  // cache can no longer restore what a cache without them would hold (further back than
  // max_rollback(), or past the last step where only that step can be undone); the cache is
  // unchanged then.
  virtual absl::Status Truncate(int64_t length) = 0;
};

class KVCache {
 public:
  virtual ~KVCache() = default;

  // Stores the keys/values of one step for `layer` and returns the entries to attend to.
  // keys/values [B, n_query_groups, T, head_size]. Errors (bad shapes, positions beyond the
  // capacity) leave the cache unchanged.
  virtual absl::StatusOr<KVView> Update(int64_t layer, const KVStep& step, const at::Tensor& keys,
                                        const at::Tensor& values) = 0;

  // Checks, before any layer runs, that a step with these positions fits (so a failing step
  // never leaves some layers updated and others not).
  virtual absl::Status CheckStep(const KVStep& step, int64_t batch_size) const = 0;

  // Forgets every entry; keeps allocations for reuse.
  virtual void Reset() = 0;
  // Forgets every entry and frees the storage (a serving engine gives a preempted request's
  // memory back). Caches whose storage is not their own (the paged cache's pool blocks)
  // give it back in Reset already.
  virtual void Release() { Reset(); }

  // Bytes of entry storage currently allocated: keys and values (encoded entries and their
  // quantisation scales for quantised caches), whether filled or not.
  virtual int64_t AllocatedBytes() const = 0;
  // Bytes of bookkeeping beside the entries: slot positions, policy scores, position ramps.
  virtual int64_t IndexBytes() const = 0;

  // Largest position a step may write plus one (the context length this cache serves).
  virtual int64_t max_sequence_length() const = 0;
  virtual int64_t batch_size() const = 0;
  virtual int64_t num_layers() const = 0;

  // The one call the attention layer makes: stores the step's keys/values for `layer` (as
  // Update) and returns the attention of q over what the step may attend to, with the mask rule
  // of core/ops/attention_mask.h and softmax in float32.
  // q [B, n_head, T, head_size] (after RoPE); keys/values as for Update. Returns
  // [B, n_head, T, head_size] in q's dtype. Errors leave the cache unchanged.
  // The default: Update, then AttendByPositions over the returned view, handing the weights to
  // attention_scorer() when it wants them for `layer`. Caches whose storage is not
  // plain tensors (quantised entries) override it to read their storage block by block
  // (AttendBlockwise), so no full-precision copy of the layer is ever made.
  virtual absl::StatusOr<at::Tensor> UpdateAndAttend(int64_t layer, const KVStep& step,
                                                     const at::Tensor& q, const at::Tensor& keys,
                                                     const at::Tensor& values,
                                                     const AttentionParams& params);

  // The roles some caches take beyond this contract, each the interface of the one caller
  // that needs it; null when the cache does not take the role.
  // A serving engine's KV budget (core/serving/kv_memory.h): storage bounded by the options.
  virtual const KVStorageBound* storage_bound() const { return nullptr; }
  // Batched decoding (cache/routing_kv_cache.h): rows attended together.
  virtual KVDecodeRows* decode_rows() { return nullptr; }
  // Batched decoding over a device pool: rows attended by one paged kernel launch.
  virtual KVTableRows* table_rows() { return nullptr; }
  // Policies that score entries by the attention they receive (the default UpdateAndAttend
  // hands it the weights).
  virtual KVAttentionScorer* attention_scorer() { return nullptr; }
  // Cache positions (core/model/cache_positions.h): non-null when positions are places in the
  // cache (KVCacheSpec.positions = "cache"; window and sink caches).
  virtual const KVPositionShifter* position_shifter() const { return nullptr; }
  KVPositionShifter* mutable_position_shifter() {
    return const_cast<KVPositionShifter*>(position_shifter());
  }
  bool ShiftsPositions() const { return position_shifter() != nullptr; }
  // Forking (core/serving/scheduler.h's n choices): the state copied into another cache.
  virtual const KVForker* forker() const { return nullptr; }
  // Speculative decoding: forgetting a step's rejected entries. Null for caches that evict
  // (window, sink, h2o, tova...): an entry a rejected token displaced cannot come back.
  virtual KVRollback* rollback() { return nullptr; }

  virtual std::string DebugName() const = 0;
};

}  // namespace lgpt

#endif  // LGPT_CACHE_KV_CACHE_H_
