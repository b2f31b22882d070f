// Single-stream speculative decoding against plain decoding (core/speculative/README.md):
// tokens/s of the same greedy request without speculation, with prompt lookup at each k, and
// with a draft checkpoint at each k, best of --rounds, with the acceptance rate and tokens per
// verification step. Two prompts: a copy-heavy one (a passage of tools/eval_data/kjv_heldout.txt
// followed by an instruction to repeat it and the passage's first words) and plain held-out
// text (the passage alone, continued). Greedy outputs are checked equal to plain decoding's.
//   bazel run -c opt //tools:bench_speculative -- [--checkpoint_dir=DIR] [--draft_dir=DIR]
//       [--k=2,4,8] [--passage_tokens=256] [--max_new_tokens=128] [--rounds=3] [--threads=N]
// Prints a markdown table on stdout.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/file_util.h"
#include "lgpt.h"
#include "tools/tool_util.h"

ABSL_FLAG(std::string, checkpoint_dir, "", "the model; empty: the embedded default model");
ABSL_FLAG(std::string, draft_dir, "",
          "a draft checkpoint with the model's tokenizer; empty: no draft rows");
ABSL_FLAG(std::vector<std::string>, k, std::vector<std::string>({"2", "4", "8"}),
          "tokens proposed per step, one row each");
ABSL_FLAG(int64_t, ngram_min, 2, "prompt lookup: the shortest suffix looked up");
ABSL_FLAG(int64_t, ngram_max, 4, "prompt lookup: the longest suffix looked up");
ABSL_FLAG(int64_t, passage_tokens, 256, "tokens of held-out text in each prompt");
ABSL_FLAG(int64_t, max_new_tokens, 128, "tokens generated per request");
ABSL_FLAG(int64_t, rounds, 3, "runs of each row; the fastest counts");
ABSL_FLAG(std::string, copy_instruction, "\n\nRepeat the passage above word for word:\n\n",
          "the copy-heavy prompt's text between the passage and its first words (a base model "
          "that follows no instruction copies after a plain paragraph break: \"\\n\\n\")");

namespace lgpt {
namespace {

struct Row {
  std::string prompt;
  std::string method;  // none, ngram, draft
  int64_t k = 0;
  double tokens_per_s = 0;
  GenerateStats stats;
  bool equal = true;  // the tokens equal plain decoding's
};

// The fastest of `rounds` runs (decode tokens/s, the first token's prefill excluded).
Row Measure(const Engine& engine, const std::vector<int64_t>& prompt, const std::string& name,
            const std::string& method, int64_t k, const std::vector<int64_t>& reference,
            std::vector<int64_t>* tokens) {
  RequestOptions options;
  options.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  options.sampling.temperature = 0;
  options.stop_at_eos = false;
  if (method != "none") {
    options.speculative.method = method;
    options.speculative.num_speculative_tokens = k;
    options.speculative.prompt_lookup_min = absl::GetFlag(FLAGS_ngram_min);
    options.speculative.prompt_lookup_max = absl::GetFlag(FLAGS_ngram_max);
  }
  Row row;
  row.prompt = name;
  row.method = method;
  row.k = k;
  for (int64_t round = 0; round < std::max<int64_t>(1, absl::GetFlag(FLAGS_rounds)); ++round) {
    const Completion done = ValueOrDie(engine.Generate(prompt, options));
    const GenerateStats& s = done.stats;
    const double rate = s.decode_s > 0 ? (s.new_tokens - 1) / s.decode_s : 0;
    if (rate > row.tokens_per_s) {
      row.tokens_per_s = rate;
      row.stats = s;
    }
    if (tokens != nullptr) *tokens = done.tokens;
    row.equal = row.equal && (reference.empty() || done.tokens == reference);
  }
  return row;
}

}  // namespace
}  // namespace lgpt

int main(int argc, char** argv) {
  using namespace lgpt;
  InitTool(argc, argv,
           "bench_speculative [--checkpoint_dir=DIR] [--draft_dir=DIR] [--k=2,4,8] "
           "[--passage_tokens=N] [--max_new_tokens=N] [--rounds=N]");
  std::string checkpoint_dir = ResolvePath(absl::GetFlag(FLAGS_checkpoint_dir));
  if (checkpoint_dir.empty()) checkpoint_dir = DefaultModelDir();
  EngineOptions engine_options;
  engine_options.draft_checkpoint_dir = ResolvePath(absl::GetFlag(FLAGS_draft_dir));
  const std::shared_ptr<const Engine> engine =
      ValueOrDie(Engine::Load(checkpoint_dir, engine_options));
  std::vector<int64_t> ks;
  for (const std::string& k : absl::GetFlag(FLAGS_k)) {
    ks.push_back(ValueOrDie(ParseIds(k, "k"))[0]);
  }
  const std::string text =
      ValueOrDie(ReadFileToString(RunfilesPath("tools/eval_data/kjv_heldout.txt")));
  const std::vector<int64_t> all = ValueOrDie(engine->Encode(text));
  const int64_t passage_tokens =
      std::min<int64_t>(absl::GetFlag(FLAGS_passage_tokens), static_cast<int64_t>(all.size()) / 2);
  const std::vector<int64_t> passage(all.begin(), all.begin() + passage_tokens);
  // Copy-heavy: the passage, the instruction, the passage's first words.
  std::vector<int64_t> copy = passage;
  const std::vector<int64_t> instruction =
      ValueOrDie(engine->tokenizer()->Encode(absl::GetFlag(FLAGS_copy_instruction),
                                             /*bos=*/false));
  copy.insert(copy.end(), instruction.begin(), instruction.end());
  copy.insert(copy.end(), passage.begin() + 1,
              passage.begin() + std::min<int64_t>(9, passage_tokens));
  // Held-out text: another passage, continued.
  const std::vector<int64_t> heldout(all.begin() + passage_tokens,
                                     all.begin() + 2 * passage_tokens);

  std::vector<Row> rows;
  for (const auto& [name, prompt] : {std::make_pair(std::string("copy"), copy),
                                     std::make_pair(std::string("held-out"), heldout)}) {
    std::vector<int64_t> reference;
    rows.push_back(Measure(*engine, prompt, name, "none", 0, {}, &reference));
    for (const int64_t k : ks) {
      rows.push_back(Measure(*engine, prompt, name, "ngram", k, reference, nullptr));
      if (engine->draft_model()) {
        rows.push_back(Measure(*engine, prompt, name, "draft", k, reference, nullptr));
      }
    }
  }
  std::printf(
      "| prompt | method | k | decode tokens/s | speed-up | acceptance | tokens/verify step "
      "| same tokens |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  double base = 0;
  for (const Row& row : rows) {
    if (row.method == "none") base = row.tokens_per_s;
    const GenerateStats& s = row.stats;
    const double per_step =
        s.verify_steps > 0
            ? static_cast<double>(s.accepted_tokens + s.verify_steps) / s.verify_steps
            : 1.0;
    std::printf(
        "%s\n",
        absl::StrFormat(
            "| %s | %s | %d | %.1f | %.2fx | %s | %.2f | %s |", row.prompt, row.method, row.k,
            row.tokens_per_s, base > 0 ? row.tokens_per_s / base : 0.0,
            row.method == "none" ? std::string("-") : absl::StrFormat("%.3f", s.acceptance_rate()),
            per_step, row.equal ? "yes" : "NO")
            .c_str());
  }
  std::fprintf(stderr, "model=%s draft=%s passage_tokens=%lld max_new_tokens=%lld\n",
               engine->config().name.c_str(),
               engine->draft_model() ? engine->draft_model()->config().name.c_str() : "none",
               static_cast<long long>(passage_tokens),
               static_cast<long long>(absl::GetFlag(FLAGS_max_new_tokens)));
  return 0;
}
