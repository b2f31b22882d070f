// One rank of sft_data_parallel_test, started by the launcher (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT set). Rank 0 prints one line per check on stdout; the exit code says whether
// all passed.
//   equal:METHOD   TrainSft over the ranks with micro-batch 1 against TrainSft in this process
//                  alone with micro-batch W (the same global batch of 4): parameters, losses
//                  and validation losses after 3 AdamW steps within 1e-5 (adapter v2's
//                  parameters within 2e-3, see Equal)
//   mismatch       the last rank's learning rate differs: every rank fails naming it
//   rank_dies      the last rank is killed after its second step; the others must fail with
//                  an error naming it (exit 2, the error on stderr)
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <glog/logging.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/dist/process_group.h"
#include "core/model/checkpoint.h"
#include "core/text/prompt_style.h"
#include "tests/test_models.h"
#include "tools/finetune_model.h"
#include "tools/sft_test_util.h"
#include "tools/sft_trainer.h"

namespace lgpt {
namespace {

constexpr double kTolerance = 1e-5;

int Fail(const std::string& why) {
  std::cerr << why << std::endl;
  return 1;
}

// Responses of quite different lengths, so the ranks' slices hold different numbers of
// response tokens and a mean of the ranks' means would not be the global mean.
std::vector<SftExample> Examples() {
  std::vector<InstructionRecord> records = TinyRecords();
  records.push_back({"Recite", "", "In the beginning God created the heaven"});
  records.push_back({"Spell", "", "x"});
  return *TokenizeSft(records, *PromptStyleFromName("phi-2"), CharEncoder(), {64, true});
}

// The same model on every rank and in every call: seeded base, seeded method parameters, in
// float64. Rounding differs between one process and the ranks (other batch shapes, other
// summation orders), and AdamW divides each gradient by its own size, so entries whose
// gradient is near 0 amplify it: in float32 LoRA's parameters end 1.3e-5 apart, in float64
// (RMSNorm still rounds to float32) 3e-7.
GPT Model(const Config& config, PeftMethod method) {
  GPT base = *GPTImpl::Create(config);
  RandomizeWeights(*base, 7);
  at::manual_seed(11);
  GPT model = *CreateFinetuneModel(config, method);
  CHECK(LoadBaseWeights(*model, StateDict(*base), "base").ok());
  MarkTrainable(*model, method);
  model->to(at::kDouble);
  return model;
}

SftTrainOptions Options(int64_t micro, double lr = 2e-2) {
  SftTrainOptions options;
  options.micro_batch_size = micro;
  options.global_batch_size = 4;
  options.max_steps = 3;
  options.lr = lr;
  options.min_lr = lr / 10;
  options.warmup_steps = 2;
  options.eval_interval = 3;
  options.eval_max_batches = 2;
  return options;
}

int Equal(const std::shared_ptr<ProcessGroup>& group, PeftMethod method) {
  const int world = group->world_size();
  const Config config = TinyConfig();
  const std::vector<SftExample> examples = Examples();

  // A global batch the ranks cannot split is refused on every rank before any collective.
  {
    GPT model = Model(config, method);
    SftTrainOptions options = Options(1);
    options.global_batch_size = 3;
    options.group = group;
    absl::StatusOr<SftTrainStats> refused = TrainSft(*model, examples, examples, options);
    if (refused.ok() || refused.status().code() != absl::StatusCode::kInvalidArgument) {
      return Fail(
          absl::StrCat("global batch 3 over ", world, " ranks: ", refused.status().ToString()));
    }
  }

  // Adapter v2 trains a bias on the keys. In the head dimensions RoPE turns slowest, a bias
  // shifts every key's score almost alike, which softmax ignores: those gradients are ~1e-8,
  // sums of terms ~1e-2 that cancel, and the float32 RMSNorm leaves them ~1e-9 apart between
  // the runs. AdamW divides each gradient by its own size, so those entries step ~lr/20 apart
  // (4e-4 here) whatever the data-parallel arithmetic; the losses still agree within 1e-5,
  // and a missing or wrong all-reduce moves parameters ~lr apart.
  const double param_tolerance = method == PeftMethod::kAdapterV2 ? 2e-3 : kTolerance;
  const double lr = 2e-2;
  GPT ddp = Model(config, method);
  SftTrainOptions options = Options(1, lr);
  options.group = group;
  options.bucket_bytes = 4096;  // several buckets
  absl::StatusOr<SftTrainStats> ddp_stats = TrainSft(*ddp, examples, examples, options);
  if (!ddp_stats.ok()) return Fail(ddp_stats.status().ToString());

  GPT one = Model(config, method);
  absl::StatusOr<SftTrainStats> one_stats = TrainSft(*one, examples, examples, Options(world, lr));
  if (!one_stats.ok()) return Fail(one_stats.status().ToString());

  double param_diff = 0, trained_change = 0;
  const GPT untouched = Model(config, method);
  const auto before = untouched->named_parameters();
  const auto reference = one->named_parameters();
  std::string worst;
  for (const auto& item : ddp->named_parameters()) {
    const double diff = (item.value() - reference[item.key()]).abs().max().item<double>();
    if (diff > param_diff) {
      param_diff = diff;
      worst = item.key();
    }
    trained_change =
        std::max(trained_change, (item.value() - before[item.key()]).abs().max().item<double>());
  }
  double val_diff = 0;
  if (ddp_stats->val_losses.size() != 2 || one_stats->val_losses.size() != 2) {
    return Fail("expected validation at steps 0 and 3");
  }
  for (size_t i = 0; i < 2; ++i) {
    val_diff = std::max(
        val_diff, std::abs(ddp_stats->val_losses[i].second - one_stats->val_losses[i].second));
  }
  const double loss_diff = std::max(std::abs(ddp_stats->first_loss - one_stats->first_loss),
                                    std::abs(ddp_stats->last_loss - one_stats->last_loss));
  const bool ok = param_diff <= param_tolerance && loss_diff <= kTolerance &&
                  val_diff <= kTolerance && trained_change > lr &&
                  ddp_stats->target_tokens == one_stats->target_tokens;
  if (group->rank() == 0) {
    std::cout << PeftMethodName(method) << (ok ? " equal" : " DIFFERENT")
              << " max_param_diff=" << param_diff << " (" << worst << ") loss_diff=" << loss_diff
              << " val_loss_diff=" << val_diff << " max_change=" << trained_change
              << " target_tokens=" << ddp_stats->target_tokens << "/" << one_stats->target_tokens
              << std::endl;
  }
  return ok ? 0 : 1;
}

int Mismatch(const std::shared_ptr<ProcessGroup>& group) {
  GPT model = Model(TinyConfig(), PeftMethod::kLora);
  SftTrainOptions options = Options(1);
  options.group = group;
  if (group->rank() == group->world_size() - 1) options.lr = 2.0000001e-2;
  absl::StatusOr<SftTrainStats> stats = TrainSft(*model, Examples(), Examples(), options);
  if (stats.ok()) return Fail("a different learning rate passed the start-up check");
  if (group->rank() == 0) std::cout << stats.status() << std::endl;
  return 0;
}

int RankDies(const std::shared_ptr<ProcessGroup>& group) {
  GPT model = Model(TinyConfig(), PeftMethod::kLora);
  SftTrainOptions options = Options(1);
  options.group = group;
  options.max_steps = 1000;
  options.eval_max_batches = 0;
  const bool dies = group->rank() == group->world_size() - 1;
  options.on_step = [dies](int64_t step, int64_t, double, double) {
    if (dies && step == 2) raise(SIGKILL);
  };
  absl::StatusOr<SftTrainStats> stats = TrainSft(*model, Examples(), Examples(), options);
  if (stats.ok()) return Fail("training went on without a rank");
  std::cerr << "error: " << stats.status() << std::endl;
  return 2;
}

}  // namespace
}  // namespace lgpt

int main(int argc, char** argv) {
  using namespace lgpt;
  if (argc != 2) return Fail("usage: worker MODE");
  const std::string mode = argv[1];
  absl::StatusOr<DistOptions> options = DistOptionsFromEnv(absl::Seconds(30));
  if (!options.ok()) return Fail(options.status().ToString());
  absl::StatusOr<std::shared_ptr<ProcessGroup>> group = ProcessGroup::Create(*options);
  if (!group.ok()) return Fail(group.status().ToString());
  if (absl::StartsWith(mode, "equal:")) {
    absl::StatusOr<PeftMethod> method = ParsePeftMethod(mode.substr(6));
    if (!method.ok()) return Fail(method.status().ToString());
    return Equal(*group, *method);
  }
  if (mode == "mismatch") return Mismatch(*group);
  if (mode == "rank_dies") return RankDies(*group);
  return Fail("unknown mode " + mode);
}
