#include "core/ops/kv_slot_write.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/base/device.h"
#include "core/ops/kv_slot_layout.h"

namespace lgpt {
namespace {

// Reference: entry t of every group copied with tensor ops into pool[block, :, offset, :].
void ReferenceWrite(const at::Tensor& src, const std::vector<int64_t>& slots, at::Tensor& pool) {
  const int64_t entries_per_block = pool.size(2), capacity = pool.size(0) * entries_per_block;
  for (int64_t t = 0; t < static_cast<int64_t>(slots.size()); ++t) {
    if (slots[t] < 0 || slots[t] >= capacity) continue;
    pool.select(0, slots[t] / entries_per_block).select(1, slots[t] % entries_per_block).copy_(src.select(1, t));
  }
}

struct Case {
  int64_t groups, tokens, head_size, num_blocks, entries_per_block;
};

class KVSlotWriteTest : public ::testing::TestWithParam<at::ScalarType> {};

// Keys [G, T, hs] taken as a transposed view of [T, G, hs] (strides as a projection leaves
// them), random distinct slots with padding, against the reference, for several shapes.
TEST_P(KVSlotWriteTest, CpuMatchesReference) {
  const at::ScalarType dtype = GetParam();
  at::manual_seed(7);
  for (const Case& c : {Case{1, 1, 8, 1, 1}, Case{2, 5, 16, 3, 4}, Case{4, 33, 64, 16, 16},
                        Case{8, 7, 128, 4, 2}}) {
    const auto options = at::TensorOptions().dtype(dtype);
    const at::Tensor keys = at::randn({c.tokens, c.groups, c.head_size}, options).transpose(0, 1);
    const at::Tensor values = at::randn({c.tokens, c.groups, c.head_size}, options).transpose(0, 1);
    const at::Tensor permutation = at::randperm(c.num_blocks * c.entries_per_block);
    std::vector<int64_t> slots(c.tokens);
    for (int64_t t = 0; t < c.tokens; ++t) {
      slots[t] = t < permutation.size(0) ? permutation[t].item<int64_t>() : -1;
    }
    if (c.tokens > 2) slots[1] = -1;  // padding is skipped
    const at::Tensor slot_tensor = at::tensor(slots, at::kLong);
    at::Tensor key_pool = at::zeros({c.num_blocks, c.groups, c.entries_per_block, c.head_size}, options);
    at::Tensor value_pool = at::zeros_like(key_pool);
    at::Tensor expected_keys = key_pool.clone(), expected_values = value_pool.clone();
    ReferenceWrite(keys, slots, expected_keys);
    ReferenceWrite(values, slots, expected_values);

    ASSERT_TRUE(WriteKVSlots(keys, values, slot_tensor, key_pool, value_pool).ok());
    EXPECT_TRUE(at::equal(key_pool, expected_keys)) << c.groups << "x" << c.tokens;
    EXPECT_TRUE(at::equal(value_pool, expected_values)) << c.groups << "x" << c.tokens;
  }
}

// The CUDA kernel equals its CPU twin bit for bit (a copy: nothing may round).
TEST_P(KVSlotWriteTest, CudaMatchesCpu) {
  if (!KVSlotWriteHasCudaKernel()) GTEST_SKIP() << "skipped: built against a CPU-only LibTorch";
  if (!CudaAvailable()) GTEST_SKIP() << "skipped: no CUDA device";
  const at::ScalarType dtype = GetParam();
  at::manual_seed(11);
  const auto options = at::TensorOptions().dtype(dtype);
  const Case c{8, 300, 128, 64, 16};
  const at::Tensor keys = at::randn({c.tokens, c.groups, c.head_size}, options).transpose(0, 1);
  const at::Tensor values = at::randn({c.tokens, c.groups, c.head_size}, options).transpose(0, 1);
  at::Tensor slots = at::randperm(c.num_blocks * c.entries_per_block).narrow(0, 0, c.tokens).clone();
  slots[3] = -1;
  at::Tensor key_pool = at::randn({c.num_blocks, c.groups, c.entries_per_block, c.head_size}, options);
  at::Tensor value_pool = at::randn_like(key_pool);
  const c10::Device cuda(c10::kCUDA, 0);
  at::Tensor cuda_keys_pool = key_pool.to(cuda), cuda_values_pool = value_pool.to(cuda);

  ASSERT_TRUE(WriteKVSlots(keys, values, slots, key_pool, value_pool).ok());
  ASSERT_TRUE(
      WriteKVSlots(keys.to(cuda), values.to(cuda), slots.to(cuda), cuda_keys_pool, cuda_values_pool)
          .ok());
  EXPECT_TRUE(at::equal(cuda_keys_pool.cpu(), key_pool));
  EXPECT_TRUE(at::equal(cuda_values_pool.cpu(), value_pool));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, KVSlotWriteTest,
                         ::testing::Values(at::kFloat, at::kBFloat16, at::kHalf));

TEST(KVSlotWriteErrors, NameTheArgumentAtFault) {
  const at::Tensor keys = at::zeros({2, 3, 8});
  const at::Tensor slots = at::arange(3, at::kLong);
  const at::Tensor pool = at::zeros({4, 2, 4, 8});
  EXPECT_TRUE(WriteKVSlots(keys, keys, slots, pool, pool).ok());
  const auto message = [&](const at::Tensor& k, const at::Tensor& s, const at::Tensor& p) {
    const absl::Status status = WriteKVSlots(k, k, s, p, pool);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    return std::string(status.message());
  };
  EXPECT_NE(message(at::zeros({2, 3}), slots, pool).find("keys"), std::string::npos);
  EXPECT_NE(message(keys.to(at::kDouble), slots, pool.to(at::kDouble)).find("float32"),
            std::string::npos);
  EXPECT_NE(message(keys, at::arange(2, at::kLong), pool).find("slots"), std::string::npos);
  EXPECT_NE(message(keys, slots.to(at::kInt), pool).find("slots"), std::string::npos);
  EXPECT_NE(message(keys, slots, at::zeros({4, 3, 4, 8})).find("key_pool"), std::string::npos);
  EXPECT_NE(message(keys, slots, pool.to(at::kHalf)).find("key_pool"), std::string::npos);
  EXPECT_NE(message(keys, slots, at::zeros({4, 2, 8, 4}).transpose(2, 3)).find("contiguous"),
            std::string::npos);
}

// The shared index math against a contiguous pool tensor's own strides.
TEST(KVSlotLayout, OffsetsFollowTheTensorLayout) {
  const kv_slot::PoolShape pool{5, 3, 4, 6};
  const at::Tensor t = at::empty({5, 3, 4, 6});
  for (int64_t slot = 0; slot < 20; ++slot) {
    for (int64_t g = 0; g < 3; ++g) {
      for (int64_t d = 0; d < 6; d += 5) {
        const int64_t expected =
            (slot / 4) * t.stride(0) + g * t.stride(1) + (slot % 4) * t.stride(2) + d;
        EXPECT_EQ(kv_slot::PoolOffset(pool, slot, g, d), expected);
      }
    }
  }
  const int64_t table[] = {7, 2, 9};
  EXPECT_EQ(kv_slot::SlotOfPosition(table, 4, 0), 28);
  EXPECT_EQ(kv_slot::SlotOfPosition(table, 4, 5), 9);
  EXPECT_EQ(kv_slot::SlotOfPosition(table, 4, 11), 39);
  EXPECT_TRUE(kv_slot::SlotInPool(pool, 19));
  EXPECT_FALSE(kv_slot::SlotInPool(pool, 20));
  EXPECT_FALSE(kv_slot::SlotInPool(pool, -1));
}

}  // namespace
}  // namespace lgpt
