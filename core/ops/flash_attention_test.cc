#include "core/ops/flash_attention.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <vector>

#include "core/ops/attention.h"

namespace lgpt {
namespace {

struct Case {
  int64_t groups, q_per_kv, steps, cached, head_size, window;
  bool softcap;
  int64_t block_size;  // > 0: the keys arrive in blocks of this many entries (two sources)
};

class FlashAttentionCases : public ::testing::TestWithParam<Case> {};

// Against the generic path (full scores, mask, softmax), which AttendBlockwise takes when the
// weights are asked for: equal within float rounding, for AVX2 and portable loops alike.
TEST_P(FlashAttentionCases, EqualsTheGenericPath) {
  at::NoGradGuard no_grad;
  const Case c = GetParam();
  const int64_t batch = 2, n_head = c.groups * c.q_per_kv, hs = c.head_size;
  const int64_t entries = c.cached + c.steps;
  at::manual_seed(c.steps * 31 + c.cached + hs);
  const at::Tensor q = at::randn({batch, n_head, c.steps, hs});
  const at::Tensor keys = at::randn({batch, c.groups, entries, hs});
  const at::Tensor values = at::randn({batch, c.groups, entries, hs});
  // Cached entries then the prompt's; row 1 has three empty slots and starts later.
  at::Tensor key_positions = at::arange(entries, at::kLong).view({1, 1, -1}).repeat({batch, 1, 1});
  key_positions[1].narrow(1, 0, std::min<int64_t>(3, entries)).fill_(-1);
  const at::Tensor query_positions =
      at::arange(c.cached, entries, at::kLong).view({1, -1}).repeat({batch, 1});
  AttentionParams params;
  params.scale = 1.0 / std::sqrt(static_cast<double>(hs));
  if (c.softcap) params.softcap = 3.0;
  params.sliding_window = c.window;
  std::vector<KVBlockSource> sources;
  if (c.block_size > 0) {
    const int64_t split = entries / 3;
    for (auto [begin, length] : {std::pair<int64_t, int64_t>{0, split},
                                 std::pair<int64_t, int64_t>{split, entries - split}}) {
      KVBlockSource source = TensorSource(keys.narrow(2, begin, length),
                                          values.narrow(2, begin, length),
                                          key_positions.narrow(2, begin, length));
      source.read_chunk = c.block_size;
      sources.push_back(source);
    }
  } else {
    sources.push_back(TensorSource(keys, values, key_positions));
  }
  at::Tensor weights;
  const at::Tensor expected =
      AttendBlockwise(q, c.groups, sources, query_positions, params, &weights);
  const at::Tensor flash = AttendBlockwise(q, c.groups, sources, query_positions, params);
  EXPECT_TRUE(at::allclose(flash, expected, 1e-5, 1e-5))
      << (flash - expected).abs().max().item<float>();
  // The kernel itself, portable loops and AVX2.
  auto runs_of = [&](int64_t b, int64_t g, std::vector<KVRun>* runs) {
    KVRun run;
    run.keys = keys.data_ptr<float>() + (b * c.groups + g) * entries * hs;
    run.values = values.data_ptr<float>() + (b * c.groups + g) * entries * hs;
    run.positions = KeyPositionRun(key_positions.data_ptr<int64_t>() + b * entries, 1);
    run.entries = entries;
    runs->push_back(run);
  };
  for (const bool avx2 : {false, CpuHasAvx2Fma()}) {
    const at::Tensor y = FlashAttention(q, c.groups, runs_of, query_positions, params, avx2);
    EXPECT_TRUE(at::allclose(y, expected, 1e-5, 1e-5))
        << "avx2 " << avx2 << ": " << (y - expected).abs().max().item<float>();
    // Deterministic: the same bits again, whatever the threads' shares or the addresses.
    const at::Tensor again =
        FlashAttention(q.clone(), c.groups, runs_of, query_positions, params, avx2);
    EXPECT_TRUE(at::equal(y, again)) << "avx2 " << avx2;
  }
  EXPECT_TRUE(at::equal(flash, AttendBlockwise(q.clone(), c.groups, sources, query_positions,
                                               params)));
  // int32 key positions (the policy caches' index): the same bits.
  std::vector<KVBlockSource> narrow = sources;
  for (KVBlockSource& source : narrow) source.positions = source.positions.to(at::kInt);
  EXPECT_TRUE(
      at::equal(flash, AttendBlockwise(q.clone(), c.groups, narrow, query_positions, params)));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, FlashAttentionCases,
    ::testing::Values(Case{1, 1, 5, 0, 8, 0, false, 0}, Case{2, 3, 40, 0, 32, 0, false, 0},
                      Case{1, 4, 100, 37, 64, 0, false, 0}, Case{4, 1, 130, 0, 64, 16, false, 0},
                      Case{2, 2, 70, 10, 24, 0, true, 0}, Case{1, 8, 17, 200, 16, 0, false, 0},
                      Case{3, 2, 66, 5, 20, 7, true, 0},  // portable only (hs % 8 != 0)
                      Case{2, 3, 90, 30, 32, 0, false, 16}, Case{1, 2, 33, 0, 64, 9, false, 5},
                      Case{2, 1, 300, 0, 128, 0, false, 64}));

// A query that sees no key (all slots empty) gets the mean of the values, as the masked
// softmax's uniform weights give.
TEST(FlashAttention, QueryWithNoVisibleKeyGetsTheMeanOfTheValues) {
  at::NoGradGuard no_grad;
  const at::Tensor q = at::randn({1, 2, 6, 8});
  const at::Tensor keys = at::randn({1, 1, 9, 8});
  const at::Tensor values = at::randn({1, 1, 9, 8});
  const at::Tensor key_positions = at::full({1, 1, 9}, -1, at::kLong);
  const at::Tensor query_positions = at::arange(6, at::kLong).view({1, -1});
  const at::Tensor y = AttendBlockwise(q, 1, {TensorSource(keys, values, key_positions)},
                                       query_positions, AttentionParams{});
  const at::Tensor mean = values.mean(2, /*keepdim=*/true).expand({1, 2, 6, 8});
  EXPECT_TRUE(at::allclose(y, mean, 1e-5, 1e-6));
}

}  // namespace
}  // namespace lgpt
