// LayerNorm and RMSNorm (with Gemma's unit offset), as LitGPT computes them. Parameter
// names ("weight", "bias") equal LitGPT's so state dicts map one to one.
#ifndef LGPT_CORE_NN_NORM_H_
#define LGPT_CORE_NN_NORM_H_

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>

#include "core/config/config.h"

namespace lgpt {

// The features of an RMSNorm split over tensor-parallel ranks (OLMo 2's q/k norm spans every
// head, and each rank holds only its heads): each rank sums the squares of its slice, the sums
// are added over the ranks, and the mean divides by the features of all ranks together.
class NormFeatureShards {
 public:
  virtual ~NormFeatureShards() = default;
  // partial [..., 1] float32: this rank's sums of squares, replaced by the sums over every
  // rank. Throws std::runtime_error when a rank fails (as a row-parallel projection does).
  virtual void SumOverRanks(at::Tensor& partial) const = 0;
  // The features of every rank together, copies of replicated ones counted each time (their
  // squares are summed each time too).
  virtual int64_t total_size() const = 0;
};

struct NormOptions {
  NormClass kind = NormClass::kRMSNorm;
  int64_t size = 0;
  double eps = 1e-5;
  bool unit_offset = false;  // RMSNorm scales by (1 + weight) (Gemma).
  bool affine = true;        // LayerNorm without weight/bias (OLMo 1).
  // RMSNorm over features split across ranks; null: this rank holds them all.
  std::shared_ptr<const NormFeatureShards> shards;

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
