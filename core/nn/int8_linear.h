// int8 weight-only quantised projections entering through the linear factory.
//
// Int8LinearFactory makes projections that load float weights like DenseProjection (same
// parameter names, so checkpoints load unchanged) and behave as dense until Quantize(),
// which replaces the float weight with int8 values and scales (a quarter of the memory).
// core/model/quantize_model.h quantises a whole model built with this factory.
//
// Quantised forward: few CPU rows (decoding) run the int8 GEMV of core/ops/quantize.h, which
// reads a quarter of the bytes of the float path; other inputs dequantise the weight and call
// at::linear.
#ifndef LGPT_CORE_NN_INT8_LINEAR_H_
#define LGPT_CORE_NN_INT8_LINEAR_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/nn/linear_factory.h"
#include "core/ops/quantize.h"

namespace lgpt {

struct Int8Options {
  // 0: per output channel; else a divisor of every quantised in_features, multiple of 8.
  int64_t group_size = 0;
  bool quantize_head = true;  // lm_head too (the largest single matrix of small models)
};

class Int8ProjectionImpl : public DenseProjectionImpl {
 public:
  Int8ProjectionImpl(const LinearSpec& spec, const Int8Options& options);
  // Quantised: the GEMV for few CPU rows without autograd; otherwise the dequantised weight,
  // through an autograd function that keeps only the int8 weight for the backward pass (a
  // frozen int8 base under trained LoRA weights stores no float copy of itself).
  at::Tensor forward(const at::Tensor& x) override;
  at::Tensor DenseWeight() const override;

  // Replaces the float weight by its int8 form; the "weight" parameter becomes empty (so
  // move the model to its device and dtype first). Fails on group sizes that do not divide
  // in_features; quantising twice is a no-op.
  absl::Status Quantize();
  bool quantized() const { return quantized_.values.defined(); }
  const Int8Weight& int8_weight() const { return quantized_; }

 private:
  Int8Options options_;
  Int8Weight quantized_;
};

// Makes Int8Projections for every site (dense ones for lm_head without quantize_head).
class Int8LinearFactory : public LinearFactory {
 public:
  explicit Int8LinearFactory(const Int8Options& options = {}) : options_(options) {}
  ProjectionPtr Make(const LinearSpec& spec) const override;

 private:
  Int8Options options_;
};

}  // namespace lgpt

#endif  // LGPT_CORE_NN_INT8_LINEAR_H_
