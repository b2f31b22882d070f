#include "core/dist/process_group.h"

#include <ATen/ATen.h>
#include <glog/logging.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

// clang-format off
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL  // a CUDA LibTorch (core/dist/BUILD)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
// clang-format on

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/status_field.h"

namespace lgpt {
namespace {

constexpr char kArrivedPrefix[] = "lgpt/arrived/";
constexpr char kReadyKey[] = "lgpt/ready";
constexpr char kReadyOk[] = "ok";
constexpr char kBackendField[] = "DistOptions.backend";

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

absl::StatusOr<int64_t> IntFromEnv(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    return absl::InvalidArgumentError(absl::StrCat("environment variable ", name, " is not set"));
  }
  int64_t parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed)) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, "='", value, "' is not an integer"));
  }
  return parsed;
}

std::string StoreValue(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}
std::vector<uint8_t> StoreBytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

bool IsLoopback(const std::string& addr) {
  return absl::StartsWith(addr, "127.") || addr == "localhost" || addr == "::1";
}

// c10d reports errors by throwing; turn them into a Status naming the operation and, from
// `suspects` (called only on failure), the ranks that are gone.
template <typename F>
absl::Status Collective(const char* what, const char* library, int rank, int world_size,
                        const std::function<std::string()>& suspects, F&& f) {
  std::string error;
  try {
    f();
    return absl::OkStatus();
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    error = e.what();
  }
  std::string who = suspects();
  if (!who.empty()) who += "; ";
  return absl::UnavailableError(absl::StrCat("rank ", rank, ": ", what, " across ", world_size,
                                             " ranks failed (a rank exited or timed out): ", who,
                                             library, ": ", error));
}

#ifdef USE_C10D_NCCL
// Ranks this host runs (LOCAL_WORLD_SIZE, as the launcher and torchrun set it), 1 without it.
int LocalWorldSize() {
  const char* value = std::getenv("LOCAL_WORLD_SIZE");
  int parsed = 0;
  return value != nullptr && absl::SimpleAtoi(value, &parsed) && parsed > 0 ? parsed : 1;
}
#endif

// Why the NCCL backend cannot serve this process, or OK.
absl::Status CheckNccl() {
#ifndef USE_C10D_NCCL
  return FieldError(absl::StatusCode::kFailedPrecondition, kBackendField,
                    "DistOptions.backend is nccl, but this build's LibTorch has no NCCL (build "
                    "with --config=cuda)");
#else
  const int gpus = static_cast<int>(at::getNumGPUs());
  if (gpus == 0) {
    return FieldError(absl::StatusCode::kFailedPrecondition, kBackendField,
                      "DistOptions.backend is nccl, but this process sees no CUDA device");
  }
  // NCCL refuses two ranks of one communicator on the same GPU.
  if (LocalWorldSize() > gpus) {
    return FieldError(absl::StatusCode::kFailedPrecondition, kBackendField,
                      absl::StrCat("DistOptions.backend is nccl, which needs a GPU per local rank: "
                                   "LOCAL_WORLD_SIZE=",
                                   LocalWorldSize(), " ranks on ", gpus, " GPUs"));
  }
  return absl::OkStatus();
#endif
}

}  // namespace

bool NcclAvailable() { return CheckNccl().ok(); }

absl::StatusOr<DistBackend> ParseDistBackend(absl::string_view name, const c10::Device& device,
                                             absl::string_view flag) {
  if (name == "gloo") return DistBackend::kGloo;
  if (name == "nccl") return DistBackend::kNccl;
  if (name == "auto") return device.is_cuda() ? DistBackend::kNccl : DistBackend::kGloo;
  return InvalidFieldError(flag,
                           absl::StrCat(flag, " must be auto, gloo or nccl, got '", name, "'"));
}

absl::Status ValidateDistOptions(const DistOptions& o) {
  if (o.world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("WORLD_SIZE must be >= 1, got ", o.world_size));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("RANK ", o.rank, " is outside [0, WORLD_SIZE=", o.world_size, ")"));
  }
  if (o.world_size > 1) {
    if (o.master_addr.empty()) return absl::InvalidArgumentError("MASTER_ADDR is empty");
    if (o.master_port < 1 || o.master_port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("MASTER_PORT ", o.master_port, " is outside [1, 65535]"));
    }
  }
  if (o.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the distributed timeout must be positive");
  }
  if (o.backend == DistBackend::kNccl && o.world_size > 1) return CheckNccl();
  return absl::OkStatus();
}

absl::StatusOr<DistOptions> DistOptionsFromEnv(absl::Duration timeout) {
  DistOptions options;
  options.timeout = timeout;
  if (std::getenv("RANK") == nullptr && std::getenv("WORLD_SIZE") == nullptr) return options;
  absl::StatusOr<int64_t> rank = IntFromEnv("RANK");
  if (!rank.ok()) return rank.status();
  absl::StatusOr<int64_t> world = IntFromEnv("WORLD_SIZE");
  if (!world.ok()) return world.status();
  options.rank = static_cast<int>(*rank);
  options.world_size = static_cast<int>(*world);
  if (*rank != options.rank || *world != options.world_size) {
    return absl::InvalidArgumentError("RANK or WORLD_SIZE does not fit an int");
  }
  if (options.world_size > 1) {
    const char* addr = std::getenv("MASTER_ADDR");
    if (addr == nullptr || *addr == '\0') {
      return absl::InvalidArgumentError("environment variable MASTER_ADDR is not set");
    }
    options.master_addr = addr;
    absl::StatusOr<int64_t> port = IntFromEnv("MASTER_PORT");
    if (!port.ok()) return port.status();
    if (*port < 1 || *port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("environment variable MASTER_PORT=", *port, " is outside [1, 65535]"));
    }
    options.master_port = static_cast<int>(*port);
  }
  absl::Status valid = ValidateDistOptions(options);
  if (!valid.ok()) return valid;
  return options;
}

struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;  // CPU tensors, and all with kGloo
#ifdef USE_C10D_NCCL
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl;  // CUDA tensors with kNccl
#endif
  std::chrono::milliseconds timeout;
  std::string where;  // MASTER_ADDR:MASTER_PORT
  int failures = 0;

  ~Impl() {
#ifdef USE_C10D_NCCL
    if (nccl) {
      try {
        nccl->shutdown();  // finishes queued work and frees the communicators
      } catch (const std::exception& e) {
        LOG(WARNING) << "NCCL shutdown: " << e.what();
      }
    }
#endif
  }

  // Whether NCCL moves `tensor` (a CUDA tensor of a kNccl group); Gloo otherwise.
  bool OverNccl(const at::Tensor& tensor) const {
#ifdef USE_C10D_NCCL
    return nccl && tensor.is_cuda();
#else
    return false;
#endif
  }
  const char* LibraryFor(const at::Tensor& tensor) const {
    return OverNccl(tensor) ? "nccl" : "gloo";
  }

  // Runs `op` on the backend for `tensor` and waits: for Gloo until it is done (within the
  // timeout); for NCCL until it is queued on the current stream.
  template <typename Op>
  void Run(const at::Tensor& tensor, Op op) {
#ifdef USE_C10D_NCCL
    if (OverNccl(tensor)) {
      op(*nccl)->wait();
      return;
    }
#endif
    op(*gloo)->wait(timeout);
  }

  // After a failed collective: which ranks are gone. Gloo's errors name a peer's address at
  // most, and local ranks share one, so each rank that saw the failure reports in through
  // the store and waits a few seconds for the others: the ranks that never report exited,
  // were killed or hang. Rank 0 serves the store, so an unreachable store means rank 0 is gone.
  std::string Suspects(int rank, int world_size) {
    const std::string prefix = absl::StrCat("lgpt/failed/", ++failures, "/");
    const absl::Duration window = std::min(absl::Milliseconds(timeout.count()), absl::Seconds(5));
    try {
      store->set(absl::StrCat(prefix, rank), StoreBytes("1"));
      const absl::Time deadline = absl::Now() + window;
      std::vector<int> missing;
      for (;;) {
        missing.clear();
        for (int r = 0; r < world_size; ++r) {
          if (r != rank && !store->check({absl::StrCat(prefix, r)})) missing.push_back(r);
        }
        if (missing.empty() || absl::Now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (missing.empty()) return "";  // every rank is alive and saw the failure too
      return absl::StrCat("rank", missing.size() > 1 ? "s " : " ", absl::StrJoin(missing, ", "),
                          " did not report back within ", absl::FormatDuration(window),
                          " (exited, killed or hung)");
    } catch (const std::exception&) {
      return absl::StrCat("rank 0 (it serves the store at ", where,
                          ") is unreachable (exited, killed or hung)");
    }
  }
};

ProcessGroup::ProcessGroup(int rank, int world_size, DistBackend backend,
                           std::unique_ptr<Impl> impl)
    : rank_(rank), world_size_(world_size), backend_(backend), impl_(std::move(impl)) {}

ProcessGroup::~ProcessGroup() = default;

std::shared_ptr<ProcessGroup> ProcessGroup::Single() {
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(0, 1, DistBackend::kGloo, nullptr));
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> ProcessGroup::Create(const DistOptions& options) {
  absl::Status valid = ValidateDistOptions(options);
  if (!valid.ok()) return valid;
  if (options.world_size == 1) return Single();
  // A peer that dies mid-send must surface as an error, not kill this process silently.
  std::signal(SIGPIPE, SIG_IGN);

  const std::string where = absl::StrCat(options.master_addr, ":", options.master_port);
  const std::string seconds = absl::StrCat(absl::ToDoubleSeconds(options.timeout), " s");
  auto impl = std::make_unique<Impl>();
  impl->timeout = ToChrono(options.timeout);
  impl->where = where;
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(options.master_port);
    store_options.isServer = options.rank == 0;
    store_options.numWorkers = c10::nullopt;
    store_options.waitWorkers = false;  // arrivals are checked below, naming who is missing
    store_options.timeout = impl->timeout;
    impl->store = c10::make_intrusive<c10d::TCPStore>(options.master_addr, store_options);
  } catch (const std::exception& e) {
    if (options.rank == 0) {
      return absl::UnavailableError(absl::StrCat("rank 0: cannot serve the store at ", where,
                                                 " (MASTER_ADDR:MASTER_PORT): ", e.what()));
    }
    return absl::DeadlineExceededError(
        absl::StrCat("rank ", options.rank, ": could not reach rank 0's store at ", where,
                     " (MASTER_ADDR:MASTER_PORT) within ", seconds, ": ", e.what()));
  }

  const absl::Time deadline = absl::Now() + options.timeout;
  try {
    c10d::Store& store = *impl->store;
    store.set(absl::StrCat(kArrivedPrefix, options.rank),
              StoreBytes(absl::StrCat(options.world_size)));
    if (options.rank == 0) {
      std::vector<int> missing;
      for (;;) {
        missing.clear();
        for (int r = 1; r < options.world_size; ++r) {
          if (!store.check({absl::StrCat(kArrivedPrefix, r)})) missing.push_back(r);
        }
        if (missing.empty() || absl::Now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      std::string verdict = kReadyOk;
      absl::Status status;
      if (!missing.empty()) {
        status = absl::DeadlineExceededError(
            absl::StrCat("rank 0: rank", missing.size() > 1 ? "s " : " ",
                         absl::StrJoin(missing, ", "), " of WORLD_SIZE=", options.world_size,
                         " never arrived at ", where, " within ", seconds));
      } else {
        for (int r = 1; r < options.world_size && status.ok(); ++r) {
          const std::string theirs = StoreValue(store.get(absl::StrCat(kArrivedPrefix, r)));
          if (theirs != absl::StrCat(options.world_size)) {
            status = absl::FailedPreconditionError(absl::StrCat(
                "rank ", r, " has WORLD_SIZE=", theirs, ", rank 0 has ", options.world_size));
          }
        }
      }
      if (!status.ok()) verdict = std::string(status.message());
      store.set(kReadyKey, StoreBytes(verdict));
      if (!status.ok()) return status;
    } else {
      while (!store.check({kReadyKey})) {
        if (absl::Now() >= deadline) {
          return absl::DeadlineExceededError(
              absl::StrCat("rank ", options.rank, ": rank 0 at ", where,
                           " did not complete the rendezvous within ", seconds));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      const std::string verdict = StoreValue(store.get(kReadyKey));
      if (verdict != kReadyOk) {
        return absl::FailedPreconditionError(
            absl::StrCat("rank ", options.rank, ": rendezvous failed: ", verdict));
      }
    }

    auto gloo_options = c10d::ProcessGroupGloo::Options::create(impl->timeout);
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
      gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    } else if (IsLoopback(options.master_addr)) {
      gloo_options->devices.push_back(
          c10d::ProcessGroupGloo::createDeviceForHostname(options.master_addr));
    } else {
      gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    impl->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(impl->store, options.rank,
                                                             options.world_size, gloo_options);
#ifdef USE_C10D_NCCL
    if (options.backend == DistBackend::kNccl) {
      // Communicators are made at the first collective, on that tensor's GPU; the prefix keeps
      // NCCL's store keys apart from Gloo's.
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = impl->timeout;
      impl->nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(
          c10::make_intrusive<c10d::PrefixStore>("lgpt/nccl/", impl->store), options.rank,
          options.world_size, nccl_options);
    }
#endif
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("rank ", options.rank, ": rendezvous at ", where, " failed: ", e.what()));
  }
  return std::shared_ptr<ProcessGroup>(
      new ProcessGroup(options.rank, options.world_size, options.backend, std::move(impl)));
}

absl::Status ProcessGroup::AllReduceSum(at::Tensor& tensor) {
  if (!impl_) return absl::OkStatus();
  if (!tensor.is_contiguous())
    return absl::InvalidArgumentError("all-reduce needs a contiguous tensor");
  return Collective("all-reduce", impl_->LibraryFor(tensor), rank_, world_size_, Suspects(), [&] {
    std::vector<at::Tensor> tensors = {tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    impl_->Run(tensor, [&](auto& backend) { return backend.allreduce(tensors, opts); });
  });
}

absl::Status ProcessGroup::Broadcast(at::Tensor& tensor, int root) {
  if (!impl_) return absl::OkStatus();
  if (root < 0 || root >= world_size_) {
    return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " is not a rank"));
  }
  if (!tensor.is_contiguous())
    return absl::InvalidArgumentError("broadcast needs a contiguous tensor");
  return Collective("broadcast", impl_->LibraryFor(tensor), rank_, world_size_, Suspects(), [&] {
    std::vector<at::Tensor> tensors = {tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    impl_->Run(tensor, [&](auto& backend) { return backend.broadcast(tensors, opts); });
  });
}

absl::StatusOr<at::Tensor> ProcessGroup::AllGather(const at::Tensor& tensor) {
  if (!impl_) return tensor.clone();
  at::Tensor input = tensor.contiguous();
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < world_size_; ++r) outputs[0].push_back(at::empty_like(input));
  absl::Status status =
      Collective("all-gather", impl_->LibraryFor(input), rank_, world_size_, Suspects(), [&] {
        std::vector<at::Tensor> inputs = {input};
        impl_->Run(input, [&](auto& backend) { return backend.allgather(outputs, inputs); });
      });
  if (!status.ok()) return status;
  return at::cat(outputs[0], 0);
}

absl::Status ProcessGroup::Barrier() {
  if (!impl_) return absl::OkStatus();
  return Collective("barrier", "gloo", rank_, world_size_, Suspects(),
                    [&] { impl_->gloo->barrier()->wait(impl_->timeout); });
}

std::function<std::string()> ProcessGroup::Suspects() {
  return [this] { return impl_->Suspects(rank_, world_size_); };
}

}  // namespace lgpt
