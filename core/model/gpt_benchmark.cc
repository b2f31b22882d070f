// Prefill and decode throughput of GPT with random weights.
//
//   bazel run //core/model:gpt_benchmark -- --benchmark_filter=Decode [--threads=N]
//
// --threads: intra-op threads (default: all hardware threads).
// LGPT_BENCH_TRACE=FILE.json: after each Decode benchmark, LibTorch's operator profile of five
// more steps (chrome://tracing), to count and time the operations a decode step issues.
// --quantize=int8|int4: block-quantised projections (core/model/quantize_model.h).
//
// LGPT_DEVICE=cuda: the model and its cache on the GPU (each timed step synchronised).
//
// Models: "tiny" (tests' size) and "llama-110m" (llama2.c's 110M: n_layer 12, n_embd 768,
// n_head 12, intermediate 2048, vocab 32000). LGPT_BENCH_PRESET=<preset name> adds any
// LitGPT preset at full size. Decode runs at several filled lengths with the cache sized
// for the whole block, to show that its cost follows the filled length.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <benchmark/benchmark.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "core/base/device.h"
#include "core/config/config.h"
#include "core/config/config_presets.h"
#include "core/model/gpt.h"
#include "core/model/quantize_model.h"

namespace lgpt {
namespace {

Config ModelConfig(const std::string& name) {
  if (name == "tiny" || name == "llama-110m") {
    Config c;
    c.name = name;
    c.mlp_class = MlpClass::kLLaMAMLP;
    c.norm_class = NormClass::kRMSNorm;
    c.parallel_residual = false;
    c.bias = false;
    c.rotary_percentage = 1.0;
    c.block_size = 1024;
    const bool tiny = name == "tiny";
    c.n_layer = tiny ? 2 : 12;
    c.n_embd = tiny ? 64 : 768;
    c.n_head = tiny ? 4 : 12;
    c.intermediate_size = tiny ? 128 : 2048;
    c.vocab_size = tiny ? 256 : 32000;
    c.padding_multiple = 64;
    if (!c.Finalize().ok()) std::abort();
    return c;
  }
  absl::StatusOr<Config> preset = ConfigFromName(name);
  if (!preset.ok()) std::abort();
  return *preset;
}

WeightQuantization& Quantization() {
  static WeightQuantization quantization = WeightQuantization::kNone;
  return quantization;
}

GPT& Model(const std::string& name) {
  static auto* models = new std::map<std::string, GPT>();
  auto it = models->find(name);
  if (it == models->end()) {
    at::manual_seed(0);
    GPT model = *GPTImpl::Create(ModelConfig(name), QuantizedModelParts(Quantization()));
    // On its device first (GPTImpl::To moves the RoPE tables too), then quantised there.
    model->To(DefaultDevice(), at::kFloat);
    if (Quantization() != WeightQuantization::kNone && !QuantizeModel(*model).ok()) std::abort();
    model->eval();
    it = models->emplace(name, model).first;
  }
  return it->second;
}

void Prefill(benchmark::State& state, const std::string& name) {
  at::NoGradGuard no_grad;
  GPT& model = Model(name);
  const int64_t length = state.range(0);
  const c10::Device device = DefaultDevice();
  const at::Tensor tokens =
      at::randint(0, model->config().vocab_size, {1, length}, at::kLong).to(device);
  for (auto _ : state) {
    auto cache = model->NewDenseCache(1, length, length);
    ForwardOptions options;
    options.last_logits_only = true;
    benchmark::DoNotOptimize(*model->Forward(tokens, cache->get(), options));
    SynchronizeDevice(device);
  }
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(length), benchmark::Counter::kIsIterationInvariantRate);
}

void Decode(benchmark::State& state, const std::string& name) {
  at::NoGradGuard no_grad;
  GPT& model = Model(name);
  const int64_t filled = state.range(0);
  const int64_t max_length = model->config().block_size;
  auto cache = *model->NewDenseCache(1, max_length, max_length);
  const c10::Device device = DefaultDevice();
  const at::Tensor prompt =
      at::randint(0, model->config().vocab_size, {1, filled}, at::kLong).to(device);
  ForwardOptions prefill;
  prefill.last_logits_only = true;
  (void)*model->Forward(prompt, cache.get(), prefill);
  const at::Tensor token = at::zeros({1, 1}, at::TensorOptions(at::kLong).device(device));
  ForwardOptions step;
  step.positions = at::full({1, 1}, filled, at::TensorOptions(at::kLong).device(device));
  step.last_logits_only = true;
  for (auto _ : state) {
    // Re-writes position `filled` each time: the cache stays at the same fill.
    benchmark::DoNotOptimize(*model->Forward(token, cache.get(), step));
    SynchronizeDevice(device);
  }
  if (const char* trace = std::getenv("LGPT_BENCH_TRACE")) {
    // LibTorch's operator-level profile of a few decode steps (chrome://tracing format).
    torch::autograd::profiler::RecordProfile profile{std::string(trace)};
    for (int i = 0; i < 5; ++i) (void)*model->Forward(token, cache.get(), step);
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(1, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["kv_cache_bytes"] = static_cast<double>(cache->AllocatedBytes());
}

void RegisterAll() {
  std::vector<std::string> names = {"tiny", "llama-110m"};
  if (const char* preset = std::getenv("LGPT_BENCH_PRESET")) names.push_back(preset);
  for (const std::string& name : names) {
    benchmark::RegisterBenchmark(("Prefill/" + name).c_str(), Prefill, name)
        ->Arg(128)
        ->Arg(512)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("Decode/" + name).c_str(), Decode, name)
        ->Arg(16)
        ->Arg(128)  // the mean context of llama2.c's default 256-step run
        ->Arg(256)
        ->Arg(512)  // the mean context of a 1024-step run
        ->Arg(1000)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
}

}  // namespace
}  // namespace lgpt

int main(int argc, char** argv) {
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) threads = std::atoi(argv[i] + 10);
    if (std::strncmp(argv[i], "--quantize=", 11) == 0) {
      lgpt::Quantization() = lgpt::ParseWeightQuantization(argv[i] + 11).value();
    }
  }
  at::set_num_threads(std::max(threads, 1));
  benchmark::AddCustomContext("threads", std::to_string(at::get_num_threads()));
  benchmark::AddCustomContext("weights", lgpt::WeightQuantizationName(lgpt::Quantization()));
  benchmark::AddCustomContext("device", lgpt::DefaultDevice().str());
  benchmark::Initialize(&argc, argv);
  lgpt::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
