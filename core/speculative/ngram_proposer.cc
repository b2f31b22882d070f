#include "core/speculative/ngram_proposer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"

namespace lgpt {

absl::Status ValidateNgramSizes(int64_t min_n, int64_t max_n, absl::string_view owner,
                                absl::string_view min_name, absl::string_view max_name) {
  const std::string min_field = absl::StrCat(owner, ".", min_name);
  const std::string max_field = absl::StrCat(owner, ".", max_name);
  if (min_n < 1) {
    return InvalidFieldError(min_field, absl::StrCat(min_field, " must be >= 1, got ", min_n));
  }
  if (max_n < min_n) {
    return InvalidFieldError(
        max_field,
        absl::StrCat(max_field, " (", max_n, ") must be >= ", min_field, " (", min_n, ")"),
        {min_field});
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<NgramProposer>> NgramProposer::Create(
    const NgramProposerOptions& options) {
  RETURN_IF_ERROR(
      ValidateNgramSizes(options.min_n, options.max_n, "NgramProposerOptions", "min_n", "max_n"));
  return std::unique_ptr<NgramProposer>(new NgramProposer(options));
}

std::string NgramProposer::DebugName() const {
  return absl::StrCat("ngram(", options_.min_n, "..", options_.max_n, ")");
}

absl::StatusOr<Proposal> NgramProposer::Propose(absl::Span<const int64_t> context, int64_t k) {
  Proposal proposal;
  const int64_t length = static_cast<int64_t>(context.size());
  if (k < 1) return proposal;
  for (int64_t n = std::min(options_.max_n, length - 1); n >= options_.min_n; --n) {
    const int64_t* suffix = context.data() + length - n;
    // The latest earlier occurrence: starts from length - n - 1 down (it may overlap the
    // suffix itself; what followed it is then partly the suffix, as in a repeating run).
    for (int64_t start = length - n - 1; start >= 0; --start) {
      if (!std::equal(suffix, suffix + n, context.data() + start)) continue;
      const int64_t from = start + n, count = std::min(k, length - from);
      proposal.tokens.assign(context.begin() + from, context.begin() + from + count);
      return proposal;
    }
  }
  return proposal;
}

}  // namespace lgpt
