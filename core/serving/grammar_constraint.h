// Constrained decoding for a request: a TokenConstraint (core/model/next_token.h) over a
// GrammarMatcher (core/constrain/matcher.h), so a grammar, a regex or a JSON schema decides
// which tokens a request may sample, in Generate, GenerateBatch's choosers and the scheduler's
// batched step alike (RequestOptions.constraint).
//
//   ASSIGN_OR_RETURN(auto vocabulary,
//                    TokenVocabulary::Create(tokenizer.VocabularyBytes(), {eos_id}));
//   ASSIGN_OR_RETURN(auto schema, CompileJsonSchema(json, "response_format.json_schema.schema"));
//   options.constraint = std::make_shared<GrammarConstraint>(GrammarMatcher(schema, vocabulary));
#ifndef LGPT_CORE_SERVING_GRAMMAR_CONSTRAINT_H_
#define LGPT_CORE_SERVING_GRAMMAR_CONSTRAINT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/constrain/matcher.h"
#include "core/model/next_token.h"

namespace lgpt {

class GrammarConstraint : public TokenConstraint {
 public:
  explicit GrammarConstraint(GrammarMatcher matcher);

  // Bans every id the grammar does not allow next, ids past its vocabulary included (a model's
  // padded vocabulary).
  void BanDisallowed(float* row, int64_t vocab) override;
  absl::Status Accept(int64_t token) override;
  std::unique_ptr<TokenConstraint> Clone() const override;
  bool Done() const override { return matcher_.IsComplete(); }

  const GrammarMatcher& matcher() const { return matcher_; }

 private:
  GrammarMatcher matcher_;
  std::vector<uint32_t> mask_;  // reused between steps
};

}  // namespace lgpt

#endif  // LGPT_CORE_SERVING_GRAMMAR_CONSTRAINT_H_
