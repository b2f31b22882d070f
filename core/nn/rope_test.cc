// Rope against LitGPT's build_rope_cache / apply_rope / apply_rope_interleave (model.py),
// re-derived here in double precision: inverse frequencies (plain, linear, Llama 3 and YaRN
// scaling, local base), the rotation of each (first, second half) or (even, odd) pair, and
// the properties RoPE exists for.
#include "core/nn/rope.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "core/config/config.h"

namespace lgpt {
namespace {

const at::Device kCpu(at::kCPU);

struct RopeCase {
  std::string label;
  int64_t head_size = 16;
  double rotary_percentage = 1.0;
  double rope_base = 10000;
  int64_t condense_ratio = 1;
  std::optional<RopeAdjustments> adjustments;
  std::optional<double> local_base;
};

Config MakeConfig(const RopeCase& c) {
  Config config;
  config.name = "rope-test";
  config.n_layer = 2;
  config.n_head = 2;
  config.n_embd = 2 * c.head_size;
  config.vocab_size = 64;
  config.padding_multiple = 64;
  config.mlp_class = MlpClass::kGptNeoxMLP;
  config.rotary_percentage = c.rotary_percentage;
  config.rope_base = c.rope_base;
  config.rope_condense_ratio = c.condense_ratio;
  config.rope_adjustments = c.adjustments;
  if (c.local_base) {
    config.rope_local_base_freq = c.local_base;
    config.rope_indices = std::vector<int>{0, 1};
  }
  const absl::Status status = config.Finalize();
  EXPECT_TRUE(status.ok()) << status;
  return config;
}

double YarnGetMscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// LitGPT's build_rope_cache: the inverse frequency theta_i of pair i, i < n_elem / 2.
std::vector<double> ReferenceTheta(const Config& config, bool local) {
  const int64_t n = config.rope_n_elem;
  const double base = local ? *config.rope_local_base_freq : config.rope_base;
  std::vector<double> theta;
  for (int64_t i = 0; i < n / 2; ++i) theta.push_back(1.0 / std::pow(base, 2.0 * i / n));
  if (local || !config.rope_adjustments) return theta;
  const RopeAdjustments& adj = *config.rope_adjustments;
  const double factor = *adj.factor;
  if (adj.IsYarn()) {
    const double original = *adj.original_max_seq_len;
    auto correction_dim = [&](double rotations) {
      return n * std::log(original / (rotations * 2 * M_PI)) / (2 * std::log(base));
    };
    double low = correction_dim(*adj.beta_fast), high = correction_dim(*adj.beta_slow);
    if (adj.truncate.value_or(true)) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(n / 2 - 1));
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < n / 2; ++i) {
      const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      // LitGPT: interpolation * (1 - ramp) + extrapolation * ramp.
      theta[i] = theta[i] / factor * (1 - ramp) + theta[i] * ramp;
    }
  } else if (adj.original_max_seq_len) {
    const double low_freq = *adj.low_freq_factor, high_freq = *adj.high_freq_factor;
    for (double& t : theta) {
      const double ratio = *adj.original_max_seq_len / (2 * M_PI / t);
      const double smooth = std::clamp((ratio - low_freq) / (high_freq - low_freq), 0.0, 1.0);
      t = (1 - smooth) * (t / factor) + smooth * t;
    }
  } else {
    for (double& t : theta) t /= factor;
  }
  return theta;
}

// LitGPT's attention_scaling (YaRN's mscale ratio; 1 otherwise).
double ReferenceScaling(const Config& config) {
  if (!config.rope_adjustments || !config.rope_adjustments->IsYarn()) return 1.0;
  const RopeAdjustments& adj = *config.rope_adjustments;
  const double factor = *adj.factor;
  const double mscale = adj.mscale.value_or(0), all_dim = adj.mscale_all_dim.value_or(0);
  if (mscale != 0 && all_dim != 0) {
    return YarnGetMscale(factor, mscale) / YarnGetMscale(factor, all_dim);
  }
  if (all_dim != 0) return YarnGetMscale(factor, all_dim);
  if (mscale != 0) return YarnGetMscale(factor, mscale);
  return 1.0;
}

// Rotates pair i of each head by angle positions[b, t] / condense_ratio * theta[i], times
// `scale`. Pairs are (i, i + n/2) (apply_rope) or (2i, 2i + 1) (apply_rope_interleave,
// whose output holds the even features first, then the odd ones). Features from n on pass
// through. Returns double.
at::Tensor ReferenceRope(const at::Tensor& x, const at::Tensor& positions,
                         const std::vector<double>& theta, int64_t condense_ratio, bool interleave,
                         double scale) {
  const at::Tensor xd = x.to(at::kDouble).contiguous();
  const int64_t batch = x.size(0), heads = x.size(1), steps = x.size(2), hs = x.size(3);
  const int64_t half = static_cast<int64_t>(theta.size()), n = 2 * half;
  at::Tensor out = xd.clone();
  auto in = xd.accessor<double, 4>();
  auto o = out.accessor<double, 4>();
  const at::Tensor pos = positions.to(at::kLong).contiguous();
  auto p = pos.accessor<int64_t, 2>();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t t = 0; t < steps; ++t) {
        for (int64_t i = 0; i < half; ++i) {
          const double angle = static_cast<double>(p[b][t]) / condense_ratio * theta[i];
          const double a = interleave ? in[b][h][t][2 * i] : in[b][h][t][i];
          const double c = interleave ? in[b][h][t][2 * i + 1] : in[b][h][t][i + half];
          o[b][h][t][i] = scale * (a * std::cos(angle) - c * std::sin(angle));
          o[b][h][t][i + half] = scale * (c * std::cos(angle) + a * std::sin(angle));
        }
        for (int64_t i = n; i < hs; ++i) o[b][h][t][i] = in[b][h][t][i];
      }
    }
  }
  return out;
}

void ExpectClose(const at::Tensor& actual, const at::Tensor& expected, double tol) {
  ASSERT_EQ(actual.sizes(), expected.sizes());
  const at::Tensor a = actual.to(at::kDouble), e = expected.to(at::kDouble);
  EXPECT_TRUE(at::allclose(a, e, /*rtol=*/tol, /*atol=*/tol))
      << "max abs diff " << (a - e).abs().max().item<double>();
}

RopeAdjustments Llama3(double factor, double low, double high, double original) {
  RopeAdjustments adj;
  adj.factor = factor;
  adj.low_freq_factor = low;
  adj.high_freq_factor = high;
  adj.original_max_seq_len = original;
  return adj;
}

RopeAdjustments Yarn(double factor, double original, std::optional<double> mscale,
                     std::optional<double> mscale_all_dim, std::optional<bool> truncate) {
  RopeAdjustments adj;
  adj.factor = factor;
  adj.beta_fast = 32;
  adj.beta_slow = 1;
  adj.original_max_seq_len = original;
  adj.mscale = mscale;
  adj.mscale_all_dim = mscale_all_dim;
  adj.truncate = truncate;
  return adj;
}

RopeAdjustments Linear(double factor) {
  RopeAdjustments adj;
  adj.factor = factor;
  return adj;
}

std::vector<RopeCase> Cases() {
  std::vector<RopeCase> cases;
  cases.push_back({"plain"});
  cases.push_back({"partial", 16, 0.5});
  cases.push_back({"partial-25", 32, 0.25, 500000});
  cases.push_back({"condensed", 16, 1.0, 10000, 4});
  // Over n = 16 the Llama 3 smooth factor is 1 for the fast pairs, fractional in between
  // and 0 for the slow ones.
  cases.push_back({"llama3", 16, 1.0, 10000, 1, Llama3(8, 1, 4, 2000)});
  cases.push_back({"linear", 16, 1.0, 10000, 1, Linear(4)});
  // The YaRN ramp runs over pairs 2..6 of 8.
  cases.push_back({"yarn", 16, 1.0, 10000, 1, Yarn(40, 4096, 1.0, 1.0, std::nullopt)});
  cases.push_back({"yarn-mscale", 16, 1.0, 10000, 1, Yarn(40, 4096, 0.707, std::nullopt, false)});
  cases.push_back({"yarn-all-dim", 16, 1.0, 10000, 1, Yarn(40, 4096, std::nullopt, 1.0, true)});
  cases.push_back({"yarn-ratio", 16, 1.0, 10000, 1, Yarn(40, 4096, 1.0, 0.5, std::nullopt)});
  RopeCase local{"local", 16, 0.5, 1000000};
  local.local_base = 10000;
  cases.push_back(local);
  return cases;
}

TEST(Rope, InverseFrequenciesMatchBuildRopeCache) {
  for (const RopeCase& c : Cases()) {
    SCOPED_TRACE(c.label);
    const Config config = MakeConfig(c);
    const Rope rope(config, kCpu);
    ASSERT_EQ(rope.n_elem(), config.rope_n_elem);
    EXPECT_EQ(rope.has_local(), c.local_base.has_value());
    for (const bool local : {false, true}) {
      if (local && !rope.has_local()) continue;
      // At position condense_ratio the angle of pair i is theta_i (< pi), in both halves.
      const at::Tensor position = at::full({1, 1}, c.condense_ratio, at::kLong);
      const RopeTables rotation = rope.RotationTables(position, local);
      const int64_t n = config.rope_n_elem, half = n / 2;
      ASSERT_EQ(rotation.cos.sizes(), at::IntArrayRef({1, 1, n}));
      ASSERT_EQ(rotation.cos.scalar_type(), at::kFloat);
      const at::Tensor angle = at::atan2(rotation.sin, rotation.cos).to(at::kDouble).view({n});
      const std::vector<double> theta = ReferenceTheta(config, local);
      for (int64_t i = 0; i < half; ++i) {
        EXPECT_NEAR(angle[i].item<double>(), theta[i], 1e-6 * theta[i] + 1e-12) << "pair " << i;
        EXPECT_NEAR(angle[i + half].item<double>(), theta[i], 1e-6 * theta[i] + 1e-12);
      }
      // Tables add LitGPT's attention scaling (YaRN's mscale) to both cos and sin.
      const RopeTables tables = rope.Tables(position, local);
      const double scaling = ReferenceScaling(config);
      ExpectClose(tables.cos, rotation.cos * scaling, 1e-6);
      ExpectClose(tables.sin, rotation.sin * scaling, 1e-6);
    }
  }
}

TEST(Rope, YarnScalingIsNotTrivialInTheseCases) {
  // Guards the cases above: each YaRN case scales, and the ratio case differs from both.
  for (const RopeCase& c : Cases()) {
    if (!c.adjustments || !c.adjustments->IsYarn()) continue;
    SCOPED_TRACE(c.label);
    const Config config = MakeConfig(c);
    const double scaling = ReferenceScaling(config);
    if (c.label == "yarn") {
      EXPECT_EQ(scaling, 1.0);  // mscale == mscale_all_dim
    } else {
      EXPECT_GT(std::abs(scaling - 1.0), 0.05);
    }
  }
}

TEST(Rope, ApplyRopeMatchesReference) {
  at::manual_seed(0);
  at::NoGradGuard no_grad;
  for (const RopeCase& c : Cases()) {
    const Config config = MakeConfig(c);
    const Rope rope(config, kCpu);
    for (const bool local : {false, true}) {
      if (local && !rope.has_local()) continue;
      for (const bool interleave : {false, true}) {
        // Float32 half-split rotations take the CPU loop (split over threads past 32 tokens);
        // interleaved ones LibTorch's path.
        for (const int64_t steps : {1, 2, 3, 9, 10, 40}) {
          SCOPED_TRACE(testing::Message() << c.label << " local " << local << " interleave "
                                          << interleave << " steps " << steps);
          const at::Tensor positions = at::randint(0, 48, {2, steps}, at::kLong);
          // Heads from a [B, T, H, hs] view, as the attention's q and k are, and (odd steps)
          // a view whose features are not contiguous either.
          const at::Tensor x = steps % 2 == 0
                                   ? at::randn({2, steps, 3, c.head_size}).transpose(1, 2)
                                   : at::randn({c.head_size, 2, 3, steps}).permute({1, 2, 3, 0});
          const RopeTables tables = rope.Tables(positions, local);
          const at::Tensor y = ApplyRope(x, tables, interleave);
          EXPECT_EQ(y.scalar_type(), at::kFloat);
          ExpectClose(y,
                      ReferenceRope(x, positions, ReferenceTheta(config, local), c.condense_ratio,
                                    interleave, ReferenceScaling(config)),
                      1e-5);
        }
      }
    }
  }
}

// The rotation as LibTorch operations (ApplyRope's general path): x [B, H, T, hs].
at::Tensor RopeByOperations(const at::Tensor& x, const RopeTables& tables) {
  const int64_t n_elem = tables.cos.size(-1), half = n_elem / 2;
  if (n_elem == 0) return x;
  const at::Tensor part = x.narrow(-1, 0, n_elem);
  const at::Tensor rotated =
      at::cat({-part.narrow(-1, half, n_elem - half), part.narrow(-1, 0, half)}, -1);
  const at::Tensor roped = part * tables.cos.unsqueeze(1) + rotated * tables.sin.unsqueeze(1);
  return at::cat({roped, x.narrow(-1, n_elem, x.size(-1) - n_elem)}, -1);
}

// The one-pass split of the fused projection gives exactly what narrowing, reshaping and the
// rotation as LibTorch operations give, for full, partial and no rotary features, grouped
// keys, decode steps and prefill chunks (split over threads).
TEST(Rope, SplitQkvRopeEqualsViewsAndApplyRope) {
  at::manual_seed(4);
  at::NoGradGuard no_grad;
  for (const double percentage : {1.0, 0.25, 0.0}) {
    RopeCase c;
    c.rotary_percentage = percentage;
    const Config config = MakeConfig(c);
    const Rope rope(config, kCpu);
    const int64_t hs = c.head_size, heads = 4, groups = 2;
    for (const int64_t steps : {1, 3, 4, 5, 100}) {
      SCOPED_TRACE(testing::Message() << "rotary " << percentage << " steps " << steps);
      const at::Tensor qkv = at::randn({2, steps, (heads + 2 * groups) * hs});
      const RopeTables tables = rope.Tables(at::randint(0, 48, {2, steps}, at::kLong), false);
      at::Tensor q, k, v;
      ASSERT_TRUE(SplitQkvRope(qkv, heads, groups, hs, tables, false, &q, &k, &v));
      auto heads_of = [&](int64_t offset, int64_t n) {
        return qkv.narrow(-1, offset, n * hs).reshape({2, steps, n, hs}).transpose(1, 2);
      };
      EXPECT_TRUE(at::equal(q, RopeByOperations(heads_of(0, heads), tables)));
      EXPECT_TRUE(at::equal(k, RopeByOperations(heads_of(heads * hs, groups), tables)));
      EXPECT_TRUE(at::equal(q, ApplyRope(heads_of(0, heads), tables, false)));
      EXPECT_TRUE(at::equal(v, heads_of((heads + groups) * hs, groups)));
      EXPECT_TRUE(q.is_contiguous() && k.is_contiguous() && v.is_contiguous());
    }
  }
  // Where it does not apply it says so and the caller takes the general path.
  const Config config = MakeConfig(RopeCase{});
  const Rope rope(config, kCpu);
  const int64_t width = 4 * 16;
  at::Tensor q, k, v;
  const RopeTables one = rope.Tables(at::zeros({1, 1}, at::kLong), false);
  EXPECT_FALSE(SplitQkvRope(at::randn({1, 1, width}), 2, 1, 16, one, true, &q, &k, &v));
  EXPECT_FALSE(SplitQkvRope(at::randn({1, 1, width}).to(at::kDouble), 2, 1, 16, one, false, &q,
                            &k, &v));
  at::AutoGradMode with_grad(true);  // autograd on: LibTorch's differentiable path
  EXPECT_FALSE(SplitQkvRope(at::randn({1, 1, width}).requires_grad_(), 2, 1, 16, one, false,
                            &q, &k, &v));
  EXPECT_FALSE(q.defined());
}

TEST(Rope, KeepsDtypeOfHalfPrecisionInputs) {
  at::manual_seed(1);
  const Config config = MakeConfig({"partial", 16, 0.5});
  const Rope rope(config, kCpu);
  const at::Tensor positions = at::randint(0, 48, {2, 3}, at::kLong);
  const at::Tensor x = at::randn({2, 3, 3, 16}).to(at::kBFloat16);
  const at::Tensor y = ApplyRope(x, rope.Tables(positions, false), false);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  ExpectClose(y, ReferenceRope(x, positions, ReferenceTheta(config, false), 1, false, 1.0), 2e-2);
}

TEST(Rope, FeaturesBeyondRopeNElemAreUntouched) {
  at::manual_seed(2);
  const Config config = MakeConfig({"partial-25", 32, 0.25, 500000});
  ASSERT_EQ(config.rope_n_elem, 8);
  const Rope rope(config, kCpu);
  for (const bool interleave : {false, true}) {
    for (const int64_t steps : {2, 7}) {
      const at::Tensor positions = at::randint(1, 1000, {2, steps}, at::kLong);
      const at::Tensor x = at::randn({2, 4, steps, 32});
      const at::Tensor y = ApplyRope(x, rope.Tables(positions, false), interleave);
      EXPECT_TRUE(at::equal(y.narrow(-1, 8, 24), x.narrow(-1, 8, 24)));
      EXPECT_FALSE(at::allclose(y.narrow(-1, 0, 8), x.narrow(-1, 0, 8)));
    }
  }
}

TEST(Rope, RotationPreservesTheNormOfEachPair) {
  at::manual_seed(3);
  for (const RopeCase& c :
       {RopeCase{"plain"}, RopeCase{"llama3", 16, 1.0, 10000, 1, Llama3(8, 1, 4, 2000)}}) {
    const Config config = MakeConfig(c);
    const Rope rope(config, kCpu);
    const int64_t half = config.rope_n_elem / 2;
    for (const bool interleave : {false, true}) {
      for (const int64_t steps : {2, 6}) {
        SCOPED_TRACE(testing::Message() << c.label << " interleave " << interleave);
        const at::Tensor positions = at::randint(0, 4000, {2, steps}, at::kLong);
        const at::Tensor x = at::randn({2, 3, steps, 16});
        const at::Tensor y = ApplyRope(x, rope.Tables(positions, false), interleave);
        // Input pairs (i, i + half) or (2i, 2i + 1); output pairs (i, i + half).
        at::Tensor x_a, x_b;
        if (interleave) {
          const at::Tensor pairs = x.view({2, 3, steps, half, 2});
          x_a = pairs.select(-1, 0);
          x_b = pairs.select(-1, 1);
        } else {
          x_a = x.narrow(-1, 0, half);
          x_b = x.narrow(-1, half, half);
        }
        const at::Tensor y_a = y.narrow(-1, 0, half), y_b = y.narrow(-1, half, half);
        ExpectClose(y_a * y_a + y_b * y_b, x_a * x_a + x_b * x_b, 1e-5);
        EXPECT_FALSE(at::allclose(y_a, x_a));
      }
    }
  }
}

// Sum over heads and features of q . k, per batch row: [B].
at::Tensor Dot(const at::Tensor& q, const at::Tensor& k) {
  return (q.to(at::kDouble) * k.to(at::kDouble)).sum({1, 2, 3});
}

TEST(Rope, QueryKeyProductDependsOnlyOnPositionDifference) {
  at::manual_seed(4);
  for (const RopeCase& c :
       {RopeCase{"plain"}, RopeCase{"partial", 16, 0.5},
        RopeCase{"llama3", 16, 1.0, 10000, 1, Llama3(8, 1, 4, 2000)},
        RopeCase{"yarn-all-dim", 16, 1.0, 10000, 1, Yarn(40, 4096, std::nullopt, 1.0, true)}}) {
    const Config config = MakeConfig(c);
    const Rope rope(config, kCpu);
    for (const bool interleave : {false, true}) {
      SCOPED_TRACE(testing::Message() << c.label << " interleave " << interleave);
      const at::Tensor q = at::randn({1, 2, 1, 16}), k = at::randn({1, 2, 1, 16});
      auto product = [&](int64_t q_pos, int64_t k_pos) {
        const at::Tensor qp = at::full({1, 1}, q_pos, at::kLong);
        const at::Tensor kp = at::full({1, 1}, k_pos, at::kLong);
        return Dot(ApplyRope(q, rope.Tables(qp, false), interleave),
                   ApplyRope(k, rope.Tables(kp, false), interleave))
            .item<double>();
      };
      for (const int64_t d : {0, 1, 5, 17}) {
        const double reference = product(3, 3 + d);
        for (const int64_t s : {1, 10, 40}) {
          EXPECT_NEAR(product(3 + s, 3 + s + d), reference, 1e-4 * (1 + std::abs(reference)))
              << "d " << d << " s " << s;
        }
      }
      // ... and does depend on the difference.
      EXPECT_GT(std::abs(product(3, 4) - product(3, 9)), 1e-3);
    }
  }
}

TEST(Rope, RotationTablesComposeAdditively) {
  // Rotating by p then by -s equals rotating by p - s. Roped features are in the half-split
  // layout (apply_rope_interleave returns evens then odds), so the second rotation is the
  // half-split one.
  at::manual_seed(5);
  for (const RopeCase& c : Cases()) {
    const Config config = MakeConfig(c);
    const Rope rope(config, kCpu);
    for (const bool local : {false, true}) {
      if (local && !rope.has_local()) continue;
      for (const bool interleave : {false, true}) {
        for (const int64_t steps : {2, 6}) {
          SCOPED_TRACE(testing::Message() << c.label << " local " << local << " interleave "
                                          << interleave << " steps " << steps);
          const at::Tensor p = at::randint(20, 60, {2, steps}, at::kLong);
          const at::Tensor s = at::randint(0, 20, {2, steps}, at::kLong);
          const at::Tensor x = at::randn({2, 3, steps, c.head_size});
          const at::Tensor roped = ApplyRope(x, rope.RotationTables(p, local), interleave);
          const at::Tensor shifted =
              ApplyRope(roped, rope.RotationTables(-s, local), /*interleave=*/false);
          ExpectClose(shifted, ApplyRope(x, rope.RotationTables(p - s, local), interleave), 1e-5);
          // The full tables of YaRN carry the magnitude factor; the rotation ones do not.
          const double scaling = ReferenceScaling(config);
          ExpectClose(ApplyRope(x, rope.Tables(p, local), interleave), roped * scaling, 1e-5);
        }
      }
    }
  }
}

TEST(Rope, InterleavedRotationOfRopedFeaturesRegathersThem) {
  // Documents why a shift of already roped keys must use the half-split layout: applying
  // the interleaved rotation again gathers the features a second time, even by 0.
  at::manual_seed(6);
  const Config config = MakeConfig({"plain"});
  const Rope rope(config, kCpu);
  const at::Tensor p = at::randint(20, 60, {1, 3}, at::kLong);
  const at::Tensor x = at::randn({1, 2, 3, 16});
  const at::Tensor roped = ApplyRope(x, rope.RotationTables(p, false), true);
  const at::Tensor zero = at::zeros({1, 3}, at::kLong);
  ExpectClose(ApplyRope(roped, rope.RotationTables(zero, false), false), roped, 1e-6);
  EXPECT_FALSE(at::allclose(ApplyRope(roped, rope.RotationTables(zero, false), true), roped));
}

TEST(Rope, GradientsFlowThroughApplyRope) {
  // With autograd the LibTorch path is taken; it must agree with the reference too.
  at::manual_seed(7);
  const Config config = MakeConfig({"partial", 16, 0.5});
  const Rope rope(config, kCpu);
  const at::Tensor positions = at::randint(0, 48, {2, 2}, at::kLong);
  const at::Tensor x = at::randn({2, 3, 2, 16}).requires_grad_(true);
  const at::Tensor y = ApplyRope(x, rope.Tables(positions, false), false);
  ASSERT_TRUE(y.requires_grad());
  ExpectClose(y.detach(),
              ReferenceRope(x.detach(), positions, ReferenceTheta(config, false), 1, false, 1.0),
              1e-5);
  // Rotations are orthogonal: the gradient of sum(y^2) / 2 is x.
  (y * y).sum().div(2).backward();
  ExpectClose(x.grad(), x.detach(), 1e-5);
}

}  // namespace
}  // namespace lgpt
