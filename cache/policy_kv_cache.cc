#include "cache/policy_kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "core/ops/decode_attention.h"

namespace lgpt {
namespace {

at::Tensor Rows(const at::Tensor& t, int64_t rows) { return t.narrow(0, 0, rows); }

// index [rows, 1 or G, n] (slots, per row or per group) -> [rows, G, n, width], to gather or
// scatter entries along dim 2.
at::Tensor Expand4(const at::Tensor& index, int64_t groups, int64_t width) {
  return index.unsqueeze(-1).expand({index.size(0), groups, index.size(2), width});
}

// Host decoding steps of quantised caches decode a (row, group)'s main entries for the step:
// at most this many (budgeted caches); longer layers attend block by block.
constexpr int64_t kHostDecodedEntries = 4096;

}  // namespace

absl::Status ValidateEntryStorage(int bits, int64_t residual, int64_t group_size,
                                  int64_t read_chunk, absl::string_view owner) {
  if (bits != 16 && bits != 8 && bits != 4) {
    const std::string field = absl::StrCat(owner, ".bits");
    return InvalidFieldError(field, absl::StrCat(field, " must be 16, 8 or 4, got ", bits));
  }
  if (residual < 0) {
    const std::string field = absl::StrCat(owner, ".residual");
    return InvalidFieldError(field, absl::StrCat(field, " must be >= 0, got ", residual));
  }
  if (group_size < 1) {
    const std::string field = absl::StrCat(owner, ".group_size");
    return InvalidFieldError(field, absl::StrCat(field, " must be >= 1, got ", group_size));
  }
  if (read_chunk < 1) {
    const std::string field = absl::StrCat(owner, ".read_chunk");
    return InvalidFieldError(field, absl::StrCat(field, " must be >= 1, got ", read_chunk));
  }
  return absl::OkStatus();
}

absl::Status CheckPolicyCacheRules(PolicyKind kind, int bits, bool cache_positions, int64_t budget,
                                   bool per_layer_budgets, std::optional<int64_t> context,
                                   const PolicyCacheFields& fields) {
  if (kind == PolicyKind::kQH2O && bits == 16) {
    return InvalidFieldError(
        fields.bits,
        absl::StrCat(fields.policy, " qh2o needs ", fields.bits,
                     " 8 or 4 (bits must be 8 or 4 for policy qh2o: it scores quantisation "
                     "error)"),
        {fields.policy});
  }
  if (!cache_positions) return absl::OkStatus();
  if (per_layer_budgets) {
    return InvalidFieldError(fields.positions,
                             absl::StrCat(fields.positions_on, " needs ", fields.one_budget,
                                          " (one budget for every layer)"),
                             {fields.layer_budgets});
  }
  if (!KeepsContiguousPositions(kind)) {
    return InvalidFieldError(
        fields.positions,
        absl::StrCat(fields.positions_on, " needs ", fields.policy,
                     " window or sink (whose kept entries are contiguous in position), got ",
                     PolicyName(kind)),
        {fields.policy});
  }
  if (context && budget >= *context) {
    return InvalidFieldError(
        fields.budget,
        absl::StrCat(fields.positions_on, " needs ", fields.budget, " below the context (",
                     *context, " tokens), got ", budget),
        {fields.positions});
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PolicyKVCache>> PolicyKVCache::Create(
    const PolicyKVCacheOptions& options) {
  RETURN_IF_ERROR(CheckCacheGeometry("PolicyKVCacheOptions", options));
  RETURN_IF_ERROR(ValidateEvictionPolicy(options.policy, "PolicyKVCacheOptions.policy"));
  RETURN_IF_ERROR(ValidateEntryStorage(options.bits, options.residual, options.group_size,
                                       options.read_chunk, "PolicyKVCacheOptions"));
  const EvictionPolicyOptions& policy = options.policy;
  PolicyCacheFields fields;
  fields.policy = "PolicyKVCacheOptions.policy.kind";
  fields.bits = "PolicyKVCacheOptions.bits";
  fields.budget = "PolicyKVCacheOptions.policy.budget";
  fields.positions = "PolicyKVCacheOptions.cache_positions";
  fields.positions_on = fields.positions;
  fields.layer_budgets = "PolicyKVCacheOptions.policy.layer_budgets";
  fields.one_budget = "PolicyKVCacheOptions.policy.layer_budgets empty";
  RETURN_IF_ERROR(CheckPolicyCacheRules(policy.kind, options.bits, options.cache_positions,
                                        policy.budget, !policy.layer_budgets.empty(),
                                        options.max_sequence_length, fields));
  if (options.max_sequence_length > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("PolicyKVCacheOptions.max_sequence_length must be at most ",
                     std::numeric_limits<int32_t>::max(), " (positions are stored as int32), got ",
                     options.max_sequence_length));
  }
  if (!policy.layer_budgets.empty() && policy.layer_budgets.size() != options.layers.size()) {
    return InvalidFieldError(
        "PolicyKVCacheOptions.policy.layer_budgets",
        absl::StrCat("PolicyKVCacheOptions.policy.layer_budgets has ", policy.layer_budgets.size(),
                     " entries for ", options.layers.size(), " layers"));
  }
  std::unique_ptr<PolicyKVCache> cache(new PolicyKVCache(options));
  for (size_t i = 0; i < options.layers.size(); ++i) {
    const KVLayerSpec& spec = options.layers[i];
    Layer layer;
    layer.spec = spec;
    const int64_t budget = policy.layer_budgets.empty() ? policy.budget : policy.layer_budgets[i];
    layer.plan = MakeLayerPlan(policy, budget, spec.sliding_window, options.max_sequence_length);
    layer.residual = options.bits < 16 ? std::min(options.residual, layer.plan.recent) : 0;
    layer.main_budget = layer.plan.budget - layer.residual;
    layer.position_groups = layer.plan.scored ? spec.n_query_groups : 1;
    layer.quant_group = std::gcd(options.group_size, spec.head_size);  // as MakeQuantCodec
    layer.ring_codec = MakeFullCodec(spec.head_size, options.dtype, options.device);
    if (options.bits == 16) {
      layer.codec = MakeFullCodec(spec.head_size, options.dtype, options.device);
    } else {
      ASSIGN_OR_RETURN(layer.codec, MakeQuantCodec(options.bits, spec.head_size, options.group_size,
                                                   options.dtype, options.device));
    }
    cache->layers_.push_back(std::move(layer));
  }
  cache->rolls_back_ =
      !options.cache_positions &&
      std::all_of(cache->layers_.begin(), cache->layers_.end(),
                  [](const Layer& layer) { return layer.plan.kind == PolicyKind::kDense; });
  return cache;
}

PolicyKVCache::PolicyKVCache(const PolicyKVCacheOptions& options) : options_(options) {}

std::string PolicyKVCache::DebugName() const {
  return absl::StrCat(PolicyName(options_.policy.kind), "(budget=", options_.policy.budget,
                      ", bits=", options_.bits, options_.cache_positions ? ", positions=cache" : "",
                      ")");
}

int64_t PolicyKVCache::MaxMainCapacity(const Layer& layer) const {
  // Evicting layers hold one spare slot for the entry a decode step adds before evicting.
  return std::max<int64_t>(1, layer.plan.evicts() ? layer.main_budget + 1 : layer.main_budget);
}

int64_t PolicyKVCache::GrownMainCapacity(const Layer& layer, int64_t needed,
                                         int64_t current) const {
  const int64_t limit = MaxMainCapacity(layer);
  if (needed <= current) return current;
  if (options_.growth_step <= 0) return GrownCapacity(needed, current, limit);
  const int64_t step = options_.growth_step;
  return std::min((needed + step - 1) / step * step, limit);
}

void PolicyKVCache::GrowMain(Layer& layer, int64_t needed) {
  if (needed > layer.main.capacity) {
    GrowStore(layer.main, *layer.codec, layer,
              GrownMainCapacity(layer, needed, layer.main.capacity));
  }
}

void PolicyKVCache::GrowStore(Store& store, const EntryCodec& codec, const Layer& layer,
                              int64_t capacity) {
  if (capacity <= store.capacity) return;
  const int64_t batch = options_.batch_size, groups = layer.spec.n_query_groups;
  std::vector<at::Tensor> parts = codec.Allocate(batch, groups, capacity);
  const at::TensorOptions index_opts = at::TensorOptions().device(options_.device);
  at::Tensor positions =
      at::full({batch, layer.position_groups, capacity}, -1, index_opts.dtype(at::kInt));
  at::Tensor scores;
  if (const int64_t channels = StateChannels(layer.plan); channels > 0) {
    scores = at::zeros({batch, groups, capacity, channels}, index_opts.dtype(at::kFloat));
  }
  if (store.capacity > 0) {
    for (size_t i = 0; i < parts.size(); ++i) {
      parts[i].narrow(2, 0, store.capacity).copy_(store.parts[i]);
    }
    positions.narrow(2, 0, store.capacity).copy_(store.positions);
    if (scores.defined()) scores.narrow(2, 0, store.capacity).copy_(store.scores);
  }
  store.parts = std::move(parts);
  store.positions = positions;
  store.scores = scores;
  store.capacity = capacity;
}

absl::Status PolicyKVCache::CheckStep(const KVStep& step, int64_t batch_size) const {
  return CheckStepBounds(step, batch_size, options_.batch_size, options_.max_sequence_length);
}

absl::StatusOr<KVView> PolicyKVCache::Update(int64_t layer_index, const KVStep& step,
                                             const at::Tensor& keys, const at::Tensor& values) {
  RETURN_IF_ERROR(CheckLayerStep(layer_index, options_.layers, step, keys, values,
                                 options_.batch_size, options_.max_sequence_length));
  Layer& layer = layers_[layer_index];
  if (layer.undo.valid) layer.undo = Undo();
  const std::vector<KVBlockSource> sources = Begin(layer, step, keys, values);
  const int64_t rows = keys.size(0), groups = layer.spec.n_query_groups;
  // Quantised storage is decoded whole here: the fallback for attention layers that do not
  // attend in place (UpdateAndAttend never does this).
  std::vector<at::Tensor> all_keys, all_values, all_positions;
  for (const KVBlockSource& source : sources) {
    at::Tensor k, v;
    source.read(0, source.size, &k, &v);
    all_keys.push_back(k);
    all_values.push_back(v);
    all_positions.push_back(source.positions);
  }
  if (sources.size() == 1) return KVView{all_keys[0], all_values[0], all_positions[0]};
  for (at::Tensor& p : all_positions) p = p.expand({rows, groups, p.size(2)});
  return KVView{at::cat(all_keys, 2), at::cat(all_values, 2), at::cat(all_positions, 2)};
}

absl::StatusOr<at::Tensor> PolicyKVCache::UpdateAndAttend(int64_t layer_index, const KVStep& step,
                                                          const at::Tensor& q,
                                                          const at::Tensor& keys,
                                                          const at::Tensor& values,
                                                          const AttentionParams& params) {
  RETURN_IF_ERROR(CheckLayerStep(layer_index, options_.layers, step, keys, values,
                                 options_.batch_size, options_.max_sequence_length));
  RETURN_IF_ERROR(CheckQueries(layer_index, q, keys));
  Layer& layer = layers_[layer_index];
  if (step.sequential && layer.codec->bits() < 16 && keys.size(2) > 1) {
    return AttendSequential(layer_index, step, q, keys, values, params);
  }
  if (layer.undo.valid) layer.undo = Undo();
  return AttendStep(layer_index, step, q, keys, values, params);
}

absl::StatusOr<at::Tensor> PolicyKVCache::AttendStep(int64_t layer_index, const KVStep& step,
                                                     const at::Tensor& q, const at::Tensor& keys,
                                                     const at::Tensor& values,
                                                     const AttentionParams& params) {
  Layer& layer = layers_[layer_index];
  if (DecodeOnHostApplies(layer, q, keys, values, step)) {
    return DecodeOnHost(layer, step, q, keys, values, params);
  }
  if (options_.bits == 16)
    return KVCache::UpdateAndAttend(layer_index, step, q, keys, values, params);
  const std::vector<KVBlockSource> sources = Begin(layer, step, keys, values);
  at::Tensor weights;
  at::Tensor y = AttendBlockwise(q, layer.spec.n_query_groups, sources, step.positions, params,
                                 layer.plan.scored ? &weights : nullptr);
  Settle(layer, weights);
  return y;
}

absl::StatusOr<at::Tensor> PolicyKVCache::AttendSequential(int64_t layer_index, const KVStep& step,
                                                           const at::Tensor& q,
                                                           const at::Tensor& keys,
                                                           const at::Tensor& values,
                                                           const AttentionParams& params) {
  Layer& layer = layers_[layer_index];
  Settle(layer, at::Tensor());
  Rewind(layer, step);
  const int64_t rows = keys.size(0), steps = keys.size(2);
  const at::Tensor positions = step.positions.to(at::kCPU, at::kLong).contiguous();  // [rows, T]
  layer.undo = Undo();
  Undo& undo = layer.undo;
  undo.valid = true;
  undo.main_used = layer.main.used;
  undo.main_high = layer.main.high;
  undo.positions = positions;
  if (layer.residual > 0) {
    const Store& ring = layer.ring;
    if (ring.capacity > 0) {
      undo.ring_positions = Rows(ring.positions, rows).to(at::kCPU).clone();
      undo.ring_keys = Rows(ring.parts[0], rows).clone();
      undo.ring_values = Rows(ring.parts[1], rows).clone();
    } else {
      undo.ring_positions = at::full({rows, 1, layer.residual}, -1, at::kInt);
    }
    undo.keys = keys.to(options_.dtype).clone();
    undo.values = values.to(options_.dtype).clone();
  }
  const int64_t* position = positions.data_ptr<int64_t>();
  std::vector<at::Tensor> outputs;
  for (int64_t t = 0; t < steps; ++t) {
    KVStep one;
    one.positions = step.positions.narrow(1, t, 1);
    one.min_position = std::numeric_limits<int64_t>::max();
    one.max_position = std::numeric_limits<int64_t>::min();
    for (int64_t b = 0; b < rows; ++b) {
      one.min_position = std::min(one.min_position, position[b * steps + t]);
      one.max_position = std::max(one.max_position, position[b * steps + t]);
    }
    ASSIGN_OR_RETURN(at::Tensor y,
                     AttendStep(layer_index, one, q.narrow(2, t, 1), keys.narrow(2, t, 1),
                                values.narrow(2, t, 1), params));
    outputs.push_back(std::move(y));
  }
  return at::cat(outputs, 2);
}

absl::Status PolicyKVCache::CheckTruncate(int64_t index, const Layer& layer, int64_t length) const {
  if (layer.residual == 0 || length > layer.max_written) return absl::OkStatus();
  const Undo& undo = layer.undo;
  // The ring must end up holding [length - residual, length) in full precision: the entries it
  // held before the last step and that step's own, when the step was sequential and began at
  // or before `length` in every row.
  if (undo.valid) {
    const int64_t* position = undo.positions.data_ptr<int64_t>();
    const int64_t rows = undo.positions.size(0), steps = undo.positions.size(1);
    bool covered = true;
    for (int64_t b = 0; b < rows; ++b) {
      covered =
          covered && *std::min_element(position + b * steps, position + (b + 1) * steps) <= length;
    }
    if (covered) return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "PolicyKVCache::Truncate(", length, "): layer ", index,
      " encoded entries that its full-precision ring would hold without the forgotten ones; only "
      "the entries of the last step can be forgotten, when it was sequential (KVStep.sequential)"));
}

absl::Status PolicyKVCache::Truncate(int64_t length) {
  if (!rolls_back_) {
    return absl::FailedPreconditionError(
        absl::StrCat("PolicyKVCache::Truncate: the ", DebugName(),
                     " cache evicts entries, which a rollback cannot bring back"));
  }
  if (length < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PolicyKVCache::Truncate: length must be >= 0, got ", length));
  }
  for (Layer& layer : layers_) Settle(layer, at::Tensor());
  for (size_t i = 0; i < layers_.size(); ++i) {
    RETURN_IF_ERROR(CheckTruncate(static_cast<int64_t>(i), layers_[i], length));
  }
  for (Layer& layer : layers_) TruncateLayer(layer, length);
  return absl::OkStatus();
}

void PolicyKVCache::TruncateLayer(Layer& layer, int64_t length) {
  if (length > layer.max_written) {
    layer.undo = Undo();
    return;
  }
  // Without the forgotten entries, decoding would have left [length - residual, length) in the
  // ring and everything before in main (no layer evicts).
  const int64_t in_main = std::max<int64_t>(0, length - layer.residual);
  Store& main = layer.main;
  if (main.capacity > 0) main.positions.masked_fill_(main.positions >= in_main, -1);
  const Undo& undo = layer.undo;
  // Entries the kept part of the step moved into main (each step's entry, or the ring's oldest
  // when the ring was full), per row: what decoding them would have added to main's counters.
  int64_t entered_main = 0;
  if (undo.valid) {
    const int64_t rows = undo.positions.size(0), steps = undo.positions.size(1);
    const int64_t* position = undo.positions.data_ptr<int64_t>();
    if (layer.residual == 0) {
      for (int64_t b = 0; b < rows; ++b) {
        entered_main = std::max<int64_t>(
            entered_main, std::count_if(position + b * steps, position + (b + 1) * steps,
                                        [length](int64_t p) { return p < length; }));
      }
    } else {
      // The ring as before the step, then the step's kept entries placed as decoding places
      // them (an empty slot, else the oldest: the first of equals).
      Store& ring = layer.ring;
      const int64_t residual = ring.capacity;
      at::Tensor ring_positions = undo.ring_positions.clone();  // [rows, 1, residual] int32
      at::Tensor ring_keys = Rows(ring.parts[0], rows), ring_values = Rows(ring.parts[1], rows);
      if (undo.ring_keys.defined()) {
        ring_keys.copy_(undo.ring_keys);
        ring_values.copy_(undo.ring_values);
      }
      for (int64_t b = 0; b < rows; ++b) {
        int32_t* slots = ring_positions.data_ptr<int32_t>() + b * residual;
        int64_t moved = 0;
        for (int64_t t = 0; t < steps; ++t) {
          const int64_t p = position[b * steps + t];
          if (p >= length) continue;
          const int64_t slot = std::min_element(slots, slots + residual) - slots;
          if (slots[slot] >= 0) ++moved;  // the ring was full: its oldest went to main
          slots[slot] = static_cast<int32_t>(p);
          ring_keys[b].select(1, slot).copy_(undo.keys[b].select(1, t));
          ring_values[b].select(1, slot).copy_(undo.values[b].select(1, t));
        }
        entered_main = std::max(entered_main, moved);
      }
      Rows(ring.positions, rows).copy_(ring_positions);
    }
    // Decoding's bookkeeping (PlaceDecode, DecodeOnHost): used counts up, high follows it.
    main.used = std::min(undo.main_used + entered_main, main.capacity);
    main.high = std::min(main.capacity, std::max(undo.main_high, main.used));
  }
  if (layer.ring.capacity > 0) {
    Store& ring = layer.ring;
    ring.positions.masked_fill_(ring.positions >= length, -1);
    ring.used = (ring.positions >= 0).sum(-1).max().item<int64_t>();
  }
  layer.max_written = std::min(layer.max_written, length - 1);
  layer.undo = Undo();
}

bool PolicyKVCache::WantsAttentionWeights(int64_t layer) const {
  return layer >= 0 && layer < num_layers() && layers_[layer].plan.scored;
}

void PolicyKVCache::ObserveAttentionWeights(int64_t layer, const at::Tensor& weights) {
  if (layer < 0 || layer >= num_layers()) return;
  Settle(layers_[layer], weights);
}

std::vector<KVBlockSource> PolicyKVCache::Begin(Layer& layer, const KVStep& step,
                                                const at::Tensor& keys, const at::Tensor& values) {
  Settle(layer, at::Tensor());
  Rewind(layer, step);
  layer.max_written = std::max(layer.max_written, step.max_position);
  const int64_t rows = keys.size(0), steps = keys.size(2);
  const at::Tensor positions =  // [rows, P, T]
      step.positions.to(at::kInt).unsqueeze(1).expand({rows, layer.position_groups, steps});
  Pending& pending = layer.pending;
  pending = Pending();
  pending.rows = rows;
  pending.newest = step.positions.amax(1).view({rows, 1, 1});
  const EntryCodec& codec = *layer.codec;
  pending.feature =
      EntryFeature(layer.plan, keys, values, [&codec](const at::Tensor& k, const at::Tensor& v) {
        std::pair<at::Tensor, at::Tensor> decoded;
        codec.Decode(codec.Encode(k, v), &decoded.first, &decoded.second);
        return decoded;
      });
  if (steps == 1) {
    PlaceDecode(layer, rows, keys, values, positions);
    pending.kind = Pending::kDecode;
  } else {
    pending.kind = Pending::kChunk;
    pending.keys = keys.to(options_.dtype);
    pending.values = values.to(options_.dtype);
    pending.positions = positions;
  }
  pending.main_high = layer.main.high;
  pending.ring_size = layer.ring.capacity;
  return Sources(layer, rows);
}

std::vector<KVBlockSource> PolicyKVCache::Sources(Layer& layer, int64_t rows) {
  std::vector<KVBlockSource> sources;
  const Store& main = layer.main;
  if (main.high > 0) {
    std::vector<at::Tensor> parts;
    for (const at::Tensor& part : main.parts) {
      parts.push_back(Rows(part, rows).narrow(2, 0, main.high));
    }
    KVBlockSource source;
    source.size = main.high;
    source.positions = Rows(main.positions, rows).narrow(2, 0, main.high);
    source.read_chunk = layer.codec->bits() < 16 ? options_.read_chunk : 0;
    const EntryCodec* codec = layer.codec.get();
    source.read = [parts, codec](int64_t begin, int64_t length, at::Tensor* k, at::Tensor* v) {
      std::vector<at::Tensor> slice;
      for (const at::Tensor& part : parts) slice.push_back(part.narrow(2, begin, length));
      codec->Decode(slice, k, v);
    };
    sources.push_back(std::move(source));
  }
  const Store& ring = layer.ring;
  if (ring.capacity > 0) {
    sources.push_back(TensorSource(Rows(ring.parts[0], rows), Rows(ring.parts[1], rows),
                                   Rows(ring.positions, rows)));
  }
  const Pending& pending = layer.pending;
  if (pending.kind == Pending::kChunk) {
    sources.push_back(TensorSource(pending.keys, pending.values, pending.positions));
  }
  return sources;
}

void PolicyKVCache::Rewind(Layer& layer, const KVStep& step) {
  // Entries at or after a row's first new position are stale (a rewind): forget them. Rare,
  // so the exact recount (a device sync) is affordable.
  if (step.min_position > layer.max_written) return;
  const int64_t rows = step.positions.size(0);
  const at::Tensor first = step.positions.amin(1).view({rows, 1, 1});
  for (Store* store : {&layer.main, &layer.ring}) {
    if (store->capacity == 0) continue;
    at::Tensor positions = Rows(store->positions, rows);
    positions.masked_fill_(positions >= first, -1);
    store->used = (store->positions >= 0).sum(-1).max().item<int64_t>();
  }
}

void PolicyKVCache::PlaceDecode(Layer& layer, int64_t rows, const at::Tensor& keys,
                                const at::Tensor& values, const at::Tensor& positions) {
  const int64_t groups = layer.spec.n_query_groups, head_size = layer.spec.head_size;
  const at::Tensor state = FreshState(layer, rows);  // [rows, G, 1, C]
  if (layer.residual == 0) {
    InsertMain(layer, rows, keys, values, positions, state);
    return;
  }
  Store& ring = layer.ring;
  if (ring.capacity == 0) GrowStore(ring, *layer.ring_codec, layer, layer.residual);
  at::Tensor ring_positions = Rows(ring.positions, rows);  // [rows, P, residual]
  at::Tensor ring_keys = Rows(ring.parts[0], rows), ring_values = Rows(ring.parts[1], rows);
  const at::Tensor slot = ring_positions.argmin(-1, /*keepdim=*/true);  // empty, else oldest
  const at::Tensor slot4 = Expand4(slot, groups, head_size);
  if (ring.used >= layer.residual) {
    // The oldest recent entry moves to main (encoded) before the new one takes its slot.
    at::Tensor moving;
    if (state.defined()) {
      moving = Rows(ring.scores, rows).gather(2, Expand4(slot, groups, state.size(3)));
    }
    InsertMain(layer, rows, ring_keys.gather(2, slot4), ring_values.gather(2, slot4),
               ring_positions.gather(-1, slot), moving);
  }
  ring_keys.scatter_(2, slot4, keys.to(options_.dtype));
  ring_values.scatter_(2, slot4, values.to(options_.dtype));
  ring_positions.scatter_(-1, slot, positions);
  if (state.defined()) {
    Rows(ring.scores, rows).scatter_(2, Expand4(slot, groups, state.size(3)), state);
  }
  ring.used = std::min(layer.residual, ring.used + 1);
  ring.high = ring.capacity;
}

void PolicyKVCache::InsertMain(Layer& layer, int64_t rows, const at::Tensor& keys,
                               const at::Tensor& values, const at::Tensor& positions,
                               const at::Tensor& scores) {
  Store& main = layer.main;
  const int64_t groups = layer.spec.n_query_groups;
  GrowMain(layer, main.used + 1);
  at::Tensor main_positions = Rows(main.positions, rows);  // [rows, P, capacity]
  // The first empty slot (empty slots hold -1, below every position).
  const at::Tensor slot = main_positions.argmin(-1, /*keepdim=*/true);
  const std::vector<at::Tensor> encoded = layer.codec->Encode(keys, values);
  for (size_t i = 0; i < encoded.size(); ++i) {
    Rows(main.parts[i], rows).scatter_(2, Expand4(slot, groups, encoded[i].size(-1)), encoded[i]);
  }
  main_positions.scatter_(-1, slot, positions);
  if (scores.defined()) {
    Rows(main.scores, rows).scatter_(2, Expand4(slot, groups, scores.size(3)), scores);
  }
  main.used = std::min(main.used + 1, main.capacity);
  main.high = std::min(main.capacity, std::max(main.high, main.used));
}

at::Tensor PolicyKVCache::FreshState(const Layer& layer, int64_t rows) const {
  const int64_t channels = StateChannels(layer.plan);
  if (channels == 0) return at::Tensor();
  at::Tensor state = at::zeros({rows, layer.spec.n_query_groups, 1, channels},
                               at::TensorOptions().dtype(at::kFloat).device(options_.device));
  if (channels > 1) state.select(3, 1).copy_(layer.pending.feature);
  return state;
}

at::Tensor PolicyKVCache::ChunkState(const Layer& layer, const at::Tensor& chunk_scores) const {
  const int64_t channels = StateChannels(layer.plan);
  if (channels == 0) return at::Tensor();
  const Pending& pending = layer.pending;
  at::Tensor state =
      at::zeros({pending.rows, layer.spec.n_query_groups, pending.keys.size(2), channels},
                at::TensorOptions().dtype(at::kFloat).device(options_.device));
  if (chunk_scores.defined()) state.select(3, 0).copy_(chunk_scores);
  if (channels > 1) state.select(3, 1).copy_(pending.feature);
  return state;
}

at::Tensor PolicyKVCache::ViewFeature(const Layer& layer) const {
  if (layer.plan.kind != PolicyKind::kH2OVlen) return at::Tensor();
  const Pending& pending = layer.pending;
  std::vector<at::Tensor> parts;
  for (auto [store, size] : {std::make_pair(&layer.main, pending.main_high),
                             std::make_pair(&layer.ring, pending.ring_size)}) {
    if (size > 0)
      parts.push_back(Rows(store->scores, pending.rows).narrow(2, 0, size).select(3, 1));
  }
  if (pending.kind == Pending::kChunk) parts.push_back(pending.feature);
  return at::cat(parts, 2);
}

void PolicyKVCache::Settle(Layer& layer, const at::Tensor& weights) {
  Pending& pending = layer.pending;
  if (pending.kind == Pending::kNone) return;
  const int64_t rows = pending.rows, groups = layer.spec.n_query_groups;
  const int64_t chunk = pending.kind == Pending::kChunk ? pending.positions.size(2) : 0;
  at::Tensor chunk_scores;
  if (layer.plan.scored && weights.defined()) {
    at::Tensor step =  // [rows, G, S]
        StepScores(layer.plan, weights, groups, ViewFeature(layer)).contiguous();
    if (layer.spec.score_reducer) layer.spec.score_reducer->Reduce(step);
    TORCH_CHECK(
        step.size(0) == rows && step.size(2) == pending.main_high + pending.ring_size + chunk,
        "attention weights ", weights.sizes(), " do not cover the KV view");
    const bool replace = ScoresReplace(layer.plan);
    int64_t offset = 0;
    for (auto [store, size] : {std::make_pair(&layer.main, pending.main_high),
                               std::make_pair(&layer.ring, pending.ring_size)}) {
      if (size > 0) {
        at::Tensor target = Rows(store->scores, rows).narrow(2, 0, size).select(3, 0);
        const at::Tensor part = step.narrow(2, offset, size);
        if (replace) {
          target.copy_(part);
        } else {
          target.add_(part);
        }
      }
      offset += size;
    }
    if (chunk > 0) chunk_scores = step.narrow(2, offset, chunk);
  }
  if (pending.kind == Pending::kDecode) {
    EvictDecode(layer);
  } else {
    Compact(layer, ChunkState(layer, chunk_scores));
  }
  pending = Pending();
}

void PolicyKVCache::EvictDecode(Layer& layer) {
  Store& main = layer.main;
  if (!layer.plan.evicts() || main.used <= layer.main_budget) return;
  if (EvictDecodeOnHost(layer)) return;
  const Pending& pending = layer.pending;
  at::Tensor positions =
      Rows(main.positions, pending.rows).narrow(2, 0, main.high);  // [rows, P, high]
  const at::Tensor scores = main.scores.defined()
                                ? Rows(main.scores, pending.rows).narrow(2, 0, main.high)
                                : at::Tensor();
  at::Tensor priority = Priority(layer.plan, positions, scores, pending.newest);
  priority.masked_fill_(positions < 0, std::numeric_limits<double>::infinity());
  const at::Tensor victim = priority.argmin(-1, /*keepdim=*/true);
  const at::Tensor over = (positions >= 0).sum(-1, /*keepdim=*/true) > layer.main_budget;
  const at::Tensor kept = positions.gather(-1, victim);
  positions.scatter_(-1, victim, at::where(over, at::full({}, -1, kept.options()), kept));
  main.used = layer.main_budget;
}

bool PolicyKVCache::EvictDecodeOnHost(Layer& layer) {
  Store& main = layer.main;
  const Pending& pending = layer.pending;
  if (!EntryPriorityApplies(layer.plan) || !main.positions.device().is_cpu() ||
      !main.positions.is_contiguous() || !pending.newest.device().is_cpu() ||
      (main.scores.defined() && !main.scores.is_contiguous())) {
    return false;
  }
  const at::Tensor newest = pending.newest.contiguous();  // [rows, 1, 1]
  EvictOnHost(layer, pending.rows, newest.data_ptr<int64_t>());
  return true;
}

void PolicyKVCache::EvictOnHost(Layer& layer, int64_t rows, const int64_t* newest_of) {
  Store& main = layer.main;
  const int64_t groups = layer.spec.n_query_groups, shared = layer.position_groups;
  const int64_t capacity = main.capacity, channels = StateChannels(layer.plan);
  int32_t* positions = main.positions.data_ptr<int32_t>();  // [B, P, capacity]
  const float* state = main.scores.defined() ? main.scores.data_ptr<float>() : nullptr;
  for (int64_t b = 0; b < rows; ++b) {
    for (int64_t g = 0; g < shared; ++g) {
      int32_t* slot = positions + (b * shared + g) * capacity;
      // Scoring plans keep positions per group (shared == groups): the same (b, g) rows.
      const float* score =
          state != nullptr ? state + (b * groups + g) * capacity * channels : nullptr;
      int64_t live = 0, victim = 0;
      double lowest = std::numeric_limits<double>::infinity();  // empty slots rank +inf
      for (int64_t s = 0; s < main.high; ++s) {
        if (slot[s] < 0) continue;
        ++live;
        const double priority = EntryPriority(
            layer.plan, slot[s], score != nullptr ? score[s * channels] : 0.0, newest_of[b]);
        if (priority < lowest) {  // the first of equals, as argmin
          lowest = priority;
          victim = s;
        }
      }
      if (live > layer.main_budget) slot[victim] = -1;
    }
  }
  main.used = layer.main_budget;
}

bool PolicyKVCache::DecodeOnHostApplies(const Layer& layer, const at::Tensor& q,
                                        const at::Tensor& keys, const at::Tensor& values,
                                        const KVStep& step) const {
  const LayerPlan& plan = layer.plan;
  if (options_.dtype != at::kFloat || !options_.device.is_cpu() || !EntryPriorityApplies(plan) ||
      plan.kind == PolicyKind::kH2OVlen || (plan.scored && layer.spec.score_reducer)) {
    return false;
  }
  // Quantised main entries are decoded per (row, group) for the step: bounded by the budget.
  if (options_.bits < 16 && MaxMainCapacity(layer) > kHostDecodedEntries) return false;
  for (const at::Tensor* t : {&q, &keys, &values}) {
    if (!t->device().is_cpu() || t->scalar_type() != at::kFloat || t->requires_grad() ||
        t->size(2) != 1) {
      return false;
    }
  }
  return step.positions.device().is_cpu() && step.positions.scalar_type() == at::kLong &&
         q.size(1) % layer.spec.n_query_groups == 0;
}

at::Tensor PolicyKVCache::DecodeOnHost(Layer& layer, const KVStep& step, const at::Tensor& q,
                                       const at::Tensor& keys, const at::Tensor& values,
                                       const AttentionParams& params) {
  Settle(layer, at::Tensor());
  Rewind(layer, step);
  layer.max_written = std::max(layer.max_written, step.max_position);
  const int64_t rows = keys.size(0), n_head = q.size(1), groups = layer.spec.n_query_groups;
  Store& main = layer.main;
  Store& ring = layer.ring;
  const bool has_ring = layer.residual > 0;
  if (has_ring && ring.capacity == 0) GrowStore(ring, *layer.ring_codec, layer, layer.residual);
  // The new entry enters main directly, or the ring's oldest moves there to make room.
  const bool ring_full = has_ring && ring.used >= layer.residual;
  const bool enters_main = !has_ring || ring_full;
  if (enters_main) GrowMain(layer, main.used + 1);
  // [rows, G, 1, hs] with each entry's hs floats contiguous and keys laid out as values (one
  // group stride), as the loops read them; the serving engine's rows may come otherwise.
  const bool alike = keys.stride(3) == 1 && values.stride(3) == 1 &&
                     (groups == 1 || keys.stride(1) == values.stride(1));
  const at::Tensor k = alike ? keys : keys.contiguous();
  const at::Tensor v = alike ? values : values.contiguous();
  const at::Tensor positions = step.positions.contiguous();  // [rows, 1]
  const int64_t* newest = positions.data_ptr<int64_t>();
  for (int64_t b = 0; b < rows; ++b) {
    PlaceOnHost(layer, b, static_cast<int32_t>(newest[b]), k, v, ring_full);
  }
  if (enters_main) {
    main.used = std::min(main.used + 1, main.capacity);
    main.high = std::min(main.capacity, std::max(main.high, main.used));
  }
  if (has_ring) {
    ring.used = std::min(layer.residual, ring.used + 1);
    ring.high = ring.capacity;
  }

  const int64_t ring_size = has_ring ? ring.capacity : 0, entries = main.high + ring_size;
  const at::Tensor view_positions = ViewPositionsOnHost(layer, rows);  // [rows, P, entries]
  float* weights = nullptr;                                            // [rows, n_head, 1, entries]
  if (layer.plan.scored) {
    layer.step_weights.resize(rows * n_head * entries);
    weights = layer.step_weights.data();
  }
  at::Tensor y = DecodeAttentionSegments(q, groups, entries, ViewSegments(layer), step.positions,
                                         view_positions, params, CpuHasAvx2Fma(), weights);
  if (weights != nullptr) ScoreOnHost(layer, rows, n_head, weights);
  if (layer.plan.evicts() && main.used > layer.main_budget) EvictOnHost(layer, rows, newest);
  return y;
}

void PolicyKVCache::PlaceOnHost(Layer& layer, int64_t b, int32_t position, const at::Tensor& keys,
                                const at::Tensor& values, bool ring_full) {
  const int64_t groups = layer.spec.n_query_groups, hs = layer.spec.head_size;
  const int64_t shared = layer.position_groups, channels = StateChannels(layer.plan);
  const float* k = keys.data_ptr<float>() + b * keys.stride(0);
  const float* v = values.data_ptr<float>() + b * values.stride(0);
  if (layer.residual == 0) {
    for (int64_t p = 0; p < shared; ++p) {
      InsertMainOnHost(layer, b, p, position, {k, v, keys.stride(1), nullptr, 0});
    }
    return;
  }
  Store& ring = layer.ring;
  const int64_t residual = ring.capacity;
  int32_t* ring_positions = ring.positions.data_ptr<int32_t>();  // [B, P, residual]
  float* ring_keys = ring.parts[0].data_ptr<float>();            // [B, G, residual, hs]
  float* ring_values = ring.parts[1].data_ptr<float>();
  float* ring_state = ring.scores.defined() ? ring.scores.data_ptr<float>() : nullptr;
  for (int64_t p = 0; p < shared; ++p) {
    int32_t* slots = ring_positions + (b * shared + p) * residual;
    // An empty slot, else the oldest entry (argmin: the first of equals).
    const int64_t slot = std::min_element(slots, slots + residual) - slots;
    const int64_t first = (b * groups) * residual + slot;  // entry index of group 0
    if (ring_full && slots[slot] >= 0) {
      InsertMainOnHost(
          layer, b, p, slots[slot],
          {ring_keys + first * hs, ring_values + first * hs, residual * hs,
           ring_state != nullptr ? ring_state + first * channels : nullptr, residual * channels});
    }
    slots[slot] = position;
    const GroupRange groups_of_p = GroupsOf(layer, p);
    for (int64_t g = groups_of_p.first; g < groups_of_p.last; ++g) {
      const int64_t entry = first + g * residual;
      std::copy_n(k + g * keys.stride(1), hs, ring_keys + entry * hs);
      std::copy_n(v + g * values.stride(1), hs, ring_values + entry * hs);
      if (ring_state != nullptr) std::fill_n(ring_state + entry * channels, channels, 0.0f);
    }
  }
}

void PolicyKVCache::InsertMainOnHost(Layer& layer, int64_t b, int64_t p, int32_t position,
                                     const HostEntry& entry) {
  Store& main = layer.main;
  const int64_t groups = layer.spec.n_query_groups, hs = layer.spec.head_size;
  const int64_t capacity = main.capacity, channels = StateChannels(layer.plan);
  int32_t* slots = main.positions.data_ptr<int32_t>() + (b * layer.position_groups + p) * capacity;
  // The first empty slot, as InsertMain's argmin finds it; one exists (capacity > used).
  const int64_t slot =
      std::find_if(slots, slots + capacity, [](int32_t s) { return s < 0; }) - slots;
  TORCH_CHECK(slot < capacity, "no empty slot in a layer's main store");
  slots[slot] = position;
  float* state = main.scores.defined() ? main.scores.data_ptr<float>() : nullptr;
  const int bits = layer.codec->bits();
  const GroupRange groups_of_p = GroupsOf(layer, p);
  for (int64_t g = groups_of_p.first; g < groups_of_p.last; ++g) {
    const int64_t index = (b * groups + g) * capacity + slot;  // of [B, G, capacity]
    const float* key = entry.keys + g * entry.group_stride;
    const float* value = entry.values + g * entry.group_stride;
    if (bits == 16) {
      std::copy_n(key, hs, main.parts[0].data_ptr<float>() + index * hs);
      std::copy_n(value, hs, main.parts[1].data_ptr<float>() + index * hs);
    } else {
      const int64_t width = hs * bits / 8, scales = hs / layer.quant_group;
      QuantizeRow(key, hs, bits, layer.quant_group,
                  static_cast<uint8_t*>(main.parts[0].data_ptr()) + index * width,
                  main.parts[1].data_ptr<at::Half>() + index * scales);
      QuantizeRow(value, hs, bits, layer.quant_group,
                  static_cast<uint8_t*>(main.parts[2].data_ptr()) + index * width,
                  main.parts[3].data_ptr<at::Half>() + index * scales);
    }
    if (state == nullptr) continue;
    float* target = state + index * channels;
    if (entry.state != nullptr) {
      std::copy_n(entry.state + g * entry.state_group_stride, channels, target);
    } else {
      std::fill_n(target, channels, 0.0f);
    }
  }
}

PolicyKVCache::GroupRange PolicyKVCache::GroupsOf(const Layer& layer, int64_t p) {
  // Shared positions (P = 1) stand for every group; per-group ones for group p alone.
  if (layer.position_groups != 1) return {p, p + 1};
  return {0, layer.spec.n_query_groups};
}

at::Tensor PolicyKVCache::ViewPositionsOnHost(const Layer& layer, int64_t rows) const {
  const Store& main = layer.main;
  const Store& ring = layer.ring;
  if (layer.residual == 0) return Rows(main.positions, rows).narrow(2, 0, main.high);
  const int64_t shared = layer.position_groups, high = main.high, residual = ring.capacity;
  at::Tensor view = at::empty({rows, shared, high + residual}, ring.positions.options());
  int32_t* out = view.data_ptr<int32_t>();
  const int32_t* main_positions = main.capacity > 0 ? main.positions.data_ptr<int32_t>() : nullptr;
  const int32_t* ring_positions = ring.positions.data_ptr<int32_t>();
  for (int64_t row = 0; row < rows * shared; ++row) {
    if (high > 0) std::copy_n(main_positions + row * main.capacity, high, out);
    std::copy_n(ring_positions + row * residual, residual, out + high);
    out += high + residual;
  }
  return view;
}

KVSegmentsOf PolicyKVCache::ViewSegments(const Layer& layer) const {
  const Store& main = layer.main;
  const Store& ring = layer.ring;
  const int64_t groups = layer.spec.n_query_groups, hs = layer.spec.head_size;
  const int64_t high = main.high, capacity = main.capacity, residual = ring.capacity;
  const int bits = layer.codec->bits(), group = layer.quant_group;
  std::vector<const void*> parts;
  for (const at::Tensor& part : main.parts) parts.push_back(part.data_ptr());
  const float* ring_keys = residual > 0 ? ring.parts[0].data_ptr<float>() : nullptr;
  const float* ring_values = residual > 0 ? ring.parts[1].data_ptr<float>() : nullptr;
  return [=](int64_t b, int64_t g, std::vector<KVSegment>* out) {
    const int64_t first = (b * groups + g) * capacity;  // main's entry 0 of (b, g)
    if (high > 0 && bits == 16) {
      out->push_back({static_cast<const float*>(parts[0]) + first * hs,
                      static_cast<const float*>(parts[1]) + first * hs, high});
    } else if (high > 0) {
      // This (row, group)'s entries, decoded for the one step: [high, hs] keys, then values.
      thread_local std::vector<float> decoded;
      decoded.resize(2 * high * hs);
      const int64_t width = hs * bits / 8, scales = hs / group;
      for (int64_t e = 0; e < high; ++e) {
        for (int part = 0; part < 2; ++part) {
          DequantizeRow(static_cast<const uint8_t*>(parts[2 * part]) + (first + e) * width,
                        static_cast<const at::Half*>(parts[2 * part + 1]) + (first + e) * scales,
                        hs, bits, group, decoded.data() + (part * high + e) * hs);
        }
      }
      out->push_back({decoded.data(), decoded.data() + high * hs, high});
    }
    if (residual > 0) {
      const int64_t ring_first = (b * groups + g) * residual;
      out->push_back({ring_keys + ring_first * hs, ring_values + ring_first * hs, residual});
    }
  };
}

void PolicyKVCache::ScoreOnHost(Layer& layer, int64_t rows, int64_t n_head, const float* weights) {
  const int64_t groups = layer.spec.n_query_groups, q_per_kv = n_head / groups;
  const int64_t channels = StateChannels(layer.plan), high = layer.main.high;
  const int64_t residual = layer.residual > 0 ? layer.ring.capacity : 0;
  const int64_t entries = high + residual;
  const bool replace = ScoresReplace(layer.plan);  // tova: the mean over the group's heads
  float* main_state = layer.main.scores.defined() ? layer.main.scores.data_ptr<float>() : nullptr;
  float* ring_state = residual > 0 ? layer.ring.scores.data_ptr<float>() : nullptr;
  for (int64_t b = 0; b < rows; ++b) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* w = weights + (b * n_head + g * q_per_kv) * entries;  // [q_per_kv, entries]
      for (int64_t s = 0; s < entries; ++s) {
        float sum = 0.0f;
        for (int64_t h = 0; h < q_per_kv; ++h) sum += w[h * entries + s];
        float* score = s < high
                           ? main_state + ((b * groups + g) * layer.main.capacity + s) * channels
                           : ring_state + ((b * groups + g) * residual + s - high) * channels;
        *score = replace ? sum / static_cast<float>(q_per_kv) : *score + sum;
      }
    }
  }
}

void PolicyKVCache::Compact(Layer& layer, const at::Tensor& chunk_scores) {
  KeepInMain(layer, TakeIntoRing(layer, chunk_scores));
}

PolicyKVCache::Recent PolicyKVCache::TakeIntoRing(Layer& layer, const at::Tensor& chunk_scores) {
  const Pending& pending = layer.pending;
  const int64_t rows = pending.rows, groups = layer.spec.n_query_groups;
  const int64_t head_size = layer.spec.head_size, steps = pending.positions.size(2);
  Store& ring = layer.ring;
  // The ring and the chunk: the ring keeps the `residual` most recent, the rest go to main.
  Recent recent{pending.positions, chunk_scores, pending.keys, pending.values, pending.positions};
  at::Tensor& recent_positions = recent.positions;
  at::Tensor& recent_scores = recent.scores;
  at::Tensor& recent_keys = recent.keys;
  at::Tensor& recent_values = recent.values;
  at::Tensor& migrant_positions = recent.migrant_positions;
  if (layer.residual > 0) {
    if (ring.capacity == 0) GrowStore(ring, *layer.ring_codec, layer, layer.residual);
    recent_positions = at::cat({Rows(ring.positions, rows), pending.positions}, 2);  // [rows, P, n]
    if (ring.scores.defined()) recent_scores = at::cat({Rows(ring.scores, rows), chunk_scores}, 2);
    recent_keys = at::cat({Rows(ring.parts[0], rows), pending.keys}, 2);
    recent_values = at::cat({Rows(ring.parts[1], rows), pending.values}, 2);
    const auto top = recent_positions.topk(layer.residual, -1);
    const at::Tensor& top_positions = std::get<0>(top);
    const at::Tensor& top_index = std::get<1>(top);  // [rows, P, residual]
    const at::Tensor top4 = Expand4(top_index, groups, head_size);
    Rows(ring.parts[0], rows).copy_(recent_keys.gather(2, top4));
    Rows(ring.parts[1], rows).copy_(recent_values.gather(2, top4));
    Rows(ring.positions, rows).copy_(top_positions);
    if (ring.scores.defined()) {
      Rows(ring.scores, rows)
          .copy_(recent_scores.gather(2, Expand4(top_index, groups, recent_scores.size(3))));
    }
    const at::Tensor in_ring =
        at::zeros_like(recent_positions, at::kBool).scatter_(-1, top_index, top_positions >= 0);
    migrant_positions = recent_positions.masked_fill(in_ring, -1);
    ring.used = std::min(layer.residual, ring.used + steps);
    ring.high = ring.capacity;
  }
  return recent;
}

void PolicyKVCache::KeepInMain(Layer& layer, const Recent& recent) {
  const Pending& pending = layer.pending;
  const int64_t rows = pending.rows, groups = layer.spec.n_query_groups;
  Store& main = layer.main;
  const at::Tensor& migrant_positions = recent.migrant_positions;
  const at::Tensor& recent_scores = recent.scores;
  // Main keeps the policy's top main_budget among its entries and the migrants, in position
  // order (so with nothing evicted the slots hold the sequence in order).
  const int64_t high = main.high;
  at::Tensor candidate_positions = migrant_positions, candidate_scores = recent_scores;
  if (high > 0) {
    candidate_positions =
        at::cat({Rows(main.positions, rows).narrow(2, 0, high), migrant_positions}, 2);
    if (main.scores.defined()) {
      candidate_scores = at::cat({Rows(main.scores, rows).narrow(2, 0, high), recent_scores}, 2);
    }
  }
  const int64_t kept = std::min(layer.main_budget, candidate_positions.size(2));
  const std::vector<at::Tensor> encoded = layer.codec->Encode(recent.keys, recent.values);
  std::vector<at::Tensor> gathered;
  at::Tensor kept_positions, kept_scores;
  if (kept > 0) {
    const at::Tensor priority =
        Priority(layer.plan, candidate_positions, candidate_scores, pending.newest);
    const auto top = priority.topk(kept, -1, /*largest=*/true, /*sorted=*/false);
    const at::Tensor valid = std::get<0>(top) > -std::numeric_limits<double>::infinity();
    at::Tensor index = std::get<1>(top);
    const at::Tensor order =
        at::where(valid, candidate_positions.gather(-1, index),
                  at::full({}, std::numeric_limits<int64_t>::max(), index.options()))
            .argsort(/*dim=*/-1, /*descending=*/false);
    index = index.gather(-1, order);
    kept_positions = candidate_positions.gather(-1, index).masked_fill_(
        valid.gather(-1, order).logical_not(), -1);
    if (candidate_scores.defined()) {
      kept_scores = candidate_scores.gather(2, Expand4(index, groups, candidate_scores.size(3)));
    }
    for (size_t i = 0; i < encoded.size(); ++i) {
      const at::Tensor source =
          high > 0 ? at::cat({Rows(main.parts[i], rows).narrow(2, 0, high), encoded[i]}, 2)
                   : encoded[i];
      gathered.push_back(source.gather(2, Expand4(index, groups, source.size(-1))));
    }
  }
  GrowMain(layer, std::min(kept + 1, MaxMainCapacity(layer)));
  Rows(main.positions, rows).fill_(-1);
  if (kept > 0) {
    for (size_t i = 0; i < gathered.size(); ++i) {
      Rows(main.parts[i], rows).narrow(2, 0, kept).copy_(gathered[i]);
    }
    Rows(main.positions, rows).narrow(2, 0, kept).copy_(kept_positions);
    if (kept_scores.defined()) Rows(main.scores, rows).narrow(2, 0, kept).copy_(kept_scores);
  }
  const bool all_rows = rows == options_.batch_size;
  main.used = all_rows ? kept : std::max(main.used, kept);
  main.high = all_rows ? kept : std::max(main.high, kept);
}

absl::StatusOr<int64_t> PolicyKVCache::MakeRoom(int64_t next, int64_t steps,
                                                const KeyShifter& shift_keys) {
  if (!options_.cache_positions) return 0;
  if (next < 0 || steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("MakeRoom: bad next position ", next, " or step of ", steps, " tokens"));
  }
  if (next + steps <= options_.max_sequence_length) return 0;
  // After the previous step's eviction a layer holds its sinks [0, s) and its most recent
  // entries, all at or above next - budget: moving them down by this puts the window right
  // after the sinks and the stream at `budget`.
  const int64_t shift = next - options_.policy.budget;
  if (shift <= 0) return 0;  // the caller shortens the step instead
  if (!shift_keys) return absl::InvalidArgumentError("MakeRoom: no key shifter");
  for (size_t i = 0; i < layers_.size(); ++i) {
    Settle(layers_[i], at::Tensor());
    Shift(static_cast<int64_t>(i), layers_[i], shift, shift_keys);
  }
  return shift;
}

void PolicyKVCache::Shift(int64_t index, Layer& layer, int64_t shift,
                          const KeyShifter& shift_keys) {
  const int64_t sinks = layer.plan.sink_tokens;  // positions below stay where they are
  for (Store* store : {&layer.main, &layer.ring}) {
    if (store->capacity == 0 || store->high == 0) continue;
    const EntryCodec& codec = store == &layer.main ? *layer.codec : *layer.ring_codec;
    const int64_t high = store->high;
    at::Tensor positions = store->positions.narrow(2, 0, high);  // [B, P, high]
    const at::Tensor moves = positions >= sinks;                 // empty slots (-1) stay
    // Quantised entries are decoded a block at a time, as UpdateAndAttend reads them.
    const int64_t block = codec.bits() < 16 ? options_.read_chunk : high;
    for (int64_t begin = 0; begin < high; begin += block) {
      const int64_t length = std::min(block, high - begin);
      std::vector<at::Tensor> slice;
      for (const at::Tensor& part : store->parts) slice.push_back(part.narrow(2, begin, length));
      at::Tensor keys;
      codec.Decode(slice, &keys, nullptr);                                   // [B, G, length, hs]
      const at::Tensor shifted = shift_keys(index, keys, shift);             // [B, G, length, hs]
      const at::Tensor move = moves.narrow(2, begin, length).unsqueeze(-1);  // [B, P, length, 1]
      // Encode takes keys and values: the value parts of this encoding are discarded.
      const std::vector<at::Tensor> encoded = codec.Encode(shifted, shifted);
      for (int i = 0; i < codec.key_parts(); ++i) {
        slice[i].copy_(at::where(move, encoded[i], slice[i]));
      }
    }
    positions.copy_(at::where(moves, positions - shift, positions));
    // Kept non-sink entries are at or above the shift (see MakeRoom); anything else is an entry
    // no later query could see: dropped rather than moved onto the sinks.
    positions.masked_fill_(moves.logical_and(positions < sinks), -1);
  }
  layer.max_written -= shift;
  layer.undo = Undo();
}

void PolicyKVCache::Reset() {
  for (Layer& layer : layers_) {
    for (Store* store : {&layer.main, &layer.ring}) {
      if (store->capacity > 0) {
        store->positions.fill_(-1);
        if (store->scores.defined()) store->scores.zero_();
      }
      store->used = 0;
      store->high = 0;
    }
    layer.pending = Pending();
    layer.max_written = -1;
    layer.undo = Undo();
  }
}

int64_t PolicyKVCache::AllocatedBytes() const {
  int64_t bytes = 0;
  for (const Layer& layer : layers_) {
    for (const Store* store : {&layer.main, &layer.ring}) {
      for (const at::Tensor& part : store->parts) {
        bytes += part.numel() * static_cast<int64_t>(part.element_size());
      }
    }
  }
  return bytes;
}

int64_t PolicyKVCache::IndexBytes() const {
  int64_t bytes = 0;
  for (const Layer& layer : layers_) {
    for (const Store* store : {&layer.main, &layer.ring}) {
      for (const at::Tensor* index : {&store->positions, &store->scores}) {
        if (index->defined()) bytes += index->numel() * static_cast<int64_t>(index->element_size());
      }
    }
  }
  return bytes;
}

int64_t PolicyKVCache::SlotBytes(const Layer& layer, const EntryCodec& codec, int64_t slots) const {
  const int64_t groups = layer.spec.n_query_groups;
  // Per slot of a row: the groups' entries, int32 positions and, for scoring policies,
  // float32 state.
  const int64_t index = 4 * layer.position_groups + 4 * groups * StateChannels(layer.plan);
  return options_.batch_size * slots * (groups * codec.BytesPerEntry() + index);
}

int64_t PolicyKVCache::MaxBytes() const {
  int64_t bytes = 0;
  for (const Layer& layer : layers_) {
    bytes += SlotBytes(layer, *layer.codec, MaxMainCapacity(layer));
    if (layer.residual > 0) bytes += SlotBytes(layer, *layer.ring_codec, layer.residual);
  }
  return bytes;
}

int64_t PolicyKVCache::BytesAfterStep(int64_t tokens) const {
  int64_t bytes = 0;
  for (const Layer& layer : layers_) {
    const Store& main = layer.main;
    // A chunk rebuilds main from the slots of main, the ring and its tokens, plus a spare
    // slot (KeepInMain), when it settles: in its own step (scoring policies) or at the next.
    const Pending& pending = layer.pending;
    const int64_t pending_chunk = pending.kind == Pending::kChunk ? pending.positions.size(2) : 0;
    int64_t needed = 0, used = main.used, high = main.high;
    if (pending_chunk > 0) {
      needed = high + layer.residual + pending_chunk + 1;
      used = high = std::min(layer.main_budget, needed - 1);
    }
    // A decode step moves at most one entry into main.
    needed = std::max(needed, tokens == 1 ? used + 1 : high + layer.residual + tokens + 1);
    needed = std::min(needed, MaxMainCapacity(layer));
    bytes += SlotBytes(layer, *layer.codec, GrownMainCapacity(layer, needed, main.capacity));
    if (layer.residual > 0) bytes += SlotBytes(layer, *layer.ring_codec, layer.residual);
  }
  return bytes;
}

void PolicyKVCache::Release() {
  for (Layer& layer : layers_) {
    layer.main = Store();
    layer.ring = Store();
    layer.pending = Pending();
    layer.max_written = -1;
    layer.undo = Undo();
  }
}

absl::Status PolicyKVCache::CheckCopyInto(const KVCache& target) const {
  const auto* other = dynamic_cast<const PolicyKVCache*>(&target);
  if (other == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot copy a ", DebugName(), " KV cache into a ", target.DebugName(), " cache"));
  }
  if (other == this) {
    return absl::FailedPreconditionError("a KV cache cannot be copied into itself");
  }
  // "PolicyKVCacheOptions.<name> differs: <here> here, <there> in the target".
  const auto differs = [](absl::string_view name, const auto& here, const auto& there) {
    const std::string field = absl::StrCat("PolicyKVCacheOptions.", name);
    return FieldError(absl::StatusCode::kFailedPrecondition, field,
                      absl::StrCat("cannot copy the KV cache: ", field, " differs: ", here,
                                   " here, ", there, " in the target"));
  };
  const PolicyKVCacheOptions& a = options_;
  const PolicyKVCacheOptions& b = other->options_;
  if (a.batch_size != b.batch_size) return differs("batch_size", a.batch_size, b.batch_size);
  if (a.dtype != b.dtype) {
    return differs("dtype", c10::toString(a.dtype), c10::toString(b.dtype));
  }
  if (a.device != b.device) return differs("device", a.device.str(), b.device.str());
  if (a.layers.size() != b.layers.size()) {
    return differs("layers", absl::StrCat(a.layers.size(), " layers"),
                   absl::StrCat(b.layers.size(), " layers"));
  }
  for (size_t i = 0; i < a.layers.size(); ++i) {
    const KVLayerSpec& x = a.layers[i];
    const KVLayerSpec& y = b.layers[i];
    if (x.n_query_groups != y.n_query_groups || x.head_size != y.head_size ||
        x.sliding_window != y.sliding_window || x.score_reducer != y.score_reducer) {
      return differs(absl::StrCat("layers[", i, "]"), "one geometry", "another");
    }
  }
  const EvictionPolicyOptions& p = a.policy;
  const EvictionPolicyOptions& q = b.policy;
  if (p.kind != q.kind) return differs("policy.kind", PolicyName(p.kind), PolicyName(q.kind));
  if (p.budget != q.budget) return differs("policy.budget", p.budget, q.budget);
  if (p.sink_tokens != q.sink_tokens) {
    return differs("policy.sink_tokens", p.sink_tokens, q.sink_tokens);
  }
  if (p.recent_fraction != q.recent_fraction) {
    return differs("policy.recent_fraction", p.recent_fraction, q.recent_fraction);
  }
  if (p.grace_period != q.grace_period) {
    return differs("policy.grace_period", p.grace_period, q.grace_period);
  }
  if (p.normalize_scores != q.normalize_scores) {
    return differs("policy.normalize_scores", p.normalize_scores ? "true" : "false",
                   q.normalize_scores ? "true" : "false");
  }
  if (p.quant_weight != q.quant_weight) {
    return differs("policy.quant_weight", p.quant_weight, q.quant_weight);
  }
  if (p.layer_budgets != q.layer_budgets) {
    return differs("policy.layer_budgets", absl::StrJoin(p.layer_budgets, ","),
                   absl::StrJoin(q.layer_budgets, ","));
  }
  if (a.bits != b.bits) return differs("bits", a.bits, b.bits);
  if (a.residual != b.residual) return differs("residual", a.residual, b.residual);
  if (a.group_size != b.group_size) return differs("group_size", a.group_size, b.group_size);
  if (a.read_chunk != b.read_chunk) return differs("read_chunk", a.read_chunk, b.read_chunk);
  if (a.cache_positions != b.cache_positions) {
    return differs("cache_positions", a.cache_positions ? "true" : "false",
                   b.cache_positions ? "true" : "false");
  }
  if (a.growth_step != b.growth_step) return differs("growth_step", a.growth_step, b.growth_step);
  for (size_t i = 0; i < layers_.size(); ++i) {
    // The options agree; max_sequence_length may still change a layer's plan (a budget that
    // covers one context and not the other). Layers that keep everything (the dense plan)
    // decide nothing from their budget, the context: any length holding the entries will do.
    const Layer& x = layers_[i];
    const Layer& y = other->layers_[i];
    const LayerPlan& s = x.plan;
    const LayerPlan& t = y.plan;
    const bool keep_all = !s.evicts() && !t.evicts();
    const bool same_plan =
        s.kind == t.kind && s.window == t.window && s.sink_tokens == t.sink_tokens &&
        s.scored == t.scored && s.normalize == t.normalize && s.quant_weight == t.quant_weight &&
        x.residual == y.residual &&
        (keep_all ||
         (s.budget == t.budget && s.recent == t.recent && x.main_budget == y.main_budget));
    if (!same_plan) {
      return differs(
          "max_sequence_length",
          absl::StrCat(a.max_sequence_length, " (layer ", i, ": ", PolicyName(s.kind), " budget ",
                       s.budget, ")"),
          absl::StrCat(b.max_sequence_length, " (", PolicyName(t.kind), " budget ", t.budget, ")"));
    }
    if (x.max_written >= b.max_sequence_length) {
      return differs("max_sequence_length",
                     absl::StrCat(a.max_sequence_length, " (position ", x.max_written, " written)"),
                     b.max_sequence_length);
    }
  }
  return absl::OkStatus();
}

void PolicyKVCache::CopyStore(const Store& from, const EntryCodec& codec, const Layer& layer,
                              int64_t capacity, Store& to) {
  to = Store();
  if (from.capacity == 0) return;
  GrowStore(to, codec, layer, capacity);  // zeroed entries, empty slots
  // Slots from `high` on are empty: only the filled ones are copied.
  const int64_t filled = from.high;
  if (filled > 0) {
    for (size_t i = 0; i < from.parts.size(); ++i) {
      to.parts[i].narrow(2, 0, filled).copy_(from.parts[i].narrow(2, 0, filled));
    }
    to.positions.narrow(2, 0, filled).copy_(from.positions.narrow(2, 0, filled));
    if (from.scores.defined()) {
      to.scores.narrow(2, 0, filled).copy_(from.scores.narrow(2, 0, filled));
    }
  }
  to.used = from.used;
  to.high = from.high;
}

absl::Status PolicyKVCache::CopyInto(KVCache& target) const {
  RETURN_IF_ERROR(CheckCopyInto(target));
  auto& copy = static_cast<PolicyKVCache&>(target);
  const auto clone = [](const at::Tensor& t) { return t.defined() ? t.clone() : t; };
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& from = layers_[i];
    Layer& to = copy.layers_[i];
    // Main at this cache's capacity, within the copy's bound (a shorter context of a layer
    // that keeps everything bounds it lower).
    const int64_t main_capacity =
        std::max(from.main.high, std::min(from.main.capacity, copy.MaxMainCapacity(to)));
    copy.CopyStore(from.main, *to.codec, to, main_capacity, to.main);
    copy.CopyStore(from.ring, *to.ring_codec, to, from.ring.capacity, to.ring);
    // The pending eviction reads the step's entries when it settles: copies of them.
    const Pending& pending = from.pending;
    to.pending = pending;
    to.pending.keys = clone(pending.keys);
    to.pending.values = clone(pending.values);
    to.pending.positions = clone(pending.positions);
    to.pending.newest = clone(pending.newest);
    to.pending.feature = clone(pending.feature);
    to.max_written = from.max_written;
  }
  return absl::OkStatus();
}

int64_t PolicyKVCache::slots(int64_t layer) const {
  return layers_[layer].main.capacity + layers_[layer].ring.capacity;
}

std::vector<int64_t> PolicyKVCache::KeptPositions(int64_t layer_index, int64_t row, int64_t group) {
  Layer& layer = layers_[layer_index];
  Settle(layer, at::Tensor());
  std::vector<int64_t> kept;
  for (const Store* store : {&layer.main, &layer.ring}) {
    if (store->capacity == 0) continue;
    const at::Tensor positions =
        store->positions[row][layer.position_groups == 1 ? 0 : group].to(at::kCPU, at::kLong);
    for (int64_t i = 0; i < positions.size(0); ++i) {
      const int64_t p = positions[i].item<int64_t>();
      if (p >= 0) kept.push_back(p);
    }
  }
  std::sort(kept.begin(), kept.end());
  return kept;
}

}  // namespace lgpt
