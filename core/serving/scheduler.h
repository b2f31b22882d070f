// Continuous batching: one thread steps every running request of one model as a batch. The
// scheduler decides; KVMemory (core/serving/kv_memory.h) allocates; the model runs the step
// (core/model/batch_forward.h). core/serving/README.md draws the three and a request's path.
//
// Each step (Orca's iteration-level scheduling):
//   1. admits waiting requests in arrival order while fewer than max_running run;
//   2. takes the B requests with a token to feed (decode rows) and prompt chunks of requests
//      still reading their prompt, about step_prefill_tokens a step, so a long prompt stalls
//      running streams for one chunk only;
//   3. runs one forward pass over the prompt chunks and then the decode rows as one-token
//      chunks (core/model/batch_forward.h: each chunk attends through its own cache, as its
//      batch-1 step does; Sarathi's stall-free batching), so every weight is read once a step;
//   4. samples the next token of every request whose logits are ready (its own sampling
//      options and its own generator, seeded as Generate seeds it), calls its on_token.
// A request moves through one explicit state (waiting, admitted, prefilling, decoding, sampling,
// preempted, finished): core/serving/request_state.h lists the transitions.
// A request's tokens equal lgpt::Generate with the same prompt, options (prefill_chunk as
// EffectiveChunk says), seed and kind of cache (greedy tokens identical; logits differ only by
// the rounding of batched matrix products).
//
// With a BlockPool (cache/block_pool.h), requests whose caches are PagedKVCaches over it
// draw their KV memory from the pool, and requests whose caches keep their own bounded
// storage (budgeted and quantised caches: KVCache::storage_bound) are charged for it as it grows:
// before each step the scheduler reserves what the step will leave (KVStorageBound::BytesAfterStep)
// beyond what the request is charged, and gives back what it did not use after it, so one
// budget holds both and memory follows use for every kind of cache:
//   - admission follows free blocks: the oldest waiting request is admitted when what it needs
//     fits beside what the running requests are promised (arrival order, no skipping): a
//     paged request its first prefill chunk (a running one its next entry); a charged cache
//     (bounded storage of its own) what it will hold at its end, its bound (a running one the
//     rest of its growth), so budgeted and quantised requests are not admitted only to be
//     preempted when they grow;
//   - when a step needs blocks the pool lacks, the most recently admitted request is
//     preempted: its blocks go back, it returns to the head of the queue and is recomputed
//     when admitted again. Recomputing replays it exactly: its prompt is prefilled in the same
//     chunks and its generated tokens are fed one by one as in its first run (no sampling, no
//     callbacks; its generator is untouched), so preemption never changes a token, for any
//     cache (a charged cache frees its storage, KVCache::Release). The oldest request can
//     preempt every other one, so a request that fits the pool alone (Submit checks: its
//     blocks, or its cache's MaxBytes) always finishes;
//   - prefix reuse (SchedulerOptions.prefix_caching, requests starting at position 0): at its
//     first prefill turn the cache takes the pool's cached blocks that start the request's
//     tokens and only the rest is prefilled, and only the rest counts against the step's
//     budget (requests admitted together still share: one whose prompt continues blocks a
//     chunk of the step computes waits for the next step, when they are published); every
//     full block the request computes (prompt and generated tokens) is published for later
//     requests. Shared entries were computed in other chunks,
//     so logits may differ from a fresh prefill by rounding (greedy tokens do not change in
//     the tests; dense full-precision caches only, since only their entries depend on the
//     tokens alone).
//
// n choices of one prompt (SubmitChoices, OpenAI's `n`) read the prompt once:
//   - dense full-precision choices over the pool share its blocks through the prefix cache
//     (above): the first computes them, the others take them at their first prefill turn;
//   - choices whose caches fork (KVCache::forker: budgeted and quantised caches, whose entries
//     depend on the steps and so cannot be shared, and dense caches outside a pool) fork by
//     copy: the first to start (the leader) prefills the prompt while the others wait,
//     admitted; in the step its prompt is done, each of them is charged what the leader's cache
//     holds (KVMemory::ReserveCopy, preempting only requests admitted after it), takes a copy of
//     its cache (entries, quantisation scales, positions, policy scores, a pending eviction:
//     KVForker::CopyInto, the filled slots only) and of its last position's logits, and samples
//     its first token with its own generator and chooser; from there each decodes on its own,
//     charged as it grows. So each equals its own Submit alone (the same chunks, the same cache
//     state, to the bit).
//     A choice whose leader is preempted or ends before its prompt is done, or that is admitted
//     after the leader has moved past it, or finds no room for the copy, prefills the prompt
//     itself (and leads the choices still waiting); a preempted fork recomputes as any
//     preempted request does; cancelling one choice leaves the others alone. A choice whose
//     options differ from the leader's in what shapes the cache (prefill chunk, adapter, cache
//     options: KVForker::CheckCopyInto) prefills on its own. SchedulerStats.forked_choices and
//     forked_tokens count the copies and the prompt tokens they did not prefill.
//
// Speculative requests (GenerateOptions.speculative) verify a block of proposed tokens as one
// chunk of the step's pass, proposed only into free memory, and roll their caches back to the
// accepted tokens (core/serving/README.md, "Speculative rows"): greedy ones give plain greedy's
// tokens; sampled ones Generate's draws with the same proposer where every step could verify
// its proposal (a step short of memory decodes one token instead, which draws differently;
// the distribution is the model's either way). Over tensor-parallel ranks rank 0 proposes and
// the plan carries the proposals.
//
// Over tensor-parallel ranks (the StepSync constructor, core/serving/step_sync.h) every rank
// runs this scheduler in lockstep: rank 0 announces each step's new requests and
// cancellations and then the tokens it sampled, so every rank takes the same decisions and the
// forward passes' collectives pair up (core/serving/README.md).
//
//   Scheduler scheduler(model);
//   auto handle = scheduler.Submit(prompt, options, std::move(cache));  // any batch-1 cache
//   absl::StatusOr<RequestResult> result = (*handle)->Wait();
#ifndef LGPT_CORE_SERVING_SCHEDULER_H_
#define LGPT_CORE_SERVING_SCHEDULER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/block_pool.h"
#include "cache/kv_cache.h"
#include "core/model/generate.h"
#include "core/model/gpt.h"
#include "core/serving/kv_memory.h"
#include "core/serving/step_sync.h"

namespace lgpt {

struct SchedulerOptions {
  int64_t max_running = 16;           // requests decoding at once (rows of a decode step)
  int64_t max_waiting = 1024;         // queued requests; Submit beyond: ResourceExhausted
  int64_t prefill_chunk = 256;        // prompt tokens per prefill forward pass (default)
  int64_t step_prefill_tokens = 256;  // prompt tokens prefilled per step, all requests together
  // The shared KV memory pool (cache/block_pool.h) that Engine::Submit's dense caches draw
  // from: 0 = no pool (each request allocates its own cache as it grows).
  int64_t kv_pool_bytes = 0;
  // Entries per pool block (vLLM's default): prefixes are shared at this granularity and a
  // request wastes at most one partial block. Decoding reads the blocks in place
  // (DecodeAttentionBlocks); the per-block cost is small (bench_serve in README.md).
  int64_t kv_block_size = 16;
  bool prefix_caching = true;  // reuse cached prompt blocks (dense full-precision requests)
  // Speculative decoding only in steps with at most this many decode rows (0: any number), as
  // vLLM's speculative_disable_by_batch_size: a batch large enough to use the matrix units
  // gains nothing from verifying more tokens per weight read and pays for the rejected ones
  // (measured on the default model: +65% at 1 stream, -21% at 16; README).
  int64_t speculative_max_rows = 0;

  absl::Status Validate() const;
};

struct RequestResult {
  std::vector<int64_t> tokens;       // as lgpt::Generate returns them
  bool cancelled = false;            // Cancel(), a false on_token, or the scheduler's end
  GenerateStats stats;               // time_to_first_token_s counts from Submit
  int64_t kv_cache_index_bytes = 0;  // the cache's IndexBytes() when the request ended
  double queue_s = 0;                // Submit to admission
  int64_t prefix_hit_tokens = 0;     // prompt tokens found in the prefix cache (not prefilled)
  // Prompt tokens its last run copied from another choice's cache (not prefilled).
  int64_t forked_tokens = 0;
  int64_t preemptions = 0;            // times the request was preempted and recomputed
  std::vector<double> inter_token_s;  // gaps between consecutive tokens
};

class Scheduler;

// A submitted request. Thread-safe.
class RequestHandle {
 public:
  // Ends the request at the next step (its cache is released then); Wait() returns the tokens
  // so far with `cancelled` set.
  void Cancel() { cancel_requested_ = true; }
  // Blocks until the request ends: its result, or the error that ended it (a failing forward
  // pass, an on_token callback that threw).
  absl::StatusOr<RequestResult> Wait();
  bool Done() const;

 private:
  friend class Scheduler;
  void Finish(absl::StatusOr<RequestResult> result);

  std::atomic<bool> cancel_requested_{false};
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  absl::StatusOr<RequestResult> result_ = absl::UnknownError("not finished");
};

struct SchedulerStats {
  int64_t waiting = 0, running = 0;
  int64_t submitted = 0, completed = 0, cancelled = 0, failed = 0;
  int64_t steps = 0;        // scheduler steps that did work
  int64_t decode_rows = 0;  // rows of all decode forward passes (mean batch = rows/passes)
  int64_t decode_passes = 0;
  int64_t peak_decode_rows = 0;  // the most requests decoding in one step so far
  int64_t prefill_tokens = 0;
  int64_t prefill_passes = 0;  // forward passes that prefilled prompt chunks
  int64_t prefill_chunks = 0;  // chunks they ran (several requests' chunks share a pass)
  // Passes that ran prompt chunks and decode rows together (counted in both kinds above).
  int64_t mixed_passes = 0;
  int64_t generated_tokens = 0;
  // The KV block pool (zeros without one): blocks in all, held by requests, and unreferenced
  // blocks the prefix cache keeps (reusable, evicted LRU when memory is needed).
  int64_t pool_blocks = 0, pool_blocks_used = 0, pool_blocks_cached = 0;
  int64_t pool_block_bytes = 0;
  int64_t prefix_hits = 0;        // requests that reused at least one cached block
  int64_t prefix_hit_tokens = 0;  // prompt tokens not prefilled thanks to the prefix cache
  int64_t preemptions = 0;        // requests preempted (blocks freed, recomputed later)
  // Choices (SubmitChoices) that took a copy of their leader's cache after its prompt, and the
  // prompt tokens they did not prefill.
  int64_t forked_choices = 0;
  int64_t forked_tokens = 0;
  // Speculative decoding (GenerateOptions.speculative, core/speculative/README.md): rows that
  // verified proposals (each also yields a token of the model's own), tokens proposed and
  // tokens accepted (vLLM's spec_decode_num_drafts / num_draft_tokens / num_accepted_tokens).
  int64_t speculative_steps = 0;
  int64_t proposed_tokens = 0;
  int64_t accepted_tokens = 0;
};

// A follower rank's KV cache for a request the leader announced (its recipe, from the
// leader's Submit), drawn from the follower's own memory.
using ReplicaCacheFactory = std::function<absl::StatusOr<std::unique_ptr<KVCache>>(
    const ReplicaRequest& request, const KVMemory& memory)>;

class Scheduler {
 public:
  // The model is shared (read-only) with any other user; the thread starts here. `memory`
  // holds the pool Submit's caches draw from (admission, preemption, prefix reuse).
  Scheduler(GPT model, SchedulerOptions options, std::unique_ptr<KVMemory> memory);
  // One rank of tensor-parallel serving (core/serving/step_sync.h): the leader (rank 0) takes
  // Submit's requests, each with its cache recipe, and shares every step's decisions through
  // `sync`; a follower runs the leader's requests through caches from `replica_caches` until
  // the leader stops (Follow).
  Scheduler(GPT model, SchedulerOptions options, std::unique_ptr<KVMemory> memory,
            std::shared_ptr<StepSync> sync, ReplicaCacheFactory replica_caches);
  // Over `pool` (null: none), with SchedulerOptions.prefix_caching.
  explicit Scheduler(GPT model, SchedulerOptions options = {},
                     std::shared_ptr<BlockPool> pool = nullptr);
  // Cancels every request still in flight (they end with `cancelled`) and joins the thread.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a generation of `prompt` through `cache` (batch size 1, empty or holding exactly
  // [0, options.start_position)), with lgpt::Generate's options and checks: InvalidArgument /
  // OutOfRange as Generate would fail, ResourceExhausted when max_waiting requests wait or
  // when a paged cache's request needs more blocks than the whole pool.
  // on_token runs on the scheduler's thread; returning false (or throwing) ends only its own
  // request.
  // Over ranks, `cache_recipe` is what the followers' ReplicaCacheFactory makes their cache
  // from (required there; FailedPrecondition on a follower, whose requests come from rank 0).
  absl::StatusOr<std::shared_ptr<RequestHandle>> Submit(std::vector<int64_t> prompt,
                                                        GenerateOptions options,
                                                        std::unique_ptr<KVCache> cache,
                                                        std::string cache_recipe = {});
  // n choices of one prompt (OpenAI's `n`): choice i as Submit(prompt, options[i], caches[i]),
  // all queued together in order or none (Submit's errors; ResourceExhausted when the n do
  // not fit beside the waiting requests). The prompt is read
  // once where the caches allow: shared prefix blocks, or a fork by copy (above).
  // InvalidArgument for no choices (naming SubmitChoices.n) or a cache count that differs.
  absl::StatusOr<std::vector<std::shared_ptr<RequestHandle>>> SubmitChoices(
      const std::vector<int64_t>& prompt, std::vector<GenerateOptions> options,
      std::vector<std::unique_ptr<KVCache>> caches, std::vector<std::string> cache_recipes = {});

  // A follower rank: blocks until serving ends, OK when the leader stopped it, else the error
  // that ended it (a rank gone, a timeout). FailedPrecondition without a follower's sync.
  absl::Status Follow();
  // Over ranks: OK while serving goes on, else the error that ended it (a rank gone).
  absl::Status SyncStatus() const;

  SchedulerStats Stats() const;
  const SchedulerOptions& options() const { return options_; }
  const std::shared_ptr<BlockPool>& pool() const { return memory_->pool(); }
  const KVMemory& memory() const { return *memory_; }
  // The prefill chunk of a request: its own, or SchedulerOptions.prefill_chunk when it asks for
  // the whole prompt at once. Its tokens equal Generate's with this chunk.
  int64_t EffectiveChunk(const GenerateOptions& options) const;

 private:
  struct Request;      // its state (request_state.h) and data, in scheduler.cc
  struct ChoiceGroup;  // the choices of one prompt (SubmitChoices)
  using Running = std::vector<std::unique_ptr<Request>>;
  // Submit's checks; the request, its cache leased.
  absl::StatusOr<std::unique_ptr<Request>> MakeRequest(std::vector<int64_t> prompt,
                                                       GenerateOptions options,
                                                       std::unique_ptr<KVCache> cache,
                                                       std::string cache_recipe) const;
  // Over ranks, before each step: the leader sends the step's plan (new requests, cancels,
  // the end), a follower receives and applies it; false when serving ends (stop or failure).
  bool SharePlan(Running& running);
  bool LeadPlan(Running& running);
  bool FollowPlan(Running& running);
  // A follower's request for the leader's announcement.
  absl::Status AddReplica(const ReplicaRequest& replica);
  // Whether the request is to be cancelled this step (over ranks: as the leader announced).
  bool CancelNow(const Request& request) const;
  // A follower's sampling: the tokens the leader chose.
  void FollowSamples(Running& running);
  // Serving over ranks failed: every request ends with `status`, no more are taken.
  void EndServing(absl::Status status);
  // What a follower runs an announced request from.
  static ReplicaRequest ReplicaOf(const Request& request);
  // FailedPrecondition on a follower rank, whose requests come from rank 0.
  absl::Status CheckTakesRequests() const;
  // Queues the requests in order, all or none (max_waiting); their handles.
  absl::StatusOr<std::vector<std::shared_ptr<RequestHandle>>> Enqueue(
      std::vector<std::unique_ptr<Request>> requests);
  void Loop();
  // Moves waiting requests to `running` in arrival order while they fit (mutex_ held).
  void AdmitWaiting(Running& running);
  void Admit(Request& request);
  // At the request's first prefill turn: takes cached prefix blocks, makes its stream.
  void Start(Request& request);
  // Prompt tokens of the request's first prefill chunk.
  int64_t FirstChunk(const Request& request) const;
  // Whether the head of the queue fits the pool beside the running requests.
  bool Fits(const Request& request, const Running& running) const;
  // One iteration over the running requests; false when there was nothing to do.
  bool Step(Running& running);
  // A prompt chunk of this step's prefill pass: `tokens` ids of `request` from its prefilled
  // ones, at `positions` ([1, tokens]).
  struct PrefillPiece {
    Request* request;
    int64_t tokens;
    at::Tensor positions;
  };
  // This step's prompt chunks within the step's token budget, their memory reserved.
  std::vector<PrefillPiece> PlanPrefill(Running& running);
  // One ForwardChunks pass over the step's prompt chunks and then its decode rows as one-token
  // chunks (at least one of either): running streams wait for one pass a step, not a prefill
  // pass and a decode pass. Then AfterPrefill and AfterDecode.
  void Pass(const std::vector<PrefillPiece>& pieces, const std::vector<Request*>& rows);
  // Publishes the pieces' blocks and keeps the logits ([pieces, V]) of the requests whose
  // prompt is done.
  void AfterPrefill(const std::vector<PrefillPiece>& pass,
                    const absl::StatusOr<at::Tensor>& logits);
  // Whether `request` (not started) would reuse prefix blocks that a chunk of `batch` is
  // computing (its prompt shares them and they are not published yet).
  bool SharesUnpublishedBlock(const Request& request, const std::vector<PrefillPiece>& batch) const;
  // The step's rows on a device whose choice needs their logits and options alone
  // (NextTokenChooser::ChoosesFromLogitsAlone) chosen together on the device, one launch read
  // back in one transfer (ChooseRows): a GPU step synchronises once, not once a request. Each
  // sampled row draws its key from its own generator, as Choose would: the same tokens as
  // alone. Rows on the CPU keep the per-row host path (no copy of their logits).
  void ChooseDeviceRowsTogether(Running& running);
  void SampleReady(Running& running);
  // The requests with a token to feed this step, in admission order, their next entry reserved
  // (a speculative row's: its verification chunk's entries, or one entry as usual).
  std::vector<Request*> ReserveDecodeRows(Running& running);
  // Speculative rows: each one's proposal for this step (Request::proposal; none while it
  // replays after a preemption). A failing proposer ends its own request only.
  void Propose(const std::vector<Request*>& rows);
  // The memory of `request`'s verification chunk when the pool has it without preempting
  // anyone; else drops the proposal (false) and the request decodes one token.
  bool ReserveVerification(Request& request);
  // After the pass, a speculative row's verification: its tokens delivered, the rejected
  // entries forgotten (KeepVerified), its statistics counted; false when it failed (the
  // request ends with the error).
  bool Verify(Request& request);
  // The cache and stream keep the fed token and the first `emitted` - 1 proposals (the last
  // emitted token is fed next); the full blocks are published.
  void KeepVerified(Request& request, int64_t emitted);
  // Over ranks, the leader: the speculative rows' proposals, into the plan the followers
  // verify the same tokens from (a failing proposer cancels its request on every rank).
  void ProposeForPlan(Running& running, StepPlan& plan);
  // Counts the fed tokens, publishes blocks and keeps the logits ([rows, V]) to sample from.
  void AfterDecode(const std::vector<Request*>& rows, const absl::StatusOr<at::Tensor>& logits);
  // Takes the pool memory `request`'s next step of `steps` entries needs (KVMemory::Reserve),
  // preempting the most recently admitted requests while the pool lacks it; false when
  // `request` itself was preempted.
  bool ReserveMemory(Request& request, int64_t steps, Running& running);
  // Pool blocks `request`'s next step of `steps` entries takes beyond what it holds.
  int64_t BlocksForStep(const Request& request, int64_t steps) const;
  // A charged request (bounded storage of its own): the pool blocks it takes from now to its
  // end, beyond what it holds (admission by bound).
  int64_t BlocksToBound(const Request& request) const;
  // After a forward pass: charged requests give back what their step's bound over-counted.
  void SettleCharges(Running& running);
  void Preempt(Request& request);
  // Forking the choices of one prompt (SubmitChoices; the header comment).
  // Whether `request` (admitted, not started) waits for its group's leader to finish the
  // prompt; else it reads the prompt itself, and leads the group when none does.
  bool WaitsForFork(Request& request);
  // Whether `request` can take a copy of `leader`'s cache once its prompt is done.
  bool CanFork(const Request& leader, const Request& request) const;
  // After a pass: leaders whose prompt is done copy their caches and logits into the choices
  // waiting for them (before sampling, which edits the logits in place).
  void ForkChoices(Running& running);
  void Fork(Request& leader, Request& request, Running& running);
  // Takes the pool memory a copy of `leader`'s cache into `request`'s holds
  // (KVMemory::ReserveCopy), preempting only requests admitted after `request`; false when
  // they cannot make room.
  bool ReserveCopy(const Request& leader, Request& request, Running& running);
  // A leader that is preempted or ends leaves the lead to the next choice to start.
  void LeaveGroup(Request& request);
  // Puts preempted requests back at the head of the queue, in arrival order.
  void Requeue(Running& running);
  void Retire(Running& running);
  // After a forward pass: the request's cache holds `history`; publish its full blocks.
  void Publish(Request& request);

  GPT model_;
  const SchedulerOptions options_;
  const std::unique_ptr<KVMemory> memory_;
  const std::shared_ptr<StepSync> sync_;  // null: one process
  const ReplicaCacheFactory replica_caches_;
  // Over ranks: why serving ended (Follow's result; Submit's error after a failure).
  absl::Status sync_status_;
  bool loop_done_ = false;
  std::condition_variable loop_done_cv_;
  // A follower's choice groups by the leader's group id (the scheduler's thread only).
  std::map<int64_t, std::shared_ptr<ChoiceGroup>> replica_groups_;

  mutable std::mutex mutex_;
  std::condition_variable work_cv_;
  std::deque<std::unique_ptr<Request>> waiting_;
  uint64_t arrivals_ = 0;
  bool stopping_ = false;
  SchedulerStats stats_;
  std::thread thread_;
};

}  // namespace lgpt

#endif  // LGPT_CORE_SERVING_SCHEDULER_H_
