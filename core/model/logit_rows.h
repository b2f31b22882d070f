// Host-side helpers over one row of float32 logits [vocab], shared by the sampler
// (core/model/sampling.cc) and the per-request token chooser (core/model/next_token.cc).
#ifndef LGPT_CORE_MODEL_LOGIT_ROWS_H_
#define LGPT_CORE_MODEL_LOGIT_ROWS_H_

#include <cstdint>
#include <vector>

namespace lgpt {

// Whether a row of logits can be sampled: no NaN, no +inf, at least one finite value.
bool LogitRowUsable(const float* values, int64_t vocab);

// The ids of the `k` largest values (0 < k <= vocab), most likely first (ties: the lower id
// first). One pass with a heap of the k best so far (its front the least likely of them): most
// ids lose one comparison against the front.
std::vector<int64_t> MostLikelyIds(const float* values, int64_t vocab, int64_t k);

}  // namespace lgpt

#endif  // LGPT_CORE_MODEL_LOGIT_ROWS_H_
