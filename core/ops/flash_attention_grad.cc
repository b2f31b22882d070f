#include "core/ops/flash_attention_grad.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <vector>

#include "core/ops/flash_attention.h"
#include "core/ops/gemv.h"

namespace lgpt {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The scalars of AttentionParams and the kernel choice, kept in the node's saved data.
void SaveParams(AutogradContext* ctx, const AttentionParams& params, bool use_avx2) {
  ctx->saved_data["scale"] = params.scale;
  ctx->saved_data["capped"] = params.softcap.has_value();
  ctx->saved_data["softcap"] = params.softcap.value_or(0.0);
  ctx->saved_data["window"] = params.sliding_window;
  ctx->saved_data["avx2"] = use_avx2;
}

AttentionParams LoadParams(AutogradContext* ctx) {
  AttentionParams params;
  params.scale = ctx->saved_data["scale"].toDouble();
  if (ctx->saved_data["capped"].toBool()) params.softcap = ctx->saved_data["softcap"].toDouble();
  params.sliding_window = ctx->saved_data["window"].toInt();
  return params;
}

class FlashAttentionFunction : public torch::autograd::Function<FlashAttentionFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& keys,
                            const at::Tensor& values, const at::Tensor& query_positions,
                            const at::Tensor& key_positions, const AttentionParams& params,
                            bool use_avx2) {
    const at::Tensor kc = keys.contiguous(), vc = values.contiguous();
    const int64_t groups = kc.size(1), entries = kc.size(2), hs = kc.size(3);
    const float* k_data = kc.data_ptr<float>();
    const float* v_data = vc.data_ptr<float>();
    auto runs_of = [&](int64_t b, int64_t g, std::vector<KVRun>* runs) {
      KVRun run;
      run.keys = k_data + (b * groups + g) * entries * hs;
      run.values = v_data + (b * groups + g) * entries * hs;
      run.positions = KeyPositionRun::Of(key_positions, b, g);
      run.entries = entries;
      runs->push_back(run);
    };
    const at::Tensor qc = q.contiguous();
    at::Tensor lse;
    at::Tensor out = FlashAttention(qc, groups, runs_of, query_positions, params, use_avx2, &lse);
    ctx->save_for_backward({qc, kc, vc, out, lse, query_positions, key_positions});
    SaveParams(ctx, params, use_avx2);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const FlashGradients grads = FlashAttentionBackward(
        saved[0], saved[1], saved[2], saved[3], saved[4], grad_outputs[0], saved[5], saved[6],
        LoadParams(ctx), ctx->saved_data["avx2"].toBool());
    // One gradient per forward argument: none for the positions, params and use_avx2.
    return {grads.q,      grads.keys,   grads.values, at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool FlashAttentionTrainableApplies(const at::Tensor& q, const at::Tensor& keys,
                                    const at::Tensor& values, const at::Tensor& query_positions,
                                    const at::Tensor& key_positions) {
  for (const at::Tensor* t : {&q, &keys, &values}) {
    if (!t->defined() || !t->device().is_cpu() || t->scalar_type() != at::kFloat || t->dim() != 4) {
      return false;
    }
  }
  if (q.size(2) < 1 || q.size(3) < 1 || keys.size(1) < 1 || keys.size(2) < 1 ||
      keys.sizes() != values.sizes() || q.size(0) != keys.size(0) || q.size(3) != keys.size(3) ||
      q.size(1) % keys.size(1) != 0) {
    return false;
  }
  if (!query_positions.device().is_cpu() || query_positions.scalar_type() != at::kLong ||
      query_positions.dim() != 2 || query_positions.size(0) != q.size(0) ||
      query_positions.size(1) != q.size(2)) {
    return false;
  }
  return KeyPositionRun::Readable(key_positions) && key_positions.size(0) == q.size(0) &&
         (key_positions.size(1) == 1 || key_positions.size(1) == keys.size(1)) &&
         key_positions.size(2) == keys.size(2);
}

at::Tensor FlashAttentionTrainable(const at::Tensor& q, const at::Tensor& keys,
                                   const at::Tensor& values, const at::Tensor& query_positions,
                                   const at::Tensor& key_positions, const AttentionParams& params,
                                   bool use_avx2) {
  return FlashAttentionFunction::apply(q, keys, values, query_positions, key_positions, params,
                                       use_avx2 && CpuHasAvx2Fma());
}

}  // namespace lgpt
