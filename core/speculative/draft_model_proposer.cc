#include "core/speculative/draft_model_proposer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"

namespace lgpt {

absl::Status CheckDraftVocabulary(const Config& target, const Config& draft,
                                  absl::string_view field) {
  if (draft.vocab_size == target.vocab_size) return absl::OkStatus();
  return InvalidFieldError(field,
                           absl::StrCat(field, ": the draft model's vocab_size (", draft.vocab_size,
                                        ") differs from the model's (", target.vocab_size,
                                        "): a draft must share the model's tokenizer"));
}

absl::StatusOr<std::unique_ptr<DraftModelProposer>> DraftModelProposer::Create(
    GPT draft, const Config& target, const DraftModelProposerOptions& options) {
  if (draft == nullptr) {
    return InvalidFieldError("DraftModelProposer.draft", "DraftModelProposer needs a draft model");
  }
  RETURN_IF_ERROR(CheckDraftVocabulary(target, draft->config(), "DraftModelProposer.draft"));
  RETURN_IF_ERROR(ValidateSampling(options.sampling));
  if (options.max_k < 1) {
    return InvalidFieldError(
        "DraftModelProposerOptions.max_k",
        absl::StrCat("DraftModelProposerOptions.max_k must be >= 1, got ", options.max_k));
  }
  if (options.prefill_chunk < 0) {
    return InvalidFieldError("DraftModelProposerOptions.prefill_chunk",
                             absl::StrCat("DraftModelProposerOptions.prefill_chunk must be >= 0, "
                                          "got ",
                                          options.prefill_chunk));
  }
  DenseKVCacheOptions cache_options;
  cache_options.batch_size = 1;
  cache_options.max_sequence_length = draft->config().block_size;
  cache_options.layers = draft->CacheLayout();
  cache_options.dtype = draft->dtype();
  cache_options.device = draft->device();
  cache_options.rollback_slots = options.max_k;
  ASSIGN_OR_RETURN(std::unique_ptr<DenseKVCache> cache, DenseKVCache::Create(cache_options));
  const int64_t vocab = std::min(draft->config().PaddedVocabSize(), target.PaddedVocabSize());
  return std::unique_ptr<DraftModelProposer>(
      new DraftModelProposer(std::move(draft), vocab, options, std::move(cache)));
}

DraftModelProposer::DraftModelProposer(GPT draft, int64_t vocab,
                                       const DraftModelProposerOptions& options,
                                       std::unique_ptr<DenseKVCache> cache)
    : draft_(std::move(draft)),
      vocab_(vocab),
      options_(options),
      cache_(std::move(cache)),
      generator_(at::make_generator<at::CPUGeneratorImpl>(options.seed)) {}

std::string DraftModelProposer::DebugName() const {
  return absl::StrCat("draft(", draft_->config().name, ")");
}

absl::StatusOr<at::Tensor> DraftModelProposer::Feed(absl::Span<const int64_t> tokens) {
  const int64_t total = static_cast<int64_t>(tokens.size());
  const int64_t chunk = options_.prefill_chunk > 0 ? options_.prefill_chunk : total;
  at::Tensor logits;
  for (int64_t begin = 0; begin < total; begin += chunk) {
    const int64_t length = std::min(chunk, total - begin);
    const int64_t first = static_cast<int64_t>(cached_.size());
    const at::Tensor ids =
        at::tensor(std::vector<int64_t>(tokens.begin() + begin, tokens.begin() + begin + length),
                   at::kLong)
            .unsqueeze(0);  // [1, T]
    ForwardOptions forward;
    forward.positions = at::arange(first, first + length, at::kLong).unsqueeze(0);  // [1, T]
    forward.last_logits_only = true;
    ASSIGN_OR_RETURN(logits, draft_->Forward(ids, cache_.get(), forward));  // [1, 1, V]
    cached_.insert(cached_.end(), tokens.begin() + begin, tokens.begin() + begin + length);
    draft_tokens_ += length;
  }
  return logits;
}

absl::StatusOr<int64_t> DraftModelProposer::Pick(const at::Tensor& logits,
                                                 std::vector<float>* probabilities) {
  const at::Tensor row =
      logits.reshape({-1}).narrow(0, 0, vocab_).to(at::kCPU, at::kFloat).contiguous();  // [V]
  const float* values = row.data_ptr<float>();
  if (IsGreedy(options_.sampling)) {
    return std::max_element(values, values + vocab_) - values;  // the first of equals, as argmax
  }
  ASSIGN_OR_RETURN(const std::vector<double> q,
                   SamplingProbabilities(values, vocab_, options_.sampling));
  // The token is drawn from the float probabilities reported, so q is what was drawn from.
  probabilities->assign(q.begin(), q.end());
  const std::vector<double> weights(probabilities->begin(), probabilities->end());
  return DrawIndex(weights, generator_);
}

absl::StatusOr<Proposal> DraftModelProposer::Propose(absl::Span<const int64_t> context, int64_t k) {
  at::NoGradGuard no_grad;
  Proposal proposal;
  const int64_t length = static_cast<int64_t>(context.size());
  // The draft feeds the context and all but the last proposal: positions up to length + k - 2.
  k = std::min({k, options_.max_k, cache_->max_sequence_length() - length + 1});
  if (length == 0 || k < 1) return proposal;
  // What the cache holds and the context share stays; the last context token is fed again
  // when the cache holds it all (its logits are the first proposal's).
  int64_t common = 0;
  const int64_t held = std::min<int64_t>(static_cast<int64_t>(cached_.size()), length - 1);
  while (common < held && cached_[common] == context[common]) ++common;
  if (common < static_cast<int64_t>(cached_.size())) {
    if (!cache_->Truncate(common).ok()) {
      // A window ring no longer holds what the shorter context needs: start over.
      cache_->Reset();
      common = 0;
    }
    cached_.resize(static_cast<size_t>(common));
  }
  ASSIGN_OR_RETURN(at::Tensor logits, Feed(context.subspan(common)));
  const bool samples = !IsGreedy(options_.sampling);
  for (int64_t i = 0; i < k; ++i) {
    std::vector<float> q;
    ASSIGN_OR_RETURN(const int64_t token, Pick(logits, &q));
    proposal.tokens.push_back(token);
    if (samples) proposal.probabilities.push_back(std::move(q));
    if (i + 1 < k) {
      const int64_t next[] = {token};
      ASSIGN_OR_RETURN(logits, Feed(next));
    }
  }
  return proposal;
}

}  // namespace lgpt
