// One rank of the serving-over-ranks tests (tests/tp_serving_test.cc), started by the launcher
// with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT:
//   serving    rank 0 submits mixed requests (prompt lengths, dense, sink, h2o and int8 caches,
//              a shared prefix through a small pool that preempts, n choices, one ended by
//              its callback) to an engine over the ranks and to one of its own in one process,
//              and prints whether each request's tokens agree; the other ranks follow;
//   rank_dies  rank 0 streams without end, the last rank exits after 3 s: rank 0's request
//              must fail with an error and later submissions be refused.
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/dist/process_group.h"
#include "lgpt.h"

namespace lgpt {
namespace {

constexpr char kDefaultModel[] = "tools/default_model";

int Fail(const std::string& why) {
  std::cerr << why << std::endl;
  return 1;
}

SchedulerOptions Serving() {
  SchedulerOptions serving;
  serving.max_running = 8;
  // Small: 256 entries a rank over two ranks (128 in one process), so requests preempt.
  serving.kv_pool_bytes = 256 << 10;
  serving.kv_block_size = 8;
  serving.prefill_chunk = 16;
  serving.step_prefill_tokens = 24;
  return serving;
}

struct Case {
  std::string name;
  std::vector<int64_t> prompt;
  RequestOptions options;
  int64_t n = 1;
};

// Prompts of ids below `vocab`; `windowed`: the model has sliding-window layers.
std::vector<Case> Cases(int64_t vocab, bool windowed) {
  std::vector<Case> cases;
  auto prompt = [vocab](int64_t length, int64_t salt) {
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < length; ++i) ids.push_back(3 + (salt * 131 + i * 37) % (vocab - 3));
    return ids;
  };
  auto greedy = [](int64_t tokens) {
    RequestOptions options;
    options.sampling.temperature = 0;
    options.max_new_tokens = tokens;
    options.stop_at_eos = false;
    return options;
  };
  Case choices{"n=3 sink", prompt(30, 7), greedy(15), 3};
  choices.options.kv_cache.policy = "sink";
  choices.options.kv_cache.budget = 20;
  cases.push_back(choices);
  cases.push_back({"dense short", prompt(5, 1), greedy(20)});
  cases.push_back({"dense long", prompt(70, 2), greedy(40)});
  Case sink{"sink@24", prompt(40, 3), greedy(40)};
  sink.options.kv_cache.policy = "sink";
  sink.options.kv_cache.budget = 24;
  cases.push_back(sink);
  Case h2o{"h2o@24", prompt(33, 4), greedy(30)};
  h2o.options.kv_cache.policy = "h2o";
  h2o.options.kv_cache.budget = 24;
  cases.push_back(h2o);
  Case int8{"int8", prompt(21, 5), greedy(30)};
  int8.options.kv_cache.bits = 8;
  cases.push_back(int8);
  // Two requests sharing a 48-token prefix: the second reuses the first's blocks.
  std::vector<int64_t> shared = prompt(48, 6);
  std::vector<int64_t> first = shared, second = shared;
  first.push_back(11);
  second.push_back(12);
  cases.push_back({"prefix a", first, greedy(25)});
  cases.push_back({"prefix b", second, greedy(25)});
  Case sampled{"sampled", prompt(12, 8), greedy(20)};
  sampled.options.sampling = {0.8, 50, 0.95};
  sampled.options.seed = 99;
  cases.push_back(sampled);
  // Ends itself after 4 tokens (rank 0's callback decides; the others hear it).
  Case stopped{"callback stop", prompt(9, 9), greedy(50)};
  cases.push_back(stopped);
  // Speculative rows: rank 0 proposes (prompt lookup over a prompt that repeats itself), every
  // rank verifies the same tokens, rank 0 decides how many are kept.
  const auto repeating = [&prompt](int64_t salt) {
    std::vector<int64_t> ids = prompt(8, salt);
    for (int i = 0; i < 3; ++i) ids.insert(ids.end(), ids.begin(), ids.begin() + 8);
    return ids;
  };
  Case lookup{"ngram", repeating(10), greedy(30)};
  lookup.options.speculative.method = "ngram";
  lookup.options.speculative.num_speculative_tokens = 4;
  lookup.options.speculative.prompt_lookup_min = 1;
  cases.push_back(lookup);
  // (Sampled speculative requests are left out: a step proposes only where the pool has room,
  // and a rank's pool, half the groups, has more blocks than one process's, so their proposals
  // and hence their draws differ; their distribution is the model's either way.)
  if (!windowed) {  // quantised storage of a windowed layer cannot roll back
    Case lookup_int8 = lookup;
    lookup_int8.name = "ngram int8";
    lookup_int8.prompt = repeating(12);
    lookup_int8.options.kv_cache.bits = 8;
    lookup_int8.options.speculative.num_speculative_tokens = 6;
    cases.push_back(lookup_int8);
  }
  return cases;
}

// Every case submitted at once; each choice's tokens.
absl::StatusOr<std::vector<std::vector<int64_t>>> RunAll(const Engine& engine) {
  std::vector<std::shared_ptr<Request>> requests;
  for (Case c :
       Cases(engine.config().vocab_size, engine.config().sliding_window_size.has_value())) {
    if (c.name == "callback stop") {
      auto count = std::make_shared<int>(0);
      c.options.on_token = [count](int64_t) { return ++*count < 4; };
    }
    absl::StatusOr<std::vector<std::shared_ptr<Request>>> submitted =
        engine.SubmitChoices(c.prompt, c.options, c.n);
    if (!submitted.ok()) return submitted.status();
    for (auto& request : *submitted) requests.push_back(request);
  }
  std::vector<std::vector<int64_t>> tokens;
  for (auto& request : requests) {
    absl::StatusOr<Completion> done = request->Wait();
    if (!done.ok()) return done.status();
    tokens.push_back(done->tokens);
  }
  return tokens;
}

// The mixed requests through an engine over the ranks and through one process, for the
// checkpoint `dir`; prints "<dir> serving equal" on rank 0.
int Serving(const std::shared_ptr<ProcessGroup>& group, const std::string& dir) {
  EngineOptions options;
  options.serving = Serving();
  options.tensor_parallel = group;
  absl::StatusOr<std::shared_ptr<const Engine>> engine = Engine::Load(dir, options);
  if (!engine.ok()) return Fail(engine.status().ToString());
  if (group->rank() != 0) {
    const absl::Status followed = (*engine)->FollowServing();
    std::cerr << "follower: " << followed << std::endl;
    return followed.ok() ? 0 : 1;
  }
  EngineOptions alone_options;
  alone_options.serving = Serving();
  absl::StatusOr<std::shared_ptr<const Engine>> alone = Engine::Load(dir, alone_options);
  if (!alone.ok()) return Fail(alone.status().ToString());
  absl::StatusOr<std::vector<std::vector<int64_t>>> over_ranks = RunAll(**engine);
  absl::StatusOr<std::vector<std::vector<int64_t>>> one_process = RunAll(**alone);
  if (!over_ranks.ok()) return Fail(over_ranks.status().ToString());
  if (!one_process.ok()) return Fail(one_process.status().ToString());
  const SchedulerStats stats = (*engine)->ServingStats();
  bool all = over_ranks->size() == one_process->size();
  for (size_t i = 0; all && i < over_ranks->size(); ++i) {
    const bool same = (*over_ranks)[i] == (*one_process)[i];
    all = all && same;
    std::cout << "request " << i << (same ? " equal" : " DIFFERENT") << ": "
              << absl::StrJoin((*over_ranks)[i], " ") << "\n";
    if (!same) std::cout << "  one process: " << absl::StrJoin((*one_process)[i], " ") << "\n";
  }
  std::cout << "preemptions=" << stats.preemptions << " prefix_hits=" << stats.prefix_hits
            << " forked_choices=" << stats.forked_choices
            << " accepted_tokens=" << stats.accepted_tokens << "\n";
  std::cout << dir << (all ? " serving equal" : " serving DIFFERENT") << std::endl;
  return all ? 0 : 1;  // the engine goes here: the followers' FollowServing returns OK
}

// An engine over the ranks whose pool EngineOptions.kv_pool_memory_fraction sizes: every rank
// prints its pool's bytes on stderr (the least rank's share, the same on all), and a request is
// served.
int MemoryFraction(const std::shared_ptr<ProcessGroup>& group) {
  EngineOptions options;
  options.serving = Serving();
  options.serving.kv_pool_bytes = 0;
  options.kv_pool_memory_fraction = 0.001;
  options.tensor_parallel = group;
  // The last rank holds 512 MiB more while the engine loads: its free memory is less.
  std::vector<char> held(group->rank() == group->world_size() - 1 ? size_t{512} << 20 : 0, 1);
  absl::StatusOr<std::shared_ptr<const Engine>> engine = Engine::Load(kDefaultModel, options);
  if (!engine.ok()) return Fail(engine.status().ToString());
  std::cerr << "held " << held.size()
            << " bytes, kv_pool_bytes=" << (*engine)->serving_options().kv_pool_bytes << std::endl;
  if (group->rank() != 0) {
    const absl::Status followed = (*engine)->FollowServing();
    std::cerr << "follower: " << followed << std::endl;
    return followed.ok() ? 0 : 1;
  }
  RequestOptions greedy;
  greedy.max_new_tokens = 6;
  greedy.sampling = {0.0, 0, 1.0};
  absl::StatusOr<std::shared_ptr<Request>> request = (*engine)->Submit({5, 6, 7, 8}, greedy);
  if (!request.ok()) return Fail(request.status().ToString());
  absl::StatusOr<Completion> done = (*request)->Wait();
  if (!done.ok()) return Fail(done.status().ToString());
  std::cout << "served " << done->tokens.size()
            << " tokens, pool_blocks=" << (*engine)->ServingStats().pool_blocks << std::endl;
  return 0;
}

int RankDies(const std::shared_ptr<ProcessGroup>& group) {
  EngineOptions options;
  options.serving = Serving();
  options.tensor_parallel = group;
  absl::StatusOr<std::shared_ptr<const Engine>> engine = Engine::Load(kDefaultModel, options);
  if (!engine.ok()) return Fail(engine.status().ToString());
  if (group->rank() != 0) {
    if (group->rank() == group->world_size() - 1) {
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::seconds(3));
        _exit(3);
      }).detach();
    }
    const absl::Status followed = (*engine)->FollowServing();
    std::cerr << "follower: " << followed << std::endl;
    return 1;
  }
  RequestOptions endless;
  endless.max_new_tokens = 1000000;
  endless.stop_at_eos = false;
  endless.kv_cache.policy = "sink";
  endless.kv_cache.budget = 32;
  endless.kv_cache.positions = "cache";
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::shared_ptr<Request>> request = (*engine)->Submit({5, 6, 7, 8}, endless);
  if (!request.ok()) return Fail(request.status().ToString());
  absl::StatusOr<Completion> done = (*request)->Wait();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  absl::StatusOr<std::shared_ptr<Request>> later = (*engine)->Submit({1, 2}, endless);
  std::cout << "request " << (done.ok() ? "finished" : "failed") << " after " << seconds
            << " s: " << (done.ok() ? "" : done.status().ToString()) << "\n"
            << "later submit: " << (later.ok() ? "accepted" : later.status().ToString())
            << std::endl;
  return !done.ok() && !later.ok() ? 2 : 1;
}

}  // namespace
}  // namespace lgpt

int main(int argc, char** argv) {
  if (argc != 2) return lgpt::Fail("usage: worker serving|rank_dies");
  const std::string mode = argv[1];
  absl::StatusOr<lgpt::DistOptions> options = lgpt::DistOptionsFromEnv(absl::Seconds(10));
  if (!options.ok()) return lgpt::Fail(options.status().ToString());
  absl::StatusOr<std::shared_ptr<lgpt::ProcessGroup>> group = lgpt::ProcessGroup::Create(*options);
  if (!group.ok()) return lgpt::Fail(group.status().ToString());
  if (mode == "serving") return lgpt::Serving(*group, lgpt::kDefaultModel);
  if (mode == "golden") {
    // Every golden family (LitGPT's LoRA model aside: its adapters are inline, not a fine-tune
    // directory an engine loads), one engine pair after the other.
    int failed = 0;
    for (const char* dir :
         {"golden/pythia", "golden/llama2", "golden/llama3_gqa", "golden_extra/falcon",
          "golden_extra/gemma2", "golden_extra/gemma3", "golden_extra/interleave",
          "golden_extra/linear_rope", "golden_extra/llama31_yarn", "golden_extra/mixtral",
          "golden_extra/olmo2", "golden_extra/phi2", "golden_extra/qwen25", "golden_extra/qwen3",
          "golden_extra/stablelm"}) {
      failed += lgpt::Serving(*group, std::string("tests/testdata/") + dir) != 0;
    }
    return failed == 0 ? 0 : 1;
  }
  if (mode == "rank_dies") return lgpt::RankDies(*group);
  if (mode == "memory_fraction") return lgpt::MemoryFraction(*group);
  return lgpt::Fail("unknown mode " + mode);
}
