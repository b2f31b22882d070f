// Engine::Embed on the embedded default model: a batch of inputs of different lengths equals
// each input alone (right padding changes nothing under causal attention); kLast and kMean pool
// the final norm's output as defined; rows have unit length; bad inputs name themselves.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "core/base/status_field.h"
#include "lgpt.h"

namespace lgpt {
namespace {

std::shared_ptr<const Engine> DefaultEngine() {
  absl::StatusOr<std::shared_ptr<const Engine>> engine = Engine::Load("tools/default_model");
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *engine : nullptr;
}

// The final norm's output [T, n_embd] of one sequence.
at::Tensor Hidden(const Engine& engine, const std::vector<int64_t>& ids) {
  at::NoGradGuard no_grad;
  ForwardOptions options;
  options.hidden_states = true;
  absl::StatusOr<at::Tensor> states =
      engine.model().Forward(at::tensor(ids, at::kLong).unsqueeze(0), nullptr, options);
  EXPECT_TRUE(states.ok()) << states.status();
  return states->squeeze(0).to(at::kFloat);
}

TEST(EmbeddingsTest, BatchedEqualsAloneAndPoolsAsDefined) {
  std::shared_ptr<const Engine> engine = DefaultEngine();
  ASSERT_NE(engine, nullptr);
  const std::vector<std::vector<int64_t>> inputs = {
      *engine->Encode("In the beginning God created the heaven and the earth."),
      *engine->Encode("Amen."), *engine->Encode("And God said, Let there be light")};
  for (const Engine::Pooling pooling : {Engine::Pooling::kLast, Engine::Pooling::kMean}) {
    absl::StatusOr<at::Tensor> batched = engine->Embed(inputs, pooling);
    ASSERT_TRUE(batched.ok()) << batched.status();
    ASSERT_EQ(batched->sizes(), (std::vector<int64_t>{3, engine->config().n_embd}));
    for (size_t i = 0; i < inputs.size(); ++i) {
      absl::StatusOr<at::Tensor> alone = engine->Embed({inputs[i]}, pooling);
      ASSERT_TRUE(alone.ok()) << alone.status();
      EXPECT_TRUE(at::allclose((*batched)[i], (*alone)[0], 1e-5, 1e-5)) << i;
      const at::Tensor hidden = Hidden(*engine, inputs[i]);
      at::Tensor expected =
          pooling == Engine::Pooling::kLast ? hidden[hidden.size(0) - 1] : hidden.mean(0);
      expected = expected / expected.norm();
      EXPECT_TRUE(at::allclose((*batched)[i], expected, 1e-5, 1e-5)) << i;
      EXPECT_NEAR((*batched)[i].norm().item<double>(), 1.0, 1e-5);
    }
  }
}

TEST(EmbeddingsTest, BadInputsNameThemselves) {
  std::shared_ptr<const Engine> engine = DefaultEngine();
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(ErrorField(engine->Embed({}).status()), "inputs");
  EXPECT_EQ(ErrorField(engine->Embed({{1, 2}, {}}).status()), "inputs[1]");
  EXPECT_EQ(ErrorField(engine->Embed({{1, 2}, {1, engine->config().PaddedVocabSize()}}).status()),
            "inputs[1]");
  const absl::Status long_input =
      engine->Embed({std::vector<int64_t>(engine->config().block_size + 1, 5)}).status();
  EXPECT_EQ(long_input.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ErrorField(long_input), "inputs[0]");
}

}  // namespace
}  // namespace lgpt
