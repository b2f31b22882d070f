#include "core/serving/grammar_constraint.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace lgpt {

GrammarConstraint::GrammarConstraint(GrammarMatcher matcher) : matcher_(std::move(matcher)) {}

void GrammarConstraint::BanDisallowed(float* row, int64_t vocab) {
  mask_.assign(static_cast<size_t>((vocab + 31) / 32), 0);
  matcher_.FillNextTokenMask(absl::MakeSpan(mask_));
  constexpr float kBanned = -std::numeric_limits<float>::infinity();
  for (int64_t word = 0; word < static_cast<int64_t>(mask_.size()); ++word) {
    const uint32_t bits = mask_[word];
    if (bits == 0xffffffffu) continue;
    const int64_t end = std::min<int64_t>(vocab, 32 * word + 32);
    for (int64_t id = 32 * word; id < end; ++id) {
      if ((bits >> (id % 32) & 1u) == 0) row[id] = kBanned;
    }
  }
}

absl::Status GrammarConstraint::Accept(int64_t token) { return matcher_.AcceptToken(token); }

std::unique_ptr<TokenConstraint> GrammarConstraint::Clone() const {
  return std::make_unique<GrammarConstraint>(matcher_.Fork());
}

}  // namespace lgpt
