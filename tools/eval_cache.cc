// Quality against memory of the KV cache policies: teacher-forced perplexity of a long token
// sequence through every policy x budget x bits combination, with the dense 16-bit cache as
// the baseline.
//
//   bazel run //tools:eval_cache -- --checkpoint_dir=DIR --text_file=FILE
//       --budgets=64,128,256 --policies=dense,window,sink,h2o --bits=16,8,4 --out_dir=DIR
//
// Tokens come from --text_file (tokenised with the checkpoint's tokenizer), --token_file
// (ids separated by commas or whitespace) or --random_tokens=N (a smoke run); the model from
// --checkpoint_dir or --random_model=PRESET (random weights: the machinery, not quality).
// With no flags at all it evaluates the embedded default model on its held-out text
// (tools/eval_data/kjv_heldout.txt, one verse a line between BOS and EOS) into
// ./eval_cache_out. Sequences longer than the model's context are cut into segments of
// --segment tokens (default: the block size the model was trained at), each starting from an
// empty cache. Every segment is fed
// --chunk tokens a step (1: token by token, so every step is a decode step and the timing is
// decode throughput); each step's logits score the next tokens.
//
// --kv_positions=cache streams window and sink caches with positions within the cache
// (cache/policy_kv_cache.h): their segments may then be longer than the block size (e.g. the
// whole text, --segment=1000000), while the dense baseline keeps context-sized segments.
//
// Writes OUT_DIR/results.csv, OUT_DIR/results.md (policy, budget, bits, kv_bytes, perplexity,
// ratio to dense, decode tokens/s) and OUT_DIR/ppl_vs_kv_bytes.png; prints progress with an
// ETA and each row as it completes on stderr, and the markdown table on stdout. The CSV is
// written row by row to OUT_DIR/results.csv.partial (flushed after each row, so a killed run
// keeps its finished rows there) and renamed to results.csv when every row is done: a file
// named results.csv is always complete. "bits" is the width the cache really stores: --bits=16
// means the model's own dtype and is reported as 32 for a float32 model.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cache/attention_probe.h"
#include "cache/kv_cache_factory.h"
#include "core/base/device.h"
#include "core/base/output_dir.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "core/config/config_presets.h"
#include "core/model/cache_positions.h"
#include "core/model/checkpoint.h"
#include "core/model/gpt.h"
#include "core/text/tokenizer.h"
#include "tools/load_flags.h"
#include "tools/model_memory.h"
#include "tools/peft_flags.h"
#include "tools/plot.h"
#include "tools/progress.h"
#include "tools/tool_util.h"

ABSL_FLAG(std::string, checkpoint_dir, "",
          "LitGPT checkpoint or fine-tune directory; empty: the embedded default model");
ABSL_FLAG(std::string, random_model, "",
          "instead of a checkpoint: a LitGPT preset name with random weights (smoke runs)");
ABSL_FLAG(uint64_t, seed, 1234, "seed of --random_model and --random_tokens");
ABSL_FLAG(std::string, text_file, "",
          "text to score (needs the checkpoint's tokenizer); with no token source at all, the "
          "default model scores its held-out text (tools/eval_data/kjv_heldout.txt)");
ABSL_FLAG(bool, lines_bos_eos, false,
          "tokenise each line of --text_file on its own, between BOS and EOS (the format "
          "//tools:pretrain trains on); else the whole text at once");
ABSL_FLAG(std::string, token_file, "", "token ids to score, separated by commas or whitespace");
ABSL_FLAG(int64_t, random_tokens, 0, "score this many random token ids (smoke runs)");
ABSL_FLAG(int64_t, max_tokens, 0, "score at most this many tokens; 0: all");
ABSL_FLAG(std::string, budgets, "64,128,256", "entries per layer, comma-separated");
ABSL_FLAG(std::string, policies, "dense,window,sink,h2o",
          "dense, window, sink, h2o, tova, h2o-vlen, qh2o (8/4 bits only: skipped at 16)");
ABSL_FLAG(std::string, bits, "16,8,4",
          "16 (full precision: the model's dtype, reported with its real width, e.g. 32 for "
          "float32), 8, 4; comma-separated");
ABSL_FLAG(int64_t, kv_sink, 4, "sink tokens of the sink policy");
ABSL_FLAG(int64_t, kv_residual, 16, "quantised caches: recent entries kept in full precision");
ABSL_FLAG(int64_t, kv_group, 32, "quantised caches: channels sharing one scale");
ABSL_FLAG(double, kv_recent_fraction, 0.5, "h2o: the recent window's share of the budget");
ABSL_FLAG(int64_t, kv_grace, -1, "score policies: newest positions never evicted (-1: default)");
ABSL_FLAG(bool, kv_normalize_scores, false, "h2o family: scores per query that saw the entry");
ABSL_FLAG(std::string, kv_budget_rule, "uniform", "uniform or pyramid (per-layer budgets)");
ABSL_FLAG(int64_t, chunk, 1, "tokens fed a step (1: token by token)");
ABSL_FLAG(std::string, kv_positions, "absolute",
          "absolute, or cache: window and sink caches stream with positions within the cache, "
          "so --segment may pass the block size (the dense baseline stays within it)");
ABSL_FLAG(int64_t, segment, 0, "tokens per independent segment; 0: the model's block size");
ABSL_FLAG(std::string, out_dir, "eval_cache_out",
          "directory for results.csv, results.md and the plot (created)");
ABSL_FLAG(bool, attention_report, true,
          "one more dense pass measuring, per layer and head, the attention weight on the first "
          "--kv_sink tokens (whether the model keeps attention sinks the sink policy can save)");
ABSL_FLAG(int64_t, attention_report_from, -1,
          "attention report: measure queries at this position and later; -1: half a segment, "
          "at most 64");
ABSL_FLAG(std::string, precision, "32-true", "32-true, bf16-true or 16-true");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda[:N]");

namespace lgpt {
namespace {

constexpr char kHeldOutText[] = "tools/eval_data/kjv_heldout.txt";

struct Row {
  KVCacheSpec spec;
  int64_t kv_bytes = 0;
  int64_t index_bytes = 0;
  double perplexity = 0;
  double decode_tokens_per_s = 0;
  int64_t scored = 0;
};

absl::StatusOr<std::vector<int64_t>> ParseList(const std::string& text, const std::string& flag) {
  std::vector<int64_t> values;
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(piece), &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", piece, "' is not an integer"));
    }
    values.push_back(v);
  }
  if (values.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, " is empty"));
  return values;
}

absl::StatusOr<std::string> ReadFile(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--", flag, ": cannot read ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

absl::StatusOr<std::vector<int64_t>> ReadTokenFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path, "token_file"));
  std::vector<int64_t> ids;
  for (absl::string_view piece :
       absl::StrSplit(text, absl::ByAnyChar(", \t\r\n"), absl::SkipEmpty())) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(piece, &id) || id < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--token_file ", path, ": '", piece,
                                                     "' is not a non-negative integer token id"));
    }
    ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<LoadedModel> LoadModel(c10::ScalarType dtype, c10::Device device,
                                      const std::vector<LoraAdapterSpec>& loras) {
  const std::string random = absl::GetFlag(FLAGS_random_model);
  if (!random.empty() && !loras.empty()) {
    return absl::InvalidArgumentError("--lora applies to a --checkpoint_dir, not a --random_model");
  }
  if (!random.empty()) {
    ASSIGN_OR_RETURN(Config config, ConfigFromName(random));
    RETURN_IF_ERROR(CheckParametersFitMemory(config, 4, "initialising them"));
    at::manual_seed(absl::GetFlag(FLAGS_seed));
    ASSIGN_OR_RETURN(GPT model, GPTImpl::Create(config));
    model->To(device, dtype);
    model->eval();
    return LoadedModel{config, model};
  }
  std::string dir = ResolvePath(absl::GetFlag(FLAGS_checkpoint_dir));
  if (dir.empty()) dir = DefaultModelDir();
  LoadOptions load;
  load.dtype = dtype;
  load.device = device;
  load.progress = PrintProgress;
  ApplyLoadFlags(load);
  return LoadModelWithPeft(dir, loras, load, "--lora");
}

absl::StatusOr<std::vector<int64_t>> LoadTokens(const Config& config) {
  std::string text_file = ResolvePath(absl::GetFlag(FLAGS_text_file));
  const std::string token_file = absl::GetFlag(FLAGS_token_file);
  const int64_t random = absl::GetFlag(FLAGS_random_tokens);
  const bool random_model = !absl::GetFlag(FLAGS_random_model).empty();
  bool lines_bos_eos = absl::GetFlag(FLAGS_lines_bos_eos);
  const int sources = (!text_file.empty()) + (!token_file.empty()) + (random > 0);
  if (sources == 0 && !random_model && absl::GetFlag(FLAGS_checkpoint_dir).empty()) {
    // The default model on the text it never saw, in the format it was trained on.
    text_file = RunfilesPath(kHeldOutText);
    lines_bos_eos = true;
    std::fprintf(stderr, "tokens: the default model's held-out text %s\n", kHeldOutText);
  } else if (sources != 1) {
    return absl::InvalidArgumentError(
        "pass exactly one of --text_file, --token_file and --random_tokens=N");
  }
  std::vector<int64_t> ids;
  if (!text_file.empty()) {
    if (random_model) {
      return absl::UnimplementedError(
          "--text_file needs a checkpoint's tokenizer (--checkpoint_dir); a --random_model has "
          "none: pass --token_file or --random_tokens");
    }
    std::string checkpoint_dir = ResolvePath(absl::GetFlag(FLAGS_checkpoint_dir));
    if (checkpoint_dir.empty()) checkpoint_dir = DefaultModelDir();
    auto tokenizer = Tokenizer::Load(checkpoint_dir);
    if (!tokenizer.ok()) {
      return absl::Status(tokenizer.status().code() == absl::StatusCode::kNotFound
                              ? absl::StatusCode::kUnimplemented
                              : tokenizer.status().code(),
                          absl::StrCat("--text_file needs a tokenizer in --checkpoint_dir (",
                                       tokenizer.status().message(),
                                       "); pass --token_file with token ids instead"));
    }
    RETURN_IF_ERROR((*tokenizer)->CheckFitsVocabulary(config.PaddedVocabSize()));
    ASSIGN_OR_RETURN(const std::string text, ReadFile(text_file, "text_file"));
    if (lines_bos_eos) {
      for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
        ASSIGN_OR_RETURN(const std::vector<int64_t> line_ids,
                         (*tokenizer)->Encode(line, /*bos=*/true, /*eos=*/true));
        ids.insert(ids.end(), line_ids.begin(), line_ids.end());
      }
    } else {
      ASSIGN_OR_RETURN(ids, (*tokenizer)->Encode(text));
    }
  } else if (!token_file.empty()) {
    ASSIGN_OR_RETURN(ids, ReadTokenFile(ResolvePath(token_file)));
  } else {
    at::manual_seed(absl::GetFlag(FLAGS_seed) + 1);
    const at::Tensor t = at::randint(0, config.vocab_size, {random}, at::kLong);
    ids.assign(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + random);
  }
  const int64_t max_tokens = absl::GetFlag(FLAGS_max_tokens);
  if (max_tokens > 0 && static_cast<int64_t>(ids.size()) > max_tokens) ids.resize(max_tokens);
  if (ids.size() < 2) return absl::InvalidArgumentError("need at least 2 tokens to score");
  for (int64_t id : ids) {
    if (id >= config.PaddedVocabSize()) {
      return absl::OutOfRangeError(absl::StrCat("token id ", id, " is outside the vocabulary of ",
                                                config.PaddedVocabSize()));
    }
  }
  return ids;
}

// Teacher-forced negative log-likelihood of `tokens` through `cache`, segment by segment.
// `on_step` (if set) gets the tokens scored so far after every step.
absl::StatusOr<Row> Evaluate(GPTImpl& model, KVCache& cache, const KVCacheSpec& spec,
                             const std::vector<int64_t>& tokens, int64_t segment, int64_t chunk,
                             const std::function<void(int64_t)>& on_step = nullptr) {
  at::NoGradGuard no_grad;
  Row row;
  row.spec = spec;
  double nll = 0, decode_s = 0;
  int64_t decode_steps = 0;
  const at::Tensor all = at::tensor(tokens, at::kLong).unsqueeze(0).to(model.device());
  const int64_t total = static_cast<int64_t>(tokens.size());
  int64_t steps = 0;
  for (int64_t begin = 0; begin + 1 < total; begin += segment) {
    const int64_t length = std::min(segment, total - begin);
    cache.Reset();
    CachePositions stream(model, cache);
    for (int64_t position = 0; position + 1 < length; position += steps) {
      ASSIGN_OR_RETURN(steps, stream.MakeRoom(std::min(chunk, length - 1 - position)));
      ForwardOptions options;
      options.positions = stream.Take(steps);
      const auto start = std::chrono::steady_clock::now();
      ASSIGN_OR_RETURN(const at::Tensor logits,
                       model.Forward(all.narrow(1, begin + position, steps), &cache, options));
      const at::Tensor targets = all.narrow(1, begin + position + 1, steps).reshape({-1});
      const at::Tensor log_probs = at::log_softmax(logits.reshape({steps, -1}).to(at::kFloat), -1);
      nll -= log_probs.gather(1, targets.unsqueeze(1)).sum().item<double>();
      if (steps == 1) {
        decode_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        ++decode_steps;
      }
      row.scored += steps;
      if (on_step) on_step(row.scored);
    }
    row.kv_bytes = std::max(row.kv_bytes, cache.AllocatedBytes());
    row.index_bytes = std::max(row.index_bytes, cache.IndexBytes());
  }
  row.perplexity = std::exp(nll / std::max<int64_t>(row.scored, 1));
  row.decode_tokens_per_s = decode_s > 0 ? decode_steps / decode_s : 0;
  return row;
}

Color PolicyColor(const std::string& policy) {
  if (policy == "dense") return {0, 0, 0};
  if (policy == "window") return {214, 39, 40};
  if (policy == "sink") return {31, 119, 180};
  if (policy == "h2o") return {44, 160, 44};
  if (policy == "tova") return {255, 127, 14};
  return {148, 103, 189};
}

Marker BitsMarker(int bits) {
  return bits == 16 ? Marker::kCircle : bits == 8 ? Marker::kSquare : Marker::kTriangle;
}

// The width the cache stores: bits 16 means full precision, i.e. the model's own dtype.
int StoredBits(const KVCacheSpec& spec, c10::ScalarType dtype) {
  return spec.bits == 16 ? static_cast<int>(c10::elementSize(dtype)) * 8 : spec.bits;
}

// "sink budget=32 8-bit", "dense 32-bit".
std::string RowLabel(const KVCacheSpec& spec, c10::ScalarType dtype) {
  return absl::StrCat(spec.policy,
                      spec.policy == "dense" ? "" : absl::StrCat(" budget=", spec.budget), " ",
                      StoredBits(spec, dtype), "-bit");
}

// Tokens a pass scores: every token but the last of each segment.
int64_t ScoredPerPass(int64_t total, int64_t segment) {
  int64_t scored = 0;
  for (int64_t begin = 0; begin + 1 < total; begin += segment) {
    scored += std::min(segment, total - begin) - 1;
  }
  return scored;
}

int Run(const std::vector<LoraAdapterSpec>& loras) {
  const c10::ScalarType dtype = ValueOrDie(ParsePrecision(absl::GetFlag(FLAGS_precision)));
  const c10::Device device = ValueOrDie(ParseDevice(absl::GetFlag(FLAGS_device)));
  const std::string out_dir = ResolvePath(absl::GetFlag(FLAGS_out_dir));
  if (out_dir.empty()) Die(absl::InvalidArgumentError("--out_dir is required"));
  // The results never go into the checkpoint they measure (they were written beside its
  // weights).
  if (absl::GetFlag(FLAGS_random_model).empty()) {
    std::string checkpoint_dir = ResolvePath(absl::GetFlag(FLAGS_checkpoint_dir));
    if (checkpoint_dir.empty()) checkpoint_dir = DefaultModelDir();
    DieIfError(OutputDir::Check(out_dir, ModelInputDirs(checkpoint_dir, loras)));
  }
  const std::vector<int64_t> budgets =
      ValueOrDie(ParseList(absl::GetFlag(FLAGS_budgets), "budgets"));
  const std::vector<int64_t> bits_list = ValueOrDie(ParseList(absl::GetFlag(FLAGS_bits), "bits"));
  std::vector<std::string> policies =
      absl::StrSplit(absl::GetFlag(FLAGS_policies), ',', absl::SkipWhitespace());
  if (policies.empty()) Die(absl::InvalidArgumentError("--policies is empty"));
  const int64_t chunk = absl::GetFlag(FLAGS_chunk);
  if (chunk < 1) Die(absl::InvalidArgumentError(absl::StrCat("--chunk must be >= 1, got ", chunk)));
  // Negative values were taken silently as their defaults (all tokens, the block size).
  for (const auto& [flag, value] :
       {std::pair<const char*, int64_t>{"segment", absl::GetFlag(FLAGS_segment)},
        {"max_tokens", absl::GetFlag(FLAGS_max_tokens)},
        {"random_tokens", absl::GetFlag(FLAGS_random_tokens)}}) {
    if (value < 0) {
      Die(absl::InvalidArgumentError(absl::StrCat("--", flag, " must be >= 0, got ", value)));
    }
  }
  // The attention report measures the first --kv_sink tokens (AttentionProbeOptions named them).
  if (absl::GetFlag(FLAGS_attention_report) && absl::GetFlag(FLAGS_kv_sink) < 1) {
    Die(absl::InvalidArgumentError(absl::StrCat(
        "--kv_sink must be >= 1 with --attention_report, got ", absl::GetFlag(FLAGS_kv_sink))));
  }
  if (absl::GetFlag(FLAGS_attention_report_from) < -1) {
    Die(absl::InvalidArgumentError(
        absl::StrCat("--attention_report_from must be >= 0 (or -1: half a segment), got ",
                     absl::GetFlag(FLAGS_attention_report_from))));
  }

  // Every combination is checked before the (long) runs start.
  std::vector<KVCacheSpec> specs;
  auto add = [&](const std::string& policy, int64_t budget, int64_t bits) {
    KVCacheSpec spec;
    spec.policy = policy;
    spec.budget = policy == "dense" ? 0 : budget;
    spec.bits = static_cast<int>(bits);
    spec.sink_tokens = absl::GetFlag(FLAGS_kv_sink);
    spec.residual = absl::GetFlag(FLAGS_kv_residual);
    spec.group_size = absl::GetFlag(FLAGS_kv_group);
    spec.recent_fraction = absl::GetFlag(FLAGS_kv_recent_fraction);
    spec.grace_period = absl::GetFlag(FLAGS_kv_grace);
    spec.normalize_scores = absl::GetFlag(FLAGS_kv_normalize_scores);
    if (policy != "dense") spec.budget_rule = absl::GetFlag(FLAGS_kv_budget_rule);
    if (policy == "qh2o" && bits == 16) return;  // scores quantisation error: 8/4 bits only
    if (policy != "dense") spec.positions = absl::GetFlag(FLAGS_kv_positions);
    if (absl::Status status = ValidateKVCacheSpec(spec); !status.ok()) {
      Die(WithMessage(status,
                      absl::StrCat("--policies/--budgets/--bits combination ", policy, " budget ",
                                   budget, " bits ", bits, ": ", status.message())));
    }
    for (const KVCacheSpec& s : specs) {
      if (s.policy == spec.policy && s.budget == spec.budget && s.bits == spec.bits) return;
    }
    specs.push_back(spec);
  };
  add("dense", 0, 16);  // the baseline
  for (const std::string& policy : policies) {
    for (int64_t bits : bits_list) {
      if (policy == "dense") {
        add(policy, 0, bits);
        continue;
      }
      for (int64_t budget : budgets) add(policy, budget, bits);
    }
  }

  LoadedModel loaded = ValueOrDie(LoadModel(dtype, device, loras));
  const std::vector<int64_t> tokens = ValueOrDie(LoadTokens(loaded.config));
  int64_t segment = absl::GetFlag(FLAGS_segment);
  const bool streaming = absl::GetFlag(FLAGS_kv_positions) == "cache";
  if (segment <= 0 || (segment > loaded.config.block_size && !streaming)) {
    segment = loaded.config.block_size;
  }
  segment = std::min<int64_t>(segment, tokens.size());
  if (segment < 2) Die(absl::InvalidArgumentError("--segment must be >= 2"));
  // Segments of caches with cache positions may pass the context; the others stay within it.
  const int64_t context_segment = std::min(segment, loaded.config.block_size);
  auto segment_of = [&](const KVCacheSpec& spec) {
    return UsesCachePositions(spec) ? segment : context_segment;
  };
  if (::mkdir(out_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    Die(absl::NotFoundError(absl::StrCat("--out_dir: cannot create ", out_dir)));
  }
  // Rows go to results.csv.partial as they finish; results.csv appears only when complete.
  const std::string csv_path = out_dir + "/results.csv";
  const std::string partial_path = csv_path + ".partial";
  std::remove(csv_path.c_str());
  std::FILE* csv_file = std::fopen(partial_path.c_str(), "w");
  if (csv_file == nullptr) Die(absl::NotFoundError(absl::StrCat("cannot write ", partial_path)));
  auto write_csv = [&](const std::string& text) {
    if (std::fputs(text.c_str(), csv_file) < 0 || std::fflush(csv_file) != 0) {
      Die(absl::DataLossError(absl::StrCat("cannot write ", partial_path)));
    }
  };
  write_csv(
      "policy,budget,bits,kv_bytes,kv_index_bytes,kv_bytes_ratio,perplexity,ppl_ratio,"
      "decode_tokens_per_s,scored_tokens\n");

  KVCacheShape shape;
  shape.max_sequence_length = context_segment;
  shape.layers = loaded.model->CacheLayout();
  shape.dtype = dtype;
  shape.device = device;
  shape.initial_capacity = context_segment;
  std::fprintf(
      stderr, "model %s (%lld layers), %zu tokens in segments of %lld, chunk %lld, %d threads\n",
      loaded.config.name.c_str(), static_cast<long long>(loaded.config.n_layer), tokens.size(),
      static_cast<long long>(segment), static_cast<long long>(chunk), at::get_num_threads());

  // Progress over every pass (one per row, one more for the attention report), token by token.
  const bool attention_report = absl::GetFlag(FLAGS_attention_report);
  const int64_t per_pass = ScoredPerPass(static_cast<int64_t>(tokens.size()), segment);
  const int64_t passes = static_cast<int64_t>(specs.size()) + (attention_report ? 1 : 0);
  Progress progress("eval_cache: tokens", per_pass * passes);
  int64_t pass = 0;
  std::string pass_label;
  auto on_step = [&](int64_t scored) { progress.Update(pass * per_pass + scored, pass_label); };

  std::vector<Row> rows;
  for (size_t i = 0; i < specs.size(); ++i, ++pass) {
    pass_label = absl::StrCat("row ", i + 1, "/", specs.size(), ": ", RowLabel(specs[i], dtype));
    std::unique_ptr<KVCache> cache = ValueOrDie(MakeKVCache(specs[i], shape));
    Row row = ValueOrDie(
        Evaluate(*loaded.model, *cache, specs[i], tokens, segment_of(specs[i]), chunk, on_step));
    rows.push_back(row);
    const Row& dense = rows[0];  // the baseline comes first
    const double kv_ratio = static_cast<double>(row.kv_bytes) / dense.kv_bytes;
    const double ppl_ratio = row.perplexity / dense.perplexity;
    write_csv(absl::StrFormat("%s,%s,%d,%lld,%lld,%.6f,%.6f,%.6f,%.2f,%lld\n", row.spec.policy,
                              row.spec.policy == "dense" ? "" : absl::StrCat(row.spec.budget),
                              StoredBits(row.spec, dtype), static_cast<long long>(row.kv_bytes),
                              static_cast<long long>(row.index_bytes), kv_ratio, row.perplexity,
                              ppl_ratio, row.decode_tokens_per_s,
                              static_cast<long long>(row.scored)));
    progress.Message(
        absl::StrFormat("[%zu/%zu] %-26s ppl %9.4f (%.4fx dense)  kv %10lld bytes  %7.1f tok/s",
                        i + 1, specs.size(), RowLabel(specs[i], dtype), row.perplexity, ppl_ratio,
                        static_cast<long long>(row.kv_bytes), row.decode_tokens_per_s));
  }

  std::string attention_md;
  if (attention_report) {
    AttentionProbeOptions probe_options;
    probe_options.first_tokens = absl::GetFlag(FLAGS_kv_sink);
    probe_options.min_query_position = absl::GetFlag(FLAGS_attention_report_from) >= 0
                                           ? absl::GetFlag(FLAGS_attention_report_from)
                                           : std::min<int64_t>(64, context_segment / 2);
    std::unique_ptr<AttentionProbe> probe =
        ValueOrDie(AttentionProbe::Create(ValueOrDie(MakeKVCache(specs[0], shape)), probe_options));
    pass_label = absl::StrCat("attention report: dense pass measuring the first ",
                              probe_options.first_tokens, " tokens");
    ValueOrDie(Evaluate(*loaded.model, *probe, specs[0], tokens, context_segment, chunk, on_step));
    const AttentionStartMass mass = probe->Result();
    attention_md = absl::StrFormat(
        "\n## Attention on the first %lld tokens (dense pass)\n\n"
        "Mean attention weight that queries at position %lld or later put on positions "
        "0..%lld, per layer: the mean over heads, the strongest head, and what uniform "
        "attention would give. A sink policy beats a plain window by keeping this mass "
        "available; heads far above uniform are attention sinks.\n\n"
        "| layer | mean over heads | strongest head | uniform | queries |\n"
        "| ---: | ---: | ---: | ---: | ---: |\n",
        static_cast<long long>(probe_options.first_tokens),
        static_cast<long long>(probe_options.min_query_position),
        static_cast<long long>(probe_options.first_tokens - 1));
    for (size_t layer = 0; layer < mass.per_head.size(); ++layer) {
      const std::vector<double>& heads = mass.per_head[layer];
      double mean = 0, strongest = 0;
      int64_t strongest_head = 0;
      for (size_t h = 0; h < heads.size(); ++h) {
        mean += heads[h] / heads.size();
        if (heads[h] > strongest) strongest = heads[h], strongest_head = static_cast<int64_t>(h);
      }
      absl::StrAppendFormat(&attention_md, "| %zu | %.4f | %.4f (head %lld) | %.4f | %lld |\n",
                            layer, mean, strongest, static_cast<long long>(strongest_head),
                            mass.uniform[layer], static_cast<long long>(mass.queries[layer]));
    }
    progress.Finish();
    std::fprintf(stderr, "%s", attention_md.c_str());
  }
  progress.Finish();

  const Row& dense = rows[0];
  std::string md = absl::StrFormat(
      "# KV cache policies: perplexity against KV memory\n\n"
      "Model `%s` (%lld layers, %s), %zu tokens scored teacher-forced in segments of %lld, "
      "%lld token(s) a step; KV bytes are the cache's storage (scales included) at the end of "
      "a segment, index bytes (positions, scores) apart; ratios are to the dense cache at the "
      "model's dtype. Decode tokens/s: whole-model steps of one token.\n\n"
      "| policy | budget | bits | kv_bytes | kv ratio | perplexity | ppl ratio | decode tok/s |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
      loaded.config.name, static_cast<long long>(loaded.config.n_layer),
      absl::GetFlag(FLAGS_precision), tokens.size(), static_cast<long long>(segment),
      static_cast<long long>(chunk));
  std::map<std::pair<std::string, int>, Series> series;
  for (const Row& row : rows) {
    const double kv_ratio = static_cast<double>(row.kv_bytes) / dense.kv_bytes;
    const double ppl_ratio = row.perplexity / dense.perplexity;
    const std::string budget = row.spec.policy == "dense" ? "-" : absl::StrCat(row.spec.budget);
    absl::StrAppendFormat(&md, "| %s | %s | %d | %lld | %.3f | %.4f | %.4f | %.1f |\n",
                          row.spec.policy, budget, StoredBits(row.spec, dtype),
                          static_cast<long long>(row.kv_bytes), kv_ratio, row.perplexity, ppl_ratio,
                          row.decode_tokens_per_s);
    Series& s = series[{row.spec.policy, row.spec.bits}];
    s.label = absl::StrCat(row.spec.policy, " ", StoredBits(row.spec, dtype), "-bit");
    s.color = PolicyColor(row.spec.policy);
    s.marker = BitsMarker(row.spec.bits);
    s.points.push_back({static_cast<double>(row.kv_bytes), row.perplexity});
    s.point_labels.push_back(row.spec.policy == "dense" ? "" : budget);
  }
  if (streaming && segment > context_segment) {
    absl::StrAppendFormat(&md,
                          "\nWindow and sink rows use cache positions (--kv_positions=cache): each "
                          "segment of %lld tokens streams through one cache; dense rows score "
                          "segments of %lld (the context).\n",
                          static_cast<long long>(segment), static_cast<long long>(context_segment));
  }
  absl::StrAppend(&md,
                  "\nPlot: `ppl_vs_kv_bytes.png` (x: KV bytes, log scale; colour: policy — "
                  "dense black, window red, sink blue, h2o green, tova orange; marker: bits — "
                  "full precision circle, 8 square, 4 triangle; labels: the budget).\n");
  absl::StrAppend(&md, attention_md);
  std::vector<Series> plotted;
  for (auto& [key, s] : series) plotted.push_back(s);
  PlotOptions plot;
  plot.title = absl::StrCat("Perplexity vs KV bytes: ", loaded.config.name);
  plot.x_label = "KV cache bytes (log scale)";
  plot.y_label = "perplexity";
  plot.log_x = true;
  plot.x_bytes = true;
  plot.note = "labels: budget";
  // Atomically: a run killed while writing left a truncated results.md.
  DieIfError(WriteFileAtomically(out_dir + "/results.md", md));
  DieIfError(WritePng(out_dir + "/ppl_vs_kv_bytes.png", ScatterPlot(plotted, plot)));
  if (std::fclose(csv_file) != 0 || std::rename(partial_path.c_str(), csv_path.c_str()) != 0) {
    Die(absl::DataLossError(absl::StrCat("cannot write ", csv_path)));
  }
  std::printf("%s", md.c_str());
  std::fflush(stdout);
  std::fprintf(stderr, "wrote %s/results.csv, results.md, ppl_vs_kv_bytes.png\n", out_dir.c_str());
  return 0;
}

}  // namespace
}  // namespace lgpt

int main(int argc, char** argv) {
  lgpt::InitTool(argc, argv,
                 "eval_cache [--checkpoint_dir=DIR] [--text_file=F | --token_file=F | "
                 "--random_tokens=N] [--budgets=64,128] [--policies=dense,window,sink,h2o] "
                 "[--bits=16,8,4] [--out_dir=DIR]; no flags: the default model on its held-out "
                 "text");
  return lgpt::Run(lgpt::ValueOrDie(lgpt::LoraFlags(argc, argv)));
}
