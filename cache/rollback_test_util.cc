#include "cache/rollback_test_util.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace lgpt {
namespace {

KVStep Step(int64_t start, int64_t length, bool sequential) {
  KVStep step;
  step.positions = at::arange(start, start + length, at::kLong).unsqueeze(0);  // [1, T]
  step.min_position = start;
  step.max_position = start + length - 1;
  step.sequential = sequential;
  return step;
}

// The same entries (keys, values [1, G, T, hs]) and queries [1, 2G, T, hs] for a position of
// a layer, whichever step they come in.
struct Inputs {
  at::Tensor q, k, v;
};
Inputs InputsFor(const KVLayerSpec& spec, int64_t layer, int64_t start, int64_t length) {
  std::vector<at::Tensor> q, k, v;
  for (int64_t p = start; p < start + length; ++p) {
    at::manual_seed(7919 * layer + p);
    q.push_back(at::randn({1, 2 * spec.n_query_groups, 1, spec.head_size}));
    k.push_back(at::randn({1, spec.n_query_groups, 1, spec.head_size}));
    v.push_back(at::randn({1, spec.n_query_groups, 1, spec.head_size}));
  }
  return {at::cat(q, 2), at::cat(k, 2), at::cat(v, 2)};
}

// One step of every layer; the outputs [1, 2G, T, hs] per layer, empty on an error.
std::vector<at::Tensor> Run(KVCache& cache, const KVCacheGeometry& geometry, const KVStep& step) {
  const int64_t start = step.min_position, length = step.positions.size(1);
  std::vector<at::Tensor> outputs;
  absl::Status check = cache.CheckStep(step, 1);
  EXPECT_TRUE(check.ok()) << check;
  if (!check.ok()) return {};
  for (size_t layer = 0; layer < geometry.layers.size(); ++layer) {
    const KVLayerSpec& spec = geometry.layers[layer];
    const Inputs in = InputsFor(spec, static_cast<int64_t>(layer), start, length);
    AttentionParams params;
    params.scale = 1.0 / std::sqrt(static_cast<double>(spec.head_size));
    params.sliding_window = spec.sliding_window;
    absl::StatusOr<at::Tensor> y =
        cache.UpdateAndAttend(static_cast<int64_t>(layer), step, in.q, in.k, in.v, params);
    EXPECT_TRUE(y.ok()) << y.status();
    if (!y.ok()) return {};
    outputs.push_back(*y);
  }
  return outputs;
}

double LargestDifference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size() || a.empty()) return std::numeric_limits<double>::infinity();
  double largest = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].sizes() != b[i].sizes()) return std::numeric_limits<double>::infinity();
    largest = std::max(largest, (a[i] - b[i]).abs().max().item<double>());
  }
  return largest;
}

}  // namespace

double RollbackDifference(KVCache& speculating, KVCache& plain, const RollbackStream& stream) {
  const KVCacheGeometry& g = stream.geometry;
  for (KVCache* cache : {&speculating, &plain}) {
    if (Run(*cache, g, Step(0, stream.prompt, false)).empty()) return HUGE_VAL;
    for (int64_t p = stream.prompt; p < stream.begin; ++p) {
      if (Run(*cache, g, Step(p, 1, false)).empty()) return HUGE_VAL;
    }
  }
  double largest = 0;
  const std::vector<at::Tensor> verified =
      Run(speculating, g, Step(stream.begin, stream.step, /*sequential=*/true));
  if (verified.empty()) return HUGE_VAL;
  KVRollback* rollback = speculating.rollback();
  EXPECT_NE(rollback, nullptr);
  if (rollback == nullptr) return HUGE_VAL;
  const absl::Status truncated = rollback->Truncate(stream.begin + stream.keep);
  EXPECT_TRUE(truncated.ok()) << truncated;
  if (!truncated.ok()) return HUGE_VAL;
  for (int64_t i = 0; i < stream.keep; ++i) {
    const std::vector<at::Tensor> decoded = Run(plain, g, Step(stream.begin + i, 1, false));
    std::vector<at::Tensor> row;
    for (const at::Tensor& y : verified) row.push_back(y.narrow(2, i, 1));
    largest = std::max(largest, LargestDifference(row, decoded));
  }
  for (int64_t p = stream.begin + stream.keep; p < stream.total; ++p) {
    largest = std::max(largest, LargestDifference(Run(speculating, g, Step(p, 1, false)),
                                                  Run(plain, g, Step(p, 1, false))));
  }
  return largest;
}

}  // namespace lgpt
