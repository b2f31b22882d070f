#include "core/ops/block_quant_device.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/shape_text.h"
#include "core/ops/block_quant_layout.h"

#ifdef LGPT_LIBTORCH_HAS_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "core/ops/block_quant_cuda.h"
#endif

namespace lgpt {
namespace {

absl::Status Invalid(const std::string& argument, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("BlockQuantGemvByParts: ", argument, " ", what));
}

std::string Describe(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  return absl::StrCat(ShapeText(t.sizes()), " ", c10::toString(t.scalar_type()), " on ",
                      t.device().str(), t.is_contiguous() ? "" : " (not contiguous)");
}

absl::Status CheckArguments(const BlockQuantWeight& weight, const at::Tensor& x,
                            const at::Tensor& bias) {
  const absl::Status well_formed = CheckBlockQuantWeight(weight);
  if (!well_formed.ok()) return Invalid("weight", std::string(well_formed.message()));
  const c10::Device device = weight.values.device();
  if (!device.is_cpu() && !device.is_cuda()) {
    return Invalid("weight", absl::StrCat("is on ", device.str(), "; the CPU or CUDA only"));
  }
  const auto expected = [&](const at::Tensor& t, std::vector<int64_t> sizes) {
    return t.defined() && t.scalar_type() == at::kFloat && t.device() == device &&
           t.sizes() == at::IntArrayRef(sizes) && t.is_contiguous();
  };
  if (!x.defined() || x.dim() != 2 || !expected(x, {x.size(0), weight.in_features})) {
    return Invalid("x", absl::StrCat("must be a contiguous float32 [rows, ", weight.in_features,
                                     "] on ", device.str(), ", got ", Describe(x)));
  }
  if (bias.defined() && !expected(bias, {weight.out_features})) {
    return Invalid("bias", absl::StrCat("must be a contiguous float32 [", weight.out_features,
                                        "] on ", device.str(), ", got ", Describe(bias)));
  }
  return absl::OkStatus();
}

// The twin: the kernel's arithmetic in plain loops, parallel over row groups.
at::Tensor GemvOnCpu(const BlockQuantWeight& weight, const at::Tensor& x, const at::Tensor& bias) {
  const int64_t rows = x.size(0), k = weight.in_features, n_out = weight.out_features;
  const int64_t blocks = k / block_quant::kBlock;
  std::vector<int8_t> codes(static_cast<size_t>(rows * k));
  std::vector<float> code_scales(static_cast<size_t>(rows * blocks));
  const float* xs = x.data_ptr<float>();
  for (int64_t i = 0; i < rows * blocks; ++i) {
    code_scales[i] = block_quant::QuantizeActivationBlock(
        xs + i * block_quant::kBlock, codes.data() + i * block_quant::kBlock, nullptr);
  }
  at::Tensor y = at::empty({rows, n_out}, x.options());  // [rows, N]
  const bool q4 = weight.format == BlockFormat::kQ4_0;
  const auto* tiles = weight.values.data_ptr<uint8_t>();
  const auto* scales = reinterpret_cast<const uint16_t*>(weight.scales.data_ptr<at::Half>());
  const float* b = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* out = y.data_ptr<float>();
  at::parallel_for(0, weight.values.size(0), 1, [&](int64_t begin, int64_t end) {
    float parts[block_quant::kGemvParts];
    for (int64_t g = begin; g < end; ++g) {
      const uint8_t* group_tiles = tiles + g * blocks * block_quant::TileBytes(q4);
      const uint16_t* group_scales = scales + g * blocks * block_quant::kGroup;
      for (int64_t lane = 0; lane < block_quant::kGroup; ++lane) {
        const int64_t n = g * block_quant::kGroup + lane;
        if (n >= n_out) break;
        for (int64_t m = 0; m < rows; ++m) {
          for (int p = 0; p < block_quant::kGemvParts; ++p) {
            parts[p] = block_quant::PartSum(group_tiles, group_scales, blocks, q4, lane, p,
                                            codes.data() + m * k, code_scales.data() + m * blocks);
          }
          out[m * n_out + n] = block_quant::CombineParts(parts, 1, b != nullptr ? b[n] : 0.0f);
        }
      }
    }
  });
  return y;
}

// The twin of the dequantisation kernel: every word of every row through DequantizeWord.
template <block_quant::OutputType Out, typename T>
void DequantizeOnCpu(const BlockQuantWeight& weight, T* out) {
  const bool q4 = weight.format == BlockFormat::kQ4_0;
  const int64_t k = weight.in_features, blocks = k / block_quant::kBlock;
  const int64_t words = q4 ? 4 : 8, per_word = block_quant::kBlock / words;
  const auto* tiles = weight.values.data_ptr<uint8_t>();
  const auto* scales = reinterpret_cast<const uint16_t*>(weight.scales.data_ptr<at::Half>());
  at::parallel_for(0, weight.out_features, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const int64_t group = n / block_quant::kGroup, lane = n % block_quant::kGroup;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t tile = group * blocks + b;
        const float scale = paged::HalfToFloat(scales[tile * block_quant::kGroup + lane]);
        for (int64_t word = 0; word < words; ++word) {
          block_quant::DequantizeWord<Out>(tiles + tile * block_quant::TileBytes(q4), q4, lane,
                                           word, scale,
                                           out + n * k + b * block_quant::kBlock + word * per_word);
        }
      }
    }
  });
}

#ifdef LGPT_LIBTORCH_HAS_CUDA
absl::StatusOr<at::Tensor> GemvOnCuda(const BlockQuantWeight& weight, const at::Tensor& x,
                                      const at::Tensor& bias) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = x.size(0), k = weight.in_features;
  at::Tensor y = at::empty({rows, weight.out_features}, x.options());  // [rows, N]
  at::Tensor codes = at::empty({rows, k}, x.options().dtype(at::kChar));
  at::Tensor code_scales = at::empty({rows, k / block_quant::kBlock}, x.options());
  cuda::BlockQuantGemvArgs a;
  a.tiles = weight.values.data_ptr<uint8_t>();
  a.scales = reinterpret_cast<const uint16_t*>(weight.scales.data_ptr<at::Half>());
  a.x = x.data_ptr<float>();
  a.bias = bias.defined() ? bias.data_ptr<float>() : nullptr;
  a.y = y.data_ptr<float>();
  a.codes = codes.data_ptr<int8_t>();
  a.code_scales = code_scales.data_ptr<float>();
  a.rows = rows;
  a.n_out = weight.out_features;
  a.k = k;
  a.q4 = weight.format == BlockFormat::kQ4_0;
  const int error = cuda::LaunchBlockQuantGemv(a, c10::cuda::getCurrentCUDAStream().stream());
  if (error != 0) {
    return absl::InternalError(
        absl::StrCat("BlockQuantGemvByParts: CUDA launch failed: error ", error));
  }
  return y;
}
#endif

}  // namespace

BlockQuantWeight BlockQuantWeightTo(const BlockQuantWeight& weight, c10::Device device) {
  BlockQuantWeight moved = weight;
  if (!weight.defined() || weight.values.device() == device) return moved;
  moved.values = weight.values.to(device);
  moved.scales = weight.scales.to(device);
  return moved;
}

absl::StatusOr<at::Tensor> BlockQuantGemvByParts(const BlockQuantWeight& weight,
                                                 const at::Tensor& x, const at::Tensor& bias) {
  const absl::Status checked = CheckArguments(weight, x, bias);
  if (!checked.ok()) return checked;
  if (x.device().is_cpu()) return GemvOnCpu(weight, x, bias);
#ifdef LGPT_LIBTORCH_HAS_CUDA
  return GemvOnCuda(weight, x, bias);
#else
  return Invalid("x", absl::StrCat("is on ", x.device().str(),
                                   ", and this build has no CUDA kernels (--config=cuda)"));
#endif
}

absl::StatusOr<at::Tensor> DequantizeBlocksTo(const BlockQuantWeight& weight,
                                              at::ScalarType dtype) {
  const absl::Status well_formed = CheckBlockQuantWeight(weight);
  if (!well_formed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DequantizeBlocksTo: weight ", well_formed.message()));
  }
  block_quant::OutputType type;
  if (dtype == at::kFloat) {
    type = block_quant::OutputType::kFloat32;
  } else if (dtype == at::kBFloat16) {
    type = block_quant::OutputType::kBFloat16;
  } else if (dtype == at::kHalf) {
    type = block_quant::OutputType::kFloat16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("DequantizeBlocksTo: dtype must be float32, bfloat16 or float16, got ",
                     c10::toString(dtype)));
  }
  const c10::Device device = weight.values.device();
  at::Tensor out = at::empty({weight.out_features, weight.in_features},
                             at::TensorOptions().dtype(dtype).device(device));  // [N, K]
  if (device.is_cpu()) {
    switch (type) {
      case block_quant::OutputType::kFloat32:
        DequantizeOnCpu<block_quant::OutputType::kFloat32>(weight, out.data_ptr<float>());
        break;
      case block_quant::OutputType::kBFloat16:
        DequantizeOnCpu<block_quant::OutputType::kBFloat16>(
            weight, reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()));
        break;
      case block_quant::OutputType::kFloat16:
        DequantizeOnCpu<block_quant::OutputType::kFloat16>(
            weight, reinterpret_cast<uint16_t*>(out.data_ptr<at::Half>()));
        break;
    }
    return out;
  }
#ifdef LGPT_LIBTORCH_HAS_CUDA
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard guard(device);
    const int error = cuda::LaunchDequantizeBlocks(
        weight.values.data_ptr<uint8_t>(),
        reinterpret_cast<const uint16_t*>(weight.scales.data_ptr<at::Half>()), weight.out_features,
        weight.in_features, weight.format == BlockFormat::kQ4_0, static_cast<int>(type),
        out.data_ptr(), c10::cuda::getCurrentCUDAStream().stream());
    if (error != 0) {
      return absl::InternalError(
          absl::StrCat("DequantizeBlocksTo: CUDA launch failed: error ", error));
    }
    return out;
  }
#endif
  return absl::InvalidArgumentError(absl::StrCat("DequantizeBlocksTo: the weight is on ",
                                                 device.str(), "; the CPU or CUDA only"));
}

bool BlockQuantHasCudaKernel() {
#ifdef LGPT_LIBTORCH_HAS_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace lgpt
