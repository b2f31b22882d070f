#include "core/base/device.h"

#include <torch/torch.h>

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

}  // namespace
}  // namespace lgpt
