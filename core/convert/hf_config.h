// Hugging Face config.json <-> LitGPT Config, for the architectures lgpt converts.
//
// Reading derives the whole Config from config.json, as Transformers' config class of the
// architecture reads it: the keys it states, the class defaults for the keys it leaves out.
// A LitGPT preset is optional: it only fills what config.json does not state (LitGPT's
// tokenizer vocabulary, the model's name); every field config.json states wins, and the
// fields where it changed the preset are reported. Keys that change the computation in a way
// lgpt cannot reproduce (an unknown rope_scaling type, attention_bias without mlp_bias on a
// Llama, qk_layernorm on Phi, a quantization_config, ...) are errors naming the key, never
// silently dropped; keys that change nothing lgpt computes are ignored.
#ifndef LGPT_CORE_CONVERT_HF_CONFIG_H_
#define LGPT_CORE_CONVERT_HF_CONFIG_H_

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/config/config.h"

namespace lgpt {

enum class HfFamily {
  kLlama,     // LlamaForCausalLM, MistralForCausalLM: q/k/v_proj, gate/up/down_proj.
  kMixtral,   // MixtralForCausalLM: block_sparse_moe.experts.{e}.w1/w3/w2.
  kGemma,     // GemmaForCausalLM: Llama names, tied embeddings.
  kGemma2,    // Gemma2ForCausalLM: pre/post feed-forward norms.
  kGemma3,    // Gemma3ForCausalLM (text only): Gemma 2 names plus q/k norms.
  kQwen2,     // Qwen2ForCausalLM: Llama names with q/k/v biases.
  kQwen3,     // Qwen3ForCausalLM / Qwen3MoeForCausalLM: q/k norms; mlp.experts.{e}.*_proj.
  kOlmo2,     // Olmo2ForCausalLM: post-attention/feed-forward norms only, q/k norms.
  kPhi,       // PhiForCausalLM (phi-1.5, phi-2): dense, fc1/fc2, final_layernorm, biases.
  kPhi3,      // Phi3ForCausalLM (Phi-3, Phi-4): fused qkv_proj and gate_up_proj.
  kGptNeoX,   // GPTNeoXForCausalLM (Pythia): interleaved query_key_value.
  kFalcon,    // FalconForCausalLM (falcon-7b/40b/180B): interleaved query_key_value.
  kStableLm,  // StableLmForCausalLM (stablelm-3b-4e1t): Llama names, LayerNorm with biases.
};

// The family of a LitGPT config, from its structure (norms, MLP, biases, extra norms); the
// name only tells Phi-3/Phi-4 (fused projections) from the Llama layout they share.
// Unimplemented for configs no converter handles.
absl::StatusOr<HfFamily> HfFamilyOf(const Config& config);

// The family of a Hugging Face `architectures[0]`; nullopt for architectures lgpt lacks.
std::optional<HfFamily> HfFamilyOfArchitecture(absl::string_view architecture);

// The Hugging Face `architectures[0]` and `model_type` of a config's family.
std::string HfArchitecture(const Config& config, HfFamily family);
std::string HfModelType(const Config& config, HfFamily family);

// Falcon 40b/180B's layout (ln_attn and ln_mlp per block) rather than falcon-7b's single
// input_layernorm shared by attention and MLP.
bool FalconNewDecoderArchitecture(const Config& config);

struct HfConfig {
  Config config;  // finalised
  HfFamily family = HfFamily::kLlama;
  // The preset that filled what config.json leaves out; empty when none was used.
  std::string preset;
  // Fields where config.json changed the preset: "rope_adjustments: {factor: 8} (preset
  // Llama-3.2-1B: {factor: 32, ...})".
  std::vector<std::string> overridden;
  // What a user should know, e.g. a rope_scaling that changes nothing within the context.
  std::vector<std::string> notes;
};

// The config of a Hugging Face checkpoint directory. With `model_config` (a LitGPT
// model_config.yaml) that config is used as it is. Otherwise it is derived from config.json;
// the preset named `model_name` (or, without one, the preset named like config.json's
// `_name_or_path` or the directory, when its architecture matches) fills only the fields
// config.json does not state. A multimodal config's text_config holds the text model; with
// a preset its vocabulary (which counts image tokens) is cut to the preset's, as LitGPT does.
// Errors: NotFound for a missing config.json or an unknown `model_name`; InvalidArgument for
// malformed JSON, mistyped keys or sizes that make no valid config, naming the key;
// Unimplemented for an unknown architecture or a key whose value lgpt cannot compute.
absl::StatusOr<HfConfig> ReadHfConfig(const std::string& hf_dir, const std::string& model_name = "",
                                      const std::string& model_config = "");

// ReadHfConfig(...).config.
absl::StatusOr<Config> ConfigFromHfDir(const std::string& hf_dir, const std::string& model_name,
                                       const std::string& model_config = "");

// config.json text for `config` (as Transformers' config of its family would hold it), such
// that ReadHfConfig derives the same computation from it without a preset.
std::string HfConfigJson(const Config& config, HfFamily family, bool tie_word_embeddings,
                         c10::ScalarType dtype);

}  // namespace lgpt

#endif  // LGPT_CORE_CONVERT_HF_CONFIG_H_
