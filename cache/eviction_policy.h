// Eviction policies: which KV entries a budgeted cache keeps, decided per (batch row, query
// group) from each entry's token position and, for score-based policies, the attention the
// entry has received.
//
//   dense   every entry (no budget).
//   window  the `budget` most recent entries.
//   sink    StreamingLLM: the first `sink_tokens` positions plus the most recent ones.
//   h2o     Heavy-Hitter Oracle: the most recent ceil(budget · recent_fraction) entries plus
//           the entries with the largest attention weight accumulated over every query so far
//           (summed over the group's heads).
//   tova    Token Omission Via Attention: the entries with the largest weight from the latest
//           query (averaged over the group's heads), no recent window.
//
// A policy turns entries into priorities (higher stays); the cache keeps the top `budget`.
// Sliding-window layers of the model keep their window whatever the policy when the budget
// covers it (so they stay exact); with a smaller budget the policy runs inside the window,
// and entries that no future query can see go first.
#ifndef LGPT_CACHE_EVICTION_POLICY_H_
#define LGPT_CACHE_EVICTION_POLICY_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lgpt {

enum class PolicyKind { kDense, kWindow, kSink, kH2O, kTova };

// "dense", "window", "sink", "h2o", "tova".
absl::StatusOr<PolicyKind> ParsePolicyKind(absl::string_view name);
std::string PolicyName(PolicyKind kind);
const std::vector<std::string>& PolicyNames();

struct EvictionPolicyOptions {
  PolicyKind kind = PolicyKind::kDense;
  int64_t budget = 0;            // entries kept per layer and (row, group); ignored by dense
  int64_t sink_tokens = 4;       // sink: positions 0 .. sink_tokens-1 always stay
  double recent_fraction = 0.5;  // h2o: share of the budget kept for the most recent entries
};

// Checks budget (>= 1 unless dense), sink_tokens (in [0, budget] for sink) and
// recent_fraction (in [0, 1]); errors name the fields under `owner` ("KVCacheSpec.budget").
absl::Status ValidateEvictionPolicy(const EvictionPolicyOptions& policy,
                                    absl::string_view owner);

// Whether the policy keeps a contiguous run of positions (plus sinks), as cache positions
// (shifting kept entries down) require: window and sink.
bool KeepsContiguousPositions(PolicyKind kind);

// What one layer of a cache does, derived from the options and the layer's geometry.
struct LayerPlan {
  PolicyKind kind = PolicyKind::kDense;
  int64_t budget = 0;       // entries kept (between steps) per (row, group)
  int64_t window = 0;       // the model's sliding window on this layer, 0 for global layers
  int64_t recent = 0;       // the most recent `recent` positions are never evicted
  int64_t sink_tokens = 0;  // sink: positions below this are never evicted
  bool scored = false;      // decisions need the attention weights
  bool evicts() const { return kind != PolicyKind::kDense; }
};

// max_sequence_length bounds the dense policy; window is the layer's sliding window (0: none).
LayerPlan MakeLayerPlan(const EvictionPolicyOptions& options, int64_t window,
                        int64_t max_sequence_length);

// Priorities of entries (higher stays): positions [B, P, S] int32 or int64 (negative: empty;
// P = 1 when the row's groups share one slot layout, else G), scores [B, G, S] float32
// (undefined for policies that do not score), newest [B, 1, 1] int64 (the newest position of
// each row). Returns [B, P or G, S] float64: -inf for empty entries and (windowed layers)
// entries no later query can see; protected entries (recent, sinks) rank above every other.
at::Tensor Priority(const LayerPlan& plan, const at::Tensor& positions, const at::Tensor& scores,
                    const at::Tensor& newest);

// A step's contribution to the entries' scores from its attention weights [B, n_head, T, S]:
// h2o sums over the group's heads and the step's queries; tova averages the latest query
// over the group's heads. Returns [B, G, S] float32.
at::Tensor StepScores(const LayerPlan& plan, const at::Tensor& weights, int64_t groups);
// Whether StepScores replace the stored scores (tova) rather than add to them (h2o).
inline bool ScoresReplace(const LayerPlan& plan) { return plan.kind == PolicyKind::kTova; }

}  // namespace lgpt

#endif  // LGPT_CACHE_EVICTION_POLICY_H_
