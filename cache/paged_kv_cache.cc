#include "cache/paged_kv_cache.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "cache/kv_codec.h"
#include "cache/pool_entries.h"
#include "core/base/device.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "core/ops/attention.h"
#include "core/ops/decode_attention.h"
#include "core/ops/flash_attention.h"
#include "core/ops/kv_dequant.h"
#include "core/ops/kv_entry.h"
#include "core/ops/paged_attention.h"
#include "core/ops/paged_attention_layout.h"
#include "glog/logging.h"

namespace lgpt {

bool PagedEvictionKeepsAsThePolicy(const PagedEviction& eviction, int64_t window) {
  return eviction.budget == 0 || window == 0 || eviction.sink_entries == 0 ||
         eviction.budget - eviction.sink_entries >= window - 1;
}

PagedKVCache::PagedKVCache(std::shared_ptr<BlockPool> pool, int64_t max_sequence_length,
                           PagedEviction eviction)
    : pool_(std::move(pool)),
      max_sequence_length_(max_sequence_length),
      slots_(max_sequence_length),
      newest_(pool_->layers().size(), 0),
      newest_keys_(pool_->layers().size()),
      newest_values_(pool_->layers().size()),
      layer_length_(pool_->layers().size(), 0) {
  // A budget that with the step's own entry covers the sequence never evicts: a dense cache.
  if (eviction.budget > 0 && eviction.budget + 1 < max_sequence_length) {
    evicts_ = true;
    sinks_ = eviction.sink_entries;
    ring_ = eviction.budget - eviction.sink_entries;
    slots_ = eviction.budget;
  }
}

absl::StatusOr<std::unique_ptr<PagedKVCache>> PagedKVCache::Create(std::shared_ptr<BlockPool> pool,
                                                                   int64_t max_sequence_length,
                                                                   PagedEviction eviction) {
  if (pool == nullptr) return absl::InvalidArgumentError("PagedKVCache needs a BlockPool");
  if (max_sequence_length < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedKVCache max_sequence_length must be >= 1, got ", max_sequence_length));
  }
  if (eviction.budget < 0) {
    return FieldError(absl::StatusCode::kInvalidArgument,
                      FieldRef("PagedEviction.budget", "budget"),
                      absl::StrCat("PagedEviction.budget must be >= 0, got ", eviction.budget));
  }
  if (eviction.sink_entries < 0 || eviction.sink_entries > eviction.budget) {
    return FieldError(
        absl::StatusCode::kInvalidArgument, FieldRef("PagedEviction.sink_entries", "sink_entries"),
        absl::StrCat("PagedEviction.sink_entries must be in [0, budget = ", eviction.budget,
                     "], got ", eviction.sink_entries));
  }
  return std::unique_ptr<PagedKVCache>(
      new PagedKVCache(std::move(pool), max_sequence_length, eviction));
}

PagedKVCache::~PagedKVCache() { Reset(); }

void PagedKVCache::Reset() {
  for (int64_t block : table_) pool_->Release(block);
  table_.clear();
  keys_.clear();
  std::fill(layer_length_.begin(), layer_length_.end(), 0);
  std::fill(newest_.begin(), newest_.end(), 0);
  length_ = 0;
}

absl::Status PagedKVCache::Truncate(int64_t length) {
  if (length < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedKVCache::Truncate: length must be >= 0, got ", length));
  }
  if (length >= length_) return absl::OkStatus();
  // Exact while no entry was overwritten: every position seen is in the slots or waits beside
  // them.
  if (evicts() && InBlocks(0) > slots_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PagedKVCache::Truncate: the evicting cache has overwritten entries before position ",
        InBlocks(0) - ring_, "; it cannot go back to length ", length));
  }
  std::fill(newest_.begin(), newest_.end(), 0);  // its position is at least `length`
  const int64_t blocks = pool_->BlocksFor(length);
  for (int64_t i = blocks; i < static_cast<int64_t>(table_.size()); ++i) pool_->Release(table_[i]);
  table_.resize(static_cast<size_t>(blocks));
  // Only whole blocks are published: one the cut falls in holds entries that will change.
  keys_.resize(
      std::min<size_t>(keys_.size(), static_cast<size_t>(length / pool_->entries_per_block())));
  for (int64_t& written : layer_length_) written = std::min(written, length);
  length_ = length;
  return absl::OkStatus();
}

int64_t PagedKVCache::SlotOf(int64_t position) const {
  return !evicts() || position < slots_ ? position : sinks_ + (position - sinks_) % ring_;
}

std::vector<std::pair<int64_t, int64_t>> PagedKVCache::Survivors(int64_t begin,
                                                                 int64_t steps) const {
  const int64_t end = begin + steps;
  // An evicting cache keeps the sinks and the last ring_ positions of the step.
  if (!evicts() || steps <= ring_) return {{begin, end}};
  // (A chunk may end among the sinks when the ring is shorter than they are.)
  std::vector<std::pair<int64_t, int64_t>> ranges;
  const int64_t sinks_end = std::min(sinks_, end);
  if (begin < sinks_end) ranges.emplace_back(begin, sinks_end);
  const int64_t recent = std::max({begin, sinks_end, end - ring_});
  if (recent < end) ranges.emplace_back(recent, end);
  return ranges;
}

std::vector<int64_t> PagedKVCache::TableSlotsToFill(int64_t steps) const {
  std::vector<int64_t> slots;
  if (steps <= 0) return slots;
  const int64_t block_entries = pool_->entries_per_block();
  if (!evicts()) {
    for (int64_t i = length_ / block_entries; i <= (length_ + steps - 1) / block_entries; ++i) {
      if (i >= static_cast<int64_t>(table_.size()) || pool_->IsShared(table_[i])) {
        slots.push_back(i);
      }
    }
    return slots;
  }
  // Table indices the step writes into, ascending (new ones continue the table: the slots fill
  // in order until the ring wraps): the waiting newest entry's (between steps every layer has
  // one, or none), then the step's entries that stay, unless the step's one entry waits.
  std::vector<bool> written(static_cast<size_t>(BlocksToHold(length_ + steps)), false);
  const int64_t in_blocks = InBlocks(0);
  if (newest_[0] && ring_ > 0) {
    written[static_cast<size_t>(SlotOf(in_blocks) / block_entries)] = true;
  }
  if (!(steps == 1 && length_ >= slots_)) {
    for (const auto& [first, end] : Survivors(length_, steps)) {
      // Slots of consecutive positions are consecutive but at the ring's end: a range covers
      // whole runs of slots, at most slots_ of them.
      for (int64_t p = first; p < end && p < first + slots_; ++p) {
        written[static_cast<size_t>(SlotOf(p) / block_entries)] = true;
      }
    }
  }
  for (size_t i = 0; i < written.size(); ++i) {
    if (!written[i] && i < table_.size()) continue;
    if (i >= table_.size() || pool_->IsShared(table_[i])) slots.push_back(static_cast<int64_t>(i));
  }
  return slots;
}

int64_t PagedKVCache::BlocksToHold(int64_t entries) const {
  return pool_->BlocksFor(evicts() ? std::min(entries, slots_) : entries);
}

int64_t PagedKVCache::BlocksNeeded(int64_t steps) const {
  return static_cast<int64_t>(TableSlotsToFill(steps).size());
}

absl::Status PagedKVCache::CheckStep(const KVStep& step, int64_t batch_size) const {
  RETURN_IF_ERROR(CheckStepBounds(step, batch_size, 1, max_sequence_length_));
  const int64_t steps = step.positions.size(1);
  if (step.min_position != length_ || step.max_position != length_ + steps - 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedKVCache appends in position order: the step must cover positions ", length_, "..",
        length_ + steps - 1, ", got ", step.min_position, "..", step.max_position));
  }
  return TakeStepBlocks(steps);
}

absl::Status PagedKVCache::TakeBlocks(int64_t steps) { return TakeStepBlocks(steps); }

absl::Status PagedKVCache::TakeStepBlocks(int64_t steps) const {
  return TakeTableBlocks(*pool_, table_, TableSlotsToFill(steps));
}

int64_t PagedKVCache::AttachPrefix(PrefixCache& prefixes, absl::Span<const int64_t> tokens) {
  if (length_ != 0 || !table_.empty() || tokens.size() < 2 || evicts()) return 0;
  const int64_t block_entries = pool_->entries_per_block();
  const int64_t usable = std::min<int64_t>(tokens.size(), max_sequence_length_);
  CHECK(prefixes.pool() == pool_) << "a prefix cache of another pool";
  uint64_t parent = PrefixCache::kRootKey;
  for (int64_t begin = 0; begin + block_entries <= usable; begin += block_entries) {
    std::optional<PrefixCache::Hit> hit =
        prefixes.Lookup(parent, tokens.subspan(begin, block_entries));
    if (!hit) break;
    table_.push_back(hit->block);
    keys_.push_back(hit->key);
    parent = hit->key;
  }
  const int64_t held = std::min<int64_t>(static_cast<int64_t>(table_.size()) * block_entries,
                                         static_cast<int64_t>(tokens.size()) - 1);
  std::fill(layer_length_.begin(), layer_length_.end(), held);
  length_ = held;
  return held;
}

void PagedKVCache::PublishPrefix(PrefixCache& prefixes, absl::Span<const int64_t> tokens) {
  CHECK(prefixes.pool() == pool_) << "a prefix cache of another pool";
  if (evicts()) return;
  const int64_t block_entries = pool_->entries_per_block();
  const int64_t full = std::min<int64_t>(tokens.size(), length_) / block_entries;
  for (int64_t i = static_cast<int64_t>(keys_.size()); i < full; ++i) {
    const uint64_t parent = i == 0 ? PrefixCache::kRootKey : keys_[i - 1];
    keys_.push_back(
        prefixes.Publish(table_[i], parent, tokens.subspan(i * block_entries, block_entries)));
  }
}

absl::StatusOr<int64_t> PagedKVCache::Write(int64_t layer, const KVStep& step,
                                            const at::Tensor& keys, const at::Tensor& values) {
  RETURN_IF_ERROR(
      CheckLayerStep(layer, pool_->layers(), step, keys, values, 1, max_sequence_length_));
  const int64_t steps = keys.size(2), begin = layer_length_[layer];
  const int64_t block_entries = pool_->entries_per_block();
  if (begin != length_ || BlocksToHold(begin + steps) > static_cast<int64_t>(table_.size())) {
    return absl::FailedPreconditionError(
        absl::StrCat("PagedKVCache layer ", layer, " written without its step's CheckStep"));
  }
  const at::Tensor k = Encodable(keys), v = Encodable(values);
  PlaceNewest(layer);
  if (evicts() && steps == 1 && begin >= slots_) {
    // The slots are full: the entry waits beside them until the next step.
    if (!newest_keys_[layer].defined()) {
      const int64_t groups = keys.size(1);
      const int64_t width =
          pool_->quantised() ? paged::EntryBytes(pool_->entry_format(layer)) : keys.size(3);
      const auto options = at::TensorOptions().dtype(pool_->dtype()).device(pool_->device());
      newest_keys_[layer] = at::empty({groups, 1, width}, options);
      newest_values_[layer] = at::empty({groups, 1, width}, options);
    }
    Store(layer, k, 0, 1, newest_keys_[layer], 0);
    Store(layer, v, 0, 1, newest_values_[layer], 0);
    newest_[layer] = 1;
  }
  // [1, G, T, hs] -> slots of consecutive blocks, each [G, bs, hs] (or [G, bs, entry_bytes]).
  for (const auto& [first, end] :
       newest_[layer] ? std::vector<std::pair<int64_t, int64_t>>() : Survivors(begin, steps)) {
    for (int64_t position = first; position < end;) {
      const int64_t slot = SlotOf(position);
      const int64_t block = table_[slot / block_entries], in_block = slot % block_entries;
      // A run ends at the block's end, the step's end or the ring's end.
      const int64_t n = std::min({end - position, block_entries - in_block, slots_ - slot});
      Store(layer, k, position - begin, n, pool_->keys(block, layer), in_block);
      Store(layer, v, position - begin, n, pool_->values(block, layer), in_block);
      position += n;
    }
  }
  layer_length_[layer] = begin + steps;
  if (std::all_of(layer_length_.begin(), layer_length_.end(),
                  [&](int64_t l) { return l == begin + steps; })) {
    length_ = begin + steps;
  }
  return begin + steps;
}

PagedKVCache::BlockList PagedKVCache::Blocks(int64_t layer, int64_t length) const {
  BlockList blocks;
  for (int64_t i = 0; i < BlocksToHold(length); ++i) {
    blocks.keys.push_back(pool_->keys(table_[i], layer));
    blocks.values.push_back(pool_->values(table_[i], layer));
  }
  return blocks;
}

void PagedKVCache::EnsureRamp(int64_t length) const {
  if (ramp_.defined() && ramp_.size(2) >= length) return;
  const int64_t size =
      GrownCapacity(length, ramp_.defined() ? ramp_.size(2) : 0, max_sequence_length_);
  ramp_ = at::arange(size, at::TensorOptions().dtype(at::kLong).device(pool_->device()))
              .view({1, 1, size});
}

at::Tensor PagedKVCache::Positions(int64_t begin, int64_t length) const {
  EnsureRamp(begin + length);
  return ramp_.narrow(2, begin, length);
}

at::Tensor PagedKVCache::KeyPositions(int64_t layer) const {
  const int64_t in_blocks = InBlocks(layer), newest = newest_[layer];
  // Until the ring wraps the slots hold 0, 1, ... and a waiting entry the next position.
  if (in_blocks <= slots_) return Positions(0, Filled(in_blocks) + newest);
  const std::pair<int64_t, int64_t> key{in_blocks, newest};
  if (slot_positions_key_ != key) {
    // Ring slot sinks_ + r holds the latest position p < in_blocks with (p - sinks_) % ring_ ==
    // r; the waiting entry holds position in_blocks.
    at::Tensor positions = at::empty({1, 1, slots_ + newest}, at::kLong);
    int64_t* data = positions.data_ptr<int64_t>();
    for (int64_t s = 0; s < sinks_; ++s) data[s] = s;
    for (int64_t r = 0; r < ring_; ++r) {
      data[sinks_ + r] = sinks_ + r + ring_ * ((in_blocks - 1 - sinks_ - r) / ring_);
    }
    if (newest) data[slots_] = in_blocks;
    slot_positions_ = ToDeviceQueued(positions, pool_->device());
    slot_positions_key_ = key;
  }
  return slot_positions_;
}

void PagedKVCache::PlaceNewest(int64_t layer) {
  if (!newest_[layer]) return;
  const int64_t position = InBlocks(layer);  // the waiting entry's
  newest_[layer] = 0;
  if (ring_ == 0) return;  // only sinks are kept: the entry is evicted
  const int64_t slot = SlotOf(position);
  const int64_t block_entries = pool_->entries_per_block();
  const int64_t block = table_[slot / block_entries], in_block = slot % block_entries;
  // [G, 1, width] into slot in_block of [G, bs, width], as stored (no conversion).
  CopyEntries(newest_keys_[layer], 0, 1, pool_->keys(block, layer), in_block);
  CopyEntries(newest_values_[layer], 0, 1, pool_->values(block, layer), in_block);
}

KVSegmentsOf PagedKVCache::AttendedSegments(int64_t layer, BlockList blocks, int64_t filled) const {
  const std::optional<paged::EntryFormat> format =
      pool_->quantised() ? std::optional<paged::EntryFormat>(pool_->entry_format(layer))
                         : std::nullopt;
  KVSegmentsOf slots =
      BlockSegments(std::move(blocks.keys), std::move(blocks.values), filled, format);
  if (!newest_[layer]) return slots;
  return [slots = std::move(slots), keys = newest_keys_[layer], values = newest_values_[layer],
          format](int64_t b, int64_t g, std::vector<KVSegment>* out) {
    slots(b, g, out);
    const int64_t row = keys.size(2) * keys.element_size();  // [G, 1, width]
    KVSegment newest{static_cast<const char*>(keys.data_ptr()) + g * row,
                     static_cast<const char*>(values.data_ptr()) + g * row, 1,
                     format ? KVEntryType::kFloat32 : *KVEntryTypeOf(keys.scalar_type())};
    newest.quantised = format;
    out->push_back(newest);
  };
}

at::Tensor PagedKVCache::NewestAs(int64_t layer, bool keys, c10::ScalarType dtype) const {
  return ReadSlots(layer, {keys ? newest_keys_[layer] : newest_values_[layer]}, 1, dtype);
}

KVBlockSource PagedKVCache::NewestSource(int64_t layer, c10::ScalarType dtype,
                                         const at::Tensor& key_positions) const {
  return TensorSource(NewestAs(layer, true, dtype), NewestAs(layer, false, dtype),
                      key_positions.narrow(2, key_positions.size(2) - 1, 1));
}

at::Tensor PagedKVCache::Encodable(const at::Tensor& entries) const {
  // Quantised entries are encoded from float32 rows.
  const bool widen =
      pool_->quantised() && entries.device().is_cpu() && entries.scalar_type() != at::kFloat;
  return widen ? entries.to(at::kFloat) : entries;
}

void PagedKVCache::Store(int64_t layer, const at::Tensor& src, int64_t from, int64_t n,
                         const at::Tensor& block, int64_t slot) const {
  StoreEntries(src, from, n, block, slot,
               pool_->quantised() ? &pool_->entry_format(layer) : nullptr);
}

at::Tensor PagedKVCache::ReadSlots(int64_t layer, const std::vector<at::Tensor>& blocks,
                                   int64_t filled, c10::ScalarType dtype) const {
  return ReadEntries(blocks, filled, pool_->quantised() ? &pool_->entry_format(layer) : nullptr,
                     dtype)
      .unsqueeze(0);
}

at::Tensor PagedKVCache::AsStored(int64_t layer, const at::Tensor& entries,
                                  c10::ScalarType dtype) const {
  // Written into a scratch block [G, T, hs or entry_bytes] as Write writes the pool's blocks,
  // then read back as attention reads them.
  const int64_t groups = entries.size(1), steps = entries.size(2);
  const int64_t width =
      pool_->quantised() ? paged::EntryBytes(pool_->entry_format(layer)) : entries.size(3);
  at::Tensor scratch = at::empty({groups, steps, width},
                                 at::TensorOptions().dtype(pool_->dtype()).device(pool_->device()));
  Store(layer, Encodable(entries), 0, steps, scratch, 0);
  return ReadSlots(layer, {scratch}, steps, dtype);
}

absl::StatusOr<KVView> PagedKVCache::WrappingChunk(int64_t layer, const KVStep& step,
                                                   const at::Tensor& keys,
                                                   const at::Tensor& values) {
  RETURN_IF_ERROR(
      CheckLayerStep(layer, pool_->layers(), step, keys, values, 1, max_sequence_length_));
  if (layer_length_[layer] != length_) {
    return absl::FailedPreconditionError(
        absl::StrCat("PagedKVCache layer ", layer, " written without its step's CheckStep"));
  }
  // What the cache kept after the previous step: its slots, once a waiting entry took the
  // evicted one's.
  PlaceNewest(layer);
  const int64_t length = layer_length_[layer], filled = Filled(length);
  const c10::ScalarType dtype = keys.scalar_type();
  const int64_t steps = keys.size(2);
  const at::Tensor step_positions =
      step.positions.to(pool_->device(), at::kLong).reshape({1, 1, steps});
  KVView view{AsStored(layer, keys, dtype), AsStored(layer, values, dtype), step_positions};
  if (filled > 0) {  // a first chunk longer than the slots has nothing kept before it
    const BlockList blocks = Blocks(layer, length);
    view.keys = at::cat({ReadSlots(layer, blocks.keys, filled, dtype), view.keys}, 2);
    view.values = at::cat({ReadSlots(layer, blocks.values, filled, dtype), view.values}, 2);
    view.positions = at::cat({KeyPositions(layer), step_positions}, 2);
  }
  RETURN_IF_ERROR(Write(layer, step, keys, values).status());
  return view;
}

bool PagedKVCache::WrapsInChunk(int64_t layer, int64_t steps) const {
  return evicts() && steps > 1 && layer >= 0 && layer < num_layers() &&
         layer_length_[layer] + steps > slots_;
}

absl::StatusOr<KVView> PagedKVCache::Update(int64_t layer, const KVStep& step,
                                            const at::Tensor& keys, const at::Tensor& values) {
  if (WrapsInChunk(layer, keys.size(2))) return WrappingChunk(layer, step, keys, values);
  RETURN_IF_ERROR(Write(layer, step, keys, values).status());
  const int64_t in_blocks = InBlocks(layer), filled = Filled(in_blocks);
  const BlockList blocks = Blocks(layer, in_blocks);
  const c10::ScalarType dtype = keys.scalar_type();
  // [G, bs, hs] blocks -> [1, G, blocks * bs, hs] -> the filled part, in the step's dtype
  // (16-bit pool entries widened, quantised ones decoded), then a waiting newest entry.
  auto join = [&](const std::vector<at::Tensor>& parts, bool are_keys) {
    const at::Tensor joined = ReadSlots(layer, parts, filled, dtype);
    return newest_[layer] ? at::cat({joined, NewestAs(layer, are_keys, dtype)}, 2) : joined;
  };
  return KVView{join(blocks.keys, true), join(blocks.values, false), KeyPositions(layer)};
}

absl::StatusOr<at::Tensor> PagedKVCache::UpdateAndAttend(int64_t layer, const KVStep& step,
                                                         const at::Tensor& q,
                                                         const at::Tensor& keys,
                                                         const at::Tensor& values,
                                                         const AttentionParams& params) {
  RETURN_IF_ERROR(CheckQueries(layer, q, keys));
  if (WrapsInChunk(layer, keys.size(2))) {
    ASSIGN_OR_RETURN(const KVView view, WrappingChunk(layer, step, keys, values));
    return AttendByPositions(q, view.keys, view.values, step.positions, view.positions, params);
  }
  if (PagedKernelApplies(q)) return AttendThroughTable(layer, step, q, keys, values, params);
  if (pool_->quantised()) return AttendQuantised(layer, step, q, keys, values, params);
  RETURN_IF_ERROR(Write(layer, step, keys, values).status());
  const int64_t block_entries = pool_->entries_per_block();
  const int64_t in_blocks = InBlocks(layer), filled = Filled(in_blocks);
  const bool newest = newest_[layer];
  // Decoding steps read the blocks in place (no gather of the request's cache).
  const BlockList blocks = Blocks(layer, in_blocks);
  const at::Tensor key_positions = KeyPositions(layer);  // [1, 1, filled + newest]
  if (newest) {
    // The slots and the waiting entry beside them, as segments (the same kernel and bits).
    if (pool_->device().is_cpu() && KVEntryTypeOf(pool_->dtype()).has_value() &&
        DecodeAttentionRowsApplies(q, keys.size(1), step.positions)) {
      return DecodeAttentionSegments(q, keys.size(1), filled + 1,
                                     AttendedSegments(layer, blocks, filled), step.positions,
                                     key_positions, params);
    }
  } else if (DecodeAttentionBlocksApplies(q, blocks.keys, blocks.values, filled, step.positions,
                                          key_positions)) {
    return DecodeAttentionBlocks(q, blocks.keys, blocks.values, filled, step.positions,
                                 key_positions, params);
  }
  if (!newest && FlashOverBlocksApplies(q, step)) {
    // AttendBlockwise would take FlashAttention over the same runs; read straight from the
    // blocks' segments instead of through a source, views and a position narrow per block.
    const KVSegmentsOf segments = BlockSegments(blocks.keys, blocks.values, filled);
    const int64_t* positions = key_positions.data_ptr<int64_t>();
    const KVRunsOf runs = [&](int64_t b, int64_t g, std::vector<KVRun>* out) {
      std::vector<KVSegment> parts;
      segments(b, g, &parts);
      int64_t begin = 0;
      for (const KVSegment& part : parts) {
        KVRun run;
        run.positions = KeyPositionRun(positions + begin, 1);
        run.entries = part.entries;
        run.type = part.type;
        if (part.type == KVEntryType::kFloat32) {
          run.keys = static_cast<const float*>(part.keys);
          run.values = static_cast<const float*>(part.values);
        } else {
          run.keys16 = part.keys;
          run.values16 = part.values;
        }
        out->push_back(run);
        begin += part.entries;
      }
    };
    return FlashAttention(q, keys.size(1), runs, step.positions, params);
  }
  std::vector<KVBlockSource> sources;
  const c10::ScalarType dtype = q.scalar_type();
  for (int64_t begin = 0; begin < filled; begin += block_entries) {
    const int64_t block = table_[begin / block_entries];
    const int64_t n = std::min(block_entries, filled - begin);
    // Views of the pool block: [1, G, n, hs].
    const at::Tensor block_keys = pool_->keys(block, layer).unsqueeze(0).narrow(2, 0, n);
    const at::Tensor block_values = pool_->values(block, layer).unsqueeze(0).narrow(2, 0, n);
    if (pool_->dtype() == dtype) {
      sources.push_back(TensorSource(block_keys, block_values, key_positions.narrow(2, begin, n)));
      continue;
    }
    // 16-bit entries of a wider model: each block widened to the queries' dtype as it is read.
    KVBlockSource source;
    source.size = n;
    source.positions = key_positions.narrow(2, begin, n);
    source.read = [block_keys, block_values, dtype](int64_t from, int64_t count, at::Tensor* k,
                                                    at::Tensor* v) {
      if (k != nullptr) *k = block_keys.narrow(2, from, count).to(dtype);
      if (v != nullptr) *v = block_values.narrow(2, from, count).to(dtype);
    };
    sources.push_back(std::move(source));
  }
  if (newest) sources.push_back(NewestSource(layer, dtype, key_positions));
  return AttendBlockwise(q, keys.size(1), sources, step.positions, params);
}

bool PagedKVCache::PagedKernelApplies(const at::Tensor& q) const {
  return pool_->device().is_cuda() && PagedAttentionHasCudaKernel() && !evicts() &&
         q.device() == pool_->device() && q.size(0) == 1 && q.size(2) == 1 &&
         !(q.requires_grad() && at::GradMode::is_enabled());
}

KVTableRows* PagedKVCache::table_rows() {
  return pool_->device().is_cuda() && PagedAttentionHasCudaKernel() && !evicts() ? this : nullptr;
}

absl::StatusOr<std::optional<KVTableRows::Row>> PagedKVCache::UpdateForTable(
    int64_t layer, const KVStep& step, const at::Tensor& keys, const at::Tensor& values) {
  if (evicts() || keys.dim() != 4 || keys.size(2) != 1) return std::nullopt;
  ASSIGN_OR_RETURN(const int64_t length, Write(layer, step, keys, values));
  Row row;
  row.layer.keys = pool_->layer_keys(layer);
  row.layer.values = pool_->layer_values(layer);
  if (pool_->quantised()) {
    row.layer.bits = pool_->entry_bits();
    row.layer.group_size = pool_->entry_format(layer).group_size;
  }
  row.row.blocks.assign(table_.begin(), table_.begin() + pool_->BlocksFor(length));
  row.row.length = length;
  row.row.query_position = step.max_position;
  return row;
}

absl::StatusOr<at::Tensor> PagedKVCache::AttendThroughTable(int64_t layer, const KVStep& step,
                                                            const at::Tensor& q,
                                                            const at::Tensor& keys,
                                                            const at::Tensor& values,
                                                            const AttentionParams& params) {
  // The block table, length and query position as plain data on the device (a few bytes a
  // layer and step; the kernel reads them there).
  ASSIGN_OR_RETURN(const std::optional<Row> row, UpdateForTable(layer, step, keys, values));
  if (!row) return absl::InternalError("PagedKVCache: a one-token step without a table row");
  ASSIGN_OR_RETURN(const at::Tensor y,
                   PagedDecodeRows(q.select(2, 0), row->layer, {row->row}, params));
  return y.unsqueeze(2);  // [1, n_head, 1, hs]
}

absl::StatusOr<at::Tensor> PagedKVCache::AttendQuantised(int64_t layer, const KVStep& step,
                                                         const at::Tensor& q,
                                                         const at::Tensor& keys,
                                                         const at::Tensor& values,
                                                         const AttentionParams& params) {
  // Every query reads the entries as stored, its step's own too (llama.cpp's quantised KV
  // cache does the same), so what a request attends to does not depend on how its prompt was
  // chunked or whether its first blocks came from the prefix cache.
  RETURN_IF_ERROR(Write(layer, step, keys, values).status());
  const paged::EntryFormat& format = pool_->entry_format(layer);
  const int64_t in_blocks = InBlocks(layer), filled = Filled(in_blocks);
  const at::Tensor key_positions = KeyPositions(layer);  // [1, 1, filled + newest]
  BlockList blocks = Blocks(layer, in_blocks);
  if (DecodeAttentionRowsApplies(q, keys.size(1), step.positions)) {
    return DecodeAttentionSegments(q, keys.size(1), key_positions.size(2),
                                   AttendedSegments(layer, std::move(blocks), filled),
                                   step.positions, key_positions, params);
  }
  // Prompt chunks (and other devices): runs of up to kDecodedRun entries (whole blocks),
  // each decoded as it is read, so the transient float copy stays bounded; a prompt within
  // one run takes AttendBlockwise's single-source path (FlashAttention on the CPU).
  constexpr int64_t kDecodedRun = 2048;
  const int64_t block_entries = pool_->entries_per_block();
  const int64_t run_blocks = std::max<int64_t>(1, kDecodedRun / block_entries);
  const c10::ScalarType dtype = q.scalar_type();
  std::vector<KVBlockSource> sources;
  for (size_t first = 0; first < blocks.keys.size(); first += run_blocks) {
    const size_t last = std::min(blocks.keys.size(), first + run_blocks);
    const int64_t from = static_cast<int64_t>(first) * block_entries;
    KVBlockSource source;
    source.size = std::min(static_cast<int64_t>(last - first) * block_entries, filled - from);
    source.positions = key_positions.narrow(2, from, source.size);
    source.read = [key_blocks = std::vector<at::Tensor>(blocks.keys.begin() + first,
                                                        blocks.keys.begin() + last),
                   value_blocks = std::vector<at::Tensor>(blocks.values.begin() + first,
                                                          blocks.values.begin() + last),
                   size = source.size, block_entries, format,
                   dtype](int64_t begin, int64_t count, at::Tensor* k, at::Tensor* v) {
      // [1, G, count, hs]: the run's entries [begin, begin + count), from the blocks holding
      // them.
      const auto decoded = [&](const std::vector<at::Tensor>& run) {
        const int64_t first = begin / block_entries;
        const int64_t last = (begin + count + block_entries - 1) / block_entries;
        return DecodeBlocks(absl::MakeConstSpan(run).subspan(first, last - first),
                            size - first * block_entries, format, dtype)
            .narrow(1, begin - first * block_entries, count)
            .unsqueeze(0);
      };
      if (k != nullptr) *k = decoded(key_blocks);
      if (v != nullptr) *v = decoded(value_blocks);
    };
    sources.push_back(std::move(source));
  }
  if (newest_[layer]) sources.push_back(NewestSource(layer, dtype, key_positions));
  return AttendBlockwise(q, keys.size(1), sources, step.positions, params);
}

bool PagedKVCache::FlashOverBlocksApplies(const at::Tensor& q, const KVStep& step) const {
  // AttendBlockwise's conditions for FlashAttention (attention.cc's TryFlash), for float32
  // blocks on the CPU, and for 16-bit blocks (widened a tile at a time).
  return pool_->device().is_cpu() && KVEntryTypeOf(pool_->dtype()).has_value() &&
         q.device().is_cpu() && q.scalar_type() == at::kFloat && q.size(2) >= kFlashMinSteps &&
         !q.requires_grad() && !at::GradMode::is_enabled() && step.positions.device().is_cpu() &&
         step.positions.scalar_type() == at::kLong;
}

absl::StatusOr<std::optional<DecodeRow>> PagedKVCache::UpdateForDecode(int64_t layer,
                                                                       const KVStep& step,
                                                                       const at::Tensor& keys,
                                                                       const at::Tensor& values) {
  // Float32 pools, 16-bit pools of float32 models (read in place, widened in registers) and
  // quantised pools (read in place, dequantised in registers).
  if (!pool_->device().is_cpu() || keys.scalar_type() != at::kFloat ||
      WrapsInChunk(layer, keys.size(2)) ||
      (!pool_->quantised() && !KVEntryTypeOf(pool_->dtype()).has_value())) {
    return std::nullopt;
  }
  ASSIGN_OR_RETURN(const int64_t length, Write(layer, step, keys, values));
  const int64_t in_blocks = InBlocks(layer), filled = Filled(in_blocks);
  DecodeRow row;
  row.entries = filled + newest_[layer];
  if (evicts()) {
    row.key_positions = KeyPositions(layer);  // [1, 1, entries]
  } else {
    EnsureRamp(length);
    row.key_positions = ramp_;  // [1, 1, >= length]: the first `length` are read
  }
  row.segments = AttendedSegments(layer, Blocks(layer, in_blocks), filled);
  return row;
}

absl::Status PagedKVCache::CheckCopyInto(const KVCache& target) const {
  const auto* paged = dynamic_cast<const PagedKVCache*>(&target);
  if (paged == nullptr || paged->pool_ != pool_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a paged KV cache copies into a paged cache over the same pool, not ", target.DebugName()));
  }
  if (paged->sinks_ != sinks_ || paged->ring_ != ring_) {
    return absl::FailedPreconditionError(
        absl::StrCat("a paged KV cache copies into one keeping the same positions: ", DebugName(),
                     " into ", paged->DebugName()));
  }
  if (paged->max_sequence_length_ < length_) {
    return absl::FailedPreconditionError(absl::StrCat("the target paged KV cache holds ",
                                                      paged->max_sequence_length_,
                                                      " positions, this one ", length_));
  }
  if (std::any_of(layer_length_.begin(), layer_length_.end(),
                  [&](int64_t l) { return l != length_; })) {
    return absl::FailedPreconditionError("a paged KV cache copies between steps only");
  }
  return absl::OkStatus();
}

absl::Status PagedKVCache::CopyInto(KVCache& target) const {
  RETURN_IF_ERROR(CheckCopyInto(target));
  auto& copy = static_cast<PagedKVCache&>(target);
  if (&copy == this) return absl::OkStatus();
  copy.Reset();
  for (int64_t block : table_) pool_->Retain(block);
  copy.table_ = table_;
  copy.layer_length_ = layer_length_;
  copy.length_ = length_;
  copy.newest_ = newest_;
  for (size_t layer = 0; layer < newest_.size(); ++layer) {
    if (!newest_[layer]) continue;
    copy.newest_keys_[layer] = newest_keys_[layer].clone();
    copy.newest_values_[layer] = newest_values_[layer].clone();
  }
  return absl::OkStatus();
}

int64_t PagedKVCache::AllocatedBytes() const {
  return static_cast<int64_t>(table_.size()) * pool_->BytesPerBlock();
}

int64_t PagedKVCache::IndexBytes() const {
  // Bookkeeping beside the pool's blocks: tables, positions, and an evicting cache's waiting
  // entries (one per layer).
  int64_t bytes = static_cast<int64_t>(table_.capacity() * sizeof(int64_t) +
                                       keys_.capacity() * sizeof(uint64_t)) +
                  (ramp_.defined() ? ramp_.numel() * 8 : 0) +
                  (slot_positions_.defined() ? slot_positions_.numel() * 8 : 0);
  for (size_t layer = 0; layer < newest_keys_.size(); ++layer) {
    if (newest_keys_[layer].defined()) bytes += 2 * newest_keys_[layer].nbytes();
  }
  return bytes;
}

std::string PagedKVCache::DebugName() const {
  const std::string kept =
      evicts() ? absl::StrCat(", sinks ", sinks_, " + ring ", ring_, " slots") : "";
  return absl::StrCat("paged(", table_.size(), " blocks of ", pool_->entries_per_block(), kept,
                      ")");
}

}  // namespace lgpt
