// StreamingLLM's point on the embedded default model (block size 256): 20,000 sampled tokens
// through a sink cache with cache positions. The cache's bytes stay flat, the text decodes and
// is not degenerate (many distinct ids, no id dominating), and its perplexity under the model
// itself (plain forward passes over 128-token windows, the trained context) stays bounded and
// does not drift up from the start of the stream to its end.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "cache/kv_cache_factory.h"
#include "core/model/checkpoint.h"
#include "core/model/generate.h"
#include "core/model/gpt.h"
#include "core/text/tokenizer.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

constexpr char kModel[] = "tools/default_model";
constexpr int64_t kTokens = 20000, kWindow = 128;

// Perplexity of ids[begin, end) under the model, window by window, each window on its own.
double Perplexity(GPTImpl& model, const std::vector<int64_t>& ids, int64_t begin, int64_t end) {
  at::NoGradGuard no_grad;
  double nll = 0;
  int64_t scored = 0;
  for (int64_t start = begin; start + 1 < end; start += kWindow) {
    const int64_t length = std::min(kWindow, end - start);
    if (length < 2) break;
    const at::Tensor window =
        at::tensor(std::vector<int64_t>(ids.begin() + start, ids.begin() + start + length),
                   at::kLong)
            .unsqueeze(0);
    absl::StatusOr<at::Tensor> logits = model.Forward(window);
    EXPECT_TRUE(logits.ok()) << logits.status();
    const at::Tensor log_probs =
        at::log_softmax(logits->reshape({length, -1}).narrow(0, 0, length - 1), -1);
    const at::Tensor targets = window.reshape({-1}).narrow(0, 1, length - 1).unsqueeze(1);
    nll -= log_probs.gather(1, targets).sum().item<double>();
    scored += length - 1;
  }
  return std::exp(nll / scored);
}

TEST(LongStreamTest, TwentyThousandTokensThroughASinkCacheStayFlatAndReadable) {
  absl::StatusOr<LoadedModel> loaded = LoadCheckpoint(kModel);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(kModel);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  GPTImpl& model = *loaded->model;
  const int64_t block = model.config().block_size;
  ASSERT_LT(block * 8, kTokens);

  KVCacheSpec spec{"sink", 64, 16};
  spec.positions = "cache";
  KVCacheShape shape;
  shape.max_sequence_length = block;
  shape.layers = model.CacheLayout();
  shape.dtype = model.dtype();
  shape.device = model.device();
  absl::StatusOr<std::unique_ptr<KVCache>> cache = MakeKVCache(spec, shape);
  ASSERT_TRUE(cache.ok()) << cache.status();

  absl::StatusOr<std::vector<int64_t>> prompt = (*tokenizer)->Encode("And God said");
  ASSERT_TRUE(prompt.ok());
  GenerateOptions options;
  options.max_new_tokens = kTokens;
  options.sampling = {0.8, 50, 1.0};
  options.seed = 7;
  int64_t count = 0, flat_bytes = -1;
  options.on_token = [&](int64_t) {
    ++count;
    if (count == 1000) flat_bytes = (*cache)->AllocatedBytes();
    if (count > 1000 && count % 500 == 0) {
      EXPECT_EQ((*cache)->AllocatedBytes(), flat_bytes) << "after " << count << " tokens";
    }
    return true;
  };
  GenerateStats stats;
  absl::StatusOr<std::vector<int64_t>> out = Generate(model, **cache, *prompt, options, &stats);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(static_cast<int64_t>(out->size()), kTokens);
  EXPECT_EQ(stats.kv_cache_bytes, flat_bytes);
  // 16 bits (float32 here): 2 · 4 layers · 2 groups · 65 slots · 32 · 4 bytes.
  EXPECT_LE(flat_bytes, 2 * 4 * 2 * 65 * 32 * 4);
  EXPECT_GT(stats.position_shift, kTokens - block);

  // Not degenerate: many distinct ids, none dominating.
  std::map<int64_t, int64_t> counts;
  for (int64_t id : *out) ++counts[id];
  int64_t most = 0;
  for (const auto& [id, n] : counts) most = std::max(most, n);
  EXPECT_GT(counts.size(), 800u);
  EXPECT_LT(most, kTokens / 8);

  // Text: the ids decode, to English-looking characters.
  absl::StatusOr<std::string> text = (*tokenizer)->Decode(*out);
  ASSERT_TRUE(text.ok()) << text.status();
  int64_t plain = 0;
  for (unsigned char c : *text) plain += std::isalpha(c) || std::isspace(c) || std::ispunct(c);
  EXPECT_GT(text->size(), static_cast<size_t>(2 * kTokens));
  EXPECT_GT(static_cast<double>(plain) / text->size(), 0.98);

  // Its own perplexity is bounded and the end of the stream is no worse than its start.
  const std::vector<int64_t>& ids = *out;
  const double first = Perplexity(model, ids, 0, 2048);
  const double last = Perplexity(model, ids, kTokens - 2048, kTokens);
  const double all = Perplexity(model, ids, 0, kTokens);
  std::fprintf(stderr, "perplexity: first 2048 %.2f, last 2048 %.2f, all %.2f; %zu ids\n", first,
               last, all, counts.size());
  std::fprintf(stderr, "tail: %s\n", text->substr(text->size() - 300).c_str());
  EXPECT_GT(all, 3.0);
  EXPECT_LT(all, 60.0);
  EXPECT_LT(last, 1.5 * first);
}

}  // namespace
}  // namespace lgpt
