// One query's row of attention scores as the CPU kernels (decode_attention, flash_attention)
// turn it into softmax weights: scaled, soft-capped and masked by positions (the mask rule of
// core/ops/attention_mask.h), then exponentiated against a maximum.
#ifndef LGPT_CORE_OPS_SCORE_ROW_H_
#define LGPT_CORE_OPS_SCORE_ROW_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/ops/attention_mask.h"
#include "core/ops/simd_avx2.h"

namespace lgpt {

// s[e] (q·k of key e) -> scaled and soft-capped, or the lowest float where the key at
// key_positions[e] is not visible from `query_position`. Returns the largest visible score;
// the lowest float when no key is visible.
inline float MaskScores(float* s, int64_t entries, int64_t query_position,
                        const KeyPositionRun& key_positions, const AttentionParams& params) {
  const float scale = static_cast<float>(params.scale);
  const float lowest = std::numeric_limits<float>::lowest();
  float max_score = lowest;
  for (int64_t e = 0; e < entries; ++e) {
    float x = s[e] * scale;
    if (params.softcap) {
      const float cap = static_cast<float>(*params.softcap);
      x = std::tanh(x / cap) * cap;
    }
    s[e] = KeyAllowed(query_position, key_positions[e], params.sliding_window) ? x
                                                                                       : lowest;
    max_score = std::max(max_score, s[e]);
  }
  return max_score;
}

// s[e] = exp(s[e] - max_score) in place; returns their sum (simd::ExpAndSum with `avx2`).
inline float ExpAndSum(float* s, int64_t entries, float max_score, bool avx2) {
#ifdef LGPT_SIMD_AVX2
  if (avx2) return simd::ExpAndSum(s, entries, max_score);
#endif
  float total = 0;
  for (int64_t e = 0; e < entries; ++e) {
    s[e] = std::exp(s[e] - max_score);
    total += s[e];
  }
  return total;
}

}  // namespace lgpt

#endif  // LGPT_CORE_OPS_SCORE_ROW_H_
