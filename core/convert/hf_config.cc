#include "core/convert/hf_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "core/base/file_util.h"
#include "core/base/status_macros.h"
#include "core/config/config_presets.h"

namespace lgpt {
namespace {

using json = nlohmann::json;

bool StartsWithLower(absl::string_view name, absl::string_view prefix) {
  return absl::StartsWith(absl::AsciiStrToLower(name), prefix);
}

absl::Status Invalid(const std::string& source, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
}

// config.json is a few levels deep. nlohmann::json copies values recursively, so a file nested
// 100,000 deep parsed fine and then overflowed the stack when copied (convert_hf crashed).
constexpr int kMaxConfigJsonDepth = 64;

// config.json parsed, refusing nesting beyond kMaxConfigJsonDepth (whose values the parser
// then discards, so nothing deep is ever built).
absl::StatusOr<json> ParseConfigJson(const std::string& text, const std::string& path) {
  bool too_deep = false;
  json j = json::parse(
      text,
      [&too_deep](int depth, json::parse_event_t, json&) {
        if (depth > kMaxConfigJsonDepth) too_deep = true;
        return !too_deep;
      },
      /*allow_exceptions=*/false);
  if (too_deep) {
    return Invalid(path, absl::StrCat("JSON nested more than ", kMaxConfigJsonDepth, " deep"));
  }
  if (j.is_discarded() || !j.is_object()) return Invalid(path, "not a JSON object");
  return j;
}

absl::Status Unsupported(const std::string& source, const std::string& what) {
  return absl::UnimplementedError(absl::StrCat(source, ": ", what));
}

const std::vector<std::pair<std::string, HfFamily>>& KnownArchitectures() {
  static const auto* const known = new std::vector<std::pair<std::string, HfFamily>>{
      {"LlamaForCausalLM", HfFamily::kLlama},
      {"MistralForCausalLM", HfFamily::kLlama},
      {"MixtralForCausalLM", HfFamily::kMixtral},
      {"GemmaForCausalLM", HfFamily::kGemma},
      {"Gemma2ForCausalLM", HfFamily::kGemma2},
      {"Gemma3ForCausalLM", HfFamily::kGemma3},
      {"Gemma3ForConditionalGeneration", HfFamily::kGemma3},
      {"Qwen2ForCausalLM", HfFamily::kQwen2},
      {"Qwen3ForCausalLM", HfFamily::kQwen3},
      {"Qwen3MoeForCausalLM", HfFamily::kQwen3},
      {"Olmo2ForCausalLM", HfFamily::kOlmo2},
      {"PhiForCausalLM", HfFamily::kPhi},
      {"Phi3ForCausalLM", HfFamily::kPhi3},
      {"GPTNeoXForCausalLM", HfFamily::kGptNeoX},
      {"FalconForCausalLM", HfFamily::kFalcon},
      {"RWForCausalLM", HfFamily::kFalcon},
      {"StableLmForCausalLM", HfFamily::kStableLm},
  };
  return *known;
}

// model_type -> architecture, for config.json files without `architectures`.
std::optional<std::string> ArchitectureOfModelType(const std::string& model_type) {
  static const auto* const known = new std::map<std::string, std::string>{
      {"llama", "LlamaForCausalLM"},      {"mistral", "MistralForCausalLM"},
      {"mixtral", "MixtralForCausalLM"},  {"gemma", "GemmaForCausalLM"},
      {"gemma2", "Gemma2ForCausalLM"},    {"gemma3_text", "Gemma3ForCausalLM"},
      {"gemma3", "Gemma3ForConditionalGeneration"},
      {"qwen2", "Qwen2ForCausalLM"},      {"qwen3", "Qwen3ForCausalLM"},
      {"qwen3_moe", "Qwen3MoeForCausalLM"}, {"olmo2", "Olmo2ForCausalLM"},
      {"phi", "PhiForCausalLM"},          {"phi3", "Phi3ForCausalLM"},
      {"gpt_neox", "GPTNeoXForCausalLM"}, {"falcon", "FalconForCausalLM"},
      {"stablelm", "StableLmForCausalLM"},
  };
  const auto it = known->find(model_type);
  if (it == known->end()) return std::nullopt;
  return it->second;
}

// ---------------------------------------------------------------------------------------
// Reading config.json: typed getters that name the key in errors.

class ConfigJson {
 public:
  ConfigJson(json j, std::string source) : j_(std::move(j)), source_(std::move(source)) {}

  const std::string& source() const { return source_; }
  bool Has(const char* key) const { return j_.contains(key); }
  // The value of the first of `keys` present and not null, or nullptr; `found` names it.
  const json* Find(std::initializer_list<const char*> keys, const char** found = nullptr) const {
    for (const char* key : keys) {
      const auto it = j_.find(key);
      if (it != j_.end() && !it->is_null()) {
        if (found) *found = key;
        return &*it;
      }
    }
    return nullptr;
  }

  // Sizes past 2^31 are hostile, not models (and would overflow shape arithmetic).
  absl::StatusOr<std::optional<int64_t>> Int(std::initializer_list<const char*> keys) const {
    const char* key = nullptr;
    const json* v = Find(keys, &key);
    if (v == nullptr) return std::optional<int64_t>();
    if (!v->is_number_integer() || v->get<int64_t>() < 0 ||
        v->get<int64_t>() > (int64_t{1} << 31)) {
      return Invalid(source_, absl::StrCat("'", key, "' must be an integer from 0 to 2^31"));
    }
    return std::optional<int64_t>(v->get<int64_t>());
  }

  absl::StatusOr<std::optional<double>> Number(std::initializer_list<const char*> keys) const {
    const char* key = nullptr;
    const json* v = Find(keys, &key);
    if (v == nullptr) return std::optional<double>();
    if (!v->is_number() || !std::isfinite(v->get<double>())) {
      return Invalid(source_, absl::StrCat("'", key, "' must be a finite number"));
    }
    return std::optional<double>(v->get<double>());
  }

  absl::StatusOr<std::optional<bool>> Bool(const char* key) const {
    const json* v = Find({key});
    if (v == nullptr) return std::optional<bool>();
    if (!v->is_boolean()) return Invalid(source_, absl::StrCat("'", key, "' must be true or false"));
    return std::optional<bool>(v->get<bool>());
  }

  absl::StatusOr<std::optional<std::string>> String(std::initializer_list<const char*> keys) const {
    const char* key = nullptr;
    const json* v = Find(keys, &key);
    if (v == nullptr) return std::optional<std::string>();
    if (!v->is_string()) return Invalid(source_, absl::StrCat("'", key, "' must be a string"));
    return std::optional<std::string>(v->get<std::string>());
  }

 private:
  json j_;
  std::string source_;
};

// ---------------------------------------------------------------------------------------
// Fields by name, to overlay the ones config.json states onto a preset and say which changed.

std::string Show(int64_t v) { return absl::StrCat(v); }
std::string Show(double v) { return absl::StrCat(v); }
std::string Show(bool v) { return v ? "true" : "false"; }
std::string Show(const std::string& v) { return v; }
std::string Show(NormClass v) { return std::string(NormClassName(v)); }
std::string Show(MlpClass v) { return std::string(MlpClassName(v)); }
std::string Show(NormQkType v) { return v == NormQkType::kOlmo2 ? "olmo2" : "default"; }
std::string Show(const std::vector<int>& v) { return absl::StrCat("[", absl::StrJoin(v, ", "), "]"); }
std::string Show(const RopeAdjustments& r) {
  std::vector<std::string> parts;
  auto add = [&](const char* name, const std::optional<double>& v) {
    if (v) parts.push_back(absl::StrCat(name, ": ", *v));
  };
  add("factor", r.factor);
  add("low_freq_factor", r.low_freq_factor);
  add("high_freq_factor", r.high_freq_factor);
  add("original_max_seq_len", r.original_max_seq_len);
  add("beta_fast", r.beta_fast);
  add("beta_slow", r.beta_slow);
  add("mscale", r.mscale);
  add("mscale_all_dim", r.mscale_all_dim);
  if (r.truncate) parts.push_back(absl::StrCat("truncate: ", Show(*r.truncate)));
  return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
}
template <typename T>
std::string Show(const std::optional<T>& v) {
  return v ? Show(*v) : "none";
}

struct FieldRef {
  const char* name;
  std::function<void(const Config& from, Config& to)> copy;
  std::function<std::string(const Config&)> show;
};

#define LGPT_FIELD(f)                                           \
  FieldRef {                                                    \
#f, [](const Config& from, Config& to) { to.f = from.f; }, \
        [](const Config& c) { return Show(c.f); }               \
  }

// Every field config.json can state.
const std::vector<FieldRef>& ComputeFields() {
  static const auto* const fields = new std::vector<FieldRef>{
      LGPT_FIELD(block_size),
      LGPT_FIELD(n_layer),
      LGPT_FIELD(n_embd),
      LGPT_FIELD(padded_vocab_size),
      LGPT_FIELD(norm_class),
      LGPT_FIELD(norm_eps),
      LGPT_FIELD(norm_qk),
      LGPT_FIELD(norm_qk_type),
      LGPT_FIELD(post_attention_norm),
      LGPT_FIELD(post_mlp_norm),
      LGPT_FIELD(parallel_residual),
      LGPT_FIELD(shared_attention_norm),
      LGPT_FIELD(n_head),
      LGPT_FIELD(head_size),
      LGPT_FIELD(n_query_groups),
      LGPT_FIELD(attn_bias),
      LGPT_FIELD(attention_scores_scalar),
      LGPT_FIELD(sliding_window_size),
      LGPT_FIELD(sliding_window_indices),
      LGPT_FIELD(attention_logit_softcapping),
      LGPT_FIELD(rope_base),
      LGPT_FIELD(rotary_percentage),
      LGPT_FIELD(rope_condense_ratio),
      LGPT_FIELD(rope_adjustments),
      LGPT_FIELD(rope_local_base_freq),
      LGPT_FIELD(rope_indices),
      LGPT_FIELD(intermediate_size),
      LGPT_FIELD(moe_intermediate_size),
      LGPT_FIELD(bias),
      LGPT_FIELD(mlp_class),
      LGPT_FIELD(gelu_approximate),
      LGPT_FIELD(n_expert),
      LGPT_FIELD(n_expert_per_token),
      LGPT_FIELD(scale_embeddings),
      LGPT_FIELD(lm_head_bias),
      LGPT_FIELD(final_logit_softcapping),
      LGPT_FIELD(norm_1),
      LGPT_FIELD(norm_2),
  };
  return *fields;
}
#undef LGPT_FIELD

// ---------------------------------------------------------------------------------------
// Deriving a Config from config.json.

// A config derived from config.json, with the fields it states.
struct Derived {
  Config config;
  std::set<std::string> stated;
  std::vector<std::string> notes;

  template <typename Member, typename Value>
  void Set(Member Config::*member, const char* name, Value&& value) {
    config.*member = std::forward<Value>(value);
    stated.insert(name);
  }
};

#define LGPT_SET(d, field, value) (d).Set(&Config::field, #field, value)

// What Transformers' config class of each family assumes for sizes config.json leaves out.
struct ClassDefaults {
  int64_t vocab, hidden, intermediate, layers, heads, positions;
  double eps, theta, rotary;
  std::optional<int64_t> head_dim;  // nullopt: hidden / heads
};

ClassDefaults DefaultsOf(HfFamily f, const std::string& arch) {
  switch (f) {
    case HfFamily::kLlama:
      if (arch == "MistralForCausalLM") {
        return {32000, 4096, 14336, 32, 32, 131072, 1e-6, 10000, 1.0, std::nullopt};
      }
      return {32000, 4096, 11008, 32, 32, 2048, 1e-6, 10000, 1.0, std::nullopt};
    case HfFamily::kMixtral:
      return {32000, 4096, 14336, 32, 32, 131072, 1e-5, 1e6, 1.0, std::nullopt};
    case HfFamily::kGemma:
      return {256000, 3072, 24576, 28, 16, 8192, 1e-6, 10000, 1.0, 256};
    case HfFamily::kGemma2:
      return {256000, 2304, 9216, 26, 8, 8192, 1e-6, 10000, 1.0, 256};
    case HfFamily::kGemma3:
      return {262208, 2304, 9216, 26, 8, 131072, 1e-6, 1e6, 1.0, 256};
    case HfFamily::kQwen2:
      return {151936, 4096, 22016, 32, 32, 32768, 1e-6, 10000, 1.0, std::nullopt};
    case HfFamily::kQwen3:
      return {151936, 4096, 22016, 32, 32, 32768, 1e-6, 10000, 1.0, 128};
    case HfFamily::kOlmo2:
      return {50304, 4096, 11008, 32, 32, 2048, 1e-5, 10000, 1.0, std::nullopt};
    case HfFamily::kPhi:
      return {51200, 2048, 8192, 24, 32, 2048, 1e-5, 10000, 0.5, std::nullopt};
    case HfFamily::kPhi3:
      return {32064, 3072, 8192, 32, 32, 4096, 1e-5, 10000, 1.0, std::nullopt};
    case HfFamily::kGptNeoX:
      return {50432, 6144, 24576, 44, 64, 2048, 1e-5, 10000, 0.25, std::nullopt};
    case HfFamily::kFalcon:
      return {65024, 4544, 4 * 4544, 32, 71, 2048, 1e-5, 10000, 1.0, std::nullopt};
    case HfFamily::kStableLm:
      return {50304, 2560, 6912, 32, 32, 4096, 1e-5, 10000, 0.25, std::nullopt};
  }
  return {};
}

bool LlamaLike(HfFamily f) {
  return f != HfFamily::kPhi && f != HfFamily::kGptNeoX && f != HfFamily::kFalcon;
}

// The block structure the architecture fixes: norms, MLP, residual layout, biases.
void DeriveStructure(HfFamily f, bool moe, Derived& d) {
  const bool llama_like = LlamaLike(f);
  LGPT_SET(d, norm_class,
           llama_like && f != HfFamily::kStableLm ? NormClass::kRMSNorm : NormClass::kLayerNorm);
  MlpClass mlp = llama_like ? MlpClass::kLLaMAMLP : MlpClass::kGptNeoxMLP;
  if (f == HfFamily::kGemma || f == HfFamily::kGemma2 || f == HfFamily::kGemma3) {
    mlp = MlpClass::kGemmaMLP;
  }
  if (moe) mlp = MlpClass::kLLaMAMoE;
  LGPT_SET(d, mlp_class, mlp);
  LGPT_SET(d, parallel_residual, !llama_like);
  LGPT_SET(d, bias, f == HfFamily::kPhi || f == HfFamily::kGptNeoX);
  LGPT_SET(d, attn_bias, f == HfFamily::kQwen2);
  LGPT_SET(d, shared_attention_norm, f == HfFamily::kPhi);
  LGPT_SET(d, lm_head_bias, f == HfFamily::kPhi);
  const bool gemma23 = f == HfFamily::kGemma2 || f == HfFamily::kGemma3;
  LGPT_SET(d, post_attention_norm, gemma23 || f == HfFamily::kOlmo2);
  LGPT_SET(d, post_mlp_norm, gemma23 || f == HfFamily::kOlmo2);
  LGPT_SET(d, norm_qk,
           f == HfFamily::kGemma3 || f == HfFamily::kQwen3 || f == HfFamily::kOlmo2);
  LGPT_SET(d, norm_qk_type, f == HfFamily::kOlmo2 ? NormQkType::kOlmo2 : NormQkType::kDefault);
  LGPT_SET(d, norm_1, f != HfFamily::kOlmo2);
  LGPT_SET(d, norm_2, f != HfFamily::kOlmo2);
  LGPT_SET(d, scale_embeddings, mlp == MlpClass::kGemmaMLP);
}

absl::Status DeriveSizes(const ConfigJson& j, HfFamily f, const ClassDefaults& defaults,
                         Derived& d) {
  auto size = [&](std::initializer_list<const char*> keys, int64_t fallback,
                  int64_t Config::*member, const char* name) -> absl::Status {
    ASSIGN_OR_RETURN(const std::optional<int64_t> v, j.Int(keys));
    d.config.*member = v.value_or(fallback);
    if (v) d.stated.insert(name);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(size({"num_hidden_layers", "n_layer", "num_layers"}, defaults.layers,
                       &Config::n_layer, "n_layer"));
  RETURN_IF_ERROR(
      size({"hidden_size", "n_embd", "d_model"}, defaults.hidden, &Config::n_embd, "n_embd"));
  RETURN_IF_ERROR(
      size({"num_attention_heads", "n_head"}, defaults.heads, &Config::n_head, "n_head"));
  RETURN_IF_ERROR(size({"max_position_embeddings", "n_positions"}, defaults.positions,
                       &Config::block_size, "block_size"));
  ASSIGN_OR_RETURN(const std::optional<int64_t> vocab, j.Int({"vocab_size"}));
  d.config.padded_vocab_size = vocab.value_or(defaults.vocab);
  d.config.vocab_size = *d.config.padded_vocab_size;
  if (vocab) d.stated.insert("padded_vocab_size");

  ASSIGN_OR_RETURN(const std::optional<int64_t> head_dim, j.Int({"head_dim"}));
  if (head_dim) {
    LGPT_SET(d, head_size, *head_dim);
  } else if (defaults.head_dim) {
    d.config.head_size = *defaults.head_dim;
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> intermediate,
                   j.Int({"intermediate_size", "ffn_hidden_size"}));
  if (intermediate) {
    LGPT_SET(d, intermediate_size, *intermediate);
  } else if (f == HfFamily::kGptNeoX || f == HfFamily::kFalcon) {
    d.config.intermediate_size = 4 * d.config.n_embd;  // Their classes' default.
  } else {
    d.config.intermediate_size = defaults.intermediate;
  }

  // Query groups: Falcon spells them its own way; everywhere else an absent
  // num_key_value_heads means multi-head attention.
  if (f == HfFamily::kFalcon) {
    ASSIGN_OR_RETURN(const std::optional<bool> new_arch, j.Bool("new_decoder_architecture"));
    ASSIGN_OR_RETURN(const std::optional<bool> multi_query, j.Bool("multi_query"));
    ASSIGN_OR_RETURN(const std::optional<int64_t> kv, j.Int({"num_kv_heads", "n_head_kv"}));
    int64_t groups = d.config.n_head;
    if (new_arch.value_or(false) || (j.Has("n_head_kv") && kv)) {
      groups = kv.value_or(d.config.n_head);
    } else if (multi_query.value_or(true)) {
      groups = 1;
    }
    LGPT_SET(d, n_query_groups, groups);
  } else {
    ASSIGN_OR_RETURN(const std::optional<int64_t> kv, j.Int({"num_key_value_heads"}));
    LGPT_SET(d, n_query_groups, kv.value_or(d.config.n_head));
  }
  return absl::OkStatus();
}

absl::Status DeriveNormAndActivation(const ConfigJson& j, HfFamily f,
                                     const ClassDefaults& defaults, Derived& d) {
  ASSIGN_OR_RETURN(const std::optional<double> eps,
                   j.Number({"rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"}));
  d.config.norm_eps = eps.value_or(defaults.eps);
  if (eps) d.stated.insert("norm_eps");

  // The activation: SiLU gates for the Llama-style MLPs, GELU (exact or tanh) otherwise.
  const bool gemma = d.config.mlp_class == MlpClass::kGemmaMLP;
  const char* key = "hidden_act";
  std::optional<std::string> act;
  if (gemma) {
    // Gemma's classes read hidden_activation and fall back to the tanh GELU (Gemma 1 ignores
    // hidden_act's "gelu" for it, with a warning).
    key = "hidden_activation";
    ASSIGN_OR_RETURN(act, j.String({"hidden_activation"}));
    if (!act) act = "gelu_pytorch_tanh";
  } else if (f == HfFamily::kFalcon) {
    key = "activation";
    ASSIGN_OR_RETURN(act, j.String({"activation"}));
  } else {
    ASSIGN_OR_RETURN(act, j.String({"hidden_act"}));
  }
  const bool gated = d.config.mlp_class == MlpClass::kLLaMAMLP ||
                     d.config.mlp_class == MlpClass::kLLaMAMoE;
  if (gated) {
    if (act && *act != "silu" && *act != "swish") {
      return Unsupported(j.source(), absl::StrCat("'", key, "': \"", *act,
                                                  "\" (lgpt's gated MLP of this family uses silu)"));
    }
    return absl::OkStatus();
  }
  std::string approximate = f == HfFamily::kPhi ? "tanh" : "none";  // The classes' defaults.
  if (act) {
    if (*act == "gelu") {
      approximate = "none";
    } else if (*act == "gelu_new" || *act == "gelu_pytorch_tanh") {
      approximate = "tanh";
    } else {
      return Unsupported(j.source(),
                         absl::StrCat("'", key, "': \"", *act,
                                      "\" (lgpt supports gelu, gelu_new and gelu_pytorch_tanh)"));
    }
  }
  LGPT_SET(d, gelu_approximate, approximate);
  return absl::OkStatus();
}

// Per-layer window choice from Transformers' `layer_types` list.
absl::StatusOr<std::optional<std::vector<int>>> LayerTypes(const ConfigJson& j, int64_t n_layer) {
  const json* types = j.Find({"layer_types"});
  if (types == nullptr) return std::optional<std::vector<int>>();
  if (!types->is_array() || static_cast<int64_t>(types->size()) != n_layer) {
    return Invalid(j.source(), absl::StrCat("'layer_types' must list one type per layer (",
                                            n_layer, ")"));
  }
  std::vector<int> indices;
  for (const json& t : *types) {
    if (t == "sliding_attention") {
      indices.push_back(1);
    } else if (t == "full_attention") {
      indices.push_back(0);
    } else {
      return Unsupported(j.source(), absl::StrCat("'layer_types' entry ", t.dump(),
                                                  " (lgpt knows sliding_attention and "
                                                  "full_attention)"));
    }
  }
  return std::optional<std::vector<int>>(indices);
}

// Sliding windows as each architecture reads them.
absl::Status DeriveWindows(const ConfigJson& j, HfFamily f, const std::string& arch,
                           Derived& d) {
  const int64_t n_layer = d.config.n_layer;
  ASSIGN_OR_RETURN(std::optional<int64_t> window, j.Int({"sliding_window"}));
  ASSIGN_OR_RETURN(std::optional<std::vector<int>> layer_types, LayerTypes(j, n_layer));
  const bool window_key = j.Has("sliding_window");
  std::optional<std::vector<int>> indices;
  switch (f) {
    case HfFamily::kLlama:
      if (arch != "MistralForCausalLM") return absl::OkStatus();  // Llama has no window.
      if (!window_key) window = 4096;                               // MistralConfig's default.
      break;
    case HfFamily::kMixtral:
    case HfFamily::kPhi3:
      break;
    case HfFamily::kQwen2:
    case HfFamily::kQwen3: {
      ASSIGN_OR_RETURN(const std::optional<bool> use, j.Bool("use_sliding_window"));
      ASSIGN_OR_RETURN(const std::optional<int64_t> max_window_layers,
                       j.Int({"max_window_layers"}));
      if (!use.value_or(false)) {
        window.reset();
        break;
      }
      if (!window_key) window = 4096;  // The classes' default.
      if (!layer_types) {
        // Transformers windows the layers from max_window_layers on.
        std::vector<int> v(n_layer);
        for (int64_t i = 0; i < n_layer; ++i) v[i] = i >= max_window_layers.value_or(28) ? 1 : 0;
        layer_types = v;
      }
      break;
    }
    case HfFamily::kGemma2:
    case HfFamily::kGemma3: {
      if (!window_key) window = 4096;
      if (!layer_types) {
        // Gemma 2 windows the even layers; Gemma 3 all but every sliding_window_pattern-th.
        ASSIGN_OR_RETURN(const std::optional<int64_t> pattern, j.Int({"sliding_window_pattern"}));
        const int64_t every = f == HfFamily::kGemma2 ? 2 : pattern.value_or(6);
        if (every < 1) return Invalid(j.source(), "'sliding_window_pattern' must be at least 1");
        std::vector<int> v(n_layer);
        for (int64_t i = 0; i < n_layer; ++i) v[i] = (i + 1) % every == 0 ? 0 : 1;
        layer_types = v;
      }
      break;
    }
    default:
      return absl::OkStatus();  // No window in these architectures.
  }
  if (window) {
    if (*window < 1) return Invalid(j.source(), "'sliding_window' must be at least 1");
    indices = layer_types;
  }
  LGPT_SET(d, sliding_window_size, window);
  LGPT_SET(d, sliding_window_indices, indices);
  if (f == HfFamily::kGemma3) {
    // Gemma 3's windowed layers use the local RoPE base.
    ASSIGN_OR_RETURN(const std::optional<double> local, j.Number({"rope_local_base_freq"}));
    LGPT_SET(d, rope_local_base_freq, local.value_or(10000));
    LGPT_SET(d, rope_indices, window ? indices : std::nullopt);
  }
  return absl::OkStatus();
}

absl::Status DeriveGemmaScaling(const ConfigJson& j, HfFamily f, Derived& d) {
  if (f != HfFamily::kGemma2 && f != HfFamily::kGemma3) return absl::OkStatus();
  const bool gemma2 = f == HfFamily::kGemma2;
  ASSIGN_OR_RETURN(const std::optional<double> scalar, j.Number({"query_pre_attn_scalar"}));
  LGPT_SET(d, attention_scores_scalar, scalar.value_or(256));
  // Present-but-null turns soft-capping off; absent takes the class default.
  ASSIGN_OR_RETURN(std::optional<double> attn_cap, j.Number({"attn_logit_softcapping"}));
  if (!j.Has("attn_logit_softcapping") && gemma2) attn_cap = 50;
  ASSIGN_OR_RETURN(std::optional<double> final_cap, j.Number({"final_logit_softcapping"}));
  if (!j.Has("final_logit_softcapping") && gemma2) final_cap = 30;
  LGPT_SET(d, attention_logit_softcapping, attn_cap);
  LGPT_SET(d, final_logit_softcapping, final_cap);
  return absl::OkStatus();
}

absl::StatusOr<double> RopeNumber(const json& s, const char* key, const std::string& source,
                                  std::optional<double> fallback = std::nullopt) {
  const auto it = s.find(key);
  if (it == s.end() || it->is_null()) {
    if (fallback) return *fallback;
    return Invalid(source, absl::StrCat("'rope_scaling' needs '", key, "'"));
  }
  if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() <= 0) {
    return Invalid(source, absl::StrCat("'rope_scaling.", key, "' must be a positive number"));
  }
  return it->get<double>();
}

// rope_scaling: llama3, linear, yarn as LitGPT's rope_adjustments; dynamic changes nothing
// within max_position_embeddings; the rest are errors.
absl::Status DeriveRopeScaling(const ConfigJson& j, HfFamily f, Derived& d) {
  if (!j.Has("rope_scaling")) return absl::OkStatus();
  LGPT_SET(d, rope_adjustments, std::nullopt);
  LGPT_SET(d, rope_condense_ratio, int64_t{1});
  const json* s = j.Find({"rope_scaling"});
  if (s == nullptr) return absl::OkStatus();
  const std::string& source = j.source();
  if (!s->is_object()) return Invalid(source, "'rope_scaling' must be an object or null");
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (s->contains(key)) {
      if (!(*s)[key].is_string()) {
        return Invalid(source, absl::StrCat("'rope_scaling.", key, "' must be a string"));
      }
      type = (*s)[key].get<std::string>();
      break;
    }
  }
  const std::map<std::string, std::set<std::string>> known_keys = {
      {"default", {}},
      {"linear", {"factor"}},
      {"dynamic", {"factor", "original_max_position_embeddings"}},
      {"llama3",
       {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}},
      {"yarn",
       {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
        "mscale_all_dim", "truncate"}},
  };
  const auto known = known_keys.find(type);
  if (known == known_keys.end()) {
    return Unsupported(source,
                       absl::StrCat("'rope_scaling.rope_type': \"", type,
                                    "\" is not supported (lgpt computes default, linear, "
                                    "dynamic, llama3 and yarn, as LitGPT does)"));
  }
  for (const auto& [key, value] : s->items()) {
    if (key == "rope_type" || key == "type" || known->second.count(key)) continue;
    return Unsupported(source, absl::StrCat("'rope_scaling.", key, "' is not supported with ",
                                            "rope_type \"", type, "\""));
  }
  const double context = static_cast<double>(d.config.block_size);
  RopeAdjustments r;
  if (type == "default") return absl::OkStatus();
  if (type == "dynamic") {
    // Dynamic NTK rescales only past max_position_embeddings, which is lgpt's context.
    d.notes.push_back(absl::StrCat("rope_scaling \"dynamic\" changes nothing within ",
                                   d.config.block_size,
                                   " positions (max_position_embeddings), the model's context"));
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const double factor, RopeNumber(*s, "factor", source));
  if (type == "linear") {
    // A whole factor is LitGPT's rope_condense_ratio; Gemma 3 scales its global layers only,
    // which rope_adjustments does.
    if (f != HfFamily::kGemma3 && factor == std::floor(factor) && factor <= 1 << 20) {
      LGPT_SET(d, rope_condense_ratio, static_cast<int64_t>(factor));
      return absl::OkStatus();
    }
    r.factor = factor;
  } else if (type == "llama3") {
    r.factor = factor;
    ASSIGN_OR_RETURN(r.low_freq_factor, RopeNumber(*s, "low_freq_factor", source));
    ASSIGN_OR_RETURN(r.high_freq_factor, RopeNumber(*s, "high_freq_factor", source));
    ASSIGN_OR_RETURN(r.original_max_seq_len,
                     RopeNumber(*s, "original_max_position_embeddings", source));
  } else {  // yarn
    r.factor = factor;
    ASSIGN_OR_RETURN(r.original_max_seq_len,
                     RopeNumber(*s, "original_max_position_embeddings", source, context));
    ASSIGN_OR_RETURN(r.beta_fast, RopeNumber(*s, "beta_fast", source, 32.0));
    ASSIGN_OR_RETURN(r.beta_slow, RopeNumber(*s, "beta_slow", source, 1.0));
    for (const char* key : {"mscale", "mscale_all_dim"}) {
      if (s->contains(key) && !(*s)[key].is_null()) {
        ASSIGN_OR_RETURN(const double v, RopeNumber(*s, key, source));
        (key == std::string("mscale") ? r.mscale : r.mscale_all_dim) = v;
      }
    }
    if (s->contains("truncate")) {
      if (!(*s)["truncate"].is_boolean()) {
        return Invalid(source, "'rope_scaling.truncate' must be true or false");
      }
      r.truncate = (*s)["truncate"].get<bool>();
    }
  }
  LGPT_SET(d, rope_adjustments, r);
  return absl::OkStatus();
}

absl::Status DeriveRope(const ConfigJson& j, HfFamily f, const ClassDefaults& defaults,
                        Derived& d) {
  ASSIGN_OR_RETURN(const std::optional<double> theta, j.Number({"rope_theta", "rotary_emb_base"}));
  d.config.rope_base = theta.value_or(defaults.theta);
  if (theta) d.stated.insert("rope_base");
  ASSIGN_OR_RETURN(const std::optional<double> rotary,
                   j.Number({"partial_rotary_factor", "rotary_pct"}));
  LGPT_SET(d, rotary_percentage, rotary.value_or(defaults.rotary));
  if (f != HfFamily::kGemma3) {
    LGPT_SET(d, rope_local_base_freq, std::nullopt);
    LGPT_SET(d, rope_indices, std::nullopt);
  }
  return DeriveRopeScaling(j, f, d);
}

absl::Status DeriveExperts(const ConfigJson& j, HfFamily f, bool moe, Derived& d) {
  LGPT_SET(d, n_expert, int64_t{0});
  LGPT_SET(d, n_expert_per_token, int64_t{0});
  LGPT_SET(d, moe_intermediate_size, std::nullopt);
  if (!moe) return absl::OkStatus();
  const bool mixtral = f == HfFamily::kMixtral;
  ASSIGN_OR_RETURN(const std::optional<int64_t> experts,
                   j.Int({mixtral ? "num_local_experts" : "num_experts"}));
  ASSIGN_OR_RETURN(const std::optional<int64_t> per_token, j.Int({"num_experts_per_tok"}));
  LGPT_SET(d, n_expert, experts.value_or(mixtral ? 8 : 128));
  LGPT_SET(d, n_expert_per_token, per_token.value_or(mixtral ? 2 : 8));
  if (mixtral) return absl::OkStatus();
  // Qwen3 MoE: every layer sparse, router weights renormalised over the chosen experts (what
  // lgpt's MoE computes).
  ASSIGN_OR_RETURN(const std::optional<int64_t> moe_size, j.Int({"moe_intermediate_size"}));
  LGPT_SET(d, moe_intermediate_size, moe_size.value_or(768));
  ASSIGN_OR_RETURN(const std::optional<int64_t> step, j.Int({"decoder_sparse_step"}));
  if (step.value_or(1) != 1) {
    return Unsupported(j.source(), "'decoder_sparse_step' other than 1 (dense layers between "
                                   "sparse ones) is not supported");
  }
  if (const json* dense = j.Find({"mlp_only_layers"}); dense && !dense->empty()) {
    return Unsupported(j.source(), "'mlp_only_layers' (dense layers among sparse ones) is not "
                                   "supported");
  }
  ASSIGN_OR_RETURN(const std::optional<bool> norm_topk, j.Bool("norm_topk_prob"));
  if (!norm_topk.value_or(false)) {
    return Unsupported(j.source(), "'norm_topk_prob': false (router weights not renormalised "
                                   "over the chosen experts) is not supported");
  }
  return absl::OkStatus();
}

// Keys whose non-default values change what the architecture computes, with what lgpt can
// compute for them.
absl::Status CheckComputeKeys(const ConfigJson& j, HfFamily f, Derived& d) {
  const std::string& source = j.source();
  if (j.Find({"quantization_config"}) != nullptr) {
    return Unsupported(source, "'quantization_config': quantised checkpoints (GPTQ, AWQ, "
                               "bitsandbytes, ...) cannot be converted; use the float weights");
  }
  auto require = [&](const char* key, bool expected, const std::string& why) -> absl::Status {
    ASSIGN_OR_RETURN(const std::optional<bool> v, j.Bool(key));
    if (v && *v != expected) {
      return Unsupported(source, absl::StrCat("'", key, "': ", *v ? "true" : "false", " ", why));
    }
    return absl::OkStatus();
  };
  const std::string no_layout = "has no LitGPT equivalent for this architecture";
  switch (f) {
    case HfFamily::kLlama: {
      // Llama's attention_bias biases q, k, v and o; LitGPT's `bias` all projections.
      ASSIGN_OR_RETURN(const std::optional<bool> attn, j.Bool("attention_bias"));
      ASSIGN_OR_RETURN(const std::optional<bool> mlp, j.Bool("mlp_bias"));
      if (attn.value_or(false) != mlp.value_or(false)) {
        return Unsupported(source,
                           absl::StrCat("'attention_bias': ", attn.value_or(false) ? "true" : "false",
                                        " with 'mlp_bias': ", mlp.value_or(false) ? "true" : "false",
                                        " (LitGPT biases all projections or none)"));
      }
      LGPT_SET(d, bias, attn.value_or(false));
      return absl::OkStatus();
    }
    case HfFamily::kQwen3:
    case HfFamily::kOlmo2:
    case HfFamily::kGemma:
    case HfFamily::kGemma2:
    case HfFamily::kGemma3:
      return require("attention_bias", false, no_layout);
    case HfFamily::kGptNeoX: {
      RETURN_IF_ERROR(require("attention_bias", true, no_layout));
      ASSIGN_OR_RETURN(const std::optional<bool> parallel, j.Bool("use_parallel_residual"));
      LGPT_SET(d, parallel_residual, parallel.value_or(true));
      return absl::OkStatus();
    }
    case HfFamily::kPhi:
      return require("qk_layernorm", false, no_layout);
    case HfFamily::kStableLm: {
      RETURN_IF_ERROR(require("qk_layernorm", false, no_layout));
      RETURN_IF_ERROR(require("use_parallel_residual", false, no_layout));
      ASSIGN_OR_RETURN(const std::optional<bool> qkv_bias, j.Bool("use_qkv_bias"));
      LGPT_SET(d, attn_bias, qkv_bias.value_or(false));
      return absl::OkStatus();
    }
    case HfFamily::kFalcon: {
      RETURN_IF_ERROR(require("alibi", false, "(ALiBi positions) is not supported"));
      RETURN_IF_ERROR(require("parallel_attn", true, no_layout));
      ASSIGN_OR_RETURN(const std::optional<bool> bias, j.Bool("bias"));
      LGPT_SET(d, bias, bias.value_or(false));
      ASSIGN_OR_RETURN(const std::optional<bool> new_arch, j.Bool("new_decoder_architecture"));
      ASSIGN_OR_RETURN(const std::optional<int64_t> norms, j.Int({"num_ln_in_parallel_attn"}));
      if (new_arch.value_or(false) && norms.value_or(2) != 2) {
        return Unsupported(source, "'num_ln_in_parallel_attn' other than 2 " + no_layout);
      }
      LGPT_SET(d, shared_attention_norm, !new_arch.value_or(false));
      return absl::OkStatus();
    }
    default:
      return absl::OkStatus();
  }
}

// The names a model goes by: config.json's `_name_or_path` ("org/name" or a path) with its
// '/'-separated parts, and the directory's own name.
struct ModelNames {
  std::string name_or_path;  // empty when config.json has none
  std::vector<std::string> parts;
  std::string dir_name;      // empty for "/"

  // The name a model derived from config.json gets: the last part, else the directory's.
  std::string Derived() const {
    if (!parts.empty()) return parts.back();
    return dir_name.empty() ? "model" : dir_name;
  }
};

ModelNames NamesOf(const ConfigJson& j, const std::string& hf_dir) {
  ModelNames names;
  if (const json* n = j.Find({"_name_or_path"}); n && n->is_string()) {
    names.name_or_path = n->get<std::string>();
    names.parts = absl::StrSplit(names.name_or_path, '/', absl::SkipEmpty());
  }
  const std::vector<std::string> dir_parts = absl::StrSplit(hf_dir, '/', absl::SkipEmpty());
  if (!dir_parts.empty()) names.dir_name = dir_parts.back();
  return names;
}

// LitGPT decides two computations by the model's name: Gemma's unit-offset RMSNorm ("Gemma" in
// the name) and OLMo's affine-free LayerNorm ("OLMo"). A derived name must say what the
// architecture is, so LitGPT (and lgpt) compute the same model from model_config.yaml.
std::string LitGptSafeName(std::string name, HfFamily f, std::vector<std::string>& notes) {
  const std::string original = name;
  const bool gemma = f == HfFamily::kGemma || f == HfFamily::kGemma2 || f == HfFamily::kGemma3;
  if (gemma && !absl::StrContains(name, "Gemma")) {
    name = StartsWithLower(name, "gemma") ? "Gemma" + name.substr(5) : "Gemma-" + name;
  } else if (!gemma) {
    name = absl::StrReplaceAll(name, {{"Gemma", "gemma"}});
  }
  name = absl::StrReplaceAll(name, {{"OLMo", "Olmo"}});
  if (name != original) {
    notes.push_back(absl::StrCat("named ", name, " rather than ", original,
                                 ": LitGPT chooses Gemma's norm by the name"));
  }
  return name;
}

absl::StatusOr<Derived> Derive(const ConfigJson& j, HfFamily f, const std::string& arch) {
  Derived d;
  const bool moe = arch == "MixtralForCausalLM" || arch == "Qwen3MoeForCausalLM";
  const ClassDefaults defaults = DefaultsOf(f, arch);
  DeriveStructure(f, moe, d);
  RETURN_IF_ERROR(DeriveSizes(j, f, defaults, d));
  RETURN_IF_ERROR(DeriveNormAndActivation(j, f, defaults, d));
  RETURN_IF_ERROR(DeriveRope(j, f, defaults, d));
  RETURN_IF_ERROR(DeriveWindows(j, f, arch, d));
  RETURN_IF_ERROR(DeriveGemmaScaling(j, f, d));
  RETURN_IF_ERROR(DeriveExperts(j, f, moe, d));
  RETURN_IF_ERROR(CheckComputeKeys(j, f, d));
  return d;
}

#undef LGPT_SET

// The preset named `model_name`, or else the one named like config.json or the directory
// whose family is `family`; nullopt when none is.
absl::StatusOr<std::optional<Config>> FindPreset(const ConfigJson& j, const ModelNames& names,
                                                 const std::string& model_name, HfFamily family) {
  if (!model_name.empty()) {
    ASSIGN_OR_RETURN(Config c, PresetFromName(model_name));
    absl::StatusOr<HfFamily> f = HfFamilyOf(c);
    if (!f.ok() || *f != family) {
      return Invalid(j.source(), absl::StrCat("the architecture does not match the preset ",
                                              model_name,
                                              f.ok() ? " (" + HfArchitecture(c, *f) + ")" : ""));
    }
    return std::optional<Config>(c);
  }
  std::vector<std::string> candidates;
  if (!names.name_or_path.empty()) candidates.push_back(names.name_or_path);
  const std::vector<std::string>& parts = names.parts;
  if (!parts.empty()) candidates.push_back(parts.back());
  if (parts.size() >= 2) candidates.push_back(parts[parts.size() - 2] + "/" + parts.back());
  if (!names.dir_name.empty()) candidates.push_back(names.dir_name);
  for (const std::string& name : candidates) {
    absl::StatusOr<Config> c = PresetFromName(name);
    if (!c.ok()) continue;
    absl::StatusOr<HfFamily> f = HfFamilyOf(*c);
    if (f.ok() && *f == family) return std::optional<Config>(*c);
  }
  return std::optional<Config>();
}

// The preset with every field config.json states replaced; `overridden` gets the changes.
Config OverlayStated(const Config& preset, const Derived& d, bool multimodal,
                     std::vector<std::string>& overridden) {
  Config c = preset;
  Config finalised_preset = preset;
  const bool preset_ok = finalised_preset.Finalize().ok();
  for (const FieldRef& field : ComputeFields()) {
    if (!d.stated.count(field.name)) continue;
    const std::string before = field.show(preset_ok ? finalised_preset : preset);
    field.copy(d.config, c);
    const std::string after = field.show(c);
    // Derived fields left unset (head size, groups) compare after finalising.
    if (before != after && !(field.show(preset) == after)) {
      overridden.push_back(absl::StrCat(field.name, ": ", after, " (preset ", preset.name, ": ",
                                        before, ")"));
    }
  }
  if (multimodal && preset_ok && d.stated.count("padded_vocab_size")) {
    // The text_config vocabulary counts image tokens; LitGPT keeps the text vocabulary.
    c.padded_vocab_size = std::min(*c.padded_vocab_size, finalised_preset.PaddedVocabSize());
  }
  c.vocab_size = std::min(preset.vocab_size, *c.padded_vocab_size);
  return c;
}

}  // namespace

// ---------------------------------------------------------------------------------------

std::optional<HfFamily> HfFamilyOfArchitecture(absl::string_view architecture) {
  for (const auto& [name, family] : KnownArchitectures()) {
    if (name == architecture) return family;
  }
  return std::nullopt;
}

absl::StatusOr<HfFamily> HfFamilyOf(const Config& c) {
  if (c.has_latent_attention) {
    return absl::UnimplementedError(
        absl::StrCat(c.name, ": multi-head latent attention checkpoints cannot be converted"));
  }
  const bool layer_norm = c.norm_class == NormClass::kLayerNorm;
  // OLMo (1)'s affine-free LayerNorm is OlmoForCausalLM, which lgpt does not convert.
  if (!c.NormHasAffine()) {
    return absl::UnimplementedError(
        absl::StrCat(c.name, ": no Hugging Face conversion for OLMo (1) checkpoints"));
  }
  switch (c.mlp_class) {
    case MlpClass::kGptNeoxMLP:
      if (!layer_norm || !c.norm_1) break;
      if (c.lm_head_bias && c.shared_attention_norm) return HfFamily::kPhi;
      if (!c.bias && c.parallel_residual) return HfFamily::kFalcon;
      if (c.bias && !c.lm_head_bias && !c.shared_attention_norm) return HfFamily::kGptNeoX;
      break;
    case MlpClass::kGemmaMLP:
      if (c.norm_qk) return HfFamily::kGemma3;
      if (c.post_attention_norm) return HfFamily::kGemma2;
      return HfFamily::kGemma;
    case MlpClass::kLLaMAMoE:
      if (c.norm_qk) return HfFamily::kQwen3;
      if (c.n_expert_groups || c.n_shared_expert.value_or(0) > 0 || c.first_k_dense_replace) break;
      return HfFamily::kMixtral;
    case MlpClass::kLLaMAMLP:
      if (c.norm_qk_type == NormQkType::kOlmo2) return HfFamily::kOlmo2;
      if (c.norm_qk) return HfFamily::kQwen3;
      if (layer_norm) return HfFamily::kStableLm;
      if (c.attn_bias && !c.bias) return HfFamily::kQwen2;
      // Phi-3 and Phi-4 are Llama blocks whose checkpoints fuse qkv and gate/up.
      if (StartsWithLower(c.name, "phi-3") || StartsWithLower(c.name, "phi-4")) {
        return HfFamily::kPhi3;
      }
      return HfFamily::kLlama;
  }
  return absl::UnimplementedError(
      absl::StrCat(c.name, ": no Hugging Face conversion for this model family"));
}

bool FalconNewDecoderArchitecture(const Config& config) { return !config.shared_attention_norm; }

namespace {

bool IsMistral(const Config& c) {
  return StartsWithLower(c.name, "mistral") || c.sliding_window_size.has_value();
}

}  // namespace

std::string HfArchitecture(const Config& c, HfFamily f) {
  switch (f) {
    case HfFamily::kLlama:  // Llama's class has no sliding window; Mistral's has.
      return IsMistral(c) ? "MistralForCausalLM" : "LlamaForCausalLM";
    case HfFamily::kMixtral:
      return "MixtralForCausalLM";
    case HfFamily::kGemma:
      return "GemmaForCausalLM";
    case HfFamily::kGemma2:
      return "Gemma2ForCausalLM";
    case HfFamily::kGemma3:
      return "Gemma3ForCausalLM";
    case HfFamily::kQwen2:
      return "Qwen2ForCausalLM";
    case HfFamily::kQwen3:
      return c.n_expert > 0 ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM";
    case HfFamily::kOlmo2:
      return "Olmo2ForCausalLM";
    case HfFamily::kPhi:
      return "PhiForCausalLM";
    case HfFamily::kPhi3:
      return "Phi3ForCausalLM";
    case HfFamily::kGptNeoX:
      return "GPTNeoXForCausalLM";
    case HfFamily::kFalcon:
      return "FalconForCausalLM";
    case HfFamily::kStableLm:
      return "StableLmForCausalLM";
  }
  return "";
}

std::string HfModelType(const Config& c, HfFamily f) {
  switch (f) {
    case HfFamily::kLlama:
      return IsMistral(c) ? "mistral" : "llama";
    case HfFamily::kMixtral:
      return "mixtral";
    case HfFamily::kGemma:
      return "gemma";
    case HfFamily::kGemma2:
      return "gemma2";
    case HfFamily::kGemma3:
      return "gemma3_text";
    case HfFamily::kQwen2:
      return "qwen2";
    case HfFamily::kQwen3:
      return c.n_expert > 0 ? "qwen3_moe" : "qwen3";
    case HfFamily::kOlmo2:
      return "olmo2";
    case HfFamily::kPhi:
      return "phi";
    case HfFamily::kPhi3:
      return "phi3";
    case HfFamily::kGptNeoX:
      return "gpt_neox";
    case HfFamily::kFalcon:
      return "falcon";
    case HfFamily::kStableLm:
      return "stablelm";
  }
  return "";
}

absl::StatusOr<HfConfig> ReadHfConfig(const std::string& hf_dir, const std::string& model_name,
                                      const std::string& model_config) {
  const std::string path = hf_dir + "/config.json";
  const bool has_json = IsFile(path);
  if (!model_config.empty()) {
    HfConfig result;
    ASSIGN_OR_RETURN(result.config, LoadConfigFile(model_config));
    ASSIGN_OR_RETURN(result.family, HfFamilyOf(result.config));
    return result;
  }
  if (!has_json) {
    return absl::NotFoundError(
        absl::StrCat(hf_dir, ": no config.json (is this a Hugging Face checkpoint directory?)"));
  }
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  ASSIGN_OR_RETURN(json j, ParseConfigJson(text, path));
  // Multimodal configs keep the text model in text_config.
  const bool multimodal = j.contains("text_config") && j["text_config"].is_object();
  if (multimodal) {
    json merged = j["text_config"];
    for (const char* key : {"architectures", "_name_or_path", "quantization_config"}) {
      if (j.contains(key)) merged[key] = j[key];
    }
    j = merged;
  }
  const ConfigJson config_json(j, path);
  std::string arch;
  if (const json* a = config_json.Find({"architectures"})) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string()) {
      return Invalid(path, "'architectures' must be a list of names");
    }
    arch = (*a)[0].get<std::string>();
  } else {
    ASSIGN_OR_RETURN(const std::optional<std::string> model_type,
                     config_json.String({"model_type"}));
    if (!model_type) return Invalid(path, "neither 'architectures' nor 'model_type' is given");
    const std::optional<std::string> known = ArchitectureOfModelType(*model_type);
    if (!known) {
      return Unsupported(path, absl::StrCat("'model_type': \"", *model_type,
                                            "\" has no LitGPT conversion"));
    }
    arch = *known;
  }
  const std::optional<HfFamily> family = HfFamilyOfArchitecture(arch);
  if (!family) {
    return Unsupported(path, absl::StrCat("unknown architecture ", arch,
                                          " (no LitGPT conversion exists for it)"));
  }
  ASSIGN_OR_RETURN(Derived derived, Derive(config_json, *family, arch));
  const ModelNames names = NamesOf(config_json, hf_dir);
  ASSIGN_OR_RETURN(std::optional<Config> preset,
                   FindPreset(config_json, names, model_name, *family));
  HfConfig result;
  result.family = *family;
  result.notes = derived.notes;
  if (preset) {
    result.preset = preset->name;
    result.config = OverlayStated(*preset, derived, multimodal, result.overridden);
  } else {
    result.config = derived.config;
    result.config.name = LitGptSafeName(names.Derived(), *family, result.notes);
    if (names.parts.size() == 2 && !absl::StartsWith(names.name_or_path, "/")) {
      result.config.hf_org = names.parts[0];
      result.config.hf_name = names.parts[1];
    }
  }
  const absl::Status finalised = result.config.Finalize();
  if (!finalised.ok()) {
    return Invalid(path, absl::StrCat("its values do not make a valid config: ",
                                      finalised.message()));
  }
  return result;
}

absl::StatusOr<Config> ConfigFromHfDir(const std::string& hf_dir, const std::string& model_name,
                                       const std::string& model_config) {
  ASSIGN_OR_RETURN(HfConfig read, ReadHfConfig(hf_dir, model_name, model_config));
  return read.config;
}

namespace {

std::string DtypeName(c10::ScalarType t) {
  switch (t) {
    case c10::kBFloat16:
      return "bfloat16";
    case c10::kHalf:
      return "float16";
    case c10::kDouble:
      return "float64";
    default:
      return "float32";
  }
}

json RopeScalingJson(const Config& c) {
  if (!c.rope_adjustments) {
    if (c.rope_condense_ratio > 1) {
      return {{"rope_type", "linear"}, {"factor", static_cast<double>(c.rope_condense_ratio)}};
    }
    return nullptr;
  }
  const RopeAdjustments& r = *c.rope_adjustments;
  json s;
  s["rope_type"] = r.IsLlama3() ? "llama3" : r.IsYarn() ? "yarn" : "linear";
  if (r.factor) s["factor"] = *r.factor;
  if (r.low_freq_factor) s["low_freq_factor"] = *r.low_freq_factor;
  if (r.high_freq_factor) s["high_freq_factor"] = *r.high_freq_factor;
  if (r.original_max_seq_len) {
    s["original_max_position_embeddings"] = static_cast<int64_t>(*r.original_max_seq_len);
  }
  if (r.beta_fast) s["beta_fast"] = *r.beta_fast;
  if (r.beta_slow) s["beta_slow"] = *r.beta_slow;
  if (r.mscale) s["mscale"] = *r.mscale;
  if (r.mscale_all_dim) s["mscale_all_dim"] = *r.mscale_all_dim;
  if (r.truncate) s["truncate"] = *r.truncate;
  return s;
}

json LayerTypesJson(const Config& c) {
  json types = json::array();
  for (int64_t i = 0; i < c.n_layer; ++i) {
    types.push_back(c.IsSlidingWindowLayer(i) ? "sliding_attention" : "full_attention");
  }
  return types;
}

}  // namespace

std::string HfConfigJson(const Config& c, HfFamily f, bool tie_word_embeddings,
                         c10::ScalarType dtype) {
  json j;
  j["architectures"] = {HfArchitecture(c, f)};
  j["model_type"] = HfModelType(c, f);
  if (!c.hf_name.empty()) {
    j["_name_or_path"] = c.hf_org.empty() ? c.hf_name : c.hf_org + "/" + c.hf_name;
  }
  j["hidden_size"] = c.n_embd;
  j["num_hidden_layers"] = c.n_layer;
  j["num_attention_heads"] = c.n_head;
  j["vocab_size"] = c.PaddedVocabSize();
  j["max_position_embeddings"] = c.block_size;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["torch_dtype"] = DtypeName(dtype);
  j["intermediate_size"] = c.IntermediateSize();
  j["rope_scaling"] = RopeScalingJson(c);
  // Only some classes read head_dim; it is written for the others only when width / heads
  // would be wrong (shrunken test models), and lgpt reads it for every family.
  if (c.n_embd != c.n_head * c.HeadSize()) j["head_dim"] = c.HeadSize();
  const std::string act = c.gelu_approximate == "tanh" ? "gelu_new" : "gelu";
  if (f == HfFamily::kGptNeoX) {
    j["layer_norm_eps"] = c.norm_eps;
    j["rotary_pct"] = c.rotary_percentage;
    j["rotary_emb_base"] = c.rope_base;
    j["use_parallel_residual"] = c.parallel_residual;
    j["hidden_act"] = act;
    return j.dump(2) + "\n";
  }
  if (f == HfFamily::kFalcon) {
    j["num_kv_heads"] = c.QueryGroups();
    j["multi_query"] = c.QueryGroups() == 1;
    j["new_decoder_architecture"] = FalconNewDecoderArchitecture(c);
    j["parallel_attn"] = c.parallel_residual;
    j["bias"] = c.bias;
    j["layer_norm_epsilon"] = c.norm_eps;
    j["rope_theta"] = c.rope_base;
    j["alibi"] = false;
    j["activation"] = act;
    return j.dump(2) + "\n";
  }
  j["num_key_value_heads"] = c.QueryGroups();
  j["head_dim"] = c.HeadSize();
  j["rope_theta"] = c.rope_base;
  j["partial_rotary_factor"] = c.rotary_percentage;
  if (f == HfFamily::kPhi) {
    j["layer_norm_eps"] = c.norm_eps;
    j["hidden_act"] = act;
    j["qk_layernorm"] = false;
    return j.dump(2) + "\n";
  }
  if (f == HfFamily::kStableLm) {
    j["layer_norm_eps"] = c.norm_eps;
    j["use_qkv_bias"] = c.attn_bias;
    j["use_parallel_residual"] = false;
    j["qk_layernorm"] = false;
    j["hidden_act"] = "silu";
    return j.dump(2) + "\n";
  }
  j["rms_norm_eps"] = c.norm_eps;
  j["attention_bias"] = c.bias;
  if (f == HfFamily::kLlama) j["mlp_bias"] = c.bias;
  if (c.mlp_class == MlpClass::kGemmaMLP) {
    j["hidden_activation"] = c.gelu_approximate == "tanh" ? "gelu_pytorch_tanh" : "gelu";
  } else {
    j["hidden_act"] = "silu";
  }
  if (c.sliding_window_size) {
    j["sliding_window"] = *c.sliding_window_size;
    if (f == HfFamily::kQwen2 || f == HfFamily::kQwen3) j["use_sliding_window"] = true;
    if (f == HfFamily::kQwen2 || f == HfFamily::kQwen3 || f == HfFamily::kGemma2 ||
        f == HfFamily::kGemma3) {
      j["layer_types"] = LayerTypesJson(c);
    }
  } else if (f == HfFamily::kGemma2 || f == HfFamily::kGemma3 || f == HfFamily::kLlama) {
    j["sliding_window"] = nullptr;  // Their classes would otherwise assume one.
  }
  if (c.n_expert > 0) {
    j[f == HfFamily::kMixtral ? "num_local_experts" : "num_experts"] = c.n_expert;
    j["num_experts_per_tok"] = c.n_expert_per_token;
    if (c.moe_intermediate_size) j["moe_intermediate_size"] = *c.moe_intermediate_size;
    if (f == HfFamily::kQwen3) j["norm_topk_prob"] = true;  // What lgpt's router computes.
  }
  if (f == HfFamily::kGemma2 || f == HfFamily::kGemma3) {
    j["query_pre_attn_scalar"] = c.attention_scores_scalar
                                     ? json(*c.attention_scores_scalar)
                                     : json(static_cast<double>(c.HeadSize()));
    j["attn_logit_softcapping"] =
        c.attention_logit_softcapping ? json(*c.attention_logit_softcapping) : json(nullptr);
    j["final_logit_softcapping"] =
        c.final_logit_softcapping ? json(*c.final_logit_softcapping) : json(nullptr);
  }
  if (c.rope_local_base_freq) j["rope_local_base_freq"] = *c.rope_local_base_freq;
  return j.dump(2) + "\n";
}

}  // namespace lgpt
