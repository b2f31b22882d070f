#include "core/ops/flash_attention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/ops/score_row.h"
#include "core/ops/simd_avx2.h"

namespace lgpt {
namespace {

constexpr int64_t kKeyTile = 64;    // entries per key/value tile
constexpr int64_t kQueryTile = 16;  // query rows sharing each key/value tile
constexpr float kLowest = std::numeric_limits<float>::lowest();

// A query tile's state: rows r of [rows, hs] accumulators, running maxima and sums.
struct RowState {
  std::vector<float> acc;    // [rows, hs]
  std::vector<float> max;    // [rows]
  std::vector<float> sum;    // [rows]
  std::vector<float> alpha;  // [rows] a tile's rescaling of the accumulators (scratch)
};

// acc_r = acc_r * alpha_r + sum_e p_r[e] v[e] for rows [0, rows), v [entries, hs].
void AccumulatePortable(const float* p, int64_t entries, const float* v, int64_t rows, int64_t hs,
                        const float* alpha, float* acc) {
  for (int64_t r = 0; r < rows; ++r) {
    float* a = acc + r * hs;
    for (int64_t j = 0; j < hs; ++j) a[j] *= alpha[r];
    const float* pr = p + r * entries;
    for (int64_t e = 0; e < entries; ++e) {
      if (pr[e] == 0.0f) continue;
      const float* ve = v + e * hs;
      for (int64_t j = 0; j < hs; ++j) a[j] += pr[e] * ve[j];
    }
  }
}

#ifdef LGPT_SIMD_AVX2
#define LGPT_FLASH_AVX2 __attribute__((target("avx2,fma")))

// R rows x 8·V columns from `col`: the accumulators stay in registers while the tile's value
// rows stream by (each read once for the R rows).
template <int R, int V>
LGPT_FLASH_AVX2 void AccumulateBlockAvx2(const float* p, int64_t entries, const float* v,
                                         int64_t hs, int64_t col, const float* alpha, float* acc) {
  // Loops unrolled in full keep sums and values in registers (GCC otherwise leaves a loop over 8
  // vectors rolled and the arrays on the stack).
  __m256 sums[R][V];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m256 a = _mm256_set1_ps(alpha[r]);
#pragma GCC unroll 8
    for (int j = 0; j < V; ++j) {
      sums[r][j] = _mm256_mul_ps(_mm256_loadu_ps(acc + r * hs + col + 8 * j), a);
    }
  }
  const float* ve = v + col;
  for (int64_t e = 0; e < entries; ++e, ve += hs) {
    __m256 values[V];
#pragma GCC unroll 8
    for (int j = 0; j < V; ++j) values[j] = _mm256_loadu_ps(ve + 8 * j);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 w = _mm256_broadcast_ss(p + r * entries + e);
#pragma GCC unroll 8
      for (int j = 0; j < V; ++j) sums[r][j] = _mm256_fmadd_ps(w, values[j], sums[r][j]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int j = 0; j < V; ++j) _mm256_storeu_ps(acc + r * hs + col + 8 * j, sums[r][j]);
  }
}

template <int R, int V>
void AccumulateRowsAvx2(const float* p, int64_t entries, const float* v, int64_t hs,
                        const float* alpha, float* acc) {
  int64_t col = 0;
  for (; col + 8 * V <= hs; col += 8 * V) {
    AccumulateBlockAvx2<R, V>(p, entries, v, hs, col, alpha, acc);
  }
  for (; col < hs; col += 8) AccumulateBlockAvx2<R, 1>(p, entries, v, hs, col, alpha, acc);
}

void AccumulateAvx2(const float* p, int64_t entries, const float* v, int64_t rows, int64_t hs,
                    const float* alpha, float* acc) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    AccumulateRowsAvx2<4, 2>(p + r * entries, entries, v, hs, alpha + r, acc + r * hs);
  }
  for (; r < rows; ++r) {
    AccumulateRowsAvx2<1, 8>(p + r * entries, entries, v, hs, alpha + r, acc + r * hs);
  }
}

#endif  // LGPT_SIMD_AVX2

// Whether any key among positions[0, n) may be seen by a query at a position in
// [q_min, q_max]: a cheap bound that skips whole tiles (the causal future, or everything
// before a sliding window).
bool AnyVisible(const KeyPositionRun& positions, int64_t n, int64_t q_min, int64_t q_max,
                int64_t window) {
  for (int64_t e = 0; e < n; ++e) {
    const int64_t k = positions[e];
    if (k >= 0 && k <= q_max && (window <= 0 || k > q_min - window)) return true;
  }
  return false;
}

bool TileVisible(const KVRun& run, int64_t begin, int64_t n, int64_t q_min, int64_t q_max,
                 int64_t window) {
  return AnyVisible(run.positions.Skip(begin), n, q_min, q_max, window);
}

// AccumulatePortable or its AVX2 kernel (hs % 8 == 0).
void Accumulate(const float* p, int64_t entries, const float* v, int64_t rows, int64_t hs,
                const float* alpha, float* acc, bool avx2) {
#ifdef LGPT_SIMD_AVX2
  if (avx2) return AccumulateAvx2(p, entries, v, rows, hs, alpha, acc);
#endif
  AccumulatePortable(p, entries, v, rows, hs, alpha, acc);
}

struct TileArgs {
  const float* q;              // [rows, hs] queries of the tile (contiguous)
  const int64_t* q_positions;  // [rows]
  int64_t rows, hs;
  const AttentionParams* params;
  bool avx2;
};

// One key/value tile against the query tile: scores, mask, online softmax update. `wide` holds
// a 16-bit run's tile widened to float32 ([n, hs] keys, then values).
void ProcessTile(const TileArgs& t, const KVRun& run, int64_t begin, int64_t n,
                 std::vector<float>& scores, std::vector<float>& wide, RowState& state) {
  const float* keys = nullptr;  // [n, hs]
  const float* values = nullptr;
  if (run.type == KVEntryType::kFloat32) {
    keys = run.keys + begin * t.hs;
    values = run.values + begin * t.hs;
  } else {
    const int64_t bytes = KVEntryBytes(run.type) * begin * t.hs;
    wide.resize(2 * n * t.hs);
    KVEntriesToFloat(static_cast<const char*>(run.keys16) + bytes, run.type, n * t.hs, wide.data());
    KVEntriesToFloat(static_cast<const char*>(run.values16) + bytes, run.type, n * t.hs,
                     wide.data() + n * t.hs);
    keys = wide.data();
    values = wide.data() + n * t.hs;
  }
  scores.resize(t.rows * n);
  for (int64_t r = 0; r < t.rows; r += kGemvMaxRows) {
    const int64_t m = std::min(kGemvMaxRows, t.rows - r);
    GemvF32Serial(keys, nullptr, t.q + r * t.hs, scores.data() + r * n, m, n, t.hs);
  }
  std::vector<float>& alpha = state.alpha;
  for (int64_t r = 0; r < t.rows; ++r) {
    float* s = scores.data() + r * n;
    const float tile_max = MaskScores(s, n, t.q_positions[r], run.positions.Skip(begin), *t.params);
    if (tile_max == kLowest) {  // nothing visible to this row here
      std::fill(s, s + n, 0.0f);
      alpha[r] = 1.0f;
      continue;
    }
    const float new_max = std::max(state.max[r], tile_max);
    alpha[r] = state.max[r] == kLowest ? 0.0f : std::exp(state.max[r] - new_max);
    const float total = ExpAndSum(s, n, new_max, t.avx2);
    state.sum[r] = state.sum[r] * alpha[r] + total;
    state.max[r] = new_max;
  }
  Accumulate(scores.data(), n, values, t.rows, t.hs, alpha.data(), state.acc.data(), t.avx2);
}

}  // namespace

at::Tensor FlashAttention(const at::Tensor& q, int64_t groups, const KVRunsOf& runs_of,
                          const at::Tensor& query_positions, const AttentionParams& params,
                          bool use_avx2, at::Tensor* lse) {
  const int64_t batch = q.size(0), n_head = q.size(1), steps = q.size(2), hs = q.size(3);
  const int64_t q_per_kv = n_head / groups;
  const int64_t rows = q_per_kv * steps;  // a group's queries: head-major, then step
  const int64_t tiles = (rows + kQueryTile - 1) / kQueryTile;
  const at::Tensor qc = q.contiguous();
  const at::Tensor qpos = query_positions.contiguous();
  at::Tensor out = at::empty({batch, n_head, steps, hs}, q.options());
  const float* q_data = qc.data_ptr<float>();
  float* out_data = out.data_ptr<float>();
  const int64_t* qp_data = qpos.data_ptr<int64_t>();
  float* lse_data = nullptr;
  if (lse != nullptr) {
    *lse = at::empty({batch, n_head, steps}, q.options());
    lse_data = lse->data_ptr<float>();
  }
#ifdef LGPT_SIMD_AVX2
  const bool avx2 = use_avx2 && hs % 8 == 0;
#else
  const bool avx2 = false;
#endif
  // Tasks (b, g, tile) in zig-zag tile order: causal tiles grow with their position, and each
  // thread's contiguous share of tasks then holds early and late tiles alike.
  const int64_t tasks = batch * groups * tiles;
  ParallelForRows(tasks, 1, 1, [&](int64_t begin, int64_t end) {
    std::vector<KVRun> runs;
    std::vector<float> scores, wide;
    std::vector<int64_t> positions(kQueryTile);
    RowState state;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bg = task / tiles, i = task % tiles;
      const int64_t tile = i % 2 == 0 ? i / 2 : tiles - 1 - i / 2;
      const int64_t b = bg / groups, g = bg % groups;
      runs.clear();
      runs_of(b, g, &runs);
      const int64_t row0 = tile * kQueryTile, n_rows = std::min(kQueryTile, rows - row0);
      // Row r of the group is head g·q_per_kv + r / steps at step r % steps: contiguous in q.
      const float* q_rows = q_data + ((b * n_head + g * q_per_kv) * steps + row0) * hs;
      int64_t q_min = std::numeric_limits<int64_t>::max(), q_max = -1;
      for (int64_t r = 0; r < n_rows; ++r) {
        positions[r] = qp_data[b * steps + (row0 + r) % steps];
        q_min = std::min(q_min, positions[r]);
        q_max = std::max(q_max, positions[r]);
      }
      state.acc.assign(n_rows * hs, 0.0f);
      state.max.assign(n_rows, kLowest);
      state.sum.assign(n_rows, 0.0f);
      state.alpha.resize(n_rows);
      const TileArgs args{q_rows, positions.data(), n_rows, hs, &params, avx2};
      for (const KVRun& run : runs) {
        for (int64_t k = 0; k < run.entries; k += kKeyTile) {
          const int64_t n = std::min(kKeyTile, run.entries - k);
          if (!TileVisible(run, k, n, q_min, q_max, params.sliding_window)) continue;
          ProcessTile(args, run, k, n, scores, wide, state);
        }
      }
      for (int64_t r = 0; r < n_rows; ++r) {
        const int64_t row = (b * n_head + g * q_per_kv) * steps + row0 + r;
        float* y = out_data + row * hs;
        if (lse_data != nullptr) {
          lse_data[row] = state.sum[r] > 0 ? state.max[r] + std::log(state.sum[r])
                                           : std::numeric_limits<float>::infinity();
        }
        if (state.sum[r] > 0) {
          const float inv = 1.0f / state.sum[r];
          for (int64_t j = 0; j < hs; ++j) y[j] = state.acc[r * hs + j] * inv;
          continue;
        }
        // No visible key: the masked softmax's uniform weights, the mean of all values.
        std::fill(y, y + hs, 0.0f);
        int64_t count = 0;
        for (const KVRun& run : runs) {
          for (int64_t e = 0; e < run.entries; ++e, ++count) {
            for (int64_t j = 0; j < hs; ++j) {
              y[j] += run.type == KVEntryType::kFloat32
                          ? run.values[e * hs + j]
                          : KVEntryAt(run.values16, run.type, e * hs + j);
            }
          }
        }
        for (int64_t j = 0; j < hs; ++j) y[j] /= static_cast<float>(std::max<int64_t>(count, 1));
      }
    }
  });
  return out;
}

namespace {

constexpr int64_t kGradQueryTile = kGemvMaxRows;  // query rows per tile of the backward

// A backward task's buffers: [m, n] scores then weights P, [m, n] dO V^T then scale · dS,
// their transposes, and the soft-capped scores over the cap (tanh) of one row.
struct GradScratch {
  std::vector<float> p, ds, p_t, ds_t, tanh;
};

// A query tile of the backward: `rows` consecutive rows of one group (contiguous, hs apart).
struct GradQueries {
  const float* q;
  const float* grad_out;
  const float* lse;
  const float* delta;  // D = rowsum(dO · out)
  const int64_t* positions;
  float* grad_q;
  int64_t rows;
};

// A key/value tile of the backward and the gradients it owns.
struct GradKeys {
  const float* keys;
  const float* values;
  KeyPositionRun positions;
  int64_t entries;
  float* grad_keys;
  float* grad_values;
};

// One (query tile, key tile) pair: recompute P, then dS, and add the pair's share of
// dV = P^T dO, dK = scale dS^T Q and dQ = scale dS K.
void BackwardPair(const GradQueries& t, const GradKeys& k, int64_t hs,
                  const AttentionParams& params, bool avx2, const float* ones, GradScratch& s) {
  const int64_t m = t.rows, n = k.entries;
  s.p.resize(m * n);
  s.ds.resize(m * n);
  s.p_t.resize(n * m);
  s.ds_t.resize(n * m);
  for (int64_t r = 0; r < m; r += kGemvMaxRows) {
    const int64_t rows = std::min(kGemvMaxRows, m - r);
    GemvF32Serial(k.keys, nullptr, t.q + r * hs, s.p.data() + r * n, rows, n, hs);
    GemvF32Serial(k.values, nullptr, t.grad_out + r * hs, s.ds.data() + r * n, rows, n, hs);
  }
  const float scale = static_cast<float>(params.scale);
  const bool capped = params.softcap.has_value();
  const float cap = capped ? static_cast<float>(*params.softcap) : 1.0f;
  if (capped) s.tanh.resize(n);
  for (int64_t r = 0; r < m; ++r) {
    float* p = s.p.data() + r * n;
    float* ds = s.ds.data() + r * n;
    if (std::isinf(t.lse[r])) {  // no visible key: the caller spreads dO over the values
      std::fill(p, p + n, 0.0f);
      std::fill(ds, ds + n, 0.0f);
      continue;
    }
    MaskScores(p, n, t.positions[r], k.positions, params);
    if (capped) {
      for (int64_t e = 0; e < n; ++e) s.tanh[e] = p[e] == kLowest ? 0.0f : p[e] / cap;
    }
    ExpAndSum(p, n, t.lse[r], avx2);  // masked scores become exactly 0
    const float d = t.delta[r];
    if (capped) {
      for (int64_t e = 0; e < n; ++e) {
        ds[e] = p[e] * (ds[e] - d) * (1.0f - s.tanh[e] * s.tanh[e]) * scale;
      }
    } else {
      for (int64_t e = 0; e < n; ++e) ds[e] = p[e] * (ds[e] - d) * scale;
    }
  }
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t e = 0; e < n; ++e) {
      s.p_t[e * m + r] = s.p[r * n + e];
      s.ds_t[e * m + r] = s.ds[r * n + e];
    }
  }
  Accumulate(s.p_t.data(), m, t.grad_out, n, hs, ones, k.grad_values, avx2);
  Accumulate(s.ds_t.data(), m, t.q, n, hs, ones, k.grad_keys, avx2);
  Accumulate(s.ds.data(), n, k.keys, m, hs, ones, t.grad_q, avx2);
}

}  // namespace

FlashGradients FlashAttentionBackward(const at::Tensor& q, const at::Tensor& keys,
                                      const at::Tensor& values, const at::Tensor& out,
                                      const at::Tensor& lse, const at::Tensor& grad_out,
                                      const at::Tensor& query_positions,
                                      const at::Tensor& key_positions,
                                      const AttentionParams& params, bool use_avx2) {
  const int64_t batch = q.size(0), n_head = q.size(1), steps = q.size(2), hs = q.size(3);
  const int64_t groups = keys.size(1), entries = keys.size(2);
  const int64_t q_per_kv = n_head / groups;
  const int64_t rows = q_per_kv * steps;  // a group's queries: head-major, then step
  const at::Tensor qc = q.contiguous(), kc = keys.contiguous(), vc = values.contiguous();
  const at::Tensor dout = grad_out.contiguous(), lsec = lse.contiguous();
  const at::Tensor delta = (dout * out).sum(-1).contiguous();  // [B, n_head, T]
  const at::Tensor qpos = query_positions.contiguous();
  at::Tensor grad_keys = at::zeros(kc.sizes(), kc.options());
  at::Tensor grad_values = at::zeros(vc.sizes(), vc.options());
  const int64_t key_tiles = (entries + kKeyTile - 1) / kKeyTile;
  const int64_t query_tiles = (rows + kGradQueryTile - 1) / kGradQueryTile;
  const int64_t pairs = batch * groups;
  // Each (row, group) pair's key tiles are dealt round-robin to `shares` tasks (so causal
  // shares are even), enough to give every thread one; each share sums its own dQ.
  const int64_t shares = std::max<int64_t>(
      1, std::min<int64_t>(key_tiles, (at::get_num_threads() + pairs - 1) / pairs));
  at::Tensor grad_q = at::zeros({shares, batch, n_head, steps, hs}, qc.options());
#ifdef LGPT_SIMD_AVX2
  const bool avx2 = use_avx2 && hs % 8 == 0;
#else
  const bool avx2 = false;
#endif
  const float* q_data = qc.data_ptr<float>();
  const float* k_data = kc.data_ptr<float>();
  const float* v_data = vc.data_ptr<float>();
  const float* do_data = dout.data_ptr<float>();
  const float* lse_data = lsec.data_ptr<float>();
  const float* delta_data = delta.data_ptr<float>();
  const int64_t* qp_data = qpos.data_ptr<int64_t>();
  float* dq_data = grad_q.data_ptr<float>();
  float* dk_data = grad_keys.data_ptr<float>();
  float* dv_data = grad_values.data_ptr<float>();
  const std::vector<float> ones(std::max(kKeyTile, kGradQueryTile), 1.0f);
  const float uniform_weight = 1.0f / static_cast<float>(std::max<int64_t>(entries, 1));
  at::parallel_for(0, pairs * shares, 1, [&](int64_t begin, int64_t end) {
    GradScratch scratch;
    std::vector<int64_t> positions(rows), q_min(query_tiles), q_max(query_tiles);
    std::vector<int64_t> unseeing;  // rows with no visible key
    for (int64_t task = begin; task < end; ++task) {
      const int64_t pair = task / shares, share = task % shares;
      const int64_t b = pair / groups, g = pair % groups;
      const int64_t row0 = (b * n_head + g * q_per_kv) * steps;  // the group's first row
      for (int64_t r = 0; r < rows; ++r) positions[r] = qp_data[b * steps + r % steps];
      for (int64_t t = 0; t < query_tiles; ++t) {
        const int64_t first = t * kGradQueryTile, last = std::min(rows, first + kGradQueryTile);
        q_min[t] = *std::min_element(positions.begin() + first, positions.begin() + last);
        q_max[t] = *std::max_element(positions.begin() + first, positions.begin() + last);
      }
      unseeing.clear();
      for (int64_t r = 0; r < rows; ++r) {
        if (std::isinf(lse_data[row0 + r])) unseeing.push_back(r);
      }
      const KeyPositionRun key_run = KeyPositionRun::Of(key_positions, b, g);
      const int64_t kv0 = pair * entries * hs;
      float* dq_rows = dq_data + (share * batch * n_head * steps + row0) * hs;
      for (int64_t kt = share; kt < key_tiles; kt += shares) {
        const int64_t k0 = kt * kKeyTile;
        const GradKeys tile{k_data + kv0 + k0 * hs,  v_data + kv0 + k0 * hs,
                            key_run.Skip(k0),        std::min(kKeyTile, entries - k0),
                            dk_data + kv0 + k0 * hs, dv_data + kv0 + k0 * hs};
        for (int64_t t = 0; t < query_tiles; ++t) {
          if (!AnyVisible(tile.positions, tile.entries, q_min[t], q_max[t],
                          params.sliding_window)) {
            continue;
          }
          const int64_t r0 = t * kGradQueryTile;
          const GradQueries queries{q_data + (row0 + r0) * hs,
                                    do_data + (row0 + r0) * hs,
                                    lse_data + row0 + r0,
                                    delta_data + row0 + r0,
                                    positions.data() + r0,
                                    dq_rows + r0 * hs,
                                    std::min(kGradQueryTile, rows - r0)};
          BackwardPair(queries, tile, hs, params, avx2, ones.data(), scratch);
        }
        // A query with no visible key weighs every entry 1 / S (the masked softmax's
        // uniform weights; its scores get no gradient).
        for (const int64_t r : unseeing) {
          const float* dy = do_data + (row0 + r) * hs;
          for (int64_t e = 0; e < tile.entries; ++e) {
            float* dv = tile.grad_values + e * hs;
            for (int64_t j = 0; j < hs; ++j) dv[j] += dy[j] * uniform_weight;
          }
        }
      }
    }
  });
  return {shares == 1 ? grad_q.select(0, 0) : grad_q.sum(0), grad_keys, grad_values};
}

}  // namespace lgpt
