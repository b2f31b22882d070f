// Small random models of any preset, for tests and benchmarks: the preset's structure
// (norms, MLP kind, GQA ratio, windows, softcapping, RoPE variant) at a size that runs in
// milliseconds.
#ifndef LGPT_TESTS_TEST_MODELS_H_
#define LGPT_TESTS_TEST_MODELS_H_

#include "absl/status/statusor.h"
#include "core/config/config.h"
#include "core/model/gpt.h"

namespace lgpt {

// Shrinks an unfinalised preset (from PresetFromName) and finalises it: at most 6 layers
// (enough for Gemma 3's 5:1 local/global pattern), 16-wide heads, at most 2 query groups,
// window 4, vocabulary 96 padded to 128, block size 64.
absl::StatusOr<Config> ShrinkConfig(Config config);

// Re-draws every parameter with magnitudes that make differences visible (norm weights near
// 1, biases near 0, matrices N(0, 0.15²)).
void RandomizeWeights(GPTImpl& model, uint64_t seed);

}  // namespace lgpt

#endif  // LGPT_TESTS_TEST_MODELS_H_
