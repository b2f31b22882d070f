#include "core/base/system_memory.h"

#include <gtest/gtest.h>

#include <fstream>

namespace lgpt {
namespace {

TEST(SystemMemory, ReadsMemAvailableWhereProcHasIt) {
  const std::optional<int64_t> available = AvailableMemoryBytes();
  if (!std::ifstream("/proc/meminfo").good()) {
    EXPECT_FALSE(available.has_value());
    return;
  }
  ASSERT_TRUE(available.has_value());
  // A machine that runs these tests has more than 64 MiB free and less than 64 TiB.
  EXPECT_GT(*available, int64_t{64} << 20);
  EXPECT_LT(*available, int64_t{64} << 40);
}

}  // namespace
}  // namespace lgpt
