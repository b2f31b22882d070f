// Generates text from a prompt with a LitGPT checkpoint (the embedded default model when
// --checkpoint_dir is not given):
//   bazel run //tools:generate -- --prompt="In the beginning"
//   bazel run //tools:generate -- --checkpoint_dir=DIR --prompt_ids=1,2,3 \
//       --max_new_tokens=N --temperature=0 --prefill_chunk=K --print_ids
// Streams text on stdout as it is produced (token ids on stderr when the checkpoint has no
// tokenizer), then prints statistics (time to first token, prefill and decode tokens/s,
// kv_cache_bytes, peak memory). With --print_ids, or without a tokenizer, the generated
// ids, space-separated, are the last line of stdout.
#include <cstdio>
#include <string>

#include <ATen/Parallel.h>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/device.h"
#include "core/model/checkpoint.h"
#include "core/model/generate.h"
#include "core/tokenizer.h"
#include "tools/tool_util.h"

ABSL_FLAG(std::string, checkpoint_dir, "",
          "LitGPT checkpoint directory; empty: the embedded default model");
ABSL_FLAG(std::string, prompt_ids, "", "comma-separated prompt token ids, e.g. 1,2,3");
ABSL_FLAG(std::string, prompt, "", "prompt text (needs a checkpoint with a tokenizer)");
ABSL_FLAG(int64_t, max_new_tokens, 50, "number of tokens to generate");
ABSL_FLAG(double, temperature, 0.8, "sampling temperature; 0 is greedy");
ABSL_FLAG(int64_t, top_k, 50, "sample from the k most likely tokens; 0 means all");
ABSL_FLAG(double, top_p, 1.0, "nucleus sampling mass in [0, 1]");
ABSL_FLAG(uint64_t, seed, 1234, "random seed");
ABSL_FLAG(int64_t, prefill_chunk, 0, "prefill the prompt in chunks of this many tokens; 0: whole");
ABSL_FLAG(std::string, stop_ids, "", "comma-separated token ids that end generation");
ABSL_FLAG(bool, print_ids, false, "print the generated ids as the last line of stdout");
ABSL_FLAG(std::string, precision, "32-true", "32-true, bf16-true or 16-true");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda[:N]");

// The embedded default model, relative to the runfiles root (see README).
constexpr char kDefaultModelDir[] = "tools/default_model";

int main(int argc, char** argv) {
  using namespace lgpt;
  InitTool(argc, argv,
           "generate --checkpoint_dir=DIR --prompt_ids=1,2,3 [--max_new_tokens=N] "
           "[--temperature=T] [--prefill_chunk=K] [--print_ids]");
  std::string checkpoint_dir = ResolvePath(absl::GetFlag(FLAGS_checkpoint_dir));
  if (checkpoint_dir.empty()) checkpoint_dir = kDefaultModelDir;
  const bool text_prompt = !absl::GetFlag(FLAGS_prompt).empty();
  if (text_prompt == !absl::GetFlag(FLAGS_prompt_ids).empty()) {
    Die(absl::InvalidArgumentError("give exactly one of --prompt and --prompt_ids"));
  }
  GenerateOptions options;
  options.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  options.sampling.temperature = absl::GetFlag(FLAGS_temperature);
  options.sampling.top_k = absl::GetFlag(FLAGS_top_k);
  options.sampling.top_p = absl::GetFlag(FLAGS_top_p);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
  if (!absl::GetFlag(FLAGS_stop_ids).empty()) {
    options.stop_tokens = ValueOrDie(ParseIds(absl::GetFlag(FLAGS_stop_ids), "stop_ids"));
  }
  if (options.max_new_tokens < 1) {
    Die(absl::InvalidArgumentError(
        absl::StrCat("--max_new_tokens must be >= 1, got ", options.max_new_tokens)));
  }
  if (options.prefill_chunk < 0) {
    Die(absl::InvalidArgumentError(
        absl::StrCat("--prefill_chunk must be >= 0, got ", options.prefill_chunk)));
  }
  DieIfError(ValidateSampling(options.sampling));

  LoadOptions load;
  load.dtype = ValueOrDie(ParsePrecision(absl::GetFlag(FLAGS_precision)));
  load.device = ValueOrDie(ParseDevice(absl::GetFlag(FLAGS_device)));
  load.progress = PrintProgress;
  LoadedModel loaded = ValueOrDie(LoadCheckpoint(checkpoint_dir, load));
  // A checkpoint without tokenizer files still generates from ids.
  std::unique_ptr<Tokenizer> tokenizer;
  absl::StatusOr<std::unique_ptr<Tokenizer>> loaded_tokenizer = Tokenizer::Load(checkpoint_dir);
  if (loaded_tokenizer.ok()) {
    tokenizer = *std::move(loaded_tokenizer);
  } else if (text_prompt) {
    Die(loaded_tokenizer.status());
  }
  std::vector<int64_t> prompt;
  if (text_prompt) {
    prompt = ValueOrDie(tokenizer->Encode(absl::GetFlag(FLAGS_prompt)));
    if (prompt.empty()) Die(absl::InvalidArgumentError("--prompt encodes to no tokens"));
    if (tokenizer->eos_id()) options.stop_tokens.push_back(*tokenizer->eos_id());
  } else {
    prompt = ValueOrDie(ParseIds(absl::GetFlag(FLAGS_prompt_ids), "prompt_ids"));
  }
  const int64_t length = static_cast<int64_t>(prompt.size()) + options.max_new_tokens;
  if (length > loaded.config.block_size) {
    Die(absl::OutOfRangeError(absl::StrCat(
        "prompt (", prompt.size(), " tokens) plus --max_new_tokens (", options.max_new_tokens,
        ") exceeds the context of ", loaded.config.block_size, " tokens")));
  }
  for (int64_t id : prompt) {
    if (id >= loaded.config.PaddedVocabSize()) {
      Die(absl::OutOfRangeError(absl::StrCat("--prompt_ids: token id ", id,
                                             " is outside the vocabulary of ",
                                             loaded.config.PaddedVocabSize())));
    }
  }
  std::unique_ptr<DenseKVCache> cache =
      ValueOrDie(loaded.model->NewDenseCache(1, length, /*initial_capacity=*/length));

  std::unique_ptr<StreamingDecoder> stream;
  if (tokenizer) {
    stream = std::make_unique<StreamingDecoder>(*tokenizer);
    // The prompt's own text first; the stream then continues it exactly (spaces included).
    std::printf("%s", ValueOrDie(stream->Prime(prompt)).c_str());
    std::fflush(stdout);
  }
  options.on_token = [&](int64_t token) {
    if (stream) {
      absl::StatusOr<std::string> text = stream->Push(token);
      if (text.ok()) std::printf("%s", text->c_str());
      std::fflush(stdout);
    } else {
      std::fprintf(stderr, "%lld ", static_cast<long long>(token));
      std::fflush(stderr);
    }
    return true;
  };
  GenerateStats stats;
  const std::vector<int64_t> generated =
      ValueOrDie(Generate(*loaded.model, *cache, prompt, options, &stats));
  if (stream) {
    std::printf("%s\n\n", stream->Flush().c_str());
  } else {
    std::fprintf(stderr, "\n");
  }

  const double prefill_tps = stats.prefill_s > 0 ? stats.prompt_tokens / stats.prefill_s : 0;
  const double decode_tps =
      stats.decode_s > 0 ? (stats.new_tokens - 1) / stats.decode_s : 0;
  std::printf("model=%s threads=%d\n", loaded.config.name.c_str(), at::get_num_threads());
  std::printf("prompt_tokens=%lld new_tokens=%lld\n", static_cast<long long>(stats.prompt_tokens),
              static_cast<long long>(stats.new_tokens));
  std::printf("time_to_first_token_s=%.4f\n", stats.time_to_first_token_s);
  std::printf("prefill_tokens_per_s=%.1f\n", prefill_tps);
  std::printf("decode_tokens_per_s=%.1f\n", decode_tps);
  std::printf("kv_cache_bytes=%lld\n", static_cast<long long>(stats.kv_cache_bytes));
  std::printf("kv_cache_index_bytes=%lld\n", static_cast<long long>(cache->IndexBytes()));
  std::printf("peak_rss_bytes=%lld\n", static_cast<long long>(PeakRssBytes()));
  // Without a tokenizer the ids are the output, so they are printed either way.
  if (absl::GetFlag(FLAGS_print_ids) || !tokenizer) {
    std::printf("%s\n", absl::StrJoin(generated, " ").c_str());
  }
  return 0;
}
