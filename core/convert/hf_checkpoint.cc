#include "core/convert/hf_checkpoint.h"

#include <ATen/ATen.h>
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/config/config_presets.h"
#include "core/base/file_util.h"
#include "core/base/output_dir.h"
#include "core/base/shape_text.h"
#include "core/io/safetensors.h"
#include "core/base/status_macros.h"
#include "core/io/torch_pickle.h"
#include "core/io/torch_pickle_writer.h"

namespace lgpt {
namespace {

using json = nlohmann::json;
using Shape = std::vector<int64_t>;

// ---------------------------------------------------------------------------------------
// Names as templates: "transformer.h.3.mlp.experts.1.fc_1.weight" is the template
// "transformer.h.{}.mlp.experts.{}.fc_1.weight" with ids {3, 1}.

std::string ToTemplate(absl::string_view name, std::vector<int64_t>* ids) {
  std::vector<std::string> parts = absl::StrSplit(name, '.');
  for (std::string& part : parts) {
    int64_t id;
    if (!part.empty() && std::all_of(part.begin(), part.end(), absl::ascii_isdigit) &&
        part.size() < 10 && absl::SimpleAtoi(part, &id)) {
      ids->push_back(id);
      part = "{}";
    }
  }
  return absl::StrJoin(parts, ".");
}

std::string Format(absl::string_view tmpl, const std::vector<int64_t>& ids) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < tmpl.size(); ++i) {
    if (tmpl.substr(i, 2) == "{}" && next < ids.size()) {
      absl::StrAppend(&out, ids[next++]);
      ++i;
    } else {
      out.push_back(tmpl[i]);
    }
  }
  return out;
}

std::string Names(const std::vector<std::string>& names) {
  constexpr size_t kShown = 5;
  std::vector<std::string> shown(names.begin(), names.begin() + std::min(kShown, names.size()));
  std::string text = absl::StrJoin(shown, ", ");
  if (names.size() > kShown) absl::StrAppend(&text, " and ", names.size() - kShown, " more");
  return text;
}

bool InterleavedQkv(HfFamily f) { return f == HfFamily::kGptNeoX || f == HfFamily::kFalcon; }

// The (LitGPT template, HF template) pairs of a family, q/k/v and Phi-3's gate_up_proj aside.
std::vector<std::pair<std::string, std::string>> NameRules(const Config& config, HfFamily f) {
  std::vector<std::pair<std::string, std::string>> r;
  const std::string lit = "transformer.h.{}.";
  auto add = [&](const std::string& l, const std::string& h) { r.emplace_back(l, h); };
  auto add_wb = [&](const std::string& l, const std::string& h) {
    add(l + ".weight", h + ".weight");
    add(l + ".bias", h + ".bias");
  };
  if (f == HfFamily::kGptNeoX) {
    const std::string hf = "gpt_neox.layers.{}.";
    add("transformer.wte.weight", "gpt_neox.embed_in.weight");
    add_wb(lit + "norm_1", hf + "input_layernorm");
    add_wb(lit + "attn.proj", hf + "attention.dense");
    add_wb(lit + "norm_2", hf + "post_attention_layernorm");
    add_wb(lit + "mlp.fc", hf + "mlp.dense_h_to_4h");
    add_wb(lit + "mlp.proj", hf + "mlp.dense_4h_to_h");
    add_wb("transformer.ln_f", "gpt_neox.final_layer_norm");
    add("lm_head.weight", "embed_out.weight");
    return r;
  }
  if (f == HfFamily::kFalcon) {
    const std::string hf = "transformer.h.{}.";
    add("transformer.wte.weight", "transformer.word_embeddings.weight");
    add_wb(lit + "attn.proj", hf + "self_attention.dense");
    add_wb(lit + "mlp.fc", hf + "mlp.dense_h_to_4h");
    add_wb(lit + "mlp.proj", hf + "mlp.dense_4h_to_h");
    if (FalconNewDecoderArchitecture(config)) {
      add_wb(lit + "norm_1", hf + "ln_attn");
      add_wb(lit + "norm_2", hf + "ln_mlp");
    } else {
      add_wb(lit + "norm_1", hf + "input_layernorm");
    }
    add_wb("transformer.ln_f", "transformer.ln_f");
    add("lm_head.weight", "lm_head.weight");
    return r;
  }
  const std::string hf = "model.layers.{}.";
  add("transformer.wte.weight", "model.embed_tokens.weight");
  add_wb("lm_head", "lm_head");
  if (f == HfFamily::kPhi) {
    add_wb(lit + "norm_1", hf + "input_layernorm");
    add_wb(lit + "attn.proj", hf + "self_attn.dense");
    add_wb(lit + "mlp.fc", hf + "mlp.fc1");
    add_wb(lit + "mlp.proj", hf + "mlp.fc2");
    add_wb("transformer.ln_f", "model.final_layernorm");
    return r;
  }
  add_wb(lit + "attn.proj", hf + "self_attn.o_proj");
  add_wb("transformer.ln_f", "model.norm");
  add(lit + "attn.norm_q.weight", hf + "self_attn.q_norm.weight");
  add(lit + "attn.norm_k.weight", hf + "self_attn.k_norm.weight");
  if (f == HfFamily::kGemma2 || f == HfFamily::kGemma3) {
    add_wb(lit + "norm_1", hf + "input_layernorm");
    add_wb(lit + "post_attention_norm", hf + "post_attention_layernorm");
    add_wb(lit + "norm_2", hf + "pre_feedforward_layernorm");
    add_wb(lit + "post_mlp_norm", hf + "post_feedforward_layernorm");
  } else if (f == HfFamily::kOlmo2) {
    add_wb(lit + "post_attention_norm", hf + "post_attention_layernorm");
    add_wb(lit + "post_mlp_norm", hf + "post_feedforward_layernorm");
  } else {
    add_wb(lit + "norm_1", hf + "input_layernorm");
    add_wb(lit + "norm_2", hf + "post_attention_layernorm");
  }
  if (f == HfFamily::kMixtral) {
    const std::string moe = hf + "block_sparse_moe.";
    add(lit + "mlp.gate.weight", moe + "gate.weight");
    add(lit + "mlp.experts.{}.fc_1.weight", moe + "experts.{}.w1.weight");
    add(lit + "mlp.experts.{}.fc_2.weight", moe + "experts.{}.w3.weight");
    add(lit + "mlp.experts.{}.proj.weight", moe + "experts.{}.w2.weight");
  } else {
    add(lit + "mlp.gate.weight", hf + "mlp.gate.weight");
    for (const std::string& prefix : {std::string("mlp.experts.{}."), std::string("mlp.")}) {
      const std::string lit_prefix =
          prefix == "mlp." ? std::string("mlp.") : std::string("mlp.experts.{}.");
      add_wb(lit + lit_prefix + "fc_1", hf + prefix + "gate_proj");
      add_wb(lit + lit_prefix + "fc_2", hf + prefix + "up_proj");
      add_wb(lit + lit_prefix + "proj", hf + prefix + "down_proj");
    }
    add_wb(lit + "mlp.shared_experts.fc_1", hf + "mlp.shared_experts.gate_proj");
    add_wb(lit + "mlp.shared_experts.fc_2", hf + "mlp.shared_experts.up_proj");
    add_wb(lit + "mlp.shared_experts.proj", hf + "mlp.shared_experts.down_proj");
  }
  return r;
}

// HF tensors the model does not use.
bool IgnoredHfName(absl::string_view tmpl) {
  return absl::EndsWith(tmpl, ".rotary_emb.inv_freq") ||
         tmpl == "gpt_neox.layers.{}.attention.bias" ||
         tmpl == "gpt_neox.layers.{}.attention.masked_bias";
}

std::string HfQkvTemplate(HfFamily f) {
  switch (f) {
    case HfFamily::kGptNeoX:
      return "gpt_neox.layers.{}.attention.query_key_value.";
    case HfFamily::kFalcon:
      return "transformer.h.{}.self_attention.query_key_value.";
    case HfFamily::kPhi3:
      return "model.layers.{}.self_attn.qkv_proj.";
    default:
      return "";
  }
}

struct QkvSizes {
  int64_t q, kv, groups, q_per_kv, head;
};
QkvSizes Sizes(const Config& c) {
  return {c.n_head * c.HeadSize(), c.QueryGroups() * c.HeadSize(), c.QueryGroups(),
          c.n_head / c.QueryGroups(), c.HeadSize()};
}

// [groups * (q_per_kv + 2) * head, ...] interleaved per group -> [Q | K | V].
at::Tensor Deinterleave(const at::Tensor& t, const QkvSizes& s) {
  std::vector<int64_t> grouped = {s.groups, (s.q_per_kv + 2) * s.head};
  for (int64_t i = 1; i < t.dim(); ++i) grouped.push_back(t.size(i));
  const at::Tensor x = t.reshape(grouped);
  std::vector<int64_t> flat = {-1};
  for (int64_t i = 1; i < t.dim(); ++i) flat.push_back(t.size(i));
  const at::Tensor q = x.narrow(1, 0, s.q_per_kv * s.head).reshape(flat);
  const at::Tensor k = x.narrow(1, s.q_per_kv * s.head, s.head).reshape(flat);
  const at::Tensor v = x.narrow(1, (s.q_per_kv + 1) * s.head, s.head).reshape(flat);
  return at::cat({q, k, v}, 0);
}

// [Q | K | V] -> interleaved per group.
at::Tensor Interleave(const at::Tensor& t, const QkvSizes& s) {
  std::vector<int64_t> rest;
  for (int64_t i = 1; i < t.dim(); ++i) rest.push_back(t.size(i));
  auto grouped = [&](int64_t rows) {
    std::vector<int64_t> shape = {s.groups, rows};
    shape.insert(shape.end(), rest.begin(), rest.end());
    return shape;
  };
  const at::Tensor q = t.narrow(0, 0, s.q).reshape(grouped(s.q_per_kv * s.head));
  const at::Tensor k = t.narrow(0, s.q, s.kv).reshape(grouped(s.head));
  const at::Tensor v = t.narrow(0, s.q + s.kv, s.kv).reshape(grouped(s.head));
  std::vector<int64_t> flat = {-1};
  flat.insert(flat.end(), rest.begin(), rest.end());
  return at::cat({q, k, v}, 1).reshape(flat);
}

absl::Status Invalid(const std::string& source, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
}

// ---------------------------------------------------------------------------------------
// Files.

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (const dirent* entry = ::readdir(d)) names.push_back(entry->d_name);
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

bool SamePath(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

// Copies the tokenizer and generation files of `from` into the output; returns the names.
absl::StatusOr<std::vector<std::string>> CopyTokenizerFiles(const std::string& from,
                                                            OutputDir& out) {
  std::vector<std::string> copied;
  for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                           "generation_config.json", "special_tokens_map.json"}) {
    const std::string src = absl::StrCat(from, "/", name);
    if (!IsFile(src)) continue;
    RETURN_IF_ERROR(out.CopyFile(src, name));
    copied.push_back(name);
  }
  return copied;
}

// Named in checksum errors: how a caller loads a corrupt file anyway.
constexpr char kVerifyOption[] = "ConvertOptions.verify_checksums";

absl::StatusOr<TensorMap> ReadWeightsFile(const std::string& path, bool verify_checksums) {
  if (absl::EndsWith(path, ".safetensors")) return ReadSafetensors(path);
  return ReadTorchStateDict(path, verify_checksums);
}

}  // namespace

// ---------------------------------------------------------------------------------------

std::map<std::string, Shape> ExpectedLitShapes(const Config& c) {
  std::map<std::string, Shape> s;
  const int64_t C = c.n_embd, P = c.PaddedVocabSize();
  auto norm = [&](const std::string& name, int64_t size) {
    if (!c.NormHasAffine()) return;
    s[name + ".weight"] = {size};
    if (c.norm_class == NormClass::kLayerNorm) s[name + ".bias"] = {size};
  };
  auto linear = [&](const std::string& name, int64_t in, int64_t out, bool bias) {
    s[name + ".weight"] = {out, in};
    if (bias) s[name + ".bias"] = {out};
  };
  auto mlp = [&](const std::string& name, MlpClass kind, int64_t size) {
    if (kind == MlpClass::kGptNeoxMLP) {
      linear(name + ".fc", C, size, c.bias);
    } else {
      linear(name + ".fc_1", C, size, c.bias);
      linear(name + ".fc_2", C, size, c.bias);
    }
    linear(name + ".proj", size, C, c.bias);
  };
  s["transformer.wte.weight"] = {P, C};
  const QkvSizes q = Sizes(c);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string h = absl::StrCat("transformer.h.", l, ".");
    if (c.norm_1) norm(h + "norm_1", C);
    linear(h + "attn.qkv", C, q.q + 2 * q.kv, c.bias || c.attn_bias);
    linear(h + "attn.proj", q.q, C, c.bias);
    if (c.norm_qk) {
      const bool olmo2 = c.norm_qk_type == NormQkType::kOlmo2;
      norm(h + "attn.norm_q", olmo2 ? q.q : q.head);
      norm(h + "attn.norm_k", olmo2 ? q.kv : q.head);
    }
    if (c.post_attention_norm) norm(h + "post_attention_norm", C);
    if (c.norm_2 && !c.shared_attention_norm) norm(h + "norm_2", C);
    const bool dense = c.first_k_dense_replace && l < *c.first_k_dense_replace;
    if (c.mlp_class == MlpClass::kLLaMAMoE && !dense) {
      linear(h + "mlp.gate", C, c.n_expert, false);
      const int64_t size = c.moe_intermediate_size.value_or(c.IntermediateSize());
      for (int64_t e = 0; e < c.n_expert; ++e) {
        mlp(absl::StrCat(h, "mlp.experts.", e), MlpClass::kLLaMAMLP, size);
      }
      if (c.n_shared_expert.value_or(0) > 0) {
        mlp(h + "mlp.shared_experts", MlpClass::kLLaMAMLP, size * *c.n_shared_expert);
      }
    } else {
      mlp(h + "mlp", dense ? MlpClass::kLLaMAMLP : c.mlp_class, c.IntermediateSize());
    }
    if (c.post_mlp_norm) norm(h + "post_mlp_norm", C);
  }
  norm("transformer.ln_f", C);
  linear("lm_head", C, P, c.lm_head_bias);
  return s;
}

absl::Status CheckLitTensors(const Config& config, const TensorMap& tensors,
                             const std::string& source) {
  // The expected names are enumerated: bound the work a hostile config can ask for.
  constexpr int64_t kMaxLayerTensors = 1 << 20;
  if (config.n_layer < 0 || config.n_expert < 0 ||
      config.n_layer * (config.n_expert + 2) > kMaxLayerTensors) {
    return Invalid(source, absl::StrCat(config.n_layer, " layers of ", config.n_expert,
                                        " experts are more than a checkpoint can hold"));
  }
  const std::map<std::string, Shape> expected = ExpectedLitShapes(config);
  std::vector<std::string> missing, unexpected;
  for (const auto& [name, shape] : expected) {
    if (!tensors.count(name)) missing.push_back(name);
  }
  for (const auto& [name, tensor] : tensors) {
    if (!expected.count(name)) unexpected.push_back(name);
  }
  if (!missing.empty()) {
    return Invalid(source, absl::StrCat("missing tensors for ", config.name, ": ", Names(missing)));
  }
  if (!unexpected.empty()) {
    return Invalid(source,
                   absl::StrCat("unexpected tensors for ", config.name, ": ", Names(unexpected)));
  }
  for (const auto& [name, shape] : expected) {
    const at::Tensor& t = tensors.at(name);
    if (!t.sizes().equals(shape)) {
      return Invalid(source, absl::StrCat("tensor ", name, " has shape ", ShapeText(t.sizes()),
                                          ", ", config.name, " expects ", ShapeText(shape)));
    }
    if (!t.is_floating_point()) {
      return Invalid(source, absl::StrCat("tensor ", name, " is ", c10::toString(t.scalar_type()),
                                          ", not a floating-point weight"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorMap> HfToLit(const Config& config, const TensorMap& hf,
                                  const std::string& source, std::optional<HfFamily> hf_family) {
  if (!hf_family) {
    ASSIGN_OR_RETURN(hf_family, HfFamilyOf(config));
  }
  const HfFamily family = *hf_family;
  std::map<std::string, std::string> rules;  // HF template -> LitGPT template.
  for (const auto& [lit, h] : NameRules(config, family)) rules[h] = lit;
  const QkvSizes sizes = Sizes(config);
  const std::string fused_qkv = HfQkvTemplate(family);
  // Multimodal Gemma 3 checkpoints keep the text model under another prefix.
  std::string text_prefix;
  if (family == HfFamily::kGemma3) {
    for (const char* prefix : {"model.language_model.", "language_model.model."}) {
      for (const auto& item : hf) {
        if (absl::StartsWith(item.first, prefix)) text_prefix = prefix;
      }
    }
  }

  TensorMap lit;
  // (layer, "weight"/"bias") -> q, k, v.
  std::map<std::pair<int64_t, std::string>, std::array<at::Tensor, 3>> split_qkv;
  auto put = [&](const std::string& name, at::Tensor t, const std::string& from) -> absl::Status {
    if (!lit.emplace(name, std::move(t)).second) {
      return Invalid(source, absl::StrCat("two tensors map to ", name, " (one is ", from, ")"));
    }
    return absl::OkStatus();
  };
  for (const auto& [original, tensor] : hf) {
    std::string name = original;
    if (!text_prefix.empty()) {
      if (name == "language_model.lm_head.weight") {
        name = "lm_head.weight";
      } else if (!absl::StartsWith(name, text_prefix)) {
        if (absl::StrContains(name, "vision_tower") ||
            absl::StrContains(name, "multi_modal_projector")) {
          continue;
        }
      } else {
        name = "model." + name.substr(text_prefix.size());
      }
    }
    std::vector<int64_t> ids;
    const std::string tmpl = ToTemplate(name, &ids);
    if (IgnoredHfName(tmpl)) continue;
    // The q/k/v concatenation silently promoted an integer projection to float, and any other
    // integer weight went into a lit_model.pth that the loader then refuses.
    if (!tensor.is_floating_point()) {
      return Invalid(source,
                     absl::StrCat("tensor ", original, " is ", c10::toString(tensor.scalar_type()),
                                  ", not a floating-point weight"));
    }
    const std::string kind = tmpl.substr(tmpl.rfind('.') + 1);  // weight or bias
    if (!fused_qkv.empty() && (tmpl == fused_qkv + "weight" || tmpl == fused_qkv + "bias")) {
      if (tensor.dim() < 1 || tensor.size(0) != sizes.q + 2 * sizes.kv) {
        return Invalid(
            source, absl::StrCat("tensor ", original, " has shape ", ShapeText(tensor.sizes()),
                                 ", ", config.name, " expects ", sizes.q + 2 * sizes.kv, " rows"));
      }
      const std::string lit_name = absl::StrCat("transformer.h.", ids[0], ".attn.qkv.", kind);
      RETURN_IF_ERROR(
          put(lit_name, InterleavedQkv(family) ? Deinterleave(tensor, sizes) : tensor, original));
      continue;
    }
    if (fused_qkv.empty() && ids.size() == 1) {
      int which = -1;
      for (int i = 0; i < 3; ++i) {
        const std::string proj = std::string(1, "qkv"[i]) + "_proj";
        if (tmpl == absl::StrCat("model.layers.{}.self_attn.", proj, ".", kind)) which = i;
      }
      if (which >= 0) {
        split_qkv[{ids[0], kind}][which] = tensor;
        continue;
      }
    }
    if (family == HfFamily::kPhi3 && tmpl == "model.layers.{}.mlp.gate_up_proj.weight") {
      const int64_t size = config.IntermediateSize();
      if (tensor.dim() != 2 || tensor.size(0) != 2 * size) {
        return Invalid(source,
                       absl::StrCat("tensor ", original, " has shape ", ShapeText(tensor.sizes()),
                                    ", ", config.name, " expects ", 2 * size, " rows"));
      }
      const std::string mlp = absl::StrCat("transformer.h.", ids[0], ".mlp.");
      RETURN_IF_ERROR(put(mlp + "fc_1.weight", tensor.narrow(0, 0, size), original));
      RETURN_IF_ERROR(put(mlp + "fc_2.weight", tensor.narrow(0, size, size), original));
      continue;
    }
    const auto rule = rules.find(tmpl);
    if (rule == rules.end()) {
      return Invalid(source, absl::StrCat("unexpected tensor ", original, " for ",
                                          HfArchitecture(config, family), " (", config.name, ")"));
    }
    at::Tensor value = tensor;
    if (rule->second == "transformer.wte.weight" && tensor.dim() == 2 &&
        tensor.size(0) > config.PaddedVocabSize() && !text_prefix.empty()) {
      value = tensor.narrow(0, 0, config.PaddedVocabSize());  // Image tokens follow the text.
    }
    RETURN_IF_ERROR(put(Format(rule->second, ids), value, original));
  }
  for (auto& [key, parts] : split_qkv) {
    const auto& [layer, kind] = key;
    const char* names[] = {"q_proj", "k_proj", "v_proj"};
    const int64_t rows[] = {sizes.q, sizes.kv, sizes.kv};
    for (int i = 0; i < 3; ++i) {
      const std::string hf_name =
          absl::StrCat(text_prefix.empty() ? "model." : text_prefix, "layers.", layer,
                       ".self_attn.", names[i], ".", kind);
      if (!parts[i].defined()) {
        return Invalid(source, absl::StrCat("missing tensor ", hf_name,
                                            " (the layer's other attention projections exist)"));
      }
      if (parts[i].dim() < 1 || parts[i].size(0) != rows[i] ||
          !parts[i].sizes().slice(1).equals(parts[0].sizes().slice(1))) {
        return Invalid(source,
                       absl::StrCat("tensor ", hf_name, " has shape ", ShapeText(parts[i].sizes()),
                                    ", ", config.name, " expects ", rows[i], " rows"));
      }
    }
    RETURN_IF_ERROR(put(absl::StrCat("transformer.h.", layer, ".attn.qkv.", kind),
                        at::cat({parts[0], parts[1], parts[2]}, 0), "q/k/v_proj"));
    parts = {};  // Releases the views as soon as they are fused.
  }
  if (!lit.count("lm_head.weight") && lit.count("transformer.wte.weight")) {
    lit["lm_head.weight"] = lit.at("transformer.wte.weight");  // Tied embeddings.
  }
  RETURN_IF_ERROR(CheckLitTensors(config, lit, source));
  return lit;
}

absl::StatusOr<TensorMap> LitToHf(const Config& config, const TensorMap& lit,
                                  const std::string& source, bool* tied) {
  ASSIGN_OR_RETURN(const HfFamily family, HfFamilyOf(config));
  for (const auto& [name, tensor] : lit) {
    if (absl::StrContains(name, "lora_")) {
      return absl::FailedPreconditionError(absl::StrCat(
          source, ": holds LoRA weights (", name, "); merge them into the base weights first"));
    }
    if (absl::StrContains(name, "adapter") || absl::StrContains(name, "gating_factor")) {
      return absl::UnimplementedError(
          absl::StrCat(source, ": adapter weights (", name, ") cannot be converted"));
    }
  }
  RETURN_IF_ERROR(CheckLitTensors(config, lit, source));
  const std::vector<std::pair<std::string, std::string>> rule_list = NameRules(config, family);
  const std::map<std::string, std::string> rules(rule_list.begin(), rule_list.end());
  const QkvSizes sizes = Sizes(config);
  const std::string fused_qkv = HfQkvTemplate(family);
  const bool tie = lit.count("lm_head.weight") && !config.lm_head_bias &&
                   family != HfFamily::kGptNeoX &&
                   at::equal(lit.at("lm_head.weight"), lit.at("transformer.wte.weight"));
  if (tied) *tied = tie;
  TensorMap hf;
  for (const auto& [name, tensor] : lit) {
    if (name == "lm_head.weight" && tie) continue;
    std::vector<int64_t> ids;
    const std::string tmpl = ToTemplate(name, &ids);
    const std::string kind = tmpl.substr(tmpl.rfind('.') + 1);
    if (tmpl == "transformer.h.{}.attn.qkv." + kind) {
      if (!fused_qkv.empty()) {
        hf[Format(fused_qkv + kind, ids)] =
            InterleavedQkv(family) ? Interleave(tensor, sizes) : tensor;
      } else {
        const std::string layer = absl::StrCat("model.layers.", ids[0], ".self_attn.");
        hf[layer + "q_proj." + kind] = tensor.narrow(0, 0, sizes.q);
        hf[layer + "k_proj." + kind] = tensor.narrow(0, sizes.q, sizes.kv);
        hf[layer + "v_proj." + kind] = tensor.narrow(0, sizes.q + sizes.kv, sizes.kv);
      }
      continue;
    }
    if (family == HfFamily::kPhi3 && tmpl == "transformer.h.{}.mlp.fc_1.weight") {
      const std::string fc_2 = absl::StrCat("transformer.h.", ids[0], ".mlp.fc_2.weight");
      hf[absl::StrCat("model.layers.", ids[0], ".mlp.gate_up_proj.weight")] =
          at::cat({tensor, lit.at(fc_2)}, 0);
      continue;
    }
    if (family == HfFamily::kPhi3 && tmpl == "transformer.h.{}.mlp.fc_2.weight") continue;
    const auto rule = rules.find(tmpl);
    if (rule == rules.end()) {
      return Invalid(source, absl::StrCat("tensor ", name, " has no ",
                                          HfArchitecture(config, family), " name"));
    }
    hf[Format(rule->second, ids)] = tensor;
  }
  return hf;
}

absl::StatusOr<TensorMap> ReadHfTensors(const std::string& hf_dir, std::vector<std::string>* files,
                                        bool verify_checksums) {
  if (!IsDirectory(hf_dir)) {
    return absl::NotFoundError(absl::StrCat(hf_dir, ": no such directory"));
  }
  std::vector<std::string> paths;
  std::map<std::string, std::string> index;  // Tensor -> shard path, from an index.
  std::string index_path;
  for (const char* name : {"model.safetensors.index.json", "pytorch_model.bin.index.json"}) {
    const std::string candidate = absl::StrCat(hf_dir, "/", name);
    if (IsFile(candidate)) {
      index_path = candidate;
      break;
    }
  }
  if (!index_path.empty()) {
    ASSIGN_OR_RETURN(const std::string text, ReadFileToString(index_path));
    const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
        !j["weight_map"].is_object()) {
      return Invalid(index_path, "not an index: expected an object with a 'weight_map' object");
    }
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : j["weight_map"].items()) {
      if (!shard.is_string() || shard.get<std::string>().empty() ||
          absl::StrContains(shard.get<std::string>(), "..")) {
        return Invalid(index_path, absl::StrCat("bad shard name for tensor ", tensor));
      }
      const std::string shard_path = absl::StrCat(hf_dir, "/", shard.get<std::string>());
      index[tensor] = shard_path;
      shards.insert(shard_path);
    }
    for (const std::string& shard : shards) {
      if (!IsFile(shard)) {
        return absl::NotFoundError(absl::StrCat(index_path, ": shard ", shard, " is missing"));
      }
      paths.push_back(shard);
    }
  } else {
    for (const char* ext : {".safetensors", ".bin"}) {
      for (const std::string& name : ListDir(hf_dir)) {
        if (absl::EndsWith(name, ext) && name != "training_args.bin" &&
            IsFile(absl::StrCat(hf_dir, "/", name))) {
          paths.push_back(absl::StrCat(hf_dir, "/", name));
        }
      }
      if (!paths.empty()) break;
    }
  }
  if (paths.empty()) {
    return absl::NotFoundError(
        absl::StrCat(hf_dir, ": no model.safetensors, pytorch_model.bin or index of shards"));
  }
  TensorMap all;
  std::map<std::string, std::string> origin;
  for (const std::string& path : paths) {
    ASSIGN_OR_RETURN(TensorMap tensors, ReadWeightsFile(path, verify_checksums));
    for (auto& [name, tensor] : tensors) {
      if (all.count(name)) {
        return Invalid(path, absl::StrCat("tensor ", name, " is also in ", origin[name]));
      }
      origin[name] = path;
      all.emplace(name, std::move(tensor));
    }
  }
  for (const auto& [tensor, shard] : index) {
    const auto it = origin.find(tensor);
    if (it == origin.end() || it->second != shard) {
      return Invalid(index_path, absl::StrCat("places tensor ", tensor, " in ", shard,
                                              ", which does not hold it"));
    }
  }
  if (files) *files = paths;
  return all;
}

namespace {

void Progress(const ConvertOptions& options, const std::string& message) {
  if (options.progress) options.progress(message);
}

TensorMap ConvertDtype(TensorMap tensors, const std::optional<c10::ScalarType>& dtype) {
  if (!dtype) return tensors;
  for (auto& [name, tensor] : tensors) {
    if (tensor.is_floating_point()) tensor = tensor.to(*dtype);
  }
  return tensors;
}

int64_t DataBytes(const TensorMap& tensors) {
  int64_t bytes = 0;
  for (const auto& [name, t] : tensors) bytes += t.numel() * t.element_size();
  return bytes;
}

absl::StatusOr<ConvertResult> ConvertHfImpl(const std::string& hf_dir, const std::string& out_dir,
                                            const ConvertOptions& options) {
  Progress(options, "reading config.json");
  ASSIGN_OR_RETURN(HfConfig hf_config,
                   ReadHfConfig(hf_dir, options.model_name, options.model_config));
  const Config& config = hf_config.config;
  Progress(options, absl::StrCat("reading weights as ", config.name));
  std::vector<std::string> files;
  absl::StatusOr<TensorMap> read = ReadHfTensors(hf_dir, &files, options.verify_checksums);
  if (!read.ok()) return WithVerifyChecksumsOption(read.status(), kVerifyOption);
  TensorMap hf = *std::move(read);
  const std::string source = files.size() == 1 ? files[0] : hf_dir;
  ASSIGN_OR_RETURN(TensorMap lit, HfToLit(config, hf, source, hf_config.family));
  hf.clear();  // The lit map holds what it needs.
  lit = ConvertDtype(std::move(lit), options.dtype);
  const bool same_dir = SamePath(hf_dir, out_dir);
  if (same_dir && options.write_safetensors && IsFile(out_dir + "/model.safetensors")) {
    return absl::FailedPreconditionError(
        absl::StrCat(out_dir,
                     ": writing model.safetensors would replace the Hugging Face weights; choose "
                     "another --out_dir or leave out --safetensors"));
  }
  // In place, the Hugging Face files stay beside the LitGPT ones (carried over as hard links).
  std::vector<std::string> inputs;
  if (!options.in_place) inputs.push_back(hf_dir);
  OutputDirOptions out_options;
  if (!same_dir) out_options.drop = {"model.safetensors", "lit_model.pth"};
  ASSIGN_OR_RETURN(std::unique_ptr<OutputDir> out, OutputDir::Begin(out_dir, inputs, out_options));
  ConvertResult result;
  result.config = config;
  result.preset = hf_config.preset;
  result.overridden = hf_config.overridden;
  result.notes = hf_config.notes;
  result.tensors = static_cast<int64_t>(lit.size());
  result.bytes = DataBytes(lit);
  Progress(options, absl::StrCat("writing ", lit.size(), " tensors to lit_model.pth"));
  RETURN_IF_ERROR(out->WriteFile("model_config.yaml", ConfigToYaml(config)));
  result.written.push_back("model_config.yaml");
  RETURN_IF_ERROR(WriteTorchStateDict(out->Path("lit_model.pth"), lit));
  result.written.push_back("lit_model.pth");
  if (options.write_safetensors) {
    RETURN_IF_ERROR(WriteSafetensors(out->Path("model.safetensors"), lit));
    result.written.push_back("model.safetensors");
  }
  if (!same_dir) {
    ASSIGN_OR_RETURN(std::vector<std::string> copied, CopyTokenizerFiles(hf_dir, *out));
    result.written.insert(result.written.end(), copied.begin(), copied.end());
  }
  RETURN_IF_ERROR(out->Commit());
  return result;
}

absl::StatusOr<ConvertResult> ConvertLitImpl(const std::string& checkpoint_dir,
                                             const std::string& out_dir,
                                             const ConvertOptions& options) {
  if (!IsDirectory(checkpoint_dir)) {
    return absl::NotFoundError(absl::StrCat(checkpoint_dir, ": no such directory"));
  }
  if (SamePath(checkpoint_dir, out_dir)) {
    return absl::FailedPreconditionError(
        absl::StrCat(out_dir,
                     ": the Hugging Face files would overwrite the LitGPT checkpoint's own; choose "
                     "another output directory"));
  }
  ASSIGN_OR_RETURN(const Config config, LoadConfigFile(checkpoint_dir + "/model_config.yaml"));
  ASSIGN_OR_RETURN(const HfFamily family, HfFamilyOf(config));
  std::string source = checkpoint_dir + "/model.safetensors";
  if (!IsFile(source)) source = checkpoint_dir + "/lit_model.pth";
  if (!IsFile(source)) {
    return absl::NotFoundError(
        absl::StrCat(checkpoint_dir, ": no model.safetensors or lit_model.pth"));
  }
  Progress(options, absl::StrCat("reading ", source));
  absl::StatusOr<TensorMap> read = ReadWeightsFile(source, options.verify_checksums);
  if (!read.ok()) return WithVerifyChecksumsOption(read.status(), kVerifyOption);
  TensorMap lit = *std::move(read);
  bool tied = false;
  ASSIGN_OR_RETURN(TensorMap hf, LitToHf(config, lit, source, &tied));
  lit.clear();
  hf = ConvertDtype(std::move(hf), options.dtype);
  // Old weights of another layout (a single file vs shards) must not survive beside new ones.
  OutputDirOptions out_options;
  out_options.drop = {"model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                      "pytorch_model.bin.index.json"};
  ASSIGN_OR_RETURN(std::unique_ptr<OutputDir> out,
                   OutputDir::Begin(out_dir, {checkpoint_dir}, out_options));
  ConvertResult result;
  result.config = config;
  result.tensors = static_cast<int64_t>(hf.size());
  result.bytes = DataBytes(hf);
  const c10::ScalarType dtype = hf.count("model.embed_tokens.weight")
                                    ? hf.at("model.embed_tokens.weight").scalar_type()
                                    : hf.begin()->second.scalar_type();
  RETURN_IF_ERROR(out->WriteFile("config.json", HfConfigJson(config, family, tied, dtype)));
  result.written.push_back("config.json");
  if (options.max_shard_bytes <= 0 || result.bytes <= options.max_shard_bytes) {
    Progress(options, absl::StrCat("writing ", hf.size(), " tensors to model.safetensors"));
    RETURN_IF_ERROR(WriteSafetensors(out->Path("model.safetensors"), hf));
    result.written.push_back("model.safetensors");
  } else {
    std::vector<TensorMap> shards(1);
    int64_t shard_bytes = 0;
    for (auto& [name, tensor] : hf) {
      const int64_t bytes = tensor.numel() * tensor.element_size();
      if (!shards.back().empty() && shard_bytes + bytes > options.max_shard_bytes) {
        shards.emplace_back();
        shard_bytes = 0;
      }
      shards.back()[name] = tensor;
      shard_bytes += bytes;
    }
    json weight_map = json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      char file[64];
      std::snprintf(file, sizeof(file), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      Progress(options, absl::StrCat("writing ", file));
      RETURN_IF_ERROR(WriteSafetensors(out->Path(file), shards[i]));
      for (const auto& [name, tensor] : shards[i]) weight_map[name] = file;
      shards[i].clear();
      result.written.push_back(file);
    }
    json index = {{"metadata", {{"total_size", result.bytes}}}, {"weight_map", weight_map}};
    RETURN_IF_ERROR(out->WriteFile("model.safetensors.index.json", index.dump(2) + "\n"));
    result.written.push_back("model.safetensors.index.json");
  }
  ASSIGN_OR_RETURN(std::vector<std::string> copied, CopyTokenizerFiles(checkpoint_dir, *out));
  result.written.insert(result.written.end(), copied.begin(), copied.end());
  RETURN_IF_ERROR(out->Commit());
  return result;
}

}  // namespace

absl::StatusOr<ConvertResult> ConvertHfCheckpoint(const std::string& hf_dir,
                                                  const std::string& out_dir,
                                                  const ConvertOptions& options) {
  try {
    return ConvertHfImpl(hf_dir, out_dir, options);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(hf_dir, ": conversion failed: ", e.what()));
  }
}

absl::StatusOr<ConvertResult> ConvertLitCheckpoint(const std::string& checkpoint_dir,
                                                   const std::string& out_dir,
                                                   const ConvertOptions& options) {
  try {
    return ConvertLitImpl(checkpoint_dir, out_dir, options);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(checkpoint_dir, ": conversion failed: ", e.what()));
  }
}

}  // namespace lgpt
