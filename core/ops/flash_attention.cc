#include "core/ops/flash_attention.h"

#include <ATen/ATen.h>

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
  std::vector<float> acc;  // [rows, hs]
  std::vector<float> max;  // [rows]
  std::vector<float> sum;  // [rows]
  std::vector<float> alpha;  // [rows] a tile's rescaling of the accumulators (scratch)
};

// acc_r = acc_r * alpha_r + sum_e p_r[e] v[e] for rows [0, rows), v [entries, hs].
void AccumulatePortable(const float* p, int64_t entries, const float* v, int64_t rows,
                        int64_t hs, const float* alpha, float* acc) {
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
                                         int64_t hs, int64_t col, const float* alpha,
                                         float* acc) {
  __m256 sums[R][V];
  for (int r = 0; r < R; ++r) {
    const __m256 a = _mm256_set1_ps(alpha[r]);
    for (int j = 0; j < V; ++j) {
      sums[r][j] = _mm256_mul_ps(_mm256_loadu_ps(acc + r * hs + col + 8 * j), a);
    }
  }
  const float* ve = v + col;
  for (int64_t e = 0; e < entries; ++e, ve += hs) {
    __m256 values[V];
    for (int j = 0; j < V; ++j) values[j] = _mm256_loadu_ps(ve + 8 * j);
    for (int r = 0; r < R; ++r) {
      const __m256 w = _mm256_broadcast_ss(p + r * entries + e);
      for (int j = 0; j < V; ++j) sums[r][j] = _mm256_fmadd_ps(w, values[j], sums[r][j]);
    }
  }
  for (int r = 0; r < R; ++r) {
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

// Whether any key of the run's [begin, begin + n) may be seen by a query at a position in
// [q_min, q_max]: a cheap bound that skips whole tiles (the causal future, or everything
// before a sliding window).
bool TileVisible(const KVRun& run, int64_t begin, int64_t n, int64_t q_min, int64_t q_max,
                 int64_t window) {
  for (int64_t e = begin; e < begin + n; ++e) {
    const int64_t k = run.positions[e];
    if (k >= 0 && k <= q_max && (window <= 0 || k > q_min - window)) return true;
  }
  return false;
}

struct TileArgs {
  const float* q;              // [rows, hs] queries of the tile (contiguous)
  const int64_t* q_positions;  // [rows]
  int64_t rows, hs;
  const AttentionParams* params;
  bool avx2;
};

// One key/value tile against the query tile: scores, mask, online softmax update.
void ProcessTile(const TileArgs& t, const KVRun& run, int64_t begin, int64_t n,
                 std::vector<float>& scores, RowState& state) {
  scores.resize(t.rows * n);
  for (int64_t r = 0; r < t.rows; r += kGemvMaxRows) {
    const int64_t m = std::min(kGemvMaxRows, t.rows - r);
    GemvF32Serial(run.keys + begin * t.hs, nullptr, t.q + r * t.hs, scores.data() + r * n, m, n,
                  t.hs);
  }
  std::vector<float>& alpha = state.alpha;
  for (int64_t r = 0; r < t.rows; ++r) {
    float* s = scores.data() + r * n;
    const float tile_max =
        MaskScores(s, n, t.q_positions[r], run.positions.Skip(begin), *t.params);
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
#ifdef LGPT_SIMD_AVX2
  if (t.avx2) {
    return AccumulateAvx2(scores.data(), n, run.values + begin * t.hs, t.rows, t.hs,
                          alpha.data(), state.acc.data());
  }
#endif
  AccumulatePortable(scores.data(), n, run.values + begin * t.hs, t.rows, t.hs, alpha.data(),
                     state.acc.data());
}

}  // namespace

at::Tensor FlashAttention(const at::Tensor& q, int64_t groups, const KVRunsOf& runs_of,
                          const at::Tensor& query_positions, const AttentionParams& params,
                          bool use_avx2) {
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
    std::vector<float> scores;
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
          ProcessTile(args, run, k, n, scores, state);
        }
      }
      for (int64_t r = 0; r < n_rows; ++r) {
        float* y = out_data + ((b * n_head + g * q_per_kv) * steps + row0 + r) * hs;
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
            for (int64_t j = 0; j < hs; ++j) y[j] += run.values[e * hs + j];
          }
        }
        for (int64_t j = 0; j < hs; ++j) y[j] /= static_cast<float>(std::max<int64_t>(count, 1));
      }
    }
  });
  return out;
}

}  // namespace lgpt
