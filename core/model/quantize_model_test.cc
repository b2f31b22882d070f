#include "core/model/quantize_model.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "core/model/checkpoint.h"
#include "core/model/generate.h"

namespace lgpt {
namespace {

constexpr char kModel[] = "tools/default_model";

LoadedModel Load(const ModelParts& parts) {
  LoadOptions options;
  options.parts = parts;
  absl::StatusOr<LoadedModel> loaded = LoadCheckpoint(kModel, options);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return *std::move(loaded);
}

at::Tensor Tokens(int64_t n) {
  at::manual_seed(5);
  return at::randint(3, 4000, {1, n}, at::kLong);
}

TEST(QuantizeModelInt8, LogitsCloseToFloatAndDecodeMatchesFullForward) {
  at::NoGradGuard no_grad;
  LoadedModel f32 = Load({});
  LoadedModel int8 = Load(Int8ModelParts());
  ASSERT_TRUE(QuantizeModelInt8(*int8.model).ok());
  const at::Tensor tokens = Tokens(40);
  const at::Tensor expected = *f32.model->Forward(tokens);
  const at::Tensor full = *int8.model->Forward(tokens);
  const double relative = ((full - expected).norm() / expected.norm()).item<double>();
  EXPECT_LT(relative, 0.05);
  // The most likely next token mostly agrees.
  const double agree =
      (full.argmax(-1) == expected.argmax(-1)).to(at::kFloat).mean().item<double>();
  EXPECT_GT(agree, 0.9);

  // Token-by-token decoding (the int8 GEMV) equals the full forward (the dequantising path).
  auto cache = *int8.model->NewDenseCache(1, 40, 40);
  for (int64_t t = 0; t < 40; ++t) {
    ForwardOptions step;
    step.positions = at::full({1, 1}, t, at::kLong);
    const at::Tensor logits = *int8.model->Forward(tokens.narrow(1, t, 1), cache.get(), step);
    ASSERT_TRUE(at::allclose(logits[0][0], full[0][t], 1e-4, 1e-3)) << "position " << t;
  }
}

TEST(QuantizeModelInt8, GeneratesAndNeedsInt8Parts) {
  LoadedModel plain = Load({});
  EXPECT_EQ(QuantizeModelInt8(*plain.model).code(), absl::StatusCode::kFailedPrecondition);
  LoadedModel int8 = Load(Int8ModelParts(Int8Options{64, true}));
  ASSERT_TRUE(QuantizeModelInt8(*int8.model).ok());
  ASSERT_TRUE(QuantizeModelInt8(*int8.model).ok());  // twice: a no-op
  auto cache = *int8.model->NewDenseCache(1, 30, 30);
  GenerateOptions options;
  options.max_new_tokens = 20;
  options.sampling.temperature = 0;
  const std::vector<int64_t> prompt = {1, 400, 17, 250};
  absl::StatusOr<std::vector<int64_t>> out = Generate(*int8.model, *cache, prompt, options);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->size(), 20u);
}

}  // namespace
}  // namespace lgpt
