// Which pieces a model is assembled from: the linear factory every projection comes from
// and the attention extensions every attention layer calls. The base model uses the
// defaults; PEFT variants pass their own, so no model code is copied into a variant.
#ifndef LGPT_CORE_MODEL_MODEL_PARTS_H_
#define LGPT_CORE_MODEL_MODEL_PARTS_H_

#include <memory>
#include <vector>

#include "attention/attention_extension.h"
#include "core/nn/linear_factory.h"

namespace lgpt {

struct ModelParts {
  std::shared_ptr<const LinearFactory> linear_factory;  // null: plain projections
  std::vector<std::shared_ptr<const AttentionExtensionFactory>> attention_extensions;
};

}  // namespace lgpt

#endif  // LGPT_CORE_MODEL_MODEL_PARTS_H_
