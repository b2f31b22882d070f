// Pretrains a model from a Config preset or yaml on a plain-text corpus:
//   bazel run //tools:pretrain -- --model_config=FILE.yaml | --model_name=NAME
//       --text_file=CORPUS.txt --out_dir=DIR [--tokenizer_dir=DIR | --vocab_size=4096]
// Trains a SentencePiece BPE tokenizer (byte fallback) on the corpus unless one is given,
// holds out the corpus tail for validation, and trains with AdamW, linear warm-up plus
// cosine decay, gradient clipping and accumulation. Checkpoints are LitGPT directories
// (model_config.yaml, model.safetensors, tokenizer files) and resume with --resume.
//
// --devices=N trains data-parallel on N local ranks (or joins a torchrun-style world): every
// rank draws the same global micro-batch of micro_batch × N windows and trains on its own
// micro_batch rows (so a step sees micro_batch × N × accumulate windows, as one process with
// --micro_batch=micro_batch × N would, and ends with the same parameters); gradients are
// averaged over the ranks before clipping and the step; the losses reported are the global
// means. Rank 0 alone trains the tokenizer (before the ranks meet, then sends it to the
// others), logs and writes out_dir. With --resume every rank reads out_dir's training state,
// so on several hosts out_dir must be on a shared file system.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

// torch/types.h must come before clip_grad.h, which does not include what it uses.
// clang-format off
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <torch/types.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/serialize.h>
// clang-format on

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/file_util.h"
#include "core/base/output_dir.h"
#include "core/config/config.h"
#include "core/config/config_presets.h"
#include "core/dist/data_parallel.h"
#include "core/io/safetensors.h"
#include "core/model/checkpoint.h"
#include "core/model/gpt.h"
#include "tools/devices_flags.h"
#include "tools/load_flags.h"
#include "tools/model_memory.h"
#include "tools/progress.h"
#include "tools/spm_tools.h"
#include "tools/tool_util.h"
#include "tools/train_util.h"

ABSL_FLAG(std::string, model_config, "", "model_config.yaml of the model to train");
ABSL_FLAG(std::string, model_name, "", "or: a LitGPT preset name");
ABSL_FLAG(std::string, text_file, "", "training corpus (UTF-8 text)");
ABSL_FLAG(std::string, out_dir, "", "output checkpoint directory");
ABSL_FLAG(std::string, tokenizer_dir, "", "existing tokenizer; empty: train one on the corpus");
ABSL_FLAG(int64_t, vocab_size, 4096, "vocabulary of the trained tokenizer");
ABSL_FLAG(int64_t, seq_len, 256, "training sequence length");
ABSL_FLAG(int64_t, micro_batch, 16, "sequences per micro-batch (of each rank with --devices)");
ABSL_FLAG(int64_t, accumulate, 1, "micro-batches per optimizer step");
ABSL_FLAG(int64_t, max_steps, 2000, "optimizer steps");
ABSL_FLAG(double, lr, 3e-3, "peak learning rate");
ABSL_FLAG(double, min_lr, 3e-4, "final learning rate of the cosine decay");
ABSL_FLAG(int64_t, warmup_steps, 100, "linear warm-up steps");
ABSL_FLAG(double, weight_decay, 0.1, "AdamW weight decay (matrices only)");
ABSL_FLAG(double, grad_clip, 1.0, "gradient norm clip; 0 disables");
ABSL_FLAG(double, val_fraction, 0.05, "corpus tail held out for validation");
ABSL_FLAG(int64_t, eval_every, 100, "steps between validation runs");
ABSL_FLAG(int64_t, eval_batches, 8, "micro-batches per validation run");
ABSL_FLAG(int64_t, save_every, 500, "steps between checkpoints");
ABSL_FLAG(std::string, save_precision, "bf16-true", "dtype of saved weights");
ABSL_FLAG(bool, resume, false, "continue from out_dir's training state");
ABSL_FLAG(uint64_t, seed, 42, "random seed");
ABSL_FLAG(int64_t, bos_first, -1,
          "token id put at position 0 of every training sequence (the rest a random window), "
          "so the model learns one fixed attention sink (StreamingLLM's sink-token pretraining); "
          "-1: plain random windows");

namespace lgpt {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Die(absl::NotFoundError(absl::StrCat("cannot read ", path)));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Through a .partial file, fsynced and renamed: a killed run never leaves a truncated yaml.
void WriteFile(const std::string& path, const std::string& text) {
  DieIfError(WriteFileAtomically(path, text));
}

void CopyFile(const std::string& from, const std::string& to) { WriteFile(to, ReadFile(from)); }

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Random windows of seq_len + 1 tokens: inputs and next-token targets.
// Random windows of `data`: inputs [batch, seq_len] and next-token targets [batch, seq_len].
// With first_token >= 0 every input starts with it and the window fills the rest.
std::pair<at::Tensor, at::Tensor> Batch(const at::Tensor& data, int64_t batch, int64_t seq_len,
                                        at::Generator& gen, int64_t first_token) {
  const at::Tensor starts =
      at::randint(0, data.size(0) - seq_len - 1, {batch}, gen, at::TensorOptions(at::kLong));
  const at::Tensor offsets = at::arange(seq_len + 1, at::kLong);
  at::Tensor windows =
      data.index_select(0, (starts.unsqueeze(1) + offsets).reshape(-1)).view({batch, seq_len + 1});
  if (first_token >= 0) {
    windows =
        at::cat({at::full({batch, 1}, first_token, at::kLong), windows.narrow(1, 0, seq_len)}, 1);
  }
  return {windows.narrow(1, 0, seq_len), windows.narrow(1, 1, seq_len)};
}

at::Tensor Loss(GPTImpl& model, const at::Tensor& x, const at::Tensor& y) {
  const at::Tensor logits = ValueOrDie(model.Forward(x));
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(at::kFloat),
                                y.reshape(-1).to(logits.device()));
}

void SaveCheckpoint(GPTImpl& model, const Config& config, const std::string& out_dir,
                    c10::ScalarType dtype) {
  TensorMap tensors;
  for (const auto& [name, tensor] : StateDict(model)) {
    tensors[name] = tensor.detach().to(at::kCPU, dtype).contiguous();
  }
  // WriteSafetensors stages, fsyncs and renames the file itself.
  DieIfError(WriteSafetensors(out_dir + "/model.safetensors", tensors));
  WriteFile(out_dir + "/model_config.yaml", ConfigToYaml(config));
}

}  // namespace
}  // namespace lgpt

int main(int argc, char** argv) {
  using namespace lgpt;
  InitTool(argc, argv,
           "pretrain --model_config=FILE|--model_name=NAME --text_file=CORPUS --out_dir=DIR");
  const std::string out_dir = ResolvePath(absl::GetFlag(FLAGS_out_dir));
  const std::string text_file = ResolvePath(absl::GetFlag(FLAGS_text_file));
  if (out_dir.empty()) Die(absl::InvalidArgumentError("--out_dir is required"));
  if (text_file.empty()) Die(absl::InvalidArgumentError("--text_file is required"));
  const int64_t seq_len = absl::GetFlag(FLAGS_seq_len), micro = absl::GetFlag(FLAGS_micro_batch);
  const int64_t accumulate = absl::GetFlag(FLAGS_accumulate);
  const int64_t max_steps = absl::GetFlag(FLAGS_max_steps);
  if (seq_len < 2 || micro < 1 || accumulate < 1 || max_steps < 1 ||
      absl::GetFlag(FLAGS_warmup_steps) < 1 || absl::GetFlag(FLAGS_eval_every) < 1 ||
      absl::GetFlag(FLAGS_save_every) < 1) {
    Die(absl::InvalidArgumentError(
        "--seq_len must be >= 2 and --micro_batch, --accumulate, --max_steps, --warmup_steps, "
        "--eval_every, --save_every >= 1"));
  }
  const double val_fraction = absl::GetFlag(FLAGS_val_fraction);
  if (!(val_fraction > 0 && val_fraction < 0.5)) {
    Die(absl::InvalidArgumentError("--val_fraction must be in (0, 0.5)"));
  }
  DieIfError(CheckOptimizerSettings(absl::GetFlag(FLAGS_lr), absl::GetFlag(FLAGS_min_lr),
                                    absl::GetFlag(FLAGS_weight_decay),
                                    absl::GetFlag(FLAGS_grad_clip), "--"));
  // Before the tokenizer and the model are made: a bad value would otherwise end the run
  // only when it saves.
  const c10::ScalarType save_dtype =
      ValueOrDie(ParsePrecision(absl::GetFlag(FLAGS_save_precision), "save_precision"));
  // spm_encode would report a missing corpus only as a failed shell command.
  if (!IsFile(text_file)) {
    Die(absl::NotFoundError(absl::StrCat("--text_file: ", text_file, " is not a file")));
  }
  Config config;
  if (!absl::GetFlag(FLAGS_model_config).empty()) {
    config = ValueOrDie(LoadConfigFile(ResolvePath(absl::GetFlag(FLAGS_model_config))));
  } else if (!absl::GetFlag(FLAGS_model_name).empty()) {
    config = ValueOrDie(ConfigFromName(absl::GetFlag(FLAGS_model_name)));
  } else {
    Die(absl::InvalidArgumentError("--model_config or --model_name is required"));
  }
  if (seq_len > config.block_size) {
    Die(absl::InvalidArgumentError(
        absl::StrCat("--seq_len ", seq_len, " exceeds block_size ", config.block_size)));
  }
  // A trained tokenizer needs 256 byte pieces plus unk, bos and eos (byte fallback) and must
  // fit the model's embedding; spm_train alone says so only after reading the corpus.
  const int64_t vocab_size = absl::GetFlag(FLAGS_vocab_size);
  // A resumed run keeps the tokenizer it has; otherwise one is trained or copied.
  const bool needs_tokenizer =
      !(absl::GetFlag(FLAGS_resume) && Exists(out_dir + "/tokenizer.model"));
  const std::string tokenizer_dir = ResolvePath(absl::GetFlag(FLAGS_tokenizer_dir));
  if (needs_tokenizer && tokenizer_dir.empty() &&
      (vocab_size < 259 || vocab_size > config.PaddedVocabSize())) {
    Die(absl::InvalidArgumentError(absl::StrCat(
        "--vocab_size=", vocab_size, " is outside [259, ", config.PaddedVocabSize(),
        "]: a trained tokenizer has 256 byte pieces plus unk, bos and eos, and the model's "
        "padded_vocab_size is ",
        config.PaddedVocabSize())));
  }
  // --devices > 1: the ranks start here and each runs this main from the top.
  if (std::optional<int> code = ValueOrDie(LaunchDevices(argc, argv))) return *code;
  const bool lead = RankFromEnv() == 0;  // trains the tokenizer, logs and writes
  // A directory this run made goes again when the corpus turns out unusable (the checks that
  // need its tokens come after the tokenizer is in it).
  const bool made_out_dir = lead && ::mkdir(out_dir.c_str(), 0755) == 0;
  auto refuse = [&](const absl::Status& status) {
    if (made_out_dir) std::filesystem::remove_all(out_dir);
    Die(status);
  };

  // Tokenizer: trained on the corpus, or copied from an existing checkpoint (rank 0 alone).
  if (lead && needs_tokenizer) {
    if (tokenizer_dir.empty()) {
      std::fprintf(stderr, "training a %lld-piece SentencePiece tokenizer on %s\n",
                   static_cast<long long>(vocab_size), text_file.c_str());
      DieIfError(TrainSentencePiece(text_file, out_dir + "/tokenizer", vocab_size));
      std::remove((out_dir + "/tokenizer.vocab").c_str());
      WriteFile(out_dir + "/tokenizer_config.json",
                "{\"add_bos_token\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}\n");
    } else {
      for (const char* name : {"tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                               "generation_config.json"}) {
        const std::string from = tokenizer_dir + "/" + name;
        if (Exists(from)) CopyFile(from, out_dir + "/" + name);
      }
    }
  }
  const std::shared_ptr<ProcessGroup> group = ValueOrDie(JoinDevices());
  const int rank = group->rank(), world = group->world_size();
  const c10::Device device = ValueOrDie(TrainingDevice());
  // The other ranks tokenize with rank 0's tokenizer, from a private copy.
  std::string tokenizer_model = out_dir + "/tokenizer.model";
  if (world > 1) {
    const std::string bytes =
        ValueOrDie(BroadcastBytes(*group, lead ? ReadFile(tokenizer_model) : std::string()));
    if (!lead) {
      tokenizer_model = absl::StrCat(std::filesystem::temp_directory_path().string(),
                                     "/lgpt-pretrain-tokenizer-", ::getpid(), ".model");
      WriteFile(tokenizer_model, bytes);
    }
  }
  if (lead) std::fprintf(stderr, "tokenizing %s\n", text_file.c_str());
  const std::vector<int64_t> ids = ValueOrDie(EncodeLinesWithBosEos(tokenizer_model, text_file));
  if (!lead) std::remove(tokenizer_model.c_str());
  const int64_t vocab = ids.empty() ? 0 : *std::max_element(ids.begin(), ids.end()) + 1;
  if (vocab > config.PaddedVocabSize()) {
    refuse(absl::InvalidArgumentError(absl::StrCat("tokenizer has ", vocab,
                                                   " tokens, the model's padded vocabulary ",
                                                   config.PaddedVocabSize())));
  }
  const int64_t bos_first = absl::GetFlag(FLAGS_bos_first);
  if (bos_first < -1 || bos_first >= config.PaddedVocabSize()) {
    refuse(absl::InvalidArgumentError(absl::StrCat(
        "--bos_first=", bos_first, " is not -1 or a token id below ", config.PaddedVocabSize())));
  }
  const at::Tensor all = at::tensor(ids, at::kLong);
  const int64_t val_tokens = static_cast<int64_t>(all.size(0) * val_fraction);
  const at::Tensor train = all.narrow(0, 0, all.size(0) - val_tokens);
  const at::Tensor val = all.narrow(0, all.size(0) - val_tokens, val_tokens);
  if (val.size(0) <= seq_len + 1) {
    refuse(absl::InvalidArgumentError(
        absl::StrCat(text_file, " is too small: its ", all.size(0), " tokens leave ", val.size(0),
                     " for validation (--val_fraction=", val_fraction,
                     "), which needs more than --seq_len + 1 = ", seq_len + 1)));
  }
  if (lead) {
    std::fprintf(stderr, "%lld training tokens, %lld validation tokens\n",
                 static_cast<long long>(train.size(0)), static_cast<long long>(val.size(0)));
  }

  // Weights, gradients and AdamW's two moments in float32 (activations come on top).
  DieIfError(CheckParametersFitMemory(config, 16, "training them"));
  at::manual_seed(absl::GetFlag(FLAGS_seed));
  GPT model = ValueOrDie(GPTImpl::Create(config));
  model->To(device, at::kFloat);  // before the optimizer sees the parameters
  int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  if (lead) {
    std::fprintf(stderr, "%s: %lld parameters\n", config.name.c_str(),
                 static_cast<long long>(parameters));
  }

  // Weight decay on matrices only, as usual for transformers.
  std::unique_ptr<torch::optim::AdamW> adamw =
      MakeAdamW(model->parameters(), absl::GetFlag(FLAGS_lr), absl::GetFlag(FLAGS_weight_decay));
  torch::optim::AdamW& optimizer = *adamw;

  int64_t start_step = 0;
  const std::string state_path = out_dir + "/training_state.pt";
  if (absl::GetFlag(FLAGS_resume) && Exists(state_path)) {
    TensorMap tensors = ValueOrDie(ReadCheckpointTensors(out_dir, nullptr, VerifyChecksumsFlag()));
    for (auto& [name, t] : tensors) t = t.to(at::kFloat);
    DieIfError(LoadStateDict(*model, tensors, out_dir));
    torch::serialize::InputArchive archive;
    archive.load_from(state_path, device);  // the optimizer's moments beside the parameters
    optimizer.load(archive);
    at::Tensor step;
    archive.read("step", step);
    start_step = step.item<int64_t>();
    if (lead) std::fprintf(stderr, "resumed at step %lld\n", static_cast<long long>(start_step));
  }

  // Data parallelism: the ranks must train the same model on the same tokens with the same
  // settings from the same step; then they start from rank 0's parameters.
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& item : model->named_parameters()) named.emplace_back(item.key(), item.value());
  GradientAllReducer reducer(group, named);
  if (world > 1) {
    const std::string settings = absl::StrFormat(
        "seq_len=%d micro_batch=%d accumulate=%d max_steps=%d lr=%.17g min_lr=%.17g "
        "warmup_steps=%d weight_decay=%.17g grad_clip=%.17g val_fraction=%.17g eval_every=%d "
        "eval_batches=%d seed=%d bos_first=%d start_step=%d",
        seq_len, micro, accumulate, max_steps, absl::GetFlag(FLAGS_lr), absl::GetFlag(FLAGS_min_lr),
        absl::GetFlag(FLAGS_warmup_steps), absl::GetFlag(FLAGS_weight_decay),
        absl::GetFlag(FLAGS_grad_clip), val_fraction, absl::GetFlag(FLAGS_eval_every),
        absl::GetFlag(FLAGS_eval_batches), absl::GetFlag(FLAGS_seed), bos_first, start_step);
    const std::string tokens = absl::StrFormat(
        "%d tokens, %016x", ids.size(), Fingerprint64(ids.data(), ids.size() * sizeof(int64_t)));
    DieIfError(CheckRanksAgree(*group, {{"model config", ConfigToYaml(config)},
                                        {"trained parameters", ParameterFingerprint(named)},
                                        {"training settings", settings},
                                        {"training tokens", tokens}}));
    DieIfError(reducer.BroadcastParameters(0));
    // Dropout masks differ between ranks, as they do between a single process's rows.
    at::manual_seed(absl::GetFlag(FLAGS_seed) + 1000003ull * static_cast<uint64_t>(rank + 1));
  }
  // Every rank draws the same global micro-batch of micro × world windows and keeps its rows.
  const BatchShard shard = ValueOrDie(ShardOfBatch(micro * world, rank, world));
  auto my_rows = [&](std::pair<at::Tensor, at::Tensor> batch) {
    return std::make_pair(batch.first.narrow(0, shard.begin, shard.size),
                          batch.second.narrow(0, shard.begin, shard.size));
  };

  at::Generator gen =
      at::make_generator<at::CPUGeneratorImpl>(absl::GetFlag(FLAGS_seed) + start_step);
  auto evaluate = [&]() {
    at::NoGradGuard no_grad;
    model->eval();
    at::Generator val_gen = at::make_generator<at::CPUGeneratorImpl>(7);
    double total = 0;
    for (int64_t i = 0; i < absl::GetFlag(FLAGS_eval_batches); ++i) {
      auto [x, y] = my_rows(Batch(val, micro * world, seq_len, val_gen, bos_first));
      total += Loss(*model, x, y).item<double>();
    }
    model->train();
    // Every rank's rows hold as many tokens: the global mean is the mean of the ranks' means.
    const double mean = total / absl::GetFlag(FLAGS_eval_batches);
    const double loss = world > 1 ? ValueOrDie(GlobalMean(*group, mean)) : mean;
    if (!std::isfinite(loss)) {
      Die(absl::FailedPreconditionError(
          absl::StrCat("the validation loss is not finite (", loss,
                       "): the model's weights or activations are not numbers")));
    }
    return loss;
  };
  auto save = [&](int64_t step) {
    if (!lead) return;
    DieIfError(CheckParametersFinite(named, step));
    model->eval();
    SaveCheckpoint(*model, config, out_dir, save_dtype);
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    archive.write("step", at::tensor(step, at::kLong));
    // Through WriteFileAtomically: saved in place, a run killed mid-save left a truncated
    // training_state.pt that --resume then failed on.
    std::ostringstream state;
    archive.save_to(state);
    WriteFile(state_path, state.str());
    model->train();
  };

  model->train();
  const auto begin = std::chrono::steady_clock::now();
  int64_t tokens_seen = 0;
  std::unique_ptr<Progress> progress;
  if (lead) progress = std::make_unique<Progress>("pretrain: step", max_steps, start_step);
  for (int64_t step = start_step; step < max_steps; ++step) {
    const double lr = LearningRate(step, max_steps, absl::GetFlag(FLAGS_warmup_steps),
                                   absl::GetFlag(FLAGS_lr), absl::GetFlag(FLAGS_min_lr));
    SetLearningRate(optimizer, lr);
    optimizer.zero_grad();
    double step_loss = 0;
    for (int64_t m = 0; m < accumulate; ++m) {
      auto [x, y] = my_rows(Batch(train, micro * world, seq_len, gen, bos_first));
      at::Tensor loss = Loss(*model, x, y) / static_cast<double>(accumulate);
      loss.backward();
      step_loss += loss.item<double>();
      tokens_seen += micro * world * seq_len;
    }
    if (world > 1) {
      // Rows of equal length: the global loss is the mean of the ranks' means, and the
      // averaged gradients are those of the global batch.
      step_loss = ValueOrDie(SumAcrossRanks(*group, step_loss)) / world;
      DieIfError(reducer.AllReduceGradients());
    }
    // Checked on the global loss, so every rank stops with the same error.
    if (!std::isfinite(step_loss)) {
      Die(absl::FailedPreconditionError(
          absl::StrCat("the training loss is not finite (", step_loss, ") at step ", step + 1,
                       ": the model's weights or activations are not numbers (lower --lr?)")));
    }
    if (absl::GetFlag(FLAGS_grad_clip) > 0) {
      torch::nn::utils::clip_grad_norm_(model->parameters(), absl::GetFlag(FLAGS_grad_clip));
    }
    optimizer.step();
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    if (progress) {
      progress->Update(step + 1, absl::StrFormat("loss %.4f lr %.2e %.0f tokens/s", step_loss, lr,
                                                 tokens_seen / elapsed));
    }
    if ((step + 1) % absl::GetFlag(FLAGS_eval_every) == 0 || step + 1 == max_steps) {
      const double val_loss = evaluate();
      if (progress) {
        progress->Message(absl::StrFormat("step %d val_loss %.4f val_ppl %.2f", step + 1, val_loss,
                                          std::exp(val_loss)));
      }
    }
    if ((step + 1) % absl::GetFlag(FLAGS_save_every) == 0 || step + 1 == max_steps) save(step + 1);
  }
  if (!lead) return 0;
  progress->Finish();
  std::fprintf(stderr, "saved %s\n", out_dir.c_str());
  return 0;
}
