// Weight quantisation of a whole model at load time.
//
//   LoadOptions load;
//   load.parts = QuantizedModelParts(WeightQuantization::kInt4);  // quantisable projections
//   LoadedModel loaded = *LoadCheckpoint(dir, load);
//   RETURN_IF_ERROR(QuantizeModel(*loaded.model));                 // frees the float weights
//
// Formats: kInt8 and kInt4 are the block formats of core/ops/block_quant.h (q8_0/q4_0-like: a
// half scale per 32 weights, integer-dot GEMV for decoding) for every projection, the MoE
// experts, lm_head and the token embedding (one table shared by a tied head and embedding;
// lookups dequantise the rows they read); norms, biases and the MoE router stay float32, as
// do projections whose in_features is not a multiple of 32. The older per-channel/per-group
// int8 format (core/nn/int8_linear.h, Int8ModelParts) serves int8-base LoRA fine-tuning.
// Each projection's float weight is freed as soon as it is quantised, so the float32 and the
// quantised copy of the model never coexist beyond one matrix.
#ifndef LGPT_CORE_MODEL_QUANTIZE_MODEL_H_
#define LGPT_CORE_MODEL_QUANTIZE_MODEL_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/model/gpt.h"
#include "core/model/model_parts.h"
#include "core/nn/block_quant_linear.h"
#include "core/nn/int8_linear.h"

namespace lgpt {

enum class WeightQuantization {
  kNone,
  kInt8,  // q8_0-like blocks: 1.0625 bytes per weight
  kInt4,  // q4_0-like blocks: 0.5625 bytes per weight
};
const char* WeightQuantizationName(WeightQuantization quantization);  // none, int8, int4
// "none", "int8" or "int4"; InvalidArgument naming the accepted values otherwise.
absl::StatusOr<WeightQuantization> ParseWeightQuantization(absl::string_view name);

// Model parts whose projections QuantizeModel turns into `quantization`'s format (kNone: the
// default parts). Until quantised the model is a plain float one.
ModelParts QuantizedModelParts(WeightQuantization quantization);

// Model parts whose projections QuantizeModelInt8 can quantise to the per-channel/per-group
// int8 format: pass them as LoadOptions::parts or to GPTImpl::Create.
ModelParts Int8ModelParts(const Int8Options& options = {});

// Quantises every quantisable projection of `model` (built with QuantizedModelParts or
// Int8ModelParts) and frees their float weights. The model must be on the CPU in float32, or
// on a CUDA device in any float dtype with the block formats (move it first: the quantised
// weights stay where the float ones were); quantising twice is a no-op. FailedPrecondition
// when nothing is quantisable or the model is elsewhere.
absl::Status QuantizeModel(GPTImpl& model);
// The same; the name of the int8-only days.
absl::Status QuantizeModelInt8(GPTImpl& model);

// Bytes of the model's weights as held: every parameter plus the quantised values and scales
// of quantised projections.
int64_t ModelWeightBytes(GPTImpl& model);

}  // namespace lgpt

#endif  // LGPT_CORE_MODEL_QUANTIZE_MODEL_H_
