#include <ATen/ATen.h>

#include <algorithm>
#include <limits>

#include "core/ops/attention.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

// Straightforward attention: keys repeated per head, scores masked by positions.
at::Tensor Reference(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                     const at::Tensor& query_positions, const at::Tensor& key_positions,
                     const AttentionParams& params, at::Tensor* weights_out) {
  const int64_t n_head = q.size(1), groups = keys.size(1);
  const at::Tensor k = keys.repeat_interleave(n_head / groups, 1);
  const at::Tensor v = values.repeat_interleave(n_head / groups, 1);
  at::Tensor scores = at::matmul(q, k.transpose(-1, -2)) * params.scale;  // [B, nh, T, S]
  if (params.softcap) scores = at::tanh(scores / *params.softcap) * *params.softcap;
  at::Tensor kp = key_positions.expand({q.size(0), groups, key_positions.size(2)})
                      .repeat_interleave(n_head / groups, 1)
                      .unsqueeze(2);                                 // [B, nh, 1, S]
  const at::Tensor qp = query_positions.unsqueeze(1).unsqueeze(-1);  // [B, 1, T, 1]
  at::Tensor allowed = at::logical_and(kp >= 0, kp <= qp);
  if (params.sliding_window > 0)
    allowed = at::logical_and(allowed, kp > qp - params.sliding_window);
  scores = scores.masked_fill(allowed.logical_not(), std::numeric_limits<float>::lowest());
  const at::Tensor weights = at::softmax(scores, -1);
  *weights_out = weights;
  return at::matmul(weights, v);
}

struct Case {
  int64_t steps;
  std::optional<double> softcap;
  int64_t window;
};

TEST(AttendBlockwiseTest, EqualsPlainAttentionOverTheConcatenatedSources) {
  at::manual_seed(3);
  const int64_t batch = 2, groups = 2, n_head = 6, head_size = 8;
  for (const Case& c : {Case{1, std::nullopt, 0}, Case{5, 2.5, 0}, Case{4, std::nullopt, 6}}) {
    // Three sources of 7, 4 and steps entries; slots 2 and 9 are empty, positions shuffled.
    const int64_t total = 11 + c.steps;
    const at::Tensor keys = at::randn({batch, groups, total, head_size});
    const at::Tensor values = at::randn({batch, groups, total, head_size});
    at::Tensor positions =
        at::randperm(total, at::kLong).view({1, 1, total}).repeat({batch, groups, 1});
    positions.select(2, 2).fill_(-1);
    positions.select(2, 9).fill_(-1);
    positions[1][1] = at::randperm(total, at::kLong);  // per-group positions differ
    const at::Tensor query_positions =
        at::arange(total - c.steps, total, at::kLong).unsqueeze(0).repeat({batch, 1});
    const at::Tensor q = at::randn({batch, n_head, c.steps, head_size});
    AttentionParams params;
    params.scale = 0.35;
    params.softcap = c.softcap;
    params.sliding_window = c.window;

    std::vector<KVBlockSource> sources;
    int64_t begin = 0;
    for (auto [size, block] : {std::pair<int64_t, int64_t>{7, 3}, {4, 1}, {c.steps, 0}}) {
      sources.push_back(TensorSource(keys.narrow(2, begin, size), values.narrow(2, begin, size),
                                     positions.narrow(2, begin, size)));
      sources.back().read_chunk = block;
      begin += size;
    }
    at::Tensor weights, expected_weights;
    const at::Tensor got = AttendBlockwise(q, groups, sources, query_positions, params, &weights);
    const at::Tensor expected =
        Reference(q, keys, values, query_positions, positions, params, &expected_weights);
    EXPECT_LT((got - expected).abs().max().item<double>(), 1e-5) << "steps " << c.steps;
    EXPECT_LT((weights - expected_weights).abs().max().item<double>(), 1e-6);
    EXPECT_GT(expected.abs().max().item<double>(), 0.1);
  }
}

TEST(AttendBlockwiseTest, ReadsCompressedStorageOneBlockAtATime) {
  at::manual_seed(5);
  const int64_t batch = 1, groups = 2, n_head = 4, head_size = 32, entries = 50, block = 8;
  const at::Tensor keys = at::randn({batch, groups, entries, head_size});
  const at::Tensor values = at::randn({batch, groups, entries, head_size});
  // Stored in half precision and decoded block by block, as a quantised cache does.
  const at::Tensor kq = keys.to(at::kHalf), vq = values.to(at::kHalf);
  const at::Tensor positions = at::arange(entries, at::kLong).view({1, 1, entries});
  int64_t largest_read = 0, reads = 0;
  KVBlockSource source;
  source.size = entries;
  source.read_chunk = block;
  source.positions = positions;
  source.read = [&](int64_t begin, int64_t length, at::Tensor* k, at::Tensor* v) {
    largest_read = std::max(largest_read, length);
    ++reads;
    if (k) *k = kq.narrow(2, begin, length).to(at::kFloat);
    if (v) *v = vq.narrow(2, begin, length).to(at::kFloat);
  };
  const at::Tensor q = at::randn({batch, n_head, 1, head_size});
  const at::Tensor query_positions = at::full({1, 1}, entries - 1, at::kLong);
  AttentionParams params;
  params.scale = 1.0 / std::sqrt(32.0);
  at::Tensor weights, expected_weights;
  const at::Tensor got = AttendBlockwise(q, groups, {source}, query_positions, params, &weights);
  const at::Tensor expected = Reference(q, kq.to(at::kFloat), vq.to(at::kFloat), query_positions,
                                        positions, params, &expected_weights);
  EXPECT_LT((got - expected).abs().max().item<double>(), 1e-5);
  EXPECT_EQ(largest_read, block);
  EXPECT_EQ(reads, 2 * ((entries + block - 1) / block));  // keys pass, then values pass
}

}  // namespace
}  // namespace lgpt
