#include "core/config/config_presets.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "core/config/config.h"
#include "core/base/status_macros.h"

namespace lgpt {
namespace {

constexpr NormClass kLayerNorm = NormClass::kLayerNorm;
constexpr NormClass kRMSNorm = NormClass::kRMSNorm;
constexpr MlpClass kLLaMAMLP = MlpClass::kLLaMAMLP;
constexpr MlpClass kGemmaMLP = MlpClass::kGemmaMLP;
constexpr MlpClass kLLaMAMoE = MlpClass::kLLaMAMoE;

// Builds a Config with setters named after LitGPT's keys, so that each entry below reads like
// its dict in config.py. Fields not set keep Config's (= LitGPT's) defaults.
class P {
 public:
  P() = default;

  P& block_size(int64_t v) { return Set(&Config::block_size, v); }
  P& vocab_size(int64_t v) { return Set(&Config::vocab_size, v); }
  P& padding_multiple(int64_t v) { return Set(&Config::padding_multiple, v); }
  P& padded_vocab_size(int64_t v) { return Set(&Config::padded_vocab_size, v); }
  P& n_layer(int64_t v) { return Set(&Config::n_layer, v); }
  P& n_embd(int64_t v) { return Set(&Config::n_embd, v); }
  P& n_head(int64_t v) { return Set(&Config::n_head, v); }
  P& n_query_groups(int64_t v) { return Set(&Config::n_query_groups, v); }
  P& head_size(int64_t v) { return Set(&Config::head_size, v); }
  P& intermediate_size(int64_t v) { return Set(&Config::intermediate_size, v); }
  P& moe_intermediate_size(int64_t v) { return Set(&Config::moe_intermediate_size, v); }
  P& norm_class_name(NormClass v) { return Set(&Config::norm_class, v); }
  P& mlp_class_name(MlpClass v) { return Set(&Config::mlp_class, v); }
  P& norm_eps(double v) { return Set(&Config::norm_eps, v); }
  P& norm_qk(bool v) { return Set(&Config::norm_qk, v); }
  P& norm_qk_type(NormQkType v) { return Set(&Config::norm_qk_type, v); }
  P& norm_1(bool v) { return Set(&Config::norm_1, v); }
  P& norm_2(bool v) { return Set(&Config::norm_2, v); }
  P& post_attention_norm(bool v) { return Set(&Config::post_attention_norm, v); }
  P& post_mlp_norm(bool v) { return Set(&Config::post_mlp_norm, v); }
  P& parallel_residual(bool v) { return Set(&Config::parallel_residual, v); }
  P& shared_attention_norm(bool v) { return Set(&Config::shared_attention_norm, v); }
  P& bias(bool v) { return Set(&Config::bias, v); }
  P& attn_bias(bool v) { return Set(&Config::attn_bias, v); }
  P& lm_head_bias(bool v) { return Set(&Config::lm_head_bias, v); }
  P& gelu_approximate(const char* v) { return Set(&Config::gelu_approximate, std::string(v)); }
  P& scale_embeddings(bool v) { return Set(&Config::scale_embeddings, v); }
  P& attention_scores_scalar(double v) { return Set(&Config::attention_scores_scalar, v); }
  P& attention_logit_softcapping(double v) { return Set(&Config::attention_logit_softcapping, v); }
  P& final_logit_softcapping(double v) { return Set(&Config::final_logit_softcapping, v); }
  P& sliding_window_size(int64_t v) { return Set(&Config::sliding_window_size, v); }
  P& sliding_window_indices(std::vector<int> v) {
    return Set(&Config::sliding_window_indices, std::move(v));
  }
  P& rotary_percentage(double v) { return Set(&Config::rotary_percentage, v); }
  P& rope_base(double v) { return Set(&Config::rope_base, v); }
  P& rope_condense_ratio(int64_t v) { return Set(&Config::rope_condense_ratio, v); }
  P& rope_local_base_freq(double v) { return Set(&Config::rope_local_base_freq, v); }
  P& rope_indices(std::vector<int> v) { return Set(&Config::rope_indices, std::move(v)); }
  P& n_expert(int64_t v) { return Set(&Config::n_expert, v); }
  P& n_expert_per_token(int64_t v) { return Set(&Config::n_expert_per_token, v); }

  // rope_adjustments=dict(factor=..., low_freq_factor=..., high_freq_factor=...,
  // original_max_seq_len=...): Llama 3.1's frequency adjustment.
  P& llama3_rope(double factor, double low_freq_factor, double high_freq_factor,
                 double original_max_seq_len) {
    RopeAdjustments r;
    r.factor = factor;
    r.low_freq_factor = low_freq_factor;
    r.high_freq_factor = high_freq_factor;
    r.original_max_seq_len = original_max_seq_len;
    c_.rope_adjustments = r;
    return *this;
  }
  // rope_adjustments=dict(factor=...): linear position scaling.
  P& linear_rope(double factor) {
    RopeAdjustments r;
    r.factor = factor;
    c_.rope_adjustments = r;
    return *this;
  }

  const Config& config() const { return c_; }

 private:
  template <typename Member, typename Value>
  P& Set(Member Config::*member, Value&& v) {
    c_.*member = std::forward<Value>(v);
    return *this;
  }

  Config c_;
};

// Gemma 2's sliding_window_indices: layers 0, 2, 4, ... use the window.
std::vector<int> EveryOtherLayer(int64_t n_layer) {
  std::vector<int> indices(n_layer);
  for (int64_t i = 0; i < n_layer; ++i) indices[i] = i % 2 == 0 ? 1 : 0;
  return indices;
}

// Gemma 3's sliding_window_indices and rope_indices: every sixth layer is global.
std::vector<int> FiveLocalOneGlobal(int64_t n_layer) {
  std::vector<int> indices(n_layer);
  for (int64_t i = 0; i < n_layer; ++i) indices[i] = (i + 1) % 6 == 0 ? 0 : 1;
  return indices;
}

// ---- Shared bases: what a family's dicts in config.py all repeat. ----

// LLaMA-style block: full rotary, sequential residual, no biases, RMSNorm, SwiGLU MLP.
P Llama() {
  return P()
      .rotary_percentage(1.0)
      .parallel_residual(false)
      .bias(false)
      .norm_class_name(kRMSNorm)
      .mlp_class_name(kLLaMAMLP);
}

P Falcon() {
  return P()
      .block_size(2048)
      .vocab_size(65024)
      .padded_vocab_size(65024)
      .rotary_percentage(1.0)
      .bias(false);
}

P Falcon3() {
  return Llama()
      .vocab_size(131072)
      .padded_vocab_size(131072)
      .n_query_groups(4)
      .rope_base(1000042)
      .norm_eps(1e-6);
}

P Llama3() {
  return Llama().vocab_size(128000).padded_vocab_size(128256).n_query_groups(8).rope_base(500000);
}

P Olmo2() {
  return Llama()
      .vocab_size(100278)
      .padded_vocab_size(100352)
      .block_size(4096)
      .norm_eps(1e-6)
      .rope_base(500000)
      .norm_qk(true)
      .norm_qk_type(NormQkType::kOlmo2)
      .norm_1(false)
      .norm_2(false)
      .post_attention_norm(true)
      .post_mlp_norm(true);
}

P Gemma() {
  return Llama()
      .mlp_class_name(kGemmaMLP)
      .gelu_approximate("tanh")
      .scale_embeddings(true)
      .vocab_size(256000);
}

// Gemma 2: softcapping, extra norms, and sliding windows on even layers.
P Gemma2(int64_t n_layer) {
  return Gemma()
      .n_layer(n_layer)
      .block_size(8192)
      .sliding_window_size(4096)
      .sliding_window_indices(EveryOtherLayer(n_layer))
      .post_attention_norm(true)
      .post_mlp_norm(true)
      .attention_logit_softcapping(50.0)
      .final_logit_softcapping(30.0);
}

// Gemma 3: five local (windowed, local RoPE base) layers for every global one.
P Gemma3(int64_t n_layer) {
  return Gemma()
      .n_layer(n_layer)
      .vocab_size(262144)
      .block_size(131072)
      .sliding_window_indices(FiveLocalOneGlobal(n_layer))
      .post_attention_norm(true)
      .post_mlp_norm(true)
      .norm_qk(true)
      .rope_base(1000000)
      .rope_local_base_freq(10000)
      .rope_indices(FiveLocalOneGlobal(n_layer));
}

P CodeLlama() { return Llama().block_size(16384).norm_eps(1e-5).rope_base(1000000); }

P Platypus() { return Llama().padded_vocab_size(32000); }

// Phi 1.5 / 2: GPT-NeoX block with a shared attention norm.
P Phi() {
  return P()
      .shared_attention_norm(true)
      .lm_head_bias(true)
      .gelu_approximate("tanh")
      .vocab_size(50257)
      .padded_vocab_size(51200)
      .block_size(2048);
}

P Phi3() {
  return Llama()
      .vocab_size(32000)
      .padded_vocab_size(32064)
      .n_embd(3072)
      .n_layer(32)
      .intermediate_size(8192);
}

P Phi4() {
  return Llama()
      .vocab_size(100352)
      .padded_vocab_size(100352)
      .n_embd(5120)
      .n_layer(40)
      .n_head(40)
      .n_query_groups(10)
      .intermediate_size(17920);
}

P Phi4Mini() {
  return Llama()
      .vocab_size(200019)
      .padded_vocab_size(200064)
      .block_size(131072)
      .n_embd(3072)
      .n_layer(32)
      .n_head(24)
      .n_query_groups(8)
      .rotary_percentage(0.75)
      .intermediate_size(8192)
      .sliding_window_size(262145);
}

P Mistral() {
  return Llama().n_layer(32).n_query_groups(8).norm_eps(1e-5).intermediate_size(14336);
}

P TinyLlama() {
  return Llama()
      .block_size(2048)
      .vocab_size(32000)
      .padding_multiple(64)
      .norm_eps(1e-5)
      .intermediate_size(5632)
      .n_query_groups(4);
}

P Qwen() { return Llama().attn_bias(true).vocab_size(151643); }

P Qwen3() {
  return Llama()
      .block_size(40960)
      .vocab_size(151643)
      .padded_vocab_size(151936)
      .norm_eps(1e-6)
      .rope_base(1000000)
      .norm_qk(true);
}

P Qwen3Moe() {
  return Qwen3().mlp_class_name(kLLaMAMoE).head_size(128).n_expert(128).n_expert_per_token(8);
}

// ---- The registry. ----

// One name/Hugging Face name pair that a config.py loop makes from a "{}" pattern.
struct Kind {
  const char* name;
  const char* hf_name;
};

class Registry {
 public:
  // Adds `p` once per kind, with "{}" in the names replaced as config.py's str.format does.
  void Add(absl::string_view name, absl::string_view hf_org, absl::string_view hf_name, const P& p,
           const std::vector<Kind>& kinds = {{"", ""}}) {
    for (const Kind& kind : kinds) {
      Config c = p.config();
      c.name = absl::StrReplaceAll(name, {{"{}", kind.name}});
      c.hf_org = std::string(hf_org);
      c.hf_name = absl::StrReplaceAll(hf_name, {{"{}", kind.hf_name}});
      presets_.push_back(std::move(c));
    }
  }

  std::vector<Config> Take() { return std::move(presets_); }

 private:
  std::vector<Config> presets_;
};

std::vector<Kind> Kinds(std::initializer_list<const char*> suffixes) {
  std::vector<Kind> kinds;
  for (const char* s : suffixes) kinds.push_back({s, s});
  return kinds;
}

// The families, in config.py's order (which from_name's search by Hugging Face name follows).

void AddStableLm(Registry& r) {
  r.Add("stablelm-base-alpha-3b", "stabilityai", "stablelm-base-alpha-3b", P());
  r.Add("stablelm-base-alpha-7b", "stabilityai", "stablelm-base-alpha-7b",
        P().n_head(48).n_embd(6144).padding_multiple(256));
  r.Add("stablelm-tuned-alpha-3b", "stabilityai", "stablelm-tuned-alpha-3b", P().n_head(32));
  r.Add("stablelm-tuned-alpha-7b", "stabilityai", "stablelm-tuned-alpha-7b",
        P().n_head(48).n_embd(6144).padding_multiple(256));
  // LayerNorm and partial rotary (LitGPT's defaults) with a LLaMA MLP.
  const P stablelm_3b = P().padded_vocab_size(50304)
                            .n_layer(32)
                            .n_head(32)
                            .n_embd(2560)
                            .parallel_residual(false)
                            .bias(false)
                            .mlp_class_name(kLLaMAMLP)
                            .intermediate_size(6912);
  r.Add("stablelm-3b-4e1t", "stabilityai", "stablelm-3b-4e1t", stablelm_3b);
  r.Add("stablelm-zephyr-3b", "stabilityai", "stablelm-zephyr-3b", stablelm_3b);

  const P stablecode = P().vocab_size(49152).n_layer(32).n_embd(2560);
  r.Add("stablecode-completion-alpha-3b", "stabilityai", "stablecode-completion-alpha-3b",
        P(stablecode).block_size(16384));
  r.Add("stablecode-completion-alpha-3b-4k", "stabilityai", "stablecode-completion-alpha-3b-4k",
        stablecode);
  r.Add("stablecode-instruct-alpha-3b", "stabilityai", "stablecode-instruct-alpha-3b", stablecode);
  r.Add("stable-code-3b", "stabilityai", "stable-code-3b", P(stablelm_3b).block_size(16384));
}

void AddPythia(Registry& r) {
  struct Size {
    const char* name;
    int64_t block_size, n_layer, n_embd, n_head, padding_multiple;
  };
  static constexpr Size kSizes[] = {
      {"pythia-14m", 512, 6, 128, 4, 128},      {"pythia-31m", 1024, 6, 256, 8, 128},
      {"pythia-70m", 2048, 6, 512, 8, 128},     {"pythia-160m", 2048, 12, 768, 12, 128},
      {"pythia-410m", 2048, 24, 1024, 16, 128}, {"pythia-1b", 2048, 16, 2048, 8, 128},
      {"pythia-1.4b", 2048, 24, 2048, 16, 128}, {"pythia-2.8b", 2048, 32, 2560, 32, 128},
      {"pythia-6.9b", 2048, 32, 4096, 32, 256}, {"pythia-12b", 2048, 36, 5120, 40, 512},
  };
  const auto pythia = [](const Size& s) {
    return P()
        .block_size(s.block_size)
        .n_layer(s.n_layer)
        .n_embd(s.n_embd)
        .n_head(s.n_head)
        .padding_multiple(s.padding_multiple);
  };
  for (const Size& s : kSizes) r.Add(s.name, "EleutherAI", s.name, pythia(s));
  // Deduped twins come after all the originals; the two smallest have none.
  for (const Size& s : kSizes) {
    const std::string name = s.name;
    if (name == "pythia-14m" || name == "pythia-31m") continue;
    r.Add(name + "-deduped", "EleutherAI", name + "-deduped", pythia(s));
  }
}

void AddFalcon(Registry& r) {
  const std::vector<Kind> instruct = Kinds({"", "-instruct"});
  // shared_attention_norm is not in falcon-7b's config.json, only in its model code.
  const P falcon_7b =
      Falcon().n_layer(32).n_head(71).n_embd(4544).n_query_groups(1).shared_attention_norm(true);
  r.Add("falcon-7b{}", "tiiuae", "falcon-7b{}", falcon_7b, instruct);
  r.Add("falcon-40b{}", "tiiuae", "falcon-40b{}",
        Falcon().n_layer(60).n_head(128).n_embd(8192).n_query_groups(8), instruct);
  r.Add("falcon-180B{}", "tiiuae", "falcon-180B{}",
        Falcon().n_layer(80).n_head(232).n_embd(14848).n_query_groups(8), Kinds({"", "-chat"}));

  const std::vector<Kind> falcon3 = Kinds({"-Base", "-Instruct"});
  r.Add("Falcon3-1B{}", "tiiuae", "Falcon3-1B{}",
        Falcon3().block_size(4096).n_layer(18).n_head(8).n_embd(2048).intermediate_size(8192),
        falcon3);
  r.Add("Falcon3-3B{}", "tiiuae", "Falcon3-3B{}",
        Falcon3().block_size(32768).n_layer(22).n_head(12).n_embd(3072).intermediate_size(9216),
        falcon3);
  r.Add("Falcon3-7B{}", "tiiuae", "Falcon3-7B{}",
        Falcon3().block_size(32768).n_layer(28).n_head(12).n_embd(3072).intermediate_size(23040),
        falcon3);
  r.Add("Falcon3-10B{}", "tiiuae", "Falcon3-10B{}",
        Falcon3().block_size(32768).n_layer(40).n_head(12).n_embd(3072).intermediate_size(23040),
        falcon3);
}

void AddOpenLlama(Registry& r) {
  const P open_llama =
      Llama().block_size(2048).vocab_size(32000).padding_multiple(64).norm_eps(1e-6);
  r.Add("open_llama_3b", "openlm-research", "open_llama_3b",
        P(open_llama).n_layer(26).n_embd(3200).intermediate_size(8640));
  r.Add("open_llama_7b", "openlm-research", "open_llama_7b",
        P(open_llama).n_layer(32).intermediate_size(11008));
  r.Add("open_llama_13b", "openlm-research", "open_llama_13b",
        P(open_llama).n_layer(40).n_head(40).n_embd(5120).intermediate_size(13824));
}

void AddLlama2(Registry& r) {
  const std::vector<Kind> chat = Kinds({"", "-chat"});
  const P llama2 = Llama().vocab_size(32000).padding_multiple(64);
  r.Add("Llama-2-7b{}-hf", "meta-llama", "Llama-2-7b{}-hf",
        P(llama2).n_layer(32).intermediate_size(11008), chat);
  r.Add("Llama-2-13b{}-hf", "meta-llama", "Llama-2-13b{}-hf",
        P(llama2).n_layer(40).n_head(40).n_embd(5120).intermediate_size(13824), chat);
  r.Add("Llama-2-70b{}-hf", "meta-llama", "Llama-2-70b{}-hf",
        P(llama2).n_layer(80).n_head(64).n_embd(8192).n_query_groups(8).intermediate_size(28672),
        chat);
}

void AddLlama3(Registry& r) {
  const std::vector<Kind> instruct = Kinds({"", "-Instruct"});
  const P l8b = Llama3().n_layer(32).n_head(32).intermediate_size(14336);
  const P l70b = Llama3().n_layer(80).n_head(64).n_embd(8192).intermediate_size(28672);
  r.Add("Llama-3-8B{}", "meta-llama", "Meta-Llama-3-8B{}", P(l8b).block_size(8192), instruct);
  r.Add("Llama-3.1-8B{}", "meta-llama", "Meta-Llama-3.1-8B{}",
        P(l8b).block_size(131072).llama3_rope(8.0, 1.0, 4.0, 8192), instruct);
  r.Add("Llama-3-70B{}", "meta-llama", "Meta-Llama-3-70B{}", P(l70b).block_size(8192), instruct);
  r.Add("Llama-3.1-70B{}", "meta-llama", "Meta-Llama-3.1-70B{}",
        P(l70b).block_size(131072).llama3_rope(8.0, 1.0, 4.0, 8192), instruct);
  r.Add("Llama-3.1-405B{}", "meta-llama", "Meta-Llama-3.1-405B{}",
        Llama3()
            .block_size(131072)
            .n_layer(126)
            .n_head(128)
            .n_embd(16384)
            .intermediate_size(53248)
            .llama3_rope(8.0, 1.0, 4.0, 8192),
        instruct);
  r.Add("Llama-3.2-1B{}", "meta-llama", "Llama-3.2-1B{}",
        Llama3()
            .block_size(131072)
            .n_layer(16)
            .n_embd(2048)
            .n_head(32)
            .intermediate_size(8192)
            .llama3_rope(32.0, 1.0, 4.0, 8192),
        instruct);
  r.Add("Llama-3.2-3B{}", "meta-llama", "Llama-3.2-3B{}",
        Llama3()
            .block_size(131072)
            .n_layer(28)
            .n_embd(3072)
            .n_head(24)
            .intermediate_size(8192)
            .llama3_rope(32.0, 1.0, 4.0, 8192),
        instruct);
  const P l31_70b = P(l70b).block_size(131072).llama3_rope(8.0, 1.0, 4.0, 8192);
  r.Add("Llama-3.3-70B-Instruct", "meta-llama", "Llama-3.3-70B-Instruct", l31_70b);
  r.Add("Llama-3.1-Nemotron-70B-Instruct-HF", "nvidia", "Llama-3.1-Nemotron-70B-Instruct-HF",
        l31_70b);
}

void AddOlmo(Registry& r) {
  // OLMo 1: LayerNorm without affine parameters (see Config::NormHasAffine).
  const P olmo = Llama()
                     .norm_class_name(kLayerNorm)
                     .vocab_size(50280)
                     .padded_vocab_size(50304)
                     .block_size(2048);
  r.Add("OLMo-1B-hf", "allenai", "OLMo-1B-hf",
        P(olmo).n_embd(2048).n_layer(16).n_head(16).intermediate_size(8192));
  const P olmo_7b = P(olmo).n_layer(32).n_head(32).intermediate_size(11008);
  r.Add("OLMo-7B-hf", "allenai", "OLMo-7B-hf", olmo_7b);
  r.Add("OLMo-7B-Instruct-hf", "allenai", "OLMo-7B-Instruct-hf", olmo_7b);

  const std::vector<Kind> stages = Kinds({"", "-SFT", "-DPO", "-Instruct"});
  r.Add("OLMo-2-1124-7B{}", "allenai", "OLMo-2-1124-7B{}",
        Olmo2().n_embd(4096).n_layer(32).n_head(32).n_query_groups(32).intermediate_size(11008),
        stages);
  r.Add("OLMo-2-1124-13B{}", "allenai", "OLMo-2-1124-13B{}",
        Olmo2().n_embd(5120).n_layer(40).n_head(40).n_query_groups(40).intermediate_size(13824),
        stages);
}

void AddGemma(Registry& r) {
  struct Model {
    const char* name;
    const char* hf_name;
    P p;
  };
  const Model models[] = {
      {"Gemma-2b", "gemma-2b",
       Gemma()
           .padding_multiple(64)
           .n_embd(2048)
           .n_layer(18)
           .n_head(8)
           .n_query_groups(1)
           .intermediate_size(16384)},
      {"Gemma-7b", "gemma-7b",
       Gemma()
           .padding_multiple(64)
           .n_embd(3072)
           .n_layer(28)
           .n_head(16)
           .head_size(256)
           .intermediate_size(24576)},
      {"Gemma-2-2b", "gemma-2-2b",
       Gemma2(26)
           .attention_scores_scalar(256)
           .intermediate_size(9216)
           .n_embd(2304)
           .n_head(8)
           .n_query_groups(4)
           .head_size(256)},
      {"Gemma-2-9b", "gemma-2-9b",
       Gemma2(42)
           .attention_scores_scalar(256)
           .intermediate_size(14336)
           .n_embd(3584)
           .n_head(16)
           .n_query_groups(8)
           .head_size(256)},
      // Scores are scaled by sqrt(n_embd / n_head) = sqrt(144), not sqrt(head_size).
      {"Gemma-2-27b", "gemma-2-27b",
       Gemma2(46)
           .attention_scores_scalar(144)
           .intermediate_size(36864)
           .n_embd(4608)
           .n_head(32)
           .n_query_groups(16)
           .head_size(128)},
  };
  // The instruction-tuned twins come after all the base models.
  for (const Model& m : models) r.Add(m.name, "google", m.hf_name, m.p);
  for (const Model& m : models) {
    r.Add(absl::StrCat(m.name, "-it"), "google", absl::StrCat(m.hf_name, "-it"), m.p);
  }

  r.Add("Gemma-3-1b-it", "google", "gemma-3-1b-it",
        Gemma3(26)
            .attention_scores_scalar(256)
            .sliding_window_size(512)
            .intermediate_size(6912)
            .n_embd(1152)
            .n_head(4)
            .n_query_groups(1)
            .head_size(256));
  r.Add("Gemma-3-4b-it", "google", "gemma-3-4b-it",
        Gemma3(34)
            .attention_scores_scalar(256)
            .sliding_window_size(1024)
            .intermediate_size(10240)
            .n_embd(2560)
            .n_head(8)
            .n_query_groups(4)
            .head_size(256)
            .linear_rope(8.0));
  r.Add("Gemma-3-12b-it", "google", "gemma-3-12b-it",
        Gemma3(48)
            .attention_scores_scalar(256)
            .sliding_window_size(1024)
            .intermediate_size(15360)
            .n_embd(3840)
            .n_head(16)
            .n_query_groups(8)
            .head_size(256)
            .linear_rope(8.0));
  r.Add("Gemma-3-27b-it", "google", "gemma-3-27b-it",
        Gemma3(62)
            .attention_scores_scalar(168)
            .sliding_window_size(1024)
            .intermediate_size(21504)
            .n_embd(5376)
            .n_head(32)
            .n_query_groups(16)
            .head_size(128)
            .linear_rope(8.0));

  r.Add("CodeGemma-7b-it", "google", "codegemma-7b-it",
        Gemma()
            .padding_multiple(64)
            .n_embd(3072)
            .n_layer(28)
            .n_head(16)
            .head_size(256)
            .intermediate_size(24576));
}

void AddFreeWillyAndCodeLlama(Registry& r) {
  r.Add("FreeWilly2", "stabilityai", "FreeWilly2",
        Llama()
            .vocab_size(32000)
            .padding_multiple(64)
            .n_layer(80)
            .n_head(64)
            .n_embd(8192)
            .n_query_groups(8)
            .intermediate_size(28672));

  // Code Llama's 32016-token vocabularies are padded to 16; the 32000 ones are not padded.
  const P v32016 = CodeLlama().vocab_size(32016).padding_multiple(16);
  const P v32000 = CodeLlama().vocab_size(32000).padded_vocab_size(32000);
  const auto size_7b = [](P p) { return p.n_layer(32).intermediate_size(11008); };
  const auto size_13b = [](P p) {
    return p.n_layer(40).n_head(40).n_embd(5120).intermediate_size(13824);
  };
  const auto size_34b = [](P p) {
    return p.n_layer(48).n_head(64).n_embd(8192).n_query_groups(8).intermediate_size(22016);
  };
  const auto size_70b = [](P p) {
    return p.n_layer(80).n_head(64).n_embd(8192).n_query_groups(8).intermediate_size(28672);
  };
  const auto add = [&r](const char* name, const P& p) { r.Add(name, "codellama", name, p); };
  add("CodeLlama-7b-hf", size_7b(v32016));
  add("CodeLlama-13b-hf", size_13b(v32016));
  add("CodeLlama-34b-hf", size_34b(v32000));
  add("CodeLlama-70b-hf", size_70b(v32016));
  add("CodeLlama-7b-Python-hf", size_7b(v32000));
  add("CodeLlama-13b-Python-hf", size_13b(v32000));
  add("CodeLlama-34b-Python-hf", size_34b(v32000));
  add("CodeLlama-70b-Python-hf", size_70b(v32016));
  add("CodeLlama-7b-Instruct-hf", size_7b(v32016));
  add("CodeLlama-13b-Instruct-hf", size_13b(v32016).block_size(2048));
  add("CodeLlama-34b-Instruct-hf", size_34b(v32000));
  // Token 32016 is an added token, so the vocabulary reports one fewer.
  add("CodeLlama-70b-Instruct-hf", size_70b(P(v32016).vocab_size(32015)));
}

void AddPlatypus(Registry& r) {
  const auto add = [&r](const char* name, const P& p) { r.Add(name, "garage-bAInd", name, p); };
  const P size_13b = Platypus().n_layer(40).n_head(40).n_embd(5120).intermediate_size(13824);
  const P size_70b = Platypus().n_layer(80).n_head(64).n_embd(8192).intermediate_size(28672);
  add("Platypus-30B", Platypus()
                          .block_size(2048)
                          .n_layer(60)
                          .n_head(52)
                          .n_embd(6656)
                          .norm_eps(1e-6)
                          .intermediate_size(17920));
  add("Platypus2-7B", Platypus().n_layer(32).norm_eps(1e-5).intermediate_size(11008));
  add("Platypus2-13B", P(size_13b).norm_eps(1e-5));
  add("Platypus2-70B", size_70b);  // Without grouped queries, unlike the other 70B ones.
  add("Camel-Platypus2-13B", size_13b);
  add("Camel-Platypus2-70B", P(size_70b).n_query_groups(8));
  add("Stable-Platypus2-13B", size_13b);
  add("Platypus2-70B-instruct", P(size_70b).n_query_groups(8));

  r.Add("LLaMA-2-7B-32K", "togethercomputer", "LLaMA-2-7B-32K",
        Llama()
            .vocab_size(32000)
            .padding_multiple(64)
            .n_layer(32)
            .intermediate_size(11008)
            .rope_condense_ratio(8));
}

void AddPhi(Registry& r) {
  const auto add = [&r](const char* name, const P& p) { r.Add(name, "microsoft", name, p); };
  add("phi-1_5", Phi().n_embd(2048).n_layer(24).rotary_percentage(0.5));  // 32 of 64 dims.
  add("phi-2", Phi().n_embd(2560).n_layer(32).rotary_percentage(0.4));    // 32 of 80 dims.
  add("Phi-3-mini-4k-instruct", Phi3().block_size(4096).sliding_window_size(2048));
  add("Phi-3-mini-128k-instruct", Phi3().block_size(131072).sliding_window_size(262145));
  add("Phi-3.5-mini-instruct", Phi3().block_size(4096));
  add("phi-4", Phi4().block_size(16384).rope_base(250000));
  add("Phi-4-reasoning", Phi4().block_size(32768).rope_base(500000));
  add("Phi-4-reasoning-plus", Phi4().block_size(32768).rope_base(500000));
  add("Phi-4-mini-instruct", Phi4Mini());
  add("Phi-4-mini-reasoning", Phi4Mini());
}

void AddMistral(Registry& r) {
  const P mathstral = Mistral().padded_vocab_size(32768).block_size(32768).rope_base(1000000);
  r.Add("Mathstral-7B-v0.1", "mistralai", "mathstral-7B-v0.1",
        P(mathstral).sliding_window_size(4096));

  const std::vector<Kind> instruct = Kinds({"", "Instruct-"});
  // block_size 4096 rather than 32768, as in config.py.
  r.Add("Mistral-7B-{}v0.1", "mistralai", "Mistral-7B-{}v0.1",
        Mistral().padded_vocab_size(32000).block_size(4096).sliding_window_size(4096), instruct);
  r.Add("Mixtral-8x7B-{}v0.1", "mistralai", "Mixtral-8x7B-{}v0.1",
        Mistral()
            .padded_vocab_size(32000)
            .block_size(32768)
            .mlp_class_name(kLLaMAMoE)
            .rope_base(1000000)
            .n_expert(8)
            .n_expert_per_token(2),
        instruct);
  r.Add("Mixtral-8x22B-{}v0.1", "mistralai", "Mixtral-8x22B-{}v0.1",
        Mistral()
            .padded_vocab_size(32768)
            .block_size(65536)
            .n_layer(56)
            .mlp_class_name(kLLaMAMoE)
            .intermediate_size(16384)
            .n_head(48)
            .n_embd(6144)
            .rope_base(1000000)
            .n_expert(8)
            .n_expert_per_token(2),
        instruct);

  const P v02 = Mistral().padded_vocab_size(32000).block_size(32768).rope_base(1000000);
  const P v03 = P(v02).padded_vocab_size(32768);
  r.Add("Mistral-7B-v0.2", "unsloth", "Mistral-7B-v0.2", v02);
  r.Add("Mistral-7B-Instruct-v0.2", "mistralai", "Mistral-7B-Instruct-v0.2", v02);
  r.Add("Mistral-7B-v0.3", "mistralai", "Mistral-7B-v0.3", v03);
  r.Add("Mistral-7B-Instruct-v0.3", "mistralai", "Mistral-7B-Instruct-v0.3", v03);
  const P large = P(v03).n_layer(88).n_head(96).n_embd(12288).intermediate_size(28672);
  r.Add("Mistral-Large-Instruct-2407", "mistralai", "Mistral-Large-Instruct-2407", large);
  r.Add("Mistral-Large-Instruct-2411", "mistralai", "Mistral-Large-Instruct-2411", large);
}

void AddSmallLlamas(Registry& r) {
  r.Add("tiny-llama-1.1b{}", "TinyLlama", "TinyLlama-1.1B{}",
        TinyLlama().n_layer(22).n_head(32).n_embd(2048),
        {{"", "-intermediate-step-1431k-3T"}, {"-chat", "-Chat-v1.0"}});
  r.Add("micro-llama-300M", "keeeeenw", "MicroLlama",
        TinyLlama().n_layer(12).n_head(16).n_embd(1024));
  r.Add("Llama-2-7b-chat-hf-function-calling-v2", "Trelis",
        "Llama-2-7b-chat-hf-function-calling-v2",
        Llama()
            .padding_multiple(64)
            .n_layer(32)
            .intermediate_size(11008)
            .norm_eps(1e-6)
            .block_size(4096)
            .vocab_size(32000)
            .n_head(32)
            .n_embd(4096)
            .rope_base(10000));
}

void AddQwen(Registry& r) {
  // Qwen2.5 sizes; the Coder and Math variants differ in block_size, rope_base and names.
  struct Size {
    const char* size;
    int64_t padded_vocab_size, n_layer, n_head, n_embd, n_query_groups, intermediate_size;
    double norm_eps;
  };
  static constexpr Size k05b = {"0.5B", 151936, 24, 14, 896, 2, 4864, 1e-6};
  static constexpr Size k15b = {"1.5B", 151936, 28, 12, 1536, 2, 8960, 1e-6};
  static constexpr Size k3b = {"3B", 151936, 36, 16, 2048, 2, 11008, 1e-6};
  static constexpr Size k7b = {"7B", 152064, 28, 28, 3584, 4, 18944, 1e-6};
  static constexpr Size k14b = {"14B", 152064, 48, 40, 5120, 8, 13824, 1e-5};
  static constexpr Size k32b = {"32B", 152064, 64, 40, 5120, 8, 27648, 1e-5};
  static constexpr Size k72b = {"72B", 152064, 80, 64, 8192, 8, 29568, 1e-5};
  const auto qwen = [](const Size& s) {
    return Qwen()
        .padded_vocab_size(s.padded_vocab_size)
        .n_layer(s.n_layer)
        .n_head(s.n_head)
        .n_embd(s.n_embd)
        .n_query_groups(s.n_query_groups)
        .intermediate_size(s.intermediate_size)
        .norm_eps(s.norm_eps);
  };
  const std::vector<Kind> instruct = Kinds({"", "-Instruct"});
  const auto add = [&](const std::string& prefix, const Size& s, int64_t block_size,
                       double rope_base) {
    const std::string name = absl::StrCat(prefix, s.size, "{}");
    r.Add(name, "Qwen", name, qwen(s).block_size(block_size).rope_base(rope_base), instruct);
  };
  add("Qwen2.5-", k05b, 32768, 1000000);
  add("Qwen2.5-", k15b, 131072, 1000000);
  add("Qwen2.5-", k3b, 32768, 1000000);
  add("Qwen2.5-", k7b, 131072, 1000000);
  add("Qwen2.5-", k14b, 131072, 1000000);
  add("Qwen2.5-", k32b, 131072, 1000000);
  add("Qwen2.5-", k72b, 131072, 1000000);
  for (const Size* s : {&k05b, &k15b, &k3b, &k7b, &k14b, &k32b}) {
    add("Qwen2.5-Coder-", *s, 32768, 1000000);
  }
  for (const Size* s : {&k15b, &k7b, &k72b}) add("Qwen2.5-Math-", *s, 4096, 10000);

  r.Add("Qwen2.5-7B-Instruct-1M", "Qwen", "Qwen2.5-7B-Instruct-1M",
        qwen(k7b).norm_eps(1e-5).block_size(1010000).rope_base(10000000));
  r.Add("Qwen2.5-14B-Instruct-1M", "Qwen", "Qwen2.5-14B-Instruct-1M",
        qwen(k14b).block_size(1010000).rope_base(10000000));
  r.Add("QwQ-32B", "Qwen", "QwQ-32B", qwen(k32b).block_size(131072).rope_base(1000000));
  r.Add("QwQ-32B-Preview", "Qwen", "QwQ-32B-Preview",
        qwen(k32b).block_size(32768).rope_base(1000000));

  const std::vector<Kind> base = Kinds({"", "-Base"});
  r.Add("Qwen3-0.6B{}", "Qwen", "Qwen3-0.6B{}",
        Qwen3()
            .n_layer(28)
            .n_head(16)
            .n_embd(1024)
            .n_query_groups(8)
            .intermediate_size(3072)
            .head_size(128),
        base);
  r.Add("Qwen3-1.7B{}", "Qwen", "Qwen3-1.7B{}",
        Qwen3().n_layer(28).n_head(16).n_embd(2048).n_query_groups(8).intermediate_size(6144),
        base);
  const P qwen3_4b = Qwen3()
                         .n_layer(36)
                         .n_head(32)
                         .n_embd(2560)
                         .n_query_groups(8)
                         .intermediate_size(9728)
                         .head_size(128);
  r.Add("Qwen3-4B{}", "Qwen", "Qwen3-4B{}", qwen3_4b, base);
  r.Add("Qwen3-8B{}", "Qwen", "Qwen3-8B{}",
        Qwen3().n_layer(36).n_head(32).n_embd(4096).n_query_groups(8).intermediate_size(12288),
        base);
  r.Add("Qwen3-14B{}", "Qwen", "Qwen3-14B{}",
        Qwen3().n_layer(40).n_head(40).n_embd(5120).n_query_groups(8).intermediate_size(17408),
        base);
  r.Add("Qwen3-32B", "Qwen", "Qwen3-32B",
        Qwen3()
            .n_layer(64)
            .n_head(64)
            .n_embd(5120)
            .n_query_groups(8)
            .intermediate_size(25600)
            .head_size(128));

  const P a3b = Qwen3Moe()
                    .n_layer(48)
                    .n_head(32)
                    .n_embd(2048)
                    .n_query_groups(4)
                    .intermediate_size(6144)
                    .moe_intermediate_size(768);
  const P a22b = Qwen3Moe()
                     .n_layer(94)
                     .n_head(64)
                     .n_embd(4096)
                     .n_query_groups(4)
                     .intermediate_size(12288)
                     .moe_intermediate_size(1536);
  r.Add("Qwen3-30B-A3B", "Qwen", "Qwen3-30B-A3B", a3b);
  r.Add("Qwen3-30B-A3B-Base", "Qwen", "Qwen3-30B-A3B-Base", a3b);
  r.Add("Qwen3-235B-A22B", "Qwen", "Qwen3-235B-A22B", a22b);

  const std::vector<Kind> y2507 = Kinds({"Thinking", "Instruct"});
  r.Add("Qwen3-235B-A22B-{}-2507", "Qwen", "Qwen3-235B-A22B-{}-2507",
        P(a22b).block_size(262144).rope_base(5000000), y2507);
  r.Add("Qwen3-30B-A3B-{}-2507", "Qwen", "Qwen3-30B-A3B-{}-2507",
        P(a3b).block_size(262144).rope_base(10000000), y2507);
  r.Add("Qwen3-4B-{}-2507", "Qwen", "Qwen3-4B-{}-2507",
        P(qwen3_4b).block_size(262144).rope_base(5000000), y2507);
}

void AddSalamandraSmolLmR1(Registry& r) {
  const std::vector<Kind> instruct = Kinds({"", "-instruct"});
  const P salamandra =
      Llama().block_size(8192).vocab_size(256000).padded_vocab_size(256000).rope_base(10000);
  r.Add("salamandra-2b{}", "BSC-LT", "salamandra-2b{}",
        P(salamandra)
            .n_layer(24)
            .n_head(16)
            .n_embd(2048)
            .n_query_groups(16)
            .intermediate_size(5440)
            .norm_eps(1e-5),
        instruct);
  r.Add("salamandra-7b{}", "BSC-LT", "salamandra-7b{}",
        P(salamandra)
            .n_layer(32)
            .n_head(32)
            .n_embd(4096)
            .n_query_groups(8)
            .intermediate_size(11008)
            .norm_eps(1e-6),
        instruct);

  const std::vector<Kind> smol_kinds = Kinds({"", "-Instruct"});
  const P smol = Llama().block_size(8192).vocab_size(49152).padded_vocab_size(49152).norm_eps(1e-5);
  const P smol_135m =
      P(smol).n_layer(30).n_head(9).n_embd(576).n_query_groups(3).intermediate_size(1536);
  r.Add("SmolLM2-135M{}", "HuggingFaceTB", "SmolLM2-135M{}", P(smol_135m).rope_base(100000),
        smol_kinds);
  r.Add("SmolLM2-360M{}", "HuggingFaceTB", "SmolLM2-360M{}",
        P(smol)
            .n_layer(32)
            .n_head(15)
            .n_embd(960)
            .n_query_groups(5)
            .intermediate_size(2560)
            .rope_base(100000),
        smol_kinds);
  r.Add("SmolLM2-1.7B{}", "HuggingFaceTB", "SmolLM2-1.7B{}",
        P(smol)
            .n_layer(24)
            .n_head(32)
            .n_embd(2048)
            .n_query_groups(32)
            .intermediate_size(8192)
            .rope_base(130000),
        smol_kinds);

  // The Llama 3.1 8B and 70B configs under other names.
  const P r1_8b = Llama3().block_size(131072).n_layer(32).n_head(32).intermediate_size(14336);
  r.Add("R1-Distill-Llama-8B", "deepseek-ai", "DeepSeek-R1-Distill-Llama-8B",
        P(r1_8b).llama3_rope(8.0, 1.0, 4.0, 8192));
  r.Add("R1-Distill-Llama-70B", "deepseek-ai", "DeepSeek-R1-Distill-Llama-70B",
        Llama3()
            .block_size(131072)
            .n_layer(80)
            .n_head(64)
            .n_embd(8192)
            .intermediate_size(28672)
            .llama3_rope(8.0, 1.0, 4.0, 8192));
}

const std::vector<Config>& Presets() {
  static const std::vector<Config>* const presets = [] {
    Registry r;
    AddStableLm(r);
    AddPythia(r);
    AddFalcon(r);
    AddOpenLlama(r);
    AddLlama2(r);
    AddLlama3(r);
    AddOlmo(r);
    AddGemma(r);
    AddFreeWillyAndCodeLlama(r);
    AddPlatypus(r);
    AddPhi(r);
    AddMistral(r);
    AddSmallLlamas(r);
    AddQwen(r);
    AddSalamandraSmolLmR1(r);
    return new std::vector<Config>(r.Take());
  }();
  return *presets;
}

// Levenshtein distance, case-insensitive, for suggesting names.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      const bool same = absl::ascii_tolower(a[i - 1]) == absl::ascii_tolower(b[j - 1]);
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (same ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

absl::Status NotFound(absl::string_view name) {
  std::vector<std::pair<size_t, std::string>> ranked;
  const std::string lower = absl::AsciiStrToLower(name);
  for (const std::string& candidate : PresetNames()) {
    const std::string candidate_lower = absl::AsciiStrToLower(candidate);
    // Containment (e.g. "llama-3.2-1b") ranks first, then the edit distance.
    const bool contains = !lower.empty() && (candidate_lower.find(lower) != std::string::npos ||
                                             lower.find(candidate_lower) != std::string::npos);
    ranked.emplace_back(contains ? 0 : 1 + EditDistance(name, candidate), candidate);
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> close;
  for (const auto& [distance, candidate] : ranked) {
    if (close.size() == 5 || distance > 1 + std::max<size_t>(3, name.size() / 3)) break;
    close.push_back(candidate);
  }
  std::string message = absl::StrCat("'", name, "' is not a supported config name");
  if (!close.empty()) absl::StrAppend(&message, "; did you mean ", absl::StrJoin(close, ", "), "?");
  return absl::NotFoundError(message);
}

}  // namespace

const std::vector<std::string>& PresetNames() {
  static const std::vector<std::string>* const names = [] {
    auto* out = new std::vector<std::string>();
    for (const Config& c : Presets()) out->push_back(c.name);
    return out;
  }();
  return *names;
}

absl::StatusOr<Config> PresetFromName(absl::string_view name) {
  for (const Config& c : Presets()) {
    if (c.name == name) return c;
  }
  // As from_name does: then by Hugging Face name, bare or as "org/name".
  for (const Config& c : Presets()) {
    if (c.hf_name == name || absl::StrCat(c.hf_org, "/", c.hf_name) == name) return c;
  }
  return NotFound(name);
}

absl::StatusOr<Config> ConfigFromName(absl::string_view name) {
  ASSIGN_OR_RETURN(Config config, PresetFromName(name));
  RETURN_IF_ERROR(config.Finalize());
  return config;
}

}  // namespace lgpt
