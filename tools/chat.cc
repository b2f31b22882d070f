// Interactive multi-turn chat with a LitGPT checkpoint (the embedded default model when
// --checkpoint_dir is not given):
//   bazel run //tools:chat -- --checkpoint_dir=DIR [--system="..."] [--kv_cache=sink ...]
// Reads one user message per line from stdin (with line editing and history when stdin is a
// terminal); /reset starts over, /quit (or end of input) ends, /help lists the commands, and
// any other /command is refused rather than sent to the model (// sends a literal "/"). The KV
// cache lives across turns, so each turn prefills only its own tokens (LitGPT re-prefills the whole
// conversation). When the context is full, the tool says so and the conversation can be reset.
#include <ATen/Parallel.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/text/prompt_style.h"
#include "lgpt.h"
#include "tools/generation_flags.h"
#include "tools/line_reader.h"
#include "tools/peft_flags.h"
#include "tools/speculative_flags.h"
#include "tools/tool_util.h"
#include "tools/tp_flags.h"

ABSL_FLAG(std::string, checkpoint_dir, "",
          "LitGPT checkpoint or fine-tune directory; empty: the embedded default model");
ABSL_FLAG(std::string, prompt_style, "",
          "prompt style name (alpaca, llama3, chatml, ...); empty: the checkpoint's own");
ABSL_FLAG(std::string, system, "", "system prompt (styles that have one)");
ABSL_FLAG(int64_t, max_new_tokens, 200, "most tokens per reply");
ABSL_FLAG(bool, stats, true, "print statistics after each reply (on stderr)");

constexpr char kCommands[] =
    "/reset  start a new conversation (empties the KV cache)\n"
    "/quit   end (also /exit, or end of input)\n"
    "/help   this list\n"
    "A message starting with \"/\" is sent as typed after \"//\" (\"//etc\" sends \"/etc\").\n";

int main(int argc, char** argv) {
  using namespace lgpt;
  InitTool(argc, argv, "chat [--checkpoint_dir=DIR] [--system=TEXT] [--prompt_style=NAME]");
  std::string checkpoint_dir = ResolvePath(absl::GetFlag(FLAGS_checkpoint_dir));
  if (checkpoint_dir.empty()) checkpoint_dir = DefaultModelDir();

  RequestOptions options;
  options.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  if (options.max_new_tokens < 1) {
    Die(absl::InvalidArgumentError(
        absl::StrCat("--max_new_tokens must be >= 1, got ", options.max_new_tokens)));
  }
  DieIfError(ApplyGenerationFlags(options));
  const KVCacheSpec kv_cache = options.kv_cache;
  EngineOptions engine_options = ValueOrDie(EngineOptionsFromFlags());
  DieIfError(ApplySpeculativeFlags(options, engine_options));
  engine_options.loras = ValueOrDie(LoraFlags(argc, argv));
  if (std::optional<int> code = ValueOrDie(LaunchTensorParallel(argc, argv))) return *code;
  // Tensor parallel: rank 0 reads the input and shares each line; every rank runs the turn.
  const std::shared_ptr<ProcessGroup> group = ValueOrDie(JoinTensorParallel(engine_options.device));
  engine_options.tensor_parallel = group;
  std::shared_ptr<const Engine> engine = ValueOrDie(Engine::Load(checkpoint_dir, engine_options));
  for (const std::string& warning : engine->warnings()) {
    std::fprintf(stderr, "chat: note: %s\n", warning.c_str());
  }
  const Tokenizer* tokenizer = engine->tokenizer();
  if (!tokenizer) {
    Die(absl::NotFoundError(absl::StrCat(checkpoint_dir, " has no tokenizer: chat needs one")));
  }
  const PromptStyle style =
      absl::GetFlag(FLAGS_prompt_style).empty()
          ? ValueOrDie(PromptStyleForCheckpoint(checkpoint_dir, engine->config()))
          : ValueOrDie(PromptStyleFromName(absl::GetFlag(FLAGS_prompt_style)));
  options.stop_token_sequences = style.StopTokenIds(
      tokenizer->eos_id(), [&](absl::string_view token) -> std::optional<int64_t> {
        absl::StatusOr<int64_t> id = tokenizer->TokenToId(token);
        return id.ok() ? std::optional<int64_t>(*id) : std::nullopt;
      });
  // A chat layout's next turn opens by closing the assistant's turn itself.
  options.keep_stop_token = !style.SupportsChat();
  options.on_text = [](absl::string_view text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return true;
  };
  std::unique_ptr<Session> session = ValueOrDie(engine->NewSession(kv_cache));

  LineReader reader;
  const std::string context =
      UsesCachePositions(kv_cache)
          ? absl::StrCat("context unbounded (the cache streams within ",
                         engine->config().block_size, " positions)")
          : absl::StrCat("context ", engine->config().block_size, " tokens");
  std::fprintf(stderr, "chat: %s, prompt style %s, %s, %s. /help, /reset, /quit\n",
               engine->config().name.c_str(), style.name().c_str(),
               DescribeKVCacheSpec(kv_cache, engine_options.dtype).c_str(), context.c_str());
  std::string line;
  int64_t turn = 0;
  auto next_line = [&](std::string* line) {
    const bool read = (!group || group->rank() == 0) && reader.ReadLine(">> ", line);
    return group ? ValueOrDie(ShareLine(*group, read, line)) : read;
  };
  while (next_line(&line)) {
    std::string message(absl::StripAsciiWhitespace(line));
    if (message.empty()) continue;
    reader.AddHistory(message);
    if (message == "/quit" || message == "/exit") break;
    if (message == "/reset") {
      session->Reset();
      turn = 0;
      std::fprintf(stderr, "(conversation reset)\n");
      continue;
    }
    if (message == "/help") {
      std::fprintf(stderr, "%s", kCommands);
      continue;
    }
    if (absl::StartsWith(message, "//")) {
      message.erase(0, 1);
    } else if (message[0] == '/') {
      std::fprintf(stderr, "chat: unknown command '%s' (/help lists the commands)\n",
                   message.substr(0, message.find(' ')).c_str());
      continue;
    }
    std::string text;
    if (turn == 0) {
      text = style.SupportsChat()
                 ? ValueOrDie(style.ApplyChat(
                       absl::GetFlag(FLAGS_system).empty()
                           ? std::vector<ChatMessage>{{"user", message}}
                           : std::vector<ChatMessage>{{"system", absl::GetFlag(FLAGS_system)},
                                                      {"user", message}}))
                 : style.Apply(message, "", absl::GetFlag(FLAGS_system));
    } else {
      // Only the new turn: the cache already holds everything before it.
      text = style.SupportsChat() ? ValueOrDie(style.ContinueChat(message))
                                  : absl::StrCat("\n\n", style.Apply(message));
    }
    const int64_t before = session->context_tokens();
    absl::StatusOr<Completion> reply = session->Send(text, options);
    if (!reply.ok()) {
      // The conversation goes on: a full context is reported, not fatal.
      std::fprintf(stderr, "chat: %s\n", std::string(reply.status().message()).c_str());
      if (absl::IsOutOfRange(reply.status())) {
        std::fprintf(stderr, "(context full: /reset to start a new conversation)\n");
      }
      continue;
    }
    std::printf("\n");
    std::fflush(stdout);
    ++turn;
    if (reply->finish_reason == FinishReason::kContextFull) {
      std::fprintf(stderr, "(context full: %lld of %lld tokens used; /reset to start over)\n",
                   static_cast<long long>(session->context_tokens()),
                   static_cast<long long>(engine->config().block_size));
    }
    if (absl::GetFlag(FLAGS_stats)) {
      const GenerateStats& s = reply->stats;
      std::fprintf(stderr,
                   "[turn %lld: prefilled %lld tokens (context had %lld) in %.3f s, %lld new "
                   "tokens at %.1f tok/s, finish=%s, kv_cache_bytes=%lld]\n",
                   static_cast<long long>(turn), static_cast<long long>(s.prompt_tokens),
                   static_cast<long long>(before), s.prefill_s,
                   static_cast<long long>(s.new_tokens),
                   s.decode_s > 0 ? (s.new_tokens - 1) / s.decode_s : 0.0,
                   FinishReasonName(reply->finish_reason),
                   static_cast<long long>(session->kv_cache_bytes()));
      if (const std::string line = SpeculativeStatsLine(options, s); !line.empty()) {
        std::fprintf(stderr, "[turn %lld: %s]\n", static_cast<long long>(turn), line.c_str());
      }
    }
  }
  return 0;
}
