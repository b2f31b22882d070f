// What per-request LoRA costs a decode step: 16 sequences, one token each, through
// ForwardChunks (the serving step) on the base model, on a multi-adapter model of 4 adapters
// with every row on the base (-1), every row on adapter 0 (no gather), and the rows spread
// over the 4 adapters (4 rows each: gather, two small products, index_add per adapter).
//
//   bazel run //peft:multi_lora_benchmark -- [--threads=1] [--rank=16] [--context=128]
//       [--steps=16] [--rounds=9]
//
// Each round prefills every sequence's `context` tokens (untimed), then times `steps` decode
// steps per mode, the modes interleaved round by round; prints each mode's median and minimum
// step time.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cache/dense_kv_cache.h"
#include "core/config/config.h"
#include "core/model/batch_forward.h"
#include "core/model/gpt.h"
#include "peft/lora.h"
#include "peft/multi_lora.h"

namespace lgpt {
namespace {

constexpr int64_t kRows = 16;
constexpr int64_t kAdapters = 4;

Config SmallConfig() {
  Config c;
  c.name = "bench-small";
  c.mlp_class = MlpClass::kLLaMAMLP;
  c.norm_class = NormClass::kRMSNorm;
  c.parallel_residual = false;
  c.bias = false;
  c.rotary_percentage = 1.0;
  c.block_size = 1024;
  c.n_layer = 4;
  c.n_embd = 512;
  c.n_head = 8;
  c.intermediate_size = 1408;
  c.vocab_size = 4096;
  c.padding_multiple = 64;
  if (!c.Finalize().ok()) std::abort();
  return c;
}

int64_t Flag(int argc, char** argv, const char* name, int64_t fallback) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      return std::atoll(argv[i] + prefix.size());
    }
  }
  return fallback;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main(int argc, char** argv) {
  const int64_t threads = Flag(argc, argv, "threads", 1);
  const int64_t rank = Flag(argc, argv, "rank", 16);
  const int64_t context = Flag(argc, argv, "context", 128);
  const int64_t steps = Flag(argc, argv, "steps", 16);
  const int64_t rounds = Flag(argc, argv, "rounds", 9);
  at::set_num_threads(static_cast<int>(threads));
  at::NoGradGuard no_grad;
  const Config config = SmallConfig();
  at::manual_seed(0);
  GPT base = *GPTImpl::Create(config);
  std::vector<LoraOptions> adapters;
  for (int64_t k = 0; k < kAdapters; ++k) {
    LoraOptions a;
    a.r = rank;
    a.alpha = 2.0 * static_cast<double>(rank);
    a.query = a.key = a.value = a.projection = a.mlp = true;
    adapters.push_back(a);
  }
  GPT multi = *GPTImpl::Create(config, *MultiLoraParts(config, adapters));
  {
    // The base weights shared, the slots random.
    std::map<std::string, at::Tensor> base_params;
    for (const auto& item : base->named_parameters()) base_params[item.key()] = item.value();
    for (auto& item : multi->named_parameters()) {
      std::string name = item.key();
      if (name.find("lora_") != std::string::npos) {
        item.value().normal_(0, 0.02);
        continue;
      }
      const size_t at = name.find(".linear.");
      if (at != std::string::npos) name.erase(at, 7);
      item.value().copy_(base_params.at(name));
    }
  }
  base->eval();
  multi->eval();

  struct Mode {
    const char* name;
    GPTImpl* model;
    std::vector<int64_t> slots;  // per row
    std::vector<double> times;   // per-step seconds of each round
  };
  std::vector<int64_t> spread, none(kRows, -1), one(kRows, 0);
  for (int64_t row = 0; row < kRows; ++row) spread.push_back(row % kAdapters);
  std::vector<Mode> modes = {{"base model", base.get(), none, {}},
                             {"multi-LoRA, every row base (-1)", multi.get(), none, {}},
                             {"multi-LoRA, every row adapter 0", multi.get(), one, {}},
                             {"multi-LoRA, 4 adapters x 4 rows", multi.get(), spread, {}}};
  const at::Tensor prompt = at::randint(0, config.vocab_size, {kRows, context}, at::kLong);
  const at::Tensor next = at::randint(0, config.vocab_size, {kRows, steps}, at::kLong);
  for (int64_t round = 0; round < rounds; ++round) {
    for (Mode& mode : modes) {
      std::vector<std::unique_ptr<DenseKVCache>> caches;
      std::vector<SequenceChunk> chunks(kRows);
      for (int64_t row = 0; row < kRows; ++row) {
        caches.push_back(*mode.model->NewDenseCache(1, context + steps));
        chunks[row].cache = caches.back().get();
        chunks[row].adapter = mode.slots[row];
        ForwardOptions prefill;
        prefill.positions = at::arange(context, at::kLong).unsqueeze(0);
        prefill.last_logits_only = true;
        prefill.adapters = {mode.slots[row]};
        if (!mode.model->Forward(prompt.narrow(0, row, 1), caches.back().get(), prefill).ok()) {
          std::abort();
        }
      }
      const auto start = std::chrono::steady_clock::now();
      for (int64_t step = 0; step < steps; ++step) {
        for (int64_t row = 0; row < kRows; ++row) {
          chunks[row].ids = next.narrow(0, row, 1).narrow(1, step, 1);
          chunks[row].positions = at::full({1, 1}, context + step, at::kLong);
        }
        if (!ForwardChunks(*mode.model, chunks).ok()) std::abort();
      }
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (round > 0) mode.times.push_back(seconds / static_cast<double>(steps));  // round 0 warms
    }
  }
  std::printf(
      "decode step, %lld rows, context %lld, %lld layers, n_embd %lld, rank %lld, "
      "%lld threads\n",
      static_cast<long long>(kRows), static_cast<long long>(context),
      static_cast<long long>(config.n_layer), static_cast<long long>(config.n_embd),
      static_cast<long long>(rank), static_cast<long long>(threads));
  // The median, and the minimum (the least disturbed by other load on the machine).
  const double median_reference = Median(modes[0].times);
  const double min_reference = *std::min_element(modes[0].times.begin(), modes[0].times.end());
  for (const Mode& mode : modes) {
    const double median = Median(mode.times);
    const double least = *std::min_element(mode.times.begin(), mode.times.end());
    std::printf("  %-34s median %7.3f ms (%+5.1f%%)   min %7.3f ms (%+5.1f%%)\n", mode.name,
                1e3 * median, 100.0 * (median / median_reference - 1.0), 1e3 * least,
                100.0 * (least / min_reference - 1.0));
  }
  return 0;
}

}  // namespace
}  // namespace lgpt

int main(int argc, char** argv) { return lgpt::Main(argc, argv); }
