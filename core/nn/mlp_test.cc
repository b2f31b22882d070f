// The feed-forward modules against LitGPT's GptNeoxMLP, LLaMAMLP, GemmaMLP and LLaMAMoE
// (model.py), re-computed here in double precision from the modules' own parameters with
// the textbook activations (erf and tanh GELU, SiLU) and, for the MoE, a per-token loop.
#include "core/nn/mlp.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/config/config.h"
#include "core/nn/linear_factory.h"

namespace lgpt {
namespace {

using Params = std::map<std::string, at::Tensor>;

Params NamedParams(const torch::nn::Module& module) {
  Params params;
  for (const auto& item : module.named_parameters()) params[item.key()] = item.value();
  return params;
}

std::set<std::string> Names(const Params& params) {
  std::set<std::string> names;
  for (const auto& [name, value] : params) names.insert(name);
  return names;
}

// Random parameters, biases included (LitGPT's init leaves biases zero, which would hide
// a dropped bias).
void Randomise(torch::nn::Module& module) {
  at::NoGradGuard no_grad;
  for (auto& p : module.parameters()) p.normal_(0, 0.3);
}

void ExpectClose(const at::Tensor& actual, const at::Tensor& expected, double tol = 1e-5) {
  ASSERT_EQ(actual.sizes(), expected.sizes());
  const at::Tensor a = actual.to(at::kDouble), e = expected.to(at::kDouble);
  EXPECT_TRUE(at::allclose(a, e, /*rtol=*/tol, /*atol=*/tol))
      << "max abs diff " << (a - e).abs().max().item<double>();
}

at::Tensor D(const at::Tensor& t) { return t.detach().to(at::kDouble); }

// nn.Linear: x W^T + b.
at::Tensor Linear(const at::Tensor& x, const Params& p, const std::string& name) {
  at::Tensor y = at::matmul(D(x), D(p.at(name + ".weight")).t());
  const auto bias = p.find(name + ".bias");
  if (bias != p.end()) y = y + D(bias->second);
  return y;
}

// F.gelu(approximate="none"): z Phi(z).
at::Tensor GeluErf(const at::Tensor& z) { return 0.5 * z * (1 + at::erf(z / std::sqrt(2.0))); }
// F.gelu(approximate="tanh").
at::Tensor GeluTanh(const at::Tensor& z) {
  return 0.5 * z * (1 + at::tanh(std::sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z)));
}
at::Tensor Gelu(const at::Tensor& z, const std::string& approximate) {
  return approximate == "tanh" ? GeluTanh(z) : GeluErf(z);
}
// F.silu: z sigmoid(z).
at::Tensor Silu(const at::Tensor& z) { return z / (1 + at::exp(-z)); }

// GptNeoxMLP.forward.
at::Tensor GptNeoxReference(const at::Tensor& x, const Params& p, const std::string& prefix,
                            const std::string& approximate) {
  return Linear(Gelu(Linear(x, p, prefix + "fc"), approximate), p, prefix + "proj");
}
// LLaMAMLP.forward.
at::Tensor LLaMAReference(const at::Tensor& x, const Params& p, const std::string& prefix) {
  return Linear(Silu(Linear(x, p, prefix + "fc_1")) * Linear(x, p, prefix + "fc_2"), p,
                prefix + "proj");
}
// GemmaMLP.forward.
at::Tensor GemmaReference(const at::Tensor& x, const Params& p, const std::string& prefix,
                          const std::string& approximate) {
  return Linear(Gelu(Linear(x, p, prefix + "fc_1"), approximate) * Linear(x, p, prefix + "fc_2"), p,
                prefix + "proj");
}

Config MlpConfig(MlpClass mlp_class, bool bias, const std::string& approximate) {
  Config config;
  config.name = "mlp-test";
  config.n_layer = 3;
  config.n_embd = 16;
  config.n_head = 2;
  config.vocab_size = 64;
  config.padding_multiple = 64;
  config.mlp_class = mlp_class;
  config.bias = bias;
  config.gelu_approximate = approximate;
  config.intermediate_size = 24;
  return config;
}

void Finalize(Config& config) {
  const absl::Status status = config.Finalize();
  ASSERT_TRUE(status.ok()) << status;
}

// Few rows without autograd take the gemv path of the projections; many rows at::linear.
const std::vector<std::vector<int64_t>> kShapes = {{1, 1, 16}, {2, 9, 16}};

void CheckForward(FeedForwardImpl& mlp, const std::function<at::Tensor(const at::Tensor&)>& ref) {
  for (const auto& shape : kShapes) {
    SCOPED_TRACE(testing::Message() << "rows " << shape[0] * shape[1]);
    const at::Tensor x = at::randn(shape);
    const at::Tensor expected = ref(x);
    {
      at::NoGradGuard no_grad;
      ExpectClose(mlp.forward(x), expected);
    }
    const at::Tensor y = mlp.forward(x);
    EXPECT_TRUE(y.requires_grad());
    ExpectClose(y, expected);
  }
}

std::set<std::string> WithBias(std::vector<std::string> layers, bool bias) {
  std::set<std::string> names;
  for (const std::string& layer : layers) {
    names.insert(layer + ".weight");
    if (bias) names.insert(layer + ".bias");
  }
  return names;
}

TEST(GptNeoxMlp, ParametersAreNamedAsLitGpt) {
  for (const bool bias : {true, false}) {
    Config config = MlpConfig(MlpClass::kGptNeoxMLP, bias, "none");
    Finalize(config);
    MlpImpl mlp(config, MlpClass::kGptNeoxMLP, 24, 0, -1, *DefaultLinearFactory());
    const Params p = NamedParams(mlp);
    EXPECT_EQ(Names(p), WithBias({"fc", "proj"}, bias));
    EXPECT_EQ(p.at("fc.weight").sizes(), at::IntArrayRef({24, 16}));
    EXPECT_EQ(p.at("proj.weight").sizes(), at::IntArrayRef({16, 24}));
  }
}

TEST(GptNeoxMlp, MatchesReference) {
  at::manual_seed(0);
  for (const std::string approximate : {"none", "tanh"}) {
    for (const bool bias : {true, false}) {
      SCOPED_TRACE(testing::Message() << approximate << " bias " << bias);
      Config config = MlpConfig(MlpClass::kGptNeoxMLP, bias, approximate);
      Finalize(config);
      MlpImpl mlp(config, MlpClass::kGptNeoxMLP, 24, 0, -1, *DefaultLinearFactory());
      Randomise(mlp);
      const Params p = NamedParams(mlp);
      CheckForward(mlp,
                   [&](const at::Tensor& x) { return GptNeoxReference(x, p, "", approximate); });
    }
  }
}

TEST(GptNeoxMlp, GeluApproximationIsDistinguishable) {
  // Guards the test above: the two GELUs differ by more than its tolerance here.
  at::manual_seed(1);
  Config config = MlpConfig(MlpClass::kGptNeoxMLP, true, "none");
  Finalize(config);
  MlpImpl mlp(config, MlpClass::kGptNeoxMLP, 24, 0, -1, *DefaultLinearFactory());
  Randomise(mlp);
  const Params p = NamedParams(mlp);
  const at::Tensor x = at::randn({2, 9, 16}) * 3;
  const at::Tensor diff = GptNeoxReference(x, p, "", "none") - GptNeoxReference(x, p, "", "tanh");
  EXPECT_GT(diff.abs().max().item<double>(), 1e-4);
}

TEST(LLaMAMlp, ParametersAreNamedAsLitGpt) {
  for (const MlpClass kind : {MlpClass::kLLaMAMLP, MlpClass::kGemmaMLP}) {
    for (const bool bias : {true, false}) {
      Config config = MlpConfig(kind, bias, "tanh");
      Finalize(config);
      MlpImpl mlp(config, kind, 24, 0, -1, *DefaultLinearFactory());
      const Params p = NamedParams(mlp);
      EXPECT_EQ(Names(p), WithBias({"fc_1", "fc_2", "proj"}, bias));
      EXPECT_EQ(p.at("fc_1.weight").sizes(), at::IntArrayRef({24, 16}));
      EXPECT_EQ(p.at("fc_2.weight").sizes(), at::IntArrayRef({24, 16}));
      EXPECT_EQ(p.at("proj.weight").sizes(), at::IntArrayRef({16, 24}));
    }
  }
}

TEST(LLaMAMlp, MatchesReference) {
  at::manual_seed(2);
  for (const bool bias : {true, false}) {
    SCOPED_TRACE(testing::Message() << "bias " << bias);
    Config config = MlpConfig(MlpClass::kLLaMAMLP, bias, "none");
    Finalize(config);
    MlpImpl mlp(config, MlpClass::kLLaMAMLP, 24, 0, -1, *DefaultLinearFactory());
    Randomise(mlp);
    const Params p = NamedParams(mlp);
    CheckForward(mlp, [&](const at::Tensor& x) { return LLaMAReference(x, p, ""); });
  }
}

TEST(GemmaMlp, MatchesReference) {
  at::manual_seed(3);
  for (const std::string approximate : {"tanh", "none"}) {
    for (const bool bias : {true, false}) {
      SCOPED_TRACE(testing::Message() << approximate << " bias " << bias);
      Config config = MlpConfig(MlpClass::kGemmaMLP, bias, approximate);
      Finalize(config);
      MlpImpl mlp(config, MlpClass::kGemmaMLP, 24, 0, -1, *DefaultLinearFactory());
      Randomise(mlp);
      const Params p = NamedParams(mlp);
      CheckForward(mlp, [&](const at::Tensor& x) { return GemmaReference(x, p, "", approximate); });
    }
  }
}

Config MoeConfig(int64_t n_expert, int64_t per_token, std::optional<int64_t> moe_size,
                 std::optional<int64_t> n_shared, double routed_scaling, bool bias) {
  Config config = MlpConfig(MlpClass::kLLaMAMoE, bias, "none");
  config.intermediate_size = 40;
  config.moe_intermediate_size = moe_size;
  config.n_expert = n_expert;
  config.n_expert_per_token = per_token;
  config.n_shared_expert = n_shared;
  config.routed_scaling_factor = routed_scaling;
  return config;
}

// LLaMAMoE.forward, one token at a time: the k largest router logits, softmax over them
// (times routed_scaling_factor), the weighted sum of those experts, plus shared experts.
at::Tensor MoeReference(const at::Tensor& x, const Params& p, const Config& config) {
  const int64_t n_embd = x.size(-1);
  const at::Tensor flat = D(x).reshape({-1, n_embd});
  const at::Tensor logits = at::matmul(flat, D(p.at("gate.weight")).t());  // [N, n_expert]
  at::Tensor y = at::zeros_like(flat);
  for (int64_t n = 0; n < flat.size(0); ++n) {
    std::vector<double> l(config.n_expert);
    for (int64_t e = 0; e < config.n_expert; ++e) l[e] = logits[n][e].item<double>();
    std::vector<int64_t> order(config.n_expert);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return l[a] > l[b]; });
    order.resize(config.n_expert_per_token);
    double total = 0;
    for (const int64_t e : order) total += std::exp(l[e] - l[order[0]]);
    const at::Tensor token = flat[n].unsqueeze(0);
    for (const int64_t e : order) {
      const double prob = std::exp(l[e] - l[order[0]]) / total * config.routed_scaling_factor;
      y[n] += prob * LLaMAReference(token, p, "experts." + std::to_string(e) + ".")[0];
    }
  }
  y = y.view(x.sizes());
  if (config.n_shared_expert.value_or(0) > 0) y = y + LLaMAReference(x, p, "shared_experts.");
  return y;
}

TEST(LLaMAMoE, ParametersAreNamedAsLitGpt) {
  for (const bool bias : {true, false}) {
    Config config = MoeConfig(3, 2, 12, 2, 1.0, bias);
    Finalize(config);
    MoeImpl moe(config, 0, *DefaultLinearFactory());
    const Params p = NamedParams(moe);
    std::set<std::string> expected = {"gate.weight"};  // the router has no bias
    for (const std::string prefix : {"experts.0.", "experts.1.", "experts.2.", "shared_experts."}) {
      for (const std::string& name :
           WithBias({prefix + "fc_1", prefix + "fc_2", prefix + "proj"}, bias)) {
        expected.insert(name);
      }
    }
    EXPECT_EQ(Names(p), expected);
    EXPECT_EQ(p.at("gate.weight").sizes(), at::IntArrayRef({3, 16}));
    // Experts are moe_intermediate_size wide; shared experts that times n_shared_expert.
    EXPECT_EQ(p.at("experts.1.fc_1.weight").sizes(), at::IntArrayRef({12, 16}));
    EXPECT_EQ(p.at("experts.1.proj.weight").sizes(), at::IntArrayRef({16, 12}));
    EXPECT_EQ(p.at("shared_experts.fc_2.weight").sizes(), at::IntArrayRef({24, 16}));
    EXPECT_EQ(p.at("shared_experts.proj.weight").sizes(), at::IntArrayRef({16, 24}));
  }
  // Without moe_intermediate_size the experts take intermediate_size (LitGPT's
  // `intermediate_size or config.intermediate_size`); no shared experts.
  Config config = MoeConfig(2, 1, std::nullopt, std::nullopt, 1.0, false);
  Finalize(config);
  MoeImpl moe(config, 0, *DefaultLinearFactory());
  const Params p = NamedParams(moe);
  EXPECT_EQ(p.at("experts.0.fc_1.weight").sizes(), at::IntArrayRef({40, 16}));
  EXPECT_EQ(p.count("shared_experts.fc_1.weight"), 0u);
  EXPECT_EQ(p.size(), 1u + 2 * 3);
}

TEST(LLaMAMoE, MatchesPerTokenReference) {
  at::manual_seed(4);
  struct Case {
    int64_t n_expert, per_token;
    std::optional<int64_t> n_shared;
    double routed_scaling;
    bool bias;
  };
  const Case cases[] = {
      {4, 2, std::nullopt, 1.0, false},
      {4, 1, std::nullopt, 1.0, true},
      {5, 3, 1, 2.5, false},
      {4, 4, 2, 1.0, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "n_expert " << c.n_expert << " k " << c.per_token
                                    << " shared " << c.n_shared.value_or(0) << " scaling "
                                    << c.routed_scaling << " bias " << c.bias);
    Config config = MoeConfig(c.n_expert, c.per_token, 12, c.n_shared, c.routed_scaling, c.bias);
    Finalize(config);
    MoeImpl moe(config, 0, *DefaultLinearFactory());
    Randomise(moe);
    {
      // A stronger router, so that the softmax weights are far from uniform.
      at::NoGradGuard no_grad;
      NamedParams(moe).at("gate.weight").mul_(4);
    }
    const Params p = NamedParams(moe);
    CheckForward(moe, [&](const at::Tensor& x) { return MoeReference(x, p, config); });
  }
}

TEST(LLaMAMoE, RoutingDependsOnTheToken) {
  // Guards the test above: the tokens of its inputs are routed to different experts, so a
  // wrong top-k or a wrong expert index would show.
  at::manual_seed(5);
  Config config = MoeConfig(4, 2, 12, std::nullopt, 1.0, false);
  Finalize(config);
  MoeImpl moe(config, 0, *DefaultLinearFactory());
  Randomise(moe);
  const at::Tensor x = at::randn({18, 16});
  const at::Tensor logits = at::matmul(x, NamedParams(moe).at("gate.weight").detach().t());
  const at::Tensor top = std::get<0>(std::get<1>(at::topk(logits, 2)).sort(1));
  std::set<std::pair<int64_t, int64_t>> sets;
  for (int64_t n = 0; n < 18; ++n) {
    sets.insert({top[n][0].item<int64_t>(), top[n][1].item<int64_t>()});
  }
  EXPECT_GE(sets.size(), 3u);
}

TEST(MakeFeedForward, BuildsTheMlpLitGptsBlockBuilds) {
  at::manual_seed(6);
  struct Case {
    MlpClass kind;
    std::set<std::string> names;
  };
  const Case cases[] = {
      {MlpClass::kGptNeoxMLP, WithBias({"fc", "proj"}, true)},
      {MlpClass::kLLaMAMLP, WithBias({"fc_1", "fc_2", "proj"}, true)},
      {MlpClass::kGemmaMLP, WithBias({"fc_1", "fc_2", "proj"}, true)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(MlpClassName(c.kind));
    Config config = MlpConfig(c.kind, true, "tanh");
    Finalize(config);
    FeedForwardPtr mlp = MakeFeedForward(config, 1, *DefaultLinearFactory());
    Randomise(*mlp);
    const Params p = NamedParams(*mlp);
    EXPECT_EQ(Names(p), c.names);
    EXPECT_EQ(p.at("proj.weight").sizes(), at::IntArrayRef({16, 24}));
    CheckForward(*mlp, [&](const at::Tensor& x) {
      switch (c.kind) {
        case MlpClass::kGptNeoxMLP:
          return GptNeoxReference(x, p, "", "tanh");
        case MlpClass::kGemmaMLP:
          return GemmaReference(x, p, "", "tanh");
        default:
          return LLaMAReference(x, p, "");
      }
    });
  }
}

TEST(MakeFeedForward, FirstKDenseReplaceGivesLLaMAMlpLayers) {
  at::manual_seed(7);
  Config config = MoeConfig(3, 2, 12, std::nullopt, 1.0, false);
  config.first_k_dense_replace = 2;
  Finalize(config);
  for (int64_t layer = 0; layer < 3; ++layer) {
    SCOPED_TRACE(testing::Message() << "layer " << layer);
    FeedForwardPtr mlp = MakeFeedForward(config, layer, *DefaultLinearFactory());
    Randomise(*mlp);
    const Params p = NamedParams(*mlp);
    if (layer < 2) {
      // LitGPT's Block: LLaMAMLP(config), intermediate_size wide.
      EXPECT_EQ(Names(p), WithBias({"fc_1", "fc_2", "proj"}, false));
      EXPECT_EQ(p.at("fc_1.weight").sizes(), at::IntArrayRef({40, 16}));
      CheckForward(*mlp, [&](const at::Tensor& x) { return LLaMAReference(x, p, ""); });
    } else {
      EXPECT_TRUE(p.count("gate.weight"));
      EXPECT_EQ(p.at("experts.2.fc_1.weight").sizes(), at::IntArrayRef({12, 16}));
      CheckForward(*mlp, [&](const at::Tensor& x) { return MoeReference(x, p, config); });
    }
  }
}

}  // namespace
}  // namespace lgpt
