// Per-request LoRA through Engine (EngineOptions.adapters, RequestOptions.adapter) on the
// embedded default model with two random LoRA fine-tunes written as LitGPT fine-tune
// directories: requests of both adapters and of the base, submitted together so that they
// share batched steps, each equal the engine that loads that fine-tune alone (greedy tokens
// equal, chosen tokens' log-probabilities within 1e-4); unknown names name the field.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/base/status_field.h"
#include "core/config/config.h"
#include "lgpt.h"
#include "peft/lora.h"
#include "tests/random_lora.h"

namespace lgpt {
namespace {

namespace fs = std::filesystem;

constexpr char kBase[] = "tools/default_model";

std::string WriteAdapter(const Config& base_config, const LoraOptions& lora,
                         const std::string& name, uint64_t seed) {
  absl::StatusOr<std::string> dir = WriteRandomLoraFineTune(
      kBase, base_config, lora, (fs::path(::testing::TempDir()) / name).string(), seed);
  EXPECT_TRUE(dir.ok()) << dir.status();
  return dir.ok() ? *dir : "";
}

TEST(EngineAdaptersTest, MixedRequestsEqualEachFineTuneAlone) {
  absl::StatusOr<std::shared_ptr<const Engine>> base = Engine::Load(kBase);
  ASSERT_TRUE(base.ok()) << base.status();
  LoraOptions first, second;
  first.r = 4;
  first.alpha = 8;
  first.query = first.value = true;
  second.r = 2;
  second.alpha = 2;
  second.mlp = second.projection = true;
  const std::string first_dir = WriteAdapter((*base)->config(), first, "psalms", 1);
  const std::string second_dir = WriteAdapter((*base)->config(), second, "proverbs", 2);
  EngineOptions options;
  options.adapters = {{"psalms", {first_dir, 1.0}}, {"proverbs", {second_dir, 1.0}}};
  absl::StatusOr<std::shared_ptr<const Engine>> multi = Engine::Load(kBase, options);
  ASSERT_TRUE(multi.ok()) << multi.status();
  EXPECT_EQ((*multi)->adapter_names(), (std::vector<std::string>{"psalms", "proverbs"}));
  const std::vector<std::pair<std::string, std::string>> requests = {
      {"psalms", first_dir}, {"", kBase}, {"proverbs", second_dir}, {"psalms", first_dir}};
  const std::vector<std::string> prompts = {"And God said", "In the beginning",
                                            "The LORD is my shepherd", "Blessed is the man"};
  RequestOptions request;
  request.max_new_tokens = 12;
  request.stop_at_eos = false;
  request.sampling = {0, 0, 1};
  request.top_logprobs = 0;
  std::vector<std::shared_ptr<Request>> submitted;
  for (size_t i = 0; i < requests.size(); ++i) {
    RequestOptions each = request;
    each.adapter = requests[i].first;
    absl::StatusOr<std::shared_ptr<Request>> handle = (*multi)->Submit(prompts[i], each);
    ASSERT_TRUE(handle.ok()) << handle.status();
    submitted.push_back(*handle);
  }
  std::vector<std::vector<int64_t>> outputs;
  for (size_t i = 0; i < requests.size(); ++i) {
    absl::StatusOr<Completion> served = submitted[i]->Wait();
    ASSERT_TRUE(served.ok()) << served.status();
    absl::StatusOr<std::shared_ptr<const Engine>> alone = Engine::Load(requests[i].second);
    ASSERT_TRUE(alone.ok()) << alone.status();
    absl::StatusOr<Completion> expected = (*alone)->Generate(prompts[i], request);
    ASSERT_TRUE(expected.ok()) << expected.status();
    EXPECT_EQ(served->tokens, expected->tokens) << "request " << i;
    ASSERT_EQ(served->logprobs.size(), expected->logprobs.size());
    for (size_t t = 0; t < served->logprobs.size(); ++t) {
      EXPECT_NEAR(served->logprobs[t].logprob, expected->logprobs[t].logprob, 1e-4)
          << "request " << i << " token " << t;
    }
    outputs.push_back(served->tokens);
    // Batch-1 Generate on the multi-adapter engine too.
    RequestOptions each = request;
    each.adapter = requests[i].first;
    absl::StatusOr<Completion> direct = (*multi)->Generate(prompts[i], each);
    ASSERT_TRUE(direct.ok()) << direct.status();
    EXPECT_EQ(direct->tokens, expected->tokens) << "request " << i;
  }
  // The adapters matter: the same prompt through the base reads other log-probabilities.
  absl::StatusOr<Completion> base_reply = (*base)->Generate(prompts[0], request);
  absl::StatusOr<Completion> adapted = (*multi)->Generate(prompts[0], [&] {
    RequestOptions each = request;
    each.adapter = "psalms";
    return each;
  }());
  ASSERT_TRUE(base_reply.ok() && adapted.ok());
  EXPECT_GT(std::abs(base_reply->logprobs[0].logprob - adapted->logprobs[0].logprob), 1e-3);

  RequestOptions unknown = request;
  unknown.adapter = "songs";
  const absl::Status status = (*multi)->Generate(prompts[0], unknown).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorField(status), "RequestOptions.adapter");
  EXPECT_NE(status.message().find("psalms, proverbs"), std::string::npos) << status;
  EXPECT_EQ(ErrorField((*base)->Submit(prompts[0], unknown).status()), "RequestOptions.adapter");
  // Adapters serve over the checkpoint itself, not over other fine-tunes.
  EngineOptions both = options;
  both.loras = {{first_dir, 1.0}};
  EXPECT_EQ(ErrorField(Engine::Load(kBase, both).status()), "EngineOptions.adapters");
}

}  // namespace
}  // namespace lgpt
