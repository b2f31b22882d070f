#include "core/constrain/matcher.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_field.h"

namespace lgpt {

absl::StatusOr<std::shared_ptr<const TokenVocabulary>> TokenVocabulary::Create(
    std::vector<std::string> token_bytes, std::vector<int64_t> eos_ids) {
  std::shared_ptr<TokenVocabulary> v(new TokenVocabulary());
  v->token_bytes_ = std::move(token_bytes);
  v->is_eos_.assign(v->token_bytes_.size(), false);
  for (int64_t id : eos_ids) {
    if (id < 0 || id >= v->size()) {
      return InvalidFieldError(
          "eos_ids",
          absl::StrCat("eos_ids: ", id, " is outside the vocabulary of ", v->size(), " tokens"));
    }
    v->is_eos_[id] = true;
  }
  v->eos_ids_ = std::move(eos_ids);

  std::vector<int32_t> order;
  for (int32_t id = 0; id < static_cast<int32_t>(v->token_bytes_.size()); ++id) {
    // EOS ids are the end, whatever their bytes: they stay out of the trie.
    if (!v->token_bytes_[id].empty() && !v->is_eos_[id]) order.push_back(id);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return v->token_bytes_[a] < v->token_bytes_[b]; });
  std::vector<int32_t> path;  // the node at each depth of the previous token's bytes
  std::vector<int32_t> parent;
  absl::string_view previous;
  const auto close_to = [&](size_t depth) {
    while (path.size() > depth) {
      v->nodes_[path.back()].subtree_end = static_cast<int32_t>(v->nodes_.size());
      path.pop_back();
    }
  };
  for (int32_t id : order) {
    const std::string& bytes = v->token_bytes_[id];
    size_t common = 0;
    while (common < bytes.size() && common < previous.size() && bytes[common] == previous[common]) {
      ++common;
    }
    close_to(common);
    for (size_t k = common; k < bytes.size(); ++k) {
      parent.push_back(path.empty() ? -1 : path.back());
      path.push_back(static_cast<int32_t>(v->nodes_.size()));
      v->nodes_.push_back(TrieNode{0, static_cast<int32_t>(v->sorted_ids_.size()),
                                   static_cast<int32_t>(k + 1), static_cast<uint8_t>(bytes[k])});
    }
    v->sorted_ids_.push_back(id);
    v->max_depth_ = std::max(v->max_depth_, static_cast<int32_t>(bytes.size()));
    previous = bytes;
  }
  close_to(0);
  const int32_t n = static_cast<int32_t>(v->nodes_.size());
  v->subtree_bytes_.resize(n);
  v->subtree_height_.assign(n, 1);
  for (int32_t i = n - 1; i >= 0; --i) {  // children come after their parent
    v->subtree_bytes_[i].set(v->nodes_[i].byte);
    if (parent[i] >= 0) {
      v->subtree_bytes_[parent[i]] |= v->subtree_bytes_[i];
      v->subtree_height_[parent[i]] =
          std::max(v->subtree_height_[parent[i]], v->subtree_height_[i] + 1);
    }
  }
  v->nodes_.push_back(TrieNode{n, static_cast<int32_t>(v->sorted_ids_.size()), 0, 0});
  return std::shared_ptr<const TokenVocabulary>(std::move(v));
}

bool TokenVocabulary::is_eos(int64_t id) const { return id >= 0 && id < size() && is_eos_[id]; }

// The states of one (grammar, vocabulary) pair, interned, with memoized byte transitions and
// cached masks. A stack is a linked list of grammar positions interned as ids: node 0 is the
// empty stack (the root rule is complete), node n > 0 is (position, parent node). A state is
// the sorted set of its stacks; state 0 is dead (no stack), and every other state's stacks,
// apart from node 0, have a byte-set element at their top.
class MatcherAutomaton {
 public:
  MatcherAutomaton(std::shared_ptr<const Grammar> grammar,
                   std::shared_ptr<const TokenVocabulary> vocabulary)
      : grammar_(std::move(grammar)), vocabulary_(std::move(vocabulary)) {
    nodes_.emplace_back(-1, -1);
    std::vector<int32_t> stacks;
    InternState(&stacks);  // dead: no live byte, all transitions to itself
    visited_.clear();
    for (int32_t position : grammar_->alternatives(grammar_->root())) {
      Expand(position, 0, &stacks);
    }
    initial_ = InternState(&stacks);
    words_ = static_cast<size_t>((vocabulary_->size() + 31) / 32);
    depth_states_.resize(vocabulary_->max_depth() + 1);
  }

  int32_t initial() const { return initial_; }
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }
  std::mutex& mu() { return mu_; }

  bool CanEnd(int32_t state) { return can_end_[state]; }
  bool Complete(int32_t state) { return complete_[state]; }

  int32_t Next(int32_t state, uint8_t byte) {
    const int32_t next = trans_[static_cast<size_t>(state) * 256 + byte];
    return next >= 0 ? next : ComputeNext(state, byte);
  }

  // The mask of `state` (words_ words, EOS included), computed or from the cache.
  const std::vector<uint32_t>& Mask(int32_t state) {
    if (static_cast<size_t>(state) < masks_.size() && !masks_[state].empty()) {
      return masks_[state];
    }
    if (mask_bytes_ + words_ * 4 > kMaskCacheBytes) {
      masks_.clear();
      mask_bytes_ = 0;
    }
    if (masks_.size() <= static_cast<size_t>(state)) masks_.resize(state + 1);
    std::vector<uint32_t>& mask = masks_[state];
    mask.assign(words_, 0);
    mask_bytes_ += words_ * 4;
    ComputeMask(state, mask.data());
    return mask;
  }

 private:
  static constexpr size_t kMaskCacheBytes = size_t{64} << 20;

  void ComputeMask(int32_t state, uint32_t* words) {
    const TokenVocabulary& v = *vocabulary_;
    int32_t* at = depth_states_.data();
    at[0] = state;
    const int32_t n = v.num_nodes();
    const TokenVocabulary::TrieNode* nodes = &v.node(0);
    const int32_t* trans = trans_.data();  // refreshed when a new state grows the table
    for (int32_t i = 0; i < n;) {
      const TokenVocabulary::TrieNode& node = nodes[i];
      const int32_t from = at[node.depth - 1];
      int32_t next = trans[static_cast<size_t>(from) * 256 + node.byte];
      if (next < 0) {
        next = ComputeNext(from, node.byte);
        trans = trans_.data();
      }
      if (next == 0) {  // a rejected prefix rejects its whole subtree
        i = node.subtree_end;
        continue;
      }
      // A subtree whose bytes all take `from` along a run of live states (inside a string:
      // a state that loops, or a count of characters left) accepts all of its tokens.
      if (node.subtree_end - i >= kRunMinNodes && Visit(from) >= kRunMinVisits) {
        const Run& run = RunOf(from);
        trans = trans_.data();  // RunOf() may have added states
        if (run.length >= v.subtree_height(i) && (v.subtree_bytes(i) & ~run.bytes).none()) {
          for (int32_t id : v.subtree_tokens(i)) words[id >> 5] |= 1u << (id & 31);
          i = node.subtree_end;
          continue;
        }
      }
      at[node.depth] = next;
      for (int32_t id : v.node_tokens(i)) words[id >> 5] |= 1u << (id & 31);
      ++i;
    }
    if (can_end_[state]) {
      for (int64_t id : v.eos_ids()) words[id >> 5] |= 1u << (id & 31);
    }
  }

  // Subtrees smaller than this are walked; a state's run (its 256 transitions) is worked out
  // once the walks have met it at kRunMinVisits larger subtrees, so that the walks of
  // structural states, which end soon, do not pay for it. A run's bytes are at least
  // kRunMinBytes (characters of a string, say), or it is none.
  static constexpr int32_t kRunMinNodes = 16;
  static constexpr uint32_t kRunMinVisits = 64;
  static constexpr size_t kRunMinBytes = 16;

  uint32_t Visit(int32_t state) {
    if (visits_.size() <= static_cast<size_t>(state)) visits_.resize(states_.size());
    return ++visits_[state];
  }

  // A state's largest class of bytes that take it to one same live state, and how many such
  // steps the bytes of the class keep every state live (a state's run continues into its
  // successor's when the successor's set holds its own): kInfinite for a state that loops on them.
  struct Run {
    std::bitset<256> bytes;
    int32_t next = 0;
    int64_t length = -1;  // -1: not computed yet
  };
  static constexpr int64_t kInfinite = int64_t{1} << 40;

  const Run& RunOf(int32_t state) {
    runs_.resize(states_.size());
    if (runs_[state].length >= 0) return runs_[state];
    // The chain of successors, each grouped, up to a known run, a state without live successor,
    // a loop or a state met before (in progress: its length is taken as 0, which is safe).
    std::vector<int32_t> chain;
    for (int32_t x = state; runs_[x].length == -1;) {
      // The largest class of live bytes (they share their successor): computing the other
      // classes' successors would make states (inside characters, say) that runs do not use.
      int count[256] = {};
      const int32_t* row = &trans_[static_cast<size_t>(x) * 256];
      const uint8_t* classes = &classes_[static_cast<size_t>(x) * 256];
      int best_class = -1;
      for (int b = 0; b < 256; ++b) {
        if (row[b] == 0) continue;  // dead
        if (++count[classes[b]] > (best_class < 0 ? 0 : count[best_class])) best_class = classes[b];
      }
      std::bitset<256> bytes;
      for (int b = 0; b < 256 && best_class >= 0; ++b) {
        if (row[b] != 0 && classes[b] == best_class) bytes.set(b);
      }
      const int32_t next = best_class >= 0 ? Next(x, static_cast<uint8_t>(best_class)) : 0;
      runs_.resize(states_.size());
      Run& run = runs_[x];
      run.length = -2;  // in progress
      run.bytes = bytes;
      run.next = next;
      const size_t best = bytes.count();
      if (best < kRunMinBytes || next == 0) run.bytes.reset();
      chain.push_back(x);
      if (run.bytes.none() || run.next == x) break;
      x = run.next;
    }
    for (size_t k = chain.size(); k-- > 0;) {
      Run& run = runs_[chain[k]];
      if (run.bytes.none()) {
        run.length = 0;
      } else if (run.next == chain[k]) {
        run.length = kInfinite;
      } else {
        const Run& next = runs_[run.next];
        const bool holds = (run.bytes & ~next.bytes).none();
        run.length = holds ? std::min(kInfinite, 1 + std::max<int64_t>(next.length, 0)) : 1;
      }
    }
    return runs_[state];
  }

  int32_t InternNode(int32_t position, int32_t parent) {
    const uint64_t key = (static_cast<uint64_t>(position) << 32) | static_cast<uint32_t>(parent);
    auto [it, inserted] = node_ids_.emplace(key, static_cast<int32_t>(nodes_.size()));
    if (inserted) nodes_.emplace_back(position, parent);
    return it->second;
  }

  // Sorts and dedupes *stacks, and returns the id of the state of those stacks.
  int32_t InternState(std::vector<int32_t>* stacks) {
    std::sort(stacks->begin(), stacks->end());
    stacks->erase(std::unique(stacks->begin(), stacks->end()), stacks->end());
    auto it = state_ids_.find(*stacks);
    if (it != state_ids_.end()) return it->second;
    const int32_t id = static_cast<int32_t>(states_.size());
    state_ids_.emplace(*stacks, id);
    can_end_.push_back(!stacks->empty() && (*stacks)[0] == 0);
    complete_.push_back(stacks->size() == 1 && (*stacks)[0] == 0);
    states_.push_back(*stacks);
    // Bytes that no stack's top takes lead to the dead state: only the others are computed.
    // Bytes that the same tops take lead to the same state: a class of such bytes is computed
    // once, for its first byte (the class's byte in `classes_`).
    std::vector<int32_t> sets;  // the distinct byte sets on top
    for (int32_t stack : *stacks) {
      if (stack == 0) continue;
      const int32_t set = grammar_->element(nodes_[stack].first).arg;
      if (std::find(sets.begin(), sets.end(), set) == sets.end()) sets.push_back(set);
    }
    trans_.resize(trans_.size() + 256, 0);
    classes_.resize(classes_.size() + 256);
    int32_t* row = &trans_[static_cast<size_t>(id) * 256];
    uint8_t* classes = &classes_[static_cast<size_t>(id) * 256];
    if (sets.size() > 64) {  // too many for a signature: each byte is its own class
      Grammar::ByteSet live;
      for (int32_t set : sets) live |= grammar_->byte_set(set);
      for (int b = 0; b < 256; ++b) {
        if (live[b]) row[b] = -1;
        classes[b] = static_cast<uint8_t>(b);
      }
      return id;
    }
    uint64_t signature[256] = {};  // which sets take each byte
    for (size_t k = 0; k < sets.size(); ++k) {
      const Grammar::ByteSet& set = grammar_->byte_set(sets[k]);
      for (int b = 0; b < 256; ++b) {
        if (set[b]) signature[b] |= uint64_t{1} << k;
      }
    }
    std::vector<std::pair<uint64_t, uint8_t>> firsts;  // each signature's first byte
    for (int b = 0; b < 256; ++b) {
      if (signature[b] == 0) continue;
      row[b] = -1;
      auto it = std::find_if(firsts.begin(), firsts.end(),
                             [&](const auto& first) { return first.first == signature[b]; });
      if (it == firsts.end()) it = firsts.insert(firsts.end(), {signature[b], b});
      classes[b] = it->second;
    }
    return id;
  }

  // Adds to *out the stacks that continue at `position` over the stack `parent`, expanded until
  // a byte set is on top (or the stack is empty).
  // (With a work list, not recursion: rules may nest deep.)
  void Expand(int32_t position, int32_t parent, std::vector<int32_t>* out) {
    std::vector<std::pair<int32_t, int32_t>>& work = work_;
    work.assign(1, {position, parent});
    while (!work.empty()) {
      std::tie(position, parent) = work.back();
      work.pop_back();
      for (;;) {
        const Grammar::Element& e = grammar_->element(position);
        if (e.kind == Grammar::Element::kEnd) {
          if (parent == 0) {
            out->push_back(0);
            break;
          }
          std::tie(position, parent) = nodes_[parent];
          continue;
        }
        if (e.kind == Grammar::Element::kBytes) {
          out->push_back(InternNode(position, parent));
          break;
        }
        // A reference in tail position returns straight to the parent: right recursion (the
        // repetitions) keeps the stack flat.
        const int32_t continuation = grammar_->element(position + 1).kind == Grammar::Element::kEnd
                                         ? parent
                                         : InternNode(position + 1, parent);
        const uint64_t key =
            (static_cast<uint64_t>(e.arg) << 32) | static_cast<uint32_t>(continuation);
        if (visited_.insert(key).second) {
          for (int32_t alternative : grammar_->alternatives(e.arg)) {
            work.emplace_back(alternative, continuation);
          }
        }
        break;
      }
    }
  }

  int32_t ComputeNext(int32_t state, uint8_t byte) {
    std::vector<int32_t>& next = scratch_;
    next.clear();
    visited_.clear();
    // Expand adds stack nodes, never states, so the state's stacks stay in place.
    for (int32_t stack : states_[state]) {
      if (stack == 0) continue;
      const auto [position, parent] = nodes_[stack];
      if (grammar_->byte_set(grammar_->element(position).arg).test(byte)) {
        Expand(position + 1, parent, &next);
      }
    }
    const int32_t id = InternState(&next);
    int32_t* row = &trans_[static_cast<size_t>(state) * 256];
    const uint8_t* classes = &classes_[static_cast<size_t>(state) * 256];
    for (int b = 0; b < 256; ++b) {
      if (row[b] < 0 && classes[b] == classes[byte]) row[b] = id;
    }
    return id;
  }

  const std::shared_ptr<const Grammar> grammar_;
  const std::shared_ptr<const TokenVocabulary> vocabulary_;
  int32_t initial_ = 0;
  size_t words_ = 0;

  // A std::mutex, which ThreadSanitizer understands (the system Abseil is not built for it).
  std::mutex mu_;
  std::vector<std::pair<int32_t, int32_t>> nodes_;
  absl::flat_hash_map<uint64_t, int32_t> node_ids_;
  std::vector<std::vector<int32_t>> states_;
  absl::flat_hash_map<std::vector<int32_t>, int32_t> state_ids_;
  std::vector<bool> can_end_, complete_;
  std::vector<int32_t> trans_;    // states x 256; -1: not computed yet
  std::vector<uint8_t> classes_;  // states x 256: the first byte of each byte's class
  absl::flat_hash_set<uint64_t> visited_;
  std::vector<std::vector<uint32_t>> masks_;
  size_t mask_bytes_ = 0;
  std::vector<int32_t> depth_states_;
  std::vector<Run> runs_;
  std::vector<uint32_t> visits_;
  std::vector<int32_t> scratch_;
  std::vector<std::pair<int32_t, int32_t>> work_;  // Expand's
};

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar,
                               std::shared_ptr<const TokenVocabulary> vocabulary)
    : automaton_(std::make_shared<MatcherAutomaton>(std::move(grammar), std::move(vocabulary))),
      state_(automaton_->initial()) {}

GrammarMatcher::~GrammarMatcher() = default;
GrammarMatcher::GrammarMatcher(const GrammarMatcher&) = default;
GrammarMatcher& GrammarMatcher::operator=(const GrammarMatcher&) = default;

const TokenVocabulary& GrammarMatcher::vocabulary() const { return automaton_->vocabulary(); }

absl::Status GrammarMatcher::AcceptToken(int64_t id) {
  const TokenVocabulary& v = vocabulary();
  const auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token ", id,
        id >= 0 && id < v.size() ? absl::StrCat(" (\"", absl::CHexEscape(v.token_bytes(id)), "\")")
                                 : "",
        " is not allowed by the grammar: ", why));
  };
  if (id < 0 || id >= v.size()) return refuse("outside the vocabulary");
  if (terminated_) return refuse("the output already ended with EOS");
  if (v.is_eos(id)) {
    if (!CanEnd()) return refuse("EOS before the grammar's sentence is complete");
    terminated_ = true;
    return absl::OkStatus();
  }
  if (v.token_bytes(id).empty()) return refuse("a special token");
  std::lock_guard<std::mutex> lock(automaton_->mu());
  int32_t state = state_;
  for (char c : v.token_bytes(id)) {
    state = automaton_->Next(state, static_cast<uint8_t>(c));
    if (state == 0) return refuse("the grammar does not continue so");
  }
  state_ = state;
  return absl::OkStatus();
}

absl::Status GrammarMatcher::AcceptBytes(absl::string_view bytes) {
  if (terminated_) return absl::InvalidArgumentError("the output already ended with EOS");
  std::lock_guard<std::mutex> lock(automaton_->mu());
  int32_t state = state_;
  for (size_t i = 0; i < bytes.size(); ++i) {
    state = automaton_->Next(state, static_cast<uint8_t>(bytes[i]));
    if (state == 0) {
      return absl::InvalidArgumentError(absl::StrCat("the grammar does not allow byte ", i,
                                                     " of \"", absl::CHexEscape(bytes), "\""));
    }
  }
  state_ = state;
  return absl::OkStatus();
}

void GrammarMatcher::FillNextTokenMask(absl::Span<uint32_t> bitmask) {
  std::fill(bitmask.begin(), bitmask.end(), 0u);
  if (terminated_) return;
  std::lock_guard<std::mutex> lock(automaton_->mu());
  const std::vector<uint32_t>& mask = automaton_->Mask(state_);
  std::memcpy(bitmask.data(), mask.data(), std::min(mask.size(), bitmask.size()) * 4);
}

std::vector<bool> GrammarMatcher::NextTokenMask() {
  const int64_t n = vocabulary().size();
  std::vector<uint32_t> words((n + 31) / 32);
  FillNextTokenMask(absl::MakeSpan(words));
  std::vector<bool> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = (words[i >> 5] >> (i & 31)) & 1;
  return out;
}

bool GrammarMatcher::CanEnd() const {
  if (terminated_) return false;
  std::lock_guard<std::mutex> lock(automaton_->mu());
  return automaton_->CanEnd(state_);
}

bool GrammarMatcher::IsComplete() const {
  if (terminated_) return true;
  std::lock_guard<std::mutex> lock(automaton_->mu());
  return automaton_->Complete(state_);
}

}  // namespace lgpt
