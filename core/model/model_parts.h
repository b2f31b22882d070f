// Which pieces a model is assembled from: the linear factory every projection comes from
// and the attention extensions every attention layer calls. The base model uses the
// defaults; PEFT variants pass their own, so no model code is copied into a variant.
#ifndef LGPT_CORE_MODEL_MODEL_PARTS_H_
#define LGPT_CORE_MODEL_MODEL_PARTS_H_

#include <memory>
#include <vector>

#include "attention/attention_extension.h"
#include "cache/kv_cache.h"
#include "core/nn/linear_factory.h"
#include "core/nn/norm.h"

namespace lgpt {

struct ModelParts {
  std::shared_ptr<const LinearFactory> linear_factory;  // null: plain projections
  std::vector<std::shared_ptr<const AttentionExtensionFactory>> attention_extensions;
  // Set on every layer of the model's cache layout (tensor parallelism over replicated KV
  // groups); null: none.
  std::shared_ptr<const KVScoreReducer> kv_score_reducer;
  // OLMo 2's whole-width q and k norms over tensor-parallel ranks (each rank holds its heads'
  // and groups' features); null: the norms see every feature.
  std::shared_ptr<const NormFeatureShards> q_norm_shards;
  std::shared_ptr<const NormFeatureShards> k_norm_shards;
};

}  // namespace lgpt

#endif  // LGPT_CORE_MODEL_MODEL_PARTS_H_
