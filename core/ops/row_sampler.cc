#include "core/ops/row_sampler.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/base/device.h"
#include "core/base/shape_text.h"
#include "core/ops/row_sampler_layout.h"

#ifdef LGPT_LIBTORCH_HAS_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "core/ops/row_sampler_cuda.h"
#endif

namespace lgpt {
namespace {

using row_sampler::RowParams;

absl::Status Invalid(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("SampleRows: ", where, " ", what));
}

absl::Status CheckOptions(const RowSampling& r, size_t row) {
  const std::string where = absl::StrCat("rows[", row, "].");
  if (!(r.temperature >= 0) || std::isinf(r.temperature)) {
    return Invalid(where + "temperature",
                   absl::StrCat("must be finite and >= 0, got ", r.temperature));
  }
  if (r.top_k < 0) return Invalid(where + "top_k", absl::StrCat("must be >= 0, got ", r.top_k));
  if (!(r.top_p >= 0 && r.top_p <= 1)) {
    return Invalid(where + "top_p", absl::StrCat("must be in [0, 1], got ", r.top_p));
  }
  if (!(r.min_p >= 0 && r.min_p <= 1)) {
    return Invalid(where + "min_p", absl::StrCat("must be in [0, 1], got ", r.min_p));
  }
  return absl::OkStatus();
}

absl::Status CheckLogits(const at::Tensor& logits, int64_t dims) {
  const auto describe = [&] {
    if (!logits.defined()) return std::string("undefined");
    return absl::StrCat(ShapeText(logits.sizes()), " ", c10::toString(logits.scalar_type()), " on ",
                        logits.device().str());
  };
  if (!logits.defined() || logits.dim() != dims || logits.scalar_type() != at::kFloat ||
      (!logits.device().is_cpu() && !logits.device().is_cuda())) {
    return Invalid("logits", absl::StrCat("must be float32 with ", dims,
                                          " dimensions on the CPU or CUDA, got ", describe()));
  }
  const int64_t vocab = logits.size(-1);
  if (vocab < 1 || vocab > row_sampler::kMaxVocab) {
    return Invalid("logits", absl::StrCat("must have between 1 and ", row_sampler::kMaxVocab,
                                          " tokens a row, got ", describe()));
  }
  return absl::OkStatus();
}

RowParams ToParams(const RowSampling& r) {
  RowParams p;
  p.temperature = static_cast<float>(r.temperature);
  p.top_k = r.top_k;
  p.top_p = r.top_p;
  const float min_p = static_cast<float>(r.min_p);
  p.log_min_p =
      min_p >= FLT_MIN ? row_sampler::LogPositive(min_p) : -std::numeric_limits<float>::infinity();
  p.key = r.key;
  return p;
}

// The twin of the kernel's radix descent (row_sampler.cu Descend): the same histograms, filled
// in index order.
template <typename Weigh>
uint64_t Descend(int64_t vocab, double limit, const Weigh& weigh) {
  uint32_t counts[row_sampler::kBuckets];
  unsigned long long weights[row_sampler::kBuckets];  // NOLINT: the kernel's type
  uint64_t prefix = 0;
  unsigned long long above = 0;  // NOLINT
  for (int pass = 0; pass < row_sampler::kRadixPasses; ++pass) {
    std::fill(counts, counts + row_sampler::kBuckets, 0u);
    std::fill(weights, weights + row_sampler::kBuckets, 0ull);
    for (int64_t i = 0; i < vocab; ++i) {
      uint64_t key = 0, weight = 0;
      if (!weigh(i, &key, &weight) || !row_sampler::InPlay(key, prefix, pass)) continue;
      const int b = row_sampler::Bucket(key, pass);
      ++counts[b];
      weights[b] += weight;
    }
    const int b = row_sampler::ChooseBucket(counts, weights, limit, &above);
    prefix |= static_cast<uint64_t>(b) << row_sampler::Shift(pass);
  }
  return prefix;
}

// The twin of the kernel (row_sampler.cu SampleRowsKernel) for one row x [vocab]; `kept` (when
// not null) receives the tokens the race runs over.
int64_t SampleRowOnCpu(const float* x, int64_t vocab, const RowParams& p,
                       std::vector<int64_t>* kept) {
  float best = -std::numeric_limits<float>::infinity();
  int64_t best_index = vocab;
  bool broken = false, finite = false;
  for (int64_t i = 0; i < vocab; ++i) {
    broken = broken || std::isnan(x[i]) || x[i] == std::numeric_limits<float>::infinity();
    finite = finite || std::isfinite(x[i]);
    if (row_sampler::Beats(x[i], i, best, best_index)) {
      best = x[i];
      best_index = i;
    }
  }
  if (broken || !finite) return kUnusableRow;
  if (row_sampler::IsGreedy(p)) {
    if (kept != nullptr) kept->push_back(best_index);
    return best_index;
  }
  uint64_t kth = 0;
  if (p.top_k > 0 && p.top_k < vocab) {
    kth = Descend(vocab, static_cast<double>(p.top_k), [x](int64_t i, uint64_t* key, uint64_t* w) {
      *key = row_sampler::RankKey(x[i], i);
      *w = 1;
      return true;
    });
  }
  const auto candidate = [&](int64_t i, uint64_t* key, uint64_t* weight) {
    *key = row_sampler::RankKey(x[i], i);
    return row_sampler::CandidateWeight(x[i], *key, best, p, kth, weight);
  };
  uint64_t boundary = 0;
  if (p.top_p < 1) {
    unsigned long long total = 0;  // NOLINT
    for (int64_t i = 0; i < vocab; ++i) {
      uint64_t key, weight;
      if (candidate(i, &key, &weight)) total += weight;
    }
    boundary = Descend(vocab, p.top_p * static_cast<double>(total), candidate);
  }
  float score = -std::numeric_limits<float>::infinity();
  int64_t chosen = vocab;
  for (int64_t i = 0; i < vocab; ++i) {
    uint64_t key, weight;
    if (!candidate(i, &key, &weight) || key < boundary) continue;
    if (kept != nullptr) kept->push_back(i);
    const float tempered = row_sampler::Tempered(x[i], best, p.temperature);
    const float mine = row_sampler::GumbelScore(tempered, p.key, i);
    if (row_sampler::Beats(mine, i, score, chosen)) {
      score = mine;
      chosen = i;
    }
  }
  return chosen;
}

#ifdef LGPT_LIBTORCH_HAS_CUDA
absl::StatusOr<std::vector<int64_t>> SampleOnCuda(const at::Tensor& logits,
                                                  const std::vector<RowParams>& params) {
  const c10::cuda::CUDAGuard guard(logits.device());
  const int64_t rows = logits.size(0);
  // [rows * sizeof(RowParams)] bytes, copied to the device with the launch's stream order.
  const at::Tensor host_params =
      at::from_blob(const_cast<RowParams*>(params.data()),
                    {static_cast<int64_t>(params.size() * sizeof(RowParams))}, at::kByte);
  const at::Tensor device_params = ToDeviceQueued(host_params, logits.device());
  at::Tensor tokens = at::empty({rows}, logits.options().dtype(at::kLong));  // [B]
  const int error = cuda::LaunchSampleRows(
      logits.data_ptr<float>(), rows, logits.size(1), logits.stride(0),
      reinterpret_cast<const RowParams*>(device_params.data_ptr<uint8_t>()),
      tokens.data_ptr<int64_t>(), c10::cuda::getCurrentCUDAStream().stream());
  if (error != 0) {
    return absl::InternalError(absl::StrCat("SampleRows: CUDA launch failed: ",
                                            cudaGetErrorString(static_cast<cudaError_t>(error))));
  }
  const at::Tensor host = tokens.cpu();
  return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + rows);
}
#endif

}  // namespace

absl::StatusOr<std::vector<int64_t>> SampleRows(const at::Tensor& logits,
                                                absl::Span<const RowSampling> rows) {
  if (absl::Status checked = CheckLogits(logits, 2); !checked.ok()) return checked;
  if (static_cast<int64_t>(rows.size()) != logits.size(0)) {
    return Invalid("rows", absl::StrCat("must hold one entry per row of logits (", logits.size(0),
                                        "), got ", rows.size()));
  }
  std::vector<RowParams> params;
  params.reserve(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    if (absl::Status checked = CheckOptions(rows[r], r); !checked.ok()) return checked;
    params.push_back(ToParams(rows[r]));
  }
  // Rows of unit stride (the kernel reads a row's tokens contiguously).
  const at::Tensor x = logits.stride(1) == 1 ? logits : logits.contiguous();  // [B, V]
  if (x.device().is_cpu()) {
    std::vector<int64_t> tokens(rows.size());
    const int64_t vocab = x.size(1);
    at::parallel_for(0, x.size(0), 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        tokens[b] =
            SampleRowOnCpu(x.data_ptr<float>() + b * x.stride(0), vocab, params[b], nullptr);
      }
    });
    return tokens;
  }
#ifdef LGPT_LIBTORCH_HAS_CUDA
  try {
    return SampleOnCuda(x, params);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("SampleRows: ", e.what_without_backtrace()));
  }
#else
  return Invalid("logits", absl::StrCat("are on ", x.device().str(),
                                        ", and this build has no CUDA kernels (--config=cuda)"));
#endif
}

absl::StatusOr<std::vector<int64_t>> KeptTokens(const at::Tensor& row, const RowSampling& options) {
  if (absl::Status checked = CheckLogits(row, 1); !checked.ok()) return checked;
  if (!row.device().is_cpu()) return Invalid("row", "must be on the CPU");
  if (absl::Status checked = CheckOptions(options, 0); !checked.ok()) return checked;
  const at::Tensor x = row.contiguous();
  std::vector<int64_t> kept;
  SampleRowOnCpu(x.data_ptr<float>(), x.size(0), ToParams(options), &kept);
  return kept;
}

bool RowSamplerHasCudaKernel() {
#ifdef LGPT_LIBTORCH_HAS_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace lgpt
