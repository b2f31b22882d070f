#include "core/ops/decode_attention.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "core/ops/attention.h"

namespace lgpt {
namespace {

struct Case {
  int64_t groups;
  int64_t steps;
  int64_t entries;
  int64_t window;
  bool softcap;
  int64_t head_size = 20;  // multiples of 8 take the AVX2 kernels
};

class DecodeAttentionCases : public ::testing::TestWithParam<Case> {};

TEST_P(DecodeAttentionCases, EqualsGenericPath) {
  const Case c = GetParam();
  const int64_t batch = 2, n_head = 6, hs = c.head_size, capacity = c.entries + 7;
  at::manual_seed(c.groups * 100 + c.steps * 10 + c.entries);
  const at::Tensor q = at::randn({batch, n_head, c.steps, hs});
  // Views of the filled prefix of larger buffers, as the dense cache returns them.
  const at::Tensor keys = at::randn({batch, c.groups, capacity, hs}).narrow(2, 0, c.entries);
  const at::Tensor values = at::randn({batch, c.groups, capacity, hs}).narrow(2, 0, c.entries);
  // Queries at the last positions; a few empty (-1) slots; row 1 shorter than row 0.
  at::Tensor key_positions =
      at::arange(c.entries, at::kLong).view({1, 1, -1}).repeat({batch, 1, 1});
  if (c.entries > 3) key_positions.select(2, 1).fill_(-1);
  at::Tensor query_positions =
      at::arange(c.entries - c.steps, c.entries, at::kLong).view({1, -1}).repeat({batch, 1});
  query_positions[1].sub_(std::min<int64_t>(2, c.entries - c.steps));
  AttentionParams params;
  params.scale = 0.3;
  if (c.softcap) params.softcap = 5.0;
  params.sliding_window = c.window;
  ASSERT_TRUE(DecodeAttentionApplies(q, keys, values, query_positions, key_positions));
  // The generic path (weights asked of AttendBlockwise never take a CPU kernel).
  at::Tensor weights;  // [B, n_head, T, S]
  const at::Tensor expected = AttendBlockwise(
      q, c.groups, {TensorSource(keys, values, key_positions)}, query_positions, params, &weights);
  for (const bool use_avx2 : {false, CpuHasAvx2Fma()}) {
    const at::Tensor actual =
        DecodeAttention(q, keys, values, query_positions, key_positions, params, use_avx2);
    EXPECT_TRUE(at::allclose(actual, expected, 1e-5, 1e-5))
        << "avx2 " << use_avx2 << ": " << (actual - expected).abs().max().item<float>();
    // The weights it hands out are the generic path's, and the output is the same bits.
    at::Tensor handed = at::full(weights.sizes(), -7.0f);
    EXPECT_TRUE(at::equal(DecodeAttention(q, keys, values, query_positions, key_positions, params,
                                          use_avx2, handed.data_ptr<float>()),
                          actual));
    EXPECT_TRUE(at::allclose(handed, weights, 1e-5, 1e-5))
        << "avx2 " << use_avx2 << ": " << (handed - weights).abs().max().item<float>();
  }
  // AttendByPositions asked for weights takes the decode kernel and returns them.
  at::Tensor dispatched_weights;
  EXPECT_TRUE(at::allclose(AttendByPositions(q, keys, values, query_positions, key_positions,
                                             params, &dispatched_weights),
                           expected, 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(dispatched_weights, weights, 1e-5, 1e-5));
  // Through AttendByPositions' own dispatch, with per-group positions expanded.
  const at::Tensor grouped = key_positions.expand({batch, c.groups, c.entries});
  EXPECT_TRUE(at::allclose(AttendByPositions(q, keys, values, query_positions, grouped, params),
                           expected, 1e-5, 1e-5));
  // int32 key positions (the policy caches' index) read the same: the same bits.
  const at::Tensor narrow = key_positions.to(at::kInt);
  ASSERT_TRUE(DecodeAttentionApplies(q, keys, values, query_positions, narrow));
  for (const bool use_avx2 : {false, CpuHasAvx2Fma()}) {
    EXPECT_TRUE(at::equal(
        DecodeAttention(q, keys, values, query_positions, narrow, params, use_avx2),
        DecodeAttention(q, keys, values, query_positions, key_positions, params, use_avx2)));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DecodeAttentionCases,
    ::testing::Values(Case{6, 1, 1, 0, false}, Case{6, 1, 17, 0, false}, Case{2, 1, 100, 0, false},
                      Case{1, 1, 33, 0, true}, Case{2, 3, 40, 0, false}, Case{3, 4, 9, 0, false},
                      Case{2, 1, 64, 8, false}, Case{2, 2, 50, 5, true},
                      // AVX2 kernels: 1, 2, 3, 4, 6, 12 and 24 queries
                      // a group; head sizes with and without a
                      // 64-column block; entries not a multiple of 8.
                      Case{6, 1, 1, 0, false, 64}, Case{6, 1, 1000, 0, false, 64},
                      Case{3, 1, 77, 0, false, 128}, Case{2, 1, 9, 0, true, 8},
                      Case{2, 2, 130, 0, false, 24}, Case{1, 4, 31, 6, false, 40},
                      Case{6, 4, 200, 0, false, 16}, Case{3, 2, 64, 0, true, 72},
                      Case{1, 1, 257, 0, false, 256}));

// Blocks read in place (the paged pool) give DecodeAttention's bits on their concatenation,
// for block sizes that divide the entries and ones that leave a partial last block.
TEST(DecodeAttentionBlocks, EqualsDecodeAttentionOnTheConcatenatedBlocks) {
  for (const int64_t hs : {int64_t{20}, int64_t{64}}) {
    for (const int64_t entries_per_block : {1, 16, 7}) {
      for (const int64_t steps : {1, 3}) {
        const int64_t groups = 2, n_head = 6, entries = 45;
        at::manual_seed(entries_per_block * 10 + steps + hs);
        const int64_t blocks = (entries + entries_per_block - 1) / entries_per_block;
        std::vector<at::Tensor> block_keys, block_values;  // [G, bs, hs]
        for (int64_t i = 0; i < blocks; ++i) {
          block_keys.push_back(at::randn({groups, entries_per_block, hs}));
          block_values.push_back(at::randn({groups, entries_per_block, hs}));
        }
        const at::Tensor keys = at::cat(block_keys, 1).narrow(1, 0, entries).unsqueeze(0);
        const at::Tensor values = at::cat(block_values, 1).narrow(1, 0, entries).unsqueeze(0);
        const at::Tensor q = at::randn({1, n_head, steps, hs});
        const at::Tensor key_positions = at::arange(entries, at::kLong).view({1, 1, -1});
        const at::Tensor query_positions =
            at::arange(entries - steps, entries, at::kLong).view({1, -1});
        AttentionParams params;
        params.scale = 0.25;
        params.sliding_window = entries_per_block == 7 ? 20 : 0;
        ASSERT_TRUE(DecodeAttentionBlocksApplies(q, block_keys, block_values, entries,
                                                 query_positions, key_positions));
        for (const bool use_avx2 : {false, CpuHasAvx2Fma()}) {
          const at::Tensor expected =
              DecodeAttention(q, keys.contiguous(), values.contiguous(), query_positions,
                              key_positions, params, use_avx2);
          const at::Tensor actual =
              DecodeAttentionBlocks(q, block_keys, block_values, entries, query_positions,
                                    key_positions, params, use_avx2);
          EXPECT_TRUE(at::equal(actual, expected))
              << "hs " << hs << " block " << entries_per_block << " steps " << steps << " avx2 "
              << use_avx2 << ": " << (actual - expected).abs().max().item<float>();
        }
      }
    }
  }
  // What it does not take: more than 4 steps, blocks too few for the entries, mixed shapes.
  const std::vector<at::Tensor> two = {at::randn({2, 4, 8}), at::randn({2, 4, 8})};
  const at::Tensor positions = at::arange(8, at::kLong).view({1, 1, -1});
  const at::Tensor q1 = at::randn({1, 4, 1, 8});
  EXPECT_FALSE(DecodeAttentionBlocksApplies(at::randn({1, 4, 5, 8}), two, two, 8,
                                            at::zeros({1, 5}, at::kLong), positions));
  EXPECT_FALSE(
      DecodeAttentionBlocksApplies(q1, two, two, 9, at::zeros({1, 1}, at::kLong), positions));
  EXPECT_FALSE(DecodeAttentionBlocksApplies(q1, two, {two[0], at::randn({2, 3, 8})}, 8,
                                            at::zeros({1, 1}, at::kLong), positions));
}

TEST(DecodeAttentionRows, EachRowEqualsItsOwnDecodeAttention) {
  // Rows of different lengths, stored as one run per group (a dense cache's buffer, wider than
  // the filled part) or in blocks (a paged pool), in one pass: each row's result must be
  // DecodeAttention's on that row alone, to the bit.
  for (const int64_t hs : {int64_t{20}, int64_t{64}}) {
    for (const int64_t steps : {1, 2}) {
      for (const int64_t window : {0, 9}) {
        const int64_t groups = 2, n_head = 6, entries_per_block = 4;
        const std::vector<int64_t> lengths = {13, 1, 30, 7, 4};
        const int64_t batch = static_cast<int64_t>(lengths.size());
        at::manual_seed(hs + steps * 7 + window);
        const at::Tensor q = at::randn({batch, n_head, steps, hs});
        at::Tensor query_positions = at::empty({batch, steps}, at::kLong);
        std::vector<DecodeRow> rows;
        std::vector<at::Tensor> row_keys, row_values;  // [1, G, length, hs] each
        for (int64_t b = 0; b < batch; ++b) {
          const int64_t length = lengths[b];
          for (int64_t t = 0; t < steps; ++t) query_positions[b][t] = length - steps + t;
          DecodeRow row;
          row.entries = length;
          row.key_positions = at::arange(length, at::kLong).view({1, 1, -1});
          if (b % 2 == 0) {  // one run per group in a wider buffer
            const at::Tensor k = at::randn({1, groups, length + 5, hs});
            const at::Tensor v = at::randn({1, groups, length + 5, hs});
            row.segments = [k, v, length](int64_t, int64_t g, std::vector<KVSegment>* out) {
              out->push_back({k.data_ptr<float>() + g * k.stride(1),
                              v.data_ptr<float>() + g * v.stride(1), length});
            };
            row_keys.push_back(k.narrow(2, 0, length));
            row_values.push_back(v.narrow(2, 0, length));
          } else {  // blocks [G, entries_per_block, hs]
            std::vector<at::Tensor> kb, vb;
            for (int64_t begin = 0; begin < length; begin += entries_per_block) {
              kb.push_back(at::randn({groups, entries_per_block, hs}));
              vb.push_back(at::randn({groups, entries_per_block, hs}));
            }
            row.segments = [kb, vb, length, entries_per_block, hs](int64_t, int64_t g,
                                                                   std::vector<KVSegment>* out) {
              for (size_t i = 0; i < kb.size(); ++i) {
                const int64_t begin = static_cast<int64_t>(i) * entries_per_block;
                out->push_back({kb[i].data_ptr<float>() + g * entries_per_block * hs,
                                vb[i].data_ptr<float>() + g * entries_per_block * hs,
                                std::min(entries_per_block, length - begin)});
              }
            };
            row_keys.push_back(at::cat(kb, 1).narrow(1, 0, length).unsqueeze(0));
            row_values.push_back(at::cat(vb, 1).narrow(1, 0, length).unsqueeze(0));
          }
          rows.push_back(std::move(row));
        }
        AttentionParams params;
        params.scale = 0.3;
        params.sliding_window = window;
        ASSERT_TRUE(DecodeAttentionRowsApplies(q, groups, query_positions));
        for (const bool use_avx2 : {false, CpuHasAvx2Fma()}) {
          const at::Tensor actual =
              DecodeAttentionRows(q, groups, rows, query_positions, params, use_avx2);
          ASSERT_EQ(actual.sizes(), q.sizes());
          for (int64_t b = 0; b < batch; ++b) {
            const at::Tensor expected = DecodeAttention(
                q.narrow(0, b, 1), row_keys[b].contiguous(), row_values[b].contiguous(),
                query_positions.narrow(0, b, 1), rows[b].key_positions, params, use_avx2);
            EXPECT_TRUE(at::equal(actual.narrow(0, b, 1), expected))
                << "row " << b << " hs " << hs << " steps " << steps << " window " << window
                << " avx2 " << use_avx2;
          }
        }
      }
    }
  }
  // Not for autograd, other dtypes, more than 4 steps, or positions of another batch.
  const at::Tensor positions = at::zeros({2, 1}, at::kLong);
  EXPECT_FALSE(DecodeAttentionRowsApplies(at::randn({2, 4, 1, 8}).requires_grad_(), 2, positions));
  EXPECT_FALSE(DecodeAttentionRowsApplies(at::randn({2, 4, 1, 8}, at::kDouble), 2, positions));
  EXPECT_FALSE(
      DecodeAttentionRowsApplies(at::randn({2, 4, 5, 8}), 2, at::zeros({2, 5}, at::kLong)));
  EXPECT_FALSE(DecodeAttentionRowsApplies(at::randn({2, 4, 1, 8}), 3, positions));
  EXPECT_FALSE(
      DecodeAttentionRowsApplies(at::randn({2, 4, 1, 8}), 2, at::zeros({3, 1}, at::kLong)));
}

// 16-bit blocks (a float32 model's bfloat16 or float16 KV pool) read in place give the float32
// kernel's bits on their widened copies, on random shapes: odd head sizes, MHA, GQA and MQA,
// blocks out of pool order, partial last blocks, single-entry rows.
TEST(DecodeAttentionBlocks, SixteenBitBlocksEqualTheFloat32KernelOnTheirWidenedCopies) {
  at::manual_seed(41);
  int64_t cases = 0;
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    for (const int64_t hs : {int64_t{7}, int64_t{20}, int64_t{64}, int64_t{72}, int64_t{128}}) {
      for (const int64_t groups : {int64_t{6}, int64_t{2}, int64_t{1}}) {
        for (int trial = 0; trial < 3; ++trial) {
          const int64_t n_head = 6;
          const int64_t steps = 1 + at::randint(4, {1}).item<int64_t>();
          const int64_t entries_per_block = std::vector<int64_t>{1, 5, 16}[trial];
          const int64_t entries = trial == 0 ? 1 : 1 + at::randint(70, {1}).item<int64_t>();
          const int64_t blocks = (entries + entries_per_block - 1) / entries_per_block;
          // A pool of blocks [num_blocks, G, bs, hs]; the row's blocks in a shuffled order.
          const int64_t num_blocks = blocks + 3;
          const at::Tensor pool_keys =
              at::randn({num_blocks, groups, entries_per_block, hs}).to(dtype);
          const at::Tensor pool_values =
              at::randn({num_blocks, groups, entries_per_block, hs}).to(dtype);
          const at::Tensor order = at::randperm(num_blocks, at::kLong);
          std::vector<at::Tensor> keys16, values16, keys32, values32;  // [G, bs, hs] each
          for (int64_t i = 0; i < blocks; ++i) {
            const int64_t block = order[i].item<int64_t>();
            keys16.push_back(pool_keys.select(0, block));
            values16.push_back(pool_values.select(0, block));
            keys32.push_back(keys16.back().to(at::kFloat));
            values32.push_back(values16.back().to(at::kFloat));
          }
          const at::Tensor q = at::randn({1, n_head, steps, hs});
          const at::Tensor key_positions = at::arange(entries, at::kLong).view({1, 1, -1});
          const at::Tensor query_positions =
              at::arange(entries - 1, entries - 1 + steps, at::kLong).view({1, -1});
          AttentionParams params;
          params.scale = 0.3;
          params.sliding_window = trial == 2 ? 11 : 0;
          if (trial == 1) params.softcap = 4.0;
          ASSERT_TRUE(DecodeAttentionBlocksApplies(q, keys16, values16, entries, query_positions,
                                                   key_positions));
          for (const bool use_avx2 : {false, CpuHasAvx2Fma()}) {
            const at::Tensor expected = DecodeAttentionBlocks(
                q, keys32, values32, entries, query_positions, key_positions, params, use_avx2);
            const at::Tensor actual = DecodeAttentionBlocks(
                q, keys16, values16, entries, query_positions, key_positions, params, use_avx2);
            EXPECT_TRUE(at::equal(actual, expected))
                << dtype << " hs " << hs << " groups " << groups << " steps " << steps << " block "
                << entries_per_block << " entries " << entries << " avx2 " << use_avx2 << ": "
                << (actual - expected).abs().max().item<float>();
          }
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 90);
  // Blocks of mixed dtypes are not taken.
  const std::vector<at::Tensor> bf16 = {at::randn({2, 4, 8}).to(at::kBFloat16)};
  const std::vector<at::Tensor> fp32 = {at::randn({2, 4, 8})};
  EXPECT_FALSE(DecodeAttentionBlocksApplies(at::randn({1, 4, 1, 8}), bf16, fp32, 4,
                                            at::zeros({1, 1}, at::kLong),
                                            at::arange(4, at::kLong).view({1, 1, -1})));
}

// A batched step over 16-bit pool blocks: each row's result is its batch-1 run's, to the bit,
// whatever the batch (the serving engine's exactness guarantee), and the float32 kernel's on
// the widened blocks.
TEST(DecodeAttentionRows, SixteenBitRowsEqualTheirBatchOneRun) {
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    for (const int64_t hs : {int64_t{20}, int64_t{64}}) {
      const int64_t groups = 2, n_head = 6, entries_per_block = 16, steps = 1;
      const std::vector<int64_t> lengths = {1, 40, 16, 17, 129, 3};
      const int64_t batch = static_cast<int64_t>(lengths.size());
      at::manual_seed(hs + (dtype == at::kHalf ? 1 : 0));
      const at::Tensor q = at::randn({batch, n_head, steps, hs});
      at::Tensor query_positions = at::empty({batch, steps}, at::kLong);
      std::vector<DecodeRow> rows;
      std::vector<std::vector<at::Tensor>> row_keys, row_values;  // [G, bs, hs] blocks
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t length = lengths[b];
        query_positions[b][0] = length - 1;
        std::vector<at::Tensor> kb, vb;
        for (int64_t begin = 0; begin < length; begin += entries_per_block) {
          kb.push_back(at::randn({groups, entries_per_block, hs}).to(dtype));
          vb.push_back(at::randn({groups, entries_per_block, hs}).to(dtype));
        }
        DecodeRow row;
        row.entries = length;
        row.key_positions = at::arange(length, at::kLong).view({1, 1, -1});
        row.segments = BlockSegments(kb, vb, length);
        rows.push_back(std::move(row));
        row_keys.push_back(kb);
        row_values.push_back(vb);
      }
      AttentionParams params;
      params.scale = 0.125;
      for (const bool use_avx2 : {false, CpuHasAvx2Fma()}) {
        const at::Tensor actual =
            DecodeAttentionRows(q, groups, rows, query_positions, params, use_avx2);
        for (int64_t b = 0; b < batch; ++b) {
          const at::Tensor alone = DecodeAttentionBlocks(
              q.narrow(0, b, 1), row_keys[b], row_values[b], lengths[b],
              query_positions.narrow(0, b, 1), rows[b].key_positions, params, use_avx2);
          EXPECT_TRUE(at::equal(actual.narrow(0, b, 1), alone))
              << dtype << " row " << b << " hs " << hs << " avx2 " << use_avx2;
          const at::Tensor keys32 =
              at::cat(row_keys[b], 1).narrow(1, 0, lengths[b]).unsqueeze(0).to(at::kFloat);
          const at::Tensor values32 =
              at::cat(row_values[b], 1).narrow(1, 0, lengths[b]).unsqueeze(0).to(at::kFloat);
          EXPECT_TRUE(at::equal(alone, DecodeAttention(q.narrow(0, b, 1), keys32, values32,
                                                       query_positions.narrow(0, b, 1),
                                                       rows[b].key_positions, params, use_avx2)))
              << dtype << " row " << b << " hs " << hs << " avx2 " << use_avx2;
        }
      }
    }
  }
}

// Restores the AVX-512 setting a test changed.
class Avx512Setting {
 public:
  explicit Avx512Setting(bool allowed) : previous_(SetDecodeAttentionAvx512ForTesting(allowed)) {}
  ~Avx512Setting() { SetDecodeAttentionAvx512ForTesting(previous_); }
  Avx512Setting(const Avx512Setting&) = delete;
  Avx512Setting& operator=(const Avx512Setting&) = delete;

 private:
  bool previous_;
};

// The AVX-512 kernels give the AVX2 kernels' results to the bit (outputs and handed-out
// weights) on every entry type: head sizes that are multiples of 16, of 8 but not 16 (a last
// 8-column block), and of neither (AVX-512 scores with a masked tail, portable values); entry
// counts around the 4-key and 16-lane steps; one segment per group or several (a pool's
// blocks, of 16 and of 5 entries); MHA, GQA and MQA with 1-4 steps; masks and soft-capping.
TEST(DecodeAttention, Avx512KernelsGiveTheAvx2Bits) {
  if (!CpuHasAvx512()) GTEST_SKIP() << "no AVX-512";
  at::manual_seed(512);
  int64_t cases = 0;
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (const int64_t hs : {3, 8, 16, 20, 24, 64, 72, 80, 128, 136, 256}) {
      for (const int64_t entries : {1, 2, 3, 4, 5, 7, 16, 17, 33, 64, 100, 257}) {
        const int64_t n_head = 4;
        const int64_t groups = std::vector<int64_t>{4, 2, 1}[cases % 3];
        const int64_t steps = 1 + cases % 4;
        const int64_t block = std::vector<int64_t>{entries, 16, 5}[(cases / 3) % 3];
        const int64_t batch = 2;
        const at::Tensor q = at::randn({batch, n_head, steps, hs});
        const at::Tensor keys = at::randn({batch, groups, entries, hs}).to(dtype);
        const at::Tensor values = at::randn({batch, groups, entries, hs}).to(dtype);
        const int64_t bytes = keys.element_size();
        // Each (row, group)'s run of entries as segments of `block` entries.
        const KVSegmentsOf segments = [&](int64_t b, int64_t g, std::vector<KVSegment>* out) {
          const KVEntryType type = *KVEntryTypeOf(dtype);
          const char* k = static_cast<const char*>(keys.data_ptr()) + keys.stride(1) * g * bytes +
                          keys.stride(0) * b * bytes;
          const char* v = static_cast<const char*>(values.data_ptr()) +
                          values.stride(1) * g * bytes + values.stride(0) * b * bytes;
          for (int64_t begin = 0; begin < entries; begin += block) {
            const int64_t at_bytes = begin * hs * bytes;
            out->push_back({k + at_bytes, v + at_bytes, std::min(block, entries - begin), type});
          }
        };
        const at::Tensor key_positions =
            at::arange(entries, at::kLong).view({1, 1, -1}).repeat({batch, 1, 1});
        at::Tensor query_positions = at::arange(entries - 1, entries - 1 + steps, at::kLong)
                                         .view({1, -1})
                                         .repeat({batch, 1});
        query_positions[1].sub_(std::min<int64_t>(2, entries - 1));
        AttentionParams params;
        params.scale = 0.2;
        if (cases % 5 == 1) params.softcap = 3.0;
        if (cases % 7 == 2) params.sliding_window = 6;
        auto run = [&](bool avx512, bool use_avx2, at::Tensor* weights) {
          const Avx512Setting setting(avx512);
          *weights = at::full({batch, n_head, steps, entries}, -7.0f);
          return DecodeAttentionSegments(q, groups, entries, segments, query_positions,
                                         key_positions, params, use_avx2,
                                         weights->data_ptr<float>());
        };
        at::Tensor weights_avx2, weights_avx512, weights_portable;
        const at::Tensor avx2 = run(false, true, &weights_avx2);
        const at::Tensor avx512 = run(true, true, &weights_avx512);
        const at::Tensor portable = run(true, false, &weights_portable);
        EXPECT_TRUE(at::equal(avx512, avx2))
            << dtype << " hs " << hs << " entries " << entries << " groups " << groups << " steps "
            << steps << " block " << block << ": " << (avx512 - avx2).abs().max().item<float>();
        EXPECT_TRUE(at::equal(weights_avx512, weights_avx2))
            << dtype << " hs " << hs << " entries " << entries << " groups " << groups << " steps "
            << steps << " block " << block;
        // And both are the portable loops' results within rounding.
        EXPECT_TRUE(at::allclose(avx512, portable, 1e-5, 1e-5))
            << dtype << " hs " << hs << " entries " << entries << ": "
            << (avx512 - portable).abs().max().item<float>();
        EXPECT_TRUE(at::allclose(weights_avx512, weights_portable, 1e-5, 1e-5));
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 3 * 11 * 12);
}

// A batched step over 16-bit blocks takes the AVX-512 kernels too: the AVX2 step's bits.
TEST(DecodeAttentionRows, Avx512RowsGiveTheAvx2Bits) {
  if (!CpuHasAvx512()) GTEST_SKIP() << "no AVX-512";
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const int64_t groups = 2, n_head = 8, hs = 64, entries_per_block = 16, steps = 1;
    const std::vector<int64_t> lengths = {1, 40, 16, 17, 129, 3};
    const int64_t batch = static_cast<int64_t>(lengths.size());
    at::manual_seed(64);
    const at::Tensor q = at::randn({batch, n_head, steps, hs});
    at::Tensor query_positions = at::empty({batch, steps}, at::kLong);
    std::vector<DecodeRow> rows;
    for (int64_t b = 0; b < batch; ++b) {
      query_positions[b][0] = lengths[b] - 1;
      std::vector<at::Tensor> kb, vb;
      for (int64_t begin = 0; begin < lengths[b]; begin += entries_per_block) {
        kb.push_back(at::randn({groups, entries_per_block, hs}).to(dtype));
        vb.push_back(at::randn({groups, entries_per_block, hs}).to(dtype));
      }
      DecodeRow row;
      row.entries = lengths[b];
      row.key_positions = at::arange(lengths[b], at::kLong).view({1, 1, -1});
      row.segments = BlockSegments(kb, vb, lengths[b]);
      rows.push_back(std::move(row));
    }
    AttentionParams params;
    params.scale = 0.125;
    at::Tensor avx2, avx512;
    {
      const Avx512Setting setting(false);
      avx2 = DecodeAttentionRows(q, groups, rows, query_positions, params, true);
    }
    {
      const Avx512Setting setting(true);
      avx512 = DecodeAttentionRows(q, groups, rows, query_positions, params, true);
    }
    EXPECT_TRUE(at::equal(avx512, avx2)) << dtype;
  }
}

// Quantised segments (int8 / int4 codes and float16 scales, read in place) give the bits of
// the kernel over their decoded float32 copies, on every path: AVX2 with and without AVX-512
// (in registers where the group is a multiple of 8) and the portable loops; one segment or
// several per group, MHA / GQA, 1-4 steps, windows and soft-capping.
TEST(DecodeAttentionSegments, QuantisedSegmentsEqualTheirDecodedCopies) {
  at::manual_seed(88);
  struct Shape {
    paged::EntryKind kind;
    int32_t head_size, group;
    int64_t heads, groups, steps, entries, block;
  };
  for (const Shape& c :
       {Shape{paged::EntryKind::kInt8, 64, 32, 4, 2, 1, 37, 16},
        Shape{paged::EntryKind::kInt4, 64, 32, 6, 3, 3, 50, 16},
        Shape{paged::EntryKind::kInt8, 24, 8, 2, 2, 4, 21, 5},
        Shape{paged::EntryKind::kInt4, 16, 4, 3, 1, 2, 9, 9},  // group of 4: channel by channel
        Shape{paged::EntryKind::kInt8, 128, 32, 8, 8, 1, 130, 64},  // one query row: 4 keys a pass
        Shape{paged::EntryKind::kInt4, 64, 32, 4, 4, 1, 45, 16},
        Shape{paged::EntryKind::kInt4, 40, 8, 4, 2, 2, 23, 7}}) {  // 16 channels, two scales
    const paged::EntryFormat f{c.kind, c.head_size, c.group};
    const int64_t entry_bytes = paged::EntryBytes(f), hs = c.head_size;
    // [G, entries] entries of random floats, quantised.
    std::vector<uint8_t> keys(c.groups * c.entries * entry_bytes);
    std::vector<uint8_t> values(keys.size());
    const at::Tensor raw = at::randn({2, c.groups, c.entries, hs}).contiguous();
    for (int64_t i = 0; i < c.groups * c.entries; ++i) {
      paged::QuantizeEntry(raw[0].data_ptr<float>() + i * hs, f, keys.data() + i * entry_bytes);
      paged::QuantizeEntry(raw[1].data_ptr<float>() + i * hs, f, values.data() + i * entry_bytes);
    }
    at::Tensor decoded_keys = at::empty({1, c.groups, c.entries, hs});
    at::Tensor decoded_values = at::empty_like(decoded_keys);
    for (int64_t i = 0; i < c.groups * c.entries; ++i) {
      paged::DecodeEntry(keys.data() + i * entry_bytes, f, decoded_keys.data_ptr<float>() + i * hs);
      paged::DecodeEntry(values.data() + i * entry_bytes, f,
                         decoded_values.data_ptr<float>() + i * hs);
    }
    const auto segments = [&](bool quantised) -> KVSegmentsOf {
      return [&, quantised](int64_t, int64_t g, std::vector<KVSegment>* out) {
        for (int64_t begin = 0; begin < c.entries; begin += c.block) {
          const int64_t n = std::min(c.block, c.entries - begin), e = g * c.entries + begin;
          if (quantised) {
            KVSegment segment{keys.data() + e * entry_bytes, values.data() + e * entry_bytes, n};
            segment.quantised = f;
            out->push_back(segment);
          } else {
            out->push_back({decoded_keys.data_ptr<float>() + e * hs,
                            decoded_values.data_ptr<float>() + e * hs, n});
          }
        }
      };
    };
    const at::Tensor q = at::randn({1, c.heads, c.steps, hs});
    const at::Tensor query_positions =
        at::arange(c.entries - c.steps, c.entries, at::kLong).unsqueeze(0);
    const at::Tensor key_positions = at::arange(c.entries, at::kLong).view({1, 1, -1});
    AttentionParams params;
    params.scale = 0.3;
    params.softcap = c.steps == 3 ? std::optional<double>(4.0) : std::nullopt;
    params.sliding_window = c.steps == 4 ? 11 : 0;
    for (const bool avx2 : {false, true}) {
      for (const bool avx512 : {false, true}) {
        Avx512Setting setting(avx512);
        const at::Tensor a = DecodeAttentionSegments(q, c.groups, c.entries, segments(true),
                                                     query_positions, key_positions, params, avx2);
        const at::Tensor b = DecodeAttentionSegments(q, c.groups, c.entries, segments(false),
                                                     query_positions, key_positions, params, avx2);
        EXPECT_TRUE(at::equal(a, b))
            << static_cast<int>(c.kind) << " head " << hs << " group " << c.group
            << (avx2 ? " avx2" : " portable") << (avx512 ? " avx512" : "") << ": "
            << (a - b).abs().max().item<double>();
      }
    }
  }
}

TEST(DecodeAttention, RowWithNoAllowedKeyGetsUniformWeights) {
  const at::Tensor q = at::randn({1, 2, 1, 8});
  const at::Tensor keys = at::randn({1, 1, 5, 8});
  const at::Tensor values = at::randn({1, 1, 5, 8});
  const at::Tensor key_positions = at::full({1, 1, 5}, -1, at::kLong);
  const at::Tensor query_positions = at::zeros({1, 1}, at::kLong);
  const at::Tensor actual =
      DecodeAttention(q, keys, values, query_positions, key_positions, AttentionParams{});
  const at::Tensor mean = values.mean(2, /*keepdim=*/true).expand({1, 2, 1, 8});
  EXPECT_TRUE(at::allclose(actual, mean, 1e-5, 1e-6));
}

TEST(DecodeAttention, NotForPrefillOrOtherDtypes) {
  const at::Tensor kv = at::randn({1, 2, 10, 8});
  const at::Tensor kp = at::arange(10, at::kLong).view({1, 1, 10});
  EXPECT_FALSE(
      DecodeAttentionApplies(at::randn({1, 2, 5, 8}), kv, kv, at::zeros({1, 5}, at::kLong), kp));
  EXPECT_FALSE(DecodeAttentionApplies(at::randn({1, 2, 1, 8}).to(at::kDouble), kv.to(at::kDouble),
                                      kv.to(at::kDouble), at::zeros({1, 1}, at::kLong), kp));
  EXPECT_FALSE(DecodeAttentionApplies(at::randn({1, 2, 1, 8}),
                                      kv.transpose(2, 3).contiguous().transpose(2, 3), kv,
                                      at::zeros({1, 1}, at::kLong), kp));
}

}  // namespace
}  // namespace lgpt
