// One rank of tensor_parallel_test, started by the launcher (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT set). Every rank also builds the single-process model and compares; rank 0
// prints one line per check on stdout, and the exit code says whether all passed.
//   presets[:A,B,..]   every preset (or those named), shrunk (tests/test_models.h), random weights:
//   TP logits
//                      of a full forward and of cached prefill + decode steps vs one process
//   default_model      tools/default_model loaded sharded from its file: logits, then greedy
//                      generation with a dense, a sink and an h2o cache
//   refuse             tools/default_model: the sharded load must fail naming the field
//   rank_dies          the last rank exits during decoding; the others must fail cleanly
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cache/kv_cache_factory.h"
#include "core/config/config_presets.h"
#include "core/dist/process_group.h"
#include "core/dist/tensor_parallel.h"
#include "core/io/npy.h"
#include "core/model/checkpoint.h"
#include "core/model/generate.h"
#include "core/model/quantize_model.h"
#include "core/model/tensor_parallel_model.h"
#include "core/nn/block_quant_linear.h"
#include "core/nn/linear_factory.h"
#include "peft/lora.h"
#include "peft/peft_checkpoint.h"
#include "tests/preset_groups.h"
#include "tests/random_lora.h"
#include "tests/test_models.h"

namespace lgpt {
namespace {

constexpr double kTolerance = 1e-5;
constexpr char kDefaultModel[] = "tools/default_model";

int Fail(const std::string& why) {
  std::cerr << why << std::endl;
  return 1;
}

double MaxDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// Max |logit difference| of a full forward and of prefill (8 tokens) + 3 decode steps.
absl::StatusOr<double> CompareLogits(GPTImpl& full, GPTImpl& local, int64_t vocab) {
  at::manual_seed(3);
  const at::Tensor idx = at::randint(0, vocab, {2, 11}, at::kLong).to(local.device());
  double worst = 0;
  {
    absl::StatusOr<at::Tensor> a = full.Forward(idx), b = local.Forward(idx);
    if (!a.ok()) return a.status();
    if (!b.ok()) return b.status();
    worst = MaxDiff(*a, *b);
  }
  auto full_cache = full.NewDenseCache(2, 11);
  auto local_cache = local.NewDenseCache(2, 11);
  if (!full_cache.ok()) return full_cache.status();
  if (!local_cache.ok()) return local_cache.status();
  for (int64_t begin = 0; begin < 11;) {
    const int64_t length = begin == 0 ? 8 : 1;
    ForwardOptions options;
    options.positions = at::arange(begin, begin + length, at::kLong)
                            .unsqueeze(0)
                            .expand({2, length})
                            .contiguous()
                            .to(local.device());
    const at::Tensor step = idx.narrow(1, begin, length);
    absl::StatusOr<at::Tensor> a = full.Forward(step, full_cache->get(), options);
    absl::StatusOr<at::Tensor> b = local.Forward(step, local_cache->get(), options);
    if (!a.ok()) return a.status();
    if (!b.ok()) return b.status();
    worst = std::max(worst, MaxDiff(*a, *b));
    begin += length;
  }
  return worst;
}

absl::StatusOr<std::vector<int64_t>> Greedy(GPTImpl& model, const KVCacheSpec& spec,
                                            const std::vector<int64_t>& prompt, int64_t n);

// Where KV groups are replicated, a scoring cache must combine the copies' scores (each
// rank sees its own heads' attention): greedy tokens with h2o and tova equal one process's,
// on every rank. Returns whether they do; rank 0 prints each cache's line.
absl::StatusOr<bool> ScoringCachesAgree(const std::shared_ptr<ProcessGroup>& group,
                                        const std::string& name, GPTImpl& full, GPTImpl& local) {
  std::vector<int64_t> prompt;
  for (int64_t i = 0; i < 12; ++i) prompt.push_back(3 + 7 * i % 50);
  bool all_same = true;
  for (const char* policy : {"h2o", "tova"}) {
    KVCacheSpec spec;
    spec.policy = policy;
    spec.budget = 6;
    absl::StatusOr<std::vector<int64_t>> a = Greedy(full, spec, prompt, 10);
    absl::StatusOr<std::vector<int64_t>> b = Greedy(local, spec, prompt, 10);
    if (!a.ok()) return a.status();
    if (!b.ok()) return b.status();
    const at::Tensor mine = at::tensor(*b, at::kLong).unsqueeze(0);
    absl::StatusOr<at::Tensor> every = group->AllGather(mine);
    if (!every.ok()) return every.status();
    const bool same = *a == *b && at::equal(*every, mine.expand_as(*every));
    all_same = all_same && same;
    if (group->rank() == 0) {
      std::cout << name << " greedy " << policy << " budget=6" << (same ? " equal" : " DIFFERENT")
                << "\n";
    }
  }
  return all_same;
}

// The presets to compare, each with the presets that shrink alike (every preset, one run per
// structure), or `only` one by one.
std::vector<std::vector<std::string>> PresetRuns(const std::vector<std::string>& only) {
  std::vector<std::vector<std::string>> runs;
  if (only.empty()) {
    for (const ShrunkPresetGroup& group : ShrunkPresetGroups()) runs.push_back(group.presets);
  } else {
    for (const std::string& name : only) runs.push_back({name});
  }
  return runs;
}

// Prints one line per preset of a run (rank 0): `name outcome`, and which preset ran for it.
void PrintRun(const ProcessGroup& group, const std::vector<std::string>& names,
              const std::string& outcome) {
  if (group.rank() != 0) return;
  for (const std::string& name : names) {
    std::cout << name << outcome;
    if (name != names.front()) std::cout << " (shrinks as " << names.front() << ")";
    std::cout << "\n";
  }
}

int Presets(const std::shared_ptr<ProcessGroup>& group, const std::vector<std::string>& only) {
  int64_t equal = 0, refused = 0, unbuildable = 0, failed = 0;
  for (const std::vector<std::string>& names : PresetRuns(only)) {
    const std::string& name = names.front();
    const int64_t presets = static_cast<int64_t>(names.size());
    absl::StatusOr<Config> preset = PresetFromName(name);
    if (!preset.ok()) return Fail(absl::StrCat(name, ": ", preset.status().ToString()));
    absl::StatusOr<Config> config = ShrinkConfig(*preset);
    if (!config.ok()) return Fail(absl::StrCat(name, ": ", config.status().ToString()));
    absl::StatusOr<GPT> full = GPTImpl::Create(*config);
    if (!full.ok()) {  // multi-head latent attention and the like: no single-process model
      unbuildable += presets;
      continue;
    }
    RandomizeWeights(**full, 11);
    absl::StatusOr<RankModelSpec> spec = TensorParallelSpec(*config, {}, group);
    if (!spec.ok()) {
      refused += presets;
      const auto code = spec.status().code();
      if (code != absl::StatusCode::kInvalidArgument && code != absl::StatusCode::kUnimplemented) {
        failed += presets;
      }
      PrintRun(*group, names, absl::StrCat(" refused: ", spec.status().ToString()));
      continue;
    }
    absl::StatusOr<GPT> local = GPTImpl::Create(spec->config, spec->parts);
    absl::StatusOr<std::map<std::string, at::Tensor>> shard =
        ShardTensors(StateDict(**full), *config, group->rank(), group->world_size());
    if (!local.ok() || !shard.ok()) {
      return Fail(absl::StrCat(name, ": ",
                               local.ok() ? shard.status().ToString() : local.status().ToString()));
    }
    if (absl::Status s = LoadStateDict(**local, *shard, name); !s.ok()) return Fail(s.ToString());
    absl::StatusOr<double> diff = CompareLogits(**full, **local, config->vocab_size);
    if (!diff.ok()) return Fail(absl::StrCat(name, ": ", diff.status().ToString()));
    bool ok = *diff <= kTolerance;
    if (config->QueryGroups() % group->world_size() != 0) {
      absl::StatusOr<bool> agree = ScoringCachesAgree(group, name, **full, **local);
      if (!agree.ok()) return Fail(absl::StrCat(name, ": ", agree.status().ToString()));
      ok = ok && *agree;
    }
    (ok ? equal : failed) += presets;
    PrintRun(*group, names,
             absl::StrCat(ok ? " equal" : " DIFFERENT", " max_abs_diff=", *diff,
                          " heads=", spec->config.n_head, "/", config->n_head,
                          " kv_groups=", spec->config.QueryGroups(), "/", config->QueryGroups()));
  }
  if (group->rank() == 0) {
    std::cout << "summary: " << equal << " equal, " << refused << " refused, " << unbuildable
              << " unbuildable, " << failed << " failed" << std::endl;
  }
  return failed == 0 ? 0 : 1;
}

absl::StatusOr<std::vector<int64_t>> Greedy(GPTImpl& model, const KVCacheSpec& spec,
                                            const std::vector<int64_t>& prompt, int64_t n) {
  KVCacheShape shape;
  shape.batch_size = 1;
  shape.max_sequence_length = static_cast<int64_t>(prompt.size()) + n;
  shape.layers = model.CacheLayout();
  shape.dtype = model.dtype();
  shape.device = model.device();
  absl::StatusOr<std::unique_ptr<KVCache>> cache = MakeKVCache(spec, shape);
  if (!cache.ok()) return cache.status();
  GenerateOptions options;
  options.max_new_tokens = n;
  options.sampling.temperature = 0;
  return Generate(model, **cache, prompt, options);
}

// The default model over the ranks against one process, with float32 or block-quantised
// weights (each rank quantises its own slices; row-parallel slices cut K on block
// boundaries, so every block is the one a single process quantises), on `device` (a GPU
// under an NCCL group: every model of the rank there).
int DefaultModel(const std::shared_ptr<ProcessGroup>& group, WeightQuantization quantize,
                 const c10::Device& device) {
  LoadOptions single_options;
  single_options.parts = QuantizedModelParts(quantize);
  single_options.device = device;
  absl::StatusOr<LoadedModel> single = LoadCheckpoint(kDefaultModel, single_options);
  LoadOptions tp_options = single_options;
  tp_options.tensor_parallel = group;
  absl::StatusOr<LoadedModel> sharded = LoadCheckpoint(kDefaultModel, tp_options);
  if (!single.ok()) return Fail(single.status().ToString());
  if (!sharded.ok()) return Fail(sharded.status().ToString());
  if (quantize != WeightQuantization::kNone) {
    for (GPTImpl* model : {single->model.get(), sharded->model.get()}) {
      if (absl::Status s = QuantizeModel(*model); !s.ok()) return Fail(s.ToString());
    }
  }
  const bool root = group->rank() == 0;
  if (root) std::cout << "weights " << WeightQuantizationName(quantize) << "\n";
  if (quantize != WeightQuantization::kNone) {
    // The row-parallel shards' own projections are quantised too.
    int row_parallel = 0, quantised = 0;
    for (const auto& module : sharded->model->modules()) {
      auto* projection = dynamic_cast<ProjectionImpl*>(module.get());
      if (projection == nullptr || projection->flat_inner() == nullptr) continue;
      ++row_parallel;
      auto* inner = dynamic_cast<BlockQuantProjectionImpl*>(projection->flat_inner());
      if (inner != nullptr && inner->quantized()) ++quantised;
    }
    if (root) {
      std::cout << "row-parallel shards quantised: " << quantised << " of " << row_parallel << "\n";
    }
  }
  if (root) {
    std::cout << "default_model heads=" << sharded->config.n_head << "/" << single->config.n_head
              << " kv_groups=" << sharded->config.QueryGroups() << "/"
              << single->config.QueryGroups() << "\n";
  }
  absl::StatusOr<double> diff =
      CompareLogits(*single->model, *sharded->model, single->config.vocab_size);
  if (!diff.ok()) return Fail(diff.status().ToString());
  // Quantised GEMVs sum each rank's blocks apart before the all-reduce: float rounding of
  // logits of magnitude ~10.
  bool ok = *diff <= (quantize == WeightQuantization::kNone ? kTolerance : 1e-4);
  if (root)
    std::cout << "logits " << (ok ? "equal" : "DIFFERENT") << " max_abs_diff=" << *diff << "\n";

  std::vector<int64_t> prompt;
  for (int64_t i = 0; i < 20; ++i) prompt.push_back(5 + 37 * i % 1000);
  std::vector<KVCacheSpec> caches(3);
  caches[1].policy = "sink";
  caches[1].budget = 24;
  caches[1].sink_tokens = 4;
  caches[2].policy = "h2o";
  caches[2].budget = 24;
  for (const KVCacheSpec& spec : caches) {
    absl::StatusOr<std::vector<int64_t>> a = Greedy(*single->model, spec, prompt, 24);
    absl::StatusOr<std::vector<int64_t>> b = Greedy(*sharded->model, spec, prompt, 24);
    if (!a.ok()) return Fail(a.status().ToString());
    if (!b.ok()) return Fail(b.status().ToString());
    // Every rank must have produced the same tokens, not just rank 0.
    at::Tensor mine = at::tensor(*b, at::kLong);
    absl::StatusOr<at::Tensor> all = group->AllGather(mine.unsqueeze(0));
    if (!all.ok()) return Fail(all.status().ToString());
    const bool same_ranks = at::equal(*all, mine.unsqueeze(0).expand_as(*all));
    const bool same = *a == *b && same_ranks;
    ok = ok && same;
    if (root) {
      std::cout << "greedy " << DescribeKVCacheSpec(spec) << (same ? " equal" : " DIFFERENT")
                << (same_ranks ? "" : " (ranks disagree)") << ": " << absl::StrJoin(*b, " ")
                << "\n";
    }
  }
  std::cout.flush();
  return ok ? 0 : 1;
}

// A LoRA fine-tune of the default model (every site, the head too) over the ranks against one
// process: each rank holds its slices of the base and of A or B (ShardLoraTensors).
int Lora(const std::shared_ptr<ProcessGroup>& group) {
  absl::StatusOr<LoadedModel> base = LoadCheckpoint(kDefaultModel, LoadOptions());
  if (!base.ok()) return Fail(base.status().ToString());
  LoraOptions lora;
  lora.r = 4;
  lora.alpha = 8;
  lora.query = lora.key = lora.value = lora.projection = lora.mlp = lora.head = true;
  const char* tmp = std::getenv("TEST_TMPDIR");
  absl::StatusOr<std::string> dir = WriteRandomLoraFineTune(
      kDefaultModel, base->config, lora,
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/tp_lora_rank", group->rank()), 5,
      /*stddev=*/0.05);
  if (!dir.ok()) return Fail(dir.status().ToString());
  absl::StatusOr<LoadedModel> single = LoadModelWithPeft(*dir, {}, LoadOptions(), "loras");
  LoadOptions tp_options;
  tp_options.tensor_parallel = group;
  absl::StatusOr<LoadedModel> sharded = LoadModelWithPeft(*dir, {}, tp_options, "loras");
  if (!single.ok()) return Fail(single.status().ToString());
  if (!sharded.ok()) return Fail(sharded.status().ToString());
  const bool root = group->rank() == 0;
  absl::StatusOr<double> diff =
      CompareLogits(*single->model, *sharded->model, single->config.vocab_size);
  if (!diff.ok()) return Fail(diff.status().ToString());
  // The adapter changes the logits: a sharding that dropped it would not match.
  absl::StatusOr<double> from_base =
      CompareLogits(*base->model, *single->model, single->config.vocab_size);
  if (!from_base.ok()) return Fail(from_base.status().ToString());
  bool ok = *diff <= kTolerance && *from_base > 1e-2;
  std::vector<int64_t> prompt;
  for (int64_t i = 0; i < 16; ++i) prompt.push_back(7 + 53 * i % 1000);
  absl::StatusOr<std::vector<int64_t>> a = Greedy(*single->model, KVCacheSpec(), prompt, 16);
  absl::StatusOr<std::vector<int64_t>> b = Greedy(*sharded->model, KVCacheSpec(), prompt, 16);
  if (!a.ok() || !b.ok()) return Fail("greedy generation failed");
  ok = ok && *a == *b;
  if (root) {
    std::cout << "lora heads=" << sharded->config.n_head << "/" << single->config.n_head
              << " logits " << (*diff <= kTolerance ? "equal" : "DIFFERENT")
              << " max_abs_diff=" << *diff << " (base vs adapted: " << *from_base << ")\n"
              << "lora greedy " << (*a == *b ? "equal" : "DIFFERENT") << ": "
              << absl::StrJoin(*b, " ") << std::endl;
  }
  return ok ? 0 : 1;
}

// Two per-request adapters over the ranks against one process, in one mixed batch (row 0
// the first adapter, row 1 the second, row 2 the base).
int MultiLora(const std::shared_ptr<ProcessGroup>& group) {
  absl::StatusOr<LoadedModel> base = LoadCheckpoint(kDefaultModel, LoadOptions());
  if (!base.ok()) return Fail(base.status().ToString());
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::vector<NamedLoraAdapter> adapters;
  for (int k = 0; k < 2; ++k) {
    LoraOptions lora;
    lora.r = 2 + 2 * k;
    lora.alpha = 8;
    lora.query = lora.value = lora.projection = lora.mlp = true;
    lora.key = k == 1;
    absl::StatusOr<std::string> dir = WriteRandomLoraFineTune(
        kDefaultModel, base->config, lora,
        absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/tp_multi_rank", group->rank(), "_", k),
        11 + k, /*stddev=*/0.05);
    if (!dir.ok()) return Fail(dir.status().ToString());
    adapters.push_back({absl::StrCat("a", k), {*dir, 1.0}});
  }
  absl::StatusOr<MultiLoraModel> single =
      LoadMultiLoraModel(kDefaultModel, adapters, LoadOptions(), "adapters");
  LoadOptions tp_options;
  tp_options.tensor_parallel = group;
  absl::StatusOr<MultiLoraModel> sharded =
      LoadMultiLoraModel(kDefaultModel, adapters, tp_options, "adapters");
  if (!single.ok()) return Fail(single.status().ToString());
  if (!sharded.ok()) return Fail(sharded.status().ToString());
  at::manual_seed(5);
  const at::Tensor idx = at::randint(0, single->loaded.config.vocab_size, {3, 9}, at::kLong);
  ForwardOptions options;
  options.adapters = {0, 1, -1};
  absl::StatusOr<at::Tensor> a = single->loaded.model->Forward(idx, nullptr, options);
  absl::StatusOr<at::Tensor> b = sharded->loaded.model->Forward(idx, nullptr, options);
  absl::StatusOr<at::Tensor> plain = base->model->Forward(idx);
  for (const auto* result : {&a, &b, &plain}) {
    if (!result->ok()) return Fail(result->status().ToString());
  }
  const double diff = MaxDiff(*a, *b);
  // Each adapted row differs from the base; the base row does not.
  const double row0 = MaxDiff((*a)[0], (*plain)[0]), row2 = MaxDiff((*a)[2], (*plain)[2]);
  const bool ok = diff <= kTolerance && row0 > 1e-3 && row2 <= kTolerance;
  if (group->rank() == 0) {
    std::cout << "multi_lora logits " << (ok ? "equal" : "DIFFERENT") << " max_abs_diff=" << diff
              << " (adapter row vs base " << row0 << ", base row " << row2 << ")" << std::endl;
  }
  return ok ? 0 : 1;
}

// Every golden case (LitGPT's own outputs) over the ranks: the full forward's logits within
// 1e-4 of LitGPT's and the greedy continuation (through a cache) equal to its.
int Golden(const std::shared_ptr<ProcessGroup>& group) {
  const bool root = group->rank() == 0;
  int equal = 0, refused = 0, different = 0;
  for (const char* case_dir :
       {"golden/pythia", "golden/llama2", "golden/llama3_gqa", "golden/llama2_lora",
        "golden_extra/falcon", "golden_extra/gemma2", "golden_extra/gemma3",
        "golden_extra/interleave", "golden_extra/linear_rope", "golden_extra/llama31_yarn",
        "golden_extra/mixtral", "golden_extra/olmo2", "golden_extra/phi2", "golden_extra/qwen25",
        "golden_extra/qwen3", "golden_extra/stablelm"}) {
    const std::string dir = case_dir;
    const std::string path = "tests/testdata/" + dir;
    LoadOptions options;
    options.tensor_parallel = group;
    if (absl::EndsWith(dir, "_lora")) {  // LitGPT's LoRA model: its adapters inside
      absl::StatusOr<Config> config = LoadConfigFile(path + "/model_config.yaml");
      if (!config.ok()) return Fail(config.status().ToString());
      absl::StatusOr<ModelParts> parts = LoraParts(*config);
      if (!parts.ok()) return Fail(parts.status().ToString());
      options.parts = *parts;
    }
    absl::StatusOr<LoadedModel> loaded = LoadCheckpoint(path, options);
    if (!loaded.ok()) {
      ++refused;
      if (root) std::cout << dir << " refused: " << loaded.status() << "\n";
      continue;
    }
    absl::StatusOr<at::Tensor> tokens = ReadNpy(path + "/tokens.npy");
    absl::StatusOr<at::Tensor> expected = ReadNpy(path + "/logits.npy");
    absl::StatusOr<at::Tensor> prompt = ReadNpy(path + "/prompt.npy");
    absl::StatusOr<at::Tensor> greedy = ReadNpy(path + "/greedy.npy");
    if (!tokens.ok() || !expected.ok() || !prompt.ok() || !greedy.ok()) {
      return Fail(dir + ": unreadable golden files");
    }
    absl::StatusOr<at::Tensor> logits = loaded->model->Forward(tokens->unsqueeze(0));
    if (!logits.ok()) return Fail(dir + ": " + logits.status().ToString());
    const double diff = MaxDiff(logits->squeeze(0), *expected);
    const std::vector<int64_t> prompt_ids(prompt->data_ptr<int64_t>(),
                                          prompt->data_ptr<int64_t>() + prompt->numel());
    absl::StatusOr<std::vector<int64_t>> tokens_out =
        Greedy(*loaded->model, KVCacheSpec(), prompt_ids, greedy->numel());
    if (!tokens_out.ok()) return Fail(dir + ": " + tokens_out.status().ToString());
    const std::vector<int64_t> want(greedy->data_ptr<int64_t>(),
                                    greedy->data_ptr<int64_t>() + greedy->numel());
    const bool same = diff <= 1e-4 && *tokens_out == want;
    (same ? equal : different) += 1;
    if (root) {
      std::cout << dir << (same ? " equal" : " DIFFERENT") << " max_abs_diff=" << diff
                << " heads=" << loaded->config.n_head << " greedy "
                << (*tokens_out == want ? "equal" : "DIFFERENT") << "\n";
    }
  }
  if (root) {
    std::cout << "golden summary: " << equal << " equal, " << refused << " refused, " << different
              << " different" << std::endl;
  }
  return different == 0 ? 0 : 1;
}

int Refuse(const std::shared_ptr<ProcessGroup>& group) {
  LoadOptions options;
  options.tensor_parallel = group;
  absl::StatusOr<LoadedModel> sharded = LoadCheckpoint(kDefaultModel, options);
  if (sharded.ok()) return Fail("the sharded load succeeded");
  if (group->rank() == 0) std::cout << "refused: " << sharded.status() << std::endl;
  // Every rank refuses at once: wait for all, so that no rank leaves while another is still
  // finishing its connections (it would see the connection closed by its peer).
  if (absl::Status all = group->Barrier(); !all.ok()) return Fail(all.ToString());
  return 0;
}

int RankDies(const std::shared_ptr<ProcessGroup>& group) {
  LoadOptions options;
  options.tensor_parallel = group;
  absl::StatusOr<LoadedModel> sharded = LoadCheckpoint(kDefaultModel, options);
  if (!sharded.ok()) return Fail(sharded.status().ToString());
  GenerateOptions generate;
  generate.max_new_tokens = 200;
  int64_t produced = 0;
  const bool dies = group->rank() == group->world_size() - 1;
  generate.on_token = [&](int64_t) {
    if (dies && ++produced == 3) _exit(3);
    return true;
  };
  auto cache = sharded->model->NewDenseCache(1, 220);
  if (!cache.ok()) return Fail(cache.status().ToString());
  absl::StatusOr<std::vector<int64_t>> tokens =
      Generate(*sharded->model, **cache, {1, 2, 3, 4}, generate);
  if (tokens.ok()) return Fail("generation went on without a rank");
  std::cerr << "error: " << tokens.status() << std::endl;
  return 2;
}

}  // namespace
}  // namespace lgpt

int main(int argc, char** argv) {
  if (argc != 2) {
    return lgpt::Fail(
        "usage: worker presets[:A,B]|default_model[:int8|int4]|default_model_nccl|lora|"
        "multi_lora|golden|refuse|rank_dies");
  }
  const std::string mode = argv[1];
  absl::StatusOr<lgpt::DistOptions> options = lgpt::DistOptionsFromEnv(absl::Seconds(20));
  if (!options.ok()) return lgpt::Fail(options.status().ToString());
  c10::Device device(c10::kCPU);
  if (mode == "default_model_nccl") {  // each local rank its GPU, the model's tensors over NCCL
    options->backend = lgpt::DistBackend::kNccl;
    device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(options->rank));
  }
  absl::StatusOr<std::shared_ptr<lgpt::ProcessGroup>> group = lgpt::ProcessGroup::Create(*options);
  if (!group.ok()) return lgpt::Fail(group.status().ToString());
  at::NoGradGuard no_grad;
  if (absl::StartsWith(mode, "presets")) {
    std::vector<std::string> only;
    if (absl::StartsWith(mode, "presets:")) only = absl::StrSplit(mode.substr(8), ',');
    return lgpt::Presets(*group, only);
  }
  if (mode == "default_model_nccl") {
    return lgpt::DefaultModel(*group, lgpt::WeightQuantization::kNone, device);
  }
  if (absl::StartsWith(mode, "default_model")) {
    absl::StatusOr<lgpt::WeightQuantization> quantize = lgpt::ParseWeightQuantization(
        mode == "default_model" ? "none" : mode.substr(std::string("default_model:").size()));
    if (!quantize.ok()) return lgpt::Fail(quantize.status().ToString());
    return lgpt::DefaultModel(*group, *quantize, device);
  }
  if (mode == "refuse") return lgpt::Refuse(*group);
  if (mode == "lora") return lgpt::Lora(*group);
  if (mode == "multi_lora") return lgpt::MultiLora(*group);
  if (mode == "golden") return lgpt::Golden(*group);
  if (mode == "rank_dies") return lgpt::RankDies(*group);
  return lgpt::Fail("unknown mode " + mode);
}
