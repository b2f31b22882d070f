#include "cache/scored_paged_kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cache/pool_entries.h"
#include "core/base/device.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "core/ops/decode_attention.h"
#include "core/ops/paged_attention_layout.h"

namespace lgpt {
namespace {

constexpr char kPolicyKind[] = "ScoredPagedKVCacheOptions.policy.kind";
constexpr char kPool[] = "ScoredPagedKVCacheOptions.pool";

bool SamePlan(const LayerPlan& a, const LayerPlan& b) {
  return a.kind == b.kind && a.budget == b.budget && a.window == b.window && a.recent == b.recent &&
         a.sink_tokens == b.sink_tokens && a.scored == b.scored && a.normalize == b.normalize;
}

// `entries` as contiguous float32 (a 16-bit model's entries widen exactly), a tensor of its own
// with `copy`.
at::Tensor AsFloat32(const at::Tensor& entries, bool copy = false) {
  return entries.to(at::kFloat, /*non_blocking=*/false, copy, at::MemoryFormat::Contiguous);
}

bool SlotWorkOnHost(ScoredSlotWork work, const BlockPool& pool) {
  return work == ScoredSlotWork::kHost || (work == ScoredSlotWork::kAuto && pool.device().is_cpu());
}

}  // namespace

absl::Status CheckScoredPagedPolicy(const EvictionPolicyOptions& policy) {
  if (policy.kind != PolicyKind::kH2O && policy.kind != PolicyKind::kH2OVlen &&
      policy.kind != PolicyKind::kTova) {
    return InvalidFieldError(
        kPolicyKind, absl::StrCat(kPolicyKind,
                                  " must be h2o, h2o-vlen or tova (sink and window caches are "
                                  "PagedKVCache's rings), got ",
                                  PolicyName(policy.kind)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ScoredPagedKVCache>> ScoredPagedKVCache::Create(
    const ScoredPagedKVCacheOptions& options) {
  if (options.pool == nullptr) {
    return InvalidFieldError(kPool, absl::StrCat(kPool, " is missing"));
  }
  const int64_t context = options.max_sequence_length;
  if (context < 1 || context > std::numeric_limits<int32_t>::max()) {
    return InvalidFieldError(
        "ScoredPagedKVCacheOptions.max_sequence_length",
        absl::StrCat("ScoredPagedKVCacheOptions.max_sequence_length must be in [1, ",
                     std::numeric_limits<int32_t>::max(), "] (positions are int32), got ",
                     context));
  }
  const EvictionPolicyOptions& policy = options.policy;
  RETURN_IF_ERROR(ValidateEvictionPolicy(policy, "ScoredPagedKVCacheOptions.policy"));
  RETURN_IF_ERROR(CheckScoredPagedPolicy(policy));
  if (options.slot_work == ScoredSlotWork::kHost && !options.pool->device().is_cpu()) {
    return InvalidFieldError(
        "ScoredPagedKVCacheOptions.slot_work",
        absl::StrCat("ScoredPagedKVCacheOptions.slot_work is kHost, which needs a CPU pool; the "
                     "pool is on ",
                     options.pool->device().str()));
  }
  const at::TensorOptions slot_options = SlotWorkOnHost(options.slot_work, *options.pool)
                                             ? at::TensorOptions()
                                             : at::TensorOptions().device(options.pool->device());
  const std::vector<KVLayerSpec>& specs = options.pool->layers();
  if (!policy.layer_budgets.empty() && policy.layer_budgets.size() != specs.size()) {
    return InvalidFieldError(
        "ScoredPagedKVCacheOptions.policy.layer_budgets",
        absl::StrCat("ScoredPagedKVCacheOptions.policy.layer_budgets has ",
                     policy.layer_budgets.size(), " entries for ", specs.size(), " layers"));
  }
  std::vector<Layer> layers;
  for (size_t i = 0; i < specs.size(); ++i) {
    Layer layer;
    const int64_t budget = policy.layer_budgets.empty() ? policy.budget : policy.layer_budgets[i];
    layer.plan = MakeLayerPlan(policy, budget, specs[i].sliding_window, context);
    layer.groups = specs[i].n_query_groups;
    layer.head_size = specs[i].head_size;
    // Evicting layers address one slot beyond the budget: a decoding step's entry before the
    // eviction it causes (PolicyKVCache's main store holds as many).
    layer.capacity =
        std::max<int64_t>(1, layer.plan.evicts() ? layer.plan.budget + 1 : layer.plan.budget);
    layer.positions = at::full({1, layer.groups, layer.capacity}, -1, slot_options.dtype(at::kInt));
    layer.channels = std::max<int64_t>(1, StateChannels(layer.plan));
    layer.scores = at::zeros({1, layer.groups, layer.capacity, layer.channels},
                             slot_options.dtype(at::kFloat));
    layers.push_back(std::move(layer));
  }
  return std::unique_ptr<ScoredPagedKVCache>(new ScoredPagedKVCache(options, std::move(layers)));
}

ScoredPagedKVCache::ScoredPagedKVCache(const ScoredPagedKVCacheOptions& options,
                                       std::vector<Layer> layers)
    : pool_(options.pool),
      max_sequence_length_(options.max_sequence_length),
      policy_(options.policy),
      on_host_(SlotWorkOnHost(options.slot_work, *options.pool)),
      layers_(std::move(layers)),
      layer_length_(layers_.size(), 0) {
  for (const Layer& layer : layers_) max_capacity_ = std::max(max_capacity_, layer.capacity);
}

ScoredPagedKVCache::~ScoredPagedKVCache() { Reset(); }

void ScoredPagedKVCache::Reset() {
  for (int64_t block : table_) pool_->Release(block);
  table_.clear();
  table_changed_ = true;
  for (Layer& layer : layers_) {
    layer.positions.fill_(-1);
    layer.scores.zero_();
    layer.high = layer.used = 0;
    layer.pending = Pending();
  }
  std::fill(layer_length_.begin(), layer_length_.end(), 0);
  length_ = 0;
}

int64_t ScoredPagedKVCache::BlocksToHold(int64_t entries) const {
  return pool_->BlocksFor(std::min(entries, max_capacity_));
}

std::vector<int64_t> ScoredPagedKVCache::TableSlotsToFill(int64_t steps) const {
  // Every slot may be written (a chunk rewrites the kept ones), so a shared block is copied
  // before the step; only forks share blocks.
  std::vector<int64_t> indices;
  const int64_t target = BlocksToHold(length_ + steps);
  for (int64_t i = 0; i < target; ++i) {
    if (i >= static_cast<int64_t>(table_.size()) || pool_->IsShared(table_[i])) {
      indices.push_back(i);
    }
  }
  return indices;
}

int64_t ScoredPagedKVCache::BlocksNeeded(int64_t steps) const {
  return static_cast<int64_t>(TableSlotsToFill(steps).size());
}

absl::Status ScoredPagedKVCache::TakeStepBlocks(int64_t steps) const {
  const std::vector<int64_t> indices = TableSlotsToFill(steps);
  if (indices.empty()) return absl::OkStatus();
  table_changed_ = true;
  return TakeTableBlocks(*pool_, table_, indices);
}

absl::Status ScoredPagedKVCache::CheckStep(const KVStep& step, int64_t batch_size) const {
  RETURN_IF_ERROR(CheckStepBounds(step, batch_size, 1, max_sequence_length_));
  const int64_t steps = step.positions.size(1);
  if (step.min_position != length_ || step.max_position != length_ + steps - 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ScoredPagedKVCache appends in position order: the step must cover positions ", length_,
        "..", length_ + steps - 1, ", got ", step.min_position, "..", step.max_position));
  }
  return TakeStepBlocks(steps);
}

absl::Status ScoredPagedKVCache::CheckLayer(int64_t layer, const KVStep& step,
                                            const at::Tensor& keys,
                                            const at::Tensor& values) const {
  RETURN_IF_ERROR(
      CheckLayerStep(layer, pool_->layers(), step, keys, values, 1, max_sequence_length_));
  const c10::ScalarType dtype = keys.scalar_type();
  const c10::Device device = pool_->device();
  if ((dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf) ||
      values.scalar_type() != dtype || keys.device() != device || values.device() != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ScoredPagedKVCache takes float32, bfloat16 or float16 keys and values (of one dtype) on "
        "its pool's device (",
        device.str(), "), got keys ", c10::toString(dtype), " on ", keys.device().str(),
        " and values ", c10::toString(values.scalar_type()), " on ", values.device().str()));
  }
  if (layer_length_[layer] != length_ ||
      BlocksToHold(length_ + keys.size(2)) > static_cast<int64_t>(table_.size())) {
    return absl::FailedPreconditionError(
        absl::StrCat("ScoredPagedKVCache layer ", layer, " written without its step's CheckStep"));
  }
  return absl::OkStatus();
}

void ScoredPagedKVCache::Advance(int64_t layer, int64_t steps) {
  layer_length_[layer] += steps;
  const int64_t length = layer_length_[layer];
  if (std::all_of(layer_length_.begin(), layer_length_.end(),
                  [&](int64_t l) { return l == length; })) {
    length_ = length;
  }
}

const paged::EntryFormat* ScoredPagedKVCache::QuantisedFormat(int64_t layer) const {
  return pool_->quantised() ? &pool_->entry_format(layer) : nullptr;
}

int64_t ScoredPagedKVCache::RowBytes(int64_t layer) const {
  if (pool_->quantised()) return paged::EntryBytes(pool_->entry_format(layer));
  return layers_[layer].head_size * static_cast<int64_t>(c10::elementSize(pool_->dtype()));
}

char* ScoredPagedKVCache::RowOf(int64_t layer, bool keys, int64_t slot, int64_t group) const {
  const int64_t block_entries = pool_->entries_per_block();
  const int64_t block = table_[slot / block_entries];
  const at::Tensor& storage = keys ? pool_->keys(block, layer) : pool_->values(block, layer);
  return static_cast<char*>(storage.data_ptr()) +
         (group * block_entries + slot % block_entries) * RowBytes(layer);
}

void ScoredPagedKVCache::StoreRow(int64_t layer, bool keys, int64_t slot, int64_t group,
                                  const float* src) const {
  StoreFloatRow(src, layers_[layer].head_size, pool_->dtype(), QuantisedFormat(layer),
                RowOf(layer, keys, slot, group));
}

std::vector<at::Tensor> ScoredPagedKVCache::SlotBlocks(int64_t layer, bool keys,
                                                       int64_t slots) const {
  std::vector<at::Tensor> blocks;
  for (int64_t i = 0; i < pool_->BlocksFor(slots); ++i) {
    blocks.push_back(keys ? pool_->keys(table_[i], layer) : pool_->values(table_[i], layer));
  }
  return blocks;
}

at::Tensor ScoredPagedKVCache::ReadKept(int64_t layer, bool keys, int64_t high,
                                        c10::ScalarType dtype) const {
  const Layer& l = layers_[layer];
  if (high == 0) return at::empty({1, l.groups, 0, l.head_size}, at::TensorOptions(dtype));
  const paged::EntryFormat* format = QuantisedFormat(layer);
  return ReadEntries(SlotBlocks(layer, keys, high), high, format, dtype).unsqueeze(0);
}

at::Tensor ScoredPagedKVCache::AsStored(int64_t layer, const at::Tensor& entries,
                                        c10::ScalarType dtype) const {
  if (!pool_->quantised() && pool_->dtype() == at::kFloat) return entries.to(dtype);
  // Encoded as the pool's blocks hold them, then read back.
  return ReadEntries({Encode(layer, entries)}, entries.size(2), QuantisedFormat(layer), dtype)
      .unsqueeze(0);
}

void ScoredPagedKVCache::PlaceDecode(Layer& layer, int64_t index, int64_t position,
                                     const at::Tensor& keys, const at::Tensor& values) {
  // One empty slot per group exists: at most `used` < capacity are live.
  TORCH_CHECK(layer.used < layer.capacity, "no empty slot in a scored paged cache's layer");
  if (on_host_) {
    PlaceDecodeOnHost(layer, index, position, keys, values);
  } else {
    PlaceDecodeOnDevice(layer, index, position, keys, values);
  }
  layer.used = std::min(layer.used + 1, layer.capacity);
  layer.high = std::min(layer.capacity, std::max(layer.high, layer.used));
}

void ScoredPagedKVCache::PlaceDecodeOnHost(Layer& layer, int64_t index, int64_t position,
                                           const at::Tensor& keys, const at::Tensor& values) {
  const at::Tensor k = AsFloat32(keys), v = AsFloat32(values);  // [1, G, 1, hs] float32
  const int64_t capacity = layer.capacity, hs = layer.head_size;
  int32_t* positions = layer.positions.data_ptr<int32_t>();  // [1, G, capacity]
  float* scores = layer.scores.data_ptr<float>();            // [1, G, capacity, channels]
  const at::Tensor feature =                                 // [1, G, 1]: h2o-vlen's value norms
      layer.pending.feature.defined() ? layer.pending.feature.contiguous() : at::Tensor();
  for (int64_t g = 0; g < layer.groups; ++g) {
    int32_t* slots = positions + g * capacity;
    // The first empty slot, as PolicyKVCache's main store takes it; one exists (used < capacity).
    const int64_t slot =
        std::find_if(slots, slots + capacity, [](int32_t s) { return s < 0; }) - slots;
    TORCH_CHECK(slot < capacity, "no empty slot in a scored paged cache's layer");
    slots[slot] = static_cast<int32_t>(position);
    float* state = scores + (g * capacity + slot) * layer.channels;
    state[0] = 0.0f;
    if (layer.channels > 1) state[1] = feature.data_ptr<float>()[g];
    StoreRow(index, true, slot, g, k.data_ptr<float>() + g * hs);
    StoreRow(index, false, slot, g, v.data_ptr<float>() + g * hs);
  }
}

void ScoredPagedKVCache::PlaceDecodeOnDevice(Layer& layer, int64_t index, int64_t position,
                                             const at::Tensor& keys, const at::Tensor& values) {
  const at::Tensor positions = layer.positions.select(0, 0);  // [G, capacity]
  // Each group's first empty slot (argmax takes the first of equals): [G, 1].
  const at::Tensor slot = positions.lt(0).to(at::kInt).argmax(1, /*keepdim=*/true);
  positions.scatter_(1, slot, position);
  at::Tensor fresh = at::zeros({layer.groups, 1, layer.channels}, layer.scores.options());
  if (layer.channels > 1) fresh.select(2, 1).copy_(layer.pending.feature.view({layer.groups, 1}));
  layer.scores.select(0, 0).scatter_(1, slot.unsqueeze(2).expand_as(fresh), fresh);
  WriteStored(index, true, slot, Encode(index, keys));
  WriteStored(index, false, slot, Encode(index, values));
}

at::Tensor ScoredPagedKVCache::TableOnDevice() const {
  if (table_changed_) {
    const at::Tensor host =
        at::from_blob(table_.data(), {static_cast<int64_t>(table_.size())}, at::kLong).clone();
    table_on_device_ = ToDeviceQueued(host, pool_->device());
    table_changed_ = false;
  }
  return table_on_device_;
}

at::Tensor ScoredPagedKVCache::SlotRange(int64_t layer, int64_t n) const {
  const at::TensorOptions options = at::TensorOptions(at::kLong).device(pool_->device());
  return at::arange(n, options).unsqueeze(0).expand({layers_[layer].groups, n});
}

at::Tensor ScoredPagedKVCache::Encode(int64_t layer, const at::Tensor& entries) const {
  const int64_t groups = entries.size(1), steps = entries.size(2);
  const paged::EntryFormat* format = QuantisedFormat(layer);
  const int64_t width = format != nullptr ? paged::EntryBytes(*format) : entries.size(3);
  const at::Tensor rows =  // [G, T, width]
      at::empty({groups, steps, width}, at::TensorOptions(pool_->dtype()).device(pool_->device()));
  StoreEntries(AsFloat32(entries), 0, steps, rows, 0, format);
  return rows;
}

std::vector<at::indexing::TensorIndex> ScoredPagedKVCache::StorageIndex(
    const at::Tensor& slots) const {
  const int64_t entries = pool_->entries_per_block();
  const at::Tensor blocks =  // [G, n]: the block of each slot
      TableOnDevice()
          .index_select(0, slots.div(entries, "floor").reshape({-1}))
          .view(slots.sizes());
  const at::Tensor groups = at::arange(slots.size(0), slots.options()).unsqueeze(1);  // [G, 1]
  return {blocks, groups, slots.remainder(entries)};
}

at::Tensor ScoredPagedKVCache::ReadStored(int64_t layer, bool keys, const at::Tensor& slots) const {
  const at::Tensor& storage = keys ? pool_->layer_keys(layer) : pool_->layer_values(layer);
  return storage.index(StorageIndex(slots));  // [G, n, width]
}

void ScoredPagedKVCache::WriteStored(int64_t layer, bool keys, const at::Tensor& slots,
                                     const at::Tensor& rows) const {
  at::Tensor storage = keys ? pool_->layer_keys(layer) : pool_->layer_values(layer);
  storage.index_put_(StorageIndex(slots), rows);
}

absl::StatusOr<KVView> ScoredPagedKVCache::Update(int64_t index, const KVStep& step,
                                                  const at::Tensor& keys,
                                                  const at::Tensor& values) {
  RETURN_IF_ERROR(CheckLayer(index, step, keys, values));
  return UpdateChecked(index, step, keys, values);
}

KVView ScoredPagedKVCache::UpdateChecked(int64_t index, const KVStep& step, const at::Tensor& keys,
                                         const at::Tensor& values) {
  Settle(index, at::Tensor());
  Layer& layer = layers_[index];
  Pending& pending = layer.pending;
  const int64_t steps = keys.size(2);
  const c10::ScalarType dtype = keys.scalar_type();
  pending.newest = step.max_position;
  if (layer.channels > 1) {  // h2o-vlen: the entries' value norms, as the policy cache takes them
    pending.feature = EntryFeature(layer.plan, keys, values, RoundTrip()).to(at::kFloat);
  }
  if (steps == 1) {
    PlaceDecode(layer, index, step.max_position, keys, values);
    Advance(index, 1);
    pending.kind = Pending::kDecode;
    pending.view_high = layer.high;
    return KVView{ReadKept(index, true, layer.high, dtype),
                  ReadKept(index, false, layer.high, dtype),
                  layer.positions.narrow(2, 0, layer.high)};
  }
  // A chunk: the kept slots, then the chunk's entries as they would be stored; which of them
  // stay is decided once the step's weights are known.
  const int64_t high = layer.high;
  pending.kind = Pending::kChunk;
  pending.view_high = high;
  pending.keys = AsFloat32(keys, /*copy=*/true);
  pending.values = AsFloat32(values, /*copy=*/true);
  pending.positions = step.positions.reshape({steps}).to(layer.positions.device(), at::kInt);
  Advance(index, steps);
  const at::Tensor chunk_positions =  // [1, G, T]
      pending.positions.to(at::kLong).view({1, 1, steps}).expand({1, layer.groups, steps});
  return KVView{
      at::cat({ReadKept(index, true, high, dtype), AsStored(index, pending.keys, dtype)}, 2),
      at::cat({ReadKept(index, false, high, dtype), AsStored(index, pending.values, dtype)}, 2),
      at::cat({layer.positions.narrow(2, 0, high).to(at::kLong), chunk_positions}, 2)};
}

bool ScoredPagedKVCache::WantsAttentionWeights(int64_t layer) const {
  return layer >= 0 && layer < num_layers() && layers_[layer].plan.scored;
}

void ScoredPagedKVCache::ObserveAttentionWeights(int64_t layer, const at::Tensor& weights) {
  if (layer < 0 || layer >= num_layers()) return;
  Settle(layer, weights);
}

void ScoredPagedKVCache::Settle(int64_t index, const at::Tensor& weights) {
  Layer& layer = layers_[index];
  Pending& pending = layer.pending;
  if (pending.kind == Pending::kNone) return;
  const int64_t high = pending.view_high;
  const int64_t chunk = pending.kind == Pending::kChunk ? pending.positions.size(0) : 0;
  at::Tensor chunk_scores;
  if (layer.plan.scored && weights.defined()) {
    at::Tensor step =  // [1, G, S]
        StepScores(layer.plan, weights, layer.groups, ViewFeature(layer)).contiguous();
    // A group's copies on other tensor-parallel ranks add their heads' scores.
    if (const auto& reducer = pool_->layers()[index].score_reducer) reducer->Reduce(step);
    TORCH_CHECK(step.size(0) == 1 && step.size(2) == high + chunk, "attention weights ",
                weights.sizes(), " do not cover the KV view");
    if (high > 0) {
      at::Tensor target = layer.scores.narrow(2, 0, high).select(3, 0);  // [1, G, high]
      const at::Tensor part = step.narrow(2, 0, high);
      if (ScoresReplace(layer.plan)) {
        target.copy_(part);
      } else {
        target.add_(part);
      }
    }
    if (chunk > 0) chunk_scores = step.narrow(2, high, chunk);
  }
  if (pending.kind == Pending::kDecode) {
    if (layer.plan.evicts() && layer.used > layer.plan.budget) EvictDecode(layer, pending.newest);
  } else {
    Compact(index, chunk_scores);
  }
  pending = Pending();
}

at::Tensor ScoredPagedKVCache::ViewFeature(const Layer& layer) const {
  if (layer.channels < 2) return at::Tensor();
  const Pending& pending = layer.pending;
  at::Tensor kept = layer.scores.narrow(2, 0, pending.view_high).select(3, 1);  // [1, G, high]
  if (pending.kind != Pending::kChunk) return kept;
  return at::cat({kept, pending.feature}, 2);
}

void ScoredPagedKVCache::ScoreDecode(Layer& layer, int64_t n_head, const float* weights) {
  const int64_t groups = layer.groups, q_per_kv = n_head / groups, high = layer.high;
  const bool replace = ScoresReplace(layer.plan);  // tova: the mean over the group's heads
  float* scores = layer.scores.data_ptr<float>();
  for (int64_t g = 0; g < groups; ++g) {
    const float* w = weights + g * q_per_kv * high;  // [q_per_kv, high]
    for (int64_t s = 0; s < high; ++s) {
      float sum = 0.0f;
      for (int64_t h = 0; h < q_per_kv; ++h) sum += w[h * high + s];
      float& score = scores[(g * layer.capacity + s) * layer.channels];
      score = replace ? sum / static_cast<float>(q_per_kv) : score + sum;
    }
  }
}

void ScoredPagedKVCache::EvictDecode(Layer& layer, int64_t newest) {
  if (on_host_) {
    EvictDecodeOnHost(layer, newest);
  } else {
    EvictDecodeOnDevice(layer, newest);
  }
  layer.used = layer.plan.budget;
}

void ScoredPagedKVCache::EvictDecodeOnHost(Layer& layer, int64_t newest) {
  int32_t* positions = layer.positions.data_ptr<int32_t>();
  const float* scores = layer.scores.data_ptr<float>();
  for (int64_t g = 0; g < layer.groups; ++g) {
    int32_t* slot = positions + g * layer.capacity;
    const float* state = scores + g * layer.capacity * layer.channels;
    int64_t live = 0, victim = 0;
    double lowest = std::numeric_limits<double>::infinity();
    for (int64_t s = 0; s < layer.high; ++s) {
      if (slot[s] < 0) continue;
      ++live;
      const double priority = EntryPriority(layer.plan, slot[s], state[s * layer.channels], newest);
      if (priority < lowest) {  // the first of equals
        lowest = priority;
        victim = s;
      }
    }
    if (live > layer.plan.budget) slot[victim] = -1;
  }
}

void ScoredPagedKVCache::EvictDecodeOnDevice(Layer& layer, int64_t newest) {
  const at::Tensor positions = layer.positions.narrow(2, 0, layer.high);  // [1, G, high]
  at::Tensor state;                                                       // [1, G, high, channels]
  if (StateChannels(layer.plan) > 0) state = layer.scores.narrow(2, 0, layer.high);
  const at::Tensor priority =  // [1, G, high] float64
      Priority(layer.plan, positions, state,
               at::full({1, 1, 1}, newest, positions.options().dtype(at::kLong)));
  // A group evicts only when it holds more than its budget, so all of its budget + 1 slots
  // (= capacity) are live and the lowest priority is a live entry's (argmin: the first of equals,
  // as the host's loop takes it). Groups at or under budget (holes left by a chunk on a windowed
  // layer) keep theirs.
  const at::Tensor victim = priority.argmin(2, /*keepdim=*/true);  // [1, G, 1]
  const at::Tensor over = positions.ge(0).sum(2, /*keepdim=*/true).gt(layer.plan.budget);
  positions.scatter_(
      2, victim,
      at::where(over, at::full({}, -1, positions.options()), positions.gather(2, victim)));
}

void ScoredPagedKVCache::Compact(int64_t index, const at::Tensor& chunk_scores) {
  Layer& layer = layers_[index];
  const Pending& pending = layer.pending;
  const int64_t groups = layer.groups, high = pending.view_high;
  const int64_t steps = pending.positions.size(0);
  // Candidates: the kept slots, then the chunk's entries; [1, G, high + T].
  const at::Tensor candidates =
      at::cat({layer.positions.narrow(2, 0, high),
               pending.positions.view({1, 1, steps}).expand({1, groups, steps})},
              2);
  at::Tensor state;  // [1, G, high + T, channels]
  if (StateChannels(layer.plan) > 0) {
    at::Tensor fresh = at::zeros({1, groups, steps, layer.channels}, layer.scores.options());
    if (chunk_scores.defined()) fresh.select(3, 0).copy_(chunk_scores);
    if (layer.channels > 1) fresh.select(3, 1).copy_(pending.feature);
    state = at::cat({layer.scores.narrow(2, 0, high), fresh}, 2);
  }
  const int64_t kept = std::min(layer.plan.budget, high + steps);
  // The policy's top `kept`, in position order (the ranking PolicyKVCache's KeepInMain makes).
  const at::Tensor newest =
      at::full({1, 1, 1}, pending.newest, candidates.options().dtype(at::kLong));
  const at::Tensor priority = Priority(layer.plan, candidates, state, newest);
  const auto top = priority.topk(kept, -1, /*largest=*/true, /*sorted=*/false);
  const at::Tensor valid = std::get<0>(top) > -std::numeric_limits<double>::infinity();
  at::Tensor chosen = std::get<1>(top);
  const at::Tensor order =
      at::where(valid, candidates.gather(-1, chosen),
                at::full({}, std::numeric_limits<int64_t>::max(), chosen.options()))
          .argsort(/*dim=*/-1, /*descending=*/false);
  chosen = chosen.gather(-1, order).contiguous();  // [1, G, kept]
  const at::Tensor kept_positions =
      candidates.gather(-1, chosen).masked_fill_(valid.gather(-1, order).logical_not(), -1);
  at::Tensor kept_state;
  if (state.defined()) {
    kept_state = state.gather(2, chosen.unsqueeze(-1).expand({-1, -1, -1, state.size(3)}));
  }
  if (on_host_) {
    MoveChosenOnHost(index, chosen);
  } else {
    MoveChosenOnDevice(index, chosen);
  }
  layer.positions.fill_(-1);
  layer.scores.zero_();
  layer.positions.narrow(2, 0, kept).copy_(kept_positions);
  if (kept_state.defined()) layer.scores.narrow(2, 0, kept).copy_(kept_state);
  layer.used = layer.high = kept;
}

void ScoredPagedKVCache::MoveChosenOnHost(int64_t index, const at::Tensor& chosen) {
  const Layer& layer = layers_[index];
  const Pending& pending = layer.pending;
  const int64_t groups = layer.groups, high = pending.view_high, kept = chosen.size(2);
  const int64_t steps = pending.positions.size(0);
  // Kept slots move as stored: saved first, since the new slots overlap the old ones.
  const int64_t row = RowBytes(index), hs = layer.head_size;
  std::vector<char> saved(static_cast<size_t>(2 * groups * high * row));
  for (int64_t part = 0; part < 2; ++part) {
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t s = 0; s < high; ++s) {
        std::memcpy(saved.data() + ((part * groups + g) * high + s) * row,
                    RowOf(index, part == 0, s, g), row);
      }
    }
  }
  const int64_t* from = chosen.data_ptr<int64_t>();
  for (int64_t part = 0; part < 2; ++part) {
    const float* chunk = (part == 0 ? pending.keys : pending.values).data_ptr<float>();
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t j = 0; j < kept; ++j) {
        const int64_t source = from[g * kept + j];
        if (source < high) {
          std::memcpy(RowOf(index, part == 0, j, g),
                      saved.data() + ((part * groups + g) * high + source) * row, row);
        } else {
          StoreRow(index, part == 0, j, g, chunk + (g * steps + source - high) * hs);
        }
      }
    }
  }
}

void ScoredPagedKVCache::MoveChosenOnDevice(int64_t index, const at::Tensor& chosen) {
  const Layer& layer = layers_[index];
  const Pending& pending = layer.pending;
  const int64_t kept = chosen.size(2);
  const at::Tensor kept_slots = SlotRange(index, pending.view_high);  // [G, high]
  for (const bool keys : {true, false}) {
    const at::Tensor candidates =  // [G, high + T, width]: the kept rows as stored, the chunk's
        at::cat({ReadStored(index, keys, kept_slots),
                 Encode(index, keys ? pending.keys : pending.values)},
                1);
    const at::Tensor from = chosen.select(0, 0).unsqueeze(2).expand({-1, -1, candidates.size(2)});
    // The gather reads every source before the write (the slots overlap).
    WriteStored(index, keys, SlotRange(index, kept), candidates.gather(1, from));
  }
}

bool ScoredPagedKVCache::DecodeOnHostApplies(int64_t index, const at::Tensor& q,
                                             const at::Tensor& keys, const KVStep& step) const {
  // h2o-vlen weighs the weights by the entries' value norms, and a reducer combines the scores
  // of a group's copies: the generic path's StepScores.
  return on_host_ && policy_.kind != PolicyKind::kH2OVlen &&
         !pool_->layers()[index].score_reducer && keys.size(2) == 1 && q.device().is_cpu() &&
         q.scalar_type() == at::kFloat && !q.requires_grad() && step.positions.device().is_cpu() &&
         step.positions.scalar_type() == at::kLong;
}

at::Tensor ScoredPagedKVCache::DecodeOnHost(int64_t index, const KVStep& step, const at::Tensor& q,
                                            const at::Tensor& keys, const at::Tensor& values,
                                            const AttentionParams& params) {
  Settle(index, at::Tensor());
  Layer& layer = layers_[index];
  PlaceDecode(layer, index, step.max_position, keys, values);
  Advance(index, 1);
  const int64_t high = layer.high, n_head = q.size(1);
  float* weights = nullptr;  // [1, n_head, 1, high]
  if (layer.plan.scored) {
    layer.step_weights.resize(static_cast<size_t>(n_head * high));
    weights = layer.step_weights.data();
  }
  const paged::EntryFormat* quantised = QuantisedFormat(index);
  const std::optional<paged::EntryFormat> format =
      quantised != nullptr ? std::optional<paged::EntryFormat>(*quantised) : std::nullopt;
  const at::Tensor y = DecodeAttentionSegments(
      q, layer.groups, high,
      BlockSegments(SlotBlocks(index, true, high), SlotBlocks(index, false, high), high, format),
      step.positions, layer.positions.narrow(2, 0, high), params, CpuHasAvx2Fma(), weights);
  if (weights != nullptr) ScoreDecode(layer, n_head, weights);
  if (layer.plan.evicts() && layer.used > layer.plan.budget) {
    EvictDecode(layer, step.max_position);
  }
  return y;
}

absl::StatusOr<at::Tensor> ScoredPagedKVCache::UpdateAndAttend(int64_t index, const KVStep& step,
                                                               const at::Tensor& q,
                                                               const at::Tensor& keys,
                                                               const at::Tensor& values,
                                                               const AttentionParams& params) {
  RETURN_IF_ERROR(CheckLayer(index, step, keys, values));
  RETURN_IF_ERROR(CheckQueries(index, q, keys));
  if (DecodeOnHostApplies(index, q, keys, step))
    return DecodeOnHost(index, step, q, keys, values, params);
  // As KVCache::UpdateAndAttend, without checking the layer again.
  const KVView view = UpdateChecked(index, step, keys, values);
  const bool scored = layers_[index].plan.scored;
  at::Tensor weights;  // [1, n_head, T, S]
  at::Tensor y = AttendByPositions(q, view.keys, view.values, step.positions, view.positions,
                                   params, scored ? &weights : nullptr);
  if (scored) Settle(index, weights);
  return y;
}

std::vector<int64_t> ScoredPagedKVCache::KeptPositions(int64_t index, int64_t group) {
  Settle(index, at::Tensor());
  const Layer& layer = layers_[index];
  const at::Tensor positions = layer.positions.to(at::kCPU).contiguous();
  const int32_t* slots = positions.data_ptr<int32_t>() + group * layer.capacity;
  std::vector<int64_t> kept;
  for (int64_t s = 0; s < layer.high; ++s) {
    if (slots[s] >= 0) kept.push_back(slots[s]);
  }
  std::sort(kept.begin(), kept.end());
  return kept;
}

absl::Status ScoredPagedKVCache::CheckCopyInto(const KVCache& target) const {
  const auto* scored = dynamic_cast<const ScoredPagedKVCache*>(&target);
  if (scored == nullptr || scored->pool_ != pool_) {
    return absl::FailedPreconditionError(
        absl::StrCat("a scored paged KV cache copies into a scored paged cache over the same pool, "
                     "not ",
                     target.DebugName()));
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (!SamePlan(layers_[i].plan, scored->layers_[i].plan) ||
        layers_[i].capacity != scored->layers_[i].capacity) {
      return absl::FailedPreconditionError(
          absl::StrCat("a scored paged KV cache copies into one of the same policy: layer ", i,
                       " of ", DebugName(), " differs in ", scored->DebugName()));
    }
  }
  if (scored->max_sequence_length_ < length_) {
    return absl::FailedPreconditionError(absl::StrCat("the target scored paged KV cache holds ",
                                                      scored->max_sequence_length_,
                                                      " positions, this one ", length_));
  }
  if (std::any_of(layer_length_.begin(), layer_length_.end(),
                  [&](int64_t l) { return l != length_; })) {
    return absl::FailedPreconditionError("a scored paged KV cache copies between steps only");
  }
  return absl::OkStatus();
}

absl::Status ScoredPagedKVCache::CopyInto(KVCache& target) const {
  RETURN_IF_ERROR(CheckCopyInto(target));
  auto& copy = static_cast<ScoredPagedKVCache&>(target);
  if (&copy == this) return absl::OkStatus();
  copy.Reset();
  for (int64_t block : table_) pool_->Retain(block);
  copy.table_ = table_;
  copy.table_changed_ = true;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& from = layers_[i];
    Layer& to = copy.layers_[i];
    to.positions.copy_(from.positions);
    to.scores.copy_(from.scores);
    to.high = from.high;
    to.used = from.used;
    to.pending = from.pending;  // its tensors are never written in place
  }
  copy.layer_length_ = layer_length_;
  copy.length_ = length_;
  return absl::OkStatus();
}

int64_t ScoredPagedKVCache::AllocatedBytes() const {
  return static_cast<int64_t>(table_.size()) * pool_->BytesPerBlock();
}

int64_t ScoredPagedKVCache::IndexBytes() const {
  int64_t bytes = static_cast<int64_t>(table_.capacity() * sizeof(int64_t));
  for (const Layer& layer : layers_) {
    bytes += layer.positions.nbytes() + layer.scores.nbytes() +
             static_cast<int64_t>(layer.step_weights.capacity() * sizeof(float));
  }
  return bytes;
}

std::string ScoredPagedKVCache::DebugName() const {
  return absl::StrCat("paged-", PolicyName(policy_.kind), "(budget=", policy_.budget, ", ",
                      table_.size(), " blocks of ", pool_->entries_per_block(), ")");
}

}  // namespace lgpt
