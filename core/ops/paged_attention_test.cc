#include "core/ops/paged_attention.h"

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/base/device.h"
#include "core/ops/attention.h"
#include "core/ops/attention_mask.h"
#include "core/ops/paged_attention_layout.h"

namespace lgpt {
namespace {

using paged::EntryFormat;
using paged::EntryKind;

// ---- The shared layout math, on the host ----

TEST(PagedLayout, HalfAndBFloat16WidenExactly) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const uint16_t b = static_cast<uint16_t>(bits);
    const float half = paged::HalfToFloat(b);
    const float expected = static_cast<float>(c10::Half(b, c10::Half::from_bits()));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(half)) << bits;
    } else {
      EXPECT_EQ(half, expected) << bits;
    }
    const float bf = paged::BFloat16ToFloat(b);
    const float expected_bf = static_cast<float>(c10::BFloat16(b, c10::BFloat16::from_bits()));
    if (!std::isnan(expected_bf)) {
      EXPECT_EQ(bf, expected_bf) << bits;
    }
  }
}

TEST(PagedLayout, FloatToHalfRoundsAsC10Does) {
  std::mt19937 random(3);
  std::vector<float> values = {
      0.0f,     -0.0f,    1.0f,      65504.0f,
      65519.0f, 65520.0f, 1e9f,      -1e9f,
      6.1e-5f,  5.96e-8f, 2.98e-8f,  2.9802322e-8f,
      1e-10f,   0.1f,     -3.14159f, std::numeric_limits<float>::infinity()};
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = any_bits(random);
    // Mostly within half's range (exponents 100 .. 143), some anywhere.
    if (i % 4 != 0) bits = (bits & 0x807fffffu) | ((100u + bits % 44u) << 23);
    float f;
    std::memcpy(&f, &bits, 4);
    if (!std::isnan(f)) values.push_back(f);
  }
  for (const float f : values) {
    EXPECT_EQ(paged::FloatToHalf(f), c10::Half(f).x) << f;
  }
}

TEST(PagedLayout, EntryIndexFollowsTheTensorLayout) {
  const paged::PoolShape pool{5, 3, 4, 12};
  const at::Tensor t = at::empty({5, 3, 4, 12}, at::kByte);
  for (int64_t block = 0; block < 5; ++block) {
    for (int64_t g = 0; g < 3; ++g) {
      for (int64_t slot = 0; slot < 4; ++slot) {
        EXPECT_EQ(paged::EntryIndex(pool, block, g, slot) * pool.entry_bytes,
                  block * t.stride(0) + g * t.stride(1) + slot * t.stride(2));
      }
    }
  }
  const int32_t table[] = {4, 0, 7, -1};
  EXPECT_EQ(paged::LocateEntry(pool, table, 4, 1, 0), paged::EntryIndex(pool, 4, 1, 0));
  EXPECT_EQ(paged::LocateEntry(pool, table, 4, 2, 5), paged::EntryIndex(pool, 0, 2, 1));
  EXPECT_EQ(paged::LocateEntry(pool, table, 4, 0, 8), -1);   // block 7 is outside the pool
  EXPECT_EQ(paged::LocateEntry(pool, table, 4, 0, 12), -1);  // no block
  EXPECT_EQ(paged::LocateEntry(pool, table, 4, 0, 16), -1);  // past the table
}

TEST(PagedLayout, VisibilityIsKeyAllowed) {
  for (int64_t window : {0, 1, 3}) {
    for (int64_t q = 0; q < 6; ++q) {
      for (int64_t k = -1; k < 8; ++k) {
        EXPECT_EQ(paged::KeyVisible(q, k, window), KeyAllowed(q, k, window)) << q << " " << k;
      }
    }
  }
}

TEST(PagedLayout, EntryBytesHoldCodesAndAlignedScales) {
  EXPECT_EQ(paged::EntryBytes({EntryKind::kFloat32, 64, 32}), 256);
  EXPECT_EQ(paged::EntryBytes({EntryKind::kBFloat16, 7, 32}), 14);
  EXPECT_EQ(paged::EntryBytes({EntryKind::kInt8, 64, 32}), 64 + 4);
  EXPECT_EQ(paged::EntryBytes({EntryKind::kInt4, 64, 32}), 32 + 4);
  EXPECT_EQ(paged::EntryBytes({EntryKind::kInt8, 9, 3}), 10 + 6);  // codes padded to even
  EXPECT_EQ(paged::EntryBytes({EntryKind::kInt4, 6, 2}), 4 + 6);
}

TEST(PagedLayout, DecodeEntryIsEveryEntryElement) {
  std::mt19937 random(8);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (const EntryFormat format :
       {EntryFormat{EntryKind::kInt8, 48, 16}, EntryFormat{EntryKind::kInt4, 64, 32},
        EntryFormat{EntryKind::kFloat32, 5, 32}}) {
    std::vector<float> x(format.head_size), out(format.head_size);
    for (float& v : x) v = normal(random);
    std::vector<uint8_t> entry(paged::EntryBytes(format));
    if (paged::IsQuantised(format.kind)) {
      paged::QuantizeEntry(x.data(), format, entry.data());
    } else {
      std::memcpy(entry.data(), x.data(), entry.size());
    }
    paged::DecodeEntry(entry.data(), format, out.data());
    for (int64_t d = 0; d < format.head_size; ++d) {
      EXPECT_EQ(out[d], paged::EntryElement(entry.data(), format, d));
      EXPECT_NEAR(out[d], x[d], 0.6f);  // half a step of int4 (absmax of 32 normals / 7)
    }
  }
}

// Splitting a softmax and merging it by MergeFactors equals the softmax over everything.
TEST(PagedLayout, MergedSplitsEqualOneSoftmax) {
  std::mt19937 random(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t n : {1, 5, 64}) {
    std::vector<float> scores(n), values(n);
    for (int64_t i = 0; i < n; ++i) {
      scores[i] = normal(random);
      values[i] = normal(random);
    }
    const float m = paged::MaxOf(scores.data(), n);
    double total = 0, expected = 0;
    for (int64_t i = 0; i < n; ++i) total += std::exp(scores[i] - m);
    for (int64_t i = 0; i < n; ++i) expected += std::exp(scores[i] - m) / total * values[i];
    for (int64_t split : {1, 2, 7}) {
      const int64_t splits = (n + split - 1) / split;
      std::vector<float> maxes(splits), sums(splits), acc(splits), factors(splits);
      for (int64_t s = 0; s < splits; ++s) {
        const int64_t begin = s * split, count = std::min(split, n - begin);
        maxes[s] = paged::MaxOf(scores.data() + begin, count);
        sums[s] = acc[s] = 0;
        for (int64_t i = begin; i < begin + count; ++i) {
          sums[s] += std::exp(scores[i] - maxes[s]);
          acc[s] += std::exp(scores[i] - maxes[s]) * values[i];
        }
      }
      paged::MergeFactors(
          maxes.data(), sums.data(), splits, [](float x) { return std::exp(x); }, factors.data());
      double merged = 0;
      for (int64_t s = 0; s < splits; ++s) merged += factors[s] * acc[s];
      EXPECT_NEAR(merged, expected, 1e-5) << n << " / " << split;
    }
  }
  float factor = 1.0f;
  const float empty_max = paged::NegativeInfinity(), empty_sum = 0.0f;
  paged::MergeFactors(
      &empty_max, &empty_sum, 1, [](float x) { return std::exp(x); }, &factor);
  EXPECT_EQ(factor, 0.0f);  // nothing seen: the output is 0, not NaN
}

// ---- The op against AttendByPositions ----

struct Request {
  int64_t length;
  int64_t query_position;  // -1: length - 1
};

struct Case {
  std::string name;
  int64_t heads, groups, head_size, entries_per_block;
  std::vector<Request> requests;
  AttentionParams params;
  int64_t entries_per_split = 256;
  bool slot_positions = false;  // permuted positions with empty slots
};

// A pool of `format` entries holding random requests, with tables over shuffled blocks, and the
// dequantised entries of each request for the reference.
struct Fixture {
  PagedKVLayer layer;
  PagedDecodeBatch batch;
  at::Tensor q;                           // [R, heads, hs] float32
  std::vector<at::Tensor> keys, values;   // per request [1, G, length, hs] float32
  std::vector<at::Tensor> key_positions;  // per request [1, G, length] int64
  std::vector<int64_t> query_positions;
};

at::ScalarType DtypeOf(EntryKind kind) {
  switch (kind) {
    case EntryKind::kBFloat16:
      return at::kBFloat16;
    case EntryKind::kFloat16:
      return at::kHalf;
    case EntryKind::kFloat32:
      return at::kFloat;
    default:
      return at::kByte;
  }
}

// Writes x [hs] as an entry of `format` at `entry` (16-bit kinds round as LibTorch does).
void WriteEntry(const float* x, const EntryFormat& format, uint8_t* entry) {
  const int64_t hs = format.head_size;
  if (paged::IsQuantised(format.kind)) {
    paged::QuantizeEntry(x, format, entry);
    return;
  }
  const at::Tensor row = at::from_blob(const_cast<float*>(x), {hs}).to(DtypeOf(format.kind));
  std::memcpy(entry, row.data_ptr(), paged::EntryBytes(format));
}

Fixture Build(const Case& c, const EntryFormat& format, uint32_t seed) {
  Fixture f;
  std::mt19937 random(seed);
  at::manual_seed(seed);
  const int64_t rows = static_cast<int64_t>(c.requests.size()), bs = c.entries_per_block;
  int64_t max_length = 0, total_blocks = 0, table_size = 1;
  for (const Request& r : c.requests) {
    max_length = std::max(max_length, r.length);
    total_blocks += (r.length + bs - 1) / bs;
    table_size = std::max(table_size, (r.length + bs - 1) / bs + 1);  // one spare slot: unused
  }
  const int64_t num_blocks = total_blocks + 3;  // blocks no request uses
  const int64_t entry_bytes = paged::EntryBytes(format);
  const paged::PoolShape pool{num_blocks, c.groups, bs, entry_bytes};
  at::Tensor key_bytes = at::randint(0, 256, {num_blocks, c.groups, bs, entry_bytes}, at::kByte);
  at::Tensor value_bytes = at::randint(0, 256, {num_blocks, c.groups, bs, entry_bytes}, at::kByte);
  if (!paged::IsQuantised(format.kind)) {  // finite garbage where no request writes
    key_bytes.zero_();
    value_bytes.zero_();
  }
  at::Tensor slot_positions = at::full({num_blocks, c.groups, bs}, -1, at::kInt);
  std::vector<int32_t> order(num_blocks);
  for (int64_t i = 0; i < num_blocks; ++i) order[i] = static_cast<int32_t>(i);
  std::shuffle(order.begin(), order.end(), random);
  at::Tensor tables = at::full({rows, table_size}, -1, at::kInt);
  at::Tensor lengths = at::empty({rows}, at::kInt), query = at::empty({rows}, at::kInt);
  f.q = at::randn({rows, c.heads, format.head_size});
  int64_t next_block = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t length = c.requests[r].length;
    const at::Tensor k = at::randn({length, c.groups, format.head_size}).contiguous();
    const at::Tensor v = at::randn({length, c.groups, format.head_size}).contiguous();
    at::Tensor k_ref = at::empty({1, c.groups, length, format.head_size});
    at::Tensor v_ref = at::empty_like(k_ref);
    at::Tensor positions = at::empty({1, c.groups, length}, at::kLong);
    auto k_at = k_ref.accessor<float, 4>();
    auto v_at = v_ref.accessor<float, 4>();
    auto positions_at = positions.accessor<int64_t, 3>();
    auto tables_at = tables.accessor<int32_t, 2>();
    for (int64_t e = 0; e < length; ++e) {
      if (e % bs == 0) tables_at[r][e / bs] = order[next_block++];
      const int64_t block = tables_at[r][e / bs];
      for (int64_t g = 0; g < c.groups; ++g) {
        const int64_t index = paged::EntryIndex(pool, block, g, e % bs);
        auto* key_entry = key_bytes.data_ptr<uint8_t>() + index * entry_bytes;
        auto* value_entry = value_bytes.data_ptr<uint8_t>() + index * entry_bytes;
        WriteEntry(k[e][g].data_ptr<float>(), format, key_entry);
        WriteEntry(v[e][g].data_ptr<float>(), format, value_entry);
        for (int64_t d = 0; d < format.head_size; ++d) {
          k_at[0][g][e][d] = paged::EntryElement(key_entry, format, d);
          v_at[0][g][e][d] = paged::EntryElement(value_entry, format, d);
        }
        // Permuted positions with holes: a cache that evicts.
        int64_t position = e;
        if (c.slot_positions) position = (e * 7 + g) % 5 == 0 ? -1 : (e * 5 + 3 * g) % length;
        positions_at[0][g][e] = position;
        slot_positions.data_ptr<int32_t>()[index] = static_cast<int32_t>(position);
      }
    }
    lengths[r] = static_cast<int32_t>(length);
    const int64_t qp = c.requests[r].query_position < 0 ? length - 1 : c.requests[r].query_position;
    query[r] = static_cast<int32_t>(qp);
    f.keys.push_back(k_ref);
    f.values.push_back(v_ref);
    f.key_positions.push_back(positions);
    f.query_positions.push_back(qp);
  }
  if (paged::IsQuantised(format.kind)) {
    f.layer.keys = key_bytes;
    f.layer.values = value_bytes;
    f.layer.bits = format.kind == EntryKind::kInt8 ? 8 : 4;
    f.layer.group_size = format.group_size;
  } else {
    // The same bytes seen as the entries' dtype.
    const at::ScalarType dtype = DtypeOf(format.kind);
    const int64_t item = at::elementSize(dtype);
    f.layer.keys = key_bytes.view(dtype).view({num_blocks, c.groups, bs, entry_bytes / item});
    f.layer.values = value_bytes.view(dtype).view({num_blocks, c.groups, bs, entry_bytes / item});
  }
  if (c.slot_positions) f.layer.slot_positions = slot_positions;
  f.batch = {tables, lengths, query, max_length};
  return f;
}

// The reference for request r: AttendByPositions over its dequantised entries, or zeros where
// it sees no key.
at::Tensor Reference(const Fixture& f, const Case& c, int64_t r) {
  const at::Tensor q = f.q[r].unsqueeze(0).unsqueeze(2);  // [1, heads, 1, hs]
  bool any = false;
  const at::Tensor& kp = f.key_positions[r];
  for (int64_t g = 0; g < c.groups; ++g) {
    for (int64_t e = 0; e < kp.size(2); ++e) {
      any = any ||
            KeyAllowed(f.query_positions[r], kp[0][g][e].item<int64_t>(), c.params.sliding_window);
    }
  }
  if (!any) return at::zeros({c.heads, q.size(3)});
  const at::Tensor qp = at::full({1, 1}, f.query_positions[r], at::kLong);
  return AttendByPositions(q, f.keys[r], f.values[r], qp, kp, c.params).squeeze(2).squeeze(0);
}

std::vector<Case> Cases() {
  AttentionParams plain;
  plain.scale = 0.125;
  AttentionParams capped = plain;
  capped.softcap = 5.0;
  AttentionParams windowed = plain;
  windowed.sliding_window = 19;
  return {
      {"gqa", 8, 2, 64, 16, {{37, -1}, {1, -1}, {16, -1}, {0, -1}, {100, -1}}, plain},
      {"mqa_softcap", 6, 1, 32, 8, {{29, -1}, {3, -1}}, capped},
      {"mha_odd_head_size", 3, 3, 24, 5, {{11, -1}, {23, -1}}, plain},
      {"window_and_early_query", 4, 2, 32, 4, {{50, -1}, {40, 12}}, windowed},
      {"many_splits", 4, 2, 64, 16, {{300, -1}, {33, -1}, {64, -1}}, plain, 32},
      {"slot_positions", 4, 2, 32, 8, {{45, -1}, {9, 4}}, plain, 32, true},
  };
}

std::vector<EntryFormat> Formats(int64_t head_size) {
  const int32_t hs = static_cast<int32_t>(head_size);
  return {{EntryKind::kFloat32, hs, 32},
          {EntryKind::kBFloat16, hs, 32},
          {EntryKind::kFloat16, hs, 32},
          {EntryKind::kInt8, hs, hs % 32 == 0 ? 32 : 8},
          {EntryKind::kInt4, hs, hs % 32 == 0 ? 32 : 8}};
}

std::string KindName(EntryKind kind) {
  const char* names[] = {"float32", "bfloat16", "float16", "int8", "int4"};
  return names[static_cast<int>(kind)];
}

// Calls check(case, fixture, options) for every case and entry format (seeds from `seed` on).
void ForEveryCase(
    uint32_t seed,
    const std::function<void(const Case&, const Fixture&, const PagedDecodeOptions&)>& check) {
  for (const Case& c : Cases()) {
    for (const EntryFormat& format : Formats(c.head_size)) {
      SCOPED_TRACE(c.name + " " + KindName(format.kind));
      PagedDecodeOptions options;
      options.entries_per_split = c.entries_per_split;
      check(c, Build(c, format, seed++), options);
    }
  }
}

TEST(PagedDecodeAttention, CpuTwinEqualsAttendByPositions) {
  ForEveryCase(1, [](const Case& c, const Fixture& f, const PagedDecodeOptions& options) {
    const absl::StatusOr<at::Tensor> y =
        PagedDecodeAttention(f.q, f.layer, f.batch, c.params, options);
    ASSERT_TRUE(y.ok()) << y.status();
    ASSERT_EQ(y->sizes(), f.q.sizes());
    for (int64_t r = 0; r < f.q.size(0); ++r) {
      const at::Tensor expected = Reference(f, c, r);
      EXPECT_LT((y.value()[r] - expected).abs().max().item<float>(), 2e-5f) << "request " << r;
    }
  });
}

// Query dtypes: the output comes back in q's dtype, computed from its float32 value.
TEST(PagedDecodeAttention, SixteenBitQueriesComputeInFloat32) {
  const Case c = Cases()[0];
  const Fixture f = Build(c, {EntryKind::kBFloat16, 64, 32}, 9);
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    const at::Tensor q = f.q.to(dtype);
    const absl::StatusOr<at::Tensor> y = PagedDecodeAttention(q, f.layer, f.batch, c.params);
    const absl::StatusOr<at::Tensor> y32 =
        PagedDecodeAttention(q.to(at::kFloat), f.layer, f.batch, c.params);
    ASSERT_TRUE(y.ok() && y32.ok());
    EXPECT_EQ(y->scalar_type(), dtype);
    EXPECT_TRUE(at::equal(*y, y32->to(dtype)));
  }
}

// The split size changes only float32 rounding.
TEST(PagedDecodeAttention, SplitSizeDoesNotChangeTheResult) {
  Case c = Cases()[4];
  const Fixture f = Build(c, {EntryKind::kInt8, 64, 32}, 12);
  std::vector<at::Tensor> outputs;
  for (int64_t split : {32, 64, 96, 512}) {
    PagedDecodeOptions options;
    options.entries_per_split = split;
    const absl::StatusOr<at::Tensor> y =
        PagedDecodeAttention(f.q, f.layer, f.batch, c.params, options);
    ASSERT_TRUE(y.ok());
    outputs.push_back(*y);
  }
  for (const at::Tensor& y : outputs) EXPECT_TRUE(at::allclose(y, outputs[0], 1e-5, 1e-6));
}

TEST(PagedDecodeAttention, EntriesPerSplitFitSharedMemory) {
  EXPECT_EQ(PagedEntriesPerSplit({256}, 8, 128), 256);
  EXPECT_EQ(PagedEntriesPerSplit({100}, 1, 64), 96);
  EXPECT_EQ(PagedEntriesPerSplit({1}, 1, 64), 32);
  const int64_t mqa = PagedEntriesPerSplit({256}, 71, 64);  // Falcon-7B: 71 heads, one group
  EXPECT_LE(paged::SplitSharedBytes(71, 64, mqa), 48 * 1024);
  EXPECT_GE(mqa, 32);
}

// The fixture's requests as host rows: each its own blocks only (tables of different widths).
std::vector<PagedDecodeRow> RowsOf(const Fixture& f) {
  const int64_t block_entries = f.layer.keys.size(2);
  std::vector<PagedDecodeRow> rows;
  for (int64_t r = 0; r < f.batch.block_tables.size(0); ++r) {
    PagedDecodeRow row;
    row.length = f.batch.lengths[r].item<int64_t>();
    row.query_position = f.batch.query_positions[r].item<int64_t>();
    for (int64_t b = 0; b * block_entries < row.length; ++b) {
      row.blocks.push_back(f.batch.block_tables[r][b].item<int32_t>());
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

// Host rows (the serving engine's batched step) attend as the batch they describe, to the bit:
// the padding of shorter tables is never read.
TEST(PagedDecodeRows, EqualTheBatchTheyDescribe) {
  ForEveryCase(200, [](const Case& c, const Fixture& f, const PagedDecodeOptions& options) {
    const absl::StatusOr<at::Tensor> batched =
        PagedDecodeAttention(f.q, f.layer, f.batch, c.params, options);
    const absl::StatusOr<at::Tensor> rows =
        PagedDecodeRows(f.q, f.layer, RowsOf(f), c.params, options);
    ASSERT_TRUE(batched.ok() && rows.ok()) << batched.status() << " " << rows.status();
    EXPECT_TRUE(at::equal(*rows, *batched));
  });
}

TEST(PagedDecodeRows, ErrorsNameTheRow) {
  const Case c = Cases()[0];
  const Fixture f = Build(c, {EntryKind::kFloat32, 64, 32}, 33);
  EXPECT_EQ(PagedDecodeRows(f.q, f.layer, {}, c.params).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<PagedDecodeRow> rows = RowsOf(f);
  ASSERT_GE(rows.size(), 2u);
  rows[1].length = static_cast<int64_t>(rows[1].blocks.size()) * f.layer.keys.size(2) + 1;
  const absl::Status status = PagedDecodeRows(f.q, f.layer, rows, c.params).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("rows[1]"), std::string::npos) << status;
}

// ---- CUDA kernel against its twin ----

// The fixture's pool and batch on `device`.
std::pair<PagedKVLayer, PagedDecodeBatch> OnDevice(const Fixture& f, const c10::Device& device) {
  PagedKVLayer layer = f.layer;
  layer.keys = layer.keys.to(device);
  layer.values = layer.values.to(device);
  if (layer.slot_positions.defined()) layer.slot_positions = layer.slot_positions.to(device);
  PagedDecodeBatch batch = f.batch;
  batch.block_tables = batch.block_tables.to(device);
  batch.lengths = batch.lengths.to(device);
  batch.query_positions = batch.query_positions.to(device);
  return {layer, batch};
}

TEST(PagedDecodeAttention, CudaMatchesTheCpuTwin) {
  if (!PagedAttentionHasCudaKernel()) GTEST_SKIP() << "skipped: built against a CPU-only LibTorch";
  if (!CudaAvailable()) GTEST_SKIP() << "skipped: no CUDA device";
  const c10::Device cuda(c10::kCUDA, 0);
  ForEveryCase(100, [&](const Case& c, const Fixture& f, const PagedDecodeOptions& options) {
    const absl::StatusOr<at::Tensor> cpu =
        PagedDecodeAttention(f.q, f.layer, f.batch, c.params, options);
    const auto [layer, batch] = OnDevice(f, cuda);
    const absl::StatusOr<at::Tensor> gpu =
        PagedDecodeAttention(f.q.to(cuda), layer, batch, c.params, options);
    ASSERT_TRUE(cpu.ok() && gpu.ok()) << cpu.status() << " " << gpu.status();
    EXPECT_LT((gpu->cpu() - *cpu).abs().max().item<float>(), 1e-5f);
  });
}

// A CUDA request longer than max_length reads NaN (the contract broken, visibly).
TEST(PagedDecodeAttention, CudaOverlongRequestsReadNaN) {
  if (!PagedAttentionHasCudaKernel()) GTEST_SKIP() << "skipped: built against a CPU-only LibTorch";
  if (!CudaAvailable()) GTEST_SKIP() << "skipped: no CUDA device";
  const c10::Device cuda(c10::kCUDA, 0);
  const Case c = Cases()[0];
  const Fixture f = Build(c, {EntryKind::kFloat32, 64, 32}, 21);
  auto [layer, batch] = OnDevice(f, cuda);
  batch.max_length = 16;
  const absl::StatusOr<at::Tensor> y = PagedDecodeAttention(f.q.to(cuda), layer, batch, c.params);
  ASSERT_TRUE(y.ok());
  const at::Tensor out = y->cpu();
  EXPECT_TRUE(at::isnan(out[0]).all().item<bool>());   // 37 entries
  EXPECT_FALSE(at::isnan(out[1]).any().item<bool>());  // 1 entry
}

// ---- Errors name the argument at fault ----

TEST(PagedDecodeAttention, ErrorsNameTheArgument) {
  const Case c = Cases()[0];
  const Fixture f = Build(c, {EntryKind::kFloat32, 64, 32}, 31);
  const auto message = [&](const at::Tensor& q, const PagedKVLayer& layer,
                           const PagedDecodeBatch& batch) {
    const absl::Status status = PagedDecodeAttention(q, layer, batch, c.params).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    return std::string(status.message());
  };
  const auto has = [](const std::string& text, const char* what) {
    return text.find(what) != std::string::npos;
  };
  EXPECT_TRUE(has(message(f.q.view({-1}), f.layer, f.batch), "q"));
  EXPECT_TRUE(has(message(f.q.narrow(1, 0, 7), f.layer, f.batch), "multiple"));
  EXPECT_TRUE(has(message(at::zeros({5, 8, 300}), f.layer, f.batch), "head_size"));
  PagedKVLayer layer = f.layer;
  layer.values = f.layer.values.to(at::kHalf);
  EXPECT_TRUE(has(message(f.q, layer, f.batch), "layer.values"));
  layer = f.layer;
  layer.bits = 8;
  EXPECT_TRUE(has(message(f.q, layer, f.batch), "layer.keys"));
  layer.bits = 5;
  EXPECT_TRUE(has(message(f.q, layer, f.batch), "layer.bits"));
  layer = f.layer;
  layer.slot_positions = at::zeros({2}, at::kInt);
  EXPECT_TRUE(has(message(f.q, layer, f.batch), "layer.slot_positions"));
  PagedDecodeBatch batch = f.batch;
  batch.lengths = f.batch.lengths.to(at::kLong);
  EXPECT_TRUE(has(message(f.q, f.layer, batch), "batch.lengths"));
  batch = f.batch;
  batch.max_length = 50;  // request 4 holds 100
  EXPECT_TRUE(has(message(f.q, f.layer, batch), "batch.lengths"));
  batch = f.batch;
  batch.block_tables = f.batch.block_tables.clone();
  batch.block_tables[0][1] = 1000;
  EXPECT_TRUE(has(message(f.q, f.layer, batch), "batch.block_tables"));
  batch.block_tables = f.batch.block_tables.narrow(0, 0, 2);
  EXPECT_TRUE(has(message(f.q, f.layer, batch), "batch.block_tables"));
  batch = f.batch;
  batch.query_positions = at::Tensor();
  EXPECT_TRUE(has(message(f.q, f.layer, batch), "batch.query_positions"));

  const Fixture q8 = Build(c, {EntryKind::kInt4, 64, 32}, 32);
  layer = q8.layer;
  layer.group_size = 24;
  EXPECT_TRUE(has(message(q8.q, layer, q8.batch), "layer.group_size"));
}

}  // namespace
}  // namespace lgpt
