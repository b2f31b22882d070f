// Model configuration: every field of LitGPT's `Config`, with its defaults and derived
// values, read from and written to LitGPT's `model_config.yaml`. Model families are data
// (named presets in config_presets.h), never subclasses.
#ifndef LGPT_CORE_CONFIG_CONFIG_H_
#define LGPT_CORE_CONFIG_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lgpt {

enum class NormClass { kLayerNorm, kRMSNorm };
enum class NormQkType { kDefault, kOlmo2 };
enum class MlpClass { kGptNeoxMLP, kLLaMAMLP, kGemmaMLP, kLLaMAMoE };

// LitGPT's `rope_adjustments` dict. Which keys are present selects the variant:
// Llama 3 (factor, low/high_freq_factor, original_max_seq_len), YaRN (factor, beta_fast,
// beta_slow, original_max_seq_len, optional mscale/mscale_all_dim/truncate) or linear
// (factor alone).
struct RopeAdjustments {
  std::optional<double> factor;
  std::optional<double> low_freq_factor;
  std::optional<double> high_freq_factor;
  std::optional<double> original_max_seq_len;
  std::optional<double> beta_fast;
  std::optional<double> beta_slow;
  std::optional<double> mscale;
  std::optional<double> mscale_all_dim;
  std::optional<bool> truncate;

  bool IsLlama3() const { return low_freq_factor || high_freq_factor; }
  bool IsYarn() const { return beta_fast || beta_slow; }
};

struct Config {
  std::string name;
  // LitGPT's hf_config dict ({org, name}); kept for round trips.
  std::string hf_org;
  std::string hf_name;

  // General size parameters.
  int64_t block_size = 4096;
  int64_t n_layer = 16;
  int64_t n_embd = 4096;
  int64_t vocab_size = 50254;
  int64_t padding_multiple = 512;
  std::optional<int64_t> padded_vocab_size;  // Derived by Finalize() when unset.

  // Transformer block structure and normalisations.
  NormClass norm_class = NormClass::kLayerNorm;
  double norm_eps = 1e-5;
  bool norm_qk = false;
  NormQkType norm_qk_type = NormQkType::kDefault;
  bool post_attention_norm = false;
  bool post_mlp_norm = false;
  bool parallel_residual = true;
  bool shared_attention_norm = false;

  // Self-attention.
  int64_t n_head = 32;
  std::optional<int64_t> head_size;       // Derived: n_embd / n_head.
  std::optional<int64_t> n_query_groups;  // Derived: n_head (MHA).
  bool attn_bias = false;
  std::optional<double> attention_scores_scalar;
  std::optional<int64_t> sliding_window_size;
  std::optional<std::vector<int>> sliding_window_indices;  // Derived: all 1 when windowed.
  std::optional<double> attention_logit_softcapping;

  // Rotary position embedding.
  double rope_base = 10000;
  double rotary_percentage = 0.25;
  int64_t rope_condense_ratio = 1;
  std::optional<RopeAdjustments> rope_adjustments;
  bool rope_interleave = false;
  std::optional<double> rope_local_base_freq;
  std::optional<std::vector<int>> rope_indices;  // Derived: all 1 when local base is set.

  // MLP and mixture of experts.
  std::optional<int64_t> intermediate_size;  // Derived: 4 * n_embd (not for LLaMAMLP).
  std::optional<int64_t> moe_intermediate_size;
  bool bias = true;
  MlpClass mlp_class = MlpClass::kGptNeoxMLP;
  std::string gelu_approximate = "none";  // "none" or "tanh".
  int64_t n_expert = 0;
  std::optional<int64_t> n_shared_expert;
  std::optional<int64_t> n_expert_groups;
  std::optional<int64_t> n_topk_groups;
  std::optional<int64_t> n_topk_scores_per_group;
  int64_t n_expert_per_token = 0;
  std::optional<int64_t> first_k_dense_replace;
  double routed_scaling_factor = 1.0;
  bool norm_topk_prob = false;

  // Before and after the blocks.
  bool scale_embeddings = false;
  bool lm_head_bias = false;
  std::optional<double> final_logit_softcapping;
  bool norm_1 = true;
  bool norm_2 = true;
  // Multi-head latent attention (DeepSeek V3) is read but not supported by the model.
  bool has_latent_attention = false;

  // PEFT fields of LitGPT's lora.Config / adapter.Config, so their yaml files load. The
  // base model ignores them; peft/ reads them.
  int64_t lora_r = 0;
  double lora_alpha = 1;
  double lora_dropout = 0;
  bool lora_query = false;
  bool lora_key = false;
  bool lora_value = false;
  bool lora_projection = false;
  bool lora_mlp = false;
  bool lora_head = false;
  std::optional<int64_t> adapter_prompt_length;
  std::optional<int64_t> adapter_start_layer;

  // ---- Derived values, valid after Finalize() ----
  int64_t rope_n_elem = 0;  // int(rotary_percentage * head_size)

  // Fills the derived fields exactly as LitGPT's Config.__post_init__ does and validates
  // every value. Errors name the offending key.
  absl::Status Finalize();

  // Accessors for finalised configs.
  int64_t HeadSize() const { return *head_size; }
  int64_t QueryGroups() const { return *n_query_groups; }
  int64_t PaddedVocabSize() const { return *padded_vocab_size; }
  int64_t IntermediateSize() const { return *intermediate_size; }
  // Gemma's RMSNorm scales by (1 + weight).
  bool NormUnitOffset() const;
  // OLMo (1) uses LayerNorm without affine parameters.
  bool NormHasAffine() const;
  bool IsSlidingWindowLayer(int64_t layer) const;
  bool UsesLocalRope(int64_t layer) const;
  // Softmax scale of attention: 1/sqrt(attention_scores_scalar or head_size), times YaRN's
  // mscale squared.
  double AttentionScale() const;

 private:
  // Finalize's steps, in order.
  absl::Status FinalizeSizes();  // layers, widths, head_size, vocabulary, query groups, MLP
  absl::Status FinalizeRope();   // rotary dims, bases, norms' eps, windows, local RoPE
  absl::Status CheckAttentionAndBlock();  // scaling, soft-capping, GELU, residual layout
  absl::Status CheckExperts();            // mixture of experts and expert groups
  absl::Status CheckPeft();               // LoRA and adapter fields
};

// Parses LitGPT's model_config.yaml text; `source` names the file in errors.
absl::StatusOr<Config> ConfigFromYaml(absl::string_view yaml_text, absl::string_view source);
absl::StatusOr<Config> LoadConfigFile(const std::string& path);
// Emits yaml that LitGPT's Config (and ConfigFromYaml) accept.
std::string ConfigToYaml(const Config& config);

// Field-by-field equality (every member, derived ones included; doubles compared exactly).
bool operator==(const RopeAdjustments& a, const RopeAdjustments& b);
inline bool operator!=(const RopeAdjustments& a, const RopeAdjustments& b) { return !(a == b); }
bool operator==(const Config& a, const Config& b);
inline bool operator!=(const Config& a, const Config& b) { return !(a == b); }

// Name of an enum value as LitGPT spells it.
absl::string_view NormClassName(NormClass c);
absl::string_view MlpClassName(MlpClass c);

}  // namespace lgpt

#endif  // LGPT_CORE_CONFIG_CONFIG_H_
