// ProposeAll (core/speculative/propose_batch.h) against each proposer's own Propose: draft
// proposers over one draft model batched (the default model as its own draft, and a random
// sliding-window model whose rings forget by truncation or start over), greedy and sampled, with
// mixed k (1..8), context lengths, prefill chunks and catch-up states over several rounds of a
// simulated serving loop; each proposer's cache afterwards; n-gram tasks mixed in; a context
// past the draft's, a token past its vocabulary, and a proposer given twice failing only their
// own tasks.
#include "core/speculative/propose_batch.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/status_field.h"
#include "core/config/config.h"
#include "core/model/checkpoint.h"
#include "core/model/gpt.h"
#include "core/speculative/draft_model_proposer.h"
#include "core/speculative/ngram_proposer.h"
#include "gtest/gtest.h"
#include "tests/serving_test_util.h"

namespace lgpt {
namespace {

GPT ModelNamed(const std::string& name) {
  return name == "default_model" ? LoadModel("tools/default_model") : RandomModel(name, 5);
}

std::unique_ptr<DraftModelProposer> Draft(GPT draft, const DraftModelProposerOptions& options) {
  const Config target = draft->config();
  absl::StatusOr<std::unique_ptr<DraftModelProposer>> proposer =
      DraftModelProposer::Create(std::move(draft), target, options);
  EXPECT_TRUE(proposer.ok()) << proposer.status();
  return proposer.ok() ? *std::move(proposer) : nullptr;
}

// `length` tokens of a small linear congruential sequence under `vocab`.
std::vector<int64_t> Tokens(uint64_t seed, int64_t length, int64_t vocab) {
  std::vector<int64_t> tokens;
  uint64_t state = seed * 2654435761u + 12345;
  for (int64_t i = 0; i < length; ++i) {
    state = state * 6364136223846793005u + 1442695040888963407u;
    tokens.push_back(static_cast<int64_t>((state >> 33) % static_cast<uint64_t>(vocab)));
  }
  return tokens;
}

// Options of the r-th request: greedy or sampled (its own seed), whole or chunked catch-up.
DraftModelProposerOptions OptionsOf(int r) {
  DraftModelProposerOptions options;
  if (r % 2 == 1) {
    options.sampling.temperature = 0.9;
    options.sampling.top_k = r % 4 == 1 ? 0 : 12;
    options.seed = 100 + static_cast<uint64_t>(r);
  }
  if (r % 3 == 2) options.prefill_chunk = 4;
  return options;
}

void ExpectSameProposal(const absl::StatusOr<Proposal>& batched,
                        const absl::StatusOr<Proposal>& alone, const std::string& where) {
  ASSERT_EQ(batched.ok(), alone.ok())
      << where << ": " << batched.status() << " / " << alone.status();
  if (!alone.ok()) {
    EXPECT_EQ(batched.status().code(), alone.status().code()) << where;
    return;
  }
  EXPECT_EQ(batched->tokens, alone->tokens) << where;
  ASSERT_EQ(batched->probabilities.size(), alone->probabilities.size()) << where;
  for (size_t t = 0; t < alone->probabilities.size(); ++t) {
    const std::vector<float>& p = batched->probabilities[t];
    const std::vector<float>& q = alone->probabilities[t];
    ASSERT_EQ(p.size(), q.size()) << where << " token " << t;
    float diff = 0;
    for (size_t v = 0; v < q.size(); ++v) diff = std::max(diff, std::abs(p[v] - q[v]));
    EXPECT_LE(diff, 1e-5) << where << " token " << t;
  }
}

// A request of the simulated serving loop: its tokens so far and its k.
struct Request {
  std::vector<int64_t> context;
  int64_t k = 1;
};

// The model's step after a proposal: the first `accepted` proposals kept, then a token of the
// model's own, which differs from the next proposal (so the draft must forget the rest).
void Advance(Request& request, const Proposal& proposal, int64_t accepted, int64_t vocab,
             uint64_t seed) {
  accepted = std::min<int64_t>(accepted, static_cast<int64_t>(proposal.tokens.size()));
  request.context.insert(request.context.end(), proposal.tokens.begin(),
                         proposal.tokens.begin() + accepted);
  int64_t token = Tokens(seed, 1, vocab).front();
  if (accepted < static_cast<int64_t>(proposal.tokens.size()) &&
      token == proposal.tokens[static_cast<size_t>(accepted)]) {
    token = (token + 1) % vocab;
  }
  request.context.push_back(token);
}

class ProposeBatchTest : public ::testing::TestWithParam<std::string> {};

// Rounds of a serving loop: every round the running requests propose, once through ProposeAll
// and once through twin proposers called alone, and the model accepts some of the proposals.
// Requests start fresh, skip a round (more to catch up on), edit their conversation (much of
// the cache forgotten: windowed rings start over), repeat a context (the cache holds it all),
// run into the draft's context end, and join late.
TEST_P(ProposeBatchTest, BatchedProposalsAndCachesEqualEachProposersAlone) {
  GPT model = ModelNamed(GetParam());
  const int64_t vocab = model->config().vocab_size;
  const int64_t block = model->config().block_size;
  constexpr int kRequests = 8;
  const int64_t lengths[kRequests] = {1, 5, 17, 33, 9, block - 4, 2, 12};
  const int64_t ks[kRequests] = {1, 3, 8, 5, 2, 8, 7, 4};
  std::vector<Request> requests(kRequests);
  std::vector<std::unique_ptr<DraftModelProposer>> batched, alone;
  for (int r = 0; r < kRequests; ++r) {
    requests[static_cast<size_t>(r)].context = Tokens(static_cast<uint64_t>(r), lengths[r], vocab);
    requests[static_cast<size_t>(r)].k = ks[r];
    batched.push_back(Draft(model, OptionsOf(r)));
    alone.push_back(Draft(model, OptionsOf(r)));
    ASSERT_NE(batched.back(), nullptr);
  }
  constexpr int kRounds = 5;
  for (int round = 0; round < kRounds; ++round) {
    // Who runs: request 4 skips round 1, request 7 joins at round 2.
    std::vector<int> running;
    for (int r = 0; r < kRequests; ++r) {
      if ((r == 4 && round == 1) || (r == 7 && round < 2)) continue;
      running.push_back(r);
    }
    std::vector<ProposalTask> tasks;
    for (int r : running) {
      const Request& request = requests[static_cast<size_t>(r)];
      tasks.push_back({batched[static_cast<size_t>(r)].get(), request.context, request.k});
    }
    const std::vector<absl::StatusOr<Proposal>> proposals = ProposeAll(tasks);
    ASSERT_EQ(proposals.size(), tasks.size());
    for (size_t j = 0; j < running.size(); ++j) {
      const size_t r = static_cast<size_t>(running[j]);
      const std::string where = absl::StrCat(GetParam(), " round ", round, " request ", r);
      const absl::StatusOr<Proposal> expected =
          alone[r]->Propose(requests[r].context, requests[r].k);
      ExpectSameProposal(proposals[j], expected, where);
      EXPECT_EQ(batched[r]->cached(), alone[r]->cached()) << where;
      EXPECT_EQ(batched[r]->draft_tokens(), alone[r]->draft_tokens()) << where;
      if (!expected.ok()) continue;
      const int64_t most = std::min<int64_t>(
          requests[r].k, block + 1 - static_cast<int64_t>(requests[r].context.size()));
      if (most >= 1) {
        EXPECT_EQ(static_cast<int64_t>(expected->tokens.size()), std::min<int64_t>(most, 8))
            << where;
      } else {
        EXPECT_TRUE(expected->tokens.empty()) << where;  // past the draft's context
      }
      // The next round's context.
      const uint64_t seed = 1000 * static_cast<uint64_t>(round) + r;
      if (r == 3 && round == 2) {
        // The conversation edited from its middle on: more forgotten than a window ring's
        // spare slots hold, so a windowed draft starts over.
        std::vector<int64_t>& context = requests[r].context;
        context.resize(context.size() / 2);
        const std::vector<int64_t> edit = Tokens(seed, 12, vocab);
        context.insert(context.end(), edit.begin(), edit.end());
      } else if (r == 6 && round == 1) {
        // The same context again: the cache holds all of it and more.
      } else {
        Advance(requests[r], *expected, static_cast<int64_t>(r + round) % 4, vocab, seed);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ProposeBatchTest, ::testing::Values("default_model", "Gemma-2-2b"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// After one batched call, every proposer's cache holds what the same call alone leaves: fresh
// proposers, ones with rejected proposals to forget, ones with accepted tokens to catch up on.
TEST(ProposeBatchCacheTest, EachCacheHoldsWhatItWouldAlone) {
  GPT model = LoadModel("tools/default_model");
  const int64_t vocab = model->config().vocab_size;
  const std::vector<int64_t> prompt = Tokens(7, 30, vocab);
  std::vector<std::unique_ptr<DraftModelProposer>> batched, alone;
  std::vector<std::vector<int64_t>> contexts;
  for (int r = 0; r < 4; ++r) {
    batched.push_back(Draft(model, OptionsOf(r)));
    alone.push_back(Draft(model, OptionsOf(r)));
  }
  // 0: fresh. 1, 2, 3: proposed 6 tokens for the prompt, then accepted 0, 3 and 5 of them.
  contexts.push_back(prompt);
  for (int r = 1; r < 4; ++r) {
    for (auto* set : {&batched, &alone}) {
      absl::StatusOr<Proposal> first = (*set)[static_cast<size_t>(r)]->Propose(prompt, 6);
      ASSERT_TRUE(first.ok()) << first.status();
      if (set == &alone) {
        Request request{prompt, 6};
        const int64_t accepted[] = {0, 0, 3, 5};
        Advance(request, *first, accepted[r], vocab, 50 + static_cast<uint64_t>(r));
        contexts.push_back(request.context);
      }
    }
    EXPECT_EQ(batched[static_cast<size_t>(r)]->cached(), alone[static_cast<size_t>(r)]->cached());
  }
  std::vector<ProposalTask> tasks;
  for (size_t r = 0; r < 4; ++r) tasks.push_back({batched[r].get(), contexts[r], 4});
  const std::vector<absl::StatusOr<Proposal>> proposals = ProposeAll(tasks);
  for (size_t r = 0; r < 4; ++r) {
    const absl::StatusOr<Proposal> expected = alone[r]->Propose(contexts[r], 4);
    ExpectSameProposal(proposals[r], expected, absl::StrCat("request ", r));
    ASSERT_TRUE(expected.ok());
    // The context and all but the last proposal.
    std::vector<int64_t> held = contexts[r];
    held.insert(held.end(), expected->tokens.begin(), expected->tokens.end() - 1);
    EXPECT_EQ(alone[r]->cached(), held) << r;
    EXPECT_EQ(batched[r]->cached(), held) << r;
  }
}

// A context past the draft's (no proposal), one at its end (one token), a token past the
// vocabulary (OutOfRange for that task), k = 0, n-gram tasks, a proposer given twice and a null
// one (InvalidArgument naming ProposalTask.proposer): the other tasks propose as alone.
TEST(ProposeBatchCacheTest, ATasksErrorFailsOnlyThatTask) {
  GPT model = LoadModel("tools/default_model");
  const int64_t vocab = model->config().vocab_size;
  const int64_t block = model->config().block_size;
  absl::StatusOr<std::unique_ptr<NgramProposer>> ngram = NgramProposer::Create({});
  ASSERT_TRUE(ngram.ok()) << ngram.status();
  std::vector<std::unique_ptr<DraftModelProposer>> batched, alone;
  for (int r = 0; r < 7; ++r) {
    batched.push_back(Draft(model, OptionsOf(r)));
    alone.push_back(Draft(model, OptionsOf(r)));
  }
  std::vector<int64_t> bad = Tokens(3, 10, vocab);
  bad[6] = model->config().PaddedVocabSize();
  std::vector<int64_t> repeating = Tokens(4, 6, vocab);
  for (int i = 0; i < 2; ++i) repeating.insert(repeating.end(), repeating.begin(), repeating.end());
  const std::vector<std::vector<int64_t>> contexts = {
      Tokens(1, 12, vocab), Tokens(2, block + 3, vocab), Tokens(5, block, vocab), bad,
      Tokens(6, 8, vocab),  Tokens(8, 20, vocab),        Tokens(9, 3, vocab),
  };
  const std::vector<int64_t> ks = {4, 4, 6, 3, 0, 8, 2};
  std::vector<ProposalTask> tasks;
  for (size_t r = 0; r < contexts.size(); ++r) {
    tasks.push_back({batched[r].get(), contexts[r], ks[r]});
    if (r == 2) tasks.push_back({ngram->get(), repeating, 5});
  }
  const std::vector<int64_t> other = Tokens(11, 9, vocab);
  tasks.push_back({ngram->get(), repeating, 3});  // the n-gram proposer twice
  tasks.push_back({nullptr, other, 3});
  const std::vector<absl::StatusOr<Proposal>> proposals = ProposeAll(tasks);
  ASSERT_EQ(proposals.size(), tasks.size());
  size_t j = 0;
  for (size_t r = 0; r < contexts.size(); ++r, ++j) {
    const absl::StatusOr<Proposal> expected = alone[r]->Propose(contexts[r], ks[r]);
    ExpectSameProposal(proposals[j], expected, absl::StrCat("request ", r));
    EXPECT_EQ(batched[r]->cached(), alone[r]->cached()) << r;
    if (r == 2) ++j;  // the n-gram task
  }
  EXPECT_TRUE(proposals[0].ok() && proposals[0]->tokens.size() == 4);
  EXPECT_TRUE(proposals[1].ok() && proposals[1]->tokens.empty());      // past the context
  EXPECT_TRUE(proposals[2].ok() && proposals[2]->tokens.size() == 1);  // at its end
  EXPECT_EQ(proposals[4].status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ErrorField(proposals[4].status()), "ProposalTask.context");
  EXPECT_TRUE(proposals[5].ok() && proposals[5]->tokens.empty());  // k = 0
  EXPECT_TRUE(proposals[6].ok() && proposals[6]->tokens.size() == 8);
  for (size_t twice : {size_t{3}, tasks.size() - 2, tasks.size() - 1}) {
    EXPECT_EQ(proposals[twice].status().code(), absl::StatusCode::kInvalidArgument) << twice;
    EXPECT_EQ(ErrorField(proposals[twice].status()), "ProposalTask.proposer") << twice;
  }
  EXPECT_NE(proposals[3].status().message().find("tasks[8]"), std::string::npos)
      << proposals[3].status();
  // Alone, the n-gram proposer proposes.
  absl::StatusOr<Proposal> lookup = (*ngram)->Propose(repeating, 5);
  ASSERT_TRUE(lookup.ok());
  EXPECT_EQ(lookup->tokens.size(), 5u);
}

// A draft proposer given twice in one call, proposers over another draft model, and n-gram
// proposers: each draft model batches its own, a repeated proposer proposes nothing, and a
// ProposeTogether called directly refuses proposers it cannot batch with.
TEST(ProposeBatchCacheTest, GroupsByDraftModelAndRefusesStrangers) {
  GPT model = LoadModel("tools/default_model");
  GPT other = LoadModel("tools/default_model");  // the same weights, another draft model
  const int64_t vocab = model->config().vocab_size;
  std::unique_ptr<DraftModelProposer> a = Draft(model, {}), b = Draft(other, {}),
                                      c = Draft(model, OptionsOf(1)), d = Draft(other, {});
  std::unique_ptr<DraftModelProposer> a_alone = Draft(model, {}), b_alone = Draft(other, {}),
                                      c_alone = Draft(model, OptionsOf(1));
  absl::StatusOr<std::unique_ptr<NgramProposer>> ngram = NgramProposer::Create({});
  ASSERT_TRUE(ngram.ok());
  EXPECT_EQ(a->batch_key(), c->batch_key());
  EXPECT_NE(a->batch_key(), b->batch_key());
  EXPECT_EQ((*ngram)->batch_key(), nullptr);
  const std::vector<int64_t> x = Tokens(21, 14, vocab), y = Tokens(22, 6, vocab),
                             z = Tokens(23, 30, vocab);
  const std::vector<absl::StatusOr<Proposal>> proposals = ProposeAll({
      {a.get(), x, 5},
      {b.get(), y, 3},
      {d.get(), x, 2},
      {c.get(), z, 7},
      {d.get(), y, 2},
      {ngram->get(), z, 2},
  });
  ASSERT_EQ(proposals.size(), 6u);
  ExpectSameProposal(proposals[0], a_alone->Propose(x, 5), "a");
  ExpectSameProposal(proposals[1], b_alone->Propose(y, 3), "b");
  ExpectSameProposal(proposals[3], c_alone->Propose(z, 7), "c");
  ExpectSameProposal(proposals[5], (*ngram)->Propose(z, 2), "ngram");
  EXPECT_EQ(ErrorField(proposals[2].status()), "ProposalTask.proposer");
  EXPECT_EQ(ErrorField(proposals[4].status()), "ProposalTask.proposer");
  EXPECT_TRUE(d->cached().empty());  // untouched
  // Directly: a proposer over another draft model, or of another kind, cannot join.
  const std::vector<absl::StatusOr<Proposal>> together =
      a->ProposeTogether({{a.get(), x, 2}, {b.get(), y, 2}, {ngram->get(), z, 2}});
  ASSERT_EQ(together.size(), 3u);
  EXPECT_TRUE(together[0].ok()) << together[0].status();
  for (size_t i : {size_t{1}, size_t{2}}) {
    EXPECT_EQ(together[i].status().code(), absl::StatusCode::kInvalidArgument) << i;
    EXPECT_EQ(ErrorField(together[i].status()), "ProposalTask.proposer") << i;
  }
}

// A conversation edited further back than the draft proposed: within a sliding-window ring's
// spare slots the cache forgets by truncation, further back (its check, or the whole ring
// forgotten) the draft starts over; either way it proposes as a fresh proposer does, alone and
// batched.
TEST(ProposeBatchCacheTest, AnEditedConversationProposesAsAFreshProposer) {
  GPT model = RandomModel("Gemma-2-2b", 5);  // windows of 4, rings of 4 + 8 spare slots
  const int64_t vocab = model->config().vocab_size;
  const std::vector<int64_t> start = Tokens(31, 40, vocab);
  // The cache holds 47 entries: 40 and 7 proposals; the edits keep 38, 35, 30 and 20.
  for (int64_t keep : {38, 35, 30, 20}) {
    SCOPED_TRACE(keep);
    std::unique_ptr<DraftModelProposer> alone = Draft(model, {}), batched = Draft(model, {}),
                                        other = Draft(model, {}), fresh = Draft(model, {});
    ASSERT_TRUE(alone->Propose(start, 8).ok());
    ASSERT_TRUE(ProposeAll({{batched.get(), start, 8}, {other.get(), start, 3}})[0].ok());
    std::vector<int64_t> context(start.begin(), start.begin() + keep);
    const std::vector<int64_t> edit = Tokens(32, 5, vocab);
    context.insert(context.end(), edit.begin(), edit.end());
    const absl::StatusOr<Proposal> expected = fresh->Propose(context, 8);
    ASSERT_TRUE(expected.ok()) << expected.status();
    ExpectSameProposal(alone->Propose(context, 8), expected, "alone");
    ExpectSameProposal(ProposeAll({{batched.get(), context, 8}, {other.get(), context, 3}})[0],
                       expected, "batched");
    EXPECT_EQ(alone->cached(), fresh->cached());
    EXPECT_EQ(batched->cached(), fresh->cached());
  }
}

}  // namespace
}  // namespace lgpt
