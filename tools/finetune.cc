// Fine-tunes a LitGPT checkpoint on Alpaca-style instruction data (a JSON list of
// {instruction, input, output}), as `litgpt finetune` does:
//   bazel run //tools:finetune -- --method=lora|adapter|adapter_v2|full
//       --checkpoint_dir=DIR --data=FILE.json --out_dir=DIR [--prompt_style=alpaca]
//       [--lora_r=8 --lora_alpha=16 ...] [--max_steps=N | --epochs=N] [--merge]
// The loss covers the response tokens only. Only the method's parameters train (the base
// stays frozen). out_dir gets the trained parameters alone under LitGPT's names
// (lit_model.pth.lora / .adapter / .adapter_v2; lit_model.pth for full), model_config.yaml
// with the PEFT fields, hyperparameters.yaml (naming the base checkpoint), the tokenizer files
// and prompt_style.yaml; --merge (LoRA) also writes a merged plain lit_model.pth that
// //tools:generate loads. Progress (with an ETA) and the final statistics, key=value lines,
// go to stderr.
//
// --devices=N trains data-parallel on N local ranks (or joins a torchrun-style world):
// --micro_batch_size is per rank, --global_batch_size counts the examples of all ranks (a
// multiple of micro_batch_size × N), gradients and losses are averaged over all ranks'
// response tokens (tools/sft_trainer.h), and rank 0 alone logs and writes out_dir.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cache/kv_cache_factory.h"
#include "core/base/output_dir.h"
#include "core/config/config.h"
#include "core/io/torch_pickle_writer.h"
#include "core/model/checkpoint.h"
#include "core/model/quantize_model.h"
#include "core/text/prompt_style.h"
#include "core/text/tokenizer.h"
#include "peft/lora.h"
#include "tools/devices_flags.h"
#include "tools/finetune_model.h"
#include "tools/load_flags.h"
#include "tools/progress.h"
#include "tools/sft_data.h"
#include "tools/sft_trainer.h"
#include "tools/tool_util.h"
#include "tools/train_util.h"

ABSL_FLAG(std::string, method, "lora", "lora, adapter, adapter_v2 or full");
ABSL_FLAG(std::string, checkpoint_dir, "", "base LitGPT checkpoint; empty: the default model");
ABSL_FLAG(std::string, data, "", "Alpaca-style JSON: a list of {instruction, input, output}");
ABSL_FLAG(std::string, out_dir, "", "output directory");
ABSL_FLAG(std::string, prompt_style, "alpaca", "LitGPT prompt style of the training prompts");
ABSL_FLAG(int64_t, lora_r, 8, "LoRA rank");
ABSL_FLAG(double, lora_alpha, 16, "LoRA alpha (scaling = alpha / r)");
ABSL_FLAG(double, lora_dropout, 0.05, "LoRA dropout");
ABSL_FLAG(bool, lora_query, true, "LoRA on the query projection");
ABSL_FLAG(bool, lora_key, false, "LoRA on the key projection");
ABSL_FLAG(bool, lora_value, true, "LoRA on the value projection");
ABSL_FLAG(bool, lora_projection, false, "LoRA on the attention output projection");
ABSL_FLAG(bool, lora_mlp, false, "LoRA on the MLP linears");
ABSL_FLAG(bool, lora_head, false, "LoRA on the language-model head");
ABSL_FLAG(int64_t, adapter_prompt_length, 10, "adapter prefix length");
ABSL_FLAG(int64_t, adapter_start_layer, 2, "first layer with an adapter prefix");
ABSL_FLAG(int64_t, epochs, 1, "passes over the training data (when --max_steps is 0)");
ABSL_FLAG(int64_t, max_steps, 0, "optimizer steps; 0: --epochs passes");
ABSL_FLAG(int64_t, micro_batch_size, 1, "examples per forward pass (of each rank with --devices)");
ABSL_FLAG(int64_t, global_batch_size, 16,
          "examples per optimizer step, all ranks together (accumulation)");
ABSL_FLAG(double, lr, 3e-4, "peak learning rate");
ABSL_FLAG(double, min_lr, 6e-5, "final learning rate of the cosine decay");
ABSL_FLAG(int64_t, warmup_steps, 10, "linear warm-up steps");
ABSL_FLAG(double, weight_decay, 0.02, "AdamW weight decay (matrices only)");
ABSL_FLAG(double, grad_clip, 1.0, "gradient norm clip; 0 disables");
ABSL_FLAG(int64_t, max_seq_length, 0, "truncate examples to this many tokens; 0: block_size");
ABSL_FLAG(double, val_split_fraction, 0.05, "share of the examples held out for validation");
ABSL_FLAG(int64_t, eval_interval, 50, "optimizer steps between validation runs");
ABSL_FLAG(int64_t, eval_iters, 100, "micro-batches per validation run");
ABSL_FLAG(int64_t, log_interval, 10, "optimizer steps between progress lines");
ABSL_FLAG(uint64_t, seed, 1337, "random seed (split, order, initialisation, dropout)");
ABSL_FLAG(std::string, kv_cache, "",
          "cache-aware training: sequences run in chunks through this KV cache policy (dense, "
          "window, sink, h2o, tova, h2o-vlen, qh2o) and gradients are those of that chunked "
          "computation; empty: plain training over whole sequences");
ABSL_FLAG(int64_t, kv_budget, 0, "with --kv_cache: entries kept per layer (and row, group)");
ABSL_FLAG(int, kv_bits, 16, "with --kv_cache: 16 (the model's dtype), 8 or 4");
ABSL_FLAG(int64_t, kv_sink, 4, "with --kv_cache=sink: first tokens always kept");
ABSL_FLAG(int64_t, kv_grace, -1, "with a score policy: newest positions never evicted");
ABSL_FLAG(bool, kv_normalize_scores, false, "h2o family: scores per query that saw the entry");
ABSL_FLAG(std::string, kv_budget_rule, "uniform", "uniform or pyramid (per-layer budgets)");
ABSL_FLAG(int64_t, chunk_size, 128, "with --kv_cache: tokens a step through the cache");
ABSL_FLAG(int64_t, first_chunk, 0,
          "with --kv_cache: tokens of the first step; 0: --kv_budget (the prefill fills the "
          "cache), or --chunk_size for dense");
ABSL_FLAG(int, checkpoint_bits, 16,
          "with --kv_cache: layer-input checkpoints in the model's dtype (16) or int8 (8)");
ABSL_FLAG(bool, merge, false, "also write a merged plain lit_model.pth (lora, full)");
ABSL_FLAG(std::string, quantize, "none",
          "lora only: int8 freezes the base projections in int8 (QLoRA-style; the saved LoRA "
          "file applies to the float base)");

namespace lgpt {
namespace {

namespace fs = std::filesystem;

constexpr char kDefaultModelDir[] = "tools/default_model";

std::string HyperparametersYaml(const std::string& base_dir, const Config& config,
                                PeftMethod method) {
  // LitGPT's merge_lora reads checkpoint_dir, precision and the lora_* keys from here.
  std::string yaml = absl::StrCat("checkpoint_dir: ", fs::absolute(base_dir).string(), "\n",
                                  "method: ", PeftMethodName(method), "\n", "precision: 32-true\n");
  if (method == PeftMethod::kLora) {
    absl::StrAppend(&yaml, "lora_r: ", config.lora_r, "\nlora_alpha: ", config.lora_alpha,
                    "\nlora_dropout: ", config.lora_dropout,
                    "\nlora_query: ", config.lora_query ? "true" : "false",
                    "\nlora_key: ", config.lora_key ? "true" : "false",
                    "\nlora_value: ", config.lora_value ? "true" : "false",
                    "\nlora_projection: ", config.lora_projection ? "true" : "false",
                    "\nlora_mlp: ", config.lora_mlp ? "true" : "false",
                    "\nlora_head: ", config.lora_head ? "true" : "false", "\n");
  }
  absl::StrAppend(&yaml, "data: ", fs::absolute(ResolvePath(absl::GetFlag(FLAGS_data))).string(),
                  "\nprompt_style: ", absl::GetFlag(FLAGS_prompt_style),
                  "\nmax_steps: ", absl::GetFlag(FLAGS_max_steps),
                  "\nepochs: ", absl::GetFlag(FLAGS_epochs),
                  "\nmicro_batch_size: ", absl::GetFlag(FLAGS_micro_batch_size),
                  "\nglobal_batch_size: ", absl::GetFlag(FLAGS_global_batch_size),
                  "\ndevices: ", absl::GetFlag(FLAGS_devices), "\nlr: ", absl::GetFlag(FLAGS_lr),
                  "\nmin_lr: ", absl::GetFlag(FLAGS_min_lr),
                  "\nwarmup_steps: ", absl::GetFlag(FLAGS_warmup_steps),
                  "\nweight_decay: ", absl::GetFlag(FLAGS_weight_decay),
                  "\nseed: ", absl::GetFlag(FLAGS_seed), "\n");
  return yaml;
}

// --kv_cache and its companions; nullopt without --kv_cache. Exits on bad values, naming flags.
std::optional<ChunkedTrainingOptions> ChunkedOptionsFromFlags() {
  const std::string policy = absl::GetFlag(FLAGS_kv_cache);
  if (policy.empty()) return std::nullopt;
  ChunkedTrainingOptions options;
  KVCacheSpec& spec = options.cache;
  spec.policy = policy;
  spec.budget = absl::GetFlag(FLAGS_kv_budget);
  spec.bits = absl::GetFlag(FLAGS_kv_bits);
  spec.sink_tokens = absl::GetFlag(FLAGS_kv_sink);
  spec.grace_period = absl::GetFlag(FLAGS_kv_grace);
  spec.normalize_scores = absl::GetFlag(FLAGS_kv_normalize_scores);
  spec.budget_rule = absl::GetFlag(FLAGS_kv_budget_rule);
  DieIfError(ValidateKVCacheSpec(spec));
  options.chunk_size = absl::GetFlag(FLAGS_chunk_size);
  options.first_chunk = absl::GetFlag(FLAGS_first_chunk);
  if (options.chunk_size < 1) {
    Die(absl::InvalidArgumentError(
        absl::StrCat("--chunk_size must be >= 1, got ", options.chunk_size)));
  }
  if (options.first_chunk < 0) {
    Die(absl::InvalidArgumentError(
        absl::StrCat("--first_chunk must be >= 0, got ", options.first_chunk)));
  }
  if (options.first_chunk == 0) {
    options.first_chunk = policy == "dense" ? options.chunk_size : spec.budget;
  }
  options.checkpoint_bits = absl::GetFlag(FLAGS_checkpoint_bits);
  if (options.checkpoint_bits != 16 && options.checkpoint_bits != 8) {
    Die(absl::InvalidArgumentError(
        absl::StrCat("--checkpoint_bits must be 16 or 8, got ", options.checkpoint_bits)));
  }
  return options;
}

}  // namespace
}  // namespace lgpt

int main(int argc, char** argv) {
  using namespace lgpt;
  InitTool(argc, argv,
           "finetune --method=lora|adapter|adapter_v2|full --checkpoint_dir=DIR "
           "--data=FILE.json --out_dir=DIR [--max_steps=N] [--merge]");
  const PeftMethod method = ValueOrDie(ParsePeftMethod(absl::GetFlag(FLAGS_method)));
  std::string checkpoint_dir = ResolvePath(absl::GetFlag(FLAGS_checkpoint_dir));
  if (checkpoint_dir.empty()) checkpoint_dir = DefaultModelDir();
  const std::string data_path = ResolvePath(absl::GetFlag(FLAGS_data));
  const std::string out_dir = ResolvePath(absl::GetFlag(FLAGS_out_dir));
  if (data_path.empty()) Die(absl::InvalidArgumentError("--data is required"));
  if (out_dir.empty()) Die(absl::InvalidArgumentError("--out_dir is required"));
  const double val_fraction = absl::GetFlag(FLAGS_val_split_fraction);
  if (!(val_fraction >= 0 && val_fraction < 1)) {
    Die(absl::InvalidArgumentError("--val_split_fraction must be in [0, 1)"));
  }
  if (absl::GetFlag(FLAGS_eval_iters) < 0) {
    Die(absl::InvalidArgumentError(absl::StrCat(
        "--eval_iters must be >= 0 (0: no validation), got ", absl::GetFlag(FLAGS_eval_iters))));
  }
  // Before any work; TrainSft checks them again, in its options' terms.
  DieIfError(CheckOptimizerSettings(absl::GetFlag(FLAGS_lr), absl::GetFlag(FLAGS_min_lr),
                                    absl::GetFlag(FLAGS_weight_decay),
                                    absl::GetFlag(FLAGS_grad_clip), "--"));
  if (absl::GetFlag(FLAGS_merge) && method != PeftMethod::kLora && method != PeftMethod::kFull) {
    Die(absl::InvalidArgumentError(absl::StrCat("--merge: ", PeftMethodName(method),
                                                " cannot be merged into a base checkpoint")));
  }
  const std::string quantize = absl::GetFlag(FLAGS_quantize);
  if (quantize != "none" && quantize != "int8") {
    Die(absl::InvalidArgumentError(
        absl::StrCat("--quantize must be none or int8, got '", quantize, "'")));
  }
  const bool int8_base = quantize == "int8";
  if (int8_base && method != PeftMethod::kLora) {
    Die(absl::InvalidArgumentError(
        absl::StrCat("--quantize=int8 is for --method=lora, not ", PeftMethodName(method))));
  }
  if (int8_base && absl::GetFlag(FLAGS_merge)) {
    Die(absl::InvalidArgumentError(
        "--merge with --quantize=int8 would merge into dequantised weights; merge the saved "
        "LoRA file into the float base with merge_lora instead"));
  }
  const PromptStyle style = ValueOrDie(PromptStyleFromName(absl::GetFlag(FLAGS_prompt_style)));
  const int devices = absl::GetFlag(FLAGS_devices);
  const c10::Device device = ValueOrDie(TrainingDevice());
  const int64_t micro_batch = absl::GetFlag(FLAGS_micro_batch_size);
  const int64_t global_batch = absl::GetFlag(FLAGS_global_batch_size);
  if (devices >= 1 && micro_batch >= 1 && global_batch % (micro_batch * devices) != 0) {
    Die(absl::InvalidArgumentError(absl::StrCat("--global_batch_size (", global_batch,
                                                ") must be a multiple of --micro_batch_size (",
                                                micro_batch, ") times --devices (", devices, ")")));
  }
  // Checked before any work: never the input directory, and writable.
  DieIfError(OutputDir::Check(out_dir, {checkpoint_dir}));
  // --devices > 1: the ranks start here and each runs this main from the top.
  if (std::optional<int> code = ValueOrDie(LaunchDevices(argc, argv))) return *code;
  const std::shared_ptr<ProcessGroup> group = ValueOrDie(JoinDevices());
  const bool lead = group->rank() == 0;  // logs and writes

  // The base model's config with the method's fields, checked against the base's tensors
  // before any other work (a config that claims 2^20 layers is refused at once, naming both
  // numbers; it was built layer by layer for minutes).
  Config config = ValueOrDie(LoadConfigFile(checkpoint_dir + "/model_config.yaml"));
  std::string base_source;
  TensorMap base =
      ValueOrDie(ReadCheckpointTensors(checkpoint_dir, &base_source, VerifyChecksumsFlag()));
  DieIfError(CheckConfigAgainstCheckpoint(config, base, base_source, at::kFloat));
  if (method == PeftMethod::kLora) {
    config.lora_r = absl::GetFlag(FLAGS_lora_r);
    config.lora_alpha = absl::GetFlag(FLAGS_lora_alpha);
    config.lora_dropout = absl::GetFlag(FLAGS_lora_dropout);
    config.lora_query = absl::GetFlag(FLAGS_lora_query);
    config.lora_key = absl::GetFlag(FLAGS_lora_key);
    config.lora_value = absl::GetFlag(FLAGS_lora_value);
    config.lora_projection = absl::GetFlag(FLAGS_lora_projection);
    config.lora_mlp = absl::GetFlag(FLAGS_lora_mlp);
    config.lora_head = absl::GetFlag(FLAGS_lora_head);
  } else if (method == PeftMethod::kAdapter || method == PeftMethod::kAdapterV2) {
    config.adapter_prompt_length = absl::GetFlag(FLAGS_adapter_prompt_length);
    config.adapter_start_layer = absl::GetFlag(FLAGS_adapter_start_layer);
  }
  DieIfError(config.Finalize());
  // The model's config is checked before the data is read (a bad --lora_r fails at once).
  if (method == PeftMethod::kLora) DieIfError(LoraParts(config).status());
  const std::optional<ChunkedTrainingOptions> chunked = ChunkedOptionsFromFlags();
  int64_t max_seq_length = absl::GetFlag(FLAGS_max_seq_length);
  if (max_seq_length == 0) max_seq_length = config.block_size;
  if (max_seq_length < 2 || max_seq_length > config.block_size) {
    Die(absl::InvalidArgumentError(absl::StrCat("--max_seq_length must be in [2, block_size ",
                                                config.block_size, "], got ", max_seq_length)));
  }

  // Data: split, then tokenized as LitGPT's SFTDataset does.
  std::unique_ptr<Tokenizer> tokenizer = ValueOrDie(Tokenizer::Load(checkpoint_dir));
  DieIfError(tokenizer->CheckFitsVocabulary(config.PaddedVocabSize()));
  if (!tokenizer->eos_id()) {
    Die(absl::FailedPreconditionError("the tokenizer has no EOS token to end responses with"));
  }
  std::vector<InstructionRecord> records = ValueOrDie(LoadAlpacaJson(data_path));
  std::mt19937_64 split_rng(absl::GetFlag(FLAGS_seed));
  std::shuffle(records.begin(), records.end(), split_rng);
  int64_t val_count = static_cast<int64_t>(records.size() * val_fraction);
  if (val_fraction > 0) val_count = std::max<int64_t>(val_count, 1);
  if (val_count >= static_cast<int64_t>(records.size())) {
    Die(absl::InvalidArgumentError(absl::StrCat(
        data_path, ": ", records.size(), " examples leave none for training after the split")));
  }
  const std::vector<InstructionRecord> val_records(records.begin(), records.begin() + val_count);
  const std::vector<InstructionRecord> train_records(records.begin() + val_count, records.end());
  SftOptions sft;
  sft.max_seq_length = max_seq_length;
  SftStats train_stats, val_stats;
  const std::vector<SftExample> train = ValueOrDie(
      TokenizeSft(train_records, style, TokenizerEncoder(*tokenizer), sft, &train_stats));
  std::vector<SftExample> val;
  if (!val_records.empty()) {
    val =
        ValueOrDie(TokenizeSft(val_records, style, TokenizerEncoder(*tokenizer), sft, &val_stats));
  }
  int64_t longest = 0;
  for (const SftExample& e : train) longest = std::max<int64_t>(longest, e.input_ids.size());
  if (lead) {
    std::fprintf(stderr,
                 "%zu training and %zu validation examples (prompt style %s); longest %lld tokens; "
                 "%lld truncated, %lld dropped (prompt alone >= %lld tokens)\n",
                 train.size(), val.size(), style.name().c_str(), static_cast<long long>(longest),
                 static_cast<long long>(train_stats.truncated + val_stats.truncated),
                 static_cast<long long>(train_stats.dropped + val_stats.dropped),
                 static_cast<long long>(max_seq_length));
  }

  if (chunked && lead) {
    std::fprintf(stderr, "cache-aware training: %s, chunks of %lld (first %lld), %s checkpoints\n",
                 DescribeKVCacheSpec(chunked->cache).c_str(),
                 static_cast<long long>(chunked->chunk_size),
                 static_cast<long long>(chunked->first_chunk),
                 chunked->checkpoint_bits == 8 ? "int8" : "full-precision");
  }

  // Model: the method's architecture, base weights, only the method's parameters trainable.
  at::manual_seed(absl::GetFlag(FLAGS_seed));
  GPT model = ValueOrDie(CreateFinetuneModel(config, method, int8_base));
  DieIfError(LoadBaseWeights(*model, base, base_source));
  base.clear();  // the base tensors are copied into the model: free them
  if (int8_base) DieIfError(QuantizeModelInt8(*model));  // frees the float base weights
  MarkTrainable(*model, method);
  if (!device.is_cpu()) {
    if (int8_base) {
      Die(absl::UnimplementedError(
          "--quantize=int8 (a per-channel int8 base) trains on the CPU; --device=cuda needs a "
          "float base"));
    }
    model->To(device, at::kFloat);  // before the optimizer sees the parameters
  }
  const int64_t weight_bytes = ModelWeightBytes(*model);
  // Peak memory of training alone: loading holds the float checkpoint once, whatever the base.
  ResetPeakRss();
  int64_t total_parameters = 0;
  for (const auto& p : model->parameters()) total_parameters += p.numel();

  SftTrainOptions options;
  options.micro_batch_size = absl::GetFlag(FLAGS_micro_batch_size);
  options.global_batch_size = absl::GetFlag(FLAGS_global_batch_size);
  options.max_steps = absl::GetFlag(FLAGS_max_steps);
  options.epochs = absl::GetFlag(FLAGS_epochs);
  options.lr = absl::GetFlag(FLAGS_lr);
  options.min_lr = absl::GetFlag(FLAGS_min_lr);
  options.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  options.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  options.grad_clip = absl::GetFlag(FLAGS_grad_clip);
  options.eval_interval = absl::GetFlag(FLAGS_eval_interval);
  options.eval_max_batches = absl::GetFlag(FLAGS_eval_iters);
  options.log_interval = absl::GetFlag(FLAGS_log_interval);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.chunked = chunked;
  options.group = group;
  options.agree_on = {{"model config", ConfigToYaml(config)},
                      {"method", absl::StrCat(PeftMethodName(method), " base=", quantize)}};
  // Progress with an ETA on stderr; the trainer's lines (validation losses) print beside it.
  std::unique_ptr<Progress> progress;
  options.log = [&progress](const std::string& line) {
    if (progress) {
      progress->Message(line);
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  };
  options.on_step = [&progress, lead](int64_t step, int64_t steps, double loss, double lr) {
    if (!lead) return;
    if (!progress) progress = std::make_unique<Progress>("finetune: step", steps);
    progress->Update(step, absl::StrFormat("loss %.4f lr %.2e", loss, lr));
  };
  const SftTrainStats stats = ValueOrDie(TrainSft(*model, train, val, options));
  const int64_t train_peak_rss = PeakRssBytes();
  if (progress) progress->Finish();
  // Every rank holds the same parameters: rank 0 alone writes them and reports.
  if (!lead) return 0;

  // Output: LitGPT's layout, as one transaction (core/base/output_dir.h).
  OutputDirOptions out_options;
  out_options.drop = {"model.safetensors", "lit_model.pth"};
  const std::unique_ptr<OutputDir> out =
      ValueOrDie(OutputDir::Begin(out_dir, {checkpoint_dir}, out_options));
  const std::string trained_name = TrainedFileName(method);
  const std::string trained_path = out_dir + "/" + trained_name;
  DieIfError(WriteTorchStateDict(out->Path(trained_name), TrainedStateDict(*model, method)));
  DieIfError(out->WriteFile("model_config.yaml", ConfigToYaml(config)));
  DieIfError(
      out->WriteFile("hyperparameters.yaml", HyperparametersYaml(checkpoint_dir, config, method)));
  DieIfError(out->WriteFile("prompt_style.yaml", style.ToYaml()));
  DieIfError(CopyPresentFiles(checkpoint_dir, kTokenizerFiles, *out).status());
  if (absl::GetFlag(FLAGS_merge) && method == PeftMethod::kLora) {
    DieIfError(WriteTorchStateDict(out->Path("lit_model.pth"),
                                   ValueOrDie(MergedStateDict(*model, method))));
  }
  DieIfError(out->Commit());
  std::fprintf(stderr, "saved %s\n", trained_path.c_str());

  std::fprintf(stderr, "method=%s threads=%d devices=%d\n",
               std::string(PeftMethodName(method)).c_str(), at::get_num_threads(),
               group->world_size());
  std::fprintf(stderr, "trainable_parameters=%lld total_parameters=%lld\n",
               static_cast<long long>(stats.trainable_parameters),
               static_cast<long long>(total_parameters));
  std::fprintf(stderr, "steps=%lld train_examples=%zu val_examples=%zu\n",
               static_cast<long long>(stats.steps), train.size(), val.size());
  std::fprintf(stderr, "first_train_loss=%.4f last_train_loss=%.4f\n", stats.first_loss,
               stats.last_loss);
  if (!stats.val_losses.empty()) {
    std::fprintf(stderr, "initial_val_loss=%.4f final_val_loss=%.4f\n",
                 stats.val_losses.front().second, stats.val_losses.back().second);
  }
  std::fprintf(stderr, "mean_step_time_s=%.4f tokens_per_s=%.1f\n", stats.mean_step_s,
               stats.tokens_per_s);
  std::fprintf(stderr, "base=%s weight_bytes=%lld train_peak_rss_bytes=%lld\n",
               int8_base ? "int8" : "float32", static_cast<long long>(weight_bytes),
               static_cast<long long>(train_peak_rss));
  std::fprintf(stderr, "peak_rss_bytes=%lld\n", static_cast<long long>(PeakRssBytes()));
  return 0;
}
