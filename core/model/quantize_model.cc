#include "core/model/quantize_model.h"

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace lgpt {

const char* WeightQuantizationName(WeightQuantization quantization) {
  switch (quantization) {
    case WeightQuantization::kNone:
      return "none";
    case WeightQuantization::kInt8:
      return "int8";
    case WeightQuantization::kInt4:
      return "int4";
  }
  return "?";
}

absl::StatusOr<WeightQuantization> ParseWeightQuantization(absl::string_view name) {
  for (WeightQuantization q :
       {WeightQuantization::kNone, WeightQuantization::kInt8, WeightQuantization::kInt4}) {
    if (name == WeightQuantizationName(q)) return q;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("weight quantisation must be none, int8 or int4, got '", name, "'"));
}

ModelParts QuantizedModelParts(WeightQuantization quantization) {
  ModelParts parts;
  if (quantization == WeightQuantization::kNone) return parts;
  BlockQuantOptions options;
  options.format =
      quantization == WeightQuantization::kInt4 ? BlockFormat::kQ4_0 : BlockFormat::kQ8_0;
  parts.linear_factory = std::make_shared<BlockQuantLinearFactory>(options);
  return parts;
}

ModelParts Int8ModelParts(const Int8Options& options) {
  ModelParts parts;
  parts.linear_factory = std::make_shared<Int8LinearFactory>(options);
  return parts;
}

namespace {

// Every module of the model, and the projection a module computes through without holding it
// as a submodule (ProjectionImpl::flat_inner: a row-parallel shard's local projection).
std::vector<torch::nn::Module*> ProjectionsAndFlatInner(GPTImpl& model) {
  std::vector<torch::nn::Module*> out;
  for (const std::shared_ptr<torch::nn::Module>& module : model.modules()) {
    out.push_back(module.get());
    if (auto* projection = dynamic_cast<ProjectionImpl*>(module.get())) {
      if (ProjectionImpl* inner = projection->flat_inner()) out.push_back(inner);
    }
  }
  return out;
}

}  // namespace

absl::Status QuantizeModel(GPTImpl& model) {
  const c10::Device device = model.device();
  if (!(device.is_cpu() && model.dtype() == c10::kFloat) && !device.is_cuda()) {
    return absl::FailedPreconditionError(
        absl::StrCat("weight quantisation needs a float32 model on the CPU or a model on a CUDA "
                     "device; this one is ",
                     c10::toString(model.dtype()), " on ", device.str()));
  }
  // A tied model's head and embedding are one table: quantised once, shared.
  auto* head = dynamic_cast<BlockQuantProjectionImpl*>(model.lm_head.get());
  const at::Tensor& embedding = model.transformer->wte->weight;
  const bool tied = head != nullptr && !head->quantized() &&
                    head->weight.sizes() == embedding.sizes() && at::equal(head->weight, embedding);
  int quantized = 0;
  std::optional<BlockFormat> format;
  for (torch::nn::Module* module : ProjectionsAndFlatInner(model)) {
    if (auto* block = dynamic_cast<BlockQuantProjectionImpl*>(module)) {
      RETURN_IF_ERROR(block->Quantize());
      format = block->options().format;
      ++quantized;
    } else if (auto* int8 = dynamic_cast<Int8ProjectionImpl*>(module)) {
      if (!device.is_cpu()) {
        return absl::FailedPreconditionError(
            "the per-channel int8 format (Int8ModelParts) quantises CPU models only; the "
            "block formats (QuantizedModelParts) serve CUDA models");
      }
      RETURN_IF_ERROR(int8->Quantize());
      ++quantized;
    }
  }
  if (quantized == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(model.config().name,
                     ": no quantisable projections; build the model with QuantizedModelParts()"));
  }
  if (!format.has_value() || model.quantized_embedding().defined() ||
      model.config().n_embd % kQuantBlock != 0) {
    return absl::OkStatus();
  }
  if (tied && head->quantized_weight().format == *format) {
    return model.SetQuantizedEmbedding(head->quantized_weight());
  }
  absl::StatusOr<BlockQuantWeight> table = QuantizeBlocks(embedding, *format);
  if (!table.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("transformer.wte: ", table.status().message()));
  }
  return model.SetQuantizedEmbedding(*std::move(table));  // moved to the model's device there
}

absl::Status QuantizeModelInt8(GPTImpl& model) { return QuantizeModel(model); }

int64_t ModelWeightBytes(GPTImpl& model) {
  int64_t bytes = 0;
  for (const at::Tensor& p : model.parameters()) {
    bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  const BlockQuantWeight& embedding = model.quantized_embedding();
  const auto* head = dynamic_cast<const BlockQuantProjectionImpl*>(model.lm_head.get());
  const bool shared = head != nullptr && embedding.defined() &&
                      head->quantized_weight().defined() &&
                      embedding.values.is_same(head->quantized_weight().values);
  if (!shared) bytes += embedding.bytes();
  for (torch::nn::Module* module : ProjectionsAndFlatInner(model)) {
    if (auto* block = dynamic_cast<BlockQuantProjectionImpl*>(module)) {
      bytes += block->quantized_weight().bytes();
    } else if (auto* int8 = dynamic_cast<Int8ProjectionImpl*>(module)) {
      if (!int8->quantized()) continue;
      const Int8Weight& weight = int8->int8_weight();
      bytes += weight.values.numel() + weight.scales.numel() * 4;
    }
  }
  return bytes;
}

}  // namespace lgpt
