#include "core/model/generate.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "core/model/cache_positions.h"

namespace lgpt {
namespace {

// The messages say "max_new_tokens" of either options struct.
FieldRef MaxNewTokens() { return FieldRef("GenerateOptions.max_new_tokens", "max_new_tokens"); }
FieldRef BatchMaxNewTokens() {
  return FieldRef("BatchGenerateOptions.max_new_tokens", "max_new_tokens");
}

// `slot` names one of `model`'s adapter slots, or the base model (-1).
absl::Status CheckAdapterSlot(const GPTImpl& model, int64_t slot, const FieldRef& field,
                              absl::string_view what) {
  if (slot >= -1 && slot < model.adapter_slots()) return absl::OkStatus();
  return InvalidFieldError(
      field,
      absl::StrCat(what, " is ", slot, ": ",
                   model.adapter_slots() == 0
                       ? "the model serves no adapters (only -1, the base model)"
                       : absl::StrCat("the model's adapter slots are [0, ", model.adapter_slots(),
                                      "), or -1 for the base model")));
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The checks of the sampling options that need the model's vocabulary.
absl::Status CheckSamplingForModel(const SamplingOptions& sampling, int64_t vocab) {
  RETURN_IF_ERROR(ValidateSampling(sampling));
  for (const auto& [token, bias] : sampling.logit_bias) {
    if (token >= vocab) {
      return InvalidFieldError(FieldRef("SamplingOptions.logit_bias", "logit_bias"),
                               absl::StrCat("logit_bias names token ", token,
                                            ", outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

// The speculation a request asks for, against what its cache can undo.
absl::Status CheckSpeculation(const KVCache& cache, const GenerateOptions& options) {
  const SpeculativeOptions& speculative = options.speculative;
  if (speculative.proposer == nullptr) return absl::OkStatus();
  if (speculative.k < 1) {
    return InvalidFieldError(
        "GenerateOptions.speculative.k",
        absl::StrCat("GenerateOptions.speculative.k must be >= 1, got ", speculative.k));
  }
  if (!speculative.history.empty() &&
      static_cast<int64_t>(speculative.history.size()) != options.start_position) {
    return InvalidFieldError(
        "GenerateOptions.speculative.history",
        absl::StrCat("GenerateOptions.speculative.history holds ", speculative.history.size(),
                     " tokens for a cache holding ", options.start_position,
                     " (GenerateOptions.start_position): give all of them, or none"),
        {"GenerateOptions.start_position"});
  }
  // rollback() is not const (the role is used to change the cache); asking changes nothing.
  KVRollback* rollback = const_cast<KVCache&>(cache).rollback();
  if (rollback == nullptr) {
    return FieldError(
        absl::StatusCode::kFailedPrecondition, "GenerateOptions.speculative",
        absl::StrCat("GenerateOptions.speculative needs a KV cache that forgets rejected "
                     "proposals (dense, paged, or quantised with the dense policy); the ",
                     cache.DebugName(),
                     " cache evicts entries, and one a rejected token displaced cannot come back"));
  }
  if (speculative.k > rollback->max_rollback()) {
    return InvalidFieldError(
        "GenerateOptions.speculative.k",
        absl::StrCat("GenerateOptions.speculative.k is ", speculative.k, " but the ",
                     cache.DebugName(), " cache forgets at most ", rollback->max_rollback(),
                     " entries of a step (its sliding-window rings keep ",
                     rollback->max_rollback() - 1,
                     " spare slots: build it with KVCacheShape.rollback_slots >= k - 1)"),
        {"KVCacheShape.rollback_slots"});
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckGenerateRequest(const GPTImpl& model, const KVCache& cache, int64_t prompt_length,
                                  const GenerateOptions& options) {
  const int64_t vocab = model.config().PaddedVocabSize();
  RETURN_IF_ERROR(CheckSamplingForModel(options.sampling, vocab));
  if (options.top_logprobs < -1 || options.top_logprobs > vocab) {
    return InvalidFieldError(
        FieldRef("GenerateOptions.top_logprobs", "top_logprobs"),
        absl::StrCat("top_logprobs must be in [-1, ", vocab, "], got ", options.top_logprobs));
  }
  if (prompt_length == 0) return absl::InvalidArgumentError("the prompt is empty");
  if (options.max_new_tokens < 0) {
    return InvalidFieldError(
        MaxNewTokens(), absl::StrCat("max_new_tokens must be >= 0, got ", options.max_new_tokens));
  }
  if (options.prefill_chunk < 0) {
    return InvalidFieldError(
        FieldRef("GenerateOptions.prefill_chunk", "prefill_chunk"),
        absl::StrCat("prefill_chunk must be >= 0, got ", options.prefill_chunk));
  }
  if (options.start_position < 0) {
    return InvalidFieldError(
        FieldRef("GenerateOptions.start_position", "start_position"),
        absl::StrCat("start_position must be >= 0, got ", options.start_position));
  }
  RETURN_IF_ERROR(CheckAdapterSlot(model, options.adapter, "GenerateOptions.adapter",
                                   "GenerateOptions.adapter"));
  RETURN_IF_ERROR(CheckSpeculation(cache, options));
  const int64_t first = options.start_position;
  const int64_t context = std::min(model.config().block_size, cache.max_sequence_length());
  // Compared by subtraction: first + prompt + max_new_tokens may overflow int64.
  const bool too_long = first > context || prompt_length > context - first ||
                        options.max_new_tokens > context - first - prompt_length;
  if (too_long && !cache.ShiftsPositions()) {
    return FieldError(absl::StatusCode::kOutOfRange, MaxNewTokens(),
                      absl::StrCat(first > 0 ? absl::StrCat(first, " cached tokens plus ") : "",
                                   "prompt (", prompt_length, " tokens) plus max_new_tokens (",
                                   options.max_new_tokens, ") exceeds the context of ", context,
                                   " tokens (a window or sink KV cache with cache positions, "
                                   "KVCacheSpec.positions=cache, goes past it)"),
                      {"KVCacheSpec.positions"});
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> Generate(GPTImpl& model, KVCache& cache,
                                              const std::vector<int64_t>& prompt,
                                              const GenerateOptions& options,
                                              GenerateStats* stats) {
  const int64_t prompt_length = static_cast<int64_t>(prompt.size());
  RETURN_IF_ERROR(CheckGenerateRequest(model, cache, prompt_length, options));
  const int64_t first = options.start_position;
  at::NoGradGuard no_grad;
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  GenerateStats local;
  GenerateStats& s = stats ? *stats : local;
  s = GenerateStats();
  s.prompt_tokens = prompt_length;

  const auto start = std::chrono::steady_clock::now();
  const at::Tensor tokens = at::tensor(prompt, at::kLong).unsqueeze(0);
  const int64_t chunk = options.prefill_chunk > 0 ? options.prefill_chunk : prompt_length;
  CachePositions stream(model, cache, first);
  at::Tensor logits;
  for (int64_t begin = 0; begin < prompt_length;) {
    ASSIGN_OR_RETURN(const int64_t length, stream.MakeRoom(std::min(chunk, prompt_length - begin)));
    ForwardOptions forward;
    forward.positions = stream.Take(length);
    forward.last_logits_only = true;
    if (options.adapter >= 0) forward.adapters = {options.adapter};
    ASSIGN_OR_RETURN(logits, model.Forward(tokens.narrow(1, begin, length), &cache, forward));
    begin += length;
  }
  s.prefill_s = SecondsSince(start);

  std::vector<int64_t> out;
  auto decode_start = std::chrono::steady_clock::now();
  NextTokenChooser chooser(options.sampling, prompt, options.constraint, options.top_logprobs);
  TokenLogprob logprob;
  // Takes a chosen token: reports it; false when generation ends with it.
  const auto emit = [&](int64_t next) {
    if (options.on_logprob && chooser.reports_logprobs()) options.on_logprob(logprob);
    out.push_back(next);
    if (out.size() == 1) {
      s.time_to_first_token_s = SecondsSince(start);
      decode_start = std::chrono::steady_clock::now();
    }
    const bool keep_going = !options.on_token || options.on_token(next);
    const bool stop = std::find(options.stop_tokens.begin(), options.stop_tokens.end(), next) !=
                          options.stop_tokens.end() ||
                      (options.constraint && options.constraint->Done());
    return keep_going && !stop && static_cast<int64_t>(out.size()) < options.max_new_tokens;
  };
  Proposer* proposer = options.speculative.proposer.get();
  // The proposer's view: earlier turns, the prompt, the output so far.
  std::vector<int64_t> context;
  if (proposer != nullptr) {
    context = options.speculative.history;
    context.insert(context.end(), prompt.begin(), prompt.end());
  }
  bool going = options.max_new_tokens > 0;
  if (going) {
    ASSIGN_OR_RETURN(const int64_t next, chooser.Choose(logits, generator, &logprob));
    going = emit(next);
  }
  // Each step feeds out.back(), the one token chosen but not yet in the cache.
  while (going) {
    Proposal proposal;
    if (proposer != nullptr) {
      context.push_back(out.back());
      // Every step yields at least one token: at most remaining - 1 are proposed.
      const int64_t k = std::min(options.speculative.k,
                                 options.max_new_tokens - static_cast<int64_t>(out.size()) - 1);
      if (k > 0) {
        ASSIGN_OR_RETURN(proposal, proposer->Propose(context, k));
      }
      if (!proposal.probabilities.empty() &&
          proposal.probabilities.size() != proposal.tokens.size()) {
        return absl::InternalError(absl::StrCat(proposer->DebugName(), " proposed ",
                                                proposal.tokens.size(), " tokens with ",
                                                proposal.probabilities.size(), " distributions"));
      }
      if (static_cast<int64_t>(proposal.tokens.size()) > k) {
        proposal.tokens.resize(k);
        if (!proposal.probabilities.empty()) proposal.probabilities.resize(k);
      }
    }
    const int64_t proposed = static_cast<int64_t>(proposal.tokens.size());
    std::vector<int64_t> step_tokens = {out.back()};
    step_tokens.insert(step_tokens.end(), proposal.tokens.begin(), proposal.tokens.end());
    const int64_t steps = proposed + 1;
    RETURN_IF_ERROR(stream.MakeRoom(steps).status());
    const int64_t position = stream.next();
    ForwardOptions forward;
    forward.positions = stream.Take(steps);
    if (proposed == 0) {
      forward.last_logits_only = true;
    } else {
      forward.sequential = true;  // each position's logits as decoding it alone gives them
    }
    if (options.adapter >= 0) forward.adapters = {options.adapter};
    ASSIGN_OR_RETURN(logits, model.Forward(at::tensor(step_tokens, at::kLong).unsqueeze(0), &cache,
                                           forward));  // [1, steps, V]
    if (proposed == 0) {
      ASSIGN_OR_RETURN(const int64_t next, chooser.Choose(logits, generator, &logprob));
      going = emit(next);
      continue;
    }
    // Position j's logits choose the token after step_tokens[j]: proposal j while the model
    // accepts, then one of its own (a replacement, or the bonus after every proposal).
    ++s.verify_steps;
    s.proposed_tokens += proposed;
    // On a device the block's rows cross to the host in one transfer (each position's check
    // reads its row there), not one a position.
    const at::Tensor block = logits.device().is_cpu() ? logits : logits.to(at::kCPU, at::kFloat);
    int64_t emitted = 0;
    for (int64_t j = 0; j <= proposed && going; ++j) {
      const at::Tensor row = block.select(1, j);  // [1, V]
      int64_t next;
      bool accepted = false;
      if (j < proposed) {
        const absl::Span<const float> draft =
            proposal.probabilities.empty() ? absl::Span<const float>() : proposal.probabilities[j];
        ASSIGN_OR_RETURN(const NextTokenChooser::Verdict verdict,
                         chooser.Verify(row, proposal.tokens[j], draft, generator, &logprob));
        next = verdict.token;
        accepted = verdict.accepted;
        if (accepted) ++s.accepted_tokens;
      } else {
        ASSIGN_OR_RETURN(next, chooser.Choose(row, generator, &logprob));
      }
      ++emitted;
      going = emit(next);
      if (!accepted) break;
      if (going) context.push_back(next);
    }
    // The cache keeps the fed token and the emitted proposals before the last emitted token
    // (which the next step feeds, as without speculation).
    const int64_t kept = position + emitted;
    RETURN_IF_ERROR(cache.rollback()->Truncate(kept));
    stream.Rewind(kept);
  }
  if (!out.empty()) s.decode_s = SecondsSince(decode_start);
  s.new_tokens = static_cast<int64_t>(out.size());
  s.kv_cache_bytes = cache.AllocatedBytes();
  s.position_shift = stream.shifted();
  return out;
}

absl::StatusOr<std::vector<std::vector<int64_t>>> GenerateBatch(
    GPTImpl& model, KVCache& cache, const std::vector<std::vector<int64_t>>& prompts,
    const BatchGenerateOptions& options, GenerateStats* stats) {
  RETURN_IF_ERROR(CheckSamplingForModel(options.sampling, model.config().PaddedVocabSize()));
  const int64_t batch = static_cast<int64_t>(prompts.size());
  if (batch == 0) return absl::InvalidArgumentError("no prompts to generate from");
  if (batch > cache.batch_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(batch, " prompts do not fit a cache of ", cache.batch_size(), " rows"));
  }
  if (options.max_new_tokens < 1) {
    return InvalidFieldError(BatchMaxNewTokens(), absl::StrCat("max_new_tokens must be >= 1, got ",
                                                               options.max_new_tokens));
  }
  if (options.prefill_chunk < 0) {
    return InvalidFieldError(
        FieldRef("BatchGenerateOptions.prefill_chunk", "prefill_chunk"),
        absl::StrCat("prefill_chunk must be >= 0, got ", options.prefill_chunk));
  }
  if (!options.adapters.empty()) {
    if (static_cast<int64_t>(options.adapters.size()) != batch) {
      return InvalidFieldError(
          "BatchGenerateOptions.adapters",
          absl::StrCat("BatchGenerateOptions.adapters has ", options.adapters.size(),
                       " entries for ", batch, " prompts: give one per prompt, or none"));
    }
    for (int64_t row = 0; row < batch; ++row) {
      RETURN_IF_ERROR(CheckAdapterSlot(model, options.adapters[row],
                                       "BatchGenerateOptions.adapters",
                                       absl::StrCat("BatchGenerateOptions.adapters[", row, "]")));
    }
  }
  const int64_t context = std::min(model.config().block_size, cache.max_sequence_length());
  int64_t shortest = std::numeric_limits<int64_t>::max(), longest = 0;
  for (int64_t row = 0; row < batch; ++row) {
    const int64_t length = static_cast<int64_t>(prompts[row].size());
    if (length == 0) return absl::InvalidArgumentError(absl::StrCat("prompt ", row, " is empty"));
    const bool too_long = length > context || options.max_new_tokens > context - length;
    if (too_long && !cache.ShiftsPositions()) {
      return FieldError(
          absl::StatusCode::kOutOfRange, BatchMaxNewTokens(),
          absl::StrCat("prompt ", row, " (", length, " tokens) plus max_new_tokens (",
                       options.max_new_tokens, ") exceeds the context of ", context, " tokens"));
    }
    shortest = std::min(shortest, length);
    longest = std::max(longest, length);
  }
  at::NoGradGuard no_grad;
  std::vector<at::Generator> generators;
  std::vector<std::unique_ptr<NextTokenChooser>> choosers;
  for (int64_t row = 0; row < batch; ++row) {
    generators.push_back(at::make_generator<at::CPUGeneratorImpl>(options.seed));
    choosers.push_back(std::make_unique<NextTokenChooser>(options.sampling, prompts[row]));
  }
  GenerateStats local;
  GenerateStats& s = stats ? *stats : local;
  s = GenerateStats();
  for (const auto& prompt : prompts) s.prompt_tokens += static_cast<int64_t>(prompt.size());

  const auto start = std::chrono::steady_clock::now();
  at::Tensor common = at::empty({batch, shortest}, at::kLong);
  for (int64_t row = 0; row < batch; ++row) {
    std::copy(prompts[row].begin(), prompts[row].begin() + shortest,
              common.data_ptr<int64_t>() + row * shortest);
  }
  const int64_t chunk = options.prefill_chunk > 0 ? options.prefill_chunk : shortest;
  CachePositions stream(model, cache);
  at::Tensor logits;  // [B, 1, V]
  for (int64_t begin = 0; begin < shortest;) {
    ASSIGN_OR_RETURN(const int64_t length, stream.MakeRoom(std::min(chunk, shortest - begin)));
    ForwardOptions forward;
    forward.positions = stream.Take(length, batch);
    forward.last_logits_only = true;
    forward.adapters = options.adapters;
    ASSIGN_OR_RETURN(logits, model.Forward(common.narrow(1, begin, length), &cache, forward));
    begin += length;
  }
  s.prefill_s = SecondsSince(start);

  std::vector<std::vector<int64_t>> out(batch);
  std::vector<bool> done(batch, false);
  int64_t active = batch;
  bool first_token_seen = false;
  auto decode_start = start;
  at::Tensor tokens = at::empty({batch, 1}, at::kLong);
  for (int64_t position = shortest; active > 0; ++position) {
    // The token at `position` for each row: its prompt's, or one sampled from the logits.
    const at::Tensor row_logits = logits.reshape({batch, -1});
    for (int64_t row = 0; row < batch; ++row) {
      int64_t& token = tokens.data_ptr<int64_t>()[row];
      const int64_t length = static_cast<int64_t>(prompts[row].size());
      if (position < length) {
        token = prompts[row][position];
        continue;
      }
      if (done[row]) continue;  // keeps feeding its last token; the output is ignored
      ASSIGN_OR_RETURN(token, choosers[row]->Choose(row_logits.narrow(0, row, 1), generators[row]));
      out[row].push_back(token);
      if (!first_token_seen) {
        first_token_seen = true;
        s.time_to_first_token_s = SecondsSince(start);
        decode_start = std::chrono::steady_clock::now();
      }
      const bool keep_going = !options.on_token || options.on_token(row, token);
      const bool stop = std::find(options.stop_tokens.begin(), options.stop_tokens.end(), token) !=
                        options.stop_tokens.end();
      if (!keep_going || stop || static_cast<int64_t>(out[row].size()) == options.max_new_tokens) {
        done[row] = true;
        --active;
      }
    }
    if (active == 0) break;
    RETURN_IF_ERROR(stream.MakeRoom(1).status());
    ForwardOptions forward;
    forward.positions = stream.Take(1, batch);
    forward.last_logits_only = true;
    forward.adapters = options.adapters;
    ASSIGN_OR_RETURN(logits, model.Forward(tokens, &cache, forward));
  }
  s.decode_s = SecondsSince(decode_start);
  for (const auto& row : out) s.new_tokens += static_cast<int64_t>(row.size());
  s.kv_cache_bytes = cache.AllocatedBytes();
  s.position_shift = stream.shifted();
  return out;
}

}  // namespace lgpt
