// One token per row of logits, drawn on the logits' device: a CUDA kernel of ours on a GPU (one
// launch for a step's rows, the ids alone read back), its twin on the CPU. Each row has its
// options (temperature, top_k, top_p, min_p as core/model/sampling.h means them) and a 64-bit
// key: the draw is a function of the row's logits, options and key alone, the same token on the
// CPU and on a GPU, whatever the other rows (row_sampler_layout.h says how).
//
//   std::vector<RowSampling> rows = {{/*temperature=*/0.8, /*top_k=*/50, /*top_p=*/0.95,
//                                     /*min_p=*/0, /*key=*/key_from_the_requests_generator}};
//   ASSIGN_OR_RETURN(std::vector<int64_t> tokens, SampleRows(logits, rows));
#ifndef LGPT_CORE_OPS_ROW_SAMPLER_H_
#define LGPT_CORE_OPS_ROW_SAMPLER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace lgpt {

struct RowSampling {
  double temperature = 0;  // 0 (or below float's range): greedy, the first largest logit
  int64_t top_k = 0;       // 0: every token
  double top_p = 1;        // in [0, 1]; 0: greedy
  double min_p = 0;        // in [0, 1]
  uint64_t key = 0;        // the draw's randomness
};

// SampleRows' token for a row holding NaN or +inf, or nothing but -inf.
constexpr int64_t kUnusableRow = -1;

// logits [B, V] float32 on the CPU or a CUDA device, `rows` B options -> B token ids (or
// kUnusableRow), read to the host in one transfer. InvalidArgument naming the argument (and the
// row and field of `rows`) for other shapes, dtypes, devices, V above 2^23, or options out of
// range.
absl::StatusOr<std::vector<int64_t>> SampleRows(const at::Tensor& logits,
                                                absl::Span<const RowSampling> rows);

// The tokens a row's draw chooses among (the CPU twin's kept set, ascending ids): its first
// largest logit alone for greedy options; those top_k, min_p and top_p keep otherwise; empty for
// an unusable row. `row`: [V] float32 on the CPU. Errors as SampleRows'.
absl::StatusOr<std::vector<int64_t>> KeptTokens(const at::Tensor& row, const RowSampling& options);

// Whether this build has the CUDA kernel (a build against a CUDA LibTorch).
bool RowSamplerHasCudaKernel();

}  // namespace lgpt

#endif  // LGPT_CORE_OPS_ROW_SAMPLER_H_
