// Eviction policies: which KV entries a budgeted cache keeps, decided per (batch row, query
// group) from each entry's token position and, for score-based policies, the attention the
// entry has received.
//
//   dense     every entry (no budget).
//   window    the `budget` most recent entries.
//   sink      StreamingLLM: the first `sink_tokens` positions plus the most recent ones.
//   h2o       Heavy-Hitter Oracle: the most recent ceil(budget · recent_fraction) entries plus
//             the entries with the largest attention weight accumulated over every query so
//             far (summed over the group's heads).
//   tova      Token Omission Via Attention: the entries with the largest weight from the
//             latest query (averaged over the group's heads), no recent window.
//   h2o-vlen  h2o whose step score weights each entry's attention by the norm of its value,
//             renormalised per query (an entry attended to for a short value matters less;
//             keys_values' VLengthH2O).
//   qh2o      Q-Hitter, for int8/int4 storage: c · score' − (1 − c) / 2 · error', with score'
//             and error' min-max normalised per (row, group) and error = |k − q(k)| + |v − q(v)|
//             of the entry under the cache's quantisation: among entries of similar score,
//             those that quantisation distorts most go first.
//
// Options of the score policies: a grace period (the newest G positions are never evicted;
// the h2o family's default is its recent window, tova's none) and score normalisation (h2o
// family: an accumulated score divided by the number of queries that have seen the entry, so
// old entries do not win by age alone). Budgets may differ per layer (layer_budgets; the
// "pyramid" rule of PyramidKV gives lower layers more).
//
// A policy turns entries into priorities (higher stays); the cache keeps the top `budget`.
// Sliding-window layers of the model keep their window whatever the policy when the budget
// covers it (so they stay exact); with a smaller budget the policy runs inside the window,
// and entries that no future query can see go first.
#ifndef LGPT_CACHE_EVICTION_POLICY_H_
#define LGPT_CACHE_EVICTION_POLICY_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lgpt {

enum class PolicyKind { kDense, kWindow, kSink, kH2O, kTova, kH2OVlen, kQH2O };

// "dense", "window", "sink", "h2o", "tova", "h2o-vlen", "qh2o".
absl::StatusOr<PolicyKind> ParsePolicyKind(absl::string_view name);
std::string PolicyName(PolicyKind kind);
const std::vector<std::string>& PolicyNames();

// Whether the policy accumulates attention scores over queries (h2o, h2o-vlen, qh2o).
bool IsH2OFamily(PolicyKind kind);

struct EvictionPolicyOptions {
  PolicyKind kind = PolicyKind::kDense;
  int64_t budget = 0;            // entries kept per layer and (row, group); ignored by dense
  int64_t sink_tokens = 4;       // sink: positions 0 .. sink_tokens-1 always stay
  double recent_fraction = 0.5;  // h2o family: share of the budget kept for the newest entries
  // Score policies: the newest `grace_period` positions are never evicted; -1: the policy's
  // default (h2o family: ceil(budget · recent_fraction); tova: none).
  int64_t grace_period = -1;
  bool normalize_scores = false;       // h2o family: accumulated score / queries that saw the entry
  double quant_weight = 0.5;           // qh2o: c, the attention score's weight against the error
  std::vector<int64_t> layer_budgets;  // one per layer; empty: `budget` on every layer
};

// Checks budget (>= 1 unless dense), sink_tokens (in [0, budget] for sink: a budget below
// them is the budget's error), recent_fraction and quant_weight (in [0, 1]), grace_period
// (>= -1) and layer_budgets (each >= 1); errors name the fields under `owner`
// ("KVCacheSpec.budget") and carry them (core/base/status_field.h).
absl::Status ValidateEvictionPolicy(const EvictionPolicyOptions& policy, absl::string_view owner);

// Budgets per layer under a rule: "uniform" (budget everywhere) or "pyramid" (PyramidKV's
// shape: linear from 1.5 · budget at the first layer to 0.5 · budget at the last, each at
// least 1, summing to about num_layers · budget).
absl::StatusOr<std::vector<int64_t>> LayerBudgets(absl::string_view rule, int64_t budget,
                                                  int64_t num_layers);

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
  bool normalize = false;   // h2o family: scores divided by the queries that saw the entry
  double quant_weight = 0.5;
  bool evicts() const { return kind != PolicyKind::kDense; }
};

// Float32 channels of policy state per entry: 0 for policies that do not score; 1 (the score)
// for h2o and tova; 2 for h2o-vlen (and the value's norm) and qh2o (and the quantisation
// error): see EntryFeature.
int64_t StateChannels(const LayerPlan& plan);

// The plan of a layer with `budget` (the options' or the layer's own), sliding `window` (0:
// none); max_sequence_length bounds the dense policy.
LayerPlan MakeLayerPlan(const EvictionPolicyOptions& options, int64_t budget, int64_t window,
                        int64_t max_sequence_length);

// Priorities of entries (higher stays): positions [B, P, S] int32 or int64 (negative: empty;
// P = 1 when the row's groups share one slot layout, else G), state [B, G, S, StateChannels]
// float32 (undefined for policies that do not score), newest [B, 1, 1] int64 (the newest
// position of each row). Returns [B, P or G, S] float64: -inf for empty entries and (windowed
// layers) entries no later query can see; protected entries (recent, sinks) rank above every
// other.
at::Tensor Priority(const LayerPlan& plan, const at::Tensor& positions, const at::Tensor& state,
                    const at::Tensor& newest);

// Priority's value for one entry at `position` (>= 0) with score channel `score`, of a row
// whose newest position is `newest`: the same double, for callers that rank entries in a host
// loop. Only for plans whose priorities need no other entry (EntryPriorityApplies: all but
// qh2o, whose normalisation spans the row).
bool EntryPriorityApplies(const LayerPlan& plan);
double EntryPriority(const LayerPlan& plan, int64_t position, double score, int64_t newest);

// Encodes and decodes keys, values [B, G, T, hs] under a layer's storage.
using RoundTrip =
    std::function<std::pair<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&)>;

// The second state channel of new entries from their full-precision keys and values
// [B, G, T, hs]: h2o-vlen the value's L2 norm; qh2o |k − k'| + |v − v'| (L2) with k', v' from
// `round_trip`. Returns [B, G, T] float32; undefined for policies with fewer channels.
at::Tensor EntryFeature(const LayerPlan& plan, const at::Tensor& keys, const at::Tensor& values,
                        const RoundTrip& round_trip);

// A step's contribution to the entries' scores from its attention weights [B, n_head, T, S]:
// the h2o family sums over the group's heads and the step's queries (h2o-vlen first weights
// each entry by value_norms [B, G, S] and renormalises every query's row); tova averages the
// latest query over the group's heads. Returns [B, G, S] float32.
at::Tensor StepScores(const LayerPlan& plan, const at::Tensor& weights, int64_t groups,
                      const at::Tensor& value_norms = at::Tensor());
// Whether StepScores replace the stored scores (tova) rather than add to them (h2o).
inline bool ScoresReplace(const LayerPlan& plan) { return plan.kind == PolicyKind::kTova; }

}  // namespace lgpt

#endif  // LGPT_CACHE_EVICTION_POLICY_H_
