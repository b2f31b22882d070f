// Quantised checkpoints: a model block-quantised once (QuantizeModel) and saved, so later
// loads read 1.06 (int8) or 0.56 (int4) bytes per weight, skip the float weights and the
// quantisation, and never hold a float copy.
//
// The file is <checkpoint_dir>/model.quantized.safetensors (beside model_config.yaml and the
// tokenizer; LoadCheckpoint prefers it to the float files). Its metadata:
//   "lgpt.format"           "block-quant-v1": the tile layout of core/ops/block_quant.h
//   "lgpt.weights"          "q8_0" or "q4_0"
//   "lgpt.tied_embedding"   "true" when transformer.wte shares lm_head's table (stored once)
//   "lgpt.crc32.<tensor>"   CRC-32 of each tensor's bytes, 8 hex digits
// Its tensors: every float parameter under its LitGPT name (norms, biases, the MoE router,
// projections left dense), and for each quantised matrix <name> (a projection's
// "...attn.qkv.weight", "lm_head.weight", "transformer.wte.weight") two tensors:
//   <name>.qvalues  uint8   [ceil(N / 16), K / 32, 512 (q8_0) or 256 (q4_0)]
//   <name>.qscales  float16 [ceil(N / 16), K / 32, 16]
// Loading checks the header, every shape and dtype against the model config, the CRC-32s
// (unless turned off), that scales are finite, and that nothing is missing or left over.
#ifndef LGPT_CORE_MODEL_QUANTIZED_CHECKPOINT_H_
#define LGPT_CORE_MODEL_QUANTIZED_CHECKPOINT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/model/gpt.h"
#include "core/model/model_parts.h"
#include "core/ops/block_quant.h"

namespace lgpt {

inline constexpr char kQuantizedWeightsFile[] = "model.quantized.safetensors";

// Writes the quantised `model` (every quantisable projection quantised) to `path`, under a
// temporary name renamed into place. FailedPrecondition when the model holds no
// block-quantised projection (run QuantizeModel first) or holds PEFT weights (merge first).
absl::Status SaveQuantizedCheckpoint(GPTImpl& model, const std::string& path);

// The block format of a quantised checkpoint, from its header alone. InvalidArgument when the
// metadata is missing or names an unknown format or layout.
absl::StatusOr<BlockFormat> QuantizedCheckpointFormat(const std::string& path);

// Model parts that build a model able to load a checkpoint of `format` (block-quantised
// projections of that format wherever QuantizeModel would put them).
ModelParts QuantizedCheckpointParts(BlockFormat format);

// Loads the file into `model` (built with QuantizedCheckpointParts or parts of the same
// format; on the CPU in float32). Errors name the file and the tensor.
absl::Status LoadQuantizedCheckpoint(GPTImpl& model, const std::string& path,
                                     bool verify_checksums = true);

}  // namespace lgpt

#endif  // LGPT_CORE_MODEL_QUANTIZED_CHECKPOINT_H_
