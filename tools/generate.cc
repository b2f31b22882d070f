// Generates text from a prompt with a LitGPT checkpoint (the embedded default model when
// --checkpoint_dir is not given):
//   bazel run //tools:generate -- --prompt="In the beginning"
//   bazel run //tools:generate -- --checkpoint_dir=DIR --prompt_ids=1,2,3
//       --max_new_tokens=N --temperature=0 --prefill_chunk=K --print_ids
// Streams text on stdout as it is produced (token ids on stderr when the checkpoint has no
// tokenizer), then prints statistics (time to first token, prefill and decode tokens/s,
// kv_cache_bytes, peak memory) on stderr. --kv_cache/--kv_budget/--kv_bits choose a budgeted or
// quantised KV cache (cache/kv_cache_factory.h). With --print_ids, or without a tokenizer, the
// generated ids, space-separated, are the only line of stdout (the text streams to stderr).
// So `generate ... > out.txt` holds the text (or the ids) alone. --speculative=ngram or
// --speculative=draft:DIR (--speculative_k, --ngram_min, --ngram_max) decode speculatively
// (core/speculative/README.md) and print the proposals' acceptance rate.
#include <ATen/Parallel.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/text/prompt_style.h"
#include "lgpt.h"
#include "tools/generation_flags.h"
#include "tools/peft_flags.h"
#include "tools/speculative_flags.h"
#include "tools/tool_util.h"
#include "tools/tp_flags.h"

ABSL_FLAG(std::string, checkpoint_dir, "",
          "LitGPT checkpoint or fine-tune directory; empty: the embedded default model");
ABSL_FLAG(std::string, prompt_ids, "", "comma-separated prompt token ids, e.g. 1,2,3");
ABSL_FLAG(std::string, prompt, "", "prompt text (needs a checkpoint with a tokenizer)");
ABSL_FLAG(std::string, prompt_style, "",
          "how --prompt is framed (alpaca, llama3, ...; none: as given); empty: the "
          "checkpoint's own (prompt_style.yaml, else from the model name), as LitGPT does");
ABSL_FLAG(int64_t, max_new_tokens, 50, "number of tokens to generate");
ABSL_FLAG(int64_t, prefill_chunk, 0, "prefill the prompt in chunks of this many tokens; 0: whole");
ABSL_FLAG(std::string, stop_ids, "", "comma-separated token ids that end generation");
ABSL_FLAG(std::vector<std::string>, stop, {},
          "comma-separated stop sequences: text that ends generation (not printed)");
ABSL_FLAG(bool, stop_at_eos, true,
          "end generation at the tokenizer's EOS token and the prompt style's stop tokens");
ABSL_FLAG(bool, print_ids, false,
          "print the generated ids as the only line of stdout (the text goes to stderr)");

int main(int argc, char** argv) {
  using namespace lgpt;
  InitTool(argc, argv,
           "generate [--checkpoint_dir=DIR] --prompt=TEXT | --prompt_ids=1,2,3 "
           "[--max_new_tokens=N] [--temperature=T] [--kv_cache=POLICY --kv_budget=N "
           "--kv_bits=B] [--speculative=ngram|draft:DIR --speculative_k=K] [--print_ids]");
  std::string checkpoint_dir = ResolvePath(absl::GetFlag(FLAGS_checkpoint_dir));
  if (checkpoint_dir.empty()) checkpoint_dir = DefaultModelDir();
  const bool text_prompt = !absl::GetFlag(FLAGS_prompt).empty();
  if (text_prompt == !absl::GetFlag(FLAGS_prompt_ids).empty()) {
    Die(absl::InvalidArgumentError("give exactly one of --prompt and --prompt_ids"));
  }
  RequestOptions options;
  options.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  options.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
  options.stop_sequences = absl::GetFlag(FLAGS_stop);
  for (size_t i = 0; i < options.stop_sequences.size(); ++i) {
    if (options.stop_sequences[i].empty()) {  // "--stop=," or "--stop=a,,b": a typo, not a stop
      Die(absl::InvalidArgumentError(absl::StrCat("--stop has an empty sequence (item ", i + 1,
                                                  " of ", options.stop_sequences.size(), ")")));
    }
  }
  options.stop_at_eos = absl::GetFlag(FLAGS_stop_at_eos);
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
  DieIfError(ApplyGenerationFlags(options));
  EngineOptions engine_options = ValueOrDie(EngineOptionsFromFlags());
  DieIfError(ApplySpeculativeFlags(options, engine_options));
  engine_options.loras = ValueOrDie(LoraFlags(argc, argv));
  if (std::optional<int> code = ValueOrDie(LaunchTensorParallel(argc, argv))) return *code;
  engine_options.tensor_parallel = ValueOrDie(JoinTensorParallel(engine_options.device));
  std::shared_ptr<const Engine> engine = ValueOrDie(Engine::Load(checkpoint_dir, engine_options));
  for (const std::string& warning : engine->warnings()) {
    std::fprintf(stderr, "generate: note: %s\n", warning.c_str());
  }
  const Tokenizer* tokenizer = engine->tokenizer();
  if (text_prompt && !tokenizer) {
    Die(absl::NotFoundError(absl::StrCat(checkpoint_dir,
                                         " has no tokenizer (tokenizer.json or tokenizer.model): "
                                         "give --prompt_ids instead of --prompt")));
  }
  std::vector<int64_t> prompt;
  bool framed = false;  // the prompt style changed the text
  if (text_prompt) {
    std::string text = absl::GetFlag(FLAGS_prompt);
    const std::string style_name = absl::GetFlag(FLAGS_prompt_style);
    if (style_name != "none") {
      const PromptStyle style =
          style_name.empty()
              ? ValueOrDie(PromptStyleForCheckpoint(checkpoint_dir, engine->config()))
              : ValueOrDie(PromptStyleFromName(style_name));
      const std::string styled = style.Apply(text);
      framed = styled != text;
      text = styled;
      if (options.stop_at_eos) {
        options.stop_token_sequences = style.StopTokenIds(
            tokenizer->eos_id(), [&](absl::string_view token) -> std::optional<int64_t> {
              absl::StatusOr<int64_t> id = tokenizer->TokenToId(token);
              return id.ok() ? std::optional<int64_t>(*id) : std::nullopt;
            });
      }
    }
    prompt = ValueOrDie(engine->Encode(text));
    if (prompt.empty()) Die(absl::InvalidArgumentError("--prompt encodes to no tokens"));
  } else {
    prompt = ValueOrDie(ParseIds(absl::GetFlag(FLAGS_prompt_ids), "prompt_ids"));
  }

  if (tokenizer) {
    // The prompt's text first (unless a prompt style framed it): the streamed reply
    // continues it exactly, spaces included.
    options.echo_prompt = !framed;
    // Statistics go to stderr: stdout holds the text alone, or the ids alone (--print_ids).
    FILE* text_out = absl::GetFlag(FLAGS_print_ids) ? stderr : stdout;
    options.on_text = [text_out](absl::string_view text) {
      std::fwrite(text.data(), 1, text.size(), text_out);
      std::fflush(text_out);
      return true;
    };
  } else {
    options.on_token = [](int64_t token) {
      std::fprintf(stderr, "%lld ", static_cast<long long>(token));
      std::fflush(stderr);
      return true;
    };
  }
  const Completion result = ValueOrDie(engine->Generate(prompt, options));
  const bool print_ids = absl::GetFlag(FLAGS_print_ids) || !tokenizer;
  std::fprintf(print_ids ? stderr : stdout, "\n");
  std::fflush(stdout);
  std::fprintf(stderr, "\n");

  const GenerateStats& stats = result.stats;
  const double prefill_tps = stats.prefill_s > 0 ? stats.prompt_tokens / stats.prefill_s : 0;
  const double decode_tps = stats.decode_s > 0 ? (stats.new_tokens - 1) / stats.decode_s : 0;
  std::fprintf(stderr, "model=%s threads=%d kv_cache=\"%s\"\n", engine->config().name.c_str(),
               at::get_num_threads(),
               DescribeKVCacheSpec(options.kv_cache, engine_options.dtype).c_str());
  std::fprintf(stderr, "prompt_tokens=%lld new_tokens=%lld finish=%s\n",
               static_cast<long long>(stats.prompt_tokens),
               static_cast<long long>(stats.new_tokens), FinishReasonName(result.finish_reason));
  std::fprintf(stderr, "time_to_first_token_s=%.4f\n", stats.time_to_first_token_s);
  std::fprintf(stderr, "prefill_tokens_per_s=%.1f\n", prefill_tps);
  std::fprintf(stderr, "decode_tokens_per_s=%.1f\n", decode_tps);
  std::fprintf(stderr, "kv_cache_bytes=%lld\n", static_cast<long long>(stats.kv_cache_bytes));
  std::fprintf(stderr, "kv_cache_index_bytes=%lld\n",
               static_cast<long long>(result.kv_cache_index_bytes));
  if (const std::string line = SpeculativeStatsLine(options, stats); !line.empty()) {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fprintf(stderr, "peak_rss_bytes=%lld\n", static_cast<long long>(PeakRssBytes()));
  std::fprintf(stderr, "anon_rss_bytes=%lld\n", static_cast<long long>(AnonRssBytes()));
  // Without a tokenizer the ids are the output, so they are printed either way.
  if (print_ids) {
    std::printf("%s\n", absl::StrJoin(result.tokens, " ").c_str());
  }
  return 0;
}
