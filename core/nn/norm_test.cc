// Norm against the textbook formulas of LitGPT's RMSNorm (model.py) and torch.nn.LayerNorm,
// written out here in double precision.
#include "core/nn/norm.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/config/config.h"

namespace lgpt {
namespace {

std::map<std::string, at::Tensor> Params(const torch::nn::Module& module) {
  std::map<std::string, at::Tensor> params;
  for (const auto& item : module.named_parameters()) params[item.key()] = item.value();
  return params;
}

void ExpectClose(const at::Tensor& actual, const at::Tensor& expected, double tol = 1e-5) {
  ASSERT_EQ(actual.sizes(), expected.sizes());
  const at::Tensor a = actual.to(at::kDouble), e = expected.to(at::kDouble);
  EXPECT_TRUE(at::allclose(a, e, /*rtol=*/tol, /*atol=*/tol))
      << "max abs diff " << (a - e).abs().max().item<double>();
}

// LitGPT's RMSNorm: x / sqrt(mean(x^2) + eps) * (weight or 1 + weight), in double.
at::Tensor ReferenceRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps,
                            bool unit_offset) {
  const at::Tensor xd = x.to(at::kDouble);
  const int64_t size = xd.size(-1);
  const at::Tensor mean_square = (xd * xd).sum(-1, /*keepdim=*/true) / static_cast<double>(size);
  at::Tensor y = xd / at::sqrt(mean_square + eps);
  if (weight.defined()) y = y * (weight.to(at::kDouble) + (unit_offset ? 1.0 : 0.0));
  return y;
}

// torch.nn.LayerNorm: (x - mean) / sqrt(biased variance + eps) * weight + bias, in double.
at::Tensor ReferenceLayerNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                              double eps) {
  const at::Tensor xd = x.to(at::kDouble);
  const double size = static_cast<double>(xd.size(-1));
  const at::Tensor mean = xd.sum(-1, /*keepdim=*/true) / size;
  const at::Tensor centred = xd - mean;
  const at::Tensor variance = (centred * centred).sum(-1, /*keepdim=*/true) / size;
  at::Tensor y = centred / at::sqrt(variance + eps);
  if (weight.defined()) y = y * weight.to(at::kDouble);
  if (bias.defined()) y = y + bias.to(at::kDouble);
  return y;
}

// Randomises the parameters (the defaults, ones and zeros, would hide a missing scale).
void RandomiseParams(torch::nn::Module& module) {
  at::NoGradGuard no_grad;
  for (auto& p : module.parameters()) p.normal_();
}

NormOptions Options(NormClass kind, int64_t size, double eps, bool unit_offset = false,
                    bool affine = true) {
  NormOptions options;
  options.kind = kind;
  options.size = size;
  options.eps = eps;
  options.unit_offset = unit_offset;
  options.affine = affine;
  return options;
}

// Float32 rows take the CPU loop (split over threads past 32 rows); with autograd the
// LibTorch path.
const std::vector<std::vector<int64_t>> kShapes = {{1, 1, 24}, {2, 3, 24}, {3, 7, 24}, {8, 40, 24}};

TEST(RmsNorm, ParametersAreNamedAsLitGpt) {
  Norm norm(Options(NormClass::kRMSNorm, 24, 1e-6));
  const auto params = Params(*norm);
  ASSERT_EQ(params.size(), 1u);
  ASSERT_TRUE(params.count("weight"));
  EXPECT_EQ(params.at("weight").sizes(), at::IntArrayRef({24}));
  // LitGPT's RMSNorm starts from ones.
  EXPECT_TRUE(at::equal(params.at("weight"), at::ones({24})));
}

TEST(RmsNorm, MatchesReferenceWithAndWithoutUnitOffset) {
  at::manual_seed(0);
  for (const bool unit_offset : {false, true}) {
    for (const double eps : {1e-6, 0.5}) {
      Norm norm(Options(NormClass::kRMSNorm, 24, eps, unit_offset));
      RandomiseParams(*norm);
      const at::Tensor weight = Params(*norm).at("weight");
      for (const auto& shape : kShapes) {
        SCOPED_TRACE(testing::Message() << "unit_offset " << unit_offset << " eps " << eps
                                        << " rows " << shape[0] * shape[1]);
        const at::Tensor x = at::randn(shape) * 3;
        const at::Tensor expected = ReferenceRmsNorm(x, weight, eps, unit_offset);
        {
          at::NoGradGuard no_grad;
          const at::Tensor y = norm->forward(x);
          EXPECT_EQ(y.scalar_type(), at::kFloat);
          ExpectClose(y, expected);
        }
        // With autograd (weight requires grad) the LibTorch path is taken.
        ExpectClose(norm->forward(x).detach(), expected);
      }
    }
  }
}

// A row's bits do not depend on the rows beside it: a decoding row in a prefill pass equals
// its own step.
TEST(RmsNorm, ARowHasTheSameBitsInAnyBatch) {
  at::manual_seed(2);
  Norm norm(Options(NormClass::kRMSNorm, 1024, 1e-5));
  RandomiseParams(*norm);
  at::NoGradGuard no_grad;
  const at::Tensor x = at::randn({300, 1024}), delta = at::randn({300, 1024});
  const at::Tensor all = norm->forward(x);
  at::Tensor sum;
  const at::Tensor all_added = norm->AddForward(x, delta, &sum);
  for (int64_t r : {0, 17, 299}) {
    EXPECT_TRUE(at::equal(all[r], norm->forward(x[r].unsqueeze(0))[0])) << "row " << r;
    at::Tensor one_sum;
    EXPECT_TRUE(at::equal(all_added[r],
                          norm->AddForward(x[r].unsqueeze(0), delta[r].unsqueeze(0), &one_sum)[0]))
        << "row " << r;
  }
}

// The residual step before a norm: one pass while decoding, the same values as adding and
// normalising (and, for LayerNorm or with autograd, exactly that).
TEST(Norm, AddForwardEqualsAddingThenNormalising) {
  at::manual_seed(5);
  for (const NormClass kind : {NormClass::kRMSNorm, NormClass::kLayerNorm}) {
    for (const bool unit_offset : {false, true}) {
      Norm norm(Options(kind, 24, 1e-5, unit_offset && kind == NormClass::kRMSNorm));
      RandomiseParams(*norm);
      for (const int64_t rows : {1, 3, 40}) {
        SCOPED_TRACE(testing::Message() << "layer_norm " << (kind == NormClass::kLayerNorm)
                                        << " unit_offset " << unit_offset << " rows " << rows);
        const at::Tensor x = at::randn({rows, 1, 24}), delta = at::randn({rows, 1, 24});
        at::NoGradGuard no_grad;
        at::Tensor sum;
        const at::Tensor y = norm->AddForward(x, delta, &sum);
        EXPECT_TRUE(at::equal(sum, delta + x));
        EXPECT_TRUE(at::equal(y, norm->forward(delta + x)));
      }
    }
  }
}

TEST(RmsNorm, UnitOffsetScalesByOnePlusWeight) {
  // A zero weight with the offset is the plain normalisation; without it, zero output.
  at::manual_seed(1);
  const at::Tensor x = at::randn({2, 5, 24});
  Norm offset(Options(NormClass::kRMSNorm, 24, 1e-6, /*unit_offset=*/true));
  Norm plain(Options(NormClass::kRMSNorm, 24, 1e-6, /*unit_offset=*/false));
  {
    at::NoGradGuard no_grad;
    Params(*offset).at("weight").zero_();
    Params(*plain).at("weight").zero_();
  }
  ExpectClose(offset->forward(x).detach(), ReferenceRmsNorm(x, at::Tensor(), 1e-6, false));
  EXPECT_TRUE(at::equal(plain->forward(x).detach(), at::zeros_like(x)));
}

TEST(RmsNorm, ComputesInFloat32ForHalfInputs) {
  // x^2 overflows float16 (max 65504) for |x| ~ 1000: computing in float16 would give
  // inf and a zero output; LitGPT computes in float32 and casts back.
  at::manual_seed(2);
  for (const at::ScalarType dtype : {at::kHalf, at::kBFloat16}) {
    Norm norm(Options(NormClass::kRMSNorm, 24, 1e-6));
    RandomiseParams(*norm);
    const at::Tensor weight = Params(*norm).at("weight");
    const at::Tensor x = (at::randn({2, 3, 24}) * 1000).to(dtype);
    at::NoGradGuard no_grad;
    const at::Tensor y = norm->forward(x);
    EXPECT_EQ(y.scalar_type(), dtype);
    ASSERT_TRUE(at::isfinite(y).all().item<bool>());
    // Float32 result rounded to the input dtype: equal up to one rounding of the output.
    const at::Tensor expected = ReferenceRmsNorm(x, weight, 1e-6, false).to(dtype);
    ExpectClose(y, expected, dtype == at::kHalf ? 1e-3 : 8e-3);
  }
}

TEST(LayerNorm, ParametersAreNamedAsLitGpt) {
  Norm norm(Options(NormClass::kLayerNorm, 24, 1e-5));
  const auto params = Params(*norm);
  ASSERT_EQ(params.size(), 2u);
  ASSERT_TRUE(params.count("weight"));
  ASSERT_TRUE(params.count("bias"));
  EXPECT_TRUE(at::equal(params.at("weight"), at::ones({24})));
  EXPECT_TRUE(at::equal(params.at("bias"), at::zeros({24})));
  // Without affine parameters (OLMo 1's elementwise_affine=False): none at all.
  Norm bare(Options(NormClass::kLayerNorm, 24, 1e-5, false, /*affine=*/false));
  EXPECT_TRUE(Params(*bare).empty());
}

TEST(LayerNorm, MatchesReferenceWithAndWithoutAffine) {
  at::manual_seed(3);
  for (const bool affine : {true, false}) {
    for (const double eps : {1e-5, 0.5}) {
      Norm norm(Options(NormClass::kLayerNorm, 24, eps, false, affine));
      RandomiseParams(*norm);
      const auto params = Params(*norm);
      const at::Tensor weight = affine ? params.at("weight") : at::Tensor();
      const at::Tensor bias = affine ? params.at("bias") : at::Tensor();
      for (const auto& shape : kShapes) {
        SCOPED_TRACE(testing::Message() << "affine " << affine << " eps " << eps);
        const at::Tensor x = at::randn(shape) * 3 + 1;
        ExpectClose(norm->forward(x).detach(), ReferenceLayerNorm(x, weight, bias, eps));
      }
    }
  }
}

Config NormConfig(const std::string& name, NormClass kind, double eps) {
  Config config;
  config.name = name;
  config.norm_class = kind;
  config.norm_eps = eps;
  config.n_layer = 2;
  config.n_embd = 32;
  config.n_head = 4;
  config.vocab_size = 100;
  config.padding_multiple = 64;
  config.mlp_class = MlpClass::kGptNeoxMLP;
  EXPECT_TRUE(config.Finalize().ok());
  return config;
}

TEST(NormOptions, FromConfigFollowsLitGptNormClass) {
  struct Case {
    std::string name;
    NormClass kind;
    bool unit_offset;
    bool affine;
  };
  // LitGPT's Config.norm_class: RMSNorm(add_unit_offset="Gemma" in name); LayerNorm with
  // elementwise_affine=False when "OLMo" in name; torch.nn.LayerNorm otherwise.
  const Case cases[] = {
      {"pythia-14m", NormClass::kLayerNorm, false, true},
      {"Llama-3.2-1B", NormClass::kRMSNorm, false, true},
      {"Gemma-2b", NormClass::kRMSNorm, true, true},
      {"gemma-3-1b-it", NormClass::kRMSNorm, false, true},  // case-sensitive, as in LitGPT
      {"Gemma-2b", NormClass::kLayerNorm, false, true},
      {"OLMo-1B-hf", NormClass::kLayerNorm, false, false},
      {"OLMo-2-1124-7B", NormClass::kRMSNorm, false, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Config config = NormConfig(c.name, c.kind, 3e-6);
    const NormOptions options = NormOptions::FromConfig(config, 40);
    EXPECT_EQ(options.kind, c.kind);
    EXPECT_EQ(options.size, 40);
    EXPECT_EQ(options.eps, 3e-6);
    EXPECT_EQ(options.unit_offset, c.unit_offset);
    EXPECT_EQ(options.affine, c.affine);

    // The module built from them computes the chosen norm.
    at::manual_seed(4);
    Norm norm(options);
    RandomiseParams(*norm);
    const auto params = Params(*norm);
    const at::Tensor x = at::randn({2, 9, 40}) + 0.5;
    const at::Tensor weight = c.affine ? params.at("weight") : at::Tensor();
    const at::Tensor expected =
        c.kind == NormClass::kRMSNorm
            ? ReferenceRmsNorm(x, weight, 3e-6, c.unit_offset)
            : ReferenceLayerNorm(x, weight, c.affine ? params.at("bias") : at::Tensor(), 3e-6);
    ExpectClose(norm->forward(x).detach(), expected);
  }
}

// A norm whose features two ranks hold half each equals the whole norm: each half's sum of
// squares plus the other's, divided by all the features. (One process plays both ranks: the
// shards add the other half's sums.)
class OtherHalf : public NormFeatureShards {
 public:
  OtherHalf(at::Tensor other_sums, int64_t total) : other_(other_sums), total_(total) {}
  void SumOverRanks(at::Tensor& partial) const override { partial.add_(other_); }
  int64_t total_size() const override { return total_; }

 private:
  at::Tensor other_;
  int64_t total_;
};

TEST(NormTest, FeaturesSplitOverRanksEqualTheWholeNorm) {
  at::manual_seed(11);
  NormOptions whole_options;
  whole_options.size = 48;
  whole_options.eps = 1e-6;
  Norm whole(whole_options);
  RandomiseParams(*whole);
  const at::Tensor weight = Params(*whole).at("weight");
  const at::Tensor x = at::randn({3, 5, 48}) * 2;  // [B, T, features]
  const at::Tensor expected = whole->forward(x).detach();
  std::vector<at::Tensor> halves, unshared;  // unshared: each half's own mean square
  for (int rank = 0; rank < 2; ++rank) {
    const at::Tensor mine = x.narrow(-1, rank * 24, 24);
    const at::Tensor other = x.narrow(-1, (1 - rank) * 24, 24);
    for (bool shared : {true, false}) {
      NormOptions options = whole_options;
      options.size = 24;
      if (shared) options.shards = std::make_shared<OtherHalf>((other * other).sum(-1, true), 48);
      Norm half(options);
      {
        at::NoGradGuard no_grad;
        Params(*half).at("weight").copy_(weight.narrow(0, rank * 24, 24));
      }
      (shared ? halves : unshared).push_back(half->forward(mine).detach());
    }
  }
  ExpectClose(at::cat(halves, -1), expected);
  EXPECT_FALSE(at::allclose(at::cat(unshared, -1), expected, 1e-3, 1e-3));  // the test can fail
}

}  // namespace
}  // namespace lgpt
