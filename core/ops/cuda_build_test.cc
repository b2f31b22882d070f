// Checks that a build is what its toolchain says: under --config=cuda (LGPT_BUILD_FLAVOR=cuda
// in the test environment) libtorch_cuda is linked and loaded, ATen's CUDA kernels are
// registered and lgpt's own CUDA kernels are compiled in; a build can never pass as CUDA while
// it silently linked a CPU-only LibTorch. On a machine with a GPU, a tensor computed there
// equals the CPU's.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <link.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/base/device.h"
#include "core/ops/kv_slot_write.h"

namespace lgpt {
namespace {

bool ExpectCuda() {
  const char* flavor = std::getenv("LGPT_BUILD_FLAVOR");
  return flavor != nullptr && std::string(flavor) == "cuda";
}

// Whether a shared object whose file name contains `name` is loaded in this process.
bool LibraryLoaded(const char* name) {
  struct Search {
    const char* name;
    bool found;
  } search{name, false};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* s = static_cast<Search*>(data);
        if (info->dlpi_name != nullptr && std::strstr(info->dlpi_name, s->name) != nullptr) {
          s->found = true;
        }
        return 0;
      },
      &search);
  return search.found;
}

bool AtenHasCudaKernels() {
  const auto op = c10::Dispatcher::singleton().findOp(c10::OperatorName("aten::add", "Tensor"));
  return op.has_value() && op->hasKernelForDispatchKey(c10::DispatchKey::CUDA);
}

TEST(CudaBuild, LibTorchCudaLinkedAndRegistered) {
  if (!ExpectCuda()) GTEST_SKIP() << "skipped: not a --config=cuda build";
  EXPECT_TRUE(LibraryLoaded("libtorch_cuda.so")) << "libtorch_cuda.so is not loaded";
  EXPECT_TRUE(AtenHasCudaKernels()) << "aten::add has no CUDA kernel registered";
  EXPECT_TRUE(KVSlotWriteHasCudaKernel()) << "lgpt's CUDA kernels were not compiled in";
}

// Whatever the flavour, the three signs agree: a LibTorch with CUDA and lgpt's kernels go
// together.
TEST(CudaBuild, SignsAgree) {
  const bool loaded = LibraryLoaded("libtorch_cuda.so");
  EXPECT_EQ(loaded, AtenHasCudaKernels());
  EXPECT_EQ(loaded, KVSlotWriteHasCudaKernel());
  if (!ExpectCuda()) {
    EXPECT_FALSE(CudaAvailable() && !loaded);
  }
}

TEST(CudaDevice, MatmulEqualsCpu) {
  if (!CudaAvailable()) GTEST_SKIP() << "skipped: no CUDA device";
  at::manual_seed(3);
  const at::Tensor a = at::randn({64, 96}, at::kDouble), b = at::randn({96, 32}, at::kDouble);
  const at::Tensor on_gpu = at::matmul(a.cuda(), b.cuda()).cpu();
  EXPECT_TRUE(at::allclose(on_gpu, at::matmul(a, b), 1e-10, 1e-10));
}

}  // namespace
}  // namespace lgpt
