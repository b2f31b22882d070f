// The arithmetic of drawing one token per row of logits on a device (core/ops/row_sampler.h),
// shared by the CUDA kernel (row_sampler.cu) and its CPU twin (row_sampler.cc) as
// __host__ __device__ code without LibTorch, so that both choose the same token to the bit.
//
// A row's draw, for temperature T > 0 and top_p > 0:
//   - tokens are ranked by a 64-bit key, logit first, then the lower index (RankKey): unique
//     keys, so top_k and top_p keep whole tokens even among tied logits, as the CPU's sampler;
//   - top_k keeps the k largest keys; min_p drops tokens whose tempered logit (x - max) / T is
//     below log(min_p); top_p then keeps the tokens whose more likely candidates hold less
//     than top_p of the candidates' mass. Masses are fixed-point integers (Mass), so their sums
//     do not depend on the order of addition (parallel threads, atomics);
//   - the k-th key and the top_p boundary are found by a radix descent over the keys' bytes
//     (ChooseBucket), eight passes of 256-bucket histograms: no sort;
//   - the token is the kept one maximising tempered + Gumbel noise (Gumbel-max: exactly the
//     softmax of the kept tempered logits), the noise drawn from Philox-4x32-10 keyed by the
//     row's 64-bit key and counted by the token's index: one draw per token, independent of the
//     thread that makes it, so any split of the work chooses the same token.
// exp and log are our own polynomials with correctly rounded operations (RoundedOps), not the
// libraries', whose last bits differ between the host and the device.
#ifndef LGPT_CORE_OPS_ROW_SAMPLER_LAYOUT_H_
#define LGPT_CORE_OPS_ROW_SAMPLER_LAYOUT_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/ops/kv_slot_layout.h"  // LGPT_HOST_DEVICE

namespace lgpt {
namespace row_sampler {

constexpr int kRadixBits = 8;
constexpr int kBuckets = 1 << kRadixBits;
constexpr int kRadixPasses = 64 / kRadixBits;
// Fixed-point masses: a tempered logit t <= 0 weighs floor(exp(t) * 2^kMassBits); the best
// token weighs 2^kMassBits. Sums over a vocabulary of at most kMaxVocab tokens fit 64 bits.
constexpr int kMassBits = 40;
constexpr int64_t kMaxVocab = int64_t{1} << 23;

// One row's options, as the kernel reads them.
struct RowParams {
  float temperature = 0;  // <= 0: greedy
  int64_t top_k = 0;      // <= 0 or >= vocab: every token
  double top_p = 1;       // >= 1: every candidate; <= 0: greedy
  float log_min_p = 0;    // log(min_p) (LogPositive); -inf: no min_p
  uint64_t key = 0;       // the draw's Philox key
};

LGPT_HOST_DEVICE inline bool IsGreedy(const RowParams& p) {
  return !(p.temperature > 0) || !(p.top_p > 0);
}

// Float operations rounded on their own (nvcc would fuse a * b + c into one FMA, rounding
// differently from the host), and fused ones where both sides must fuse.
LGPT_HOST_DEVICE inline float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
LGPT_HOST_DEVICE inline float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
LGPT_HOST_DEVICE inline float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
LGPT_HOST_DEVICE inline float Fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);  // correctly rounded, as __fmaf_rn
#endif
}

LGPT_HOST_DEVICE inline uint32_t FloatBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
#endif
}
LGPT_HOST_DEVICE inline float BitsFloat(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
#endif
}

// The natural logarithm of a positive normal float, to ~1 ulp: x = m * 2^e with m in
// [sqrt(1/2), sqrt(2)), log m = 2 atanh(s), s = (m - 1) / (m + 1), |s| < 0.172, by its series.
LGPT_HOST_DEVICE inline float LogPositive(float x) {
  uint32_t bits = FloatBits(x);
  int exponent = static_cast<int>((bits >> 23) & 255) - 127;
  bits = (bits & 0x007fffffu) | 0x3f800000u;  // m in [1, 2)
  if (bits > 0x3fb504f3u) {                   // m > sqrt(2): halve it
    bits -= 0x00800000u;
    ++exponent;
  }
  const float m = BitsFloat(bits);
  const float s = Div(Add(m, -1.0f), Add(m, 1.0f));
  const float z = Mul(s, s);
  float series = 1.0f / 13;
  series = Fma(series, z, 1.0f / 11);
  series = Fma(series, z, 1.0f / 9);
  series = Fma(series, z, 1.0f / 7);
  series = Fma(series, z, 1.0f / 5);
  series = Fma(series, z, 1.0f / 3);
  series = Fma(series, z, 1.0f);
  const float log_m = Mul(Mul(2.0f, s), series);
  // e * log(2) in two parts: the high part's product is exact for |e| < 2^8.
  const float e = static_cast<float>(exponent);
  return Add(Fma(e, 0.693145751953125f, log_m), Mul(e, 1.42860677e-06f));
}

// exp(t) for t <= 0, to a few ulp; 0 below -87 (where float underflows). t = n log 2 + r,
// |r| <= log(2) / 2, e^r by its Taylor series, times 2^n built from bits.
LGPT_HOST_DEVICE inline float ExpNonPositive(float t) {
  if (!(t > -87.0f)) return 0.0f;
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = Add(Add(Mul(t, 1.44269504f), kMagic), -kMagic);
  const float r = Fma(-n, 1.42860677e-06f, Fma(-n, 0.693145751953125f, t));
  float series = 1.0f / 5040;
  series = Fma(series, r, 1.0f / 720);
  series = Fma(series, r, 1.0f / 120);
  series = Fma(series, r, 1.0f / 24);
  series = Fma(series, r, 1.0f / 6);
  series = Fma(series, r, 0.5f);
  series = Fma(series, r, 1.0f);
  series = Fma(series, r, 1.0f);
  const int exponent = static_cast<int>(n) + 127;  // n in [-126, 0]
  if (exponent <= 0) return 0.0f;
  return Mul(series, BitsFloat(static_cast<uint32_t>(exponent) << 23));
}

// Unsigned keys ordered as the floats are (-inf smallest; NaN is never ranked: such rows are
// refused).
LGPT_HOST_DEVICE inline uint32_t FloatKey(float x) {
  const uint32_t bits = FloatBits(x);
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}

// The rank of token `index` with logit x: larger is more likely; ties go to the lower index.
LGPT_HOST_DEVICE inline uint64_t RankKey(float x, int64_t index) {
  return (static_cast<uint64_t>(FloatKey(x)) << 32) | (0xffffffffu - static_cast<uint32_t>(index));
}

// (x - best) / T: 0 for the best token, below 0 for the others (-inf far below).
LGPT_HOST_DEVICE inline float Tempered(float x, float best, float temperature) {
  return Div(Add(x, -best), temperature);
}

// A tempered logit's fixed-point weight.
LGPT_HOST_DEVICE inline uint64_t Mass(float tempered) {
  return static_cast<uint64_t>(Mul(ExpNonPositive(tempered), 1099511627776.0f));  // 2^40
}

// Whether token (x, key) is one of top_p's candidates: within top_k (its key at least `kth`, the
// k-th key; 0 without top_k) and not dropped by min_p; `weight` gets its fixed-point mass then.
LGPT_HOST_DEVICE inline bool CandidateWeight(float x, uint64_t key, float best, const RowParams& p,
                                             uint64_t kth, uint64_t* weight) {
  if (key < kth) return false;
  const float tempered = Tempered(x, best, p.temperature);
  if (tempered < p.log_min_p) return false;
  *weight = Mass(tempered);
  return true;
}

// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", 2011): the
// random block of counter block `counter` under key (k0, k1).
LGPT_HOST_DEVICE inline void Philox4x32(const uint32_t counter[4], uint32_t k0, uint32_t k1,
                                        uint32_t out[4]) {
  uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

// A number uniform in (0, 1), never 0 or 1, for token `index` of a row keyed `key`: 23 bits of
// the block of counter (index, 0, 0) and a half, times 2^-23.
LGPT_HOST_DEVICE inline float UniformOpen(uint64_t key, uint64_t index) {
  const uint32_t counter[4] = {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0,
                               0};
  uint32_t block[4];
  Philox4x32(counter, static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32), block);
  return Mul(Add(static_cast<float>(block[0] >> 9), 0.5f), 1.0f / 8388608.0f);
}

// Token `index`'s score in the Gumbel-max race: tempered - log(-log(u)).
LGPT_HOST_DEVICE inline float GumbelScore(float tempered, uint64_t key, int64_t index) {
  const float exponential = -LogPositive(UniformOpen(key, static_cast<uint64_t>(index)));
  return Add(tempered, -LogPositive(exponential));
}

// Whether (score a, index a) beats (score b, index b): the higher score, then the lower index.
LGPT_HOST_DEVICE inline bool Beats(float score_a, int64_t index_a, float score_b, int64_t index_b) {
  return score_a > score_b || (score_a == score_b && index_a < index_b);
}

// The radix descent: pass p (0 first) looks at the key's byte 7 - p; a key takes part when its
// bytes above agree with `prefix`.
LGPT_HOST_DEVICE inline int Shift(int pass) { return 64 - kRadixBits * (pass + 1); }
LGPT_HOST_DEVICE inline int Bucket(uint64_t key, int pass) {
  return static_cast<int>((key >> Shift(pass)) & (kBuckets - 1));
}
LGPT_HOST_DEVICE inline bool InPlay(uint64_t key, uint64_t prefix, int pass) {
  return pass == 0 || (key >> (Shift(pass) + kRadixBits)) == (prefix >> (Shift(pass) + kRadixBits));
}

// One step of the descent to the last key, in descending order, whose more likely keys weigh
// less than `limit` in all (`above`: the weight of the keys above the buckets, in and out).
// Picks the first bucket from the top that holds keys and whose keys reach the limit, or else
// the last bucket that holds keys, and returns it (the keys of its byte value).
LGPT_HOST_DEVICE inline int ChooseBucket(const uint32_t* counts,
                                         const unsigned long long* weights,  // NOLINT: atomics'
                                         double limit, unsigned long long* above) {  // NOLINT
  int last = -1;
  for (int b = kBuckets - 1; b >= 0; --b) {
    if (counts[b] == 0) continue;
    last = b;
    if (static_cast<double>(*above + weights[b]) >= limit) return b;
    *above += weights[b];
  }
  // No bucket reached it: every key is kept; the last one bounds them. Undo its weight.
  if (last < 0) return 0;  // no key takes part (callers always have the best token)
  *above -= weights[last];
  return last;
}

}  // namespace row_sampler
}  // namespace lgpt

#endif  // LGPT_CORE_OPS_ROW_SAMPLER_LAYOUT_H_
