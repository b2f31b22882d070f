#include "core/model/quantized_checkpoint.h"

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "core/io/crc32.h"
#include "core/io/safetensors.h"
#include "core/io/tensor_map.h"
#include "core/model/state_dict.h"
#include "core/nn/block_quant_linear.h"

namespace lgpt {
namespace {

constexpr char kFormatKey[] = "lgpt.format";
constexpr char kFormatValue[] = "block-quant-v1";
constexpr char kWeightsKey[] = "lgpt.weights";
constexpr char kTiedKey[] = "lgpt.tied_embedding";
constexpr char kCrcPrefix[] = "lgpt.crc32.";
constexpr char kEmbedding[] = "transformer.wte.weight";

std::string Crc32Hex(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU).contiguous();  // a CUDA model's tensors read on the host
  return absl::StrFormat("%08x", Crc32(c.data_ptr(), c.numel() * c.element_size()));
}

// Every block-quantised projection by the name of its weight ("...attn.qkv.weight").
std::map<std::string, BlockQuantProjectionImpl*> QuantisedProjections(GPTImpl& model) {
  std::map<std::string, BlockQuantProjectionImpl*> out;
  for (const auto& item : model.named_modules()) {
    if (auto* p = dynamic_cast<BlockQuantProjectionImpl*>(item.value().get())) {
      out[item.key() + ".weight"] = p;
    }
  }
  return out;
}

bool IsPeftParameter(const std::string& name) {
  for (const char* marker : {"lora_", "adapter_", "gating_factor"}) {
    if (name.find(marker) != std::string::npos) return true;
  }
  return false;
}

// Takes <name>.qvalues and <name>.qscales out of `tensors`.
absl::StatusOr<BlockQuantWeight> TakeQuantised(TensorMap& tensors, const std::string& name,
                                               BlockFormat format, int64_t out_features,
                                               int64_t in_features, const std::string& path) {
  BlockQuantWeight w;
  w.format = format;
  w.out_features = out_features;
  w.in_features = in_features;
  for (const char* suffix : {".qvalues", ".qscales"}) {
    auto it = tensors.find(name + suffix);
    if (it == tensors.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": missing tensor ", name, suffix, " (", name, " is quantised)"));
    }
    (std::string(suffix) == ".qvalues" ? w.values : w.scales) = it->second;
    tensors.erase(it);
  }
  return w;
}

absl::Status CheckCrcs(const TensorMap& tensors, const std::map<std::string, std::string>& meta,
                       const std::string& path) {
  for (const auto& [name, tensor] : tensors) {
    auto it = meta.find(kCrcPrefix + name);
    if (it == meta.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": no ", kCrcPrefix, name, " in the metadata"));
    }
    const std::string actual = Crc32Hex(tensor);
    if (actual != it->second) {
      return FieldError(
          absl::StatusCode::kDataLoss, "LoadOptions.verify_checksums",
          absl::StrCat(path, ": tensor ", name, " has CRC-32 ", actual, ", the file records ",
                       it->second,
                       " (corrupted; LoadOptions.verify_checksums=false skips the check)"));
    }
  }
  return absl::OkStatus();
}

// The block format the header's metadata names (QuantizedCheckpointFormat).
absl::StatusOr<BlockFormat> FormatOf(const SafetensorsHeader& header, const std::string& path) {
  auto format = header.metadata.find(kFormatKey);
  if (format == header.metadata.end() || format->second != kFormatValue) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": metadata ", kFormatKey, " must be \"", kFormatValue, "\", got ",
                     format == header.metadata.end() ? "nothing" : "\"" + format->second + "\""));
  }
  auto weights = header.metadata.find(kWeightsKey);
  for (BlockFormat f : {BlockFormat::kQ8_0, BlockFormat::kQ4_0}) {
    if (weights != header.metadata.end() && weights->second == BlockFormatName(f)) return f;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": metadata ", kWeightsKey, " must be q8_0 or q4_0, got ",
                   weights == header.metadata.end() ? "nothing" : "\"" + weights->second + "\""));
}

}  // namespace

ModelParts QuantizedCheckpointParts(BlockFormat format) {
  BlockQuantOptions options;
  options.format = format;
  ModelParts parts;
  parts.linear_factory = std::make_shared<BlockQuantLinearFactory>(options);
  return parts;
}

absl::Status SaveQuantizedCheckpoint(GPTImpl& model, const std::string& path) {
  TensorMap tensors;
  std::map<std::string, std::string> metadata = {{kFormatKey, kFormatValue}};
  std::set<std::string> quantised_names;
  for (const auto& [name, p] : QuantisedProjections(model)) {
    if (!p->quantized()) {
      return absl::FailedPreconditionError(
          absl::StrCat(name, " is not quantised yet: run QuantizeModel before saving"));
    }
    const BlockQuantWeight& w = p->quantized_weight();
    metadata[kWeightsKey] = BlockFormatName(w.format);
    tensors[name + ".qvalues"] = w.values;
    tensors[name + ".qscales"] = w.scales;
    quantised_names.insert(name);
  }
  if (quantised_names.empty()) {
    return absl::FailedPreconditionError(
        "the model has no block-quantised projections (build it with QuantizedModelParts and "
        "run QuantizeModel)");
  }
  const BlockQuantWeight& embedding = model.quantized_embedding();
  if (embedding.defined()) {
    auto* head = dynamic_cast<BlockQuantProjectionImpl*>(model.lm_head.get());
    if (head != nullptr && embedding.values.is_same(head->quantized_weight().values)) {
      metadata[kTiedKey] = "true";
    } else {
      tensors[std::string(kEmbedding) + ".qvalues"] = embedding.values;
      tensors[std::string(kEmbedding) + ".qscales"] = embedding.scales;
    }
    quantised_names.insert(kEmbedding);
  }
  for (const auto& [name, tensor] : StateDict(model)) {
    if (IsPeftParameter(name)) {
      return absl::FailedPreconditionError(absl::StrCat("the model holds PEFT weights (", name,
                                                        "): merge them into the base first"));
    }
    if (!quantised_names.count(name)) tensors[name] = tensor;
  }
  for (const auto& [name, tensor] : tensors) metadata[kCrcPrefix + name] = Crc32Hex(tensor);
  return WriteSafetensors(path, tensors, metadata);
}

absl::StatusOr<BlockFormat> QuantizedCheckpointFormat(const std::string& path) {
  ASSIGN_OR_RETURN(const SafetensorsHeader header, ReadSafetensorsHeader(path));
  return FormatOf(header, path);
}

absl::Status LoadQuantizedCheckpoint(GPTImpl& model, const std::string& path,
                                     bool verify_checksums) {
  if (model.device().is_cpu() ? model.dtype() != c10::kFloat : !model.device().is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     " holds block-quantised weights, which run on the CPU in float32 or on a CUDA "
                     "device (dtype and device of the load options)"));
  }
  ASSIGN_OR_RETURN(const SafetensorsHeader header, ReadSafetensorsHeader(path));
  ASSIGN_OR_RETURN(const BlockFormat format, FormatOf(header, path));
  ASSIGN_OR_RETURN(TensorMap tensors, ReadSafetensors(path));
  if (verify_checksums) RETURN_IF_ERROR(CheckCrcs(tensors, header.metadata, path));
  RETURN_IF_ERROR(CheckFinite(tensors, path));  // the half scales too

  for (const auto& [name, p] : QuantisedProjections(model)) {
    ASSIGN_OR_RETURN(BlockQuantWeight w, TakeQuantised(tensors, name, format, p->weight.size(0),
                                                       p->weight.size(1), path));
    absl::Status set = p->SetQuantized(std::move(w));
    if (!set.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", set.message()));
  }
  auto tied = header.metadata.find(kTiedKey);
  if (tied != header.metadata.end() && tied->second == "true") {
    auto* head = dynamic_cast<BlockQuantProjectionImpl*>(model.lm_head.get());
    if (head == nullptr || !head->quantized()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": the embedding is tied to lm_head, which is not quantised"));
    }
    RETURN_IF_ERROR(model.SetQuantizedEmbedding(head->quantized_weight()));
  } else if (tensors.count(std::string(kEmbedding) + ".qvalues")) {
    const at::Tensor& table = model.transformer->wte->weight;
    ASSIGN_OR_RETURN(BlockQuantWeight w, TakeQuantised(tensors, kEmbedding, format, table.size(0),
                                                       table.size(1), path));
    absl::Status set = model.SetQuantizedEmbedding(std::move(w));
    if (!set.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", set.message()));
  }
  RETURN_IF_ERROR(LoadStateDict(model, tensors, path, /*allow_missing=*/true,
                                /*adopt_storage=*/true));
  // Quantised matrices left their float parameters empty; anything else must be in the file.
  std::vector<std::string> missing;
  for (const auto& [name, target] : StateDict(model)) {
    if (!tensors.count(name) && target.numel() > 0) missing.push_back(name);
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": missing tensors ", absl::StrJoin(missing, ", ")));
  }
  return absl::OkStatus();
}

}  // namespace lgpt
