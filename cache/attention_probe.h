// A KV cache decorator that measures where the attention goes: how much of each head's
// attention weight lands on the sequence's first tokens. Whether a model keeps "attention
// sinks" there (StreamingLLM) decides whether the sink policy can beat a plain window, so
// //tools:eval_cache reports it next to the perplexities.
//
// The probe forwards storage to the wrapped cache and attends over the wrapped cache's views
// (KVCache's default UpdateAndAttend) to see the weights: quantised caches are decoded whole
// each step, and the decode-step kernel is not used: a measuring tool, not a serving cache.
#ifndef LGPT_CACHE_ATTENTION_PROBE_H_
#define LGPT_CACHE_ATTENTION_PROBE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/kv_cache.h"

namespace lgpt {

struct AttentionProbeOptions {
  int64_t first_tokens = 4;         // positions 0 .. first_tokens - 1 count as the start
  int64_t min_query_position = 64;  // only queries this far in are measured
};

// Mean attention weight on the first tokens, per layer and head, over the measured queries.
struct AttentionStartMass {
  std::vector<std::vector<double>> per_head;  // [layer][head]
  std::vector<double> uniform;                // [layer]: the mass under uniform attention
  std::vector<int64_t> queries;               // [layer]: (row, query) pairs measured
};

class AttentionProbe : public KVCache, public KVAttentionScorer {
 public:
  // Fails when `inner` is null or the options are out of range.
  static absl::StatusOr<std::unique_ptr<AttentionProbe>> Create(
      std::unique_ptr<KVCache> inner, const AttentionProbeOptions& options);

  absl::StatusOr<KVView> Update(int64_t layer, const KVStep& step, const at::Tensor& keys,
                                const at::Tensor& values) override;
  absl::Status CheckStep(const KVStep& step, int64_t batch_size) const override {
    return inner_->CheckStep(step, batch_size);
  }
  // Resets the wrapped cache; the measurements accumulate across resets (segments).
  void Reset() override { inner_->Reset(); }
  int64_t AllocatedBytes() const override { return inner_->AllocatedBytes(); }
  int64_t IndexBytes() const override { return inner_->IndexBytes(); }
  int64_t max_sequence_length() const override { return inner_->max_sequence_length(); }
  int64_t batch_size() const override { return inner_->batch_size(); }
  int64_t num_layers() const override { return inner_->num_layers(); }
  // Every step's weights, measured, then handed to the wrapped cache's scorer when it wants them.
  KVAttentionScorer* attention_scorer() override { return this; }
  bool WantsAttentionWeights(int64_t layer) const override { return true; }
  void ObserveAttentionWeights(int64_t layer, const at::Tensor& weights) override;
  std::string DebugName() const override { return "probe(" + inner_->DebugName() + ")"; }

  AttentionStartMass Result() const;

 private:
  AttentionProbe(std::unique_ptr<KVCache> inner, const AttentionProbeOptions& options);

  struct LayerStats {
    at::Tensor query_positions;  // [B, T] of the last step
    at::Tensor key_positions;    // [B, 1 or G, S] of the last view
    std::vector<double> head_sums;
    double uniform_sum = 0;
    int64_t queries = 0;
  };

  std::unique_ptr<KVCache> inner_;
  AttentionProbeOptions options_;
  std::vector<LayerStats> layers_;
};

}  // namespace lgpt

#endif  // LGPT_CACHE_ATTENTION_PROBE_H_
