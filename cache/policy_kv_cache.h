// Budgeted and quantised KV caches: any eviction policy (cache/eviction_policy.h) on any entry
// storage (cache/kv_codec.h: the model's dtype, int8, int4), decided per (batch row, query
// group).
//
// Storage of one layer, per (row, group):
//   main  up to `main_budget + 1` slots (grown on demand, doubling) of encoded entries with
//         their positions (-1: empty) and policy scores; slots are filled in any order.
//   ring  quantised caches only: the `residual` most recent entries in full precision (KIVI's
//         residual). An entry leaving the ring is encoded into main; the policy never evicts
//         ring entries (residual <= the policy's protected recent window).
// Between steps a layer holds at most plan.budget = main_budget + residual entries.
//
// Index bytes: positions are int32 and, where the policy decides from positions alone (window,
// sink, dense, h2o whose recent window is its whole budget), shared by the row's groups (one
// slot layout for all of them); only scoring policies keep positions per group and float32
// state per entry (the score; h2o-vlen adds the value's norm, qh2o the quantisation error).
// So an int8/int4 entry's bookkeeping is 4 / n_query_groups bytes (window, sink), 8 bytes
// (h2o, tova) or 12 (h2o-vlen, qh2o) beside its 2 · (head_size · bits / 8 + 2 · head_size /
// group_size) bytes of keys and values.
//
// A step attends to what the layer kept after the previous step plus the step's own entries,
// and only then evicts down to the budget: a decode step writes its entry into main's spare
// slot (or the ring), attends to main + ring, and evicts one entry when over budget; a prefill
// chunk of T > 1 tokens attends to main + ring + the chunk (a transient concatenation), then
// main is rebuilt from the entries the policy keeps. So no query loses a key it needs whatever
// the chunking, and with a budget covering the sequence nothing is ever evicted and every
// policy equals the dense cache. Eviction waits for the step's attention weights
// (ObserveAttentionWeights) or, for policies that do not score, for the layer's next step.
//
// Reading: decoding steps (one token) of float32 CPU caches run in host loops (DecodeOnHost):
// the entry is placed, encoded and its slot chosen by plain loops, attention takes the decode
// kernel over main's and the ring's entries in place (quantised main entries of a (row, group)
// are decoded for the step into a thread-local buffer of at most budget + 1 entries), the
// kernel hands out the softmax weights a scoring policy adds to its scores, and the eviction
// is one loop over the slots: one LibTorch allocation (the output) a layer and step, where the
// tensor path below takes ~25 operations and costs more than the attention on small models.
// Everything else (prompt chunks, other dtypes or devices, h2o-vlen, qh2o, unbudgeted quantised
// layers) takes the tensor path: quantised storage attends block by block (AttendBlockwise in
// core/ops/attention.h; at most `read_chunk` entries decoded at a time, so no full-precision
// copy of the layer exists), full-precision storage takes KVCache's default (Update, whose
// view of main copies nothing on decode steps, then AttendByPositions). Update on quantised
// storage decodes the whole layer (a transient copy, for callers that want the entries
// themselves, such as the attention probe). Both paths make the same decisions from the same
// bits (policy_kv_cache_test InPlaceAttentionEqualsAttentionOverTheView).
//
// Costs per decode step and layer: O(slots) for slot choice and eviction, O(head_size) to
// encode the one entry that enters main, O(slots · head_size) to decode quantised entries for
// the step, no allocation of storage except when main grows, so bytes stay flat once the
// budget is reached.
//
// Cache positions (options.cache_positions; window and sink policies): StreamingLLM's point,
// generating past the model's context. RoPE scores depend only on the query-key distance, so
// what a window cache lacks is positions beyond the context; a sink cache also wants its sinks
// right before the window. Design: llama.cpp's context shift, amortised. The stream writes at
// positions within the cache; when a step would reach max_sequence_length (the context L),
// MakeRoom moves every kept entry except the sinks down by shift = next - budget, re-rotating its
// key by -shift (KeyShifter: RoPE rotations compose exactly), so the sinks stay at 0 .. s-1, the
// window lands right after them at s .. budget-1 (StreamingLLM's layout) and the stream goes on
// at position `budget`. Until the next shift, L - budget steps later, the window drifts up while
// the sinks stay: every query-key distance the model sees is below L, window distances are the
// true ones, and the sinks sit between `budget` and L positions back. Equivalent to attending at
// those positions from scratch (tests/cache_positions_test.cc checks this against uncached
// forward passes). Costs: O(budget · head_size) per layer once every L - budget steps (O(1)
// amortised per step; e.g. 64 of a 256 context: every 192 steps), nothing per ordinary step; no
// extra storage; the sinks are never touched. Quantised main entries are decoded, rotated and
// re-encoded (block by block, never the whole layer at once): each re-encode adds up to half a
// quantisation step, and a window entry is shifted at most ceil(budget / (L - budget)) times
// in its life (once for budgets up to L/2); full-precision entries (16 bits and the ring) rotate
// with float32 rounding only.
//
// Rollback (speculative decoding): caches that never evict (the dense policy, or budgets that
// cover every layer's span) forget entries exactly; the others take no rollback role (an entry
// a rejected token displaced cannot come back, and h2o's scores would keep the rejected
// queries' attention). Quantised storage attends a step's tokens as decoding reads them only
// when the step asks (KVStep.sequential: each token's own entry and the ring's oldest ones are
// read encoded, as one-token steps read them; a chunk reads them in full precision), and such a
// step keeps the ring as it was and the step's full-precision entries until the next step, so
// that Truncate can put back into the ring, in full precision and in the slots decoding would
// have used, the entries the step had moved into main.
#ifndef LGPT_CACHE_POLICY_KV_CACHE_H_
#define LGPT_CACHE_POLICY_KV_CACHE_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/eviction_policy.h"
#include "cache/kv_cache.h"
#include "cache/kv_codec.h"
#include "core/ops/attention.h"
#include "core/ops/decode_attention.h"

namespace lgpt {

struct PolicyKVCacheOptions : KVCacheGeometry {
  EvictionPolicyOptions policy;
  int bits = 16;             // 16: the model's dtype; 8 or 4: quantised entries
  int64_t residual = 16;     // quantised: most recent entries kept in full precision
  int64_t group_size = 32;   // quantised: channels sharing one scale
  int64_t read_chunk = 512;  // entries decoded at a time by UpdateAndAttend
  // Positions within the cache (window and sink policies, budget below max_sequence_length):
  // MakeRoom shifts kept entries down when the stream reaches max_sequence_length.
  bool cache_positions = false;
  // Slots main grows by: 0 doubles its capacity (at least 64 slots, O(1) amortised copies);
  // N > 0 grows it to the next multiple of N (a serving pool's block size: storage charged to
  // the pool in whole blocks, never more than budget / N + 1 blocks per layer and group).
  int64_t growth_step = 0;
};

// Checks the storage fields: bits (16, 8 or 4), residual (>= 0), group_size (>= 1) and
// read_chunk (>= 1); errors name the fields under `owner` ("KVCacheSpec.bits") and carry them
// (core/base/status_field.h).
absl::Status ValidateEntryStorage(int bits, int64_t residual, int64_t group_size,
                                  int64_t read_chunk, absl::string_view owner);

// How CheckPolicyCacheRules names what it checks: the caller's own fields (KVCacheSpec's for
// cache/kv_cache_factory.h, PolicyKVCacheOptions' for PolicyKVCache::Create).
struct PolicyCacheFields {
  std::string policy;         // the policy kind ("KVCacheSpec.policy")
  std::string bits;           // "KVCacheSpec.bits"
  std::string budget;         // "KVCacheSpec.budget"
  std::string positions;      // what turns cache positions on ("KVCacheSpec.positions")
  std::string positions_on;   // how a message says they are on ("KVCacheSpec.positions=cache")
  std::string layer_budgets;  // what gives layers budgets of their own ("KVCacheSpec.budget_rule")
  std::string one_budget;     // how a message asks for none ("KVCacheSpec.budget_rule uniform")
};

// The rules a policy cache's options obey across their parts (each part's own:
// ValidateEvictionPolicy, ValidateEntryStorage): qh2o needs 8 or 4 bits; cache positions need
// a window or sink policy, one budget for every layer (`per_layer_budgets` false) and, where
// `context` is known, a budget below it. Errors name and carry `fields`.
absl::Status CheckPolicyCacheRules(PolicyKind kind, int bits, bool cache_positions, int64_t budget,
                                   bool per_layer_budgets, std::optional<int64_t> context,
                                   const PolicyCacheFields& fields);

class PolicyKVCache : public KVCache,
                      public KVStorageBound,
                      public KVAttentionScorer,
                      public KVPositionShifter,
                      public KVForker,
                      public KVRollback {
 public:
  static absl::StatusOr<std::unique_ptr<PolicyKVCache>> Create(const PolicyKVCacheOptions& options);

  absl::StatusOr<KVView> Update(int64_t layer, const KVStep& step, const at::Tensor& keys,
                                const at::Tensor& values) override;
  absl::Status CheckStep(const KVStep& step, int64_t batch_size) const override;
  void Reset() override;
  // Frees every layer's storage (capacity back to 0).
  void Release() override;
  // Entry storage (main and ring, scales included), summed over layers.
  int64_t AllocatedBytes() const override;
  // Positions (int32, per row or per group) and scores (float32, scoring policies) of every slot.
  int64_t IndexBytes() const override;
  // Every layer at its largest: main_budget + 1 slots (main_budget without eviction) and the
  // ring, entries and index.
  int64_t MaxBytes() const override;
  // Main's capacity after the step as GrowStore would grow it (a decode step adds at most one
  // entry to main, a chunk at most its tokens), the ring's once allocated.
  int64_t BytesAfterStep(int64_t tokens) const override;
  const KVStorageBound* storage_bound() const override { return this; }
  int64_t max_sequence_length() const override { return options_.max_sequence_length; }
  int64_t batch_size() const override { return options_.batch_size; }
  int64_t num_layers() const override { return static_cast<int64_t>(layers_.size()); }
  bool WantsAttentionWeights(int64_t layer) const override;
  void ObserveAttentionWeights(int64_t layer, const at::Tensor& weights) override;
  KVAttentionScorer* attention_scorer() override { return this; }
  // Decoding steps in host loops where DecodeOnHostApplies; otherwise quantised storage attends
  // block by block (AttendBlockwise) and full-precision storage takes KVCache's default.
  absl::StatusOr<at::Tensor> UpdateAndAttend(int64_t layer, const KVStep& step, const at::Tensor& q,
                                             const at::Tensor& keys, const at::Tensor& values,
                                             const AttentionParams& params) override;
  // Itself with cache positions (options.cache_positions).
  const KVPositionShifter* position_shifter() const override {
    return options_.cache_positions ? this : nullptr;
  }
  absl::StatusOr<int64_t> MakeRoom(int64_t next, int64_t steps,
                                   const KeyShifter& shift_keys) override;
  // Forking: into another PolicyKVCache whose options equal these but for max_sequence_length,
  // and whose layers make the same decisions (LayerPlan) over it.
  const KVForker* forker() const override { return this; }
  absl::Status CheckCopyInto(const KVCache& target) const override;
  // Each layer's stores at this cache's capacity (within the target's bound), their filled
  // slots ([0, high)) copied, and its pending eviction (the last chunk's entries, settled at the
  // next step) cloned: O(filled slots + the last chunk) per layer.
  absl::Status CopyInto(KVCache& target) const override;
  std::string DebugName() const override;
  // Itself when no layer evicts and positions are stream positions; null otherwise.
  KVRollback* rollback() override { return rolls_back_ ? this : nullptr; }
  // Unlimited: layers without a full-precision ring forget any entries; ring layers forget
  // those of the last step when it was sequential (KVStep.sequential), else none.
  int64_t max_rollback() const override { return kUnlimited; }
  absl::Status Truncate(int64_t length) override;

  const LayerPlan& plan(int64_t layer) const { return layers_[layer].plan; }
  // Full-precision recent entries of `layer` (0 unless quantised).
  int64_t residual(int64_t layer) const { return layers_[layer].residual; }
  // Slots allocated for `layer` (main plus ring), per (row, group).
  int64_t slots(int64_t layer) const;
  // Positions `layer` keeps for (row, group), ascending, after any pending eviction.
  std::vector<int64_t> KeptPositions(int64_t layer, int64_t row, int64_t group);

 private:
  struct Store {
    std::vector<at::Tensor> parts;  // encoded entries, each [B, G, capacity, width]
    at::Tensor positions;           // [B, P, capacity] int32, -1 where empty (P: Layer)
    at::Tensor scores;  // [B, G, capacity, StateChannels] float32: the policy's state (scoring
                        // policies only; undefined otherwise)
    int64_t capacity = 0;
    int64_t used = 0;  // upper bound on the live entries of any (row, group)
    int64_t high = 0;  // upper bound on (highest live slot + 1): views stop there
  };
  // What a step leaves to do after its attention: evict (decode) or rebuild main (chunk).
  struct Pending {
    enum Kind { kNone, kDecode, kChunk } kind = kNone;
    int64_t rows = 0;
    int64_t main_high = 0;    // main slots in the step's view
    int64_t ring_size = 0;    // ring slots in the step's view
    at::Tensor keys, values;  // chunk: [rows, G, T, hs]
    at::Tensor positions;     // chunk: [rows, P, T] int32
    at::Tensor newest;        // [rows, 1, 1]: the newest position of each row
    at::Tensor feature;       // [rows, G, T]: EntryFeature of the step's entries (or undefined)
  };
  // What Truncate needs to undo a sequential step: main's counters and the ring before the
  // step, and the step's entries in full precision (layers with a ring).
  struct Undo {
    bool valid = false;
    int64_t main_used = 0;
    int64_t main_high = 0;
    at::Tensor ring_positions;  // [rows, 1, residual] int32 on the host; -1 where empty
    at::Tensor ring_keys;       // [rows, G, residual, hs] (undefined while the ring was unused)
    at::Tensor ring_values;
    at::Tensor positions;  // [rows, T] int64 on the host: the step's positions
    at::Tensor keys;       // [rows, G, T, hs] in the model's dtype
    at::Tensor values;
  };
  struct Layer {
    KVLayerSpec spec;
    LayerPlan plan;
    int64_t residual = 0;
    int64_t main_budget = 0;
    // P, the position groups: G where decisions differ by group (scoring policies), else 1
    // (one slot layout for every group of a row).
    int64_t position_groups = 1;
    int64_t quant_group = 0;                 // channels sharing a scale in quantised entries
    int64_t max_written = -1;                // largest position written since the last reset
    std::unique_ptr<EntryCodec> codec;       // main's entries
    std::unique_ptr<EntryCodec> ring_codec;  // full precision
    Store main;
    Store ring;
    Pending pending;
    std::vector<float> step_weights;  // DecodeOnHost's attention weights, reused every step
    Undo undo;                        // the last step's, when it was sequential
  };

  explicit PolicyKVCache(const PolicyKVCacheOptions& options);
  // Settles the previous step, drops rewound entries and places the step's entries; returns
  // the sources the step attends to, in view order: main, ring, chunk.
  std::vector<KVBlockSource> Begin(Layer& layer, const KVStep& step, const at::Tensor& keys,
                                   const at::Tensor& values);
  void Settle(Layer& layer, const at::Tensor& weights);
  // Policy state of the step's new entries: [rows, G, 1, C] for a decode step (score 0 and
  // the entry's feature), [rows, G, T, C] for a chunk with its scores [rows, G, T]; undefined
  // for policies without state.
  at::Tensor FreshState(const Layer& layer, int64_t rows) const;
  at::Tensor ChunkState(const Layer& layer, const at::Tensor& chunk_scores) const;
  // h2o-vlen: the value norms of the step's view [rows, G, S] (main, ring, chunk).
  at::Tensor ViewFeature(const Layer& layer) const;
  void Rewind(Layer& layer, const KVStep& step);
  void PlaceDecode(Layer& layer, int64_t rows, const at::Tensor& keys, const at::Tensor& values,
                   const at::Tensor& positions);
  void InsertMain(Layer& layer, int64_t rows, const at::Tensor& keys, const at::Tensor& values,
                  const at::Tensor& positions, const at::Tensor& scores);
  void EvictDecode(Layer& layer);
  // EvictDecode as one loop over the slots (CPU storage, EntryPriorityApplies): the same
  // choice as Priority and argmin without a LibTorch operation per step; false when it does
  // not apply.
  bool EvictDecodeOnHost(Layer& layer);
  // The loop itself, for `rows` rows whose newest positions are newest[0, rows).
  void EvictOnHost(Layer& layer, int64_t rows, const int64_t* newest);
  // A whole decoding step of float32 storage on the CPU in host loops: place the entry (into
  // the ring, whose oldest entry moves on to main, or into main, encoded), attend with the
  // decode kernel (which hands out the weights a scoring policy adds to its scores), evict.
  // The same arithmetic as Begin, AttendBlockwise and Settle (the same bits for quantised
  // entries) without their ~25 LibTorch operations per layer and step, which cost more than
  // the step's attention on small models. Quantised main entries are decoded per (row, group)
  // into a thread-local buffer for the step (budgeted caches only: kHostDecodedEntries).
  // Applies to one-token steps of policies EntryPriorityApplies to, except h2o-vlen (its
  // feature is computed by tensor operations) and layers with a score reducer.
  bool DecodeOnHostApplies(const Layer& layer, const at::Tensor& q, const at::Tensor& keys,
                           const at::Tensor& values, const KVStep& step) const;
  at::Tensor DecodeOnHost(Layer& layer, const KVStep& step, const at::Tensor& q,
                          const at::Tensor& keys, const at::Tensor& values,
                          const AttentionParams& params);
  // Places row b's new entry (keys, values [rows, G, 1, hs] float32, each entry's hs floats
  // contiguous) with fresh (zero) policy state: into the ring, after moving its oldest entry to
  // main when `ring_full`, or straight into main.
  void PlaceOnHost(Layer& layer, int64_t b, int32_t position, const at::Tensor& keys,
                   const at::Tensor& values, bool ring_full);
  // One entry of every group of a position group, in host memory: group g's key at
  // keys + g · group_stride (values alike) and its state at state + g · state_group_stride
  // (null: fresh zero state).
  struct HostEntry {
    const float* keys;
    const float* values;
    int64_t group_stride;
    const float* state;
    int64_t state_group_stride;
  };
  // Writes (and encodes) an entry into the first empty main slot of (row b, position group p).
  void InsertMainOnHost(Layer& layer, int64_t b, int64_t p, int32_t position,
                        const HostEntry& entry);
  // The query groups [first, last) whose slots position group p stands for.
  struct GroupRange {
    int64_t first;
    int64_t last;
  };
  static GroupRange GroupsOf(const Layer& layer, int64_t p);
  // The step's view in host decoding: positions [rows, P, main.high + ring] (int32) and the
  // entries of each (row, group), main's then the ring's.
  at::Tensor ViewPositionsOnHost(const Layer& layer, int64_t rows) const;
  KVSegmentsOf ViewSegments(const Layer& layer) const;
  // Adds (h2o) or sets (tova) each viewed entry's score from the step's weights
  // [rows, n_head, 1, main.high + ring].
  void ScoreOnHost(Layer& layer, int64_t rows, int64_t n_head, const float* weights);
  // After a chunk: the ring takes the newest entries, main keeps the policy's choice.
  void Compact(Layer& layer, const at::Tensor& chunk_scores);
  // The ring's entries and the chunk's [rows, G, ·]: the ring keeps the `residual` newest;
  // the others (migrant_positions, -1 where the ring kept them) move on to main.
  struct Recent {
    at::Tensor positions, scores, keys, values;
    at::Tensor migrant_positions;
  };
  Recent TakeIntoRing(Layer& layer, const at::Tensor& chunk_scores);
  // Rebuilds main from its entries and the migrants: the policy's top main_budget, in
  // position order.
  void KeepInMain(Layer& layer, const Recent& recent);
  // Moves the layer's entries at or above its sink positions down by `shift`.
  void Shift(int64_t index, Layer& layer, int64_t shift, const KeyShifter& shift_keys);
  void GrowStore(Store& store, const EntryCodec& codec, const Layer& layer, int64_t capacity);
  // `to` (a store of `layer`, this cache's) becomes a copy of `from` (a store of another cache's
  // same layer) with `capacity` slots (at least from.high): the filled slots copied.
  void CopyStore(const Store& from, const EntryCodec& codec, const Layer& layer, int64_t capacity,
                 Store& to);
  // Grows main to hold `needed` slots (nothing when it does already).
  void GrowMain(Layer& layer, int64_t needed);
  // Main's capacity for `needed` slots when it has `current` (options.growth_step).
  int64_t GrownMainCapacity(const Layer& layer, int64_t needed, int64_t current) const;
  int64_t MaxMainCapacity(const Layer& layer) const;
  // Bytes of `slots` slots of a row with `codec`'s entries and the layer's index.
  int64_t SlotBytes(const Layer& layer, const EntryCodec& codec, int64_t slots) const;
  std::vector<KVBlockSource> Sources(Layer& layer, int64_t rows);

  // UpdateAndAttend's work for one step, after its checks.
  absl::StatusOr<at::Tensor> AttendStep(int64_t layer_index, const KVStep& step,
                                        const at::Tensor& q, const at::Tensor& keys,
                                        const at::Tensor& values, const AttentionParams& params);
  // A sequential step of quantised storage: each token as a one-token step, the undo kept.
  absl::StatusOr<at::Tensor> AttendSequential(int64_t layer_index, const KVStep& step,
                                              const at::Tensor& q, const at::Tensor& keys,
                                              const at::Tensor& values,
                                              const AttentionParams& params);
  // Truncate's check of one layer: whether it can forget positions >= length exactly.
  absl::Status CheckTruncate(int64_t index, const Layer& layer, int64_t length) const;
  void TruncateLayer(Layer& layer, int64_t length);

  PolicyKVCacheOptions options_;
  std::vector<Layer> layers_;
  bool rolls_back_ = false;  // no layer evicts, stream positions
};

}  // namespace lgpt

#endif  // LGPT_CACHE_POLICY_KV_CACHE_H_
