// Teacher-forced perplexity of a checkpoint on a text, with float32, int8 or int4 weights:
//   bible -f Rev21:1-Rev22:21 | sed -E 's/^[0-9A-Za-z]+[0-9]+:[0-9]+ //' > /tmp/rev.txt
//   bazel run //tools:perplexity -- --text_file=/tmp/rev.txt --lines_bos_eos --quantize=int8
// The tokens are scored in consecutive windows of the model's block size (each window on
// its own, as in training); prints tokens, mean negative log-likelihood and perplexity.
// --kv_pool_dtype=float32|bfloat16|float16|int8|int4 feeds each window through a serving
// engine's paged KV cache instead, over a block pool of such entries (the keys and values every
// query reads are the pool's, as in `serve --pool_mb --kv_pool_dtype`), --chunk tokens a step (0:
// the whole window in one step; 1: token by token, every step a decoding step):
//   bazel run //tools:perplexity -- --text_file=tools/eval_data/kjv_heldout.txt --lines_bos_eos
//       --kv_pool_dtype=bfloat16
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cache/block_pool.h"
#include "cache/paged_kv_cache.h"
#include "core/base/device.h"
#include "core/base/file_util.h"
#include "core/model/checkpoint.h"
#include "core/model/quantize_model.h"
#include "core/serving/kv_memory.h"
#include "core/text/tokenizer.h"
#include "tools/load_flags.h"
#include "tools/peft_flags.h"
#include "tools/tool_util.h"

ABSL_FLAG(std::string, checkpoint_dir, "",
          "LitGPT checkpoint or fine-tune directory; empty: the embedded default model");
ABSL_FLAG(std::string, text_file, "", "text to score");
ABSL_FLAG(bool, lines_bos_eos, false,
          "tokenise each line on its own, between BOS and EOS (the default model's training "
          "format); else the whole text at once");
ABSL_FLAG(std::string, quantize, "none",
          "none, int8 (q8_0-like blocks), int4 (q4_0-like blocks) or int8_channel (int8 with "
          "a scale per output channel or per --group_size inputs)");
ABSL_FLAG(bool, agreement, false,
          "with --quantize: also load the float model and report how often the quantised "
          "model's most likely next token is the float model's (top1_agreement)");
ABSL_FLAG(int64_t, group_size, 0,
          "int8_channel: input features per scale; 0: one per output channel");
ABSL_FLAG(std::string, kv_pool_dtype, "",
          "score through a paged KV cache over a pool of such entries (auto, model, float32, "
          "bfloat16, float16, int8, int4); empty: uncached windows");
ABSL_FLAG(int64_t, chunk, 0, "with --kv_pool_dtype: tokens a step; 0: the whole window");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda[:N] (float32 weights; quantised ones too)");

int main(int argc, char** argv) {
  using namespace lgpt;
  InitTool(argc, argv,
           "perplexity --text_file=FILE [--lines_bos_eos] [--quantize=int8|int4|int8_channel] "
           "[--kv_pool_dtype=bfloat16 --chunk=N]");
  std::string checkpoint_dir = ResolvePath(absl::GetFlag(FLAGS_checkpoint_dir));
  if (checkpoint_dir.empty()) checkpoint_dir = DefaultModelDir();
  const std::string quantize = absl::GetFlag(FLAGS_quantize);
  const bool int8_channel = quantize == "int8_channel";
  const absl::StatusOr<WeightQuantization> blocks =
      int8_channel ? WeightQuantization::kNone : ParseWeightQuantization(quantize);
  if (!blocks.ok()) {
    Die(absl::InvalidArgumentError(absl::StrCat("--quantize: unknown value '", quantize, "'")));
  }
  const std::string text_path = ResolvePath(absl::GetFlag(FLAGS_text_file));
  // A directory opens as a stream that reads nothing, and scored as an empty text.
  std::ifstream file(text_path);
  if (!file || !IsFile(text_path)) Die(absl::NotFoundError("cannot read --text_file"));
  std::stringstream buffer;
  buffer << file.rdbuf();
  const std::string text = buffer.str();

  LoadOptions load;
  ApplyLoadFlags(load);
  load.device = ValueOrDie(ParseDevice(absl::GetFlag(FLAGS_device)));
  load.parts = int8_channel ? Int8ModelParts(Int8Options{absl::GetFlag(FLAGS_group_size)})
                            : QuantizedModelParts(*blocks);
  const std::vector<LoraAdapterSpec> loras = ValueOrDie(LoraFlags(argc, argv));
  LoadedModel loaded = ValueOrDie(LoadModelWithPeft(checkpoint_dir, loras, load, "--lora"));
  if (quantize != "none") DieIfError(QuantizeModel(*loaded.model));
  // The float model the quantised one is compared with (--agreement).
  std::optional<LoadedModel> reference;
  if (absl::GetFlag(FLAGS_agreement) && quantize != "none") {
    LoadOptions plain = load;
    plain.parts = ModelParts();
    reference = ValueOrDie(LoadModelWithPeft(checkpoint_dir, loras, plain, "--lora"));
  }
  std::unique_ptr<Tokenizer> tokenizer = ValueOrDie(Tokenizer::Load(checkpoint_dir));
  DieIfError(tokenizer->CheckFitsVocabulary(loaded.config.PaddedVocabSize()));
  std::vector<int64_t> ids;
  if (absl::GetFlag(FLAGS_lines_bos_eos)) {
    for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
      const std::vector<int64_t> line_ids = ValueOrDie(tokenizer->Encode(line, true, true));
      ids.insert(ids.end(), line_ids.begin(), line_ids.end());
    }
  } else {
    ids = ValueOrDie(tokenizer->Encode(text));
  }
  // The first token has no prediction: fewer than two printed tokens=0 and a NaN perplexity
  // with exit status 0.
  if (ids.size() < 2) {
    Die(absl::InvalidArgumentError(absl::StrCat("--text_file ", text_path,
                                                " has too few tokens to score (", ids.size(),
                                                "; at least 2 are needed)")));
  }
  at::NoGradGuard no_grad;
  const int64_t window = loaded.config.block_size;
  // --kv_pool_dtype: one request's paged cache over a pool of a window's blocks.
  const std::string pool_dtype_name = absl::GetFlag(FLAGS_kv_pool_dtype);
  const int64_t chunk = absl::GetFlag(FLAGS_chunk);
  if (chunk < 0) Die(absl::InvalidArgumentError(absl::StrCat("--chunk must be >= 0, got ", chunk)));
  std::unique_ptr<PagedKVCache> paged;
  if (!pool_dtype_name.empty()) {
    KVCacheGeometry geometry;
    geometry.layers = loaded.model->CacheLayout();
    geometry.device = loaded.model->device();
    const KVPoolEntries entries = ValueOrDie(KVPoolEntriesFor(
        pool_dtype_name, loaded.model->dtype(), geometry.device, "--kv_pool_dtype"));
    geometry.dtype = entries.dtype;
    BlockPoolOptions pool_options;
    pool_options.entry_bits = entries.bits;
    pool_options.num_blocks =
        (window + pool_options.entries_per_block - 1) / pool_options.entries_per_block;
    paged = ValueOrDie(
        PagedKVCache::Create(ValueOrDie(BlockPool::Create(geometry, pool_options)), window));
  }
  // Logits [1, T, V] of one window: uncached, or step by step through the paged cache.
  auto window_logits = [&](const at::Tensor& tokens) -> at::Tensor {
    if (paged == nullptr) return ValueOrDie(loaded.model->Forward(tokens));
    paged->Reset();
    const int64_t length = tokens.size(1);
    const int64_t step = chunk > 0 ? chunk : length;
    std::vector<at::Tensor> parts;
    for (int64_t position = 0; position < length; position += step) {
      const int64_t n = std::min(step, length - position);
      ForwardOptions options;
      options.positions = at::arange(position, position + n, at::kLong).unsqueeze(0);
      parts.push_back(
          ValueOrDie(loaded.model->Forward(tokens.narrow(1, position, n), paged.get(), options)));
    }
    return at::cat(parts, 1);
  };
  const at::Tensor all = at::tensor(ids, at::kLong);
  double nll = 0;
  int64_t scored = 0, agreed = 0;
  for (int64_t begin = 0; begin + 1 < static_cast<int64_t>(ids.size()); begin += window) {
    const int64_t length = std::min<int64_t>(window, ids.size() - begin);
    if (length < 2) break;
    const at::Tensor tokens = all.narrow(0, begin, length).unsqueeze(0);
    const at::Tensor logits = window_logits(tokens);  // [1, T, V]
    const at::Tensor logp = at::log_softmax(logits[0].narrow(0, 0, length - 1).to(at::kDouble), -1);
    const at::Tensor target = tokens[0].narrow(0, 1, length - 1).unsqueeze(1).to(logp.device());
    nll -= logp.gather(1, target).sum().item<double>();
    if (reference) {
      const at::Tensor expected = ValueOrDie(reference->model->Forward(tokens));  // [1, T, V]
      agreed += (logits[0].narrow(0, 0, length - 1).argmax(-1) ==
                 expected[0].narrow(0, 0, length - 1).argmax(-1))
                    .sum()
                    .item<int64_t>();
    }
    scored += length - 1;
  }
  std::printf("weights=%s", quantize.c_str());
  if (paged != nullptr) {
    if (paged->pool()->quantised()) {
      std::printf(" kv_pool_dtype=int%d", paged->pool()->entry_bits());
    } else {
      std::printf(" kv_pool_dtype=%s", c10::toString(paged->pool()->dtype()));
    }
  }
  std::printf(" tokens=%lld nll=%.5f perplexity=%.3f", static_cast<long long>(scored), nll / scored,
              std::exp(nll / scored));
  if (reference) std::printf(" top1_agreement=%.4f", static_cast<double>(agreed) / scored);
  std::printf("\n");
  return 0;
}
