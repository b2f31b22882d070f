// One rank of data_parallel_test: `worker MODE`, with RANK, WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT from the launcher. Exits 0 when its checks pass; prints why not on stderr.
//   reduce     gradients averaged in buckets equal the mean of every rank's gradients, for
//              several bucket sizes; frozen parameters and gradients no rank has stay so
//   agree      CheckRanksAgree passes on equal items, names the item and rank that differ,
//              and the scalar helpers (SumAcrossRanks, GlobalMean, BroadcastBytes) add up
//   disagree   the last rank passes a different "model config": every rank must fail with
//              the same error naming it (printed on stdout by rank 0)
#include <cmath>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "absl/strings/str_cat.h"
#include "core/dist/data_parallel.h"
#include "core/dist/process_group.h"

namespace lgpt {
namespace {

int Fail(const std::string& why) {
  std::cerr << why << std::endl;
  return 1;
}

using Named = std::vector<std::pair<std::string, at::Tensor>>;

// The same parameters on every rank (seeded), each rank's own gradients (seeded by rank),
// returned with every rank's gradients for the expected mean.
struct Case {
  Named parameters;
  std::vector<std::vector<at::Tensor>> grads;  // [rank][parameter]; undefined: none
};

Case MakeCase(int rank, int world) {
  Case c;
  at::manual_seed(5);
  const std::vector<std::vector<int64_t>> shapes = {{3, 4}, {7}, {2, 2, 5}, {1}, {16, 3}, {4}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    at::Tensor p = at::randn(shapes[i]);
    // #3 is frozen (LoRA's base); the others train.
    p.set_requires_grad(i != 3);
    c.parameters.push_back({absl::StrCat("p", i), p});
  }
  for (int r = 0; r < world; ++r) {
    at::manual_seed(100 + r);
    std::vector<at::Tensor> grads;
    for (size_t i = 0; i < shapes.size(); ++i) {
      // #1: only rank 0 has a gradient (unused by the others' batches); #5: no rank has one.
      const bool has = i != 3 && i != 5 && (i != 1 || r == 0);
      grads.push_back(has ? at::randn(shapes[i]) : at::Tensor());
    }
    c.grads.push_back(grads);
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (c.grads[rank][i].defined()) {
      c.parameters[i].second.mutable_grad() = c.grads[rank][i].clone();
    }
  }
  return c;
}

int Reduce(ProcessGroup& pg, const std::shared_ptr<ProcessGroup>& group) {
  const int rank = pg.rank(), world = pg.world_size();
  // 1 byte: a bucket per parameter; 100 bytes: a few; 1 MiB: one bucket.
  for (int64_t bucket_bytes : {int64_t{1}, int64_t{100}, int64_t{1} << 20}) {
    Case c = MakeCase(rank, world);
    GradientAllReducerOptions options;
    options.bucket_bytes = bucket_bytes;
    GradientAllReducer reducer(group, c.parameters, options);
    if (reducer.trained_parameters() != 5) return Fail("the frozen parameter was bucketed");
    if (bucket_bytes == 1 && reducer.buckets().size() != 5) return Fail("expected 5 buckets");
    if (bucket_bytes == (1 << 20) && reducer.buckets().size() != 1) return Fail("expected 1");
    if (absl::Status s = reducer.AllReduceGradients(); !s.ok()) return Fail(s.ToString());
    for (size_t i = 0; i < c.parameters.size(); ++i) {
      const at::Tensor& grad = c.parameters[i].second.grad();
      at::Tensor sum;
      for (int r = 0; r < world; ++r) {
        const at::Tensor& g = c.grads[r][i];
        if (!g.defined()) continue;
        sum = sum.defined() ? sum + g : g.clone();
      }
      if (!sum.defined()) {
        if (grad.defined()) return Fail(absl::StrCat("p", i, " got a gradient no rank had"));
        continue;
      }
      if (!grad.defined()) return Fail(absl::StrCat("p", i, " lost its gradient"));
      const double diff = (grad - sum / world).abs().max().item<double>();
      if (diff > 1e-6) return Fail(absl::StrCat("p", i, " differs from the mean by ", diff));
    }
  }
  // Broadcast: every rank's trained parameters become rank 0's; the frozen one stays.
  Case c = MakeCase(rank, world);
  at::NoGradGuard no_grad;
  for (auto& [name, p] : c.parameters) p.add_(rank);
  GradientAllReducer reducer(group, c.parameters);
  if (absl::Status s = reducer.BroadcastParameters(); !s.ok()) return Fail(s.ToString());
  const Case fresh = MakeCase(rank, world);
  for (size_t i = 0; i < c.parameters.size(); ++i) {
    const at::Tensor expected = fresh.parameters[i].second + (i == 3 ? rank : 0);
    if (!at::equal(c.parameters[i].second, expected)) return Fail(absl::StrCat("broadcast p", i));
  }
  if (rank == 0) std::cout << "reduce ok on " << world << " ranks" << std::endl;
  return 0;
}

int Agree(ProcessGroup& pg) {
  const int rank = pg.rank(), world = pg.world_size();
  const std::vector<AgreementItem> same = {{"model config", "n_layer: 2\n"},
                                           {"training data", std::string(1000, 'x')}};
  if (absl::Status s = CheckRanksAgree(pg, same); !s.ok()) return Fail(s.ToString());
  absl::StatusOr<double> sum = SumAcrossRanks(pg, rank + 1.5);
  if (!sum.ok()) return Fail(sum.status().ToString());
  if (*sum != world * (world + 2) / 2.0) return Fail(absl::StrCat("sum ", *sum));
  // Rank r: mean r over r + 1 terms; the global mean is Σ r(r + 1) / Σ (r + 1).
  absl::StatusOr<double> mean = GlobalMean(pg, rank, rank + 1);
  if (!mean.ok()) return Fail(mean.status().ToString());
  double num = 0, den = 0;
  for (int r = 0; r < world; ++r) num += r * (r + 1.0), den += r + 1.0;
  if (std::abs(*mean - num / den) > 1e-12) return Fail(absl::StrCat("mean ", *mean));
  absl::StatusOr<double> none = GlobalMean(pg, 1, 0);
  if (!none.ok() || !std::isnan(*none)) return Fail("a mean of no weight is not NaN");
  for (const std::string& payload :
       {std::string("tokenizer bytes\0with a zero", 27), std::string()}) {
    absl::StatusOr<std::string> got =
        BroadcastBytes(pg, rank == world - 1 ? payload : "not this", world - 1);
    if (!got.ok()) return Fail(got.status().ToString());
    if (*got != payload) return Fail("BroadcastBytes: wrong bytes");
  }
  if (rank == 0) std::cout << "agree ok on " << world << " ranks" << std::endl;
  return 0;
}

int Disagree(ProcessGroup& pg) {
  const int rank = pg.rank(), world = pg.world_size();
  const std::vector<AgreementItem> items = {
      {"world size", "2"},
      {"model config", rank == world - 1 ? "n_layer: 3\n" : "n_layer: 2\n"},
      {"trained parameters", "w [2,2] Float trained\n"}};
  absl::Status s = CheckRanksAgree(pg, items);
  if (s.ok()) return Fail("a different config passed the check");
  // Every rank reports the same error.
  if (rank == 0) std::cout << s << std::endl;
  return 0;
}

}  // namespace
}  // namespace lgpt

int main(int argc, char** argv) {
  using namespace lgpt;
  if (argc != 2) return Fail("usage: worker MODE");
  const std::string mode = argv[1];
  absl::StatusOr<DistOptions> options = DistOptionsFromEnv(absl::Seconds(20));
  if (!options.ok()) return Fail(std::string(options.status().message()));
  absl::StatusOr<std::shared_ptr<ProcessGroup>> group = ProcessGroup::Create(*options);
  if (!group.ok()) return Fail(std::string(group.status().message()));
  if (mode == "reduce") return Reduce(**group, *group);
  if (mode == "agree") return Agree(**group);
  if (mode == "disagree") return Disagree(**group);
  return Fail("unknown mode " + mode);
}
