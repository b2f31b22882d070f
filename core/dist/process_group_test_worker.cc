// One rank of process_group_test: `worker MODE`, with RANK, WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT from the launcher. Exits 0 when its checks pass; prints why not on stderr.
//   collectives       all-reduce, broadcast, all-gather and barrier give the expected values
//   collectives_nccl  the same over NCCL on GPU LOCAL_RANK, and CPU tensors beside them
//   peer_dies    the last rank exits 3 after the rendezvous; the others all-reduce and must
//                report the failure (exit 2 with the error) within the timeout
#include <ATen/ATen.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/dist/process_group.h"

namespace {

int Fail(const std::string& why) {
  std::cerr << why << std::endl;
  return 1;
}

// All-reduce, broadcast and all-gather of tensors on `device`: "" when every value is right.
std::string CheckCollectives(lgpt::ProcessGroup& pg, const c10::Device& device) {
  const int rank = pg.rank(), world = pg.world_size();
  const at::TensorOptions on = at::TensorOptions().device(device);
  // all-reduce: rank r holds (r + 1) · [1, 2, 3]; the sum is w(w+1)/2 · [1, 2, 3].
  at::Tensor t = at::arange(1, 4, on.dtype(at::kFloat)) * (rank + 1);
  if (absl::Status s = pg.AllReduceSum(t); !s.ok()) return std::string(s.message());
  const double factor = world * (world + 1) / 2.0;
  if (t.device() != device || !at::equal(t.cpu(), at::arange(1, 4, at::kFloat) * factor)) {
    return "all-reduce: wrong sum";
  }
  // broadcast from the last rank.
  at::Tensor b = at::full({2, 2}, static_cast<double>(rank), on.dtype(at::kDouble));
  if (absl::Status s = pg.Broadcast(b, world - 1); !s.ok()) return std::string(s.message());
  if (!at::equal(b.cpu(), at::full({2, 2}, static_cast<double>(world - 1), at::kDouble))) {
    return "broadcast: wrong values";
  }
  // all-gather: rank r contributes [[r, r]].
  absl::StatusOr<at::Tensor> g = pg.AllGather(at::full({1, 2}, rank, on.dtype(at::kLong)));
  if (!g.ok()) return std::string(g.status().message());
  if (!at::equal(g->cpu(), at::arange(world, at::kLong).unsqueeze(1).expand({world, 2}))) {
    return "all-gather: wrong values";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return Fail("usage: worker MODE");
  const std::string mode = argv[1];
  absl::StatusOr<lgpt::DistOptions> options = lgpt::DistOptionsFromEnv(absl::Seconds(10));
  if (!options.ok()) return Fail(std::string(options.status().message()));
  if (mode == "collectives_nccl") options->backend = lgpt::DistBackend::kNccl;
  absl::StatusOr<std::shared_ptr<lgpt::ProcessGroup>> group = lgpt::ProcessGroup::Create(*options);
  if (!group.ok()) return Fail(std::string(group.status().message()));
  lgpt::ProcessGroup& pg = **group;
  const int rank = pg.rank(), world = pg.world_size();

  if (mode == "collectives" || mode == "collectives_nccl") {
    std::vector<c10::Device> devices = {c10::Device(c10::kCPU)};
    if (mode == "collectives_nccl") {
      int local_rank = 0;
      const char* value = std::getenv("LOCAL_RANK");
      if (value == nullptr || !absl::SimpleAtoi(value, &local_rank)) return Fail("no LOCAL_RANK");
      // The GPU's tensors over NCCL, then CPU tensors (over Gloo) beside them.
      devices.insert(devices.begin(), c10::Device(c10::kCUDA, local_rank));
    }
    for (const c10::Device& device : devices) {
      const std::string error = CheckCollectives(pg, device);
      if (!error.empty()) return Fail(absl::StrCat(device.str(), ": ", error));
    }
    if (absl::Status s = pg.Barrier(); !s.ok()) return Fail(std::string(s.message()));
    std::cout << "collectives ok on rank " << rank << " of " << world << std::endl;
    return 0;
  }
  if (mode == "peer_dies") {
    if (rank == world - 1) _exit(3);
    at::Tensor t = at::ones({1024});
    for (int i = 0; i < 100; ++i) {
      absl::Status s = pg.AllReduceSum(t);
      if (!s.ok()) {
        std::cerr << "error: " << s << std::endl;
        return 2;
      }
    }
    return Fail("all-reduce with a dead peer succeeded");
  }
  return Fail("unknown mode " + mode);
}
