// The CUDA row sampler: one thread block per row of logits. Every decision is an integer sum
// or an order-independent comparison (row_sampler_layout.h), so the token does not depend on
// how the threads split the row: the CPU twin (row_sampler.cc) chooses the same one.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/ops/row_sampler_cuda.h"
#include "core/ops/row_sampler_layout.h"

namespace lgpt {
namespace cuda {
namespace {

using row_sampler::kBuckets;
using row_sampler::RowParams;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullWarp = 0xffffffffu;

// What a block shares: the radix histograms, the reductions' partial results, and the values
// every thread needs after a step of thread 0.
struct Shared {
  uint32_t counts[kBuckets];
  unsigned long long weights[kBuckets];  // NOLINT: atomicAdd's type
  float warp_score[kWarps];
  int64_t warp_index[kWarps];
  unsigned long long total;  // NOLINT
  uint64_t prefix;
  float best;
  int64_t best_index;
};

// The block's winner of (score, index) pairs (Beats: the higher score, then the lower index), in
// every thread. A total order, so the result is the same for any split of the pairs.
__device__ void BlockBest(Shared& s, float& score, int64_t& index) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_score = __shfl_down_sync(kFullWarp, score, offset);
    const int64_t other_index = __shfl_down_sync(kFullWarp, index, offset);
    if (row_sampler::Beats(other_score, other_index, score, index)) {
      score = other_score;
      index = other_index;
    }
  }
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) {
    s.warp_score[warp] = score;
    s.warp_index[warp] = index;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w) {
      if (row_sampler::Beats(s.warp_score[w], s.warp_index[w], s.warp_score[0], s.warp_index[0])) {
        s.warp_score[0] = s.warp_score[w];
        s.warp_index[0] = s.warp_index[w];
      }
    }
  }
  __syncthreads();
  score = s.warp_score[0];
  index = s.warp_index[0];
  __syncthreads();
}

// A token's part in a descent: its rank key (Key), and whether it takes part with what weight
// (Weight; keys a pass does not look at skip it and its exp).
struct TopKWeigh {
  const float* x;
  __device__ uint64_t Key(int64_t i) const { return row_sampler::RankKey(x[i], i); }
  __device__ bool Weight(int64_t, uint64_t, uint64_t* weight) const {
    *weight = 1;
    return true;
  }
};

// Candidates of top_p: within top_k (kth: the k-th key, or 0) and not dropped by min_p; their
// fixed-point masses.
struct TopPWeigh {
  const float* x;
  float best;
  RowParams p;
  uint64_t kth;
  __device__ uint64_t Key(int64_t i) const { return row_sampler::RankKey(x[i], i); }
  __device__ bool Weight(int64_t i, uint64_t key, uint64_t* weight) const {
    return row_sampler::CandidateWeight(x[i], key, best, p, kth, weight);
  }
  __device__ bool operator()(int64_t i, uint64_t* key, uint64_t* weight) const {
    *key = Key(i);
    return Weight(i, *key, weight);
  }
};

// The last key, in descending order, whose more likely keys (taking part) weigh less than
// `limit`: eight passes of byte histograms. Lanes of a warp that fall in one bucket add their
// counts and weights once (__match_any_sync), so a crowded bucket costs one atomic a warp.
template <typename Weigh>
__device__ uint64_t Descend(Shared& s, int64_t vocab, double limit, const Weigh& weigh) {
  const int lane = threadIdx.x % 32;
  const int64_t warp_start = (threadIdx.x / 32) * 32;
  uint64_t prefix = 0;
  unsigned long long above = 0;  // NOLINT: thread 0's
  for (int pass = 0; pass < row_sampler::kRadixPasses; ++pass) {
    for (int b = threadIdx.x; b < kBuckets; b += kThreads) {
      s.counts[b] = 0;
      s.weights[b] = 0;
    }
    __syncthreads();
    for (int64_t base = warp_start; base < vocab; base += kThreads) {
      const int64_t i = base + lane;
      uint64_t key = 0, weight = 0;
      bool takes_part = false;
      if (i < vocab) {
        key = weigh.Key(i);
        takes_part = row_sampler::InPlay(key, prefix, pass) && weigh.Weight(i, key, &weight);
      }
      // Later passes look at few keys: most warps have none and skip the aggregation.
      if (__ballot_sync(kFullWarp, takes_part) == 0) continue;
      if (!takes_part) weight = 0;
      const int bucket = takes_part ? row_sampler::Bucket(key, pass) : kBuckets;
      const unsigned peers = __match_any_sync(kFullWarp, bucket);
      unsigned long long sum = 0;  // NOLINT
      for (int src = 0; src < 32; ++src) {
        const unsigned long long w =                                               // NOLINT
            __shfl_sync(kFullWarp, static_cast<unsigned long long>(weight), src);  // NOLINT
        if ((peers >> src) & 1u) sum += w;
      }
      if (takes_part && lane == __ffs(peers) - 1) {
        atomicAdd(&s.counts[bucket], static_cast<uint32_t>(__popc(peers)));
        if (sum != 0) atomicAdd(&s.weights[bucket], sum);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const int b = row_sampler::ChooseBucket(s.counts, s.weights, limit, &above);
      s.prefix = prefix | (static_cast<uint64_t>(b) << row_sampler::Shift(pass));
    }
    __syncthreads();
    prefix = s.prefix;
    __syncthreads();
  }
  return prefix;
}

// The candidates' total mass, the same sum in any order.
__device__ unsigned long long TotalMass(Shared& s, int64_t vocab, const TopPWeigh& weigh) {
  if (threadIdx.x == 0) s.total = 0;
  __syncthreads();
  unsigned long long mine = 0;  // NOLINT
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    uint64_t key, weight;
    if (weigh(i, &key, &weight)) mine += weight;
  }
  for (int offset = 16; offset > 0; offset >>= 1) mine += __shfl_down_sync(kFullWarp, mine, offset);
  if (threadIdx.x % 32 == 0) atomicAdd(&s.total, mine);
  __syncthreads();
  return s.total;
}

__global__ void __launch_bounds__(kThreads)
    SampleRowsKernel(const float* logits, int64_t vocab, int64_t row_stride,
                     const RowParams* params, int64_t* tokens) {
  __shared__ Shared s;
  const int64_t row = blockIdx.x;
  const float* x = logits + row * row_stride;
  const RowParams p = params[row];
  // The best token, and whether the row can be sampled at all.
  float best = -INFINITY;
  int64_t best_index = vocab;
  int broken = 0, finite = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = x[i];
    broken |= isnan(v) || v == INFINITY;
    finite |= isfinite(v);
    if (row_sampler::Beats(v, i, best, best_index)) {
      best = v;
      best_index = i;
    }
  }
  broken = __syncthreads_or(broken);
  finite = __syncthreads_or(finite);
  BlockBest(s, best, best_index);
  if (broken || !finite) {
    if (threadIdx.x == 0) tokens[row] = -1;
    return;
  }
  if (row_sampler::IsGreedy(p)) {
    if (threadIdx.x == 0) tokens[row] = best_index;
    return;
  }
  uint64_t kth = 0;  // top_k's last key: tokens below it are out
  if (p.top_k > 0 && p.top_k < vocab) {
    kth = Descend(s, vocab, static_cast<double>(p.top_k), TopKWeigh{x});
  }
  const TopPWeigh candidate{x, best, p, kth};
  uint64_t boundary = 0;  // top_p's last key
  if (p.top_p < 1) {
    const double limit = p.top_p * static_cast<double>(TotalMass(s, vocab, candidate));
    boundary = Descend(s, vocab, limit, candidate);
  }
  // The Gumbel-max race among the kept tokens.
  float score = -INFINITY;
  int64_t chosen = vocab;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    uint64_t key, weight;
    if (!candidate(i, &key, &weight) || key < boundary) continue;
    const float tempered = row_sampler::Tempered(x[i], best, p.temperature);
    const float mine = row_sampler::GumbelScore(tempered, p.key, i);
    if (row_sampler::Beats(mine, i, score, chosen)) {
      score = mine;
      chosen = i;
    }
  }
  BlockBest(s, score, chosen);
  if (threadIdx.x == 0) tokens[row] = chosen;
}

}  // namespace

int LaunchSampleRows(const float* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                     const RowParams* params, int64_t* tokens, void* stream) {
  if (rows == 0) return 0;
  SampleRowsKernel<<<static_cast<unsigned>(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      logits, vocab, row_stride, params, tokens);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace cuda
}  // namespace lgpt
