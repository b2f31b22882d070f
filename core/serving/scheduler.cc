#include "core/serving/scheduler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <exception>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "core/model/batch_forward.h"
#include "core/model/cache_positions.h"
#include "core/model/next_token.h"
#include "core/model/sampling.h"
#include "core/serving/request_state.h"
#include "core/speculative/propose_batch.h"
#include "core/speculative/proposer.h"

namespace lgpt {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

int64_t Scheduler::EffectiveChunk(const GenerateOptions& options) const {
  return options.prefill_chunk > 0 ? options.prefill_chunk : options_.prefill_chunk;
}

absl::Status SchedulerOptions::Validate() const {
  // "SchedulerOptions.<name> must be <rule>, got <value>", carrying the field.
  auto invalid = [](absl::string_view name, absl::string_view rule, int64_t value) {
    const std::string field = absl::StrCat("SchedulerOptions.", name);
    return InvalidFieldError(field, absl::StrCat(field, " must be ", rule, ", got ", value));
  };
  if (max_running < 1) return invalid("max_running", ">= 1", max_running);
  if (max_waiting < 0) return invalid("max_waiting", ">= 0", max_waiting);
  if (prefill_chunk < 1) return invalid("prefill_chunk", ">= 1", prefill_chunk);
  if (step_prefill_tokens < 1) return invalid("step_prefill_tokens", ">= 1", step_prefill_tokens);
  if (kv_pool_bytes < 0) return invalid("kv_pool_bytes", ">= 0", kv_pool_bytes);
  if (kv_block_size < 1) return invalid("kv_block_size", ">= 1", kv_block_size);
  if (speculative_max_rows < 0) {
    return invalid("speculative_max_rows", ">= 0 (0: any number)", speculative_max_rows);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------

absl::StatusOr<RequestResult> RequestHandle::Wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [this] { return done_; });
  return result_;
}

bool RequestHandle::Done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

void RequestHandle::Finish(absl::StatusOr<RequestResult> result) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    result_ = std::move(result);
    done_ = true;
  }
  done_cv_.notify_all();
}

// ---------------------------------------------------------------------------------------

// A request: its phase (core/serving/request_state.h) and the data its phases use.
struct Scheduler::Request {
  std::shared_ptr<RequestHandle> handle;
  uint64_t arrival = 0;
  RequestState state = RequestState::kWaiting;
  // The prompt, then the generated tokens; the cache holds the entries of
  // ids[0, prefilled + fed).
  std::vector<int64_t> ids;
  int64_t prompt_length = 0;
  GenerateOptions options;
  KVLease memory;                          // its cache and what it holds of the pool (KVMemory)
  std::unique_ptr<CachePositions> stream;  // made at the first prefill turn
  at::Generator generator;
  // Penalties, constraint and logprobs over the tokens so far; a preempted request keeps it
  // (its replayed tokens are not chosen again).
  std::unique_ptr<NextTokenChooser> chooser;
  // This step's token when ChooseDeviceRowsTogether chose it with the step's other rows.
  std::optional<absl::StatusOr<int64_t>> device_choice;
  int64_t prefilled = 0;
  int64_t fed = 0;    // generated tokens whose entries the cache holds
  at::Tensor logits;  // [1, V] of the last position, in kSampling
  // Speculative decoding (options.speculative.proposer): this step's proposal, the tokens its
  // verification chunk feeds (the token to feed, then the proposal), that chunk's logits
  // ([1 + proposed, V], in kSampling) and the cache position of its first token.
  Proposal proposal;
  std::vector<int64_t> verify_ids;
  at::Tensor verify_logits;
  int64_t verify_position = 0;
  absl::Status error;
  RequestResult result;
  Clock::time_point submitted, prefill_done, last_token;
  std::optional<Clock::time_point> admitted;  // its first admission
  // The choices of one prompt it was submitted with (SubmitChoices); null alone.
  std::shared_ptr<ChoiceGroup> group;
  // Over ranks: the recipe the followers make its cache from, whether the leader announced it
  // and its cancellation (a request is cancelled at the step its cancellation is announced, on
  // every rank).
  std::string cache_recipe;
  bool announced = false;
  bool cancel_announced = false;

  KVCache& cache() const { return *memory.cache(); }
  int64_t generated() const { return static_cast<int64_t>(ids.size()) - prompt_length; }
  // Whether its cache and stream are set up (its first prefill turn came since admission).
  bool started() const {
    return state == RequestState::kPrefilling || state == RequestState::kDecoding ||
           state == RequestState::kSampling;
  }
  // In kDecoding: the token to feed, the one just sampled or the next generated one replayed.
  int64_t next_token() const { return ids[prompt_length + fed]; }
  // Whether this step verifies a proposal (a speculative row).
  bool verifies() const { return !proposal.tokens.empty(); }
  // Tokens a speculative request may have proposed now: none while it replays generated tokens
  // (after a preemption), else up to its k, leaving room for the token of its own each step
  // yields (as Generate caps it).
  int64_t ProposalBudget() const {
    if (options.speculative.proposer == nullptr || fed + 1 != generated()) return 0;
    return std::min(options.speculative.k, options.max_new_tokens - generated() - 1);
  }
  void DropProposal() {
    proposal = Proposal();
    verify_ids.clear();
    verify_logits = at::Tensor();
  }

  void MoveTo(RequestState next) {
    TORCH_CHECK(IsRequestTransition(state, next), "scheduler: request ", arrival,
                " cannot go from ", RequestStateName(state), " to ", RequestStateName(next));
    state = next;
  }
  void Fail(absl::Status status) {
    error = std::move(status);
    MoveTo(RequestState::kFinished);
  }
  void Cancel() {
    result.cancelled = true;
    MoveTo(RequestState::kFinished);
  }
  // A sampled token: appends it, times it and calls on_token; then feeds it (kDecoding) or
  // ends (a stop token, max_new_tokens, on_token's false or its exception).
  void Deliver(int64_t next) {
    const Clock::time_point now = Clock::now();
    ids.push_back(next);
    if (generated() == 1) {
      result.stats.time_to_first_token_s = Seconds(submitted, now);
    } else {
      result.inter_token_s.push_back(Seconds(last_token, now));
    }
    last_token = now;
    const bool keep_going = CallOnToken(next);
    const std::vector<int64_t>& stops = options.stop_tokens;
    const bool stop = std::find(stops.begin(), stops.end(), next) != stops.end();
    const bool finished = options.constraint && options.constraint->Done();
    const bool done =
        !error.ok() || !keep_going || stop || finished || generated() == options.max_new_tokens;
    MoveTo(done ? RequestState::kFinished : RequestState::kDecoding);
  }
  // Calls on_logprob; its exception becomes the request's error.
  void CallOnLogprob(const TokenLogprob& logprob) {
    try {
      options.on_logprob(logprob);
    } catch (const std::exception& e) {
      error = absl::InternalError(absl::StrCat("on_logprob threw: ", e.what()));
    } catch (...) {
      error = absl::InternalError("on_logprob threw");
    }
  }
  // on_token's answer (true without one); its exception becomes the request's error.
  bool CallOnToken(int64_t next) {
    if (!options.on_token) return true;
    try {
      return options.on_token(next);
    } catch (const std::exception& e) {
      error = absl::InternalError(absl::StrCat("on_token threw: ", e.what()));
    } catch (...) {
      error = absl::InternalError("on_token threw");
    }
    return true;
  }
  // With its prompt in the cache: kDecoding while generated tokens are left to replay, else
  // kSampling from row `row` of `pass_logits` ([rows, V] or [rows, 1, V]).
  void Advance(const at::Tensor& pass_logits, int64_t row) {
    if (fed < generated()) return MoveTo(RequestState::kDecoding);
    logits = pass_logits.select(0, row).reshape({1, -1});
    MoveTo(RequestState::kSampling);
  }
};

// The choices of one prompt (SubmitChoices). The leader prefills the prompt; the others whose
// caches fork wait, admitted, until its prompt is done and then take copies of its cache and
// logits (ForkChoices). Used on the scheduler's thread only.
struct Scheduler::ChoiceGroup {
  // Over ranks: the arrival number of its first choice, the group's name on every rank.
  uint64_t id = 0;
  // The choice prefilling (or that prefilled) the prompt for the others; null when none is:
  // not yet, or it was preempted or ended (the next choice to start takes its place).
  Request* leader = nullptr;
};

Scheduler::Scheduler(GPT model, SchedulerOptions options, std::shared_ptr<BlockPool> pool)
    : Scheduler(std::move(model), options,
                std::make_unique<KVMemory>(std::move(pool), options.prefix_caching)) {}

Scheduler::Scheduler(GPT model, SchedulerOptions options, std::unique_ptr<KVMemory> memory)
    : Scheduler(std::move(model), options, std::move(memory), nullptr, nullptr) {}

Scheduler::Scheduler(GPT model, SchedulerOptions options, std::unique_ptr<KVMemory> memory,
                     std::shared_ptr<StepSync> sync, ReplicaCacheFactory replica_caches)
    : model_(std::move(model)),
      options_(options),
      memory_(std::move(memory)),
      sync_(std::move(sync)),
      replica_caches_(std::move(replica_caches)) {
  thread_ = std::thread([this] { Loop(); });
}

absl::Status Scheduler::Follow() {
  if (sync_ == nullptr || sync_->leader()) {
    return absl::FailedPreconditionError("Follow is for a follower rank of serving over ranks");
  }
  std::unique_lock<std::mutex> lock(mutex_);
  loop_done_cv_.wait(lock, [this] { return loop_done_; });
  return sync_status_;
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

absl::StatusOr<std::unique_ptr<Scheduler::Request>> Scheduler::MakeRequest(
    std::vector<int64_t> prompt, GenerateOptions options, std::unique_ptr<KVCache> cache,
    std::string cache_recipe) const {
  RETURN_IF_ERROR(options_.Validate());
  if (sync_ != nullptr && sync_->leader() && cache_recipe.empty()) {
    return absl::InvalidArgumentError(
        "serving over ranks: Submit needs the cache recipe the other ranks make their caches "
        "from");
  }
  if (cache == nullptr) return absl::InvalidArgumentError("Submit needs a KV cache");
  if (cache->batch_size() != 1 || cache->num_layers() != model_->config().n_layer) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Submit needs a cache of batch size 1 and ", model_->config().n_layer, " layers, got ",
        cache->batch_size(), " rows and ", cache->num_layers(), " layers"));
  }
  RETURN_IF_ERROR(
      CheckGenerateRequest(*model_, *cache, static_cast<int64_t>(prompt.size()), options));
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= model_->config().PaddedVocabSize()) {
      return absl::OutOfRangeError(absl::StrCat("prompt token ", i, " (", prompt[i],
                                                ") is outside the vocabulary [0, ",
                                                model_->config().PaddedVocabSize(), ")"));
    }
  }
  auto request = std::make_unique<Request>();
  const int64_t entries =
      options.start_position + static_cast<int64_t>(prompt.size()) + options.max_new_tokens;
  ASSIGN_OR_RETURN(request->memory,
                   // An adapter's KV entries are its own: not shared through the prefix cache.
                   memory_->Lease(std::move(cache), entries,
                                  options.start_position == 0 && options.adapter < 0));
  request->handle = std::make_shared<RequestHandle>();
  request->prompt_length = static_cast<int64_t>(prompt.size());
  request->cache_recipe = std::move(cache_recipe);
  request->chooser = std::make_unique<NextTokenChooser>(options.sampling, prompt,
                                                        options.constraint, options.top_logprobs);
  request->ids = std::move(prompt);
  request->options = std::move(options);
  request->generator = at::make_generator<at::CPUGeneratorImpl>(request->options.seed);
  request->submitted = Clock::now();
  return request;
}

absl::StatusOr<std::vector<std::shared_ptr<RequestHandle>>> Scheduler::Enqueue(
    std::vector<std::unique_ptr<Request>> requests) {
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (const auto& request : requests) handles.push_back(request->handle);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!sync_status_.ok()) {
      return absl::UnavailableError(
          absl::StrCat("serving over ranks ended: ", sync_status_.message()));
    }
    if (stopping_) return absl::CancelledError("the scheduler is shutting down");
    // All or none: max_waiting - waiting is compared, as waiting + n may overflow.
    if (static_cast<int64_t>(requests.size()) >
        options_.max_waiting - static_cast<int64_t>(waiting_.size())) {
      return FieldError(
          absl::StatusCode::kResourceExhausted, "SchedulerOptions.max_waiting",
          requests.size() == 1
              ? absl::StrCat(waiting_.size(),
                             " requests are waiting (SchedulerOptions.max_waiting)")
              : absl::StrCat(requests.size(), " choices do not fit beside the ", waiting_.size(),
                             " requests waiting (SchedulerOptions.max_waiting ",
                             options_.max_waiting, ")"));
    }
    if (requests.front()->group != nullptr) requests.front()->group->id = arrivals_;
    for (auto& request : requests) {
      request->arrival = arrivals_++;
      waiting_.push_back(std::move(request));
      ++stats_.submitted;
    }
  }
  work_cv_.notify_one();
  return handles;
}

absl::Status Scheduler::CheckTakesRequests() const {
  if (sync_ == nullptr || sync_->leader()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "this rank follows rank 0 of serving over ranks: submit requests there");
}

absl::StatusOr<std::shared_ptr<RequestHandle>> Scheduler::Submit(std::vector<int64_t> prompt,
                                                                 GenerateOptions options,
                                                                 std::unique_ptr<KVCache> cache,
                                                                 std::string cache_recipe) {
  RETURN_IF_ERROR(CheckTakesRequests());
  ASSIGN_OR_RETURN(std::unique_ptr<Request> request,
                   MakeRequest(std::move(prompt), std::move(options), std::move(cache),
                               std::move(cache_recipe)));
  std::vector<std::unique_ptr<Request>> one;
  one.push_back(std::move(request));
  ASSIGN_OR_RETURN(std::vector<std::shared_ptr<RequestHandle>> handles, Enqueue(std::move(one)));
  return handles.front();
}

absl::StatusOr<std::vector<std::shared_ptr<RequestHandle>>> Scheduler::SubmitChoices(
    const std::vector<int64_t>& prompt, std::vector<GenerateOptions> options,
    std::vector<std::unique_ptr<KVCache>> caches, std::vector<std::string> cache_recipes) {
  RETURN_IF_ERROR(CheckTakesRequests());
  if (options.empty()) {
    return InvalidFieldError(FieldRef("SubmitChoices.n", "n"), "n must be >= 1, got 0");
  }
  if (caches.size() != options.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SubmitChoices takes one KV cache a choice: ", options.size(), " choices, ",
                     caches.size(), " caches"));
  }
  const auto group = std::make_shared<ChoiceGroup>();
  std::vector<std::unique_ptr<Request>> requests;
  for (size_t i = 0; i < options.size(); ++i) {
    absl::StatusOr<std::unique_ptr<Request>> request =
        MakeRequest(prompt, std::move(options[i]), std::move(caches[i]),
                    i < cache_recipes.size() ? std::move(cache_recipes[i]) : std::string());
    if (!request.ok()) return request.status();
    if (options.size() > 1) (*request)->group = group;
    requests.push_back(*std::move(request));
  }
  return Enqueue(std::move(requests));
}

SchedulerStats Scheduler::Stats() const {
  SchedulerStats stats;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats = stats_;
  }
  const KVMemoryStats memory = memory_->Stats();
  stats.pool_blocks = memory.blocks;
  stats.pool_blocks_cached = memory.blocks_cached;
  stats.pool_blocks_used = memory.blocks_used;
  stats.pool_block_bytes = memory.block_bytes;
  return stats;
}

void Scheduler::Loop() {
  at::NoGradGuard no_grad;
  std::vector<std::unique_ptr<Request>> running;
  while (true) {
    // Over ranks every rank exchanges the plan first (a leader with nothing to do sends one
    // every heartbeat); the followers' queue is what the leader announced.
    if (sync_ != nullptr && !SharePlan(running)) break;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (sync_ == nullptr) {
        work_cv_.wait(lock, [&] { return stopping_ || !waiting_.empty() || !running.empty(); });
        if (stopping_) break;
      }
      AdmitWaiting(running);
      stats_.waiting = static_cast<int64_t>(waiting_.size());
      stats_.running = static_cast<int64_t>(running.size());
    }
    Step(running);
  }
  // Shutting down: every request still here ends as cancelled (or with the error that ended
  // serving over ranks).
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& request : waiting_) running.push_back(std::move(request));
    waiting_.clear();
  }
  for (auto& request : running) {
    if (request->state == RequestState::kFinished) continue;
    if (sync_status_.ok()) {
      request->Cancel();
    } else {
      request->Fail(sync_status_);
    }
  }
  Retire(running);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    loop_done_ = true;
  }
  loop_done_cv_.notify_all();
}

absl::Status Scheduler::SyncStatus() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sync_status_;
}

bool Scheduler::CancelNow(const Request& request) const {
  return sync_ != nullptr ? request.cancel_announced : request.handle->cancel_requested_.load();
}

bool Scheduler::SharePlan(Running& running) {
  return sync_->leader() ? LeadPlan(running) : FollowPlan(running);
}

bool Scheduler::LeadPlan(Running& running) {
  // The heartbeat: a follower waiting longer than its collectives' timeout takes the leader
  // for dead.
  constexpr auto kHeartbeat = std::chrono::milliseconds(500);
  StepPlan plan;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (running.empty()) {
      work_cv_.wait_for(lock, kHeartbeat, [&] { return stopping_ || !waiting_.empty(); });
    }
    const auto note = [&plan](Request& r) {
      if (!r.announced) {
        r.announced = true;
        plan.arrivals.push_back(ReplicaOf(r));
      }
      if (r.handle->cancel_requested_ && !r.cancel_announced) {
        r.cancel_announced = true;
        plan.cancelled.push_back(r.arrival);
      }
    };
    for (auto& request : waiting_) note(*request);
    for (auto& request : running) {
      if (request->state != RequestState::kFinished) note(*request);
    }
    plan.stop = stopping_;
  }
  ProposeForPlan(running, plan);
  if (absl::Status shared = sync_->SharePlan(plan); !shared.ok()) {
    EndServing(shared);
    return false;
  }
  return !plan.stop;
}

void Scheduler::ProposeForPlan(Running& running, StepPlan& plan) {
  // The speculative rows' proposals go with the plan: the followers verify the same tokens (a
  // draft model runs on this rank only). A proposer that fails ends its request on every rank.
  std::vector<Request*> decoding;
  for (auto& owned : running) {
    if (owned->state == RequestState::kDecoding) decoding.push_back(owned.get());
  }
  Propose(decoding);
  for (Request* r : decoding) {
    if (r->state == RequestState::kFinished) {
      if (!r->cancel_announced) plan.cancelled.push_back(r->arrival);
      r->cancel_announced = true;
    } else if (r->verifies()) {
      plan.proposals.push_back({r->arrival, r->proposal.tokens});
    }
  }
}

ReplicaRequest Scheduler::ReplicaOf(const Request& r) {
  // Announced before its first admission: its ids are still the prompt.
  ReplicaRequest replica;
  replica.id = r.arrival;
  replica.group = r.group != nullptr ? static_cast<int64_t>(r.group->id) : -1;
  replica.prompt.assign(r.ids.begin(), r.ids.begin() + r.prompt_length);
  replica.max_new_tokens = r.options.max_new_tokens;
  replica.prefill_chunk = r.options.prefill_chunk;
  replica.start_position = r.options.start_position;
  replica.adapter = r.options.adapter;
  replica.cache_recipe = r.cache_recipe;
  return replica;
}

bool Scheduler::FollowPlan(Running& running) {
  StepPlan plan;
  absl::Status status = sync_->SharePlan(plan);
  for (size_t i = 0; status.ok() && i < plan.arrivals.size(); ++i) {
    status = AddReplica(plan.arrivals[i]);
  }
  if (!status.ok()) {
    EndServing(status);
    return false;
  }
  for (auto& request : running) request->DropProposal();
  for (const StepProposal& proposal : plan.proposals) {
    auto it = std::find_if(running.begin(), running.end(), [&](const auto& r) {
      return r->arrival == proposal.id && r->state == RequestState::kDecoding;
    });
    if (it == running.end()) {
      EndServing(absl::InternalError(
          absl::StrCat("serving over ranks diverged: rank 0 proposed tokens for request ",
                       proposal.id, ", which is not decoding on this rank")));
      return false;
    }
    (*it)->proposal.tokens = proposal.tokens;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (uint64_t id : plan.cancelled) {
    for (auto& request : waiting_) {
      if (request->arrival == id) request->cancel_announced = true;
    }
    for (auto& request : running) {
      if (request->arrival == id) request->cancel_announced = true;
    }
  }
  return !plan.stop;
}

absl::Status Scheduler::AddReplica(const ReplicaRequest& replica) {
  absl::StatusOr<std::unique_ptr<KVCache>> cache = replica_caches_(replica, *memory_);
  GenerateOptions options;
  options.max_new_tokens = replica.max_new_tokens;
  options.prefill_chunk = replica.prefill_chunk;
  options.start_position = replica.start_position;
  options.adapter = replica.adapter;
  absl::StatusOr<std::unique_ptr<Request>> request =
      cache.ok() ? MakeRequest(replica.prompt, std::move(options), *std::move(cache), "")
                 : absl::StatusOr<std::unique_ptr<Request>>(cache.status());
  if (!request.ok()) {
    // The leader took it: this rank cannot follow (a different pool, a divergence).
    return absl::InternalError(absl::StrCat(
        "rank 0's request ", replica.id, " cannot run on this rank: ", request.status().message()));
  }
  Request& r = **request;
  r.arrival = replica.id;
  r.announced = true;
  if (replica.group >= 0) {
    std::shared_ptr<ChoiceGroup>& group = replica_groups_[replica.group];
    if (group == nullptr) {
      group = std::make_shared<ChoiceGroup>();
      group->id = static_cast<uint64_t>(replica.group);
    }
    r.group = group;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  arrivals_ = replica.id + 1;
  waiting_.push_back(*std::move(request));
  ++stats_.submitted;
  return absl::OkStatus();
}

void Scheduler::EndServing(absl::Status status) {
  std::lock_guard<std::mutex> lock(mutex_);
  sync_status_ = std::move(status);
  stopping_ = true;
}

void Scheduler::AdmitWaiting(Running& running) {
  // Cancelled requests leave the queue at once (they hold no blocks).
  for (auto& request : waiting_) {
    if (CancelNow(*request)) {
      request->Cancel();
      running.push_back(std::move(request));
    }
  }
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), nullptr), waiting_.end());
  // Over ranks the leader admits only what the followers know of (a request submitted since
  // the plan waits for the next one).
  while (static_cast<int64_t>(running.size()) < options_.max_running && !waiting_.empty() &&
         (sync_ == nullptr || waiting_.front()->announced) && Fits(*waiting_.front(), running)) {
    running.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    Admit(*running.back());
  }
}

int64_t Scheduler::FirstChunk(const Request& request) const {
  return std::min(EffectiveChunk(request.options), request.prompt_length);
}

bool Scheduler::Fits(const Request& request, const Running& running) const {
  if (request.memory.use() == KVLease::Use::kNone) return true;
  // Blocks promised to running requests: a request yet to start its prefill its first chunk,
  // any other its next step. Finished ones (cancelled in the queue) hold and need none.
  int64_t promised = 0;
  bool alone = true;
  for (const auto& other : running) {
    if (other->state == RequestState::kFinished) continue;
    alone = false;
    promised += KVMemory::Bounded(other->memory)
                    ? BlocksToBound(*other)
                    : BlocksForStep(*other, other->started() ? 1 : FirstChunk(*other));
  }
  if (alone) return true;
  // A cache with bounded memory (storage of its own, or a sink or window cache in blocks)
  // needs what it will hold at its end (its growth is known: admitting it on less would
  // preempt it, or others, as it grows); a dense paged one its first chunk, or all it held
  // when it was preempted (resuming it sooner would only preempt it again).
  int64_t needed = 0;
  if (KVMemory::Bounded(request.memory)) {
    needed = BlocksToBound(request);
  } else {
    needed = BlocksForStep(request, request.result.preemptions > 0
                                        ? static_cast<int64_t>(request.ids.size()) + 1
                                        : FirstChunk(request));
  }
  return needed + promised <= memory_->free_blocks();
}

int64_t Scheduler::BlocksToBound(const Request& request) const {
  // Every entry the request has yet to write, as one step: the storage it ends with (at most
  // its cache's MaxBytes), beyond what it is charged now.
  const int64_t written = request.started() ? request.prefilled + request.fed : 0;
  const int64_t remaining = request.prompt_length + request.options.max_new_tokens - written;
  return BlocksForStep(request, std::max<int64_t>(1, remaining));
}

int64_t Scheduler::BlocksForStep(const Request& request, int64_t steps) const {
  return memory_->BlocksForStep(request.memory, steps, request.started());
}

void Scheduler::Admit(Request& r) {
  r.MoveTo(RequestState::kAdmitted);
  if (!r.admitted) r.admitted = Clock::now();
}

void Scheduler::Start(Request& r) {
  // The cache must hold the prompt, then the generated tokens when the request was
  // preempted: the cached prefix of all of them counts.
  const int64_t hit = memory_->AttachPrefix(r.memory, r.ids);
  const int64_t prompt_hit = std::min(hit, r.prompt_length);
  if (r.result.preemptions == 0 && prompt_hit > 0) {
    r.result.prefix_hit_tokens = prompt_hit;
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.prefix_hits;
    stats_.prefix_hit_tokens += prompt_hit;
  }
  r.prefilled = prompt_hit;
  r.fed = hit - prompt_hit;
  r.stream = std::make_unique<CachePositions>(*model_, r.cache(), r.options.start_position + hit);
  // A cached prefix covers at most all but the last token (PagedKVCache::AttachPrefix): one
  // that covers the prompt leaves a generated token to replay.
  r.MoveTo(r.prefilled == r.prompt_length ? RequestState::kDecoding : RequestState::kPrefilling);
}

bool Scheduler::Step(Running& running) {
  for (auto& request : running) {
    if (request->state != RequestState::kFinished && CancelNow(*request)) request->Cancel();
  }
  Retire(running);
  if (running.empty()) return false;
  // Running streams reserve their next entry first, then prompt chunks take the rest.
  std::vector<Request*> rows = ReserveDecodeRows(running);
  std::vector<PrefillPiece> pieces = PlanPrefill(running);
  // A later reservation may have preempted a request of either list.
  const auto gone = [](const Request& r) {
    return r.state == RequestState::kPreempted || r.state == RequestState::kFinished;
  };
  rows.erase(std::remove_if(rows.begin(), rows.end(), [&](Request* r) { return gone(*r); }),
             rows.end());
  pieces.erase(std::remove_if(pieces.begin(), pieces.end(),
                              [&](const PrefillPiece& piece) { return gone(*piece.request); }),
               pieces.end());
  if (!pieces.empty() || !rows.empty()) Pass(pieces, rows);
  SettleCharges(running);
  ForkChoices(running);
  SampleReady(running);
  Retire(running);
  Requeue(running);
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.steps;
  return true;
}

void Scheduler::SettleCharges(Running& running) {
  for (auto& owned : running) memory_->Settle(owned->memory);
}

bool Scheduler::ReserveMemory(Request& request, int64_t steps, Running& running) {
  if (request.memory.use() == KVLease::Use::kNone) return true;
  while (true) {
    const absl::Status reserved = memory_->Reserve(request.memory, steps);
    if (reserved.ok()) return true;
    // The most recently admitted request still holding pool memory goes (possibly this one).
    Request* victim = nullptr;
    for (auto it = running.rbegin(); it != running.rend() && victim == nullptr; ++it) {
      Request& other = **it;
      if (memory_->Holds(other.memory) && other.state != RequestState::kFinished &&
          other.state != RequestState::kPreempted) {
        victim = &other;
      }
    }
    if (victim == nullptr) {
      // Nothing left to free: the request cannot go on (Submit's check makes this rare).
      request.Fail(reserved);
      return false;
    }
    Preempt(*victim);
    if (victim == &request) return false;
  }
}

void Scheduler::Preempt(Request& r) {
  r.MoveTo(RequestState::kPreempted);
  LeaveGroup(r);
  r.stream.reset();
  memory_->Release(r.memory);
  r.prefilled = 0;
  r.fed = 0;
  r.logits = at::Tensor();
  r.DropProposal();
  r.result.forked_tokens = 0;  // it reads the prompt again, or takes another copy
  ++r.result.preemptions;
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.preemptions;
}

void Scheduler::Requeue(Running& running) {
  std::vector<std::unique_ptr<Request>> preempted;
  for (auto& owned : running) {
    if (owned != nullptr && owned->state == RequestState::kPreempted) {
      owned->MoveTo(RequestState::kWaiting);
      preempted.push_back(std::move(owned));
    }
  }
  if (preempted.empty()) return;
  running.erase(std::remove(running.begin(), running.end(), nullptr), running.end());
  std::sort(preempted.begin(), preempted.end(),
            [](const auto& a, const auto& b) { return a->arrival < b->arrival; });
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = preempted.rbegin(); it != preempted.rend(); ++it) {
    waiting_.push_front(std::move(*it));
  }
  stats_.waiting = static_cast<int64_t>(waiting_.size());
  stats_.running = static_cast<int64_t>(running.size());
}

void Scheduler::Publish(Request& r) {
  memory_->Publish(r.memory, absl::MakeConstSpan(r.ids).first(r.prefilled + r.fed));
}

bool Scheduler::SharesUnpublishedBlock(const Request& request,
                                       const std::vector<PrefillPiece>& batch) const {
  if (!request.memory.shares_prefixes() || request.ids.size() < 2) return false;
  const int64_t entries_per_block = memory_->entries_per_block();
  for (const PrefillPiece& piece : batch) {
    const Request& other = *piece.request;
    if (!other.memory.shares_prefixes()) continue;
    // The whole blocks the two share (AttachPrefix leaves the request's last token out), and
    // how far `other` had published them before this step.
    const size_t limit = std::min(request.ids.size() - 1, other.ids.size());
    const int64_t common = static_cast<int64_t>(
        std::mismatch(request.ids.begin(), request.ids.begin() + limit, other.ids.begin()).first -
        request.ids.begin());
    const int64_t published = (other.prefilled + other.fed) / entries_per_block * entries_per_block;
    if (common / entries_per_block * entries_per_block > published) return true;
  }
  return false;
}

std::vector<Scheduler::PrefillPiece> Scheduler::PlanPrefill(Running& running) {
  // The chunks of this step. Chunks are never split (score-based and
  // quantised caches evict by chunk, so the chunks must be those of the batch-1 run); the budget
  // defers whole chunks, but the first chunk of a step always runs.
  int64_t budget = options_.step_prefill_tokens;
  std::vector<PrefillPiece> batch;
  for (size_t i = 0; i < running.size() && (batch.empty() || budget > 0); ++i) {
    Request& r = *running[i];
    const int64_t length = r.prompt_length;
    if (r.state != RequestState::kAdmitted && r.state != RequestState::kPrefilling) continue;
    if (r.state == RequestState::kAdmitted) {
      // A choice whose leader is prefilling the prompt waits for a copy of its cache.
      if (WaitsForFork(r)) continue;
      // A request whose prompt continues blocks that a chunk of this step computes waits for
      // them (published after the pass) rather than computing them again.
      if (SharesUnpublishedBlock(r, batch)) break;
      // Started here, not at admission: the cached prefix counts against the budget only
      // for what it leaves to prefill.
      Start(r);
      if (r.state != RequestState::kPrefilling) continue;
    }
    const int64_t chunk = std::min(EffectiveChunk(r.options), length - r.prefilled);
    if (!batch.empty() && chunk > budget) break;
    absl::StatusOr<int64_t> fits = r.stream->MakeRoom(chunk);
    if (!fits.ok()) {
      r.Fail(fits.status());
      continue;
    }
    if (!ReserveMemory(r, *fits, running)) continue;
    batch.push_back({&r, *fits, r.stream->Take(*fits)});
    budget -= *fits;
  }
  return batch;
}

void Scheduler::Pass(const std::vector<PrefillPiece>& pieces, const std::vector<Request*>& rows) {
  // One forward pass for all of them: every weight is read once for the step's tokens (the
  // matrix kernels run the rows in slices, core/ops/gemv.h) and the per-pass costs of small
  // models are paid once. Each decode row attends through its own cache as its batch-1 step
  // does.
  std::vector<SequenceChunk> chunks;
  chunks.reserve(pieces.size() + rows.size());
  for (const PrefillPiece& piece : pieces) {
    // A view of the chunk's ids ([1, T] int64), read during the forward pass only.
    Request& r = *piece.request;
    chunks.push_back({&r.cache(),
                      at::from_blob(r.ids.data() + r.prefilled, {1, piece.tokens}, at::kLong),
                      piece.positions, r.options.adapter});
  }
  // Verification chunks (speculative rows) before the one-token rows, which attend together
  // when they end the step (cache/routing_kv_cache.h).
  for (Request* r : rows) {
    if (!r->verifies()) continue;
    const int64_t steps = static_cast<int64_t>(r->verify_ids.size());
    r->verify_position = r->stream->next();
    chunks.push_back({&r->cache(), at::from_blob(r->verify_ids.data(), {1, steps}, at::kLong),
                      r->stream->Take(steps), r->options.adapter, /*all_logits=*/true,
                      /*sequential=*/true});
  }
  // The rows' tokens and positions live here during the pass; the chunks view them.
  std::vector<int64_t> row_ids, row_positions;
  row_ids.reserve(rows.size());
  row_positions.reserve(rows.size());
  for (Request* r : rows) {
    if (r->verifies()) continue;
    row_ids.push_back(r->next_token());
    row_positions.push_back(r->stream->TakeOne());
    chunks.push_back({&r->cache(), at::from_blob(&row_ids.back(), {1, 1}, at::kLong),
                      at::from_blob(&row_positions.back(), {1, 1}, at::kLong), r->options.adapter});
  }
  const absl::StatusOr<at::Tensor> logits = ForwardChunks(*model_, chunks);  // [chunks, V]
  const auto part = [&](int64_t begin, int64_t count) -> absl::StatusOr<at::Tensor> {
    if (!logits.ok()) return logits.status();
    return logits->narrow(0, begin, count);
  };
  const int64_t prompts = static_cast<int64_t>(pieces.size());
  if (!pieces.empty()) AfterPrefill(pieces, part(0, prompts));
  if (!rows.empty()) AfterDecode(rows, part(prompts, logits.ok() ? logits->size(0) - prompts : 0));
  if (pieces.empty() || rows.empty()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.mixed_passes;
}

void Scheduler::AfterPrefill(const std::vector<PrefillPiece>& pass,
                             const absl::StatusOr<at::Tensor>& logits) {
  int64_t tokens = 0;
  for (size_t p = 0; p < pass.size(); ++p) {
    Request& r = *pass[p].request;
    if (!logits.ok()) {
      r.Fail(logits.status());
      continue;
    }
    r.prefilled += pass[p].tokens;
    tokens += pass[p].tokens;
    Publish(r);
    if (r.prefilled < r.prompt_length) continue;
    // Recomputing after a preemption, the generated tokens are replayed next (their logits
    // are known already); else the first token is sampled from these logits.
    if (r.generated() == 0) {
      r.prefill_done = Clock::now();
      r.result.stats.prefill_s = Seconds(*r.admitted, r.prefill_done);
      if (r.options.max_new_tokens == 0) {
        r.MoveTo(RequestState::kFinished);
        continue;
      }
    }
    r.Advance(*logits, static_cast<int64_t>(p));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.prefill_tokens += tokens;
  ++stats_.prefill_passes;
  stats_.prefill_chunks += static_cast<int64_t>(pass.size());
}

void Scheduler::LeaveGroup(Request& r) {
  if (r.group != nullptr && r.group->leader == &r) r.group->leader = nullptr;
}

bool Scheduler::CanFork(const Request& leader, const Request& r) const {
  // The same prompt (the group's), read in the same chunks, from the same position with the
  // same adapter, into a cache the leader's copies into; a stream that has not shifted (a
  // prompt within the context never does).
  const KVForker* forker = leader.cache().forker();
  return forker != nullptr && leader.prompt_length == r.prompt_length &&
         leader.options.start_position == r.options.start_position &&
         leader.options.adapter == r.options.adapter &&
         EffectiveChunk(leader.options) == EffectiveChunk(r.options) &&
         (leader.stream == nullptr || leader.stream->shifted() == 0) &&
         forker->CheckCopyInto(r.cache()).ok();
}

bool Scheduler::WaitsForFork(Request& r) {
  // Only a choice reading its prompt for the first time (not replaying generated tokens).
  if (r.group == nullptr || r.generated() > 0 || r.cache().forker() == nullptr) return false;
  Request*& leader = r.group->leader;
  if (leader == &r) return false;
  if (leader != nullptr &&
      (leader->state == RequestState::kAdmitted || leader->state == RequestState::kPrefilling)) {
    // A choice whose options differ (its chunks, its cache) prefills on its own.
    return CanFork(*leader, r);
  }
  // No choice is reading the prompt (none yet, or the leader was preempted, ended or is past
  // its prompt): this one does, for the others.
  leader = &r;
  return false;
}

void Scheduler::ForkChoices(Running& running) {
  for (auto& owned : running) {
    Request& leader = *owned;
    if (leader.state != RequestState::kSampling || leader.generated() > 0 ||
        leader.group == nullptr || leader.group->leader != &leader) {
      continue;
    }
    // Its prompt is done this step: every choice waiting for it takes a copy (one the pool
    // lacks room for reads the prompt itself, at a later step).
    for (size_t i = 0; i < running.size(); ++i) {
      Request& r = *running[i];
      if (&r != &leader && r.group == leader.group && r.state == RequestState::kAdmitted &&
          r.generated() == 0 && CanFork(leader, r)) {
        Fork(leader, r, running);
      }
    }
  }
}

bool Scheduler::ReserveCopy(const Request& leader, Request& r, Running& running) {
  while (!memory_->ReserveCopy(r.memory, leader.memory).ok()) {
    // Only requests admitted after this one give way to its copy, the most recent first: the
    // leader and the choices forked before it keep theirs (so two choices never take turns
    // preempting each other), and without the copy it reads the prompt itself.
    Request* victim = nullptr;
    for (auto it = running.rbegin(); it != running.rend() && it->get() != &r; ++it) {
      Request& other = **it;
      if (memory_->Holds(other.memory) && other.state != RequestState::kFinished &&
          other.state != RequestState::kPreempted) {
        victim = &other;
        break;
      }
    }
    if (victim == nullptr) return false;
    Preempt(*victim);
  }
  return true;
}

void Scheduler::Fork(Request& leader, Request& r, Running& running) {
  // The copy's memory first: what the leader's cache holds.
  if (!ReserveCopy(leader, r, running)) return;  // it will read the prompt itself
  if (absl::Status copied = leader.cache().forker()->CopyInto(r.cache()); !copied.ok()) {
    memory_->Release(r.memory);
    r.Fail(copied);
    return;
  }
  r.MoveTo(RequestState::kPrefilling);
  r.stream = std::make_unique<CachePositions>(*model_, r.cache(), leader.stream->next());
  r.prefilled = r.prompt_length;
  r.fed = 0;
  r.prefill_done = Clock::now();
  r.result.stats.prefill_s = Seconds(*r.admitted, r.prefill_done);
  r.result.forked_tokens = r.prompt_length;
  // Its own copy of the logits: sampling edits them in place.
  r.logits = leader.logits.clone();
  r.MoveTo(RequestState::kSampling);
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.forked_choices;
  stats_.forked_tokens += r.prompt_length;
}

void Scheduler::ChooseDeviceRowsTogether(Running& running) {
  std::vector<Request*> rows;
  std::vector<at::Tensor> logits;
  for (auto& owned : running) {
    Request& r = *owned;
    if (r.state == RequestState::kSampling && !r.verifies() &&
        r.chooser->ChoosesFromLogitsAlone() && r.logits.defined() && !r.logits.device().is_cpu()) {
      rows.push_back(&r);
      logits.push_back(r.logits.reshape({-1}));  // [V]
    }
  }
  if (rows.size() < 2) return;
  at::Tensor stacked;  // [B, V]
  try {
    stacked = at::stack(logits);
  } catch (const std::exception&) {
    return;  // (out of device memory, say) each row is chosen on its own, reporting its error
  }
  std::vector<RowSampling> options;
  for (Request* r : rows) options.push_back(RowSamplingFor(r->chooser->sampling(), r->generator));
  std::vector<absl::StatusOr<int64_t>> choices = ChooseRows(stacked, options);
  for (size_t i = 0; i < rows.size(); ++i) rows[i]->device_choice = std::move(choices[i]);
}

void Scheduler::SampleReady(Running& running) {
  if (sync_ != nullptr && !sync_->leader()) return FollowSamples(running);
  ChooseDeviceRowsTogether(running);
  StepTokens shared;  // over ranks: what each request got, for the followers
  for (auto& owned : running) {
    Request& r = *owned;
    if (r.state != RequestState::kSampling) continue;
    if (r.verifies()) {
      const int64_t before = static_cast<int64_t>(r.ids.size());
      const bool failed = !Verify(r);
      // Over ranks: the block's tokens, and -1 after them when the verification failed.
      shared.ids.push_back(r.arrival);
      shared.tokens.insert(shared.tokens.end(), r.ids.begin() + before, r.ids.end());
      if (failed) shared.tokens.push_back(-1);
      shared.counts.push_back(static_cast<int64_t>(r.ids.size()) - before + (failed ? 1 : 0));
      shared.done.push_back(r.state == RequestState::kFinished ? 1 : 0);
      continue;
    }
    TokenLogprob logprob;
    absl::StatusOr<int64_t> next = r.device_choice.has_value()
                                       ? r.chooser->Take(*r.device_choice)
                                       : r.chooser->Choose(r.logits, r.generator, &logprob);
    r.device_choice.reset();
    r.logits = at::Tensor();
    if (!next.ok()) {
      r.Fail(next.status());
    } else {
      if (r.options.on_logprob && r.chooser->reports_logprobs()) r.CallOnLogprob(logprob);
      r.Deliver(*next);
    }
    shared.ids.push_back(r.arrival);
    shared.tokens.push_back(next.ok() ? *next : -1);
    shared.counts.push_back(1);
    shared.done.push_back(r.state == RequestState::kFinished ? 1 : 0);
  }
  if (sync_ == nullptr) return;
  if (absl::Status status = sync_->ShareTokens(shared); !status.ok()) {
    EndServing(status);
  }
}

bool Scheduler::Verify(Request& r) {
  // Position j's logits choose the token after verify_ids[j]: proposal j while the model
  // accepts, then one of its own (a replacement, or the bonus after every proposal). Each
  // token is delivered as a sampled one is (on_logprob, on_token, stops).
  const Proposal& proposal = r.proposal;
  const int64_t proposed = static_cast<int64_t>(proposal.tokens.size());
  int64_t emitted = 0, accepted = 0;
  bool verified = true;
  // On a device the block's rows cross to the host in one transfer (each position's check
  // reads its row there), not one a position.
  const at::Tensor block = r.verify_logits.device().is_cpu()
                               ? r.verify_logits
                               : r.verify_logits.to(at::kCPU, at::kFloat);  // [steps, V]
  for (int64_t j = 0; j <= proposed; ++j) {
    const at::Tensor row = block.narrow(0, j, 1);  // [1, V]
    TokenLogprob logprob;
    absl::StatusOr<NextTokenChooser::Verdict> verdict;
    if (j < proposed) {
      const absl::Span<const float> draft = proposal.probabilities.empty()
                                                ? absl::Span<const float>()
                                                : absl::MakeConstSpan(proposal.probabilities[j]);
      verdict = r.chooser->Verify(row, proposal.tokens[j], draft, r.generator, &logprob);
    } else {
      absl::StatusOr<int64_t> bonus = r.chooser->Choose(row, r.generator, &logprob);
      if (bonus.ok()) verdict = NextTokenChooser::Verdict{*bonus, false};
      if (!bonus.ok()) verdict = bonus.status();
    }
    if (!verdict.ok()) {
      r.Fail(verdict.status());
      verified = false;
      break;
    }
    if (j > 0) r.MoveTo(RequestState::kSampling);  // the next token of the block
    if (r.options.on_logprob && r.chooser->reports_logprobs()) r.CallOnLogprob(logprob);
    r.Deliver(verdict->token);
    ++emitted;
    if (verdict->accepted) ++accepted;
    if (r.state == RequestState::kFinished || !verdict->accepted) break;
  }
  GenerateStats& stats = r.result.stats;
  ++stats.verify_steps;
  stats.proposed_tokens += proposed;
  stats.accepted_tokens += accepted;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.speculative_steps;
    stats_.proposed_tokens += proposed;
    stats_.accepted_tokens += accepted;
  }
  if (r.state != RequestState::kFinished) KeepVerified(r, emitted);
  r.DropProposal();
  return verified;
}

void Scheduler::KeepVerified(Request& r, int64_t emitted) {
  // The cache keeps the fed token and the accepted proposals before the last emitted token
  // (the next step feeds it, as without speculation).
  const int64_t kept = r.verify_position + emitted;
  if (absl::Status truncated = r.cache().rollback()->Truncate(kept); !truncated.ok()) {
    r.Fail(truncated);
    return;
  }
  r.stream->Rewind(kept);
  r.fed += emitted;
  Publish(r);
}

void Scheduler::FollowSamples(Running& running) {
  StepTokens shared;
  absl::Status status = sync_->ShareTokens(shared);
  size_t next = 0;
  int64_t token_offset = 0;
  for (auto& owned : running) {
    Request& r = *owned;
    if (r.state != RequestState::kSampling) continue;
    r.logits = at::Tensor();
    if (status.ok() && (next >= shared.ids.size() || shared.ids[next] != r.arrival)) {
      status = absl::InternalError(absl::StrCat(
          "serving over ranks diverged: this rank samples request ", r.arrival,
          " where rank 0 sampled ",
          next < shared.ids.size() ? absl::StrCat(shared.ids[next]) : std::string("none")));
    }
    if (!status.ok()) break;
    const int64_t count = shared.counts[next];
    const bool done = shared.done[next] != 0;
    ++next;
    if (!r.verifies() && count != 1) {
      status = absl::InternalError(absl::StrCat("serving over ranks diverged: rank 0 sampled ",
                                                count, " tokens for request ", r.arrival,
                                                ", which verifies no proposal on this rank"));
      break;
    }
    const int64_t* tokens = shared.tokens.data() + token_offset;
    token_offset += count;
    if (tokens[count - 1] < 0) {  // rank 0's sampling failed: the request ends there
      r.DropProposal();
      r.Cancel();
      continue;
    }
    r.ids.insert(r.ids.end(), tokens, tokens + count);
    if (r.verifies()) {
      if (!done) KeepVerified(r, count);
      r.DropProposal();
      if (r.state == RequestState::kFinished) continue;  // a failed truncation
    }
    r.MoveTo(done ? RequestState::kFinished : RequestState::kDecoding);
  }
  if (status.ok() && next != shared.ids.size()) {
    status = absl::InternalError(absl::StrCat("serving over ranks diverged: rank 0 sampled ",
                                              shared.ids.size(), " requests, this rank ", next));
  }
  if (!status.ok()) EndServing(status);
}

std::vector<Scheduler::Request*> Scheduler::ReserveDecodeRows(Running& running) {
  // Rows in admission order, so that when blocks run out the newest requests go first.
  std::vector<Request*> candidates;
  for (auto& owned : running) {
    Request& r = *owned;
    if (r.state != RequestState::kDecoding) continue;
    // Shifting caches make room before the step; a failure ends this request only.
    absl::Status room = r.stream->MakeRoom(1).status();
    if (!room.ok()) {
      r.Fail(room);
      continue;
    }
    candidates.push_back(&r);
  }
  // Over ranks the proposals came with the plan (ProposeForPlan, FollowPlan).
  if (sync_ == nullptr) Propose(candidates);
  std::vector<Request*> rows;
  for (Request* r : candidates) {
    if (r->state != RequestState::kDecoding) continue;  // preempted by an earlier row
    if (r->verifies() && ReserveVerification(*r)) {
      rows.push_back(r);
    } else if (ReserveMemory(*r, 1, running)) {
      rows.push_back(r);
    }
  }
  return rows;
}

void Scheduler::Propose(const std::vector<Request*>& rows) {
  // One call for every speculative row, so that draft proposers over one draft model share
  // their forward passes (core/speculative/propose_batch.h).
  std::vector<Request*> asking;
  std::vector<ProposalTask> tasks;
  std::vector<std::vector<int64_t>> joined;  // contexts with earlier turns before the prompt
  joined.reserve(rows.size());
  // Above speculative_max_rows decode rows no step speculates (the requests decode one token).
  const int64_t limit = options_.speculative_max_rows;
  const bool speculates = limit == 0 || static_cast<int64_t>(rows.size()) <= limit;
  for (Request* r : rows) {
    r->DropProposal();
    const int64_t k = speculates ? r->ProposalBudget() : 0;
    if (k < 1) continue;
    // The proposer's view: earlier turns (GenerateOptions.speculative.history), the prompt and
    // the output so far.
    const std::vector<int64_t>& history = r->options.speculative.history;
    absl::Span<const int64_t> context = r->ids;
    if (!history.empty()) {
      joined.push_back(history);
      joined.back().insert(joined.back().end(), r->ids.begin(), r->ids.end());
      context = joined.back();
    }
    asking.push_back(r);
    tasks.push_back({r->options.speculative.proposer.get(), context, k});
  }
  if (tasks.empty()) return;
  std::vector<absl::StatusOr<Proposal>> proposals = ProposeAll(tasks);
  for (size_t i = 0; i < asking.size(); ++i) {
    Request* r = asking[i];
    const int64_t k = tasks[i].k;
    absl::StatusOr<Proposal>& proposal = proposals[i];
    if (!proposal.ok()) {
      r->Fail(proposal.status());
      continue;
    }
    Proposal& p = *proposal;
    if (!p.probabilities.empty() && p.probabilities.size() != p.tokens.size()) {
      r->Fail(absl::InternalError(absl::StrCat(r->options.speculative.proposer->DebugName(),
                                               " proposed ", p.tokens.size(), " tokens with ",
                                               p.probabilities.size(), " distributions")));
      continue;
    }
    if (static_cast<int64_t>(p.tokens.size()) > k) {
      p.tokens.resize(static_cast<size_t>(k));
      if (!p.probabilities.empty()) p.probabilities.resize(static_cast<size_t>(k));
    }
    r->proposal = std::move(p);
  }
}

bool Scheduler::ReserveVerification(Request& r) {
  // A proposal only goes where memory is free: it preempts no one (its entries may be
  // forgotten after the step), else the request decodes one token as usual.
  const int64_t steps = 1 + static_cast<int64_t>(r.proposal.tokens.size());
  absl::StatusOr<int64_t> room = r.stream->MakeRoom(steps);
  if (!room.ok() || *room < steps || !memory_->Reserve(r.memory, steps).ok()) {
    r.DropProposal();
    return false;
  }
  r.verify_ids.assign(1, r.next_token());
  r.verify_ids.insert(r.verify_ids.end(), r.proposal.tokens.begin(), r.proposal.tokens.end());
  return true;
}

void Scheduler::AfterDecode(const std::vector<Request*>& rows,
                            const absl::StatusOr<at::Tensor>& logits) {
  // The pass's rows: each verification chunk's, in order, then one per one-token row.
  int64_t verify_rows = 0;
  for (Request* r : rows) {
    if (r->verifies()) verify_rows += static_cast<int64_t>(r->verify_ids.size());
  }
  int64_t next_verify = 0, next_row = verify_rows;
  for (Request* row : rows) {
    Request& r = *row;
    if (!logits.ok()) {
      r.DropProposal();
      r.Fail(logits.status());
      continue;
    }
    if (r.verifies()) {
      // Sampling verifies the proposal (Verify), then the cache forgets what it rejected.
      const int64_t steps = static_cast<int64_t>(r.verify_ids.size());
      r.verify_logits = logits->narrow(0, next_verify, steps);
      next_verify += steps;
      r.MoveTo(RequestState::kSampling);
      continue;
    }
    ++r.fed;
    Publish(r);
    r.Advance(*logits, next_row++);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.decode_passes;
  stats_.decode_rows += static_cast<int64_t>(rows.size());
  stats_.peak_decode_rows = std::max(stats_.peak_decode_rows, static_cast<int64_t>(rows.size()));
}

void Scheduler::Retire(Running& running) {
  auto done = std::stable_partition(
      running.begin(), running.end(),
      [](const std::unique_ptr<Request>& r) { return r->state != RequestState::kFinished; });
  if (done == running.end()) return;
  const Clock::time_point now = Clock::now();
  SchedulerStats delta;
  for (auto it = done; it != running.end(); ++it) {
    Request& r = **it;
    RequestResult& result = r.result;
    result.tokens.assign(r.ids.begin() + r.prompt_length, r.ids.end());
    result.stats.prompt_tokens = r.prompt_length;
    result.stats.new_tokens = static_cast<int64_t>(result.tokens.size());
    result.stats.kv_cache_bytes = r.cache().AllocatedBytes();
    result.kv_cache_index_bytes = r.cache().IndexBytes();
    result.stats.position_shift = r.stream ? r.stream->shifted() : 0;
    if (!result.tokens.empty()) result.stats.decode_s = Seconds(r.prefill_done, now);
    result.queue_s = Seconds(r.submitted, r.admitted.value_or(now));
    delta.generated_tokens += result.stats.new_tokens;
    if (!r.error.ok()) {
      ++delta.failed;
    } else {
      result.cancelled ? ++delta.cancelled : ++delta.completed;
    }
  }
  {
    // Counted before the handles finish, so a waiter sees its request in the statistics.
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.completed += delta.completed;
    stats_.cancelled += delta.cancelled;
    stats_.failed += delta.failed;
    stats_.generated_tokens += delta.generated_tokens;
    stats_.running = static_cast<int64_t>(done - running.begin());
  }
  for (auto it = done; it != running.end(); ++it) {
    Request& r = **it;
    LeaveGroup(r);
    // The cache goes before the waiter wakes: a finished request holds no KV memory.
    r.stream.reset();
    memory_->Close(r.memory);
    if (!r.error.ok()) {
      r.handle->Finish(r.error);
    } else {
      r.handle->Finish(std::move(r.result));
    }
  }
  running.erase(done, running.end());
}

}  // namespace lgpt
