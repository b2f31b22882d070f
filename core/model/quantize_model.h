// int8 weight-only quantisation of a whole model (see core/ops/quantize.h for the format).
//
//   LoadOptions load;
//   load.parts = Int8ModelParts();           // projections that can become int8
//   LoadedModel loaded = *LoadCheckpoint(dir, load);
//   RETURN_IF_ERROR(QuantizeModelInt8(*loaded.model));
//
// The quantised model keeps float32 embeddings, norms and biases; the int8 GEMV serves
// decoding on the CPU, larger inputs dequantise per call.
#ifndef LGPT_CORE_MODEL_QUANTIZE_MODEL_H_
#define LGPT_CORE_MODEL_QUANTIZE_MODEL_H_

#include "absl/status/status.h"
#include "core/model/gpt.h"
#include "core/model/model_parts.h"
#include "core/nn/int8_linear.h"

namespace lgpt {

// Model parts whose projections QuantizeModelInt8 can quantise: pass them as
// LoadOptions::parts or to GPTImpl::Create. Until quantised the model is a plain float one.
ModelParts Int8ModelParts(const Int8Options& options = {});

// Quantises every projection of `model` to int8 and frees their float weights. The model
// must have been built with Int8ModelParts and be on the CPU in float32 (move it first);
// quantising twice is a no-op.
absl::Status QuantizeModelInt8(GPTImpl& model);

// Bytes of the model's weights as held: every parameter plus the int8 values and scales of
// quantised projections.
int64_t ModelWeightBytes(GPTImpl& model);

}  // namespace lgpt

#endif  // LGPT_CORE_MODEL_QUANTIZE_MODEL_H_
