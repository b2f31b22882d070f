#include "core/base/device_memory.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/base/device.h"
#include "core/base/system_memory.h"

namespace lgpt {
namespace {

TEST(DeviceMemoryTest, TheCpuGivesWhatTheKernelCallsAvailable) {
  const absl::StatusOr<int64_t> free = FreeDeviceMemoryBytes(c10::Device(c10::kCPU));
  ASSERT_TRUE(free.ok()) << free.status();
  EXPECT_GT(*free, 0);
  const std::optional<int64_t> available = AvailableMemoryBytes();
  ASSERT_TRUE(available.has_value());
  // Both read MemAvailable; other processes move it between the two reads.
  EXPECT_LT(std::llabs(*free - *available), int64_t{1} << 30);
}

TEST(DeviceMemoryTest, OtherDevicesAreRefused) {
  const absl::StatusOr<int64_t> free = FreeDeviceMemoryBytes(c10::Device(c10::kMeta));
  ASSERT_FALSE(free.ok());
  EXPECT_EQ(free.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DeviceMemoryTest, AbsentGpusAreRefused) {
  const absl::StatusOr<int64_t> free = FreeDeviceMemoryBytes(c10::Device(c10::kCUDA, 99));
  ASSERT_FALSE(free.ok());
  EXPECT_EQ(free.status().code(), absl::StatusCode::kFailedPrecondition) << free.status();
}

// On a GPU: a tensor takes its bytes from the free memory, and gives them back when freed,
// though LibTorch's caching allocator keeps them reserved (they count as free: it reuses them).
TEST(DeviceMemoryTest, AGpusFreeMemoryFollowsItsTensors) {
  if (!CudaAvailable()) GTEST_SKIP() << "skipped: no CUDA device";
  const c10::Device gpu(c10::kCUDA, 0);
  constexpr int64_t kBytes = int64_t{256} << 20;
  constexpr int64_t kSlack = int64_t{32} << 20;  // the allocator's rounding, the driver's own
  const absl::StatusOr<int64_t> before = FreeDeviceMemoryBytes(gpu);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_GT(*before, kBytes);
  {
    const at::Tensor held = at::empty({kBytes}, at::TensorOptions().dtype(at::kByte).device(gpu));
    const absl::StatusOr<int64_t> during = FreeDeviceMemoryBytes(gpu);
    ASSERT_TRUE(during.ok()) << during.status();
    EXPECT_NEAR(static_cast<double>(*before - *during), static_cast<double>(kBytes), kSlack);
  }
  const absl::StatusOr<int64_t> after = FreeDeviceMemoryBytes(gpu);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_NEAR(static_cast<double>(*after), static_cast<double>(*before), kSlack);
}

}  // namespace
}  // namespace lgpt
