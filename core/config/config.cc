#include "core/config/config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "core/base/status_macros.h"
#include "yaml-cpp/depthguard.h"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/yaml.h"

namespace lgpt {
namespace {

// ---------------------------------------------------------------------------------------------
// Scalar text: YAML 1.1 as PyYAML (LitGPT's reader and writer) spells it.

// The node's value is a quoted string: a number or bool in quotes is a string to PyYAML, so
// LitGPT would not read it as one either.
bool IsQuoted(const YAML::Node& node) { return node.Tag() == "!"; }

// Control characters from a broken file are shown escaped, so messages stay one clean line.
std::string Printable(absl::string_view text) {
  std::string out;
  for (unsigned char ch : text) {
    if (ch < 0x20 || ch == 0x7f) {
      out += absl::StrFormat("\\x%02x", ch);
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out;
}

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Scalar:
      return absl::StrCat(IsQuoted(node) ? "the quoted string '" : "'", Printable(node.Scalar()),
                          "'");
    default:
      return "nothing";
  }
}

std::string Where(const YAML::Node& node) {
  // A missing value's mark is where the next token starts, often the next line.
  if (node.IsNull()) return "";
  const YAML::Mark mark = node.Mark();
  if (mark.is_null()) return "";
  return absl::StrCat(" (line ", mark.line + 1, ")");
}

absl::Status TypeError(absl::string_view key, absl::string_view expected, const YAML::Node& node) {
  return absl::InvalidArgumentError(
      absl::StrCat(key, ": expected ", expected, ", got ", Describe(node), Where(node)));
}

// Digits with an optional sign: [-+]?[0-9]+
bool LooksLikeInt(absl::string_view s) {
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  return !s.empty() && std::all_of(s.begin(), s.end(), absl::ascii_isdigit);
}

// [-+]?(digits[.digits]|.digits)([eE][-+]?digits)?  (the exponent form PyYAML writes is a
// subset; "1e-5" is accepted too since nothing else could be meant).
bool LooksLikeDecimal(absl::string_view s) {
  size_t i = 0;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
  size_t mantissa_digits = 0;
  while (i < s.size() && absl::ascii_isdigit(s[i])) ++i, ++mantissa_digits;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && absl::ascii_isdigit(s[i])) ++i, ++mantissa_digits;
  }
  if (mantissa_digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
    size_t exponent_digits = 0;
    while (i < s.size() && absl::ascii_isdigit(s[i])) ++i, ++exponent_digits;
    if (exponent_digits == 0) return false;
  }
  return i == s.size();
}

std::optional<double> ParseFloatText(absl::string_view s) {
  static const std::set<std::string> kInf = {".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"};
  static const std::set<std::string> kNegInf = {"-.inf", "-.Inf", "-.INF"};
  static const std::set<std::string> kNan = {".nan", ".NaN", ".NAN"};
  const std::string text(s);
  if (kInf.count(text)) return std::numeric_limits<double>::infinity();
  if (kNegInf.count(text)) return -std::numeric_limits<double>::infinity();
  if (kNan.count(text)) return std::numeric_limits<double>::quiet_NaN();
  double value;
  if (!LooksLikeDecimal(s) || !absl::SimpleAtod(s, &value)) return std::nullopt;
  return value;
}

absl::StatusOr<double> ReadDouble(const YAML::Node& node, absl::string_view key) {
  if (!node.IsScalar() || IsQuoted(node)) return TypeError(key, "a number", node);
  std::optional<double> value = ParseFloatText(node.Scalar());
  if (!value) return TypeError(key, "a number", node);
  return *value;
}

absl::StatusOr<int64_t> ReadInt(const YAML::Node& node, absl::string_view key) {
  if (!node.IsScalar() || IsQuoted(node)) return TypeError(key, "an integer", node);
  const std::string& text = node.Scalar();
  int64_t value;
  if (LooksLikeInt(text)) {
    if (!absl::SimpleAtoi(text, &value)) return TypeError(key, "an integer in range", node);
    return value;
  }
  // Python writes ints that went through float arithmetic as "2048.0"; accept whole numbers.
  std::optional<double> d = ParseFloatText(text);
  constexpr double kExact = 9007199254740992.0;  // 2^53: every integer up to it is a double.
  if (!d || !std::isfinite(*d) || *d != std::floor(*d) || std::fabs(*d) > kExact) {
    return TypeError(key, "an integer", node);
  }
  return static_cast<int64_t>(*d);
}

absl::StatusOr<bool> ReadBool(const YAML::Node& node, absl::string_view key) {
  static const std::set<std::string> kTrue = {"true", "True", "TRUE", "yes", "Yes",
                                              "YES",  "on",   "On",   "ON"};
  static const std::set<std::string> kFalse = {"false", "False", "FALSE", "no", "No",
                                               "NO",    "off",   "Off",   "OFF"};
  if (!node.IsScalar() || IsQuoted(node)) return TypeError(key, "true or false", node);
  if (kTrue.count(node.Scalar())) return true;
  if (kFalse.count(node.Scalar())) return false;
  return TypeError(key, "true or false", node);
}

absl::StatusOr<std::string> ReadString(const YAML::Node& node, absl::string_view key) {
  if (!node.IsScalar()) return TypeError(key, "a string", node);
  return node.Scalar();
}

template <typename T, typename Reader>
absl::StatusOr<std::optional<T>> ReadOptional(const YAML::Node& node, absl::string_view key,
                                              Reader reader) {
  if (node.IsNull()) return std::optional<T>();
  ASSIGN_OR_RETURN(T value, reader(node, key));
  return std::optional<T>(std::move(value));
}

absl::StatusOr<std::optional<std::vector<int>>> ReadIndices(const YAML::Node& node,
                                                            absl::string_view key) {
  if (node.IsNull()) return std::optional<std::vector<int>>();
  if (!node.IsSequence()) return TypeError(key, "a list of integers", node);
  std::vector<int> values;
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string element_key = absl::StrCat(key, "[", i, "]");
    ASSIGN_OR_RETURN(int64_t value, ReadInt(node[i], element_key));
    if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) {
      return TypeError(element_key, "a small integer", node[i]);
    }
    values.push_back(static_cast<int>(value));
  }
  return std::optional<std::vector<int>>(std::move(values));
}

// ---------------------------------------------------------------------------------------------
// Writing: the text PyYAML's yaml.dump would give, so that LitGPT reads back the same values.

// Shortest text that reads back as exactly `v`, in PyYAML's float syntax (it needs a '.' in
// the mantissa, else "1e-05" would be a string to it).
std::string FormatFloat(double v) {
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  if (v == std::floor(v) && std::fabs(v) < 1e16) return absl::StrFormat("%.1f", v);
  std::string text;
  for (int precision = 1; precision <= 17; ++precision) {
    text = absl::StrFormat("%.*g", precision, v);
    double back;
    if (absl::SimpleAtod(text, &back) && back == v) break;
  }
  if (text.find('.') == std::string::npos) {
    const size_t e = text.find('e');
    text.insert(e == std::string::npos ? text.size() : e, ".0");
  }
  return text;
}

// For values LitGPT types as int but this config keeps as double (rope_base, ...): whole
// numbers are written as ints, like LitGPT's own files.
std::string FormatIntLike(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e16) {
    return absl::StrFormat("%.0f", v);
  }
  return FormatFloat(v);
}

std::string FormatBool(bool v) { return v ? "true" : "false"; }

// Plain when PyYAML would read the text back as this same string, double-quoted otherwise.
std::string FormatString(absl::string_view s) {
  static const std::set<std::string> kSpecial = {
      "",      "~",   "null", "Null", "NULL", "true", "True", "TRUE", "false", "False",
      "FALSE", "yes", "Yes",  "YES",  "no",   "No",   "NO",   "on",   "On",    "ON",
      "off",   "Off", "OFF",  "y",    "Y",    "n",    "N",    "<<",   "=",
  };
  bool plain = !s.empty() && absl::ascii_isalpha(s[0]) && !kSpecial.count(std::string(s));
  for (char ch : s) {
    if (!(absl::ascii_isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '/')) {
      plain = false;
    }
  }
  if (plain) return std::string(s);
  std::string out = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (ch < 0x20 || ch == 0x7f) {
          out += absl::StrFormat("\\x%02x", ch);
        } else {
          out += static_cast<char>(ch);  // UTF-8 passes through.
        }
    }
  }
  return out + "\"";
}

template <typename T, typename Format>
std::string FormatOptional(const std::optional<T>& v, Format format) {
  return v ? format(*v) : "null";
}

// ---------------------------------------------------------------------------------------------
// The plain typed members, by their LitGPT key. Keys with structure or enums (name, hf_config,
// *_class_name, norm_qk_type, gelu_approximate, rope_adjustments, latent_attention and the two
// index lists) are handled by hand below.

enum class Group { kModel, kLora, kAdapter };

struct Field {
  const char* key;
  std::variant<int64_t Config::*, std::optional<int64_t> Config::*, double Config::*,
               std::optional<double> Config::*, bool Config::*>
      member;
  bool int_like = false;  // A double that LitGPT types as int.
  Group group = Group::kModel;
};

const std::vector<Field>& Fields() {
  static const auto* fields = new std::vector<Field>{
      {"adapter_prompt_length", &Config::adapter_prompt_length, false, Group::kAdapter},
      {"adapter_start_layer", &Config::adapter_start_layer, false, Group::kAdapter},
      {"attention_logit_softcapping", &Config::attention_logit_softcapping},
      {"attention_scores_scalar", &Config::attention_scores_scalar, true},
      {"attn_bias", &Config::attn_bias},
      {"bias", &Config::bias},
      {"block_size", &Config::block_size},
      {"final_logit_softcapping", &Config::final_logit_softcapping},
      {"first_k_dense_replace", &Config::first_k_dense_replace},
      {"head_size", &Config::head_size},
      {"intermediate_size", &Config::intermediate_size},
      {"lm_head_bias", &Config::lm_head_bias},
      {"lora_alpha", &Config::lora_alpha, true, Group::kLora},
      {"lora_dropout", &Config::lora_dropout, false, Group::kLora},
      {"lora_head", &Config::lora_head, false, Group::kLora},
      {"lora_key", &Config::lora_key, false, Group::kLora},
      {"lora_mlp", &Config::lora_mlp, false, Group::kLora},
      {"lora_projection", &Config::lora_projection, false, Group::kLora},
      {"lora_query", &Config::lora_query, false, Group::kLora},
      {"lora_r", &Config::lora_r, false, Group::kLora},
      {"lora_value", &Config::lora_value, false, Group::kLora},
      {"moe_intermediate_size", &Config::moe_intermediate_size},
      {"n_embd", &Config::n_embd},
      {"n_expert", &Config::n_expert},
      {"n_expert_groups", &Config::n_expert_groups},
      {"n_expert_per_token", &Config::n_expert_per_token},
      {"n_head", &Config::n_head},
      {"n_layer", &Config::n_layer},
      {"n_query_groups", &Config::n_query_groups},
      {"n_shared_expert", &Config::n_shared_expert},
      {"n_topk_groups", &Config::n_topk_groups},
      {"n_topk_scores_per_group", &Config::n_topk_scores_per_group},
      {"norm_1", &Config::norm_1},
      {"norm_2", &Config::norm_2},
      {"norm_eps", &Config::norm_eps},
      {"norm_qk", &Config::norm_qk},
      {"norm_topk_prob", &Config::norm_topk_prob},
      {"padded_vocab_size", &Config::padded_vocab_size},
      {"padding_multiple", &Config::padding_multiple},
      {"parallel_residual", &Config::parallel_residual},
      {"post_attention_norm", &Config::post_attention_norm},
      {"post_mlp_norm", &Config::post_mlp_norm},
      {"rope_base", &Config::rope_base, true},
      {"rope_condense_ratio", &Config::rope_condense_ratio},
      {"rope_interleave", &Config::rope_interleave},
      {"rope_local_base_freq", &Config::rope_local_base_freq},
      {"rotary_percentage", &Config::rotary_percentage},
      {"routed_scaling_factor", &Config::routed_scaling_factor},
      {"scale_embeddings", &Config::scale_embeddings},
      {"shared_attention_norm", &Config::shared_attention_norm},
      {"sliding_window_size", &Config::sliding_window_size},
      {"vocab_size", &Config::vocab_size},
  };
  return *fields;
}

// Overload set for std::visit.
template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

absl::Status ReadField(const Field& field, const YAML::Node& node, Config& config) {
  const absl::string_view key = field.key;
  return std::visit(Overloaded{
                        [&](int64_t Config::*m) -> absl::Status {
                          ASSIGN_OR_RETURN(config.*m, ReadInt(node, key));
                          return absl::OkStatus();
                        },
                        [&](std::optional<int64_t> Config::*m) -> absl::Status {
                          ASSIGN_OR_RETURN(config.*m, ReadOptional<int64_t>(node, key, ReadInt));
                          return absl::OkStatus();
                        },
                        [&](double Config::*m) -> absl::Status {
                          ASSIGN_OR_RETURN(config.*m, ReadDouble(node, key));
                          return absl::OkStatus();
                        },
                        [&](std::optional<double> Config::*m) -> absl::Status {
                          ASSIGN_OR_RETURN(config.*m, ReadOptional<double>(node, key, ReadDouble));
                          return absl::OkStatus();
                        },
                        [&](bool Config::*m) -> absl::Status {
                          ASSIGN_OR_RETURN(config.*m, ReadBool(node, key));
                          return absl::OkStatus();
                        },
                    },
                    field.member);
}

std::string FormatField(const Field& field, const Config& config) {
  const auto format_double = [&](double v) {
    return field.int_like ? FormatIntLike(v) : FormatFloat(v);
  };
  const auto format_int = [](int64_t v) { return absl::StrCat(v); };
  return std::visit(
      Overloaded{
          [&](int64_t Config::*m) { return format_int(config.*m); },
          [&](std::optional<int64_t> Config::*m) { return FormatOptional(config.*m, format_int); },
          [&](double Config::*m) { return format_double(config.*m); },
          [&](std::optional<double> Config::*m) {
            return FormatOptional(config.*m, format_double);
          },
          [&](bool Config::*m) { return FormatBool(config.*m); },
      },
      field.member);
}

bool FieldIsDefault(const Field& field, const Config& config) {
  static const Config* const kDefaults = new Config();
  return std::visit([&](auto m) { return config.*m == kDefaults->*m; }, field.member);
}

// ---------------------------------------------------------------------------------------------
// Enums.

constexpr std::pair<NormClass, const char*> kNormClasses[] = {
    {NormClass::kLayerNorm, "LayerNorm"},
    {NormClass::kRMSNorm, "RMSNorm"},
};
constexpr std::pair<MlpClass, const char*> kMlpClasses[] = {
    {MlpClass::kGptNeoxMLP, "GptNeoxMLP"},
    {MlpClass::kLLaMAMLP, "LLaMAMLP"},
    {MlpClass::kGemmaMLP, "GemmaMLP"},
    {MlpClass::kLLaMAMoE, "LLaMAMoE"},
};
constexpr std::pair<NormQkType, const char*> kNormQkTypes[] = {
    {NormQkType::kDefault, "default"},
    {NormQkType::kOlmo2, "olmo2"},
};

template <typename Enum, size_t N>
absl::string_view EnumName(const std::pair<Enum, const char*> (&table)[N], Enum value) {
  for (const auto& [e, name] : table) {
    if (e == value) return name;
  }
  return "?";
}

template <typename Enum, size_t N>
absl::StatusOr<Enum> ReadEnum(const std::pair<Enum, const char*> (&table)[N],
                              const YAML::Node& node, absl::string_view key) {
  std::vector<std::string> names;
  for (const auto& [e, name] : table) names.push_back(absl::StrCat("'", name, "'"));
  const std::string expected = absl::StrCat("one of ", absl::StrJoin(names, ", "));
  if (!node.IsScalar()) return TypeError(key, expected, node);
  for (const auto& [e, name] : table) {
    if (node.Scalar() == name) return e;
  }
  return TypeError(key, expected, node);
}

absl::string_view NormQkTypeName(NormQkType t) { return EnumName(kNormQkTypes, t); }

// ---------------------------------------------------------------------------------------------
// rope_adjustments.

struct RopeKey {
  const char* key;
  std::optional<double> RopeAdjustments::*member;
  bool int_like;
};
constexpr RopeKey kRopeKeys[] = {
    {"beta_fast", &RopeAdjustments::beta_fast, false},
    {"beta_slow", &RopeAdjustments::beta_slow, false},
    {"factor", &RopeAdjustments::factor, false},
    {"high_freq_factor", &RopeAdjustments::high_freq_factor, false},
    {"low_freq_factor", &RopeAdjustments::low_freq_factor, false},
    {"mscale", &RopeAdjustments::mscale, false},
    {"mscale_all_dim", &RopeAdjustments::mscale_all_dim, false},
    {"original_max_seq_len", &RopeAdjustments::original_max_seq_len, true},
};

absl::Status ReadRopeAdjustments(const YAML::Node& node, Config& config) {
  if (node.IsNull()) {
    config.rope_adjustments.reset();
    return absl::OkStatus();
  }
  if (!node.IsMap()) return TypeError("rope_adjustments", "a mapping or null", node);
  RopeAdjustments adjustments;
  std::set<std::string> seen;
  for (const auto& entry : node) {
    if (!entry.first.IsScalar()) return TypeError("rope_adjustments", "string keys", entry.first);
    const std::string& name = entry.first.Scalar();
    const std::string key = absl::StrCat("rope_adjustments.", name);
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate key ", key, Where(entry.first)));
    }
    if (name == "truncate") {
      ASSIGN_OR_RETURN(adjustments.truncate, ReadOptional<bool>(entry.second, key, ReadBool));
      continue;
    }
    const RopeKey* known = nullptr;
    for (const RopeKey& rope_key : kRopeKeys) {
      if (name == rope_key.key) known = &rope_key;
    }
    if (known == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown key ", key, Where(entry.first)));
    }
    ASSIGN_OR_RETURN(adjustments.*(known->member),
                     ReadOptional<double>(entry.second, key, ReadDouble));
  }
  config.rope_adjustments = adjustments;
  return absl::OkStatus();
}

std::string FormatRopeAdjustments(const std::optional<RopeAdjustments>& adjustments) {
  if (!adjustments) return "null";
  std::vector<std::pair<std::string, std::string>> entries;
  for (const RopeKey& rope_key : kRopeKeys) {
    const std::optional<double>& v = (*adjustments).*(rope_key.member);
    if (v)
      entries.emplace_back(rope_key.key, rope_key.int_like ? FormatIntLike(*v) : FormatFloat(*v));
  }
  if (adjustments->truncate) entries.emplace_back("truncate", FormatBool(*adjustments->truncate));
  if (entries.empty()) return "{}";
  std::sort(entries.begin(), entries.end());
  std::string out;
  for (const auto& [k, v] : entries) absl::StrAppend(&out, "\n  ", k, ": ", v);
  return out;
}

// ---------------------------------------------------------------------------------------------
// hf_config.

absl::Status ReadHfConfig(const YAML::Node& node, Config& config) {
  config.hf_org.clear();
  config.hf_name.clear();
  if (node.IsNull()) return absl::OkStatus();
  if (!node.IsMap()) return TypeError("hf_config", "a mapping", node);
  for (const auto& entry : node) {
    if (!entry.first.IsScalar()) return TypeError("hf_config", "string keys", entry.first);
    const std::string& name = entry.first.Scalar();
    const std::string key = absl::StrCat("hf_config.", name);
    if (name == "org") {
      ASSIGN_OR_RETURN(config.hf_org, ReadString(entry.second, key));
    } else if (name == "name") {
      ASSIGN_OR_RETURN(config.hf_name, ReadString(entry.second, key));
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown key ", key, Where(entry.first)));
    }
  }
  return absl::OkStatus();
}

std::string FormatHfConfig(const Config& config) {
  std::string out;
  if (!config.hf_name.empty()) absl::StrAppend(&out, "\n  name: ", FormatString(config.hf_name));
  if (!config.hf_org.empty()) absl::StrAppend(&out, "\n  org: ", FormatString(config.hf_org));
  return out.empty() ? "{}" : out;
}

std::string FormatIndices(const std::optional<std::vector<int>>& indices) {
  if (!indices) return "null";
  if (indices->empty()) return "[]";
  std::string out;
  for (int v : *indices) absl::StrAppend(&out, "\n- ", v);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Parsing a whole document.

absl::Status ReadKey(const YAML::Node& key_node, const YAML::Node& value, Config& config) {
  const std::string& key = key_node.Scalar();
  for (const Field& field : Fields()) {
    if (key == field.key) return ReadField(field, value, config);
  }
  if (key == "name") {
    if (value.IsNull()) {
      config.name.clear();
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(config.name, ReadString(value, key));
  } else if (key == "hf_config") {
    return ReadHfConfig(value, config);
  } else if (key == "norm_class_name") {
    ASSIGN_OR_RETURN(config.norm_class, ReadEnum(kNormClasses, value, key));
  } else if (key == "mlp_class_name") {
    ASSIGN_OR_RETURN(config.mlp_class, ReadEnum(kMlpClasses, value, key));
  } else if (key == "norm_qk_type") {
    ASSIGN_OR_RETURN(config.norm_qk_type, ReadEnum(kNormQkTypes, value, key));
  } else if (key == "gelu_approximate") {
    ASSIGN_OR_RETURN(config.gelu_approximate, ReadString(value, key));
    if (config.gelu_approximate != "none" && config.gelu_approximate != "tanh") {
      return TypeError(key, "'none' or 'tanh'", value);
    }
  } else if (key == "rope_adjustments") {
    return ReadRopeAdjustments(value, config);
  } else if (key == "latent_attention") {
    if (!value.IsNull() && !value.IsMap()) {
      return TypeError(key, "a mapping or null", value);
    }
    config.has_latent_attention = !value.IsNull();
  } else if (key == "sliding_window_indices") {
    ASSIGN_OR_RETURN(config.sliding_window_indices, ReadIndices(value, key));
  } else if (key == "rope_indices") {
    ASSIGN_OR_RETURN(config.rope_indices, ReadIndices(value, key));
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown key '", key, "'", Where(key_node)));
  }
  return absl::OkStatus();
}

absl::Status WithSource(const absl::Status& status, absl::string_view source) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(source, ": ", status.message()));
}

// Counts documents and remembers where each starts, building nothing.
class DocumentCounter : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

  std::vector<YAML::Mark> starts;
};

absl::StatusOr<Config> ParseDocument(absl::string_view yaml_text, absl::string_view source) {
  const std::string text(yaml_text);
  // Not YAML::LoadAll: in yaml-cpp 0.7 it never stops on some malformed input (a leading ',')
  // and allocates until memory runs out. Two documents are enough to know there are too many.
  std::istringstream stream(text);
  YAML::Parser parser(stream);
  DocumentCounter counter;
  while (counter.starts.size() < 2 && parser.HandleNextDocument(counter)) {
  }
  if (counter.starts.size() > 1) {
    const YAML::Mark& second = counter.starts[1];
    if (second.pos == counter.starts[0].pos) {  // The parser made no progress.
      return absl::InvalidArgumentError(absl::StrCat(source, ": malformed yaml: line ",
                                                     second.line + 1, ", column ",
                                                     second.column + 1, ": unexpected token"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected one yaml document, found more (line ", second.line + 1,
                     ", column ", second.column + 1, ")"));
  }
  const YAML::Node root = YAML::Load(text);
  if (counter.starts.empty() || root.IsNull()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": the config is empty"));
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected a mapping of config keys at the top level, got ",
                     Describe(root), Where(root)));
  }
  Config config;
  std::set<std::string> seen;
  for (const auto& entry : root) {
    const YAML::Node& key_node = entry.first;
    if (!key_node.IsScalar()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": a config key must be a string, got ", Describe(key_node), Where(key_node)));
    }
    const std::string& key = key_node.Scalar();
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": duplicate key '", key, "'", Where(key_node)));
    }
    RETURN_IF_ERROR(WithSource(ReadKey(key_node, entry.second, config), source));
  }
  RETURN_IF_ERROR(WithSource(config.Finalize(), source));
  return config;
}

// ---------------------------------------------------------------------------------------------
// Finalize() checks.

absl::Status AtLeast(absl::string_view key, int64_t value, int64_t minimum) {
  if (value >= minimum) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(key, " (", value, ") must be at least ", minimum));
}

// Far above any real model, low enough that derived sizes (4 * n_embd, per-layer lists, ...)
// can neither overflow nor exhaust memory.
constexpr int64_t kMaxLayers = int64_t{1} << 20;
constexpr int64_t kMaxSize = int64_t{1} << 40;

absl::Status InRange(absl::string_view key, int64_t value, int64_t minimum, int64_t maximum) {
  RETURN_IF_ERROR(AtLeast(key, value, minimum));
  if (value <= maximum) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(key, " (", value, ") must be at most ", maximum));
}

absl::Status OptionalAtLeast(absl::string_view key, const std::optional<int64_t>& value,
                             int64_t minimum) {
  return value ? AtLeast(key, *value, minimum) : absl::OkStatus();
}

absl::Status Finite(absl::string_view key, double value) {
  if (std::isfinite(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(key, " (", value, ") must be a finite number"));
}

absl::Status Positive(absl::string_view key, double value) {
  RETURN_IF_ERROR(Finite(key, value));
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(key, " (", value, ") must be positive"));
}

absl::Status OptionalPositive(absl::string_view key, const std::optional<double>& value) {
  return value ? Positive(key, *value) : absl::OkStatus();
}

// LitGPT's check_indicator_and_length: missing means every layer; longer lists are cut to
// n_layer; shorter lists and values other than 0/1 are errors.
absl::Status CheckIndicator(absl::string_view key, std::optional<std::vector<int>>& indices,
                            int64_t n_layer) {
  if (!indices) {
    indices = std::vector<int>(n_layer, 1);
    return absl::OkStatus();
  }
  if (static_cast<int64_t>(indices->size()) < n_layer) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, " has ", indices->size(), " entries, must have n_layer (", n_layer, ")"));
  }
  indices->resize(n_layer);
  for (size_t i = 0; i < indices->size(); ++i) {
    if ((*indices)[i] != 0 && (*indices)[i] != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, "[", i, "] is ", (*indices)[i], ", must be 0 or 1"));
    }
  }
  return absl::OkStatus();
}

// model.py's rope_cache(): which keys select which RoPE variant, and what each one needs.
absl::Status CheckRopeAdjustments(const RopeAdjustments& r) {
  for (const RopeKey& rope_key : kRopeKeys) {
    const std::optional<double>& v = r.*(rope_key.member);
    if (v) RETURN_IF_ERROR(Finite(absl::StrCat("rope_adjustments.", rope_key.key), *v));
  }
  const auto missing = [&](std::initializer_list<const char*> keys) {
    std::vector<std::string> names;
    for (const char* key : keys) {
      for (const RopeKey& rope_key : kRopeKeys) {
        if (absl::string_view(key) == rope_key.key && !(r.*(rope_key.member))) {
          names.push_back(key);
        }
      }
    }
    return absl::StrJoin(names, ", ");
  };
  if (r.IsLlama3() && r.IsYarn()) {
    return absl::InvalidArgumentError(
        "rope_adjustments mixes Llama 3 keys (low_freq_factor, high_freq_factor) with YaRN keys "
        "(beta_fast, beta_slow); they are mutually exclusive");
  }
  if (r.IsLlama3()) {
    const std::string absent =
        missing({"factor", "low_freq_factor", "high_freq_factor", "original_max_seq_len"});
    if (!absent.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rope_adjustments lacks the Llama 3 keys: ", absent));
    }
    if (*r.low_freq_factor == *r.high_freq_factor) {
      return absl::InvalidArgumentError(
          absl::StrCat("rope_adjustments.low_freq_factor and high_freq_factor (",
                       *r.low_freq_factor, ") must differ"));
    }
  } else if (r.IsYarn()) {
    const std::string absent =
        missing({"factor", "beta_fast", "beta_slow", "original_max_seq_len"});
    if (!absent.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rope_adjustments lacks the YaRN keys: ", absent));
    }
  }
  if (r.factor) RETURN_IF_ERROR(Positive("rope_adjustments.factor", *r.factor));
  if ((r.IsLlama3() || r.IsYarn()) && r.original_max_seq_len) {
    RETURN_IF_ERROR(Positive("rope_adjustments.original_max_seq_len", *r.original_max_seq_len));
  }
  return absl::OkStatus();
}

// LitGPT's find_multiple.
int64_t RoundUpToMultiple(int64_t n, int64_t k) { return n % k == 0 ? n : n + k - n % k; }

}  // namespace

// ---------------------------------------------------------------------------------------------

absl::string_view NormClassName(NormClass c) { return EnumName(kNormClasses, c); }
absl::string_view MlpClassName(MlpClass c) { return EnumName(kMlpClasses, c); }

absl::Status Config::Finalize() {
  if (has_latent_attention) {
    return absl::UnimplementedError(
        "multi-head latent attention is not supported (latent_attention is set)");
  }
  if (name.empty()) name = hf_name;

  RETURN_IF_ERROR(FinalizeSizes());
  RETURN_IF_ERROR(FinalizeRope());
  RETURN_IF_ERROR(CheckAttentionAndBlock());
  RETURN_IF_ERROR(CheckExperts());
  RETURN_IF_ERROR(CheckPeft());
  return absl::OkStatus();
}

absl::Status Config::FinalizeSizes() {
  RETURN_IF_ERROR(InRange("n_layer", n_layer, 1, kMaxLayers));
  RETURN_IF_ERROR(InRange("n_embd", n_embd, 1, kMaxSize));
  RETURN_IF_ERROR(InRange("n_head", n_head, 1, kMaxSize));
  RETURN_IF_ERROR(InRange("vocab_size", vocab_size, 1, kMaxSize));
  RETURN_IF_ERROR(InRange("block_size", block_size, 1, kMaxSize));
  RETURN_IF_ERROR(InRange("padding_multiple", padding_multiple, 1, kMaxSize));

  if (!head_size) {
    if (n_embd % n_head != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "n_embd (", n_embd, ") is not divisible by n_head (", n_head, "); set head_size"));
    }
    head_size = n_embd / n_head;
  }
  RETURN_IF_ERROR(InRange("head_size", *head_size, 1, kMaxSize));

  if (!padded_vocab_size) {
    padded_vocab_size = RoundUpToMultiple(vocab_size, padding_multiple);
  } else {
    RETURN_IF_ERROR(InRange("padded_vocab_size", *padded_vocab_size, 1, kMaxSize));
    vocab_size = std::min(vocab_size, *padded_vocab_size);
  }

  if (n_query_groups) {
    RETURN_IF_ERROR(AtLeast("n_query_groups", *n_query_groups, 1));
    if (n_head % *n_query_groups != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "n_head (", n_head, ") is not divisible by n_query_groups (", *n_query_groups, ")"));
    }
  } else {
    n_query_groups = n_head;
  }

  if (!intermediate_size) {
    // Only LLaMAMLP insists, as in LitGPT; the other MLPs default to 4 * n_embd.
    if (mlp_class == MlpClass::kLLaMAMLP) {
      return absl::InvalidArgumentError(absl::StrCat(
          "intermediate_size must be set for mlp_class_name LLaMAMLP (config '", name, "')"));
    }
    intermediate_size = 4 * n_embd;
  }
  RETURN_IF_ERROR(InRange("intermediate_size", *intermediate_size, 1, kMaxSize));
  return absl::OkStatus();
}

absl::Status Config::FinalizeRope() {
  RETURN_IF_ERROR(Finite("rotary_percentage", rotary_percentage));
  if (rotary_percentage < 0 || rotary_percentage > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("rotary_percentage (", rotary_percentage, ") must be in [0, 1]"));
  }
  // int(rotary_percentage * head_size) in Python: the same double product, truncated.
  rope_n_elem = static_cast<int64_t>(rotary_percentage * static_cast<double>(*head_size));
  if (rope_n_elem > 0 && rope_n_elem % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rotary_percentage (", rotary_percentage, ") times head_size (", *head_size,
                     ") gives an odd number of rotary dimensions (", rope_n_elem, ")"));
  }
  RETURN_IF_ERROR(Positive("rope_base", rope_base));
  RETURN_IF_ERROR(AtLeast("rope_condense_ratio", rope_condense_ratio, 1));
  RETURN_IF_ERROR(Finite("norm_eps", norm_eps));
  if (norm_eps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("norm_eps (", norm_eps, ") must be >= 0"));
  }
  if (rope_adjustments) RETURN_IF_ERROR(CheckRopeAdjustments(*rope_adjustments));

  if (sliding_window_size) {
    RETURN_IF_ERROR(AtLeast("sliding_window_size", *sliding_window_size, 1));
    RETURN_IF_ERROR(CheckIndicator("sliding_window_indices", sliding_window_indices, n_layer));
  }
  if (rope_local_base_freq) {
    RETURN_IF_ERROR(Positive("rope_local_base_freq", *rope_local_base_freq));
    RETURN_IF_ERROR(CheckIndicator("rope_indices", rope_indices, n_layer));
  }
  return absl::OkStatus();
}

absl::Status Config::CheckAttentionAndBlock() {
  RETURN_IF_ERROR(OptionalPositive("attention_scores_scalar", attention_scores_scalar));
  RETURN_IF_ERROR(OptionalPositive("attention_logit_softcapping", attention_logit_softcapping));
  RETURN_IF_ERROR(OptionalPositive("final_logit_softcapping", final_logit_softcapping));
  if (gelu_approximate != "none" && gelu_approximate != "tanh") {
    return absl::InvalidArgumentError(
        absl::StrCat("gelu_approximate ('", gelu_approximate, "') must be 'none' or 'tanh'"));
  }
  if (!parallel_residual && shared_attention_norm) {
    // LitGPT's Block raises NotImplementedError: no checkpoint uses this combination.
    return absl::InvalidArgumentError(
        "shared_attention_norm (true) needs parallel_residual (false given)");
  }
  return absl::OkStatus();
}

absl::Status Config::CheckExperts() {
  RETURN_IF_ERROR(InRange("n_expert", n_expert, 0, kMaxSize));
  RETURN_IF_ERROR(AtLeast("n_expert_per_token", n_expert_per_token, 0));
  if (moe_intermediate_size) {
    RETURN_IF_ERROR(InRange("moe_intermediate_size", *moe_intermediate_size, 1, kMaxSize));
  }
  RETURN_IF_ERROR(OptionalAtLeast("n_shared_expert", n_shared_expert, 0));
  RETURN_IF_ERROR(Finite("routed_scaling_factor", routed_scaling_factor));
  if (mlp_class == MlpClass::kLLaMAMoE) {
    RETURN_IF_ERROR(AtLeast("n_expert", n_expert, 1));
    if (n_expert_per_token < 1 || n_expert_per_token > n_expert) {
      return absl::InvalidArgumentError(absl::StrCat("n_expert_per_token (", n_expert_per_token,
                                                     ") must be in [1, n_expert (", n_expert,
                                                     ")]"));
    }
    // Shared experts are sized moe_intermediate_size * n_shared_expert.
    if (n_shared_expert.value_or(0) > 0 && !moe_intermediate_size) {
      return absl::InvalidArgumentError("n_shared_expert needs moe_intermediate_size");
    }
  }
  if (first_k_dense_replace) {
    RETURN_IF_ERROR(AtLeast("first_k_dense_replace", *first_k_dense_replace, 0));
    if (mlp_class != MlpClass::kLLaMAMoE) {
      return absl::InvalidArgumentError(
          absl::StrCat("first_k_dense_replace (", *first_k_dense_replace,
                       ") needs mlp_class_name LLaMAMoE, not ", MlpClassName(mlp_class)));
    }
  }
  if (n_expert_groups) {
    if (*n_expert_groups < 2 || n_expert % *n_expert_groups != 0) {
      return absl::InvalidArgumentError(absl::StrCat("n_expert_groups (", *n_expert_groups,
                                                     ") must be more than 1 and divide n_expert (",
                                                     n_expert, ")"));
    }
    if (!n_topk_groups) {
      return absl::InvalidArgumentError("n_expert_groups needs n_topk_groups");
    }
    RETURN_IF_ERROR(AtLeast("n_topk_groups", *n_topk_groups, 1));
    if (*n_topk_groups > *n_expert_groups) {
      return absl::InvalidArgumentError(absl::StrCat(
          "n_topk_groups (", *n_topk_groups, ") exceeds n_expert_groups (", *n_expert_groups, ")"));
    }
    const int64_t experts_per_group = n_expert / *n_expert_groups;
    if (!n_topk_scores_per_group || *n_topk_scores_per_group < 1 ||
        *n_topk_scores_per_group > experts_per_group) {
      return absl::InvalidArgumentError(
          absl::StrCat("n_topk_scores_per_group (",
                       n_topk_scores_per_group ? absl::StrCat(*n_topk_scores_per_group) : "null",
                       ") must be in [1, n_expert / n_expert_groups (", experts_per_group, ")]"));
    }
  }
  return absl::OkStatus();
}

absl::Status Config::CheckPeft() {
  RETURN_IF_ERROR(AtLeast("lora_r", lora_r, 0));
  RETURN_IF_ERROR(Finite("lora_alpha", lora_alpha));
  RETURN_IF_ERROR(Finite("lora_dropout", lora_dropout));
  if (lora_dropout < 0 || lora_dropout >= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora_dropout (", lora_dropout, ") must be in [0, 1)"));
  }
  RETURN_IF_ERROR(OptionalAtLeast("adapter_prompt_length", adapter_prompt_length, 1));
  RETURN_IF_ERROR(OptionalAtLeast("adapter_start_layer", adapter_start_layer, 0));
  return absl::OkStatus();
}

bool Config::NormUnitOffset() const {
  return norm_class == NormClass::kRMSNorm && absl::StrContains(name, "Gemma");
}

bool Config::NormHasAffine() const {
  return !(norm_class == NormClass::kLayerNorm && absl::StrContains(name, "OLMo"));
}

bool Config::IsSlidingWindowLayer(int64_t layer) const {
  return sliding_window_size && sliding_window_indices && layer >= 0 &&
         layer < static_cast<int64_t>(sliding_window_indices->size()) &&
         (*sliding_window_indices)[layer] != 0;
}

bool Config::UsesLocalRope(int64_t layer) const {
  return rope_local_base_freq && rope_indices && layer >= 0 &&
         layer < static_cast<int64_t>(rope_indices->size()) && (*rope_indices)[layer] != 0;
}

double Config::AttentionScale() const {
  const double scores_scalar = attention_scores_scalar.value_or(0);
  // Python's `attention_scores_scalar or head_size`: zero counts as unset.
  const double denominator =
      scores_scalar != 0 ? scores_scalar : static_cast<double>(head_size.value_or(0));
  double mscale = 1.0;
  if (rope_adjustments) {
    const double factor = rope_adjustments->factor.value_or(0);
    const double mscale_all_dim = rope_adjustments->mscale_all_dim.value_or(0);
    // model.py's yarn_get_mscale(factor, mscale_all_dim), used when both are truthy.
    if (factor != 0 && mscale_all_dim != 0 && factor > 1) {
      mscale = 0.1 * mscale_all_dim * std::log(factor) + 1.0;
    }
  }
  return 1.0 / std::sqrt(denominator) * mscale * mscale;
}

bool operator==(const RopeAdjustments& a, const RopeAdjustments& b) {
  return a.factor == b.factor && a.low_freq_factor == b.low_freq_factor &&
         a.high_freq_factor == b.high_freq_factor &&
         a.original_max_seq_len == b.original_max_seq_len && a.beta_fast == b.beta_fast &&
         a.beta_slow == b.beta_slow && a.mscale == b.mscale &&
         a.mscale_all_dim == b.mscale_all_dim && a.truncate == b.truncate;
}

bool operator==(const Config& a, const Config& b) {
  return a.name == b.name && a.hf_org == b.hf_org && a.hf_name == b.hf_name &&
         a.block_size == b.block_size && a.n_layer == b.n_layer && a.n_embd == b.n_embd &&
         a.vocab_size == b.vocab_size && a.padding_multiple == b.padding_multiple &&
         a.padded_vocab_size == b.padded_vocab_size && a.norm_class == b.norm_class &&
         a.norm_eps == b.norm_eps && a.norm_qk == b.norm_qk && a.norm_qk_type == b.norm_qk_type &&
         a.post_attention_norm == b.post_attention_norm && a.post_mlp_norm == b.post_mlp_norm &&
         a.parallel_residual == b.parallel_residual &&
         a.shared_attention_norm == b.shared_attention_norm && a.n_head == b.n_head &&
         a.head_size == b.head_size && a.n_query_groups == b.n_query_groups &&
         a.attn_bias == b.attn_bias && a.attention_scores_scalar == b.attention_scores_scalar &&
         a.sliding_window_size == b.sliding_window_size &&
         a.sliding_window_indices == b.sliding_window_indices &&
         a.attention_logit_softcapping == b.attention_logit_softcapping &&
         a.rope_base == b.rope_base && a.rotary_percentage == b.rotary_percentage &&
         a.rope_condense_ratio == b.rope_condense_ratio &&
         a.rope_adjustments == b.rope_adjustments && a.rope_interleave == b.rope_interleave &&
         a.rope_local_base_freq == b.rope_local_base_freq && a.rope_indices == b.rope_indices &&
         a.intermediate_size == b.intermediate_size &&
         a.moe_intermediate_size == b.moe_intermediate_size && a.bias == b.bias &&
         a.mlp_class == b.mlp_class && a.gelu_approximate == b.gelu_approximate &&
         a.n_expert == b.n_expert && a.n_shared_expert == b.n_shared_expert &&
         a.n_expert_groups == b.n_expert_groups && a.n_topk_groups == b.n_topk_groups &&
         a.n_topk_scores_per_group == b.n_topk_scores_per_group &&
         a.n_expert_per_token == b.n_expert_per_token &&
         a.first_k_dense_replace == b.first_k_dense_replace &&
         a.routed_scaling_factor == b.routed_scaling_factor &&
         a.norm_topk_prob == b.norm_topk_prob && a.scale_embeddings == b.scale_embeddings &&
         a.lm_head_bias == b.lm_head_bias &&
         a.final_logit_softcapping == b.final_logit_softcapping && a.norm_1 == b.norm_1 &&
         a.norm_2 == b.norm_2 && a.has_latent_attention == b.has_latent_attention &&
         a.lora_r == b.lora_r && a.lora_alpha == b.lora_alpha && a.lora_dropout == b.lora_dropout &&
         a.lora_query == b.lora_query && a.lora_key == b.lora_key && a.lora_value == b.lora_value &&
         a.lora_projection == b.lora_projection && a.lora_mlp == b.lora_mlp &&
         a.lora_head == b.lora_head && a.adapter_prompt_length == b.adapter_prompt_length &&
         a.adapter_start_layer == b.adapter_start_layer && a.rope_n_elem == b.rope_n_elem;
}

absl::StatusOr<Config> ConfigFromYaml(absl::string_view yaml_text, absl::string_view source) {
  // yaml-cpp reports malformed input (and too-deep nesting) by throwing; none may escape.
  try {
    return ParseDocument(yaml_text, source);
  } catch (const YAML::DeepRecursion& e) {
    // yaml-cpp's own message for this is "bad file".
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": malformed yaml: line ", e.mark.line + 1, ": nesting is too deep"));
  } catch (const YAML::Exception& e) {
    std::string message = Printable(e.msg);
    if (!e.mark.is_null()) {
      message =
          absl::StrCat("line ", e.mark.line + 1, ", column ", e.mark.column + 1, ": ", message);
    }
    return absl::InvalidArgumentError(absl::StrCat(source, ": malformed yaml: ", message));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": cannot read the config: ", Printable(e.what())));
  }
}

absl::StatusOr<Config> LoadConfigFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open config file ", path));
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) return absl::DataLossError(absl::StrCat("cannot read config file ", path));
  return ConfigFromYaml(text.str(), path);
}

std::string ConfigToYaml(const Config& config) {
  std::vector<std::pair<std::string, std::string>> entries;
  bool any_lora = false;
  for (const Field& field : Fields()) {
    if (field.group == Group::kLora && !FieldIsDefault(field, config)) any_lora = true;
  }
  for (const Field& field : Fields()) {
    // LitGPT's base Config rejects PEFT keys: write them only where a PEFT config set them
    // (all the lora_* keys together, as lora.Config's dump has them).
    if (field.group == Group::kLora && !any_lora) continue;
    if (field.group == Group::kAdapter && FieldIsDefault(field, config)) continue;
    entries.emplace_back(field.key, FormatField(field, config));
  }
  entries.emplace_back("gelu_approximate", FormatString(config.gelu_approximate));
  entries.emplace_back("hf_config", FormatHfConfig(config));
  entries.emplace_back("latent_attention", config.has_latent_attention ? "{}" : "null");
  entries.emplace_back("mlp_class_name", std::string(MlpClassName(config.mlp_class)));
  entries.emplace_back("name", FormatString(config.name));
  entries.emplace_back("norm_class_name", std::string(NormClassName(config.norm_class)));
  entries.emplace_back("norm_qk_type", std::string(NormQkTypeName(config.norm_qk_type)));
  entries.emplace_back("rope_adjustments", FormatRopeAdjustments(config.rope_adjustments));
  entries.emplace_back("rope_indices", FormatIndices(config.rope_indices));
  entries.emplace_back("sliding_window_indices", FormatIndices(config.sliding_window_indices));
  std::sort(entries.begin(), entries.end());

  std::string out;
  for (const auto& [key, value] : entries) {
    // Block values (mappings, lists) start on the next line.
    absl::StrAppend(&out, key, ":", value[0] == '\n' ? "" : " ", value, "\n");
  }
  return out;
}

}  // namespace lgpt
