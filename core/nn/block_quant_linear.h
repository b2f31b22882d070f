// Block-quantised projections (q8_0/q4_0-like, core/ops/block_quant.h) entering through the
// linear factory, for every projection site: attention, MLPs, MoE experts and lm_head.
//
// A BlockQuantProjection loads float weights like DenseProjection (same parameter names, so
// checkpoints load unchanged) and is dense until Quantize(), which replaces the float weight
// by the block format and frees it (the "weight" parameter stays registered, empty).
// core/model/quantize_model.h quantises a whole model built with this factory.
//
// The quantised weight lives on the device of the float weight it replaced.
//
// Quantised forward:
//   - CPU float32 input without autograd, any number of rows (decoding, batched decoding,
//     prefill): the integer GEMV of core/ops/block_quant.h, reading each weight byte once per
//     call (1.125 bytes per weight for q8_0, 0.625 for q4_0) and quantising the activations
//     to int8 per 32-block. A row's result does not depend on the other rows, so prefill,
//     chunked prefill, decoding and batched decoding compute every row alike.
//   - CUDA input without autograd (any float dtype, computed in float32): up to
//     kDeviceGemvMaxRows rows the CUDA GEMV of core/ops/block_quant_device.h (the same
//     activation quantisation and integer dots; rows batch-invariant); more rows (prefill)
//     dequantise the weight on the device to the input's dtype and multiply through cuBLAS.
//   - anything else (autograd, other dtypes on the CPU): the weight is dequantised per call
//     (N x K floats, freed after) and multiplied with at::linear; an autograd function keeps
//     only the quantised weight for the backward pass.
// Projections whose in_features is not a multiple of 32 cannot be blocked: the factory
// leaves them dense (float), and Quantize() on one made directly is an InvalidArgument error.
#ifndef LGPT_CORE_NN_BLOCK_QUANT_LINEAR_H_
#define LGPT_CORE_NN_BLOCK_QUANT_LINEAR_H_

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "core/nn/linear_factory.h"
#include "core/ops/block_quant.h"

namespace lgpt {

struct BlockQuantOptions {
  BlockFormat format = BlockFormat::kQ8_0;
  bool quantize_head = true;  // lm_head too (the largest single matrix of small models)
};

class BlockQuantProjectionImpl : public DenseProjectionImpl {
 public:
  BlockQuantProjectionImpl(const LinearSpec& spec, const BlockQuantOptions& options);
  at::Tensor forward(const at::Tensor& x) override;
  at::Tensor DenseWeight() const override;
  // Moving the module moves the quantised tiles and scales too (their dtype never changes).
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;
  using DenseProjectionImpl::to;  // to(dtype): the tiles stay as they are

  // Replaces the float weight by its block-quantised form and frees it (move the model to
  // its device and dtype first). InvalidArgument naming the site when in_features is not a
  // multiple of 32; quantising twice is a no-op.
  absl::Status Quantize();
  // Adopts an already quantised weight (a quantised checkpoint's) and frees the float one.
  // InvalidArgument naming the site when its format, shape or dtypes are not this
  // projection's.
  absl::Status SetQuantized(BlockQuantWeight weight);
  bool quantized() const { return quantized_.defined(); }
  const BlockQuantWeight& quantized_weight() const { return quantized_; }
  const BlockQuantOptions& options() const { return options_; }

 private:
  at::Tensor CpuGemv(const at::Tensor& x) const;        // x on the CPU, float32
  at::Tensor DeviceForward(const at::Tensor& x) const;  // x on the weight's CUDA device

  LinearSpec spec_;
  BlockQuantOptions options_;
  BlockQuantWeight quantized_;
};

// Makes BlockQuantProjections for every site whose in_features is a multiple of 32 (dense
// ones elsewhere, for lm_head without quantize_head, and for the MoE router, whose few
// outputs decide the routing and cost little to read).
class BlockQuantLinearFactory : public LinearFactory {
 public:
  explicit BlockQuantLinearFactory(const BlockQuantOptions& options = {}) : options_(options) {}
  ProjectionPtr Make(const LinearSpec& spec) const override;

 private:
  BlockQuantOptions options_;
};

}  // namespace lgpt

#endif  // LGPT_CORE_NN_BLOCK_QUANT_LINEAR_H_
