#include "core/base/device.h"

#include <torch/torch.h>

#include <vector>

#include "gtest/gtest.h"

namespace lgpt {
namespace {

TEST(DeviceTest, ParsesCpu) {
  auto device = ParseDevice("cpu");
  ASSERT_TRUE(device.ok());
  EXPECT_TRUE(device->is_cpu());
}

TEST(DeviceTest, RejectsUnknownNames) {
  EXPECT_EQ(ParseDevice("tpu").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseDevice("cuda:x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DeviceTest, CudaMatchesAvailability) {
  auto device = ParseDevice("cuda");
  EXPECT_EQ(device.ok(), CudaAvailable());
}

TEST(DeviceTest, DefaultDeviceRunsArithmetic) {
  torch::Tensor a = torch::ones({2, 3}, torch::TensorOptions().device(DefaultDevice()));
  EXPECT_EQ(a.sum().item<float>(), 6.0f);
}

TEST(DeviceTest, GpuOnlyKernelRuns) {
  if (!CudaAvailable()) GTEST_SKIP() << "no CUDA GPU: GPU-only test skipped";
  torch::Tensor a = torch::ones({4}, torch::TensorOptions().device(torch::kCUDA));
  EXPECT_EQ(a.sum().item<float>(), 4.0f);
}

// Host data queued to a device arrives whole and unchanged, many times in a row (each copy's
// pinned block is reused only after its copy has read it); on the CPU it is the tensor itself.
TEST(DeviceTest, ToDeviceQueuedDeliversTheHostData) {
  const torch::Tensor host = torch::arange(1000, torch::kLong);
  EXPECT_TRUE(ToDeviceQueued(host, c10::Device(c10::kCPU)).is_same(host));
  if (!CudaAvailable()) GTEST_SKIP() << "skipped (the CUDA copies): no CUDA device";
  const c10::Device cuda(c10::kCUDA, 0);
  std::vector<torch::Tensor> copies;
  for (int64_t i = 0; i < 64; ++i) copies.push_back(ToDeviceQueued(host + i, cuda));
  for (int64_t i = 0; i < 64; ++i) {
    ASSERT_EQ(copies[i].device(), cuda);
    EXPECT_TRUE(torch::equal(copies[i].cpu(), host + i)) << i;
  }
}

}  // namespace
}  // namespace lgpt
