#include "lgpt.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/base/device_memory.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "core/model/checkpoint.h"
#include "core/model/quantize_model.h"
#include "core/speculative/draft_model_proposer.h"

namespace lgpt {
namespace {

// Holds back generated text that may be the start of a stop sequence, so the caller never
// sees part of one.
class StopSequenceFilter {
 public:
  explicit StopSequenceFilter(const std::vector<std::string>& stops) : stops_(stops) {}

  // Adds text; returns what is final. Sets *stopped when a stop sequence appeared (the text
  // from it on is dropped).
  std::string Add(absl::string_view text, bool* stopped) {
    pending_.append(text.data(), text.size());
    size_t cut = std::string::npos;
    for (const std::string& stop : stops_) {
      if (stop.empty()) continue;
      cut = std::min(cut, pending_.find(stop));
    }
    if (cut != std::string::npos) {
      *stopped = true;
      std::string out = pending_.substr(0, cut);
      pending_.clear();
      return out;
    }
    size_t keep = 0;  // longest suffix of pending_ that begins some stop sequence
    for (const std::string& stop : stops_) {
      for (size_t n = std::min(stop.size() - (stop.empty() ? 0 : 1), pending_.size()); n > keep;
           --n) {
        if (pending_.compare(pending_.size() - n, n, stop, 0, n) == 0) {
          keep = n;
          break;
        }
      }
    }
    std::string out = pending_.substr(0, pending_.size() - keep);
    pending_.erase(0, pending_.size() - keep);
    return out;
  }

  std::string Rest() { return std::exchange(pending_, std::string()); }

 private:
  const std::vector<std::string>& stops_;
  std::string pending_;
};

// The messages say "max_new_tokens" of RequestOptions.max_new_tokens.
FieldRef MaxNewTokens() { return FieldRef("RequestOptions.max_new_tokens", "max_new_tokens"); }

absl::Status MaxNewTokensBelowOne(int64_t max_new_tokens) {
  return InvalidFieldError(MaxNewTokens(),
                           absl::StrCat("max_new_tokens must be >= 1, got ", max_new_tokens));
}

// Generate's speculation errors in the request's terms (RequestOptions.speculative).
absl::Status InRequestTerms(const absl::Status& status) {
  return RenameField(RenameField(status, "GenerateOptions.speculative.k",
                                 "SpeculativeSpec.num_speculative_tokens"),
                     "GenerateOptions.speculative", "SpeculativeSpec.method");
}

// Tokens a request proposes per step (0 without speculation).
int64_t SpeculativeTokens(const RequestOptions& options) {
  return options.speculative.enabled() ? options.speculative.num_speculative_tokens : 0;
}

// Speculative decoding runs in Generate, Session and the scheduler, not in GenerateBatch.
absl::Status RefuseSpeculation(const RequestOptions& options, absl::string_view where) {
  if (!options.speculative.enabled()) return absl::OkStatus();
  return FieldError(absl::StatusCode::kUnimplemented, "SpeculativeSpec.method",
                    absl::StrCat("SpeculativeSpec.method=", options.speculative.method,
                                 ": speculative decoding runs in Engine::Generate and Session, not "
                                 "yet in ",
                                 where));
}

// Whether a draft's tokenizer is the model's: the same token bytes and special ids.
absl::Status CheckDraftTokenizer(const Tokenizer* model, const Tokenizer* draft,
                                 const std::string& draft_dir) {
  const std::string field = "EngineOptions.draft_checkpoint_dir";
  if (model == nullptr && draft == nullptr) return absl::OkStatus();  // ids only: vocab_size
  if (model == nullptr || draft == nullptr) {
    return InvalidFieldError(
        field, absl::StrCat(field, " ", draft_dir, ": ", model ? "the draft" : "the model",
                            " has no tokenizer to compare with the other's (a draft must share "
                            "the model's tokenizer)"));
  }
  const std::vector<std::string> ours = model->VocabularyBytes();
  const std::vector<std::string> theirs = draft->VocabularyBytes();
  std::string difference;
  if (ours.size() != theirs.size()) {
    difference = absl::StrCat("it has ", theirs.size(), " tokens, the model's ", ours.size());
  } else if (model->bos_id() != draft->bos_id() || model->eos_id() != draft->eos_id()) {
    difference = "its BOS or EOS id differs";
  } else {
    for (size_t id = 0; id < ours.size(); ++id) {
      if (ours[id] != theirs[id]) {
        difference = absl::StrCat("token ", id, " is ", absl::CHexEscape(theirs[id]), " there and ",
                                  absl::CHexEscape(ours[id]), " in the model");
        break;
      }
    }
  }
  if (difference.empty()) return absl::OkStatus();
  return InvalidFieldError(
      field,
      absl::StrCat(field, " ", draft_dir, ": the draft's tokenizer differs from the model's (",
                   difference, "): a draft must share the model's tokenizer"));
}

// A checkpoint's tokenizer: null when it has none, an error when one is malformed.
absl::StatusOr<std::shared_ptr<const Tokenizer>> LoadTokenizer(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> loaded = absl::NotFoundError("");
  for (const std::string& candidate : CheckpointFileDirs(dir)) {
    loaded = Tokenizer::Load(candidate);
    if (!absl::IsNotFound(loaded.status())) break;
  }
  if (loaded.ok()) return std::shared_ptr<const Tokenizer>(*std::move(loaded));
  // Present but malformed: say so rather than ignore it.
  if (!absl::IsNotFound(loaded.status())) return loaded.status();
  return std::shared_ptr<const Tokenizer>();
}

absl::Status CheckIds(const std::vector<int64_t>& ids, int64_t vocab, absl::string_view what) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::OutOfRangeError(absl::StrCat(what, ": token id ", ids[i], " at index ", i,
                                                " is outside the vocabulary of ", vocab));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kMaxTokens:
      return "max_tokens";
    case FinishReason::kStopToken:
      return "stop_token";
    case FinishReason::kStopSequence:
      return "stop_sequence";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kContextFull:
      return "context_full";
  }
  return "unknown";
}

Engine::Engine(GPT model, std::shared_ptr<const Tokenizer> tokenizer, std::string checkpoint_dir,
               SchedulerOptions serving)
    : model_(std::move(model)),
      tokenizer_(std::move(tokenizer)),
      checkpoint_dir_(std::move(checkpoint_dir)),
      serving_(serving) {}

Engine::~Engine() = default;

namespace {

// EngineOptions.kv_pool_memory_fraction's rules, before anything loads.
absl::Status CheckPoolMemoryFraction(const EngineOptions& options) {
  const double fraction = options.kv_pool_memory_fraction;
  if (fraction == 0) return absl::OkStatus();
  const char* const field = "EngineOptions.kv_pool_memory_fraction";
  if (!(fraction > 0 && fraction < 1)) {  // NaN too
    return InvalidFieldError(
        field,
        absl::StrCat("EngineOptions.kv_pool_memory_fraction must be in (0, 1), got ", fraction));
  }
  if (options.serving.kv_pool_bytes > 0) {
    return InvalidFieldError(field,
                             "EngineOptions.kv_pool_memory_fraction sizes the KV pool: not with "
                             "SchedulerOptions.kv_pool_bytes",
                             {"SchedulerOptions.kv_pool_bytes"});
  }
  return absl::OkStatus();
}

// The KV pool bytes EngineOptions.kv_pool_memory_fraction buys on `device` now. Over
// tensor-parallel ranks (`group`, every rank calling) the least of the ranks' free memory, so
// that every rank makes the same pool; a rank that cannot read its memory fails them all.
absl::StatusOr<int64_t> PoolBytesOfFreeMemory(double fraction, const c10::Device& device,
                                              ProcessGroup* group) {
  absl::StatusOr<int64_t> free = FreeDeviceMemoryBytes(device);
  if (group != nullptr && group->world_size() > 1) {
    ASSIGN_OR_RETURN(const at::Tensor all,  // [world_size], -1 where a rank failed
                     group->AllGather(at::full({1}, free.ok() ? *free : -1, at::kLong)));
    if (!free.ok()) return free.status();
    free = all.min().item<int64_t>();
    if (*free < 0) {
      return absl::FailedPreconditionError(
          "EngineOptions.kv_pool_memory_fraction: another tensor-parallel rank cannot read its "
          "free memory");
    }
  }
  if (!free.ok()) return free.status();
  return static_cast<int64_t>(fraction * static_cast<double>(*free));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Engine>> Engine::Load(const std::string& checkpoint_dir,
                                                           const EngineOptions& options) {
  RETURN_IF_ERROR(options.serving.Validate());  // before the expensive part
  RETURN_IF_ERROR(CheckPoolMemoryFraction(options));
  ASSIGN_OR_RETURN(const KVPoolEntries kv_pool_entries,
                   KVPoolEntriesFor(options.kv_pool_dtype, options.dtype, options.device,
                                    "EngineOptions.kv_pool_dtype"));
  LoadOptions load;
  load.dtype = options.dtype;
  load.device = options.device;
  load.progress = options.progress;
  load.verify_checksums = options.verify_checksums;
  WeightQuantization quantize = options.quantize;
  if (options.quantize_int8) {
    if (quantize == WeightQuantization::kInt4) {
      return InvalidFieldError(
          "EngineOptions.quantize_int8",
          "EngineOptions.quantize_int8 and EngineOptions.quantize int4 contradict each other",
          {FieldRef("EngineOptions.quantize", "EngineOptions.quantize int4")});
    }
    quantize = WeightQuantization::kInt8;
  }
  if (quantize != WeightQuantization::kNone) {
    // The mentions name the values too ("EngineOptions.dtype float32"): a tool shows its flag
    // with the value it takes.
    const std::string quantize_text =
        absl::StrCat("EngineOptions.quantize ", WeightQuantizationName(quantize));
    if (options.device.is_cpu() && options.dtype != c10::kFloat) {
      return InvalidFieldError(
          FieldRef("EngineOptions.quantize", quantize_text),
          absl::StrCat(quantize_text,
                       " needs EngineOptions.dtype float32 on the CPU (quantised weights run there "
                       "with float32 activations; a CUDA device takes any dtype)"),
          {FieldRef("EngineOptions.dtype", "EngineOptions.dtype float32")});
    }
    if (!options.device.is_cpu() && !options.device.is_cuda()) {
      return InvalidFieldError(
          FieldRef("EngineOptions.quantize", quantize_text),
          absl::StrCat(quantize_text, " needs a CPU or CUDA EngineOptions.device, got ",
                       options.device.str()),
          {FieldRef("EngineOptions.device", "EngineOptions.device")});
    }
    load.parts = QuantizedModelParts(quantize);
  }
  if (!options.adapters.empty() && !options.loras.empty()) {
    return InvalidFieldError("EngineOptions.adapters",
                             "EngineOptions.adapters serve over the checkpoint itself: not with "
                             "EngineOptions.loras",
                             {"EngineOptions.loras"});
  }
  if (options.tensor_parallel && options.tensor_parallel->world_size() > 1) {
    // Quantised weights shard as dense ones do (each rank quantises its own slices), LoRA
    // adapters (static or per request) by ShardLoraTensors.
    load.tensor_parallel = options.tensor_parallel;
  }
  std::vector<std::string> adapter_names;
  absl::StatusOr<LoadedModel> loaded_or = absl::UnknownError("not loaded");
  if (options.adapters.empty()) {
    loaded_or = LoadModelWithPeft(checkpoint_dir, options.loras, load, "EngineOptions.loras");
  } else {
    absl::StatusOr<MultiLoraModel> multi =
        LoadMultiLoraModel(checkpoint_dir, options.adapters, load, "EngineOptions.adapters");
    if (multi.ok()) {
      adapter_names = multi->adapter_names;
      loaded_or = std::move(multi->loaded);
    } else {
      loaded_or = multi.status();
    }
  }
  if (!loaded_or.ok()) {  // Name the option the caller set.
    return RenameField(loaded_or.status(), "LoadOptions.verify_checksums",
                       "EngineOptions.verify_checksums");
  }
  ASSIGN_OR_RETURN(LoadedModel loaded, std::move(loaded_or));
  if (quantize != WeightQuantization::kNone) {
    if (options.progress) {
      options.progress(
          absl::StrCat("quantising projections to ", WeightQuantizationName(quantize)));
    }
    RETURN_IF_ERROR(QuantizeModel(*loaded.model));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const Tokenizer> tokenizer, LoadTokenizer(checkpoint_dir));
  if (tokenizer) RETURN_IF_ERROR(tokenizer->CheckFitsVocabulary(loaded.config.PaddedVocabSize()));
  GPT draft;
  if (!options.draft_checkpoint_dir.empty()) {
    const std::string field = "EngineOptions.draft_checkpoint_dir";
    if (options.tensor_parallel && options.tensor_parallel->world_size() > 1) {
      return FieldError(absl::StatusCode::kUnimplemented, field,
                        absl::StrCat(field,
                                     " does not combine with EngineOptions.tensor_parallel "
                                     "yet"),
                        {"EngineOptions.tensor_parallel"});
    }
    if (options.progress) options.progress("loading the draft model");
    LoadOptions draft_load = load;
    draft_load.tensor_parallel = nullptr;
    absl::StatusOr<LoadedModel> loaded_draft =
        LoadCheckpoint(options.draft_checkpoint_dir, draft_load);
    if (!loaded_draft.ok()) {
      return WithFields(
          WithMessage(loaded_draft.status(), absl::StrCat(field, " ", options.draft_checkpoint_dir,
                                                          ": ", loaded_draft.status().message())),
          field);
    }
    RETURN_IF_ERROR(CheckDraftVocabulary(loaded.config, loaded_draft->config, field));
    ASSIGN_OR_RETURN(std::shared_ptr<const Tokenizer> draft_tokenizer,
                     LoadTokenizer(options.draft_checkpoint_dir));
    RETURN_IF_ERROR(
        CheckDraftTokenizer(tokenizer.get(), draft_tokenizer.get(), options.draft_checkpoint_dir));
    if (quantize != WeightQuantization::kNone) RETURN_IF_ERROR(QuantizeModel(*loaded_draft->model));
    draft = loaded_draft->model;
  }
  SchedulerOptions serving = options.serving;
  if (options.kv_pool_memory_fraction > 0) {
    ASSIGN_OR_RETURN(serving.kv_pool_bytes,
                     PoolBytesOfFreeMemory(options.kv_pool_memory_fraction, loaded.model->device(),
                                           options.tensor_parallel.get()));
  }
  std::shared_ptr<Engine> engine(
      new Engine(std::move(loaded.model), std::move(tokenizer), checkpoint_dir, serving));
  engine->draft_ = std::move(draft);
  engine->tensor_parallel_ = options.tensor_parallel;
  engine->kv_pool_entries_ = kv_pool_entries;
  engine->warnings_ = std::move(loaded.warnings);
  engine->adapter_names_ = std::move(adapter_names);
  if (serving.kv_pool_bytes > 0) {
    // Refused now, not at every Submit.
    absl::Status pool =
        KVMemory::PoolFor(engine->CacheGeometry(), engine->MemoryOptions()).status();
    if (!pool.ok() && options.kv_pool_memory_fraction > 0) {
      pool = RenameField(pool, "SchedulerOptions.kv_pool_bytes",
                         "EngineOptions.kv_pool_memory_fraction");
    }
    RETURN_IF_ERROR(pool);
  }
  return std::shared_ptr<const Engine>(std::move(engine));
}

std::shared_ptr<const Engine> Engine::FromModel(GPT model,
                                                std::shared_ptr<const Tokenizer> tokenizer,
                                                SchedulerOptions serving, GPT draft) {
  std::shared_ptr<Engine> engine(new Engine(std::move(model), std::move(tokenizer), "", serving));
  engine->draft_ = std::move(draft);
  return engine;
}

absl::StatusOr<std::vector<int64_t>> Engine::Encode(absl::string_view text) const {
  if (!tokenizer_) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", checkpoint_dir_, " has no tokenizer; give token ids"));
  }
  return tokenizer_->Encode(text);
}

absl::StatusOr<at::Tensor> Engine::Embed(const std::vector<std::vector<int64_t>>& inputs,
                                         Pooling pooling) const {
  if (inputs.empty()) return InvalidFieldError("inputs", "no inputs to embed");
  int64_t longest = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string field = absl::StrCat("inputs[", i, "]");
    if (inputs[i].empty()) return InvalidFieldError(field, absl::StrCat(field, " is empty"));
    RETURN_IF_ERROR(WithFields(CheckIds(inputs[i], config().PaddedVocabSize(), field), field));
    if (static_cast<int64_t>(inputs[i].size()) > config().block_size) {
      return FieldError(
          absl::StatusCode::kOutOfRange, field,
          absl::StrCat(field, " (", inputs[i].size(), " tokens) exceeds the context of ",
                       config().block_size, " tokens"));
    }
    longest = std::max<int64_t>(longest, inputs[i].size());
  }
  // Right-padded: attention is causal, so padding after a sequence changes none of its states.
  const int64_t rows = static_cast<int64_t>(inputs.size());
  at::Tensor ids = at::zeros({rows, longest}, at::kLong);  // [B, T]
  for (int64_t row = 0; row < rows; ++row) {
    std::copy(inputs[row].begin(), inputs[row].end(), ids.data_ptr<int64_t>() + row * longest);
  }
  at::NoGradGuard no_grad;
  ForwardOptions forward;
  forward.hidden_states = true;
  ASSIGN_OR_RETURN(const at::Tensor states, model_->Forward(ids.to(model_->device()), nullptr,
                                                            forward));  // [B, T, n_embd]
  const at::Tensor hidden = states.to(at::kFloat).cpu();
  at::Tensor pooled = at::empty({rows, hidden.size(2)}, at::kFloat);  // [B, n_embd]
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t length = static_cast<int64_t>(inputs[row].size());
    pooled[row] = pooling == Pooling::kLast ? hidden[row][length - 1]
                                            : hidden[row].narrow(0, 0, length).mean(0);
  }
  return pooled / pooled.norm(2, -1, /*keepdim=*/true).clamp_min(1e-12);
}

absl::StatusOr<std::unique_ptr<KVCache>> Engine::NewCache(const KVCacheSpec& spec, int64_t batch,
                                                          int64_t length,
                                                          int64_t rollback_slots) const {
  KVCacheShape shape;
  static_cast<KVCacheGeometry&>(shape) = CacheGeometry();
  shape.batch_size = batch;
  shape.max_sequence_length = length;
  shape.rollback_slots = rollback_slots;
  return MakeKVCache(spec, shape);
}

absl::StatusOr<std::shared_ptr<Proposer>> Engine::ProposerFor(const RequestOptions& options) const {
  return MakeProposer(options.speculative, config(), draft_, options.sampling, options.seed);
}

std::vector<int64_t> Engine::StopTokens(const RequestOptions& options) const {
  std::vector<int64_t> stops = options.stop_tokens;
  for (const std::vector<int64_t>& sequence : options.stop_token_sequences) {
    if (sequence.size() == 1) stops.push_back(sequence[0]);
  }
  if (options.stop_at_eos && tokenizer_ && tokenizer_->eos_id()) {
    stops.push_back(*tokenizer_->eos_id());
  }
  return stops;
}

// A request's generation settings from `start_position`; RequestText adds its stop tokens
// and streaming callback.
GenerateOptions GenerationSettings(const RequestOptions& options, int64_t start_position) {
  GenerateOptions generate;
  generate.max_new_tokens = options.max_new_tokens;
  generate.sampling = options.sampling;
  generate.seed = options.seed;
  generate.prefill_chunk = options.prefill_chunk;
  generate.start_position = start_position;
  generate.top_logprobs = options.top_logprobs;
  generate.constraint = options.constraint;
  return generate;
}

// The text side of one request, shared by Run (batch-1, synchronous) and Submit (through the
// scheduler): streaming decode, stop sequences and stop token sequences, the finish reason.
class RequestText {
 public:
  // `adapter`: the slot of options.adapter (Engine::AdapterSlot).
  RequestText(std::shared_ptr<const Tokenizer> tokenizer, const RequestOptions& options,
              std::vector<int64_t> stops, int64_t adapter = -1)
      : tokenizer_(std::move(tokenizer)),
        options_(options),
        stops_(std::move(stops)),
        adapter_(adapter),
        filter_(options_.stop_sequences) {}

  // Primes the decoder on the text before the reply (and echoes it when asked). False when
  // the echo callback cancelled the request.
  absl::StatusOr<bool> Prime(absl::Span<const int64_t> context) {
    if (!tokenizer_) return true;
    stream_ = std::make_unique<StreamingDecoder>(*tokenizer_);
    ASSIGN_OR_RETURN(std::string prompt_text, stream_->Prime(context));
    if (options_.echo_prompt && options_.on_text && !prompt_text.empty() &&
        !options_.on_text(prompt_text)) {
      cancelled_ = true;
    }
    return !cancelled_;
  }

  // Generate's on_logprob: kept for the completion, passed on.
  void OnLogprob(const TokenLogprob& logprob) {
    result_.logprobs.push_back(logprob);
    if (options_.on_logprob) options_.on_logprob(logprob);
  }

  // Generate's on_token: false ends the request.
  bool OnToken(int64_t token) {
    if (options_.on_token && !options_.on_token(token)) {
      cancelled_ = true;
      return false;
    }
    generated_.push_back(token);
    for (const std::vector<int64_t>& sequence : options_.stop_token_sequences) {
      if (sequence.size() > 1 && generated_.size() >= sequence.size() &&
          std::equal(sequence.rbegin(), sequence.rend(), generated_.rbegin())) {
        stopped_by_tokens_ = true;
      }
    }
    if (!stream_) return !stopped_by_tokens_;
    absl::StatusOr<std::string> piece = stream_->Push(token);
    if (!piece.ok()) {
      decode_error_ = piece.status();
      return false;
    }
    const std::string text = filter_.Add(*piece, &stopped_by_sequence_);
    return Emit(text) && !stopped_by_sequence_ && !stopped_by_tokens_;
  }

  // The completion of `tokens` (what generation returned); `cancelled`: ended from outside.
  absl::StatusOr<Completion> Finish(std::vector<int64_t> tokens, const GenerateStats& stats,
                                    int64_t index_bytes, bool cancelled = false) {
    RETURN_IF_ERROR(decode_error_);
    cancelled_ = cancelled_ || cancelled;
    if (stream_ && !cancelled_ && !stopped_by_sequence_) {
      const std::string text = filter_.Add(stream_->Flush(), &stopped_by_sequence_);
      Emit(text);
      if (!stopped_by_sequence_) Emit(filter_.Rest());
    }
    result_.tokens = std::move(tokens);
    result_.stats = stats;
    result_.kv_cache_index_bytes = index_bytes;
    if (cancelled_) {
      result_.finish_reason = FinishReason::kCancelled;
    } else if (stopped_by_sequence_) {
      result_.finish_reason = FinishReason::kStopSequence;
    } else if (stopped_by_tokens_ || (options_.constraint && options_.constraint->Done()) ||
               (!result_.tokens.empty() &&
                std::find(stops_.begin(), stops_.end(), result_.tokens.back()) != stops_.end())) {
      result_.finish_reason = FinishReason::kStopToken;
    } else {
      result_.finish_reason = FinishReason::kMaxTokens;
    }
    return std::move(result_);
  }

  // Generate's options for this request, whose callbacks call OnToken and OnLogprob on this
  // object through `self` (a pointer or a shared_ptr that keeps it alive).
  template <typename Self>
  static GenerateOptions Generation(Self self, int64_t start_position) {
    GenerateOptions generate = GenerationSettings(self->options_, start_position);
    generate.stop_tokens = self->stops_;
    generate.adapter = self->adapter_;
    generate.on_token = [self](int64_t token) { return self->OnToken(token); };
    if (self->options_.top_logprobs >= 0) {
      generate.on_logprob = [self](const TokenLogprob& logprob) { self->OnLogprob(logprob); };
    }
    return generate;
  }

 private:
  bool Emit(const std::string& text) {
    if (text.empty()) return true;
    result_.text += text;
    if (options_.on_text && !options_.on_text(text)) cancelled_ = true;
    return !cancelled_;
  }

  std::shared_ptr<const Tokenizer> tokenizer_;
  const RequestOptions options_;
  const std::vector<int64_t> stops_;
  const int64_t adapter_;
  std::unique_ptr<StreamingDecoder> stream_;
  StopSequenceFilter filter_;
  std::vector<int64_t> generated_;
  bool cancelled_ = false, stopped_by_sequence_ = false, stopped_by_tokens_ = false;
  absl::Status decode_error_;
  Completion result_;
};

absl::StatusOr<Completion> Engine::Run(KVCache& cache, int64_t start_position,
                                       const std::vector<int64_t>& prompt,
                                       const RequestOptions& options,
                                       absl::Span<const int64_t> stream_context,
                                       std::shared_ptr<Proposer> proposer,
                                       std::vector<int64_t> history) const {
  RETURN_IF_ERROR(CheckIds(prompt, config().PaddedVocabSize(), "prompt"));
  // A streaming callback that throws ends this request with an error, as through Submit (the
  // scheduler's "on_token threw"), instead of unwinding through the caller.
  try {
    ASSIGN_OR_RETURN(const int64_t adapter, AdapterSlot(options));
    RequestText text(tokenizer_, options, StopTokens(options), adapter);
    ASSIGN_OR_RETURN(const bool go_on, text.Prime(stream_context));
    if (!go_on) return text.Finish({}, GenerateStats(), 0, /*cancelled=*/true);
    GenerateStats stats;
    GenerateOptions generate = RequestText::Generation(&text, start_position);
    if (proposer != nullptr) {
      generate.speculative.proposer = std::move(proposer);
      generate.speculative.k = options.speculative.num_speculative_tokens;
      generate.speculative.history = std::move(history);
    }
    absl::StatusOr<std::vector<int64_t>> tokens =
        lgpt::Generate(*model_, cache, prompt, generate, &stats);
    if (!tokens.ok()) return InRequestTerms(tokens.status());
    return text.Finish(*std::move(tokens), stats, cache.IndexBytes());
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("a streaming callback threw: ", e.what()));
  } catch (...) {
    return absl::InternalError("a streaming callback threw");
  }
}

// ---------------------------------------------------------------------------------------
// Requests through the scheduler.

void Request::Cancel() { handle_->Cancel(); }

bool Request::Done() const { return handle_->Done(); }

absl::StatusOr<Completion> Request::Wait() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!completion_) {
    absl::StatusOr<RequestResult> result = handle_->Wait();
    if (!result.ok()) {
      completion_ = result.status();
    } else {
      queue_s_ = result->queue_s;
      inter_token_s_ = result->inter_token_s;
      prefix_hit_tokens_ = result->prefix_hit_tokens;
      forked_tokens_ = result->forked_tokens;
      preemptions_ = result->preemptions;
      completion_ = text_->Finish(std::move(result->tokens), result->stats,
                                  result->kv_cache_index_bytes, result->cancelled);
    }
  }
  return *completion_;
}

namespace {

// Serving over ranks: a request's cache as the other ranks make it (its spec and length), one
// `key=value` line a field.
std::string EncodeCacheRecipe(const KVCacheSpec& spec, int64_t length, int64_t rollback_slots) {
  return absl::StrCat(
      "policy=", spec.policy, "\nbudget=", spec.budget, "\nbits=", spec.bits,
      "\nsink_tokens=", spec.sink_tokens,
      "\nrecent_fraction=", absl::StrFormat("%.17g", spec.recent_fraction),
      "\ngrace_period=", spec.grace_period, "\nnormalize_scores=", spec.normalize_scores ? 1 : 0,
      "\nquant_weight=", absl::StrFormat("%.17g", spec.quant_weight),
      "\nbudget_rule=", spec.budget_rule, "\nresidual=", spec.residual,
      "\ngroup_size=", spec.group_size, "\nread_chunk=", spec.read_chunk,
      "\npositions=", spec.positions, "\nlength=", length, "\nrollback_slots=", rollback_slots);
}

absl::Status DecodeCacheRecipe(absl::string_view recipe, KVCacheSpec* spec, int64_t* length,
                               int64_t* rollback_slots) {
  int fields = 0;
  for (absl::string_view line : absl::StrSplit(recipe, '\n')) {
    const std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(line, '=');
    const absl::string_view key = kv.first, value = kv.second;
    bool ok = true;
    int64_t flag = 0;
    if (key == "policy") {
      spec->policy = std::string(value);
    } else if (key == "budget") {
      ok = absl::SimpleAtoi(value, &spec->budget);
    } else if (key == "bits") {
      ok = absl::SimpleAtoi(value, &spec->bits);
    } else if (key == "sink_tokens") {
      ok = absl::SimpleAtoi(value, &spec->sink_tokens);
    } else if (key == "recent_fraction") {
      ok = absl::SimpleAtod(value, &spec->recent_fraction);
    } else if (key == "grace_period") {
      ok = absl::SimpleAtoi(value, &spec->grace_period);
    } else if (key == "normalize_scores") {
      ok = absl::SimpleAtoi(value, &flag);
      spec->normalize_scores = flag != 0;
    } else if (key == "quant_weight") {
      ok = absl::SimpleAtod(value, &spec->quant_weight);
    } else if (key == "budget_rule") {
      spec->budget_rule = std::string(value);
    } else if (key == "residual") {
      ok = absl::SimpleAtoi(value, &spec->residual);
    } else if (key == "group_size") {
      ok = absl::SimpleAtoi(value, &spec->group_size);
    } else if (key == "read_chunk") {
      ok = absl::SimpleAtoi(value, &spec->read_chunk);
    } else if (key == "positions") {
      spec->positions = std::string(value);
    } else if (key == "length") {
      ok = absl::SimpleAtoi(value, length);
    } else if (key == "rollback_slots") {
      ok = absl::SimpleAtoi(value, rollback_slots);
    } else {
      ok = false;
    }
    if (!ok) return absl::InvalidArgumentError(absl::StrCat("cache recipe: bad line '", line, "'"));
    ++fields;
  }
  if (fields != 15) {
    return absl::InvalidArgumentError(absl::StrCat("cache recipe: ", fields, " fields, not 15"));
  }
  return absl::OkStatus();
}

}  // namespace

Scheduler& Engine::scheduler() const {
  std::call_once(scheduler_once_, [this] {
    absl::StatusOr<std::unique_ptr<KVMemory>> memory =
        KVMemory::Create(CacheGeometry(), MemoryOptions());
    if (!memory.ok()) {
      pool_error_ = memory.status();
      memory = std::make_unique<KVMemory>(nullptr, serving_.prefix_caching);
    }
    if (!ServesOverRanks()) {
      scheduler_ = std::make_unique<Scheduler>(model_, serving_, *std::move(memory));
      return;
    }
    // Over ranks: rank 0 leads, the others follow its steps (core/serving/step_sync.h) and
    // make each request's cache from its recipe in their own memory.
    const KVCacheGeometry geometry = CacheGeometry();
    ReplicaCacheFactory caches =
        [geometry](const ReplicaRequest& request,
                   const KVMemory& memory) -> absl::StatusOr<std::unique_ptr<KVCache>> {
      KVCacheSpec spec;
      int64_t length = 0, rollback_slots = 0;
      RETURN_IF_ERROR(DecodeCacheRecipe(request.cache_recipe, &spec, &length, &rollback_slots));
      return memory.NewCache(spec, geometry, length, rollback_slots);
    };
    scheduler_ =
        std::make_unique<Scheduler>(model_, serving_, *std::move(memory),
                                    ProcessGroupStepSync(tensor_parallel_), std::move(caches));
  });
  return *scheduler_;
}

bool Engine::ServesOverRanks() const {
  return tensor_parallel_ != nullptr && tensor_parallel_->world_size() > 1;
}

absl::Status Engine::ServingStatus() const {
  if (!pool_error_.ok()) return pool_error_;
  return scheduler().SyncStatus();
}

absl::Status Engine::FollowServing() const {
  if (!ServesOverRanks() || tensor_parallel_->rank() == 0) {
    return absl::FailedPreconditionError(
        "FollowServing is for ranks other than 0 of an engine over EngineOptions.tensor_parallel");
  }
  if (!pool_error_.ok()) return pool_error_;
  return scheduler().Follow();
}

KVCacheGeometry Engine::CacheGeometry() const {
  KVCacheGeometry geometry;
  geometry.layers = model_->CacheLayout();
  geometry.dtype = model_->dtype();
  geometry.device = model_->device();
  return geometry;
}

KVMemoryOptions Engine::MemoryOptions() const {
  KVMemoryOptions options;
  options.pool_bytes = serving_.kv_pool_bytes;
  options.entries_per_block = serving_.kv_block_size;
  options.prefix_caching = serving_.prefix_caching;
  options.entry_dtype = kv_pool_entries_.dtype;
  options.entry_bits = kv_pool_entries_.bits;
  return options;
}

struct Engine::Prepared {
  std::shared_ptr<Request> request;  // its handle not yet set
  std::unique_ptr<KVCache> cache;
  std::string cache_recipe;  // serving over ranks: what the other ranks make their cache from
  GenerateOptions generate;
  bool go_on = true;  // false: the echoed prompt's on_text cancelled it
};

absl::StatusOr<Engine::Prepared> Engine::Prepare(const std::vector<int64_t>& prompt,
                                                 const RequestOptions& options) const {
  RETURN_IF_ERROR(CheckRequest(prompt, options));
  const KVMemory& memory = scheduler().memory();
  if (!pool_error_.ok()) return pool_error_;
  Prepared prepared;
  const int64_t length = CacheLength(prompt, options);
  ASSIGN_OR_RETURN(prepared.cache, memory.NewCache(options.kv_cache, CacheGeometry(), length,
                                                   SpeculativeTokens(options)));
  if (ServesOverRanks()) {
    prepared.cache_recipe = EncodeCacheRecipe(options.kv_cache, length, SpeculativeTokens(options));
  }
  ASSIGN_OR_RETURN(const int64_t adapter, AdapterSlot(options));
  auto text = std::make_shared<RequestText>(tokenizer_, options, StopTokens(options), adapter);
  prepared.request.reset(new Request());
  prepared.request->text_ = text;
  ASSIGN_OR_RETURN(prepared.go_on, text->Prime(prompt));
  // The scheduler's callback keeps the text state alive on its own.
  prepared.generate = RequestText::Generation(text, 0);
  // Each request (each choice of n) its own proposer: a draft's keeps a KV cache.
  ASSIGN_OR_RETURN(prepared.generate.speculative.proposer, ProposerFor(options));
  prepared.generate.speculative.k = SpeculativeTokens(options);
  return prepared;
}

absl::StatusOr<std::shared_ptr<Request>> Engine::Submit(const std::vector<int64_t>& prompt,
                                                        const RequestOptions& options) const {
  ASSIGN_OR_RETURN(Prepared prepared, Prepare(prompt, options));
  std::shared_ptr<Request>& request = prepared.request;
  absl::StatusOr<std::shared_ptr<RequestHandle>> handle =
      scheduler().Submit(prompt, std::move(prepared.generate), std::move(prepared.cache),
                         std::move(prepared.cache_recipe));
  if (!handle.ok()) return InRequestTerms(handle.status());
  request->handle_ = *std::move(handle);
  if (!prepared.go_on) request->handle_->Cancel();
  return request;
}

absl::StatusOr<std::shared_ptr<Request>> Engine::Submit(absl::string_view prompt,
                                                        const RequestOptions& options) const {
  ASSIGN_OR_RETURN(std::vector<int64_t> ids, Encode(prompt));
  if (ids.empty()) return absl::InvalidArgumentError("the prompt encodes to no tokens");
  return Submit(ids, options);
}

absl::StatusOr<std::vector<std::shared_ptr<Request>>> Engine::SubmitChoices(
    const std::vector<int64_t>& prompt, const RequestOptions& options, int64_t n,
    const std::function<void(int64_t, RequestOptions&)>& per_choice) const {
  if (n < 1) {
    return InvalidFieldError(FieldRef("SubmitChoices.n", "n"),
                             absl::StrCat("n must be >= 1, got ", n));
  }
  RETURN_IF_ERROR(CheckRequest(prompt, options));
  // Every choice's options first: the constraint is cloned before the first choice runs.
  std::vector<RequestOptions> each(static_cast<size_t>(n), options);
  for (int64_t i = 0; i < n; ++i) {
    RequestOptions& choice = each[static_cast<size_t>(i)];
    choice.seed = options.seed + static_cast<uint64_t>(i);
    if (options.constraint) choice.constraint = options.constraint->Clone();
    if (per_choice) per_choice(i, choice);
  }
  // Submitted together (core/serving/scheduler.h): the first prefills the prompt for the others.
  std::vector<Prepared> prepared;
  std::vector<GenerateOptions> generates;
  std::vector<std::unique_ptr<KVCache>> caches;
  std::vector<std::string> recipes;
  for (const RequestOptions& choice : each) {
    ASSIGN_OR_RETURN(Prepared one, Prepare(prompt, choice));
    generates.push_back(std::move(one.generate));
    caches.push_back(std::move(one.cache));
    recipes.push_back(std::move(one.cache_recipe));
    prepared.push_back(std::move(one));
  }
  absl::StatusOr<std::vector<std::shared_ptr<RequestHandle>>> handles = scheduler().SubmitChoices(
      prompt, std::move(generates), std::move(caches), std::move(recipes));
  if (!handles.ok()) return InRequestTerms(handles.status());
  std::vector<std::shared_ptr<Request>> choices;
  for (size_t i = 0; i < prepared.size(); ++i) {
    std::shared_ptr<Request>& request = prepared[i].request;
    request->handle_ = (*handles)[i];
    if (!prepared[i].go_on) request->handle_->Cancel();
    choices.push_back(std::move(request));
  }
  return choices;
}

absl::StatusOr<int64_t> Engine::AdapterSlot(const RequestOptions& options) const {
  absl::StatusOr<int64_t> slot = AdapterSlotByName(adapter_names_, options.adapter);
  if (slot.ok()) return slot;
  return InvalidFieldError(
      "RequestOptions.adapter",
      adapter_names_.empty()
          ? absl::StrCat("RequestOptions.adapter '", options.adapter,
                         "': the engine serves no adapters (EngineOptions.adapters)")
          : absl::StrCat("RequestOptions.adapter '", options.adapter, "' is not one of ",
                         absl::StrJoin(adapter_names_, ", ")));
}

SchedulerStats Engine::ServingStats() const { return scheduler().Stats(); }

absl::Status Engine::CheckRequest(const std::vector<int64_t>& prompt,
                                  const RequestOptions& options) const {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (options.max_new_tokens < 1) return MaxNewTokensBelowOne(options.max_new_tokens);
  RETURN_IF_ERROR(CheckIds(prompt, config().PaddedVocabSize(), "prompt"));
  RETURN_IF_ERROR(ValidateKVCacheSpec(options.kv_cache));
  RETURN_IF_ERROR(ValidateSpeculativeSpec(options.speculative));
  if (options.top_logprobs < -1 || options.top_logprobs > config().PaddedVocabSize()) {
    return InvalidFieldError(
        FieldRef("RequestOptions.top_logprobs", "top_logprobs"),
        absl::StrCat("top_logprobs must be in [-1, ", config().PaddedVocabSize(), "], got ",
                     options.top_logprobs));
  }
  // Compared by subtraction: prompt + max_new_tokens may overflow int64.
  const int64_t prompt_length = static_cast<int64_t>(prompt.size());
  if (options.max_new_tokens > config().block_size - prompt_length &&
      !UsesCachePositions(options.kv_cache)) {
    return FieldError(
        absl::StatusCode::kOutOfRange, MaxNewTokens(),
        absl::StrCat("prompt (", prompt.size(), " tokens) plus max_new_tokens (",
                     options.max_new_tokens, ") exceeds the context of ", config().block_size,
                     " tokens (with KVCacheSpec.positions=absolute; a window or sink cache with "
                     "KVCacheSpec.positions=cache goes past it)"),
        {"KVCacheSpec.positions"});
  }
  return absl::OkStatus();
}

int64_t Engine::CacheLength(const std::vector<int64_t>& prompt,
                            const RequestOptions& options) const {
  // Cache positions: the cache spans the whole context and shifts within it.
  return UsesCachePositions(options.kv_cache)
             ? config().block_size
             : static_cast<int64_t>(prompt.size()) + options.max_new_tokens;
}

absl::StatusOr<std::unique_ptr<KVCache>> Engine::CacheFor(const std::vector<int64_t>& prompt,
                                                          const RequestOptions& options) const {
  return NewCache(options.kv_cache, 1, CacheLength(prompt, options), SpeculativeTokens(options));
}

absl::StatusOr<Completion> Engine::Generate(absl::string_view prompt,
                                            const RequestOptions& options) const {
  ASSIGN_OR_RETURN(std::vector<int64_t> ids, Encode(prompt));
  if (ids.empty()) return absl::InvalidArgumentError("the prompt encodes to no tokens");
  return Generate(ids, options);
}

absl::StatusOr<Completion> Engine::Generate(const std::vector<int64_t>& prompt,
                                            const RequestOptions& options) const {
  RETURN_IF_ERROR(CheckRequest(prompt, options));
  ASSIGN_OR_RETURN(std::unique_ptr<KVCache> cache, CacheFor(prompt, options));
  ASSIGN_OR_RETURN(std::shared_ptr<Proposer> proposer, ProposerFor(options));
  return Run(*cache, 0, prompt, options, prompt, std::move(proposer));
}

absl::StatusOr<std::vector<Completion>> Engine::GenerateBatch(
    const std::vector<std::vector<int64_t>>& prompts, const RequestOptions& options) const {
  if (prompts.empty()) return absl::InvalidArgumentError("no prompts");
  // Before the cache is sized from it: a very negative value made the cache's length the
  // error ("DenseKVCacheOptions.max_sequence_length must be >= 1").
  if (options.max_new_tokens < 1) return MaxNewTokensBelowOne(options.max_new_tokens);
  if (options.on_token || options.on_text || !options.stop_sequences.empty()) {
    return absl::InvalidArgumentError(
        "GenerateBatch takes no streaming callbacks or stop sequences");
  }
  if (options.constraint || options.top_logprobs >= 0 || options.on_logprob) {
    return absl::InvalidArgumentError(
        "GenerateBatch takes no constraint or logprobs (Submit each request: the scheduler "
        "batches them)");
  }
  RETURN_IF_ERROR(RefuseSpeculation(options, "Engine::GenerateBatch"));
  int64_t longest = 0;
  for (size_t row = 0; row < prompts.size(); ++row) {
    RETURN_IF_ERROR(
        CheckIds(prompts[row], config().PaddedVocabSize(), absl::StrCat("prompt ", row)));
    longest = std::max<int64_t>(longest, prompts[row].size());
  }
  RETURN_IF_ERROR(ValidateKVCacheSpec(options.kv_cache));
  const int64_t block = config().block_size;  // longest + max_new_tokens, capped without overflow
  const int64_t length = UsesCachePositions(options.kv_cache) || longest >= block
                             ? block
                             : longest + std::min(options.max_new_tokens, block - longest);
  ASSIGN_OR_RETURN(std::unique_ptr<KVCache> cache,
                   NewCache(options.kv_cache, static_cast<int64_t>(prompts.size()), length));
  BatchGenerateOptions batch;
  batch.max_new_tokens = options.max_new_tokens;
  batch.sampling = options.sampling;
  batch.seed = options.seed;
  batch.prefill_chunk = options.prefill_chunk;
  batch.stop_tokens = StopTokens(options);
  ASSIGN_OR_RETURN(const int64_t adapter, AdapterSlot(options));
  if (adapter >= 0) batch.adapters.assign(prompts.size(), adapter);
  GenerateStats stats;
  ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> rows,
                   lgpt::GenerateBatch(*model_, *cache, prompts, batch, &stats));
  std::vector<Completion> results(rows.size());
  for (size_t row = 0; row < rows.size(); ++row) {
    Completion& result = results[row];
    result.tokens = std::move(rows[row]);
    result.stats = stats;
    result.kv_cache_index_bytes = cache->IndexBytes();
    if (tokenizer_) {
      // Decode as the streaming path does: primed on the prompt, so leading spaces survive.
      StreamingDecoder stream(*tokenizer_);
      RETURN_IF_ERROR(stream.Prime(prompts[row]).status());
      for (int64_t token : result.tokens) {
        ASSIGN_OR_RETURN(std::string piece, stream.Push(token));
        result.text += piece;
      }
      result.text += stream.Flush();
    }
    const bool stopped = std::find(batch.stop_tokens.begin(), batch.stop_tokens.end(),
                                   result.tokens.back()) != batch.stop_tokens.end();
    result.finish_reason = stopped ? FinishReason::kStopToken : FinishReason::kMaxTokens;
  }
  return results;
}

absl::StatusOr<std::unique_ptr<Session>> Engine::NewSession(const KVCacheSpec& kv_cache) const {
  RETURN_IF_ERROR(ValidateKVCacheSpec(kv_cache));
  ASSIGN_OR_RETURN(std::unique_ptr<KVCache> cache,
                   NewCache(kv_cache, 1, config().block_size, kSessionRollbackSlots));
  return std::unique_ptr<Session>(new Session(shared_from_this(), std::move(cache)));
}

Session::Session(std::shared_ptr<const Engine> engine, std::unique_ptr<KVCache> cache)
    : engine_(std::move(engine)), cache_(std::move(cache)) {}

int64_t Session::context_left() const {
  if (cache_->ShiftsPositions()) return std::numeric_limits<int64_t>::max();
  return cache_->max_sequence_length() - context_tokens();
}

void Session::Reset() {
  cache_->Reset();
  history_.clear();
  cached_ = 0;
  shifted_ = 0;
  proposer_ = nullptr;
  proposer_key_.clear();
}

absl::StatusOr<Completion> Session::Send(absl::string_view text, const RequestOptions& options) {
  if (!engine_->tokenizer()) {
    return absl::FailedPreconditionError("the session's checkpoint has no tokenizer");
  }
  std::optional<bool> bos;
  if (!history_.empty()) bos = false;
  ASSIGN_OR_RETURN(std::vector<int64_t> ids, engine_->tokenizer()->Encode(text, bos));
  return Send(ids, options);
}

absl::StatusOr<Completion> Session::Send(const std::vector<int64_t>& tokens,
                                         const RequestOptions& options) {
  if (tokens.empty()) return absl::InvalidArgumentError("nothing to send: no tokens");
  if (options.max_new_tokens < 1) return MaxNewTokensBelowOne(options.max_new_tokens);
  RETURN_IF_ERROR(CheckIds(tokens, engine_->config().PaddedVocabSize(), "message"));
  // The previous reply's last token was sampled but never fed: it goes first.
  std::vector<int64_t> prompt(history_.begin() + cached_, history_.end());
  prompt.insert(prompt.end(), tokens.begin(), tokens.end());
  const int64_t context = std::min(engine_->config().block_size, cache_->max_sequence_length());
  const int64_t room = cache_->ShiftsPositions()
                           ? options.max_new_tokens  // cache positions: no end of context
                           : context - cached_ - static_cast<int64_t>(prompt.size());
  if (room < 1) {
    return absl::OutOfRangeError(absl::StrCat("context full: the message needs ", tokens.size(),
                                              " tokens but only ",
                                              std::max<int64_t>(0, context - context_tokens() - 1),
                                              " of the context's ", context, " are left"));
  }
  RequestOptions capped = options;
  capped.max_new_tokens = std::min(options.max_new_tokens, room);
  // The conversation's proposer: a draft keeps its cache across turns while the request's
  // settings stay.
  RETURN_IF_ERROR(ValidateSpeculativeSpec(options.speculative));
  const SpeculativeSpec& spec = options.speculative;
  const SamplingOptions& sampling = options.sampling;
  const std::string key =
      spec.enabled() ? absl::StrCat(spec.method, "/", spec.num_speculative_tokens, "/",
                                    spec.prompt_lookup_min, "/", spec.prompt_lookup_max, "/",
                                    IsGreedy(sampling) ? 0.0 : sampling.temperature, "/",
                                    sampling.top_k, "/", sampling.top_p, "/", sampling.min_p)
                     : "";
  if (key != proposer_key_ || (spec.enabled() && proposer_ == nullptr)) {
    ASSIGN_OR_RETURN(proposer_, engine_->ProposerFor(options));
    proposer_key_ = key;
  }
  // The generation's own checks (sampling, prefill_chunk, ...) before the cache is touched, as
  // Submit runs them: a failure inside Run resets the session, bad options must not cost it.
  GenerateOptions settings = GenerationSettings(capped, cached_ - shifted_);
  settings.speculative.proposer = proposer_;
  settings.speculative.k = spec.num_speculative_tokens;
  RETURN_IF_ERROR(InRequestTerms(CheckGenerateRequest(
      engine_->model(), *cache_, static_cast<int64_t>(prompt.size()), settings)));
  absl::StatusOr<Completion> result = engine_->Run(
      *cache_, cached_ - shifted_, prompt, capped, absl::MakeConstSpan(prompt), proposer_,
      proposer_ ? std::vector<int64_t>(history_.begin(), history_.begin() + cached_)
                : std::vector<int64_t>());
  if (!result.ok()) {
    // A failed step may have stored part of its entries: start over rather than risk them.
    Reset();
    return WithMessage(result.status(),
                       absl::StrCat(result.status().message(), " (the session was reset)"));
  }
  cached_ += static_cast<int64_t>(prompt.size()) + static_cast<int64_t>(result->tokens.size()) - 1;
  shifted_ += result->stats.position_shift;
  history_.insert(history_.end(), tokens.begin(), tokens.end());
  history_.insert(history_.end(), result->tokens.begin(), result->tokens.end());
  if (!options.keep_stop_token && result->finish_reason == FinishReason::kStopToken) {
    history_.pop_back();  // the one token never fed; the next turn's text closes the turn
  }
  if (result->finish_reason == FinishReason::kMaxTokens &&
      capped.max_new_tokens < options.max_new_tokens) {
    result->finish_reason = FinishReason::kContextFull;
  }
  return result;
}

}  // namespace lgpt
