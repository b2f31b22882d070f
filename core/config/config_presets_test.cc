#include "core/config/config_presets.h"

#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/config/config.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

// The size and structure of a finalised config in one line.
std::string Summary(const Config& c) {
  return absl::StrFormat(
      "b%d v%d/%d l%d e%d h%d/%d/%d i%d/%s x%d/%d r%d@%.10g eps%.10g %s %s p%db%da%dq%d w%s",
      c.block_size, c.vocab_size, c.PaddedVocabSize(), c.n_layer, c.n_embd, c.n_head,
      c.QueryGroups(), c.HeadSize(), c.IntermediateSize(),
      c.moe_intermediate_size ? absl::StrCat(*c.moe_intermediate_size) : "-", c.n_expert,
      c.n_expert_per_token, c.rope_n_elem, c.rope_base, c.norm_eps, NormClassName(c.norm_class),
      MlpClassName(c.mlp_class), c.parallel_residual, c.bias, c.attn_bias, c.norm_qk,
      c.sliding_window_size ? absl::StrCat(*c.sliding_window_size) : "-");
}

struct Expected {
  const char* name;
  const char* hf;  // org/name
  const char* summary;
};

// Generated with LitGPT's own config.py (every entry of `configs`, in order, through
// Config(**dict)) with the same format as Summary().
const Expected kExpected[] = {
    {"stablelm-base-alpha-3b", "stabilityai/stablelm-base-alpha-3b",
     "b4096 v50254/50688 l16 e4096 h32/32/128 i16384/- x0/0 r32@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"stablelm-base-alpha-7b", "stabilityai/stablelm-base-alpha-7b",
     "b4096 v50254/50432 l16 e6144 h48/48/128 i24576/- x0/0 r32@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"stablelm-tuned-alpha-3b", "stabilityai/stablelm-tuned-alpha-3b",
     "b4096 v50254/50688 l16 e4096 h32/32/128 i16384/- x0/0 r32@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"stablelm-tuned-alpha-7b", "stabilityai/stablelm-tuned-alpha-7b",
     "b4096 v50254/50432 l16 e6144 h48/48/128 i24576/- x0/0 r32@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"stablelm-3b-4e1t", "stabilityai/stablelm-3b-4e1t",
     "b4096 v50254/50304 l32 e2560 h32/32/80 i6912/- x0/0 r20@10000 eps1e-05 LayerNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"stablelm-zephyr-3b", "stabilityai/stablelm-zephyr-3b",
     "b4096 v50254/50304 l32 e2560 h32/32/80 i6912/- x0/0 r20@10000 eps1e-05 LayerNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"stablecode-completion-alpha-3b", "stabilityai/stablecode-completion-alpha-3b",
     "b16384 v49152/49152 l32 e2560 h32/32/80 i10240/- x0/0 r20@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"stablecode-completion-alpha-3b-4k", "stabilityai/stablecode-completion-alpha-3b-4k",
     "b4096 v49152/49152 l32 e2560 h32/32/80 i10240/- x0/0 r20@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"stablecode-instruct-alpha-3b", "stabilityai/stablecode-instruct-alpha-3b",
     "b4096 v49152/49152 l32 e2560 h32/32/80 i10240/- x0/0 r20@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"stable-code-3b", "stabilityai/stable-code-3b",
     "b16384 v50254/50304 l32 e2560 h32/32/80 i6912/- x0/0 r20@10000 eps1e-05 LayerNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"pythia-14m", "EleutherAI/pythia-14m",
     "b512 v50254/50304 l6 e128 h4/4/32 i512/- x0/0 r8@10000 eps1e-05 LayerNorm GptNeoxMLP "
     "p1b1a0q0 w-"},
    {"pythia-31m", "EleutherAI/pythia-31m",
     "b1024 v50254/50304 l6 e256 h8/8/32 i1024/- x0/0 r8@10000 eps1e-05 LayerNorm GptNeoxMLP "
     "p1b1a0q0 w-"},
    {"pythia-70m", "EleutherAI/pythia-70m",
     "b2048 v50254/50304 l6 e512 h8/8/64 i2048/- x0/0 r16@10000 eps1e-05 LayerNorm GptNeoxMLP "
     "p1b1a0q0 w-"},
    {"pythia-160m", "EleutherAI/pythia-160m",
     "b2048 v50254/50304 l12 e768 h12/12/64 i3072/- x0/0 r16@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"pythia-410m", "EleutherAI/pythia-410m",
     "b2048 v50254/50304 l24 e1024 h16/16/64 i4096/- x0/0 r16@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"pythia-1b", "EleutherAI/pythia-1b",
     "b2048 v50254/50304 l16 e2048 h8/8/256 i8192/- x0/0 r64@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"pythia-1.4b", "EleutherAI/pythia-1.4b",
     "b2048 v50254/50304 l24 e2048 h16/16/128 i8192/- x0/0 r32@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"pythia-2.8b", "EleutherAI/pythia-2.8b",
     "b2048 v50254/50304 l32 e2560 h32/32/80 i10240/- x0/0 r20@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"pythia-6.9b", "EleutherAI/pythia-6.9b",
     "b2048 v50254/50432 l32 e4096 h32/32/128 i16384/- x0/0 r32@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"pythia-12b", "EleutherAI/pythia-12b",
     "b2048 v50254/50688 l36 e5120 h40/40/128 i20480/- x0/0 r32@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"pythia-70m-deduped", "EleutherAI/pythia-70m-deduped",
     "b2048 v50254/50304 l6 e512 h8/8/64 i2048/- x0/0 r16@10000 eps1e-05 LayerNorm GptNeoxMLP "
     "p1b1a0q0 w-"},
    {"pythia-160m-deduped", "EleutherAI/pythia-160m-deduped",
     "b2048 v50254/50304 l12 e768 h12/12/64 i3072/- x0/0 r16@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"pythia-410m-deduped", "EleutherAI/pythia-410m-deduped",
     "b2048 v50254/50304 l24 e1024 h16/16/64 i4096/- x0/0 r16@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"pythia-1b-deduped", "EleutherAI/pythia-1b-deduped",
     "b2048 v50254/50304 l16 e2048 h8/8/256 i8192/- x0/0 r64@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"pythia-1.4b-deduped", "EleutherAI/pythia-1.4b-deduped",
     "b2048 v50254/50304 l24 e2048 h16/16/128 i8192/- x0/0 r32@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"pythia-2.8b-deduped", "EleutherAI/pythia-2.8b-deduped",
     "b2048 v50254/50304 l32 e2560 h32/32/80 i10240/- x0/0 r20@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"pythia-6.9b-deduped", "EleutherAI/pythia-6.9b-deduped",
     "b2048 v50254/50432 l32 e4096 h32/32/128 i16384/- x0/0 r32@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"pythia-12b-deduped", "EleutherAI/pythia-12b-deduped",
     "b2048 v50254/50688 l36 e5120 h40/40/128 i20480/- x0/0 r32@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"falcon-7b", "tiiuae/falcon-7b",
     "b2048 v65024/65024 l32 e4544 h71/1/64 i18176/- x0/0 r64@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b0a0q0 w-"},
    {"falcon-7b-instruct", "tiiuae/falcon-7b-instruct",
     "b2048 v65024/65024 l32 e4544 h71/1/64 i18176/- x0/0 r64@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b0a0q0 w-"},
    {"falcon-40b", "tiiuae/falcon-40b",
     "b2048 v65024/65024 l60 e8192 h128/8/64 i32768/- x0/0 r64@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b0a0q0 w-"},
    {"falcon-40b-instruct", "tiiuae/falcon-40b-instruct",
     "b2048 v65024/65024 l60 e8192 h128/8/64 i32768/- x0/0 r64@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b0a0q0 w-"},
    {"falcon-180B", "tiiuae/falcon-180B",
     "b2048 v65024/65024 l80 e14848 h232/8/64 i59392/- x0/0 r64@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b0a0q0 w-"},
    {"falcon-180B-chat", "tiiuae/falcon-180B-chat",
     "b2048 v65024/65024 l80 e14848 h232/8/64 i59392/- x0/0 r64@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b0a0q0 w-"},
    {"Falcon3-1B-Base", "tiiuae/Falcon3-1B-Base",
     "b4096 v131072/131072 l18 e2048 h8/4/256 i8192/- x0/0 r256@1000042 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Falcon3-1B-Instruct", "tiiuae/Falcon3-1B-Instruct",
     "b4096 v131072/131072 l18 e2048 h8/4/256 i8192/- x0/0 r256@1000042 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Falcon3-3B-Base", "tiiuae/Falcon3-3B-Base",
     "b32768 v131072/131072 l22 e3072 h12/4/256 i9216/- x0/0 r256@1000042 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Falcon3-3B-Instruct", "tiiuae/Falcon3-3B-Instruct",
     "b32768 v131072/131072 l22 e3072 h12/4/256 i9216/- x0/0 r256@1000042 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Falcon3-7B-Base", "tiiuae/Falcon3-7B-Base",
     "b32768 v131072/131072 l28 e3072 h12/4/256 i23040/- x0/0 r256@1000042 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Falcon3-7B-Instruct", "tiiuae/Falcon3-7B-Instruct",
     "b32768 v131072/131072 l28 e3072 h12/4/256 i23040/- x0/0 r256@1000042 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Falcon3-10B-Base", "tiiuae/Falcon3-10B-Base",
     "b32768 v131072/131072 l40 e3072 h12/4/256 i23040/- x0/0 r256@1000042 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Falcon3-10B-Instruct", "tiiuae/Falcon3-10B-Instruct",
     "b32768 v131072/131072 l40 e3072 h12/4/256 i23040/- x0/0 r256@1000042 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"open_llama_3b", "openlm-research/open_llama_3b",
     "b2048 v32000/32000 l26 e3200 h32/32/100 i8640/- x0/0 r100@10000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"open_llama_7b", "openlm-research/open_llama_7b",
     "b2048 v32000/32000 l32 e4096 h32/32/128 i11008/- x0/0 r128@10000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"open_llama_13b", "openlm-research/open_llama_13b",
     "b2048 v32000/32000 l40 e5120 h40/40/128 i13824/- x0/0 r128@10000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Llama-2-7b-hf", "meta-llama/Llama-2-7b-hf",
     "b4096 v32000/32000 l32 e4096 h32/32/128 i11008/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Llama-2-7b-chat-hf", "meta-llama/Llama-2-7b-chat-hf",
     "b4096 v32000/32000 l32 e4096 h32/32/128 i11008/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Llama-2-13b-hf", "meta-llama/Llama-2-13b-hf",
     "b4096 v32000/32000 l40 e5120 h40/40/128 i13824/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Llama-2-13b-chat-hf", "meta-llama/Llama-2-13b-chat-hf",
     "b4096 v32000/32000 l40 e5120 h40/40/128 i13824/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Llama-2-70b-hf", "meta-llama/Llama-2-70b-hf",
     "b4096 v32000/32000 l80 e8192 h64/8/128 i28672/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Llama-2-70b-chat-hf", "meta-llama/Llama-2-70b-chat-hf",
     "b4096 v32000/32000 l80 e8192 h64/8/128 i28672/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Llama-3-8B", "meta-llama/Meta-Llama-3-8B",
     "b8192 v128000/128256 l32 e4096 h32/8/128 i14336/- x0/0 r128@500000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Llama-3-8B-Instruct", "meta-llama/Meta-Llama-3-8B-Instruct",
     "b8192 v128000/128256 l32 e4096 h32/8/128 i14336/- x0/0 r128@500000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B",
     "b131072 v128000/128256 l32 e4096 h32/8/128 i14336/- x0/0 r128@500000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B-Instruct",
     "b131072 v128000/128256 l32 e4096 h32/8/128 i14336/- x0/0 r128@500000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Llama-3-70B", "meta-llama/Meta-Llama-3-70B",
     "b8192 v128000/128256 l80 e8192 h64/8/128 i28672/- x0/0 r128@500000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Llama-3-70B-Instruct", "meta-llama/Meta-Llama-3-70B-Instruct",
     "b8192 v128000/128256 l80 e8192 h64/8/128 i28672/- x0/0 r128@500000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B",
     "b131072 v128000/128256 l80 e8192 h64/8/128 i28672/- x0/0 r128@500000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Llama-3.1-70B-Instruct", "meta-llama/Meta-Llama-3.1-70B-Instruct",
     "b131072 v128000/128256 l80 e8192 h64/8/128 i28672/- x0/0 r128@500000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Llama-3.1-405B", "meta-llama/Meta-Llama-3.1-405B",
     "b131072 v128000/128256 l126 e16384 h128/8/128 i53248/- x0/0 r128@500000 eps1e-05 "
     "RMSNorm LLaMAMLP p0b0a0q0 w-"},
    {"Llama-3.1-405B-Instruct", "meta-llama/Meta-Llama-3.1-405B-Instruct",
     "b131072 v128000/128256 l126 e16384 h128/8/128 i53248/- x0/0 r128@500000 eps1e-05 "
     "RMSNorm LLaMAMLP p0b0a0q0 w-"},
    {"Llama-3.2-1B", "meta-llama/Llama-3.2-1B",
     "b131072 v128000/128256 l16 e2048 h32/8/64 i8192/- x0/0 r64@500000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-1B-Instruct",
     "b131072 v128000/128256 l16 e2048 h32/8/64 i8192/- x0/0 r64@500000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Llama-3.2-3B", "meta-llama/Llama-3.2-3B",
     "b131072 v128000/128256 l28 e3072 h24/8/128 i8192/- x0/0 r128@500000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Llama-3.2-3B-Instruct", "meta-llama/Llama-3.2-3B-Instruct",
     "b131072 v128000/128256 l28 e3072 h24/8/128 i8192/- x0/0 r128@500000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Llama-3.3-70B-Instruct", "meta-llama/Llama-3.3-70B-Instruct",
     "b131072 v128000/128256 l80 e8192 h64/8/128 i28672/- x0/0 r128@500000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Llama-3.1-Nemotron-70B-Instruct-HF", "nvidia/Llama-3.1-Nemotron-70B-Instruct-HF",
     "b131072 v128000/128256 l80 e8192 h64/8/128 i28672/- x0/0 r128@500000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"OLMo-1B-hf", "allenai/OLMo-1B-hf",
     "b2048 v50280/50304 l16 e2048 h16/16/128 i8192/- x0/0 r128@10000 eps1e-05 LayerNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"OLMo-7B-hf", "allenai/OLMo-7B-hf",
     "b2048 v50280/50304 l32 e4096 h32/32/128 i11008/- x0/0 r128@10000 eps1e-05 LayerNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"OLMo-7B-Instruct-hf", "allenai/OLMo-7B-Instruct-hf",
     "b2048 v50280/50304 l32 e4096 h32/32/128 i11008/- x0/0 r128@10000 eps1e-05 LayerNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"OLMo-2-1124-7B", "allenai/OLMo-2-1124-7B",
     "b4096 v100278/100352 l32 e4096 h32/32/128 i11008/- x0/0 r128@500000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q1 w-"},
    {"OLMo-2-1124-7B-SFT", "allenai/OLMo-2-1124-7B-SFT",
     "b4096 v100278/100352 l32 e4096 h32/32/128 i11008/- x0/0 r128@500000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q1 w-"},
    {"OLMo-2-1124-7B-DPO", "allenai/OLMo-2-1124-7B-DPO",
     "b4096 v100278/100352 l32 e4096 h32/32/128 i11008/- x0/0 r128@500000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q1 w-"},
    {"OLMo-2-1124-7B-Instruct", "allenai/OLMo-2-1124-7B-Instruct",
     "b4096 v100278/100352 l32 e4096 h32/32/128 i11008/- x0/0 r128@500000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q1 w-"},
    {"OLMo-2-1124-13B", "allenai/OLMo-2-1124-13B",
     "b4096 v100278/100352 l40 e5120 h40/40/128 i13824/- x0/0 r128@500000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q1 w-"},
    {"OLMo-2-1124-13B-SFT", "allenai/OLMo-2-1124-13B-SFT",
     "b4096 v100278/100352 l40 e5120 h40/40/128 i13824/- x0/0 r128@500000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q1 w-"},
    {"OLMo-2-1124-13B-DPO", "allenai/OLMo-2-1124-13B-DPO",
     "b4096 v100278/100352 l40 e5120 h40/40/128 i13824/- x0/0 r128@500000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q1 w-"},
    {"OLMo-2-1124-13B-Instruct", "allenai/OLMo-2-1124-13B-Instruct",
     "b4096 v100278/100352 l40 e5120 h40/40/128 i13824/- x0/0 r128@500000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q1 w-"},
    {"Gemma-2b", "google/gemma-2b",
     "b4096 v256000/256000 l18 e2048 h8/1/256 i16384/- x0/0 r256@10000 eps1e-05 RMSNorm "
     "GemmaMLP p0b0a0q0 w-"},
    {"Gemma-7b", "google/gemma-7b",
     "b4096 v256000/256000 l28 e3072 h16/16/256 i24576/- x0/0 r256@10000 eps1e-05 RMSNorm "
     "GemmaMLP p0b0a0q0 w-"},
    {"Gemma-2-2b", "google/gemma-2-2b",
     "b8192 v256000/256000 l26 e2304 h8/4/256 i9216/- x0/0 r256@10000 eps1e-05 RMSNorm "
     "GemmaMLP p0b0a0q0 w4096"},
    {"Gemma-2-9b", "google/gemma-2-9b",
     "b8192 v256000/256000 l42 e3584 h16/8/256 i14336/- x0/0 r256@10000 eps1e-05 RMSNorm "
     "GemmaMLP p0b0a0q0 w4096"},
    {"Gemma-2-27b", "google/gemma-2-27b",
     "b8192 v256000/256000 l46 e4608 h32/16/128 i36864/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "GemmaMLP p0b0a0q0 w4096"},
    {"Gemma-2b-it", "google/gemma-2b-it",
     "b4096 v256000/256000 l18 e2048 h8/1/256 i16384/- x0/0 r256@10000 eps1e-05 RMSNorm "
     "GemmaMLP p0b0a0q0 w-"},
    {"Gemma-7b-it", "google/gemma-7b-it",
     "b4096 v256000/256000 l28 e3072 h16/16/256 i24576/- x0/0 r256@10000 eps1e-05 RMSNorm "
     "GemmaMLP p0b0a0q0 w-"},
    {"Gemma-2-2b-it", "google/gemma-2-2b-it",
     "b8192 v256000/256000 l26 e2304 h8/4/256 i9216/- x0/0 r256@10000 eps1e-05 RMSNorm "
     "GemmaMLP p0b0a0q0 w4096"},
    {"Gemma-2-9b-it", "google/gemma-2-9b-it",
     "b8192 v256000/256000 l42 e3584 h16/8/256 i14336/- x0/0 r256@10000 eps1e-05 RMSNorm "
     "GemmaMLP p0b0a0q0 w4096"},
    {"Gemma-2-27b-it", "google/gemma-2-27b-it",
     "b8192 v256000/256000 l46 e4608 h32/16/128 i36864/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "GemmaMLP p0b0a0q0 w4096"},
    {"Gemma-3-1b-it", "google/gemma-3-1b-it",
     "b131072 v262144/262144 l26 e1152 h4/1/256 i6912/- x0/0 r256@1000000 eps1e-05 RMSNorm "
     "GemmaMLP p0b0a0q1 w512"},
    {"Gemma-3-4b-it", "google/gemma-3-4b-it",
     "b131072 v262144/262144 l34 e2560 h8/4/256 i10240/- x0/0 r256@1000000 eps1e-05 RMSNorm "
     "GemmaMLP p0b0a0q1 w1024"},
    {"Gemma-3-12b-it", "google/gemma-3-12b-it",
     "b131072 v262144/262144 l48 e3840 h16/8/256 i15360/- x0/0 r256@1000000 eps1e-05 RMSNorm "
     "GemmaMLP p0b0a0q1 w1024"},
    {"Gemma-3-27b-it", "google/gemma-3-27b-it",
     "b131072 v262144/262144 l62 e5376 h32/16/128 i21504/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "GemmaMLP p0b0a0q1 w1024"},
    {"CodeGemma-7b-it", "google/codegemma-7b-it",
     "b4096 v256000/256000 l28 e3072 h16/16/256 i24576/- x0/0 r256@10000 eps1e-05 RMSNorm "
     "GemmaMLP p0b0a0q0 w-"},
    {"FreeWilly2", "stabilityai/FreeWilly2",
     "b4096 v32000/32000 l80 e8192 h64/8/128 i28672/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"CodeLlama-7b-hf", "codellama/CodeLlama-7b-hf",
     "b16384 v32016/32016 l32 e4096 h32/32/128 i11008/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"CodeLlama-13b-hf", "codellama/CodeLlama-13b-hf",
     "b16384 v32016/32016 l40 e5120 h40/40/128 i13824/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"CodeLlama-34b-hf", "codellama/CodeLlama-34b-hf",
     "b16384 v32000/32000 l48 e8192 h64/8/128 i22016/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"CodeLlama-70b-hf", "codellama/CodeLlama-70b-hf",
     "b16384 v32016/32016 l80 e8192 h64/8/128 i28672/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"CodeLlama-7b-Python-hf", "codellama/CodeLlama-7b-Python-hf",
     "b16384 v32000/32000 l32 e4096 h32/32/128 i11008/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"CodeLlama-13b-Python-hf", "codellama/CodeLlama-13b-Python-hf",
     "b16384 v32000/32000 l40 e5120 h40/40/128 i13824/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"CodeLlama-34b-Python-hf", "codellama/CodeLlama-34b-Python-hf",
     "b16384 v32000/32000 l48 e8192 h64/8/128 i22016/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"CodeLlama-70b-Python-hf", "codellama/CodeLlama-70b-Python-hf",
     "b16384 v32016/32016 l80 e8192 h64/8/128 i28672/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"CodeLlama-7b-Instruct-hf", "codellama/CodeLlama-7b-Instruct-hf",
     "b16384 v32016/32016 l32 e4096 h32/32/128 i11008/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"CodeLlama-13b-Instruct-hf", "codellama/CodeLlama-13b-Instruct-hf",
     "b2048 v32016/32016 l40 e5120 h40/40/128 i13824/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"CodeLlama-34b-Instruct-hf", "codellama/CodeLlama-34b-Instruct-hf",
     "b16384 v32000/32000 l48 e8192 h64/8/128 i22016/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"CodeLlama-70b-Instruct-hf", "codellama/CodeLlama-70b-Instruct-hf",
     "b16384 v32015/32016 l80 e8192 h64/8/128 i28672/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Platypus-30B", "garage-bAInd/Platypus-30B",
     "b2048 v32000/32000 l60 e6656 h52/52/128 i17920/- x0/0 r128@10000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Platypus2-7B", "garage-bAInd/Platypus2-7B",
     "b4096 v32000/32000 l32 e4096 h32/32/128 i11008/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Platypus2-13B", "garage-bAInd/Platypus2-13B",
     "b4096 v32000/32000 l40 e5120 h40/40/128 i13824/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Platypus2-70B", "garage-bAInd/Platypus2-70B",
     "b4096 v32000/32000 l80 e8192 h64/64/128 i28672/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Camel-Platypus2-13B", "garage-bAInd/Camel-Platypus2-13B",
     "b4096 v32000/32000 l40 e5120 h40/40/128 i13824/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Camel-Platypus2-70B", "garage-bAInd/Camel-Platypus2-70B",
     "b4096 v32000/32000 l80 e8192 h64/8/128 i28672/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Stable-Platypus2-13B", "garage-bAInd/Stable-Platypus2-13B",
     "b4096 v32000/32000 l40 e5120 h40/40/128 i13824/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Platypus2-70B-instruct", "garage-bAInd/Platypus2-70B-instruct",
     "b4096 v32000/32000 l80 e8192 h64/8/128 i28672/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"LLaMA-2-7B-32K", "togethercomputer/LLaMA-2-7B-32K",
     "b4096 v32000/32000 l32 e4096 h32/32/128 i11008/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"phi-1_5", "microsoft/phi-1_5",
     "b2048 v50257/51200 l24 e2048 h32/32/64 i8192/- x0/0 r32@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"phi-2", "microsoft/phi-2",
     "b2048 v50257/51200 l32 e2560 h32/32/80 i10240/- x0/0 r32@10000 eps1e-05 LayerNorm "
     "GptNeoxMLP p1b1a0q0 w-"},
    {"Phi-3-mini-4k-instruct", "microsoft/Phi-3-mini-4k-instruct",
     "b4096 v32000/32064 l32 e3072 h32/32/96 i8192/- x0/0 r96@10000 eps1e-05 RMSNorm LLaMAMLP "
     "p0b0a0q0 w2048"},
    {"Phi-3-mini-128k-instruct", "microsoft/Phi-3-mini-128k-instruct",
     "b131072 v32000/32064 l32 e3072 h32/32/96 i8192/- x0/0 r96@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w262145"},
    {"Phi-3.5-mini-instruct", "microsoft/Phi-3.5-mini-instruct",
     "b4096 v32000/32064 l32 e3072 h32/32/96 i8192/- x0/0 r96@10000 eps1e-05 RMSNorm LLaMAMLP "
     "p0b0a0q0 w-"},
    {"phi-4", "microsoft/phi-4",
     "b16384 v100352/100352 l40 e5120 h40/10/128 i17920/- x0/0 r128@250000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Phi-4-reasoning", "microsoft/Phi-4-reasoning",
     "b32768 v100352/100352 l40 e5120 h40/10/128 i17920/- x0/0 r128@500000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Phi-4-reasoning-plus", "microsoft/Phi-4-reasoning-plus",
     "b32768 v100352/100352 l40 e5120 h40/10/128 i17920/- x0/0 r128@500000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Phi-4-mini-instruct", "microsoft/Phi-4-mini-instruct",
     "b131072 v200019/200064 l32 e3072 h24/8/128 i8192/- x0/0 r96@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w262145"},
    {"Phi-4-mini-reasoning", "microsoft/Phi-4-mini-reasoning",
     "b131072 v200019/200064 l32 e3072 h24/8/128 i8192/- x0/0 r96@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w262145"},
    {"Mathstral-7B-v0.1", "mistralai/mathstral-7B-v0.1",
     "b32768 v32768/32768 l32 e4096 h32/8/128 i14336/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w4096"},
    {"Mistral-7B-v0.1", "mistralai/Mistral-7B-v0.1",
     "b4096 v32000/32000 l32 e4096 h32/8/128 i14336/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w4096"},
    {"Mistral-7B-Instruct-v0.1", "mistralai/Mistral-7B-Instruct-v0.1",
     "b4096 v32000/32000 l32 e4096 h32/8/128 i14336/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w4096"},
    {"Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-v0.1",
     "b32768 v32000/32000 l32 e4096 h32/8/128 i14336/- x8/2 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMoE p0b0a0q0 w-"},
    {"Mixtral-8x7B-Instruct-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1",
     "b32768 v32000/32000 l32 e4096 h32/8/128 i14336/- x8/2 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMoE p0b0a0q0 w-"},
    {"Mixtral-8x22B-v0.1", "mistralai/Mixtral-8x22B-v0.1",
     "b65536 v32768/32768 l56 e6144 h48/8/128 i16384/- x8/2 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMoE p0b0a0q0 w-"},
    {"Mixtral-8x22B-Instruct-v0.1", "mistralai/Mixtral-8x22B-Instruct-v0.1",
     "b65536 v32768/32768 l56 e6144 h48/8/128 i16384/- x8/2 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMoE p0b0a0q0 w-"},
    {"Mistral-7B-v0.2", "unsloth/Mistral-7B-v0.2",
     "b32768 v32000/32000 l32 e4096 h32/8/128 i14336/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Mistral-7B-Instruct-v0.2", "mistralai/Mistral-7B-Instruct-v0.2",
     "b32768 v32000/32000 l32 e4096 h32/8/128 i14336/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Mistral-7B-v0.3", "mistralai/Mistral-7B-v0.3",
     "b32768 v32768/32768 l32 e4096 h32/8/128 i14336/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Mistral-7B-Instruct-v0.3", "mistralai/Mistral-7B-Instruct-v0.3",
     "b32768 v32768/32768 l32 e4096 h32/8/128 i14336/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Mistral-Large-Instruct-2407", "mistralai/Mistral-Large-Instruct-2407",
     "b32768 v32768/32768 l88 e12288 h96/8/128 i28672/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Mistral-Large-Instruct-2411", "mistralai/Mistral-Large-Instruct-2411",
     "b32768 v32768/32768 l88 e12288 h96/8/128 i28672/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"tiny-llama-1.1b", "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
     "b2048 v32000/32000 l22 e2048 h32/4/64 i5632/- x0/0 r64@10000 eps1e-05 RMSNorm LLaMAMLP "
     "p0b0a0q0 w-"},
    {"tiny-llama-1.1b-chat", "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
     "b2048 v32000/32000 l22 e2048 h32/4/64 i5632/- x0/0 r64@10000 eps1e-05 RMSNorm LLaMAMLP "
     "p0b0a0q0 w-"},
    {"micro-llama-300M", "keeeeenw/MicroLlama",
     "b2048 v32000/32000 l12 e1024 h16/4/64 i5632/- x0/0 r64@10000 eps1e-05 RMSNorm LLaMAMLP "
     "p0b0a0q0 w-"},
    {"Llama-2-7b-chat-hf-function-calling-v2", "Trelis/Llama-2-7b-chat-hf-function-calling-v2",
     "b4096 v32000/32000 l32 e4096 h32/32/128 i11008/- x0/0 r128@10000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B",
     "b32768 v151643/151936 l24 e896 h14/2/64 i4864/- x0/0 r64@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct",
     "b32768 v151643/151936 l24 e896 h14/2/64 i4864/- x0/0 r64@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-1.5B", "Qwen/Qwen2.5-1.5B",
     "b131072 v151643/151936 l28 e1536 h12/2/128 i8960/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct",
     "b131072 v151643/151936 l28 e1536 h12/2/128 i8960/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-3B", "Qwen/Qwen2.5-3B",
     "b32768 v151643/151936 l36 e2048 h16/2/128 i11008/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-3B-Instruct", "Qwen/Qwen2.5-3B-Instruct",
     "b32768 v151643/151936 l36 e2048 h16/2/128 i11008/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-7B", "Qwen/Qwen2.5-7B",
     "b131072 v151643/152064 l28 e3584 h28/4/128 i18944/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct",
     "b131072 v151643/152064 l28 e3584 h28/4/128 i18944/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-14B", "Qwen/Qwen2.5-14B",
     "b131072 v151643/152064 l48 e5120 h40/8/128 i13824/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-14B-Instruct", "Qwen/Qwen2.5-14B-Instruct",
     "b131072 v151643/152064 l48 e5120 h40/8/128 i13824/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-32B", "Qwen/Qwen2.5-32B",
     "b131072 v151643/152064 l64 e5120 h40/8/128 i27648/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-32B-Instruct", "Qwen/Qwen2.5-32B-Instruct",
     "b131072 v151643/152064 l64 e5120 h40/8/128 i27648/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-72B", "Qwen/Qwen2.5-72B",
     "b131072 v151643/152064 l80 e8192 h64/8/128 i29568/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-72B-Instruct", "Qwen/Qwen2.5-72B-Instruct",
     "b131072 v151643/152064 l80 e8192 h64/8/128 i29568/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-Coder-0.5B", "Qwen/Qwen2.5-Coder-0.5B",
     "b32768 v151643/151936 l24 e896 h14/2/64 i4864/- x0/0 r64@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-Coder-0.5B-Instruct", "Qwen/Qwen2.5-Coder-0.5B-Instruct",
     "b32768 v151643/151936 l24 e896 h14/2/64 i4864/- x0/0 r64@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-Coder-1.5B", "Qwen/Qwen2.5-Coder-1.5B",
     "b32768 v151643/151936 l28 e1536 h12/2/128 i8960/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-Coder-1.5B-Instruct", "Qwen/Qwen2.5-Coder-1.5B-Instruct",
     "b32768 v151643/151936 l28 e1536 h12/2/128 i8960/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-Coder-3B", "Qwen/Qwen2.5-Coder-3B",
     "b32768 v151643/151936 l36 e2048 h16/2/128 i11008/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-Coder-3B-Instruct", "Qwen/Qwen2.5-Coder-3B-Instruct",
     "b32768 v151643/151936 l36 e2048 h16/2/128 i11008/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-Coder-7B", "Qwen/Qwen2.5-Coder-7B",
     "b32768 v151643/152064 l28 e3584 h28/4/128 i18944/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-Coder-7B-Instruct", "Qwen/Qwen2.5-Coder-7B-Instruct",
     "b32768 v151643/152064 l28 e3584 h28/4/128 i18944/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-Coder-14B", "Qwen/Qwen2.5-Coder-14B",
     "b32768 v151643/152064 l48 e5120 h40/8/128 i13824/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-Coder-14B-Instruct", "Qwen/Qwen2.5-Coder-14B-Instruct",
     "b32768 v151643/152064 l48 e5120 h40/8/128 i13824/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-Coder-32B", "Qwen/Qwen2.5-Coder-32B",
     "b32768 v151643/152064 l64 e5120 h40/8/128 i27648/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-Coder-32B-Instruct", "Qwen/Qwen2.5-Coder-32B-Instruct",
     "b32768 v151643/152064 l64 e5120 h40/8/128 i27648/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-Math-1.5B", "Qwen/Qwen2.5-Math-1.5B",
     "b4096 v151643/151936 l28 e1536 h12/2/128 i8960/- x0/0 r128@10000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-Math-1.5B-Instruct", "Qwen/Qwen2.5-Math-1.5B-Instruct",
     "b4096 v151643/151936 l28 e1536 h12/2/128 i8960/- x0/0 r128@10000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-Math-7B", "Qwen/Qwen2.5-Math-7B",
     "b4096 v151643/152064 l28 e3584 h28/4/128 i18944/- x0/0 r128@10000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-Math-7B-Instruct", "Qwen/Qwen2.5-Math-7B-Instruct",
     "b4096 v151643/152064 l28 e3584 h28/4/128 i18944/- x0/0 r128@10000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-Math-72B", "Qwen/Qwen2.5-Math-72B",
     "b4096 v151643/152064 l80 e8192 h64/8/128 i29568/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-Math-72B-Instruct", "Qwen/Qwen2.5-Math-72B-Instruct",
     "b4096 v151643/152064 l80 e8192 h64/8/128 i29568/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-7B-Instruct-1M", "Qwen/Qwen2.5-7B-Instruct-1M",
     "b1010000 v151643/152064 l28 e3584 h28/4/128 i18944/- x0/0 r128@10000000 eps1e-05 "
     "RMSNorm LLaMAMLP p0b0a1q0 w-"},
    {"Qwen2.5-14B-Instruct-1M", "Qwen/Qwen2.5-14B-Instruct-1M",
     "b1010000 v151643/152064 l48 e5120 h40/8/128 i13824/- x0/0 r128@10000000 eps1e-05 "
     "RMSNorm LLaMAMLP p0b0a1q0 w-"},
    {"QwQ-32B", "Qwen/QwQ-32B",
     "b131072 v151643/152064 l64 e5120 h40/8/128 i27648/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"QwQ-32B-Preview", "Qwen/QwQ-32B-Preview",
     "b32768 v151643/152064 l64 e5120 h40/8/128 i27648/- x0/0 r128@1000000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a1q0 w-"},
    {"Qwen3-0.6B", "Qwen/Qwen3-0.6B",
     "b40960 v151643/151936 l28 e1024 h16/8/128 i3072/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q1 w-"},
    {"Qwen3-0.6B-Base", "Qwen/Qwen3-0.6B-Base",
     "b40960 v151643/151936 l28 e1024 h16/8/128 i3072/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q1 w-"},
    {"Qwen3-1.7B", "Qwen/Qwen3-1.7B",
     "b40960 v151643/151936 l28 e2048 h16/8/128 i6144/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q1 w-"},
    {"Qwen3-1.7B-Base", "Qwen/Qwen3-1.7B-Base",
     "b40960 v151643/151936 l28 e2048 h16/8/128 i6144/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q1 w-"},
    {"Qwen3-4B", "Qwen/Qwen3-4B",
     "b40960 v151643/151936 l36 e2560 h32/8/128 i9728/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q1 w-"},
    {"Qwen3-4B-Base", "Qwen/Qwen3-4B-Base",
     "b40960 v151643/151936 l36 e2560 h32/8/128 i9728/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q1 w-"},
    {"Qwen3-8B", "Qwen/Qwen3-8B",
     "b40960 v151643/151936 l36 e4096 h32/8/128 i12288/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q1 w-"},
    {"Qwen3-8B-Base", "Qwen/Qwen3-8B-Base",
     "b40960 v151643/151936 l36 e4096 h32/8/128 i12288/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q1 w-"},
    {"Qwen3-14B", "Qwen/Qwen3-14B",
     "b40960 v151643/151936 l40 e5120 h40/8/128 i17408/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q1 w-"},
    {"Qwen3-14B-Base", "Qwen/Qwen3-14B-Base",
     "b40960 v151643/151936 l40 e5120 h40/8/128 i17408/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q1 w-"},
    {"Qwen3-32B", "Qwen/Qwen3-32B",
     "b40960 v151643/151936 l64 e5120 h64/8/128 i25600/- x0/0 r128@1000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q1 w-"},
    {"Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B",
     "b40960 v151643/151936 l48 e2048 h32/4/128 i6144/768 x128/8 r128@1000000 eps1e-06 "
     "RMSNorm LLaMAMoE p0b0a0q1 w-"},
    {"Qwen3-30B-A3B-Base", "Qwen/Qwen3-30B-A3B-Base",
     "b40960 v151643/151936 l48 e2048 h32/4/128 i6144/768 x128/8 r128@1000000 eps1e-06 "
     "RMSNorm LLaMAMoE p0b0a0q1 w-"},
    {"Qwen3-235B-A22B", "Qwen/Qwen3-235B-A22B",
     "b40960 v151643/151936 l94 e4096 h64/4/128 i12288/1536 x128/8 r128@1000000 eps1e-06 "
     "RMSNorm LLaMAMoE p0b0a0q1 w-"},
    {"Qwen3-235B-A22B-Thinking-2507", "Qwen/Qwen3-235B-A22B-Thinking-2507",
     "b262144 v151643/151936 l94 e4096 h64/4/128 i12288/1536 x128/8 r128@5000000 eps1e-06 "
     "RMSNorm LLaMAMoE p0b0a0q1 w-"},
    {"Qwen3-235B-A22B-Instruct-2507", "Qwen/Qwen3-235B-A22B-Instruct-2507",
     "b262144 v151643/151936 l94 e4096 h64/4/128 i12288/1536 x128/8 r128@5000000 eps1e-06 "
     "RMSNorm LLaMAMoE p0b0a0q1 w-"},
    {"Qwen3-30B-A3B-Thinking-2507", "Qwen/Qwen3-30B-A3B-Thinking-2507",
     "b262144 v151643/151936 l48 e2048 h32/4/128 i6144/768 x128/8 r128@10000000 eps1e-06 "
     "RMSNorm LLaMAMoE p0b0a0q1 w-"},
    {"Qwen3-30B-A3B-Instruct-2507", "Qwen/Qwen3-30B-A3B-Instruct-2507",
     "b262144 v151643/151936 l48 e2048 h32/4/128 i6144/768 x128/8 r128@10000000 eps1e-06 "
     "RMSNorm LLaMAMoE p0b0a0q1 w-"},
    {"Qwen3-4B-Thinking-2507", "Qwen/Qwen3-4B-Thinking-2507",
     "b262144 v151643/151936 l36 e2560 h32/8/128 i9728/- x0/0 r128@5000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q1 w-"},
    {"Qwen3-4B-Instruct-2507", "Qwen/Qwen3-4B-Instruct-2507",
     "b262144 v151643/151936 l36 e2560 h32/8/128 i9728/- x0/0 r128@5000000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q1 w-"},
    {"salamandra-2b", "BSC-LT/salamandra-2b",
     "b8192 v256000/256000 l24 e2048 h16/16/128 i5440/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"salamandra-2b-instruct", "BSC-LT/salamandra-2b-instruct",
     "b8192 v256000/256000 l24 e2048 h16/16/128 i5440/- x0/0 r128@10000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"salamandra-7b", "BSC-LT/salamandra-7b",
     "b8192 v256000/256000 l32 e4096 h32/8/128 i11008/- x0/0 r128@10000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"salamandra-7b-instruct", "BSC-LT/salamandra-7b-instruct",
     "b8192 v256000/256000 l32 e4096 h32/8/128 i11008/- x0/0 r128@10000 eps1e-06 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"SmolLM2-135M", "HuggingFaceTB/SmolLM2-135M",
     "b8192 v49152/49152 l30 e576 h9/3/64 i1536/- x0/0 r64@100000 eps1e-05 RMSNorm LLaMAMLP "
     "p0b0a0q0 w-"},
    {"SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct",
     "b8192 v49152/49152 l30 e576 h9/3/64 i1536/- x0/0 r64@100000 eps1e-05 RMSNorm LLaMAMLP "
     "p0b0a0q0 w-"},
    {"SmolLM2-360M", "HuggingFaceTB/SmolLM2-360M",
     "b8192 v49152/49152 l32 e960 h15/5/64 i2560/- x0/0 r64@100000 eps1e-05 RMSNorm LLaMAMLP "
     "p0b0a0q0 w-"},
    {"SmolLM2-360M-Instruct", "HuggingFaceTB/SmolLM2-360M-Instruct",
     "b8192 v49152/49152 l32 e960 h15/5/64 i2560/- x0/0 r64@100000 eps1e-05 RMSNorm LLaMAMLP "
     "p0b0a0q0 w-"},
    {"SmolLM2-1.7B", "HuggingFaceTB/SmolLM2-1.7B",
     "b8192 v49152/49152 l24 e2048 h32/32/64 i8192/- x0/0 r64@130000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"SmolLM2-1.7B-Instruct", "HuggingFaceTB/SmolLM2-1.7B-Instruct",
     "b8192 v49152/49152 l24 e2048 h32/32/64 i8192/- x0/0 r64@130000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"R1-Distill-Llama-8B", "deepseek-ai/DeepSeek-R1-Distill-Llama-8B",
     "b131072 v128000/128256 l32 e4096 h32/8/128 i14336/- x0/0 r128@500000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
    {"R1-Distill-Llama-70B", "deepseek-ai/DeepSeek-R1-Distill-Llama-70B",
     "b131072 v128000/128256 l80 e8192 h64/8/128 i28672/- x0/0 r128@500000 eps1e-05 RMSNorm "
     "LLaMAMLP p0b0a0q0 w-"},
};

TEST(ConfigPresetsTest, NamesAndSummariesMatchLitGpt) {
  const std::vector<std::string>& names = PresetNames();
  ASSERT_EQ(names.size(), std::size(kExpected));
  for (size_t i = 0; i < names.size(); ++i) {
    SCOPED_TRACE(kExpected[i].name);
    EXPECT_EQ(names[i], kExpected[i].name);
    absl::StatusOr<Config> config = ConfigFromName(kExpected[i].name);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->name, kExpected[i].name);
    EXPECT_EQ(absl::StrCat(config->hf_org, "/", config->hf_name), kExpected[i].hf);
    EXPECT_EQ(Summary(*config), kExpected[i].summary);
  }
}

TEST(ConfigPresetsTest, NamesAreUnique) {
  const std::vector<std::string>& names = PresetNames();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size());
}

TEST(ConfigPresetsTest, EveryPresetRoundTripsThroughYaml) {
  for (const std::string& name : PresetNames()) {
    SCOPED_TRACE(name);
    absl::StatusOr<Config> config = ConfigFromName(name);
    ASSERT_TRUE(config.ok()) << config.status();
    const std::string yaml = ConfigToYaml(*config);
    absl::StatusOr<Config> back = ConfigFromYaml(yaml, name);
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << yaml;
    EXPECT_TRUE(*back == *config) << yaml;
    EXPECT_EQ(ConfigToYaml(*back), yaml);
    // The base LitGPT Config rejects PEFT keys.
    EXPECT_FALSE(absl::StrContains(yaml, "lora_")) << yaml;
    EXPECT_FALSE(absl::StrContains(yaml, "adapter_")) << yaml;
  }
}

TEST(ConfigPresetsTest, Llama32_1B) {
  absl::StatusOr<Config> c = ConfigFromName("Llama-3.2-1B");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hf_org, "meta-llama");
  EXPECT_EQ(c->hf_name, "Llama-3.2-1B");
  EXPECT_EQ(c->block_size, 131072);
  EXPECT_EQ(c->n_layer, 16);
  EXPECT_EQ(c->n_embd, 2048);
  EXPECT_EQ(c->n_head, 32);
  EXPECT_EQ(c->QueryGroups(), 8);
  EXPECT_EQ(c->HeadSize(), 64);
  EXPECT_EQ(c->IntermediateSize(), 8192);
  EXPECT_EQ(c->vocab_size, 128000);
  EXPECT_EQ(c->PaddedVocabSize(), 128256);
  EXPECT_EQ(c->rope_base, 500000);
  EXPECT_EQ(c->rope_n_elem, 64);
  EXPECT_EQ(c->norm_class, NormClass::kRMSNorm);
  EXPECT_EQ(c->mlp_class, MlpClass::kLLaMAMLP);
  EXPECT_FALSE(c->parallel_residual);
  EXPECT_FALSE(c->bias);
  ASSERT_TRUE(c->rope_adjustments.has_value());
  EXPECT_TRUE(c->rope_adjustments->IsLlama3());
  EXPECT_FALSE(c->rope_adjustments->IsYarn());
  EXPECT_EQ(c->rope_adjustments->factor, 32.0);
  EXPECT_EQ(c->rope_adjustments->low_freq_factor, 1.0);
  EXPECT_EQ(c->rope_adjustments->high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_adjustments->original_max_seq_len, 8192.0);
  EXPECT_FALSE(c->NormUnitOffset());
  EXPECT_DOUBLE_EQ(c->AttentionScale(), 1.0 / 8.0);

  absl::StatusOr<Config> instruct = ConfigFromName("Llama-3.2-1B-Instruct");
  ASSERT_TRUE(instruct.ok()) << instruct.status();
  EXPECT_EQ(instruct->hf_name, "Llama-3.2-1B-Instruct");
}

TEST(ConfigPresetsTest, Gemma2_9b) {
  absl::StatusOr<Config> c = ConfigFromName("Gemma-2-9b");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hf_name, "gemma-2-9b");
  EXPECT_EQ(c->n_layer, 42);
  EXPECT_EQ(c->n_embd, 3584);
  EXPECT_EQ(c->n_head, 16);
  EXPECT_EQ(c->QueryGroups(), 8);
  EXPECT_EQ(c->HeadSize(), 256);
  EXPECT_EQ(c->IntermediateSize(), 14336);
  EXPECT_EQ(c->mlp_class, MlpClass::kGemmaMLP);
  EXPECT_EQ(c->gelu_approximate, "tanh");
  EXPECT_TRUE(c->scale_embeddings);
  EXPECT_TRUE(c->post_attention_norm);
  EXPECT_TRUE(c->post_mlp_norm);
  EXPECT_EQ(c->attention_logit_softcapping, 50.0);
  EXPECT_EQ(c->final_logit_softcapping, 30.0);
  EXPECT_EQ(c->attention_scores_scalar, 256.0);
  EXPECT_EQ(c->sliding_window_size, 4096);
  ASSERT_TRUE(c->sliding_window_indices.has_value());
  ASSERT_EQ(c->sliding_window_indices->size(), 42u);
  for (int layer = 0; layer < 42; ++layer) {
    EXPECT_EQ((*c->sliding_window_indices)[layer], layer % 2 == 0 ? 1 : 0) << layer;
    EXPECT_EQ(c->IsSlidingWindowLayer(layer), layer % 2 == 0) << layer;
  }
  EXPECT_TRUE(c->NormUnitOffset());
  EXPECT_TRUE(c->NormHasAffine());
  EXPECT_FALSE(c->UsesLocalRope(0));
  EXPECT_DOUBLE_EQ(c->AttentionScale(), 1.0 / 16.0);

  absl::StatusOr<Config> it = ConfigFromName("Gemma-2-9b-it");
  ASSERT_TRUE(it.ok()) << it.status();
  EXPECT_EQ(it->hf_name, "gemma-2-9b-it");
}

TEST(ConfigPresetsTest, Gemma2_27bScalesScoresByItsOwnScalar) {
  absl::StatusOr<Config> c = ConfigFromName("Gemma-2-27b");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->HeadSize(), 128);
  EXPECT_DOUBLE_EQ(c->AttentionScale(), 1.0 / 12.0);
}

TEST(ConfigPresetsTest, Gemma3_27bIt) {
  absl::StatusOr<Config> c = ConfigFromName("Gemma-3-27b-it");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_layer, 62);
  EXPECT_EQ(c->sliding_window_size, 1024);
  EXPECT_EQ(c->rope_local_base_freq, 10000.0);
  EXPECT_EQ(c->rope_base, 1000000);
  EXPECT_TRUE(c->norm_qk);
  ASSERT_TRUE(c->rope_adjustments.has_value());
  EXPECT_EQ(c->rope_adjustments->factor, 8.0);
  EXPECT_FALSE(c->rope_adjustments->IsLlama3());
  EXPECT_FALSE(c->rope_adjustments->IsYarn());
  for (int layer = 0; layer < 62; ++layer) {
    const bool global = (layer + 1) % 6 == 0;
    EXPECT_EQ(c->IsSlidingWindowLayer(layer), !global) << layer;
    EXPECT_EQ(c->UsesLocalRope(layer), !global) << layer;
  }
  absl::StatusOr<Config> small = ConfigFromName("Gemma-3-1b-it");
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_FALSE(small->rope_adjustments.has_value());
}

TEST(ConfigPresetsTest, Pythia14m) {
  absl::StatusOr<Config> c = ConfigFromName("pythia-14m");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hf_org, "EleutherAI");
  EXPECT_EQ(c->block_size, 512);
  EXPECT_EQ(c->n_layer, 6);
  EXPECT_EQ(c->n_embd, 128);
  EXPECT_EQ(c->n_head, 4);
  EXPECT_EQ(c->HeadSize(), 32);
  EXPECT_EQ(c->rope_n_elem, 8);
  EXPECT_EQ(c->vocab_size, 50254);
  EXPECT_EQ(c->PaddedVocabSize(), 50304);
  EXPECT_EQ(c->IntermediateSize(), 512);
  EXPECT_EQ(c->norm_class, NormClass::kLayerNorm);
  EXPECT_EQ(c->mlp_class, MlpClass::kGptNeoxMLP);
  EXPECT_TRUE(c->parallel_residual);
  EXPECT_TRUE(c->bias);
  EXPECT_TRUE(c->NormHasAffine());
  // The two smallest Pythias have no deduped twin; the others do.
  EXPECT_EQ(ConfigFromName("pythia-14m-deduped").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(ConfigFromName("pythia-70m-deduped").ok());
  EXPECT_TRUE(ConfigFromName("pythia-12b-deduped").ok());
}

TEST(ConfigPresetsTest, Mixtral8x7B) {
  absl::StatusOr<Config> c = ConfigFromName("Mixtral-8x7B-v0.1");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mlp_class, MlpClass::kLLaMAMoE);
  EXPECT_EQ(c->n_expert, 8);
  EXPECT_EQ(c->n_expert_per_token, 2);
  EXPECT_EQ(c->IntermediateSize(), 14336);
  EXPECT_FALSE(c->moe_intermediate_size.has_value());
  EXPECT_EQ(c->QueryGroups(), 8);
  EXPECT_EQ(c->rope_base, 1000000);
  EXPECT_EQ(c->block_size, 32768);
  EXPECT_EQ(c->PaddedVocabSize(), 32000);
  EXPECT_TRUE(ConfigFromName("Mixtral-8x7B-Instruct-v0.1").ok());
  EXPECT_TRUE(ConfigFromName("Mixtral-8x22B-Instruct-v0.1").ok());
}

TEST(ConfigPresetsTest, Qwen3) {
  absl::StatusOr<Config> c = ConfigFromName("Qwen3-0.6B");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->norm_qk);
  EXPECT_EQ(c->norm_qk_type, NormQkType::kDefault);
  // head_size is set explicitly: 1024 / 16 would be 64.
  EXPECT_EQ(c->HeadSize(), 128);
  EXPECT_EQ(c->rope_n_elem, 128);
  EXPECT_EQ(c->QueryGroups(), 8);
  EXPECT_EQ(c->norm_eps, 1e-6);
  EXPECT_FALSE(c->attn_bias);
  EXPECT_TRUE(ConfigFromName("Qwen3-0.6B-Base").ok());

  absl::StatusOr<Config> moe = ConfigFromName("Qwen3-30B-A3B");
  ASSERT_TRUE(moe.ok()) << moe.status();
  EXPECT_EQ(moe->mlp_class, MlpClass::kLLaMAMoE);
  EXPECT_EQ(moe->n_expert, 128);
  EXPECT_EQ(moe->n_expert_per_token, 8);
  EXPECT_EQ(moe->moe_intermediate_size, 768);
  EXPECT_TRUE(ConfigFromName("Qwen3-30B-A3B-Instruct-2507").ok());

  absl::StatusOr<Config> qwen25 = ConfigFromName("Qwen2.5-0.5B-Instruct");
  ASSERT_TRUE(qwen25.ok()) << qwen25.status();
  EXPECT_TRUE(qwen25->attn_bias);
  EXPECT_FALSE(qwen25->bias);
}

TEST(ConfigPresetsTest, Olmo2) {
  absl::StatusOr<Config> c = ConfigFromName("OLMo-2-1124-7B");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->norm_qk);
  EXPECT_EQ(c->norm_qk_type, NormQkType::kOlmo2);
  EXPECT_FALSE(c->norm_1);
  EXPECT_FALSE(c->norm_2);
  EXPECT_TRUE(c->post_attention_norm);
  EXPECT_TRUE(c->post_mlp_norm);
  EXPECT_EQ(c->norm_class, NormClass::kRMSNorm);
  EXPECT_TRUE(c->NormHasAffine());
  for (const char* stage : {"-SFT", "-DPO", "-Instruct"}) {
    EXPECT_TRUE(ConfigFromName(absl::StrCat("OLMo-2-1124-13B", stage)).ok()) << stage;
  }
  // OLMo 1 uses LayerNorm without affine parameters.
  absl::StatusOr<Config> olmo1 = ConfigFromName("OLMo-1B-hf");
  ASSERT_TRUE(olmo1.ok()) << olmo1.status();
  EXPECT_FALSE(olmo1->NormHasAffine());
}

TEST(ConfigPresetsTest, FalconAndPhi) {
  absl::StatusOr<Config> falcon = ConfigFromName("falcon-7b-instruct");
  ASSERT_TRUE(falcon.ok()) << falcon.status();
  EXPECT_EQ(falcon->n_head, 71);
  EXPECT_EQ(falcon->HeadSize(), 64);
  EXPECT_EQ(falcon->QueryGroups(), 1);
  EXPECT_TRUE(falcon->shared_attention_norm);
  EXPECT_TRUE(falcon->parallel_residual);
  EXPECT_TRUE(ConfigFromName("falcon-180B-chat").ok());
  EXPECT_TRUE(ConfigFromName("Falcon3-10B-Instruct").ok());

  absl::StatusOr<Config> phi2 = ConfigFromName("phi-2");
  ASSERT_TRUE(phi2.ok()) << phi2.status();
  EXPECT_EQ(phi2->HeadSize(), 80);
  EXPECT_EQ(phi2->rope_n_elem, 32);  // int(0.4 * 80)
  EXPECT_TRUE(phi2->lm_head_bias);
  EXPECT_EQ(phi2->gelu_approximate, "tanh");
  EXPECT_EQ(phi2->PaddedVocabSize(), 51200);
  EXPECT_EQ(phi2->vocab_size, 50257);

  absl::StatusOr<Config> phi3 = ConfigFromName("Phi-3-mini-4k-instruct");
  ASSERT_TRUE(phi3.ok()) << phi3.status();
  EXPECT_EQ(phi3->sliding_window_size, 2048);
  EXPECT_TRUE(phi3->IsSlidingWindowLayer(31));
}

TEST(ConfigPresetsTest, VocabularyIsCappedByPaddedSize) {
  // Platypus-30B sets only padded_vocab_size; LitGPT then caps the default vocab_size.
  absl::StatusOr<Config> c = ConfigFromName("Platypus-30B");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab_size, 32000);
  EXPECT_EQ(c->PaddedVocabSize(), 32000);
  absl::StatusOr<Config> code = ConfigFromName("CodeLlama-70b-Instruct-hf");
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(code->vocab_size, 32015);
  EXPECT_EQ(code->PaddedVocabSize(), 32016);
}

TEST(ConfigPresetsTest, TinyLlamaNamesDifferFromHuggingFace) {
  absl::StatusOr<Config> c = ConfigFromName("tiny-llama-1.1b-chat");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hf_org, "TinyLlama");
  EXPECT_EQ(c->hf_name, "TinyLlama-1.1B-Chat-v1.0");
  absl::StatusOr<Config> base = ConfigFromName("TinyLlama-1.1B-intermediate-step-1431k-3T");
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_EQ(base->name, "tiny-llama-1.1b");
}

TEST(ConfigPresetsTest, LooksUpHuggingFaceNames) {
  absl::StatusOr<Config> bare = ConfigFromName("Meta-Llama-3-8B-Instruct");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(bare->name, "Llama-3-8B-Instruct");
  absl::StatusOr<Config> with_org = ConfigFromName("meta-llama/Meta-Llama-3.1-8B");
  ASSERT_TRUE(with_org.ok()) << with_org.status();
  EXPECT_EQ(with_org->name, "Llama-3.1-8B");
  absl::StatusOr<Config> mistral = ConfigFromName("unsloth/Mistral-7B-v0.2");
  ASSERT_TRUE(mistral.ok()) << mistral.status();
  EXPECT_EQ(mistral->name, "Mistral-7B-v0.2");
}

TEST(ConfigPresetsTest, UnknownNameIsNotFoundWithSuggestions) {
  absl::StatusOr<Config> c = ConfigFromName("Llama-3.2-1b");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(c.status().message(), "'Llama-3.2-1b'")) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "Llama-3.2-1B")) << c.status();

  absl::StatusOr<Config> nonsense = ConfigFromName("zzzzzzzzzzzzzzzzzzzzzz");
  EXPECT_EQ(nonsense.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ConfigFromName("").status().code(), absl::StatusCode::kNotFound);
}

TEST(ConfigPresetsTest, PresetFromNameAllowsOverridesBeforeFinalize) {
  absl::StatusOr<Config> c = PresetFromName("pythia-14m");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->head_size.has_value());  // Not finalised yet.
  c->n_layer = 2;
  c->n_embd = 64;
  ASSERT_TRUE(c->Finalize().ok());
  EXPECT_EQ(c->HeadSize(), 16);
  EXPECT_EQ(c->IntermediateSize(), 256);
}

}  // namespace
}  // namespace lgpt
