// The runtime of constrained decoding: which tokens a grammar (core/constrain/grammar.h) allows
// next, and advancing it by the token the sampler chose.
//
//   // Once per tokenizer (core/text's Tokenizer::VocabularyBytes() gives each id's bytes):
//   ASSIGN_OR_RETURN(std::shared_ptr<const TokenVocabulary> vocabulary,
//                    TokenVocabulary::Create(tokenizer.VocabularyBytes(), {eos_id}));
//   // Per request:
//   GrammarMatcher matcher(grammar, vocabulary);
//   while (!matcher.IsComplete()) {
//     matcher.FillNextTokenMask(absl::MakeSpan(bitmask));  // before sampling
//     int64_t id = Sample(logits, bitmask);
//     RETURN_IF_ERROR(matcher.AcceptToken(id));             // after
//     if (vocabulary->is_eos(id)) break;
//   }
//
// The matcher is a pushdown automaton over bytes: its state is the set of grammar stacks that
// the bytes so far leave open, and each state and byte lead to one next state. States and
// their byte transitions are interned and memoized, so a state seen before (say, inside a JSON
// string) costs a table look-up per byte; the mask is a walk of the vocabulary's byte trie that
// drops a subtree at the first byte the state rejects, and masks are cached per state. Forks
// share all of it: a server can keep one matcher per grammar and Fork() it per request.
//
// Thread safety: Grammar and TokenVocabulary are immutable and may be shared by any number of
// threads and matchers. A GrammarMatcher is for one request and one thread at a time; its
// copies (Fork()) share the memo tables, which are guarded by a mutex, so the copies may be
// used on different threads.
#ifndef LGPT_CORE_CONSTRAIN_MATCHER_H_
#define LGPT_CORE_CONSTRAIN_MATCHER_H_

#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/constrain/grammar.h"

namespace lgpt {

// A tokenizer's vocabulary as byte strings, with a prefix trie over them.
class TokenVocabulary {
 public:
  // token_bytes[id]: the exact bytes token `id` adds to the text. An empty string is a token
  // that a grammar never allows (special and control tokens), except the `eos_ids`, which
  // are allowed exactly when the grammar may end (and never as text, whatever their bytes).
  // InvalidArgument naming eos_ids for an id outside the vocabulary.
  static absl::StatusOr<std::shared_ptr<const TokenVocabulary>> Create(
      std::vector<std::string> token_bytes, std::vector<int64_t> eos_ids);

  int64_t size() const { return static_cast<int64_t>(token_bytes_.size()); }
  const std::string& token_bytes(int64_t id) const { return token_bytes_[id]; }
  bool is_eos(int64_t id) const;
  const std::vector<int64_t>& eos_ids() const { return eos_ids_; }

  // The trie in preorder: node i adds byte `byte` at depth `depth` (>= 1) to its parent's
  // bytes; its subtree is the nodes [i, subtree_end); the tokens whose bytes end at it are
  // node_tokens(i), and those of its whole subtree subtree_tokens(i).
  struct TrieNode {
    int32_t subtree_end;
    int32_t first_token;  // index into the tokens sorted by bytes
    int32_t depth;
    uint8_t byte;
  };
  int32_t num_nodes() const { return static_cast<int32_t>(nodes_.size()) - 1; }
  const TrieNode& node(int32_t i) const { return nodes_[i]; }
  absl::Span<const int32_t> node_tokens(int32_t i) const {
    return TokenRange(nodes_[i].first_token, nodes_[i + 1].first_token);
  }
  absl::Span<const int32_t> subtree_tokens(int32_t i) const {
    return TokenRange(nodes_[i].first_token, nodes_[nodes_[i].subtree_end].first_token);
  }
  // The bytes of node i and all nodes below it.
  const std::bitset<256>& subtree_bytes(int32_t i) const { return subtree_bytes_[i]; }
  // The most bytes a token of node i's subtree has from node i on (node i's byte included).
  int32_t subtree_height(int32_t i) const { return subtree_height_[i]; }
  int32_t max_depth() const { return max_depth_; }

 private:
  TokenVocabulary() = default;
  std::vector<std::string> token_bytes_;
  std::vector<int64_t> eos_ids_;
  std::vector<bool> is_eos_;
  absl::Span<const int32_t> TokenRange(int32_t begin, int32_t end) const {
    return absl::MakeConstSpan(sorted_ids_).subspan(begin, end - begin);
  }

  std::vector<TrieNode> nodes_;  // and a sentinel whose first_token is the number of tokens
  std::vector<std::bitset<256>> subtree_bytes_;
  std::vector<int32_t> subtree_height_;
  std::vector<int32_t> sorted_ids_;
  int32_t max_depth_ = 0;
};

class MatcherAutomaton;  // the shared memo tables (matcher.cc)

class GrammarMatcher {
 public:
  GrammarMatcher(std::shared_ptr<const Grammar> grammar,
                 std::shared_ptr<const TokenVocabulary> vocabulary);
  ~GrammarMatcher();
  // Copies are cheap (a state id and a shared pointer): one per choice when n > 1.
  GrammarMatcher(const GrammarMatcher&);
  GrammarMatcher& operator=(const GrammarMatcher&);
  GrammarMatcher Fork() const { return *this; }

  // Advances by token `id`. InvalidArgument, naming the token, when the grammar does not allow
  // it (an id outside the vocabulary, a token without bytes, EOS before the grammar may end,
  // anything after EOS); the matcher is unchanged then.
  absl::Status AcceptToken(int64_t id);
  // Advances by raw bytes (tests, forced prefixes). InvalidArgument when not allowed; the matcher
  // is unchanged then.
  absl::Status AcceptBytes(absl::string_view bytes);

  // Bit i % 32 of word i / 32 is set when token i may come next; the words past the vocabulary
  // (a model's padded vocabulary) are cleared, and ids beyond the span's 32 * size() bits are
  // left out. EOS ids are set exactly when CanEnd().
  void FillNextTokenMask(absl::Span<uint32_t> bitmask);
  // The same as one flag per token of the vocabulary.
  std::vector<bool> NextTokenMask();

  // Whether the text so far is a complete sentence of the grammar (EOS is allowed).
  bool CanEnd() const;
  // Whether nothing more can follow: EOS was accepted, or the grammar's sentence is complete
  // and cannot be extended. The server stops the request then.
  bool IsComplete() const;
  // Whether an EOS token was accepted.
  bool terminated() const { return terminated_; }

  const TokenVocabulary& vocabulary() const;

 private:
  std::shared_ptr<MatcherAutomaton> automaton_;
  int32_t state_ = 0;
  bool terminated_ = false;
};

}  // namespace lgpt

#endif  // LGPT_CORE_CONSTRAIN_MATCHER_H_
