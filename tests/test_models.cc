#include "tests/test_models.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "absl/strings/match.h"
#include "core/base/status_macros.h"

namespace lgpt {

absl::StatusOr<Config> ShrinkConfig(Config c) {
  c.n_layer = std::min<int64_t>(c.n_layer, 6);
  const int64_t heads = c.n_head;
  const int64_t groups = c.n_query_groups.value_or(heads);
  const int64_t q_per_kv = heads / std::max<int64_t>(groups, 1);
  const int64_t new_groups = std::min<int64_t>(groups, 2);
  c.n_query_groups = new_groups;
  c.n_head = new_groups * std::min<int64_t>(q_per_kv, 3);
  c.head_size = 16;
  c.n_embd = 32;
  c.intermediate_size = 48;
  if (c.moe_intermediate_size) c.moe_intermediate_size = 24;
  if (c.n_expert > 0) {
    c.n_expert = std::min<int64_t>(c.n_expert, 4);
    c.n_expert_per_token = std::min<int64_t>(c.n_expert_per_token, 2);
  }
  c.vocab_size = 96;
  c.padded_vocab_size = 128;
  c.block_size = 64;
  if (c.sliding_window_size) c.sliding_window_size = 4;
  if (c.attention_scores_scalar) c.attention_scores_scalar = 16;
  RETURN_IF_ERROR(c.Finalize());
  return c;
}

void RandomizeWeights(GPTImpl& model, uint64_t seed) {
  at::manual_seed(seed);
  // Gemma's norms scale by (1 + weight): centre those weights on 0 for the same magnitudes.
  const double norm_centre = model.config().NormUnitOffset() ? 0.0 : 1.0;
  at::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    at::Tensor p = item.value();
    const std::string& name = item.key();
    if (p.dim() >= 2) {
      p.normal_(0, 0.15);
    } else if (absl::EndsWith(name, "bias")) {
      p.normal_(0, 0.1);
    } else {
      p.normal_(norm_centre, 0.1);
    }
  }
}

}  // namespace lgpt
