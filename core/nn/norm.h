// LayerNorm and RMSNorm (with Gemma's unit offset), as LitGPT computes them. Parameter
// names ("weight", "bias") equal LitGPT's so state dicts map one to one.
#ifndef LGPT_CORE_NN_NORM_H_
#define LGPT_CORE_NN_NORM_H_

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "core/config/config.h"

namespace lgpt {

struct NormOptions {
  NormClass kind = NormClass::kRMSNorm;
  int64_t size = 0;
  double eps = 1e-5;
  bool unit_offset = false;  // RMSNorm scales by (1 + weight) (Gemma).
  bool affine = true;        // LayerNorm without weight/bias (OLMo 1).

  // The norm LitGPT's `config.norm_class(size, eps=config.norm_eps)` builds.
  static NormOptions FromConfig(const Config& config, int64_t size);
};

class NormImpl : public torch::nn::Module {
 public:
  explicit NormImpl(const NormOptions& options);
  // x [..., size] -> [..., size], same dtype (RMSNorm computes in float32).
  at::Tensor forward(const at::Tensor& x);
  // The residual step before a norm: *sum = x + delta, returns forward(*sum). Decoding
  // (a few float32 rows, no autograd, RMSNorm) does both in one pass, same values.
  at::Tensor AddForward(const at::Tensor& x, const at::Tensor& delta, at::Tensor* sum);

  const NormOptions& options() const { return options_; }

 private:
  NormOptions options_;
  at::Tensor weight_;  // [size]; undefined without affine
  at::Tensor bias_;    // [size]; LayerNorm only
};
TORCH_MODULE(Norm);

}  // namespace lgpt

#endif  // LGPT_CORE_NN_NORM_H_
