#include "core/nn/adapter_routing.h"

#include <ATen/ATen.h>

#include <map>
#include <utility>

namespace lgpt {
namespace {
thread_local const AdapterRouting* current_routing = nullptr;
}  // namespace

AdapterRouting AdapterRouting::Uniform(int64_t slot) {
  AdapterRouting routing;
  routing.uniform_slot_ = slot < 0 ? -1 : slot;
  return routing;
}

AdapterRouting AdapterRouting::PerRow(std::vector<int64_t> slots, c10::Device device) {
  bool same = true;
  for (size_t i = 1; i < slots.size() && same; ++i) same = slots[i] == slots[0];
  if (same) return Uniform(slots.empty() ? -1 : slots[0]);
  AdapterRouting routing;
  routing.per_row_ = true;
  std::map<int64_t, std::vector<int64_t>> rows_of;  // slot -> its rows, ascending
  for (size_t row = 0; row < slots.size(); ++row) {
    if (slots[row] >= 0) rows_of[slots[row]].push_back(static_cast<int64_t>(row));
  }
  for (auto& [slot, rows] : rows_of) {
    routing.groups_.push_back({slot, at::tensor(rows, at::kLong).to(device)});
  }
  routing.slots_ = std::move(slots);
  return routing;
}

AdapterRouting AdapterRouting::Select(const std::vector<int64_t>& kept, c10::Device device) const {
  if (!per_row_) return *this;
  std::vector<int64_t> slots;
  slots.reserve(kept.size());
  for (int64_t row : kept) slots.push_back(slots_.at(static_cast<size_t>(row)));
  return PerRow(std::move(slots), device);
}

const AdapterRouting* CurrentAdapterRouting() { return current_routing; }

ScopedAdapterRouting::ScopedAdapterRouting(const AdapterRouting* routing)
    : previous_(current_routing) {
  current_routing = routing;
}

ScopedAdapterRouting::~ScopedAdapterRouting() { current_routing = previous_; }

}  // namespace lgpt
