#include "core/train/chunked_backward.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/kv_codec.h"
#include "core/base/status_macros.h"
#include "core/train/replay_kv_cache.h"

namespace lgpt {
namespace {

constexpr int64_t kIgnoreIndex = -100;  // SftLoss's (LitGPT's) ignore_index

struct Chunk {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

std::vector<Chunk> Chunks(int64_t total, int64_t first, int64_t size) {
  std::vector<Chunk> chunks;
  for (int64_t begin = 0; begin < total;) {
    const int64_t end = std::min(total, begin + (begin == 0 ? first : size));
    chunks.push_back({begin, end});
    begin = end;
  }
  return chunks;
}

// Σ cross-entropy over the counted targets: logits [B, T, V], targets [B, T]; with classes
// (int64 [K]), over those logits only, targets being indices into them.
at::Tensor LossSum(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& classes) {
  const at::Tensor scored = classes.defined() ? logits.index_select(-1, classes) : logits;
  return at::cross_entropy_loss(scored.reshape({-1, scored.size(-1)}).to(at::kFloat),
                                targets.reshape(-1), /*weight=*/{}, at::Reduction::Sum,
                                kIgnoreIndex);
}

// Classification targets [B, S]: per row only the first counted target, as its index into
// `classes`; InvalidArgument naming the row when it is not a class token.
absl::StatusOr<at::Tensor> ClassTargets(const at::Tensor& targets,
                                        const std::vector<int64_t>& classes) {
  const at::Tensor host = targets.to(at::kCPU).contiguous();
  at::Tensor out = at::full_like(host, kIgnoreIndex);
  const auto t = host.accessor<int64_t, 2>();
  auto o = out.accessor<int64_t, 2>();
  for (int64_t b = 0; b < host.size(0); ++b) {
    for (int64_t s = 0; s < host.size(1); ++s) {
      if (t[b][s] == kIgnoreIndex) continue;
      const auto it = std::find(classes.begin(), classes.end(), t[b][s]);
      if (it == classes.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "row ", b, ": the first target that counts (token ", t[b][s], " at position ", s,
            ") is not one of ChunkedTrainingOptions.class_tokens"));
      }
      o[b][s] = it - classes.begin();
      break;
    }
  }
  return out.to(targets.device());
}

// Every layer's input [B, S, E] for the backward pass, in the model's dtype or int8 (per token
// and group of channels, float16 scales: cache/kv_codec.h's quantisation).
class LayerCheckpoints {
 public:
  LayerCheckpoints(int64_t count, int64_t batch, int64_t total, int64_t width, int bits,
                   const at::TensorOptions& options)
      : bits_(bits), group_(std::gcd<int64_t>(32, width)), dtype_(options.dtype().toScalarType()) {
    for (int64_t i = 0; i < count; ++i) {
      if (bits_ == 8) {
        data_.push_back(at::empty({batch, total, width}, options.dtype(at::kChar)));
        scales_.push_back(at::empty({batch, total, width / group_}, options.dtype(at::kHalf)));
      } else {
        data_.push_back(at::empty({batch, total, width}, options));
      }
    }
  }
  // Stores x [B, T, E] as positions [begin, begin + T) of checkpoint i.
  void Write(int64_t i, int64_t begin, const at::Tensor& x) {
    const int64_t steps = x.size(1);
    if (bits_ != 8) {
      data_[i].narrow(1, begin, steps).copy_(x);
      return;
    }
    const QuantizedGroups q = QuantizeGroups(x, 8, group_);
    data_[i].narrow(1, begin, steps).copy_(q.data);
    scales_[i].narrow(1, begin, steps).copy_(q.scales);
  }
  // Checkpoint i in the model's dtype [B, S, E] (int8: decoded, one layer at a time), and
  // frees its storage.
  at::Tensor Take(int64_t i) {
    at::Tensor out =
        bits_ == 8 ? DequantizeGroups(data_[i], scales_[i], 8, group_, dtype_) : data_[i];
    data_[i] = at::Tensor();
    if (bits_ == 8) scales_[i] = at::Tensor();
    return out;
  }
  int64_t bytes() const {
    int64_t total = 0;
    for (const std::vector<at::Tensor>* parts : {&data_, &scales_}) {
      for (const at::Tensor& t : *parts) total += t.numel() * t.element_size();
    }
    return total;
  }

 private:
  int bits_;
  int64_t group_;
  c10::ScalarType dtype_;
  std::vector<at::Tensor> data_, scales_;
};

// The rows one cell recomputes: per batch row, the positions before the chunk that any group
// attended to (ascending), padded to the longest row, then the chunk's own.
struct CellRows {
  at::Tensor index;          // [B, U + C] int64: rows of the layer's checkpoint (padding: 0)
  at::Tensor positions;      // [B, U + C] int64: their positions (padding: the chunk's first)
  at::Tensor key_positions;  // [B, G, U + C] int64: -1 where group g did not attend
  int64_t replayed = 0;      // U
};

// attended [B, 1 or G, S] int64 on the CPU: one step's entry of the replay log.
CellRows RowsOfCell(const at::Tensor& attended, const Chunk& chunk, int64_t groups) {
  const int64_t batch = attended.size(0), shared = attended.size(1);
  const auto log = attended.accessor<int64_t, 3>();
  std::vector<std::vector<std::vector<int64_t>>> seen(batch);  // [b][p]: sorted positions
  std::vector<std::vector<int64_t>> replayed(batch);
  int64_t widest = 0;
  for (int64_t b = 0; b < batch; ++b) {
    std::set<int64_t> before;
    seen[b].resize(shared);
    for (int64_t p = 0; p < shared; ++p) {
      for (int64_t s = 0; s < attended.size(2); ++s) {
        const int64_t position = log[b][p][s];
        if (position < 0) continue;
        seen[b][p].push_back(position);
        if (position < chunk.begin) before.insert(position);
      }
      std::sort(seen[b][p].begin(), seen[b][p].end());
    }
    replayed[b].assign(before.begin(), before.end());
    widest = std::max<int64_t>(widest, static_cast<int64_t>(replayed[b].size()));
  }
  const int64_t width = widest + chunk.size();
  CellRows rows;
  rows.replayed = widest;
  rows.index = at::zeros({batch, width}, at::kLong);
  rows.positions = at::full({batch, width}, chunk.begin, at::kLong);
  rows.key_positions = at::full({batch, groups, width}, -1, at::kLong);
  auto index = rows.index.accessor<int64_t, 2>();
  auto positions = rows.positions.accessor<int64_t, 2>();
  auto keys = rows.key_positions.accessor<int64_t, 3>();
  for (int64_t b = 0; b < batch; ++b) {
    auto place = [&](int64_t column, int64_t position) {
      index[b][column] = position;
      positions[b][column] = position;
      for (int64_t g = 0; g < groups; ++g) {
        const std::vector<int64_t>& group = seen[b][shared == 1 ? 0 : g];
        if (std::binary_search(group.begin(), group.end(), position)) keys[b][g][column] = position;
      }
    };
    for (size_t j = 0; j < replayed[b].size(); ++j) place(static_cast<int64_t>(j), replayed[b][j]);
    for (int64_t t = 0; t < chunk.size(); ++t) place(widest + t, chunk.begin + t);
  }
  return rows;
}

absl::Status CheckInputs(const GPTImpl& model, const at::Tensor& input_ids,
                         const at::Tensor& labels, const ChunkedTrainingOptions& options) {
  if (input_ids.dim() != 2 || input_ids.size(0) < 1 || input_ids.size(1) < 1 ||
      input_ids.scalar_type() != at::kLong) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input_ids must be int64 [B, S] with B, S >= 1, got ", ShapeString(input_ids)));
  }
  if (!labels.defined() || labels.sizes() != input_ids.sizes() ||
      labels.scalar_type() != at::kLong) {
    return absl::InvalidArgumentError(absl::StrCat("labels must be int64 like input_ids ",
                                                   ShapeString(input_ids), ", got ",
                                                   ShapeString(labels)));
  }
  const Config& config = model.config();
  if (input_ids.size(1) > config.block_size) {
    return absl::OutOfRangeError(absl::StrCat("a sequence of ", input_ids.size(1),
                                              " tokens is longer than the model's context (",
                                              config.block_size, ")"));
  }
  const int64_t lowest = input_ids.min().item<int64_t>();
  const int64_t highest = input_ids.max().item<int64_t>();
  if (lowest < 0 || highest >= config.PaddedVocabSize()) {
    return absl::OutOfRangeError(absl::StrCat("token id ", lowest < 0 ? lowest : highest,
                                              " is outside the vocabulary [0, ",
                                              config.PaddedVocabSize(), ")"));
  }
  if (options.chunk_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ChunkedTrainingOptions.chunk_size must be >= 1, got ", options.chunk_size));
  }
  if (options.first_chunk < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ChunkedTrainingOptions.first_chunk must be >= 0, got ", options.first_chunk));
  }
  if (options.checkpoint_bits != 16 && options.checkpoint_bits != 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ChunkedTrainingOptions.checkpoint_bits must be 16 or 8, got ", options.checkpoint_bits));
  }
  for (const int64_t token : options.class_tokens) {
    if (token < 0 || token >= config.PaddedVocabSize()) {
      return absl::OutOfRangeError(absl::StrCat("ChunkedTrainingOptions.class_tokens: token ",
                                                token, " is outside the vocabulary [0, ",
                                                config.PaddedVocabSize(), ")"));
    }
  }
  if (UsesCachePositions(options.cache)) {
    return absl::InvalidArgumentError(
        "ChunkedTrainingOptions.cache.positions must be absolute (training keeps stream "
        "positions)");
  }
  return ValidateKVCacheSpec(options.cache);
}

// dL/d(input of the last layer), chunk by chunk through the head, into `grad` [B, S, n_embd].
void HeadBackward(GPTImpl& model, const at::Tensor& last, const at::Tensor& targets,
                  const at::Tensor& classes, const std::vector<Chunk>& chunks, double scale,
                  at::Tensor& grad) {
  for (const Chunk& chunk : chunks) {
    const at::Tensor h = last.narrow(1, chunk.begin, chunk.size()).detach().requires_grad_(true);
    at::Tensor loss =
        LossSum(model.Head(h), targets.narrow(1, chunk.begin, chunk.size()), classes) * scale;
    loss.backward();
    grad.narrow(1, chunk.begin, chunk.size()).copy_(h.grad());
  }
}

// One layer, cell by cell: `grad` (dL/d output of layer `layer`) -> dL/d its input; parameter
// gradients accumulate.
absl::StatusOr<at::Tensor> LayerBackward(GPTImpl& model, int64_t layer, const at::Tensor& input,
                                         const at::Tensor& grad, const std::vector<at::Tensor>& log,
                                         const std::vector<Chunk>& chunks, int64_t groups,
                                         ChunkedLossResult& result) {
  const int64_t batch = input.size(0), width_embd = input.size(2);
  at::Tensor grad_in = at::zeros_like(grad);
  for (size_t c = 0; c < chunks.size(); ++c) {
    const Chunk& chunk = chunks[c];
    const CellRows rows = RowsOfCell(log[c], chunk, groups);
    const int64_t width = rows.index.size(1);
    result.peak_cell_rows = std::max(result.peak_cell_rows, width);
    const at::Tensor gather =
        rows.index.to(input.device()).unsqueeze(-1).expand({batch, width, width_embd});
    const at::Tensor x = input.gather(1, gather).detach().requires_grad_(true);  // [B, U + C, E]
    KVStep step;
    step.positions = rows.positions.to(input.device());
    step.min_position = rows.positions.min().item<int64_t>();
    step.max_position = rows.positions.max().item<int64_t>();
    ReplayKVCache replay(layer, model.config().n_layer, model.config().block_size,
                         rows.key_positions);
    ASSIGN_OR_RETURN(const at::Tensor y, model.ForwardBlock(layer, x, step, &replay));
    torch::autograd::backward({y.narrow(1, rows.replayed, chunk.size())},
                              {grad.narrow(1, chunk.begin, chunk.size()).to(y.scalar_type())});
    grad_in.scatter_add_(1, gather, x.grad().to(grad_in.scalar_type()));
  }
  return grad_in;
}

absl::StatusOr<ChunkedLossResult> ChunkedLossUnchecked(GPTImpl& model, const at::Tensor& input_ids,
                                                       const at::Tensor& labels,
                                                       const ChunkedTrainingOptions& options,
                                                       std::optional<double> grad_scale) {
  const Config& config = model.config();
  const c10::Device device = model.device();
  const int64_t batch = input_ids.size(0), total = input_ids.size(1), layers = config.n_layer;
  const at::Tensor ids = input_ids.to(device);
  at::Tensor targets = at::full({batch, total}, kIgnoreIndex, ids.options());  // [B, S]
  if (total > 1) targets.narrow(1, 0, total - 1).copy_(labels.narrow(1, 1, total - 1));
  at::Tensor classes;  // [K] int64: the class tokens, undefined for next-token loss
  if (!options.class_tokens.empty()) {
    ASSIGN_OR_RETURN(targets, ClassTargets(targets, options.class_tokens));
    classes = at::tensor(options.class_tokens, at::kLong).to(device);
  }
  const std::vector<Chunk> chunks =
      Chunks(total, options.first_chunk > 0 ? options.first_chunk : options.chunk_size,
             options.chunk_size);
  KVCacheShape shape;
  shape.batch_size = batch;
  shape.max_sequence_length = config.block_size;
  shape.layers = model.CacheLayout();
  shape.dtype = model.dtype();
  shape.device = device;
  ASSIGN_OR_RETURN(std::unique_ptr<KVCache> inner, MakeKVCache(options.cache, shape));
  RecordingKVCache cache(std::move(inner));

  // Forward: every layer's input is kept (checkpoints [B, S, E], the last one the output of
  // the last layer) when a backward pass follows.
  const bool backward = grad_scale.has_value();
  LayerCheckpoints inputs(backward ? layers + 1 : 0, batch, total, config.n_embd,
                          options.checkpoint_bits,
                          at::TensorOptions().dtype(model.dtype()).device(device));
  ChunkedLossResult result;
  result.chunks = static_cast<int64_t>(chunks.size());
  double loss_sum = 0;
  {
    at::NoGradGuard no_grad;
    for (const Chunk& chunk : chunks) {
      KVStep step;
      step.positions = at::arange(chunk.begin, chunk.end, ids.options())
                           .unsqueeze(0)
                           .expand({batch, chunk.size()});
      step.min_position = chunk.begin;
      step.max_position = chunk.end - 1;
      RETURN_IF_ERROR(cache.CheckStep(step, batch));
      at::Tensor x = model.EmbedTokens(ids.narrow(1, chunk.begin, chunk.size()));
      for (int64_t l = 0; l < layers; ++l) {
        if (backward) inputs.Write(l, chunk.begin, x);
        ASSIGN_OR_RETURN(x, model.ForwardBlock(l, x, step, &cache));
      }
      if (backward) inputs.Write(layers, chunk.begin, x);
      loss_sum += LossSum(model.Head(x), targets.narrow(1, chunk.begin, chunk.size()), classes)
                      .item<double>();
    }
  }
  result.target_tokens = (targets != kIgnoreIndex).sum().item<int64_t>();
  result.loss = result.target_tokens > 0 ? loss_sum / result.target_tokens : 0.0;
  if (!backward || result.target_tokens == 0) return result;
  result.checkpoint_bytes = inputs.bytes();

  // Backward: the head chunk by chunk, then each layer cell by cell, top down; a layer's
  // checkpoint is taken (decoded) when its cells start and freed when they are done.
  const double scale = *grad_scale / static_cast<double>(result.target_tokens);
  at::Tensor last = inputs.Take(layers);
  at::Tensor grad = at::zeros_like(last);
  HeadBackward(model, last, targets, classes, chunks, scale, grad);
  last = at::Tensor();
  for (int64_t l = layers - 1; l >= 0; --l) {
    ASSIGN_OR_RETURN(grad, LayerBackward(model, l, inputs.Take(l), grad, cache.log()[l], chunks,
                                         shape.layers[l].n_query_groups, result));
  }
  const at::Tensor embedded = model.EmbedTokens(ids);
  if (embedded.requires_grad()) embedded.backward(grad.to(embedded.scalar_type()));
  return result;
}

}  // namespace

absl::StatusOr<ChunkedLossResult> ChunkedLoss(GPTImpl& model, const at::Tensor& input_ids,
                                              const at::Tensor& labels,
                                              const ChunkedTrainingOptions& options,
                                              std::optional<double> grad_scale) {
  RETURN_IF_ERROR(CheckInputs(model, input_ids, labels, options));
  try {
    return ChunkedLossUnchecked(model, input_ids, labels, options, grad_scale);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("chunked training step failed: ", e.what_without_backtrace()));
  }
}

}  // namespace lgpt
