// Per-request adapters in one forward pass (S-LoRA / Punica): which adapter slot each token
// row of the running forward pass uses, so projections that hold several adapters
// (peft/multi_lora.h) add each adapter's update to its own rows only.
//
// The routing is plain data installed for the duration of a forward pass on the calling
// thread (ScopedAdapterRouting; GPT::Forward installs one from ForwardOptions.adapters), and
// read by the projections through CurrentAdapterRouting(). Forwards of different models on
// different threads never see each other's routing.
//
// Rows are the flattened rows of the projections' input: x [B, T, C] has B·T rows, row
// b·T + t being token t of batch row b (a decode step [B, 1, C]: one row per sequence; a
// mixed prefill step [1, ΣT, C]: one row per token, the chunks' token ranges end to end).
#ifndef LGPT_CORE_NN_ADAPTER_ROUTING_H_
#define LGPT_CORE_NN_ADAPTER_ROUTING_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace lgpt {

class AdapterRouting {
 public:
  // The rows of one adapter slot.
  struct Group {
    int64_t slot = -1;
    at::Tensor rows;  // [n] int64 row indices, ascending, on the routing's device
  };

  // Every row uses the base model (no adapter).
  AdapterRouting() = default;
  // Every row uses `slot` (-1: the base model), whatever the number of rows.
  static AdapterRouting Uniform(int64_t slot);
  // Row i uses slots[i] (-1: the base model). Slots are not checked against any model here
  // (GPT::Forward checks them). The groups' index tensors are built once, on `device`; when
  // every row uses one slot the routing is Uniform (no gather at all).
  static AdapterRouting PerRow(std::vector<int64_t> slots, c10::Device device);

  // No row uses an adapter.
  bool base_only() const { return !per_row_ && uniform_slot_ < 0; }
  // The slot of every row when one slot serves them all (-1: the base model); nullopt when
  // the rows differ.
  std::optional<int64_t> uniform_slot() const {
    return per_row_ ? std::nullopt : std::optional<int64_t>(uniform_slot_);
  }
  // The number of rows a per-row routing describes; -1 for a uniform one (any number).
  int64_t rows() const { return per_row_ ? static_cast<int64_t>(slots_.size()) : -1; }
  // Per row: each slot's rows, slots ascending, the base model's rows (-1) left out.
  // Empty for a uniform routing.
  const std::vector<Group>& groups() const { return groups_; }
  // The slot of each row (per-row routings; empty for uniform ones).
  const std::vector<int64_t>& slots() const { return slots_; }

  // The routing of the rows `kept` (indices into this routing's rows): what the language-model
  // head sees after the forward pass keeps only some tokens. A uniform routing is returned as
  // it is.
  AdapterRouting Select(const std::vector<int64_t>& kept, c10::Device device) const;

 private:
  bool per_row_ = false;
  int64_t uniform_slot_ = -1;
  std::vector<int64_t> slots_;
  std::vector<Group> groups_;
};

// The routing of the forward pass running on this thread; null outside one (every row then
// uses the base model).
const AdapterRouting* CurrentAdapterRouting();

// Installs `routing` (not owned; it must outlive the scope) as this thread's routing while
// alive, and restores the previous one after.
class ScopedAdapterRouting {
 public:
  explicit ScopedAdapterRouting(const AdapterRouting* routing);
  ~ScopedAdapterRouting();
  ScopedAdapterRouting(const ScopedAdapterRouting&) = delete;
  ScopedAdapterRouting& operator=(const ScopedAdapterRouting&) = delete;

 private:
  const AdapterRouting* previous_;
};

}  // namespace lgpt

#endif  // LGPT_CORE_NN_ADAPTER_ROUTING_H_
