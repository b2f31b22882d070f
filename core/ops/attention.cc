#include "core/ops/attention.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <limits>

#include "core/ops/decode_attention.h"
#include "core/ops/flash_attention.h"
#include "core/ops/flash_attention_grad.h"

namespace lgpt {
namespace {

int64_t ReadChunk(const KVBlockSource& source) {
  return source.read_chunk > 0 ? source.read_chunk : source.size;
}

// Calls visit(source, column, begin, length) for each block of each source in order, where
// column is the block's first column among all sources' entries.
template <typename Visit>
void ForEachBlock(const std::vector<KVBlockSource>& sources, Visit visit) {
  int64_t offset = 0;
  for (const KVBlockSource& source : sources) {
    for (int64_t begin = 0; begin < source.size; begin += ReadChunk(source)) {
      visit(source, offset + begin, begin, std::min(ReadChunk(source), source.size - begin));
    }
    offset += source.size;
  }
}

// Scores q·k of every source, [B, G, q_per_kv, T, S] float32, unscaled.
at::Tensor Scores(const at::Tensor& q_grouped, int64_t q_per_kv, int64_t steps,
                  const std::vector<KVBlockSource>& sources, int64_t total) {
  const int64_t batch = q_grouped.size(0), groups = q_grouped.size(1);
  const std::vector<int64_t> shape = {batch, groups, q_per_kv, steps, total};
  if (sources.size() == 1 && ReadChunk(sources[0]) >= total) {
    at::Tensor keys;  // one read: no copy into a preallocated buffer
    sources[0].read(0, total, &keys, nullptr);
    return at::matmul(q_grouped, keys.transpose(-1, -2)).view(shape).to(at::kFloat);
  }
  at::Tensor scores = at::empty(shape, q_grouped.options().dtype(at::kFloat));
  ForEachBlock(sources, [&](const KVBlockSource& source, int64_t column, int64_t begin,
                            int64_t length) {
    at::Tensor keys;
    source.read(begin, length, &keys, nullptr);
    const at::Tensor block = at::matmul(q_grouped, keys.transpose(-1, -2));  // [B, G, q·T, n]
    scores.narrow(-1, column, length).copy_(block.view({batch, groups, q_per_kv, steps, length}));
  });
  return scores;
}

// The key positions of all sources, [B, 1 or G, S].
at::Tensor KeyPositions(const std::vector<KVBlockSource>& sources, int64_t batch, int64_t groups) {
  if (sources.size() == 1) return sources[0].positions;
  bool grouped = false;
  for (const KVBlockSource& source : sources) grouped = grouped || source.positions.size(1) != 1;
  std::vector<at::Tensor> positions;
  for (const KVBlockSource& source : sources) {
    positions.push_back(grouped ? source.positions.expand({batch, groups, source.size})
                                : source.positions);
  }
  return at::cat(positions, -1);
}

// weights [B, G, q·T, S] float32 times the values of every source: [B, G, q·T, hs].
at::Tensor WeightedValues(const at::Tensor& weights, const std::vector<KVBlockSource>& sources) {
  if (sources.size() == 1 && sources[0].read_chunk <= 0) {
    // One source read whole: in the values' dtype, as LitGPT's attention.
    at::Tensor values;
    sources[0].read(0, sources[0].size, nullptr, &values);
    return at::matmul(weights.to(values.scalar_type()), values);
  }
  at::Tensor y;
  ForEachBlock(sources, [&](const KVBlockSource& source, int64_t column, int64_t begin,
                            int64_t length) {
    at::Tensor values;
    source.read(begin, length, nullptr, &values);
    const at::Tensor part = at::matmul(weights.narrow(-1, column, length), values.to(at::kFloat));
    if (y.defined()) {
      y.add_(part);
    } else {
      y = part;
    }
  });
  return y;
}

// Prompts through FlashAttention when every block reads as float32 rows on the CPU; false
// (nothing written) otherwise, and for decode-sized steps (DecodeAttention's, or the generic
// path's bit-for-bit results are what the caches' equivalence tests pin).
bool TryFlash(const at::Tensor& q, int64_t groups, const std::vector<KVBlockSource>& sources,
              const at::Tensor& query_positions, const AttentionParams& params, at::Tensor* out) {
  if (!q.device().is_cpu() || q.scalar_type() != at::kFloat || q.size(2) < kFlashMinSteps ||
      q.requires_grad() || !query_positions.device().is_cpu() ||
      query_positions.scalar_type() != at::kLong || at::GradMode::is_enabled()) {
    return false;
  }
  struct Block {
    at::Tensor keys, values, positions;  // [B, G, n, hs], [B, 1 or G, n]
  };
  std::vector<Block> blocks;
  bool ok = true;
  ForEachBlock(sources, [&](const KVBlockSource& source, int64_t, int64_t begin, int64_t length) {
    if (!ok) return;
    Block block;
    source.read(begin, length, &block.keys, &block.values);
    block.positions = source.positions.narrow(2, begin, length);
    ok = block.keys.scalar_type() == at::kFloat && block.values.scalar_type() == at::kFloat &&
         block.keys.device().is_cpu() && block.values.device().is_cpu() &&
         KVRowsContiguous(block.keys) && KVRowsContiguous(block.values) &&
         KeyPositionRun::Readable(block.positions);
    blocks.push_back(std::move(block));
  });
  if (!ok) return false;
  auto runs_of = [&](int64_t b, int64_t g, std::vector<KVRun>* runs) {
    for (const Block& block : blocks) {
      const at::Tensor& k = block.keys;
      const at::Tensor& v = block.values;
      const at::Tensor& p = block.positions;
      KVRun run;
      run.keys = k.data_ptr<float>() + b * k.stride(0) + g * k.stride(1);
      run.values = v.data_ptr<float>() + b * v.stride(0) + g * v.stride(1);
      run.positions = KeyPositionRun::Of(p, b, g);
      run.entries = k.size(2);
      runs->push_back(run);
    }
  };
  *out = FlashAttention(q, groups, runs_of, query_positions, params);
  return true;
}

// Training: when autograd records the attention (grad mode on, and q, keys or values need
// gradients) and there is one source read whole of float32 tensors on the CPU, the trainable
// flash kernel (core/ops/flash_attention_grad.h) instead of the generic path, whose saved
// scores and weights grow as T · S. False (nothing written) otherwise.
bool TryFlashTrainable(const at::Tensor& q, const std::vector<KVBlockSource>& sources,
                       const at::Tensor& query_positions, const AttentionParams& params,
                       at::Tensor* out) {
  if (!at::GradMode::is_enabled() || sources.size() != 1 ||
      ReadChunk(sources[0]) < sources[0].size) {
    return false;
  }
  at::Tensor keys, values;
  sources[0].read(0, sources[0].size, &keys, &values);
  if (!q.requires_grad() && !keys.requires_grad() && !values.requires_grad()) return false;
  if (!FlashAttentionTrainableApplies(q, keys, values, query_positions, sources[0].positions)) {
    return false;
  }
  *out = FlashAttentionTrainable(q, keys, values, query_positions, sources[0].positions, params);
  return true;
}

}  // namespace

KVBlockSource TensorSource(const at::Tensor& keys, const at::Tensor& values,
                           const at::Tensor& positions) {
  KVBlockSource source;
  source.size = keys.size(2);
  source.positions = positions;
  source.read = [keys, values](int64_t begin, int64_t length, at::Tensor* k, at::Tensor* v) {
    if (k != nullptr) *k = keys.narrow(2, begin, length);
    if (v != nullptr) *v = values.narrow(2, begin, length);
  };
  return source;
}

at::Tensor AttendBlockwise(const at::Tensor& q, int64_t groups,
                           const std::vector<KVBlockSource>& sources,
                           const at::Tensor& query_positions, const AttentionParams& params,
                           at::Tensor* weights_out) {
  const int64_t batch = q.size(0), n_head = q.size(1), steps = q.size(2), head_size = q.size(3);
  const int64_t q_per_kv = n_head / groups;
  int64_t total = 0;
  for (const KVBlockSource& source : sources) total += source.size;
  if (total == 0) {
    if (weights_out != nullptr)
      *weights_out = at::zeros({batch, n_head, steps, 0}, q.options().dtype(at::kFloat));
    return at::zeros_like(q);
  }
  at::Tensor flash;
  if (weights_out == nullptr && (TryFlashTrainable(q, sources, query_positions, params, &flash) ||
                                 TryFlash(q, groups, sources, query_positions, params, &flash))) {
    return flash;
  }
  // Query head h uses key group h / q_per_kv (LitGPT's repeat_interleave layout).
  const at::Tensor q_grouped = q.reshape({batch, groups, q_per_kv * steps, head_size});
  at::Tensor scores = Scores(q_grouped, q_per_kv, steps, sources, total);  // [B, G, q, T, S]
  scores.mul_(params.scale);
  if (params.softcap) scores = at::tanh(scores / *params.softcap) * *params.softcap;
  const at::Tensor allowed =
      AttentionMask(query_positions, KeyPositions(sources, batch, groups), params.sliding_window)
          .unsqueeze(2);
  // The lowest finite value instead of -inf: a row with no allowed key (a padding query)
  // yields uniform weights rather than NaN.
  scores.masked_fill_(allowed.logical_not(), std::numeric_limits<float>::lowest());
  const at::Tensor weights = at::softmax(scores, -1, at::kFloat);  // [B, G, q, T, S]
  if (weights_out != nullptr) *weights_out = weights.view({batch, n_head, steps, total});
  const at::Tensor y =
      WeightedValues(weights.view({batch, groups, q_per_kv * steps, total}), sources);
  return y.to(q.scalar_type()).view({batch, n_head, steps, head_size});
}

at::Tensor AttendByPositions(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                             const at::Tensor& query_positions, const at::Tensor& key_positions,
                             const AttentionParams& params, at::Tensor* weights_out) {
  if (DecodeAttentionApplies(q, keys, values, query_positions, key_positions)) {
    if (weights_out == nullptr) {
      return DecodeAttention(q, keys, values, query_positions, key_positions, params);
    }
    *weights_out =
        at::empty({q.size(0), q.size(1), q.size(2), keys.size(2)}, q.options().dtype(at::kFloat));
    return DecodeAttention(q, keys, values, query_positions, key_positions, params, CpuHasAvx2Fma(),
                           weights_out->data_ptr<float>());
  }
  return AttendBlockwise(q, keys.size(1), {TensorSource(keys, values, key_positions)},
                         query_positions, params, weights_out);
}

}  // namespace lgpt
