#include "cache/dense_kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "glog/logging.h"

namespace lgpt {
namespace {

// Writes `src` [B, G, T, hs] into `buffer` [B, G, C, hs] at `slots` [B, T].
void ScatterSlots(at::Tensor& buffer, const at::Tensor& slots, const at::Tensor& src) {
  // Decode steps on the CPU: a few rows copied directly. index_copy_/scatter_ cost more in
  // dispatch and TensorIterator setup than the copy itself, once per layer and token.
  if (buffer.device().is_cpu() && src.device().is_cpu() && slots.device().is_cpu() &&
      buffer.scalar_type() == src.scalar_type() && slots.scalar_type() == at::kLong &&
      buffer.stride(3) == 1 && src.stride(3) == 1 && src.size(2) <= 4) {
    const int64_t batch = src.size(0), groups = src.size(1), steps = src.size(2);
    const int64_t row_bytes = src.size(3) * src.element_size();
    const int64_t capacity = buffer.size(2);
    const auto slot = slots.accessor<int64_t, 2>();
    char* dst = static_cast<char*>(buffer.data_ptr());
    const char* from = static_cast<const char*>(src.data_ptr());
    const int64_t item = src.element_size();
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t t = 0; t < steps; ++t) {
        const int64_t c = slot[b][t];
        CHECK(c >= 0 && c < capacity) << "slot " << c << " outside the cache's " << capacity;
        for (int64_t g = 0; g < groups; ++g) {
          std::memcpy(
              dst + (b * buffer.stride(0) + g * buffer.stride(1) + c * buffer.stride(2)) * item,
              from + (b * src.stride(0) + g * src.stride(1) + t * src.stride(2)) * item, row_bytes);
        }
      }
    }
    return;
  }
  if (slots.size(0) == 1 && src.size(0) == 1) {
    buffer.index_copy_(2, slots[0], src);
    return;
  }
  const at::Tensor index = slots.view({slots.size(0), 1, slots.size(1), 1}).expand(src.sizes());
  buffer.scatter_(2, index, src);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DenseKVCache>> DenseKVCache::Create(
    const DenseKVCacheOptions& options) {
  RETURN_IF_ERROR(CheckCacheGeometry("DenseKVCacheOptions", options));
  if (options.initial_capacity < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DenseKVCacheOptions.initial_capacity must be >= 0, got ", options.initial_capacity));
  }
  if (options.rollback_slots < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DenseKVCacheOptions.rollback_slots must be >= 0, got ", options.rollback_slots));
  }
  return std::unique_ptr<DenseKVCache>(new DenseKVCache(options));
}

DenseKVCache::DenseKVCache(const DenseKVCacheOptions& options) : options_(options) {
  const at::TensorOptions opts = at::TensorOptions().dtype(options.dtype).device(options.device);
  const int64_t batch = options.batch_size;
  for (const KVLayerSpec& spec : options.layers) {
    Layer layer;
    layer.spec = spec;
    layer.ring = spec.sliding_window > 0 && spec.sliding_window < options.max_sequence_length;
    if (layer.ring) {
      layer.capacity =
          std::min(spec.sliding_window + options.rollback_slots, options.max_sequence_length);
      layer.keys = at::zeros({batch, spec.n_query_groups, layer.capacity, spec.head_size}, opts);
      layer.values = at::zeros_like(layer.keys);
      layer.positions = at::full({batch, 1, layer.capacity}, -1,
                                 at::TensorOptions().dtype(at::kLong).device(options.device));
    }
    layers_.push_back(std::move(layer));
  }
  if (options.initial_capacity > 0) {
    for (Layer& layer : layers_) {
      if (!layer.ring) Grow(layer, std::min(options.initial_capacity, options.max_sequence_length));
    }
  }
}

void DenseKVCache::Grow(Layer& layer, int64_t needed) {
  if (needed <= layer.capacity) return;
  // A caller that gave initial_capacity knows the length: no doubling past it.
  const int64_t capacity =
      layer.capacity == 0 && options_.initial_capacity > 0
          ? std::min(needed, options_.max_sequence_length)
          : GrownCapacity(needed, layer.capacity, options_.max_sequence_length);
  const at::TensorOptions opts = at::TensorOptions().dtype(options_.dtype).device(options_.device);
  const KVLayerSpec& spec = layer.spec;
  at::Tensor keys =
      at::zeros({options_.batch_size, spec.n_query_groups, capacity, spec.head_size}, opts);
  at::Tensor values = at::zeros_like(keys);
  if (layer.capacity > 0) {
    keys.narrow(2, 0, layer.capacity).copy_(layer.keys);
    values.narrow(2, 0, layer.capacity).copy_(layer.values);
  }
  layer.keys = keys;
  layer.values = values;
  layer.capacity = capacity;
}

void DenseKVCache::GrowRamp(int64_t length) {
  if (ramp_.defined() && ramp_.size(2) >= length) return;
  // Doubles (up to the longest sequence) rather than growing by the one entry of each step.
  const int64_t old = ramp_.defined() ? ramp_.size(2) : 0;
  const int64_t size = std::max(length, std::min(2 * old, options_.max_sequence_length));
  ramp_ = at::arange(size, at::TensorOptions().dtype(at::kLong).device(options_.device))
              .view({1, 1, size});
}

at::Tensor DenseKVCache::Ramp(int64_t length) {
  GrowRamp(length);
  return ramp_.size(2) == length ? ramp_ : ramp_.narrow(2, 0, length);
}

at::Tensor DenseKVCache::InCacheDtype(const at::Tensor& t) const {
  // Each skipped no-op is one LibTorch dispatch less per layer and decode step.
  return t.scalar_type() == options_.dtype ? t : t.to(options_.dtype);
}

std::pair<at::Tensor, at::Tensor> DenseKVCache::WriteSlots(Layer& layer, const KVStep& step,
                                                           const at::Tensor& k,
                                                           const at::Tensor& v) {
  Grow(layer, step.max_position + 1);
  const int64_t batch = k.size(0);
  const bool all_rows = batch == layer.keys.size(0);
  at::Tensor layer_keys = all_rows ? layer.keys : layer.keys.narrow(0, 0, batch);
  at::Tensor layer_values = all_rows ? layer.values : layer.values.narrow(0, 0, batch);
  ScatterSlots(layer_keys, step.positions, k);
  ScatterSlots(layer_values, step.positions, v);
  layer.end = std::max(layer.end, step.max_position + 1);
  return {layer_keys, layer_values};
}

absl::Status DenseKVCache::CheckStep(const KVStep& step, int64_t batch_size) const {
  return CheckStepBounds(step, batch_size, options_.batch_size, options_.max_sequence_length);
}

absl::StatusOr<KVView> DenseKVCache::Update(int64_t layer_index, const KVStep& step,
                                            const at::Tensor& keys, const at::Tensor& values) {
  RETURN_IF_ERROR(CheckLayerStep(layer_index, options_.layers, step, keys, values,
                                 options_.batch_size, options_.max_sequence_length));
  Layer& layer = layers_[layer_index];
  const int64_t batch = keys.size(0);
  const at::Tensor k = InCacheDtype(keys), v = InCacheDtype(values);
  if (layer.ring) return RingUpdate(layer, step, k, v);

  const auto [layer_keys, layer_values] = WriteSlots(layer, step, k, v);
  // Slots past a row's own length hold positions beyond its queries: the causal mask hides
  // them, which is what lets rows of different lengths share one cache.
  return KVView{layer_keys.narrow(2, 0, layer.end), layer_values.narrow(2, 0, layer.end),
                Ramp(layer.end).expand({batch, 1, layer.end})};
}

absl::StatusOr<std::optional<DecodeRow>> DenseKVCache::UpdateForDecode(int64_t layer_index,
                                                                       const KVStep& step,
                                                                       const at::Tensor& keys,
                                                                       const at::Tensor& values) {
  if (layer_index < 0 || layer_index >= num_layers() || layers_[layer_index].ring ||
      options_.batch_size != 1 || options_.dtype != at::kFloat || !options_.device.is_cpu()) {
    return std::nullopt;  // (a bad layer index gets its error from UpdateAndAttend)
  }
  // Update's writes without its views: a batched step calls this for every request and
  // layer, so the few LibTorch operations of a view (narrow, expand) add up.
  RETURN_IF_ERROR(CheckLayerStep(layer_index, options_.layers, step, keys, values,
                                 options_.batch_size, options_.max_sequence_length));
  Layer& layer = layers_[layer_index];
  WriteSlots(layer, step, InCacheDtype(keys), InCacheDtype(values));
  GrowRamp(layer.end);
  DecodeRow row;
  row.entries = layer.end;
  row.key_positions = ramp_;  // [1, 1, >= end]: the first `end` are read
  // layer.keys [1, G, capacity, hs]: each group's entries one run of rows.
  row.segments = [keys = layer.keys, values = layer.values, end = layer.end](
                     int64_t, int64_t g, std::vector<KVSegment>* out) {
    out->push_back({keys.data_ptr<float>() + g * keys.stride(1),
                    values.data_ptr<float>() + g * values.stride(1), end});
  };
  return row;
}

KVView DenseKVCache::RingUpdate(Layer& layer, const KVStep& step, const at::Tensor& k,
                                const at::Tensor& v) {
  const int64_t batch = k.size(0);
  const int64_t steps = k.size(2);
  const int64_t capacity = layer.capacity;
  at::Tensor ring_keys = layer.keys.narrow(0, 0, batch);
  at::Tensor ring_values = layer.values.narrow(0, 0, batch);
  at::Tensor ring_positions = layer.positions.narrow(0, 0, batch);
  // Entries at or after a row's first new position are stale (a rewind): forget them.
  const at::Tensor first = std::get<0>(step.positions.min(1)).view({batch, 1, 1});
  ring_positions.masked_fill_(ring_positions >= first, -1);

  KVView view;
  if (steps == 1) {
    // One query needs the window's last `capacity` positions, its own included: write first.
    const at::Tensor slots = step.positions.remainder(capacity);
    ScatterSlots(ring_keys, slots, k);
    ScatterSlots(ring_values, slots, v);
    ring_positions.scatter_(2, slots.unsqueeze(1), step.positions.unsqueeze(1));
    return KVView{ring_keys, ring_values, ring_positions};
  }
  // A chunk's first query still needs keys the chunk itself would overwrite: attend to the
  // old entries plus the chunk's own, then keep the chunk's last `capacity` entries.
  view.keys = at::cat({ring_keys, k}, 2);
  view.values = at::cat({ring_values, v}, 2);
  view.positions = at::cat({ring_positions.clone(), step.positions.unsqueeze(1)}, 2);
  const int64_t kept = std::min(steps, capacity);
  const at::Tensor kept_positions = step.positions.narrow(1, steps - kept, kept);
  const at::Tensor slots = kept_positions.remainder(capacity);
  ScatterSlots(ring_keys, slots, k.narrow(2, steps - kept, kept));
  ScatterSlots(ring_values, slots, v.narrow(2, steps - kept, kept));
  ring_positions.scatter_(2, slots.unsqueeze(1), kept_positions.unsqueeze(1));
  return view;
}

absl::Status DenseKVCache::CheckCopyInto(const KVCache& target) const {
  const auto* other = dynamic_cast<const DenseKVCache*>(&target);
  if (other == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot copy a dense KV cache into a ", target.DebugName(), " cache"));
  }
  if (other == this) {
    return absl::FailedPreconditionError("a KV cache cannot be copied into itself");
  }
  const auto differs = [](absl::string_view name, const auto& here, const auto& there) {
    const std::string field = absl::StrCat("DenseKVCacheOptions.", name);
    return FieldError(absl::StatusCode::kFailedPrecondition, field,
                      absl::StrCat("cannot copy the KV cache: ", field, " differs: ", here,
                                   " here, ", there, " in the target"));
  };
  const DenseKVCacheOptions& a = options_;
  const DenseKVCacheOptions& b = other->options_;
  if (a.batch_size != b.batch_size) return differs("batch_size", a.batch_size, b.batch_size);
  if (a.dtype != b.dtype) return differs("dtype", c10::toString(a.dtype), c10::toString(b.dtype));
  if (a.device != b.device) return differs("device", a.device.str(), b.device.str());
  if (a.layers.size() != b.layers.size()) {
    return differs("layers", absl::StrCat(a.layers.size(), " layers"),
                   absl::StrCat(b.layers.size(), " layers"));
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& x = layers_[i];
    const Layer& y = other->layers_[i];
    if (x.spec.n_query_groups != y.spec.n_query_groups || x.spec.head_size != y.spec.head_size ||
        x.spec.sliding_window != y.spec.sliding_window) {
      return differs(absl::StrCat("layers[", i, "]"), "one geometry", "another");
    }
    if (x.ring != y.ring || (x.ring && x.capacity != y.capacity)) {
      return differs(
          "max_sequence_length",
          absl::StrCat(a.max_sequence_length, " (layer ", i, x.ring ? " a ring)" : " global)"),
          absl::StrCat(b.max_sequence_length, y.ring ? " (a ring)" : " (global)"));
    }
    if (x.end > b.max_sequence_length) {
      return differs("max_sequence_length",
                     absl::StrCat(a.max_sequence_length, " (", x.end, " positions written)"),
                     b.max_sequence_length);
    }
  }
  return absl::OkStatus();
}

int64_t DenseKVCache::max_rollback() const {
  for (const Layer& layer : layers_) {
    if (layer.ring) return options_.rollback_slots + 1;
  }
  return kUnlimited;
}

absl::Status DenseKVCache::Truncate(int64_t length) {
  if (length < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DenseKVCache::Truncate: length must be >= 0, got ", length));
  }
  // Rings first, checked before anything changes: after the truncation a row's next query (at
  // its newest kept position + 1) sees the window before it, which the ring must still hold.
  std::vector<at::Tensor> kept_positions;  // per ring layer: [B, 1, capacity] on the host
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& layer = layers_[i];
    if (!layer.ring) continue;
    at::Tensor positions = layer.positions.to(at::kCPU).clone();  // the check changes nothing
    const at::Tensor held_before = (positions >= 0).any(-1).view({-1});  // [B]
    positions.masked_fill_(positions >= length, -1);
    const int64_t window = layer.spec.sliding_window, capacity = layer.capacity;
    const int64_t* slots = positions.data_ptr<int64_t>();
    for (int64_t b = 0; b < options_.batch_size; ++b) {
      const int64_t* row = slots + b * capacity;
      const int64_t newest = *std::max_element(row, row + capacity);
      if (newest < 0) {
        // Every entry the ring held is cut: fine for an empty row or a cut to nothing, else
        // the entries before `length` that the next query sees are gone.
        if (length == 0 || !held_before[b].item<bool>()) continue;
        return absl::FailedPreconditionError(absl::StrCat(
            "DenseKVCache::Truncate(", length, "): the ring of layer ", i, " (window ", window,
            ", ", capacity - window,
            " spare slots) holds no entry before it; give DenseKVCacheOptions.rollback_slots >= "
            "the entries a step writes past what it keeps, minus 1"));
      }
      // The next query, at newest + 1, sees positions newest + 2 - window .. newest.
      const int64_t oldest_seen = std::max<int64_t>(0, newest + 2 - window);
      const int64_t held = std::count_if(row, row + capacity, [&](int64_t p) {
        return p >= oldest_seen;  // (every held position is <= newest)
      });
      if (held < newest + 1 - oldest_seen) {
        return absl::FailedPreconditionError(absl::StrCat(
            "DenseKVCache::Truncate(", length, "): the ring of layer ", i, " (window ", window,
            ", ", capacity - window,
            " spare slots) no longer holds the entries the next query sees; give "
            "DenseKVCacheOptions.rollback_slots >= the entries a step writes past what it "
            "keeps, minus 1"));
      }
    }
    kept_positions.push_back(positions);
  }
  size_t ring = 0;
  for (Layer& layer : layers_) {
    if (layer.ring) {
      layer.positions.copy_(kept_positions[ring++]);
    } else {
      layer.end = std::min(layer.end, length);
    }
  }
  return absl::OkStatus();
}

absl::Status DenseKVCache::CopyInto(KVCache& target) const {
  RETURN_IF_ERROR(CheckCopyInto(target));
  auto& copy = static_cast<DenseKVCache&>(target);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& from = layers_[i];
    Layer& to = copy.layers_[i];
    if (from.ring) {  // window-sized, allocated by both caches
      to.keys.copy_(from.keys);
      to.values.copy_(from.values);
      to.positions.copy_(from.positions);
      continue;
    }
    if (to.capacity != from.capacity) {
      to.keys = from.capacity > 0 ? at::zeros_like(from.keys) : at::Tensor();
      to.values = from.capacity > 0 ? at::zeros_like(from.values) : at::Tensor();
      to.capacity = from.capacity;
    }
    // Slots from `end` on were never written (or are hidden by the causal mask).
    if (from.end > 0) {
      to.keys.narrow(2, 0, from.end).copy_(from.keys.narrow(2, 0, from.end));
      to.values.narrow(2, 0, from.end).copy_(from.values.narrow(2, 0, from.end));
    }
    to.end = from.end;
  }
  copy.ramp_ = ramp_;  // 0, 1, 2, ...: never written in place
  return absl::OkStatus();
}

void DenseKVCache::Reset() {
  for (Layer& layer : layers_) {
    layer.end = 0;
    if (layer.ring) layer.positions.fill_(-1);
  }
}

int64_t DenseKVCache::AllocatedBytes() const {
  int64_t bytes = 0;
  for (const Layer& layer : layers_) {
    if (layer.capacity == 0) continue;
    bytes += 2 * layer.keys.numel() * static_cast<int64_t>(layer.keys.element_size());
  }
  return bytes;
}

int64_t DenseKVCache::IndexBytes() const {
  int64_t bytes = ramp_.defined() ? ramp_.numel() * 8 : 0;
  for (const Layer& layer : layers_) {
    if (layer.ring) bytes += layer.positions.numel() * 8;
  }
  return bytes;
}

}  // namespace lgpt
