// Per-request LoRA (peft/multi_lora.h): one forward pass over rows of several adapters and of
// the base model equals, row by row, each adapter's own LoRA model (peft/lora.h) run alone;
// the base model's rows are the base model's bit for bit; one adapter for every row takes
// the no-gather path; bad slots and bad adapter directories are clear errors naming fields.
#include "peft/multi_lora.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/dense_kv_cache.h"
#include "core/base/status_field.h"
#include "core/config/config_presets.h"
#include "core/io/torch_pickle_writer.h"
#include "core/model/batch_forward.h"
#include "core/model/checkpoint.h"
#include "core/model/generate.h"
#include "core/model/quantize_model.h"
#include "core/nn/adapter_routing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "peft/lora.h"
#include "peft/peft_checkpoint.h"
#include "peft/peft_method.h"
#include "tests/test_models.h"

namespace lgpt {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

double MaxDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

Config TinyConfig() {
  Config config = ShrinkConfig(*PresetFromName("Llama-3.2-1B")).value();
  config.n_layer = 2;
  EXPECT_TRUE(config.Finalize().ok());
  return config;
}

// Three adapters of different ranks, alphas, scales and sites; adapter 2 leaves attention
// alone, adapter 1 adapts lm_head.
std::vector<LoraOptions> ThreeAdapters() {
  LoraOptions a;
  a.r = 4;
  a.alpha = 8;
  a.query = a.value = a.mlp = true;
  LoraOptions b;
  b.r = 2;
  b.alpha = 3;
  b.query = b.key = b.projection = b.head = true;
  b.scale = 0.5;
  LoraOptions c;
  c.r = 3;
  c.alpha = 6;
  c.mlp = true;
  c.scale = 1.5;
  return {a, b, c};
}

TensorMap BaseState(GPTImpl& model) {
  TensorMap state;
  for (const auto& [name, tensor] : StateDict(model)) state[name] = tensor.detach().clone();
  return state;
}

// The base model, the multi-adapter model over its weights (random slots) and each adapter's
// own LoRA model with its slot's weights.
struct Models {
  Config config;
  std::vector<LoraOptions> adapters;
  GPT base, multi;
  std::vector<GPT> single;  // single[k]: adapter k alone
  // The model a row of `slot` must equal: the base for -1.
  GPTImpl& For(int64_t slot) { return slot < 0 ? *base : *single[static_cast<size_t>(slot)]; }
};

Models MakeModels(std::shared_ptr<const LinearFactory> base_factory = nullptr) {
  Models m;
  m.config = TinyConfig();
  m.adapters = ThreeAdapters();
  m.base = *GPTImpl::Create(m.config);
  RandomizeWeights(*m.base, 7);
  const TensorMap base = BaseState(*m.base);
  ModelParts parts = MultiLoraParts(m.config, m.adapters, base_factory).value();
  m.multi = *GPTImpl::Create(m.config, parts);
  EXPECT_TRUE(LoadBaseWeights(*m.multi, base, "base").ok());
  at::manual_seed(21);
  at::NoGradGuard no_grad;
  TensorMap slots;
  for (auto& item : m.multi->named_parameters()) {
    if (IsPeftOnlyParameter(item.key())) {
      item.value().normal_(0, 0.2);
      slots[item.key()] = item.value();
    }
  }
  for (size_t k = 0; k < m.adapters.size(); ++k) {
    ModelParts single_parts;
    single_parts.linear_factory =
        std::make_shared<LoraLinearFactory>(m.adapters[k], LinearFactoryOrDefault(base_factory));
    GPT single = *GPTImpl::Create(m.config, single_parts);
    EXPECT_TRUE(LoadBaseWeights(*single, base, "base").ok());
    const std::string slot = absl::StrCat(".slot", k, ".");
    for (auto& item : single->named_parameters()) {
      if (!IsPeftOnlyParameter(item.key())) continue;
      const std::string name = item.key();
      const size_t dot = name.rfind('.');
      item.value().copy_(slots.at(absl::StrCat(name.substr(0, dot), slot, name.substr(dot + 1))));
    }
    m.single.push_back(single);
  }
  for (GPT* model : {&m.base, &m.multi}) (*model)->eval();
  for (GPT& model : m.single) model->eval();
  return m;
}

at::Tensor Positions(int64_t start, int64_t length) {
  return at::arange(start, start + length, at::kLong).unsqueeze(0);
}

// A request: its adapter, its tokens, a cache in the multi-adapter model's pass and one in its
// own model's.
struct Sequence {
  int64_t adapter = -1;
  at::Tensor tokens;  // [1, length]
  int64_t fed = 0;
  std::unique_ptr<DenseKVCache> shared, alone;
};

std::vector<Sequence> MakeSequences(Models& m, const std::vector<int64_t>& adapters,
                                    int64_t length) {
  at::manual_seed(5);
  std::vector<Sequence> sequences;
  for (int64_t adapter : adapters) {
    Sequence s;
    s.adapter = adapter;
    s.tokens = at::randint(0, m.config.vocab_size, {1, length}, at::kLong);
    s.shared = *m.multi->NewDenseCache(1, length);
    s.alone = *m.For(adapter).NewDenseCache(1, length);
    sequences.push_back(std::move(s));
  }
  return sequences;
}

// One ForwardChunks step through `model` (the multi-adapter model, or `adapters` left out for
// another model) feeding `counts[s]` tokens of sequence s (0: none), checked against each
// chunk run alone through its adapter's model. Returns the step's logits.
at::Tensor Step(Models& m, std::vector<Sequence>& sequences, const std::vector<int64_t>& counts,
                double tolerance = 1e-4) {
  std::vector<SequenceChunk> chunks;
  std::vector<size_t> fed;
  for (size_t s = 0; s < sequences.size(); ++s) {
    if (counts[s] == 0) continue;
    Sequence& seq = sequences[s];
    SequenceChunk chunk;
    chunk.cache = seq.shared.get();
    chunk.ids = seq.tokens.narrow(1, seq.fed, counts[s]);
    chunk.positions = Positions(seq.fed, counts[s]);
    chunk.adapter = seq.adapter;
    chunks.push_back(chunk);
    fed.push_back(s);
  }
  absl::StatusOr<at::Tensor> logits = ForwardChunks(*m.multi, chunks);
  EXPECT_TRUE(logits.ok()) << logits.status();
  if (!logits.ok()) return at::Tensor();
  for (size_t c = 0; c < chunks.size(); ++c) {
    Sequence& seq = sequences[fed[c]];
    ForwardOptions alone;
    alone.positions = chunks[c].positions;
    alone.last_logits_only = true;
    const at::Tensor expected =
        m.For(seq.adapter).Forward(chunks[c].ids, seq.alone.get(), alone).value().reshape({-1});
    EXPECT_LE(MaxDiff(logits->select(0, static_cast<int64_t>(c)), expected), tolerance)
        << "sequence " << fed[c] << " (adapter " << seq.adapter << ")";
    seq.fed += counts[fed[c]];
  }
  return *logits;
}

// One fused QKV projection with per-row slots: row i is x_i (W + delta_k)^T + b for its slot k
// (each adapter a different subset of Q, K, V), the base model's rows x_i W^T + b exactly.
TEST(MultiLoraProjection, EachRowGetsItsSlotsUpdateOnly) {
  at::manual_seed(4);
  at::NoGradGuard no_grad;
  LinearSpec spec;
  spec.site = LinearSite::kQkv;
  spec.in_features = 32;
  spec.q_size = 32;
  spec.kv_size = 16;
  spec.out_features = 64;
  spec.bias = true;
  MultiLoraProjectionImpl projection(spec, LinearFactory().Make(spec), ThreeAdapters());
  ASSERT_EQ(projection.slots(), 3);
  EXPECT_EQ(projection.slot(0).rank(), 4);  // query, value
  EXPECT_EQ(projection.slot(1).rank(), 2);  // query, key
  EXPECT_EQ(projection.slot(2).rank(), 0);  // no attention site: no parameters
  EXPECT_FALSE(projection.slot(2).lora_A.defined());
  for (auto& p : projection.parameters()) p.normal_(0, 0.3);
  const at::Tensor weight = projection.DenseWeight(), bias = projection.DenseBias();
  const at::Tensor x = at::randn({2, 4, 32});  // [B, T, in]
  const std::vector<int64_t> slots = {0, -1, 1, 1, 2, 0, -1, 1};
  const AdapterRouting routing = AdapterRouting::PerRow(slots, at::kCPU);
  at::Tensor y;
  {
    const ScopedAdapterRouting routed(&routing);
    y = projection.forward(x).reshape({8, 64});
  }
  const at::Tensor rows = x.reshape({8, 32});
  const at::Tensor base = projection.linear->forward(x).reshape({8, 64});
  for (int64_t i = 0; i < 8; ++i) {
    const int64_t slot = slots[static_cast<size_t>(i)];
    const at::Tensor delta =
        slot < 0 ? at::zeros_like(weight) : projection.slot(slot).DeltaWeight();
    const at::Tensor expected = at::linear(rows[i], weight + delta, bias);
    if (slot < 0) {
      EXPECT_TRUE(at::equal(y[i], base[i])) << i;
    } else {
      EXPECT_LE(MaxDiff(y[i], expected), 1e-5) << i;
    }
  }
  // Adapter 0 adapts Q and V only: its K columns are the base's.
  EXPECT_TRUE(at::equal(y[0].narrow(0, 32, 16), base[0].narrow(0, 32, 16)));
  // No routing installed: the base projection.
  EXPECT_TRUE(at::equal(projection.forward(x).reshape({8, 64}), base));
  // A routing of another number of rows is refused, not misapplied.
  const AdapterRouting short_routing = AdapterRouting::PerRow({0, 1, -1}, at::kCPU);
  const ScopedAdapterRouting routed(&short_routing);
  EXPECT_THROW(projection.forward(x), c10::Error);
}

TEST(MultiLora, EachAdapterChangesTheLogits) {
  Models m = MakeModels();
  at::NoGradGuard no_grad;
  const at::Tensor tokens = at::randint(0, m.config.vocab_size, {2, 10}, at::kLong);
  const at::Tensor base = m.base->Forward(tokens).value();
  for (size_t k = 0; k < m.single.size(); ++k) {
    EXPECT_GT(MaxDiff(m.single[k]->Forward(tokens).value(), base), 1e-2) << "adapter " << k;
  }
}

// Prompt chunks and decode rows of the base model and of adapters 0, 1 and 2 in the same
// steps: each row equals its adapter's model alone, through three kinds of step (tokens end to
// end with decode rows among prompt chunks, and a pure decode step of one row each).
TEST(MultiLora, MixedChunksEqualEachAdaptersModelAlone) {
  Models m = MakeModels();
  at::NoGradGuard no_grad;
  std::vector<Sequence> sequences = MakeSequences(m, {-1, 0, 1, 2, 0, 1, -1, 2}, 24);
  Step(m, sequences, {5, 7, 3, 6, 1, 4, 2, 8});  // prompts, one of a single token
  Step(m, sequences, {1, 4, 1, 0, 6, 1, 3, 1});  // decode rows among prompt chunks
  for (int step = 0; step < 3; ++step) Step(m, sequences, {1, 1, 1, 1, 1, 1, 1, 1});  // decode
  Step(m, sequences, {0, 1, 0, 1, 0, 0, 0, 1});  // a subset: one chunk per adapter
  Step(m, sequences, {0, 0, 1, 0, 0, 0, 0, 0});  // one chunk alone (the batch-1 pass)
}

// Rows of the base model (-1) in a mixed pass are the base model's own rows, bit for bit: the
// base projections see the same rows, and no update touches them.
TEST(MultiLora, BaseRowsAreTheBaseModelsExactly) {
  Models m = MakeModels();
  at::NoGradGuard no_grad;
  for (const bool decode : {false, true}) {
    std::vector<SequenceChunk> mixed, plain;
    std::vector<std::unique_ptr<DenseKVCache>> caches;
    const std::vector<int64_t> adapters = {-1, 0, -1, 1, 2};
    for (size_t s = 0; s < adapters.size(); ++s) {
      const int64_t length = decode ? 1 : 3 + static_cast<int64_t>(s);
      SequenceChunk chunk;
      chunk.ids = at::randint(0, m.config.vocab_size, {1, length}, at::kLong);
      chunk.positions = Positions(0, length);
      caches.push_back(*m.multi->NewDenseCache(1, 16));
      chunk.cache = caches.back().get();
      chunk.adapter = adapters[s];
      mixed.push_back(chunk);
      caches.push_back(*m.base->NewDenseCache(1, 16));
      chunk.cache = caches.back().get();
      chunk.adapter = -1;
      plain.push_back(chunk);
    }
    const at::Tensor with_adapters = ForwardChunks(*m.multi, mixed).value();
    const at::Tensor base = ForwardChunks(*m.base, plain).value();
    for (int64_t s : {0, 2}) {
      EXPECT_TRUE(at::equal(with_adapters[s], base[s])) << "decode " << decode << ", row " << s;
    }
    EXPECT_GT(MaxDiff(with_adapters[1], base[1]), 1e-3);  // the adapters' rows did change
  }
  // No adapters at all: the base model's forward pass, bit for bit.
  const at::Tensor tokens = at::randint(0, m.config.vocab_size, {3, 9}, at::kLong);
  EXPECT_TRUE(at::equal(m.multi->Forward(tokens).value(), m.base->Forward(tokens).value()));
  ForwardOptions none;
  none.adapters = {-1, -1, -1};
  EXPECT_TRUE(
      at::equal(m.multi->Forward(tokens, nullptr, none).value(), m.base->Forward(tokens).value()));
}

// One adapter for every row: the whole-batch routing (no gather), from one entry, from one
// entry per row, from ForwardChunks and from Generate.
TEST(MultiLora, OneAdapterForEveryRow) {
  Models m = MakeModels();
  at::NoGradGuard no_grad;
  const at::Tensor tokens = at::randint(0, m.config.vocab_size, {3, 9}, at::kLong);
  for (int64_t slot = 0; slot < 3; ++slot) {
    const at::Tensor expected = m.single[static_cast<size_t>(slot)]->Forward(tokens).value();
    ForwardOptions whole;
    whole.adapters = {slot};
    EXPECT_LE(MaxDiff(m.multi->Forward(tokens, nullptr, whole).value(), expected), 1e-4);
    ForwardOptions per_row;
    per_row.adapters = {slot, slot, slot};
    EXPECT_LE(MaxDiff(m.multi->Forward(tokens, nullptr, per_row).value(), expected), 1e-4);
  }
  // Every row of one adapter through ForwardChunks, prefill then decode.
  std::vector<Sequence> sequences = MakeSequences(m, {1, 1, 1, 1}, 12);
  Step(m, sequences, {4, 2, 5, 3});
  Step(m, sequences, {1, 1, 1, 1});
  // Generate (batch 1) and GenerateBatch with one adapter each.
  GenerateOptions options;
  options.max_new_tokens = 6;
  options.adapter = 2;
  const std::vector<int64_t> prompt = {3, 14, 15, 9, 2};
  auto shared_cache = *m.multi->NewDenseCache(1, 32);
  auto alone_cache = *m.single[2]->NewDenseCache(1, 32);
  const std::vector<int64_t> with_slot = Generate(*m.multi, *shared_cache, prompt, options).value();
  options.adapter = -1;
  EXPECT_EQ(with_slot, Generate(*m.single[2], *alone_cache, prompt, options).value());
  BatchGenerateOptions batch_options;
  batch_options.max_new_tokens = 5;
  batch_options.adapters = {0, -1, 1};
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11, 12}};
  auto batch_cache = *m.multi->NewDenseCache(3, 32);
  const std::vector<std::vector<int64_t>> batched =
      GenerateBatch(*m.multi, *batch_cache, prompts, batch_options).value();
  for (size_t row = 0; row < prompts.size(); ++row) {
    GenerateOptions one;
    one.max_new_tokens = 5;
    one.seed = batch_options.seed;
    const int64_t slot = batch_options.adapters[row];
    auto cache = *m.For(slot).NewDenseCache(1, 32);
    EXPECT_EQ(batched[row], Generate(m.For(slot), *cache, prompts[row], one).value()) << row;
  }
}

TEST(MultiLora, BadSlotsAreErrorsNamingTheField) {
  Models m = MakeModels();
  at::NoGradGuard no_grad;
  EXPECT_EQ(m.multi->adapter_slots(), 3);
  EXPECT_EQ(m.base->adapter_slots(), 0);
  auto cache = *m.multi->NewDenseCache(1, 16);
  for (const int64_t slot : {3, -2}) {
    SequenceChunk chunk{cache.get(), at::zeros({1, 2}, at::kLong), Positions(0, 2), slot};
    SequenceChunk other = chunk;
    other.adapter = 0;
    const absl::Status status = ForwardChunks(*m.multi, {other, chunk}).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ErrorField(status), "SequenceChunk.adapter");
    EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("chunk 1: SequenceChunk.adapter is ", slot,
                                                         ": the model's adapter slots are "
                                                         "[0, 3)")));
  }
  // The base model serves none.
  auto base_cache = *m.base->NewDenseCache(1, 16);
  SequenceChunk chunk{base_cache.get(), at::zeros({1, 2}, at::kLong), Positions(0, 2), 0};
  EXPECT_THAT(ForwardChunks(*m.base, {chunk}).status().message(),
              HasSubstr("the model serves no adapters"));
  const at::Tensor tokens = at::zeros({2, 3}, at::kLong);
  ForwardOptions options;
  options.adapters = {0, 3};
  absl::Status status = m.multi->Forward(tokens, nullptr, options).status();
  EXPECT_EQ(ErrorField(status), "ForwardOptions.adapters");
  EXPECT_THAT(status.message(), HasSubstr("ForwardOptions.adapters[1] is 3"));
  options.adapters = {0, 1, 2, 0};
  status = m.multi->Forward(tokens, nullptr, options).status();
  EXPECT_EQ(ErrorField(status), "ForwardOptions.adapters");
  EXPECT_THAT(status.message(), HasSubstr("has 4 entries for ids [2, 3]"));
  GenerateOptions generate;
  generate.adapter = 7;
  status = Generate(*m.multi, *cache, {1, 2}, generate).status();
  EXPECT_EQ(ErrorField(status), "GenerateOptions.adapter");
  BatchGenerateOptions batch;
  batch.adapters = {0};
  auto batch_cache = *m.multi->NewDenseCache(2, 16);
  status = GenerateBatch(*m.multi, *batch_cache, {{1}, {2}}, batch).status();
  EXPECT_EQ(ErrorField(status), "BatchGenerateOptions.adapters");
  batch.adapters = {0, 5};
  status = GenerateBatch(*m.multi, *batch_cache, {{1}, {2}}, batch).status();
  EXPECT_THAT(status.message(), HasSubstr("BatchGenerateOptions.adapters[1] is 5"));
}

TEST(MultiLora, AdapterSlotByName) {
  const std::vector<std::string> names = {"sql", "chat"};
  EXPECT_EQ(AdapterSlotByName(names, "chat").value(), 1);
  EXPECT_EQ(AdapterSlotByName(names, "").value(), -1);
  const absl::Status unknown = AdapterSlotByName(names, "poetry").status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.message(), HasSubstr("'sql', 'chat'"));
}

TEST(MultiLora, PartsRefuseBadAdapters) {
  const Config config = TinyConfig();
  EXPECT_FALSE(MultiLoraParts(config, {}).ok());
  std::vector<LoraOptions> adapters = ThreeAdapters();
  adapters[1].r = config.n_embd + 1;
  const absl::Status status = MultiLoraParts(config, adapters).status();
  EXPECT_THAT(status.message(), HasSubstr("adapter slot 1: lora_r"));
}

// ---- Loading LitGPT LoRA fine-tune directories as slots.

std::string TempDir(const std::string& name) {
  const std::string dir = (fs::path(::testing::TempDir()) / name).lexically_normal().string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

Config WithLora(Config config, const LoraOptions& lora) {
  config.lora_r = lora.r;
  config.lora_alpha = lora.alpha;
  config.lora_query = lora.query;
  config.lora_key = lora.key;
  config.lora_value = lora.value;
  config.lora_projection = lora.projection;
  config.lora_mlp = lora.mlp;
  config.lora_head = lora.head;
  return config;
}

// The models above as a base checkpoint and three LoRA fine-tune directories over it.
struct Dirs {
  std::string base;
  std::vector<std::string> adapters;
  std::vector<NamedLoraAdapter> named;
};

Dirs WriteDirs(Models& m, const std::string& name) {
  Dirs dirs;
  dirs.base = TempDir(name + "_base");
  WriteText(dirs.base + "/model_config.yaml", ConfigToYaml(m.config));
  EXPECT_TRUE(WriteTorchStateDict(dirs.base + "/lit_model.pth", BaseState(*m.base)).ok());
  const std::vector<std::string> names = {"sql", "chat", "code"};
  for (size_t k = 0; k < m.single.size(); ++k) {
    const std::string dir = TempDir(absl::StrCat(name, "_", names[k]));
    WriteText(dir + "/model_config.yaml", ConfigToYaml(WithLora(m.config, m.adapters[k])));
    WriteText(dir + "/hyperparameters.yaml", "checkpoint_dir: " + dirs.base + "\n");
    TensorMap trained;
    for (const auto& [tensor_name, tensor] : StateDict(*m.single[k])) {
      if (IsTrainedParameter(PeftMethod::kLora, tensor_name)) {
        trained[tensor_name] = tensor.detach().contiguous();
      }
    }
    EXPECT_TRUE(WriteTorchStateDict(dir + "/lit_model.pth.lora", trained).ok());
    dirs.adapters.push_back(dir);
    dirs.named.push_back({names[k], {dir, m.adapters[k].scale}});
  }
  return dirs;
}

TEST(MultiLoraLoad, LoadedSlotsEqualEachAdapterLoadedAlone) {
  Models m = MakeModels();
  const Dirs dirs = WriteDirs(m, "load");
  absl::StatusOr<MultiLoraModel> loaded = LoadMultiLoraModel(dirs.base, dirs.named);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->adapter_names, (std::vector<std::string>{"sql", "chat", "code"}));
  EXPECT_EQ(loaded->AdapterSlot("code").value(), 2);
  EXPECT_EQ(loaded->AdapterSlot("").value(), -1);
  EXPECT_EQ(loaded->loaded.model->adapter_slots(), 3);
  // Each adapter as LoadModelWithPeft loads it alone (the single-adapter loader).
  m.multi = loaded->loaded.model;
  for (size_t k = 0; k < dirs.named.size(); ++k) {
    m.single[k] = LoadModelWithPeft(dirs.base, {dirs.named[k].lora}).value().model;
  }
  at::NoGradGuard no_grad;
  std::vector<Sequence> sequences = MakeSequences(m, {2, -1, 0, 1, 1, 0}, 16);
  Step(m, sequences, {3, 5, 2, 4, 1, 6});
  Step(m, sequences, {1, 1, 1, 1, 1, 1});
  Step(m, sequences, {2, 1, 1, 3, 1, 1});
}

// An int8 and an int4 base (quantised after loading, as EngineOptions.quantize does): each slot
// still equals its adapter over the same quantised base.
TEST(MultiLoraLoad, QuantisedBases) {
  Models m = MakeModels();
  const Dirs dirs = WriteDirs(m, "quantised");
  for (const WeightQuantization q : {WeightQuantization::kInt8, WeightQuantization::kInt4}) {
    LoadOptions options;
    options.parts = QuantizedModelParts(q);
    absl::StatusOr<MultiLoraModel> loaded = LoadMultiLoraModel(dirs.base, dirs.named, options);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ASSERT_TRUE(QuantizeModel(*loaded->loaded.model).ok());
    m.multi = loaded->loaded.model;
    for (size_t k = 0; k < dirs.named.size(); ++k) {
      m.single[k] = LoadModelWithPeft(dirs.base, {dirs.named[k].lora}, options).value().model;
      ASSERT_TRUE(QuantizeModel(*m.single[k]).ok());
    }
    m.base = LoadCheckpoint(dirs.base, options).value().model;
    ASSERT_TRUE(QuantizeModel(*m.base).ok());
    at::NoGradGuard no_grad;
    std::vector<Sequence> sequences = MakeSequences(m, {0, 1, -1, 2}, 12);
    Step(m, sequences, {3, 4, 2, 5});
    Step(m, sequences, {1, 1, 1, 1});
  }
}

TEST(MultiLoraLoad, BadAdaptersAreClearErrors) {
  Models m = MakeModels();
  const Dirs dirs = WriteDirs(m, "bad");
  auto load = [&](std::vector<NamedLoraAdapter> adapters) {
    return LoadMultiLoraModel(dirs.base, adapters, {}, "EngineOptions.adapters").status();
  };
  // Names: empty, repeated.
  std::vector<NamedLoraAdapter> named = dirs.named;
  named[1].name = "";
  absl::Status status = load(named);
  EXPECT_EQ(ErrorField(status), "EngineOptions.adapters");
  EXPECT_THAT(status.message(), HasSubstr("EngineOptions.adapters[1].name is empty"));
  named = dirs.named;
  named[2].name = "sql";
  EXPECT_THAT(load(named).message(), HasSubstr("[2].name 'sql' names an earlier adapter too"));
  named = dirs.named;
  named[0].lora.scale = -1;
  EXPECT_THAT(load(named).message(), HasSubstr("EngineOptions.adapters[0].scale"));
  EXPECT_THAT(load({}).message(), HasSubstr("EngineOptions.adapters is empty"));
  // No such directory; not a LoRA fine-tune.
  named = dirs.named;
  named[1].lora.dir = dirs.base + "/none";
  status = load(named);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("EngineOptions.adapters[1] 'chat' "));
  named[1].lora.dir = dirs.base;
  EXPECT_THAT(load(named).message(), HasSubstr("no lit_model.pth.lora"));
  // Another base: a different model_config.yaml key.
  const std::string other = TempDir("bad_other_base");
  fs::copy_file(dirs.adapters[1] + "/lit_model.pth.lora", other + "/lit_model.pth.lora");
  Config other_config = WithLora(m.config, m.adapters[1]);
  other_config.n_layer = 3;
  WriteText(other + "/model_config.yaml", ConfigToYaml(other_config));
  named = dirs.named;
  named[1].lora.dir = other;
  status = load(named);
  EXPECT_EQ(ErrorField(status), "EngineOptions.adapters");
  EXPECT_THAT(status.message(), HasSubstr("EngineOptions.adapters[1] 'chat' " + other));
  EXPECT_THAT(status.message(), HasSubstr("n_layer is 3 but the base model's is 2"));
  // A file whose shapes are not its config's: adapter 0's file under adapter 1's config.
  const std::string shapes = TempDir("bad_shapes");
  fs::copy_file(dirs.adapters[0] + "/lit_model.pth.lora", shapes + "/lit_model.pth.lora");
  WriteText(shapes + "/model_config.yaml", ConfigToYaml(WithLora(m.config, m.adapters[1])));
  named = dirs.named;
  named[2].lora.dir = shapes;
  status = load(named);
  EXPECT_EQ(ErrorField(status), "EngineOptions.adapters");
  EXPECT_THAT(status.message(), HasSubstr("EngineOptions.adapters[2] 'code' " + shapes));
  EXPECT_THAT(status.message(), HasSubstr("lit_model.pth.lora: "));
  // The base must be plain.
  EXPECT_THAT(LoadMultiLoraModel(dirs.adapters[0], dirs.named).status().message(),
              HasSubstr("is a lora fine-tune"));
}

}  // namespace
}  // namespace lgpt
