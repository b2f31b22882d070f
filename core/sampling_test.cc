#include "core/sampling.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "gtest/gtest.h"

namespace lgpt {
namespace {

TEST(SamplingTest, GreedyWhenTemperatureOrTopPIsZero) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const at::Tensor logits = at::tensor({0.1f, 3.0f, 0.2f, 2.9f}).view({1, 4});
  EXPECT_EQ(SampleNext(logits, {0.0, 0, 1.0}, gen).item<int64_t>(), 1);
  EXPECT_EQ(SampleNext(logits, {1.0, 0, 0.0}, gen).item<int64_t>(), 1);
}

TEST(SamplingTest, TopKOneIsGreedyAtAnyTemperature) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const at::Tensor logits = at::randn({3, 50});
  const at::Tensor sampled = SampleNext(logits, {5.0, 1, 1.0}, gen);
  EXPECT_TRUE(at::equal(sampled, logits.argmax(-1)));
}

TEST(SamplingTest, TopKAndTopPOnlyDrawAllowedTokens) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor logits = at::tensor({5.0f, 4.9f, 0.0f, -1.0f, 4.8f}).view({1, 5});
  for (int i = 0; i < 200; ++i) {
    const int64_t k = SampleNext(logits, {1.0, 2, 1.0}, gen).item<int64_t>();
    EXPECT_TRUE(k == 0 || k == 1) << k;
    // top_p 0.5 keeps only the two most likely (0.37 + 0.34 > 0.5).
    const int64_t p = SampleNext(logits, {1.0, 0, 0.5}, gen).item<int64_t>();
    EXPECT_TRUE(p == 0 || p == 1) << p;
  }
}

TEST(SamplingTest, SameSeedSameDraws) {
  const at::Tensor logits = at::randn({2, 100});
  at::Generator a = at::make_generator<at::CPUGeneratorImpl>(42);
  at::Generator b = at::make_generator<at::CPUGeneratorImpl>(42);
  for (int i = 0; i < 20; ++i) {
    EXPECT_TRUE(at::equal(SampleNext(logits, {0.9, 40, 0.9}, a), SampleNext(logits, {0.9, 40, 0.9}, b)));
  }
}

TEST(SamplingTest, RejectsImpossibleOptions) {
  EXPECT_FALSE(ValidateSampling({-1.0, 0, 1.0}).ok());
  EXPECT_FALSE(ValidateSampling({1.0, -3, 1.0}).ok());
  EXPECT_FALSE(ValidateSampling({1.0, 0, 1.5}).ok());
  EXPECT_FALSE(ValidateSampling({NAN, 0, 1.0}).ok());
  EXPECT_TRUE(ValidateSampling({0.8, 50, 0.9}).ok());
}

}  // namespace
}  // namespace lgpt
