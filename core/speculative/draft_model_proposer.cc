#include "core/speculative/draft_model_proposer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "core/model/batch_forward.h"
#include "core/speculative/propose_batch.h"

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
  return PickRow(row.data_ptr<float>(), probabilities);
}

absl::StatusOr<int64_t> DraftModelProposer::PickRow(const float* values,
                                                    std::vector<float>* probabilities) {
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

absl::StatusOr<int64_t> DraftModelProposer::Begin(absl::Span<const int64_t> context, int64_t k) {
  const int64_t length = static_cast<int64_t>(context.size());
  // The draft feeds the context and all but the last proposal: positions up to length + k - 2.
  k = std::min({k, options_.max_k, cache_->max_sequence_length() - length + 1});
  if (length == 0 || k < 1) return 0;
  const int64_t padded = draft_->config().PaddedVocabSize();
  for (int64_t i = 0; i < length; ++i) {
    if (context[i] < 0 || context[i] >= padded) {
      return FieldError(absl::StatusCode::kOutOfRange, FieldRef("ProposalTask.context", "context"),
                        absl::StrCat(DebugName(), ": context[", i, "] = ", context[i],
                                     " is outside the draft model's vocabulary [0, ", padded, ")"));
    }
  }
  // What the cache holds and the context share stays; the last context token is fed again
  // when the cache holds it all (its logits are the first proposal's).
  int64_t common = 0;
  const int64_t held = std::min<int64_t>(static_cast<int64_t>(cached_.size()), length - 1);
  while (common < held && cached_[common] == context[common]) ++common;
  const int64_t forgotten = static_cast<int64_t>(cached_.size()) - common;
  if (forgotten > 0) {
    // Further back than a window ring's spare slots reach (KVRollback's limit, asked first:
    // a ring all of whose entries are forgotten would not notice), or a ring that no longer
    // holds what the shorter context needs: start over.
    if (forgotten > cache_->max_rollback() || !cache_->Truncate(common).ok()) {
      cache_->Reset();
      common = 0;
    }
    cached_.resize(static_cast<size_t>(common));
  }
  return k;
}

absl::StatusOr<Proposal> DraftModelProposer::Propose(absl::Span<const int64_t> context, int64_t k) {
  at::NoGradGuard no_grad;
  Proposal proposal;
  ASSIGN_OR_RETURN(k, Begin(context, k));
  if (k == 0) return proposal;
  ASSIGN_OR_RETURN(at::Tensor logits, Feed(context.subspan(cached_.size())));
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

// A task of ProposeTogether that proposes something.
struct DraftModelProposer::Member {
  size_t task = 0;  // its index among the tasks
  DraftModelProposer* proposer = nullptr;
  absl::Span<const int64_t> context;
  int64_t k = 0;  // the tokens it proposes (Begin's)
  Proposal proposal;
  at::Tensor row;       // its latest logits, [padded_vocab] float32 on the host
  int64_t next = 0;     // its latest proposal, fed in the next decode pass
  absl::Status status;  // not OK: it has failed and proposes no further
};

void DraftModelProposer::FeedTogether(GPTImpl& draft, absl::Span<Member* const> members,
                                      absl::Span<const absl::Span<const int64_t>> tokens) {
  std::vector<SequenceChunk> chunks;
  chunks.reserve(members.size());
  for (size_t j = 0; j < members.size(); ++j) {
    const DraftModelProposer& proposer = *members[j]->proposer;
    const int64_t first = static_cast<int64_t>(proposer.cached_.size());
    const int64_t length = static_cast<int64_t>(tokens[j].size());
    SequenceChunk chunk;
    chunk.cache = proposer.cache_.get();
    chunk.ids = at::tensor(std::vector<int64_t>(tokens[j].begin(), tokens[j].end()), at::kLong)
                    .unsqueeze(0);                                                // [1, T]
    chunk.positions = at::arange(first, first + length, at::kLong).unsqueeze(0);  // [1, T]
    chunks.push_back(std::move(chunk));
  }
  absl::StatusOr<at::Tensor> logits = ForwardChunks(draft, chunks);  // [chunks, V]
  if (logits.ok()) {
    const at::Tensor rows = logits->to(at::kCPU, at::kFloat).contiguous();  // [chunks, V]
    for (size_t j = 0; j < members.size(); ++j) {
      DraftModelProposer& proposer = *members[j]->proposer;
      proposer.cached_.insert(proposer.cached_.end(), tokens[j].begin(), tokens[j].end());
      proposer.draft_tokens_ += static_cast<int64_t>(tokens[j].size());
      members[j]->row = rows[static_cast<int64_t>(j)];  // [V]
    }
    return;
  }
  if (members.size() == 1) {
    members.front()->status = logits.status();
    return;
  }
  // Whichever chunk failed the pass (the pass may have written some layers' entries): each
  // cache back to what it held, and each chunk again alone.
  for (size_t j = 0; j < members.size(); ++j) {
    DraftModelProposer& proposer = *members[j]->proposer;
    if (!proposer.cache_->Truncate(static_cast<int64_t>(proposer.cached_.size())).ok()) {
      proposer.cache_->Reset();
      proposer.cached_.clear();
      members[j]->status = logits.status();
      continue;
    }
    FeedTogether(draft, absl::MakeConstSpan(&members[j], 1), absl::MakeConstSpan(&tokens[j], 1));
  }
}

std::vector<absl::StatusOr<Proposal>> DraftModelProposer::ProposeTogether(
    absl::Span<const ProposalTask> tasks) {
  at::NoGradGuard no_grad;
  std::vector<absl::StatusOr<Proposal>> proposals(tasks.size(), Proposal());
  const std::vector<absl::Status> checks = CheckProposalTasks(tasks);
  std::vector<Member> members;
  members.reserve(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (!checks[i].ok()) {
      proposals[i] = checks[i];
      continue;
    }
    auto* proposer = dynamic_cast<DraftModelProposer*>(tasks[i].proposer);
    if (proposer == nullptr || proposer->draft_.get() != draft_.get()) {
      proposals[i] = InvalidFieldError(
          "ProposalTask.proposer",
          absl::StrCat("tasks[", i, "]: ProposalTask.proposer (", tasks[i].proposer->DebugName(),
                       ") is not a draft proposer over ", DebugName(),
                       "'s draft model, so it cannot propose together with it"));
      continue;
    }
    absl::StatusOr<int64_t> k = proposer->Begin(tasks[i].context, tasks[i].k);
    if (!k.ok()) {
      proposals[i] = k.status();
      continue;
    }
    if (*k == 0) continue;  // nothing to propose, as alone
    Member member;
    member.task = i;
    member.proposer = proposer;
    member.context = tasks[i].context;
    member.k = *k;
    members.push_back(std::move(member));
  }
  // Catching up: the rest of each context after what its cache keeps, all in one pass (in
  // rounds of each proposer's prefill_chunk tokens where it has one).
  std::vector<Member*> feeding;
  std::vector<absl::Span<const int64_t>> tokens;
  for (;;) {
    feeding.clear();
    tokens.clear();
    for (Member& member : members) {
      if (!member.status.ok()) continue;
      const absl::Span<const int64_t> rest =
          member.context.subspan(member.proposer->cached_.size());
      if (rest.empty()) continue;
      const int64_t chunk = member.proposer->options_.prefill_chunk;
      feeding.push_back(&member);
      tokens.push_back(chunk > 0 ? rest.first(std::min<size_t>(rest.size(), chunk)) : rest);
    }
    if (feeding.empty()) break;
    FeedTogether(*draft_, feeding, tokens);
  }
  // Decoding: each member picks from its latest logits with its own generator, and feeds its
  // pick until it has k.
  for (;;) {
    feeding.clear();
    tokens.clear();
    for (Member& member : members) {
      if (!member.status.ok() || static_cast<int64_t>(member.proposal.tokens.size()) == member.k) {
        continue;
      }
      DraftModelProposer& proposer = *member.proposer;
      std::vector<float> q;
      absl::StatusOr<int64_t> token = proposer.PickRow(member.row.data_ptr<float>(), &q);
      if (!token.ok()) {
        member.status = token.status();
        continue;
      }
      member.proposal.tokens.push_back(*token);
      if (!IsGreedy(proposer.options_.sampling)) {
        member.proposal.probabilities.push_back(std::move(q));
      }
      if (static_cast<int64_t>(member.proposal.tokens.size()) < member.k) {
        member.next = *token;
        feeding.push_back(&member);
        tokens.push_back(absl::MakeConstSpan(&member.next, 1));
      }
    }
    if (feeding.empty()) break;
    FeedTogether(*draft_, feeding, tokens);
  }
  for (Member& member : members) {
    if (member.status.ok()) {
      proposals[member.task] = std::move(member.proposal);
    } else {
      proposals[member.task] = member.status;
    }
  }
  return proposals;
}

}  // namespace lgpt
