// lgpt's library API for services: load a checkpoint once, then generate from many threads.
//
//   absl::StatusOr<std::shared_ptr<const lgpt::Engine>> engine =
//       lgpt::Engine::Load("checkpoints/meta-llama/Llama-3.2-1B");
//   lgpt::RequestOptions options;
//   options.max_new_tokens = 64;
//   options.on_text = [](absl::string_view piece) { std::cout << piece; return true; };
//   absl::StatusOr<lgpt::Completion> done = (*engine)->Generate("Hello", options);
//
// An Engine is immutable after loading and safe to share: every request and every Session
// owns its KV cache, the weights are shared. A Session keeps its cache across calls, so a
// multi-turn chat prefills only each new turn.
//
// Errors about an option name it in the library's terms ("KVCacheSpec.budget must be >= 1 for
// policy h2o, got 0", "SchedulerOptions.max_running must be >= 1") and carry it:
// lgpt::ErrorField(status) is "KVCacheSpec.budget" (core/base/status_field.h), which a tool or
// server maps to its own flag or request field.
#ifndef LGPT_LGPT_H_
#define LGPT_LGPT_H_

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cache/kv_cache.h"
#include "cache/kv_cache_factory.h"
#include "core/base/status_field.h"
#include "core/config/config.h"
#include "core/dist/process_group.h"
#include "core/model/generate.h"
#include "core/model/gpt.h"
#include "core/model/next_token.h"
#include "core/model/quantize_model.h"
#include "core/model/sampling.h"
#include "core/serving/kv_memory.h"
#include "core/serving/scheduler.h"
#include "core/speculative/proposer.h"
#include "core/speculative/speculative_spec.h"
#include "core/text/tokenizer.h"
#include "peft/peft_checkpoint.h"

namespace lgpt {

struct EngineOptions {
  c10::ScalarType dtype = c10::kFloat;
  c10::Device device = c10::Device(c10::kCPU);
  // LoRA fine-tunes applied over the checkpoint, unmerged, in order, each with its scale
  // (llama.cpp's --lora / --lora-scaled); see peft/peft_checkpoint.h.
  std::vector<LoraAdapterSpec> loras;
  // LoRA adapters served per request (S-LoRA / Punica): loaded beside the base, each picked by
  // name through RequestOptions::adapter, and requests with different adapters share a batched
  // step (the base projection once, each adapter's low-rank product on its rows). Not with
  // `loras` (the base must be the checkpoint itself); over dense, int8 or int4 weights.
  std::vector<NamedLoraAdapter> adapters;
  // Weights quantised at load (CPU, float32 activations), the float32 weights freed as each
  // matrix is quantised: kInt8 = q8_0-like blocks (int8, a scale per 32 weights; 1.125
  // bytes per weight), kInt4 = q4_0-like blocks (4-bit; 0.625 bytes per weight). Every
  // projection, MoE expert and lm_head; decoding runs integer dot products
  // (core/ops/block_quant.h). See core/model/quantize_model.h.
  WeightQuantization quantize = WeightQuantization::kNone;
  // Older spelling of quantize = kInt8 (true with quantize kNone or kInt8 means kInt8).
  bool quantize_int8 = false;
  // Speculative decoding's draft model (RequestOptions.speculative.method "draft";
  // core/speculative/README.md): a checkpoint loaded beside the model with the same dtype,
  // device and quantize. It must share the model's tokenizer: the same vocab_size and the same
  // token bytes and special ids (checked at load; InvalidArgument naming this field otherwise).
  // Not with tensor_parallel.
  std::string draft_checkpoint_dir;
  // Continuous batching of the requests given to Engine::Submit.
  SchedulerOptions serving;
  // The KV pool's entries (with serving.kv_pool_bytes; KVPoolEntriesFor in
  // core/serving/kv_memory.h): "model" (the model's dtype: pooled requests give Generate's
  // tokens), "auto" (`serve`'s default: bfloat16 for float32 models on the CPU), "float32",
  // "bfloat16", "float16", or "int8" / "int4" (codes and a float16 scale per 32 channels inside
  // the block: a dense request then decodes as Generate with KVCacheSpec{bits, residual 0}).
  // A float32 model's 16-bit entries fit twice the blocks in the pool and halve what each
  // decoding step reads, int8 ~3.8x and int4 ~7.1x the blocks; their cost in perplexity is in
  // README.md.
  std::string kv_pool_dtype = "model";
  // A KV pool of this fraction of the memory the model's device has free once the weights (and
  // a draft's) are loaded (core/base/device_memory.h: on a GPU the driver's free memory plus
  // LibTorch's unused cache; on the CPU MemAvailable), in (0, 1): vLLM's
  // gpu_memory_utilization, taken of what the weights left rather than of the whole device; the
  // rest is room for the forward passes. Instead of serving.kv_pool_bytes, which Load then sets
  // (ServingStats says the blocks); 0: off. Over tensor-parallel ranks, of the least any rank
  // has free (every rank holds the same pool).
  double kv_pool_memory_fraction = 0;
  // Check lit_model.pth's records against their CRC-32s (LoadOptions::verify_checksums): a
  // corrupt file fails to load, naming the tensor. Off only for trusted storage.
  bool verify_checksums = true;
  // Called with a short description of each loading stage.
  std::function<void(const std::string&)> progress;
  // Tensor-parallel inference over this group (world size > 1; core/dist/): every rank calls
  // Engine::Load and then makes the same requests in the same order, with the same seeds, so
  // that all ranks sample the same tokens (their logits are identical). Not yet with
  // quantize or loras.
  std::shared_ptr<ProcessGroup> tensor_parallel;
};

enum class FinishReason {
  kMaxTokens,     // max_new_tokens were generated
  kStopToken,     // a stop token or stop token sequence (EOS by default) was generated
  kStopSequence,  // a stop sequence appeared; the text is cut before it
  kCancelled,     // a callback returned false
  kContextFull,   // a Session reached the end of the model's context
};
const char* FinishReasonName(FinishReason reason);

struct RequestOptions {
  int64_t max_new_tokens = 256;
  SamplingOptions sampling = {0.8, 50, 1.0};  // temperature, top_k, top_p (LitGPT's order)
  uint64_t seed = 1234;
  // Generation ends at the tokenizer's EOS (when it has one) and at these ids.
  bool stop_at_eos = true;
  std::vector<int64_t> stop_tokens;
  // Id sequences that end generation (a prompt style's stop tokens, some multi-token).
  std::vector<std::vector<int64_t>> stop_token_sequences;
  // Text that ends generation; it is held back from on_text while it may still be forming.
  std::vector<std::string> stop_sequences;
  // The KV cache of the request: dense by default, or a budgeted / quantised one. A window or
  // sink cache with kv_cache.positions = "cache" has no length limit: max_new_tokens may take
  // the stream past the model's block_size in flat memory (cache/policy_kv_cache.h).
  KVCacheSpec kv_cache;
  int64_t prefill_chunk = 0;  // 0: the whole prompt in one step
  // Streaming: called for each generated token and for each piece of final text (never a
  // partial UTF-8 character; all pieces concatenate to Completion::text). Returning false
  // cancels the request (FinishReason::kCancelled), keeping what was produced so far.
  std::function<bool(int64_t token)> on_token;
  std::function<bool(absl::string_view text)> on_text;
  // Log-probabilities of each generated token (Completion::logprobs, and on_logprob as they
  // come): -1 none; 0 the chosen token's; K > 0 also the K most likely tokens of its step.
  // From the model's logits before any bias, penalty or constraint (core/model/next_token.h).
  int64_t top_logprobs = -1;
  // Called with each generated token's log-probabilities just before on_token (with
  // top_logprobs >= 0).
  std::function<void(const TokenLogprob&)> on_logprob;
  // Which tokens may come next: constrained decoding (a grammar, regex or JSON schema over the
  // tokenizer's vocabulary, core/constrain/). One request's own object (it holds the state).
  std::shared_ptr<TokenConstraint> constraint;
  // The per-request LoRA adapter (EngineOptions.adapters) by name; empty: the base model.
  // Equal, per request, to that adapter's model alone. Prefix caching skips adapter requests
  // (their KV entries are the adapter's).
  std::string adapter;
  // on_text first receives the prompt's own text, so that the echoed prompt and the pieces
  // concatenate to the decode of prompt + reply (continuations keep their leading spaces).
  bool echo_prompt = false;
  // Sessions: whether a reply's final stop token stays in the context. Chat layouts whose
  // next-turn text starts with the end-of-turn token (PromptStyle::ContinueChat) say false.
  bool keep_stop_token = true;
  // Speculative decoding (core/speculative/README.md): method "ngram" (prompt lookup) or
  // "draft" (EngineOptions.draft_checkpoint_dir), num_speculative_tokens per step. Greedy
  // output is the same token for token, sampled output has the same distribution; only the
  // speed changes (Completion::stats counts proposed and accepted tokens). Engine::Generate,
  // Session and Submit (the scheduler: speculative rows verify beside plain ones in its
  // steps); GenerateBatch and serving over tensor-parallel ranks refuse it. Over dense, paged
  // or quantised KV caches (budgeted ones are refused: they cannot take rejected entries back).
  SpeculativeSpec speculative;
};

struct Completion {
  std::vector<int64_t> tokens;         // generated ids, the stop token included when one ended it
  std::string text;                    // decoded text of the tokens (empty without a tokenizer)
  std::vector<TokenLogprob> logprobs;  // one per token, with RequestOptions::top_logprobs >= 0
  FinishReason finish_reason = FinishReason::kMaxTokens;
  GenerateStats stats;
  int64_t kv_cache_index_bytes = 0;  // positions and scores beside the entries
};

class Session;
class RequestText;

// A request submitted to an Engine's scheduler. Thread-safe.
class Request {
 public:
  // Ends the request at the next scheduler step (FinishReason::kCancelled, with what was
  // produced so far).
  void Cancel();
  // Blocks until the request ends. Callbacks ran on the scheduler's thread.
  absl::StatusOr<Completion> Wait();
  bool Done() const;
  // After Wait: seconds from Submit to admission, and between consecutive tokens.
  double queue_s() const { return queue_s_; }
  const std::vector<double>& inter_token_s() const { return inter_token_s_; }
  // After Wait: prompt tokens taken from the prefix cache, or copied from another choice's
  // cache (Engine::SubmitChoices); times preempted and recomputed.
  int64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }
  int64_t forked_tokens() const { return forked_tokens_; }
  int64_t preemptions() const { return preemptions_; }

 private:
  friend class Engine;
  Request() = default;

  std::shared_ptr<RequestHandle> handle_;
  std::shared_ptr<RequestText> text_;
  std::mutex mutex_;
  std::optional<absl::StatusOr<Completion>> completion_;
  double queue_s_ = 0;
  std::vector<double> inter_token_s_;
  int64_t prefix_hit_tokens_ = 0;
  int64_t forked_tokens_ = 0;
  int64_t preemptions_ = 0;
};

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  // Loads model_config.yaml, the weights and (when present) the tokenizer of a LitGPT
  // checkpoint directory, or of a fine-tune directory as `finetune` writes it (LoRA, adapter,
  // adapter v2 over the base its hyperparameters.yaml names; its tokenizer, else the base's),
  // with options.loras on top.
  static absl::StatusOr<std::shared_ptr<const Engine>> Load(const std::string& checkpoint_dir,
                                                            const EngineOptions& options = {});
  // Wraps a model built elsewhere (tests, fine-tuned weights); the tokenizer may be null.
  // `draft`: the draft model of RequestOptions.speculative "draft" (its vocabulary is checked
  // when a request uses it).
  static std::shared_ptr<const Engine> FromModel(GPT model,
                                                 std::shared_ptr<const Tokenizer> tokenizer,
                                                 SchedulerOptions serving = {},
                                                 GPT draft = nullptr);
  // Cancels the requests still running through Submit (they end as kCancelled).
  ~Engine();

  // The prompt is encoded as LitGPT does (BOS when the tokenizer's config asks for it).
  // FailedPrecondition without a tokenizer.
  absl::StatusOr<Completion> Generate(absl::string_view prompt,
                                      const RequestOptions& options) const;
  absl::StatusOr<Completion> Generate(const std::vector<int64_t>& prompt,
                                      const RequestOptions& options) const;
  // Prompts of different lengths at once; each row's result equals its own Generate with the
  // same options (streaming callbacks are not called; stop sequences are not supported).
  absl::StatusOr<std::vector<Completion>> GenerateBatch(
      const std::vector<std::vector<int64_t>>& prompts, const RequestOptions& options) const;

  // Continuous batching: the request joins the engine's scheduler (core/serving/scheduler.h),
  // which decodes every running request in one batched step. The completion equals
  // Generate's with the same options (greedy tokens identical), except that a prompt is
  // prefilled in SchedulerOptions.prefill_chunk pieces when prefill_chunk is 0. Checks as
  // Generate's; ResourceExhausted when SchedulerOptions.max_waiting requests wait.
  absl::StatusOr<std::shared_ptr<Request>> Submit(const std::vector<int64_t>& prompt,
                                                  const RequestOptions& options) const;
  absl::StatusOr<std::shared_ptr<Request>> Submit(absl::string_view prompt,
                                                  const RequestOptions& options) const;
  // n choices of one prompt (OpenAI's `n`), submitted together: choice i is `options` with
  // seed + i and its own copy of the constraint (Clone, so give one in its first state), then
  // `per_choice(i, options)` when given (per-choice callbacks). The prompt is prefilled once:
  // with a block pool and prefix caching, dense choices share the prompt's full KV blocks (the
  // first prefills them, the others take them from the prefix cache, as vLLM v1 forks `n`);
  // budgeted and quantised caches (and dense ones without a pool) fork by copy: the first
  // prefills the prompt, each other takes a copy of its cache and last logits and samples its
  // own first token (core/serving/scheduler.h; Request::forked_tokens, and
  // SchedulerStats.forked_choices). Each equals its own Submit alone, tokens and logprobs. A
  // choice whose per_choice changes its cache or prefill_chunk prefills on its own. On an
  // error no choice is submitted. InvalidArgument for n < 1.
  absl::StatusOr<std::vector<std::shared_ptr<Request>>> SubmitChoices(
      const std::vector<int64_t>& prompt, const RequestOptions& options, int64_t n,
      const std::function<void(int64_t choice, RequestOptions& options)>& per_choice =
          nullptr) const;
  // The scheduler's counters.
  SchedulerStats ServingStats() const;
  // Serving over tensor-parallel ranks (EngineOptions.tensor_parallel): rank 0's Submit takes
  // the requests and every other rank calls this, which runs rank 0's requests on this rank's
  // shard step by step (core/serving/step_sync.h) and returns when rank 0's engine goes (OK)
  // or serving fails (a rank gone, a timeout: the error; rank 0's requests in flight fail with
  // it). FailedPrecondition on rank 0 or without ranks.
  absl::Status FollowServing() const;
  // OK while Submit's serving goes on; over ranks, the error that ended it (a rank gone, a
  // timeout: every later Submit fails with it too).
  absl::Status ServingStatus() const;

  // A conversation that keeps its KV cache between calls. `kv_cache` chooses the cache;
  // its context is the model's block_size, unless kv_cache.positions is "cache" (window and
  // sink caches): then the conversation never fills the context. Its sliding-window layers keep
  // kSessionRollbackSlots spare slots, so speculation of up to that many + 1 tokens a step.
  static constexpr int64_t kSessionRollbackSlots = 8;
  absl::StatusOr<std::unique_ptr<Session>> NewSession(const KVCacheSpec& kv_cache = {}) const;

  absl::StatusOr<std::vector<int64_t>> Encode(absl::string_view text) const;

  // Embeddings of token sequences in one batched forward pass: each input's final hidden
  // states (after the final norm) pooled over its tokens, kLast (the last token's, as decoder
  // embedding models such as e5-mistral and gte-Qwen pool) or kMean, scaled to unit length.
  // [inputs, n_embd] float32. Errors: no inputs, an empty input, an id outside the
  // vocabulary, an input past the context (naming `inputs[i]`).
  enum class Pooling { kLast, kMean };
  absl::StatusOr<at::Tensor> Embed(const std::vector<std::vector<int64_t>>& inputs,
                                   Pooling pooling = Pooling::kLast) const;
  const Config& config() const { return model_->config(); }
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  const std::string& checkpoint_dir() const { return checkpoint_dir_; }
  // Notes from loading (LoadedModel::warnings), e.g. a block_size past the trained context.
  const std::vector<std::string>& warnings() const { return warnings_; }
  // The per-request adapters' names (EngineOptions.adapters), by slot.
  const std::vector<std::string>& adapter_names() const { return adapter_names_; }
  // What sizes the scheduler Submit feeds (EngineOptions.serving).
  const SchedulerOptions& serving_options() const { return serving_; }
  GPTImpl& model() const { return *model_; }
  // The draft model (EngineOptions.draft_checkpoint_dir); null without one.
  const GPT& draft_model() const { return draft_; }

 private:
  friend class Session;
  Engine(GPT model, std::shared_ptr<const Tokenizer> tokenizer, std::string checkpoint_dir,
         SchedulerOptions serving);
  // Generate's and Submit's checks of a request; the batch-1 cache it asks for.
  absl::Status CheckRequest(const std::vector<int64_t>& prompt,
                            const RequestOptions& options) const;
  absl::StatusOr<std::unique_ptr<KVCache>> CacheFor(const std::vector<int64_t>& prompt,
                                                    const RequestOptions& options) const;
  // Submit's work before the scheduler: the checks, the request, its cache and generation.
  struct Prepared;
  absl::StatusOr<Prepared> Prepare(const std::vector<int64_t>& prompt,
                                   const RequestOptions& options) const;
  // Positions a request's cache spans.
  int64_t CacheLength(const std::vector<int64_t>& prompt, const RequestOptions& options) const;
  // Started by the first Submit, with the KV memory (core/serving/kv_memory.h) and its block
  // pool when SchedulerOptions.kv_pool_bytes asks for one.
  Scheduler& scheduler() const;
  // Whether Submit serves over tensor-parallel ranks.
  bool ServesOverRanks() const;
  // The cache geometry of this model's requests (batch size and length left to each).
  KVCacheGeometry CacheGeometry() const;
  KVMemoryOptions MemoryOptions() const;
  // `rollback_slots`: KVCacheShape.rollback_slots (speculation of that many tokens over
  // sliding-window layers).
  absl::StatusOr<std::unique_ptr<KVCache>> NewCache(const KVCacheSpec& spec, int64_t batch,
                                                    int64_t length,
                                                    int64_t rollback_slots = 0) const;
  // The proposer of a request's RequestOptions.speculative; null when it asks for none.
  absl::StatusOr<std::shared_ptr<Proposer>> ProposerFor(const RequestOptions& options) const;
  std::vector<int64_t> StopTokens(const RequestOptions& options) const;
  // The slot of options.adapter (-1: the base model); InvalidArgument naming
  // RequestOptions.adapter for a name the engine does not serve.
  absl::StatusOr<int64_t> AdapterSlot(const RequestOptions& options) const;
  // Generates after `prompt` at `start_position` in `cache` with stop sequences, streaming
  // and cancellation; speculatively with `proposer`, which sees `history` (the cache's
  // positions [0, start_position), or nothing) before the prompt.
  absl::StatusOr<Completion> Run(KVCache& cache, int64_t start_position,
                                 const std::vector<int64_t>& prompt, const RequestOptions& options,
                                 absl::Span<const int64_t> stream_context,
                                 std::shared_ptr<Proposer> proposer = nullptr,
                                 std::vector<int64_t> history = {}) const;

  GPT model_;
  GPT draft_;                                      // speculative decoding's draft model, or null
  std::shared_ptr<ProcessGroup> tensor_parallel_;  // EngineOptions.tensor_parallel
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::string checkpoint_dir_;
  std::vector<std::string> warnings_;
  std::vector<std::string> adapter_names_;
  SchedulerOptions serving_;
  KVPoolEntries kv_pool_entries_;  // dtype Undefined: the model's
  mutable std::once_flag scheduler_once_;
  mutable absl::Status pool_error_;  // why the pool could not be made (Submit returns it)
  mutable std::unique_ptr<Scheduler> scheduler_;  // last: stopped before the rest goes
};

// One conversation: a KV cache and the tokens it holds. Not thread-safe itself; many
// Sessions of one Engine run concurrently.
class Session {
 public:
  // Appends `tokens` to the context and generates a reply after them; only the new tokens
  // are prefilled. max_new_tokens is capped to the context left (FinishReason::kContextFull
  // when that cap ends the reply); OutOfRange when the new tokens themselves do not fit,
  // with the session unchanged. With cache positions nothing is capped or refused.
  absl::StatusOr<Completion> Send(const std::vector<int64_t>& tokens,
                                  const RequestOptions& options);
  // Encodes `text` without BOS (a continuation); the first call of a session adds BOS when
  // the tokenizer asks for it.
  absl::StatusOr<Completion> Send(absl::string_view text, const RequestOptions& options);

  // Tokens in the context (cached plus the last reply's final token, fed with the next call).
  int64_t context_tokens() const { return static_cast<int64_t>(history_.size()); }
  int64_t context_left() const;
  // Forgets the conversation; keeps the cache's allocations.
  void Reset();
  int64_t kv_cache_bytes() const { return cache_->AllocatedBytes(); }

 private:
  friend class Engine;
  Session(std::shared_ptr<const Engine> engine, std::unique_ptr<KVCache> cache);

  std::shared_ptr<const Engine> engine_;
  std::unique_ptr<KVCache> cache_;
  std::vector<int64_t> history_;  // every token of the conversation, in order
  int64_t cached_ = 0;            // history_[0, cached_) is in the cache
  // Cache positions (KVCacheSpec.positions = "cache"): how far the cache has moved its entries
  // down; the next token's cache position is cached_ - shifted_.
  int64_t shifted_ = 0;
  // Speculative decoding: the conversation's proposer (a draft keeps its KV cache across
  // turns) and the request settings it was made for.
  std::shared_ptr<Proposer> proposer_;
  std::string proposer_key_;
};

}  // namespace lgpt

#endif  // LGPT_LGPT_H_
