#include "core/ops/flash_attention_grad.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/ops/attention.h"
#include "core/ops/flash_attention.h"
#include "core/ops/gemv.h"

namespace lgpt {
namespace {

struct Case {
  int64_t batch, groups, q_per_kv, steps, cached, head_size, window;
  bool softcap;
  bool holes;  // row 1 has empty slots; with `cached`, its first queries see no key at all
};

struct Inputs {
  at::Tensor q, keys, values, query_positions, key_positions, grad_out;
  AttentionParams params;
};

// Queries at positions cached .. cached + steps - 1 against keys 0 .. cached + steps - 1, in
// float64 (the reference's precision).
Inputs MakeInputs(const Case& c) {
  at::manual_seed(c.steps * 131 + c.cached * 7 + c.head_size + c.groups);
  const int64_t n_head = c.groups * c.q_per_kv, entries = c.cached + c.steps;
  Inputs in;
  in.q = at::randn({c.batch, n_head, c.steps, c.head_size}, at::kDouble);
  in.keys = at::randn({c.batch, c.groups, entries, c.head_size}, at::kDouble);
  in.values = at::randn({c.batch, c.groups, entries, c.head_size}, at::kDouble);
  in.grad_out = at::randn({c.batch, n_head, c.steps, c.head_size}, at::kDouble);
  in.key_positions =
      at::arange(entries, at::kLong).view({1, 1, -1}).repeat({c.batch, 1, 1}).contiguous();
  if (c.holes && c.batch > 1) {
    // Row 1: the cache's entries and the first query's own slot are empty, so with a short
    // window its first queries see nothing (the mean-of-values rule).
    in.key_positions[1].narrow(1, 0, std::min(entries, c.cached + 1)).fill_(-1);
  }
  in.query_positions =
      at::arange(c.cached, entries, at::kLong).view({1, -1}).repeat({c.batch, 1}).contiguous();
  in.params.scale = 1.0 / std::sqrt(static_cast<double>(c.head_size));
  if (c.softcap) in.params.softcap = 2.0;  // small: the tanh derivative matters
  in.params.sliding_window = c.window;
  return in;
}

struct Result {
  at::Tensor y, dq, dk, dv;
  std::string node;  // the autograd node that made y
};

// y and the gradients of sum(y · grad_out) through AttendByPositions (`flash` false: the
// generic path's autograd, in the inputs' dtype) or FlashAttentionTrainable.
Result RunAttention(const Inputs& in, at::ScalarType dtype, bool direct, bool use_avx2 = true) {
  const at::Tensor q = in.q.to(dtype).detach().requires_grad_(true);
  const at::Tensor k = in.keys.to(dtype).detach().requires_grad_(true);
  const at::Tensor v = in.values.to(dtype).detach().requires_grad_(true);
  Result r;
  r.y = direct ? FlashAttentionTrainable(q, k, v, in.query_positions, in.key_positions, in.params,
                                         use_avx2)
               : AttendByPositions(q, k, v, in.query_positions, in.key_positions, in.params);
  r.node = r.y.grad_fn() ? r.y.grad_fn()->name() : "";
  (r.y * in.grad_out.to(dtype)).sum().backward();
  r.y = r.y.detach();
  r.dq = q.grad();
  r.dk = k.grad();
  r.dv = v.grad();
  return r;
}

// |got - want| <= tolerance · max(max |want|, 1) (float32 against the float64 reference).
void ExpectNear(const at::Tensor& got, const at::Tensor& want, double tolerance,
                const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  // At least 1: a gradient that is 0 in exact arithmetic (one visible key) is rounding here.
  const double scale = std::max(want.abs().max().item<double>(), 1.0);
  const double diff = (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>();
  EXPECT_LE(diff, tolerance * scale) << what << ": diff " << diff << ", max " << scale;
}

void ExpectResultNear(const Result& got, const Result& want, double tolerance,
                      const std::string& what) {
  ExpectNear(got.y, want.y, tolerance, what + " y");
  ExpectNear(got.dq, want.dq, tolerance, what + " dq");
  ExpectNear(got.dk, want.dk, tolerance, what + " dk");
  ExpectNear(got.dv, want.dv, tolerance, what + " dv");
}

class FlashAttentionGradCases : public ::testing::TestWithParam<Case> {};

// float32 through the flash kernels against float64 autograd through the generic path.
TEST_P(FlashAttentionGradCases, GradientsEqualTheGenericPath) {
  const Case c = GetParam();
  const Inputs in = MakeInputs(c);
  const Result want = RunAttention(in, at::kDouble, /*direct=*/false);
  EXPECT_EQ(want.node.find("FlashAttention"), std::string::npos) << want.node;
  // AttendByPositions dispatches float32 in training to the trainable flash kernel.
  const Result got = RunAttention(in, at::kFloat, /*direct=*/false);
  EXPECT_NE(got.node.find("FlashAttentionFunction"), std::string::npos) << got.node;
  ExpectResultNear(got, want, 1e-4, "dispatched");
  // Portable loops and AVX2: both match the reference and each other.
  const Result portable = RunAttention(in, at::kFloat, /*direct=*/true, /*use_avx2=*/false);
  ExpectResultNear(portable, want, 1e-4, "portable");
  if (CpuHasAvx2Fma()) {
    const Result avx2 = RunAttention(in, at::kFloat, /*direct=*/true, /*use_avx2=*/true);
    ExpectResultNear(avx2, want, 1e-4, "avx2");
    ExpectResultNear(avx2, portable, 1e-5, "avx2 vs portable");
  }
}

// The training forward is the inference kernel's: the same bits as FlashAttention without
// autograd.
TEST_P(FlashAttentionGradCases, ForwardEqualsTheInferenceKernel) {
  const Case c = GetParam();
  const Inputs in = MakeInputs(c);
  const at::Tensor q = in.q.to(at::kFloat), k = in.keys.to(at::kFloat);
  const at::Tensor v = in.values.to(at::kFloat);
  at::Tensor inference;
  {
    at::NoGradGuard no_grad;
    auto runs_of = [&](int64_t b, int64_t g, std::vector<KVRun>* runs) {
      KVRun run;
      run.keys = k.data_ptr<float>() + (b * c.groups + g) * k.size(2) * c.head_size;
      run.values = v.data_ptr<float>() + (b * c.groups + g) * v.size(2) * c.head_size;
      run.positions = KeyPositionRun::Of(in.key_positions, b, g);
      run.entries = k.size(2);
      runs->push_back(run);
    };
    inference = FlashAttention(q, c.groups, runs_of, in.query_positions, in.params);
  }
  const at::Tensor trained = FlashAttentionTrainable(
      q.requires_grad_(true), k, v, in.query_positions, in.key_positions, in.params);
  EXPECT_TRUE(at::equal(trained.detach(), inference));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, FlashAttentionGradCases,
    ::testing::Values(
        // Causal prefill, n_head 6 in 2, 1 and 6 groups; T = 1, 17, 65, 130; hs 32 and 64.
        Case{1, 2, 3, 130, 0, 32, 0, false, false}, Case{2, 1, 6, 65, 0, 64, 0, false, false},
        Case{2, 6, 1, 17, 0, 32, 0, false, false}, Case{1, 2, 3, 1, 0, 32, 0, false, false},
        // A query block offset into a longer key sequence (chunked training).
        Case{2, 2, 3, 17, 100, 64, 0, false, false}, Case{1, 2, 3, 1, 40, 32, 0, false, false},
        // Sliding window, soft-capping, both with an offset.
        Case{2, 2, 3, 130, 0, 32, 16, false, false}, Case{1, 2, 3, 65, 0, 32, 0, true, false},
        Case{2, 2, 3, 40, 70, 64, 24, true, false},
        // Head size 20 (portable only), empty slots and queries that see no key.
        Case{2, 3, 2, 66, 5, 20, 7, true, true}, Case{2, 2, 3, 30, 9, 32, 3, false, true},
        // Many key and query tiles.
        Case{2, 2, 3, 300, 0, 32, 0, false, false}));

// More threads than (row, group) pairs: the key tiles are shared out and the partial dQs
// summed; the result equals one share's within rounding.
TEST(FlashAttentionGrad, SharedKeyTilesGiveTheSameGradients) {
  const Case c{1, 1, 4, 200, 30, 32, 0, false, false};
  const Inputs in = MakeInputs(c);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const Result one = RunAttention(in, at::kFloat, /*direct=*/true);
  at::set_num_threads(4);
  const Result four = RunAttention(in, at::kFloat, /*direct=*/true);
  at::set_num_threads(threads);
  EXPECT_TRUE(at::equal(one.y, four.y));
  EXPECT_TRUE(at::equal(one.dk, four.dk));
  EXPECT_TRUE(at::equal(one.dv, four.dv));
  ExpectNear(four.dq, one.dq, 1e-6, "dq");
}

// Views (the model's q, k, v are transposes of the qkv projection) and keys shared by the
// batch (an expanded adapter prefix) get the gradients autograd gives the generic path.
TEST(FlashAttentionGrad, StridedAndExpandedInputs) {
  at::manual_seed(3);
  const int64_t batch = 2, steps = 37, groups = 2, n_head = 6, hs = 32;
  const at::Tensor qkv = at::randn({batch, steps, (n_head + 2 * groups) * hs}, at::kDouble);
  const at::Tensor prefix = at::randn({1, groups, 9, hs}, at::kDouble);
  const at::Tensor query_positions = at::arange(steps, at::kLong).view({1, -1}).repeat({2, 1});
  const at::Tensor key_positions = query_positions.unsqueeze(1);
  AttentionParams params;
  params.scale = 0.2;
  std::vector<at::Tensor> grads[2];
  for (const at::ScalarType dtype : {at::kDouble, at::kFloat}) {
    const at::Tensor x = qkv.to(dtype).detach().requires_grad_(true);
    const at::Tensor p = prefix.to(dtype).detach().requires_grad_(true);
    const at::Tensor q =
        x.narrow(-1, 0, n_head * hs).view({batch, steps, n_head, hs}).transpose(1, 2);
    const at::Tensor k =
        x.narrow(-1, n_head * hs, groups * hs).view({batch, steps, groups, hs}).transpose(1, 2);
    const at::Tensor v = x.narrow(-1, (n_head + groups) * hs, groups * hs)
                             .view({batch, steps, groups, hs})
                             .transpose(1, 2);
    const at::Tensor y = AttendByPositions(q, k, v, query_positions, key_positions, params);
    const at::Tensor zeros = at::zeros({batch, steps}, at::kLong);
    const at::Tensor y_prefix =
        AttendByPositions(q, p.expand({batch, -1, -1, -1}), p.expand({batch, -1, -1, -1}), zeros,
                          at::zeros({batch, 1, 9}, at::kLong), params);
    if (dtype == at::kFloat) {
      EXPECT_NE(y_prefix.grad_fn()->name().find("FlashAttentionFunction"), std::string::npos);
    }
    (y.sin().sum() + y_prefix.cos().sum()).backward();
    grads[dtype == at::kFloat] = {x.grad(), p.grad()};
  }
  ExpectNear(grads[1][0], grads[0][0], 1e-4, "qkv");
  ExpectNear(grads[1][1], grads[0][1], 1e-4, "prefix");
}

}  // namespace
}  // namespace lgpt
