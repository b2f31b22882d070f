// AdapterRouting (core/nn/adapter_routing.h): per-row groups by slot, uniform routings, the
// head's row selection, and scopes that nest per thread.
#include "core/nn/adapter_routing.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace lgpt {
namespace {

std::vector<int64_t> Rows(const at::Tensor& rows) {
  const at::Tensor cpu = rows.cpu().contiguous();
  return std::vector<int64_t>(cpu.data_ptr<int64_t>(), cpu.data_ptr<int64_t>() + cpu.numel());
}

TEST(AdapterRouting, DefaultAndUniform) {
  EXPECT_TRUE(AdapterRouting().base_only());
  EXPECT_EQ(AdapterRouting().uniform_slot(), -1);
  const AdapterRouting one = AdapterRouting::Uniform(2);
  EXPECT_FALSE(one.base_only());
  EXPECT_EQ(one.uniform_slot(), 2);
  EXPECT_EQ(one.rows(), -1);
  EXPECT_TRUE(one.groups().empty());
  EXPECT_TRUE(AdapterRouting::Uniform(-1).base_only());
}

TEST(AdapterRouting, PerRowGroupsBySlotAndLeavesTheBaseRowsOut) {
  const AdapterRouting routing = AdapterRouting::PerRow({1, -1, 0, 1, -1, 0, 0}, at::kCPU);
  EXPECT_FALSE(routing.base_only());
  EXPECT_EQ(routing.uniform_slot(), std::nullopt);
  EXPECT_EQ(routing.rows(), 7);
  ASSERT_EQ(routing.groups().size(), 2u);
  EXPECT_EQ(routing.groups()[0].slot, 0);
  EXPECT_EQ(Rows(routing.groups()[0].rows), (std::vector<int64_t>{2, 5, 6}));
  EXPECT_EQ(routing.groups()[1].slot, 1);
  EXPECT_EQ(Rows(routing.groups()[1].rows), (std::vector<int64_t>{0, 3}));
}

TEST(AdapterRouting, OneSlotForEveryRowIsUniform) {
  EXPECT_EQ(AdapterRouting::PerRow({3, 3, 3}, at::kCPU).uniform_slot(), 3);
  EXPECT_TRUE(AdapterRouting::PerRow({-1, -1}, at::kCPU).base_only());
  EXPECT_TRUE(AdapterRouting::PerRow({}, at::kCPU).base_only());
}

TEST(AdapterRouting, SelectKeepsTheChosenRows) {
  const AdapterRouting routing = AdapterRouting::PerRow({0, 0, 1, 1, -1, -1}, at::kCPU);
  const AdapterRouting last = routing.Select(std::vector<int64_t>{1, 3, 5}, at::kCPU);
  EXPECT_EQ(last.slots(), (std::vector<int64_t>{0, 1, -1}));
  ASSERT_EQ(last.groups().size(), 2u);
  EXPECT_EQ(Rows(last.groups()[1].rows), (std::vector<int64_t>{1}));
  EXPECT_EQ(routing.Select(std::vector<int64_t>{2, 3}, at::kCPU).uniform_slot(), 1);
  EXPECT_EQ(AdapterRouting::Uniform(4).Select(std::vector<int64_t>{0}, at::kCPU).uniform_slot(), 4);
}

TEST(AdapterRouting, ScopesNestPerThread) {
  EXPECT_EQ(CurrentAdapterRouting(), nullptr);
  const AdapterRouting outer = AdapterRouting::Uniform(0), inner = AdapterRouting::Uniform(1);
  {
    ScopedAdapterRouting a(&outer);
    EXPECT_EQ(CurrentAdapterRouting(), &outer);
    {
      ScopedAdapterRouting b(&inner);
      EXPECT_EQ(CurrentAdapterRouting(), &inner);
      // Another thread sees none of this thread's routing.
      const AdapterRouting* seen = &outer;
      std::thread([&] { seen = CurrentAdapterRouting(); }).join();
      EXPECT_EQ(seen, nullptr);
    }
    EXPECT_EQ(CurrentAdapterRouting(), &outer);
  }
  EXPECT_EQ(CurrentAdapterRouting(), nullptr);
}

}  // namespace
}  // namespace lgpt
