// The field payload: set, read, kept through a new message, and rendered in a boundary's terms
// (only the payload's mentions, whole names only, values included).
#include "core/base/status_field.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/cord.h"

namespace lgpt {
namespace {

// A boundary's words: --flags for three fields, values as --flag=value.
std::optional<std::string> Flag(const FieldMention& mention) {
  static const std::map<std::string, std::string> kFlags = {
      {"KVCacheSpec.budget", "--kv_budget"},
      {"KVCacheSpec.policy", "--kv_cache"},
      {"KVCacheSpec.positions", "--kv_positions"},
      {"EngineOptions.verify_checksums", "--verify_checksums"},
      {"RequestOptions.max_new_tokens", "--max_new_tokens"}};
  const auto it = kFlags.find(std::string(mention.path));
  if (it == kFlags.end()) return std::nullopt;
  return mention.value ? it->second + "=" + std::string(*mention.value) : it->second;
}

TEST(StatusFieldTest, TheFieldTravelsInThePayload) {
  const absl::Status status = InvalidFieldError("KVCacheSpec.budget", "KVCacheSpec.budget < 1");
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_EQ(status.message(), "KVCacheSpec.budget < 1");
  EXPECT_EQ(ErrorField(status), "KVCacheSpec.budget");
  EXPECT_TRUE(status.GetPayload(kFieldPayloadUrl).has_value());
  EXPECT_EQ(kFieldPayloadUrl, "lgpt.dev/field");

  const absl::Status two = FieldError(
      absl::StatusCode::kResourceExhausted, "SchedulerOptions.kv_pool_bytes", "m",
      {"KVCacheSpec.policy", FieldRef("RequestOptions.max_new_tokens", "max_new_tokens")});
  EXPECT_TRUE(absl::IsResourceExhausted(two));
  EXPECT_EQ(ErrorField(two), "SchedulerOptions.kv_pool_bytes");
  const std::vector<FieldRef> fields = ErrorFields(two);
  ASSERT_EQ(fields.size(), 3u);
  EXPECT_EQ(fields[1].path, "KVCacheSpec.policy");
  EXPECT_EQ(fields[1].text(), "KVCacheSpec.policy");
  EXPECT_EQ(fields[2].path, "RequestOptions.max_new_tokens");
  EXPECT_EQ(fields[2].text(), "max_new_tokens");
}

TEST(StatusFieldTest, PlainStatusesAndOkNameNoField) {
  EXPECT_EQ(ErrorField(absl::InvalidArgumentError("KVCacheSpec.budget < 1")), std::nullopt);
  EXPECT_TRUE(ErrorFields(absl::InternalError("x")).empty());
  EXPECT_TRUE(WithFields(absl::OkStatus(), "KVCacheSpec.budget").ok());
  EXPECT_EQ(ErrorField(WithFields(absl::OkStatus(), "KVCacheSpec.budget")), std::nullopt);
  // A plain status renders as it is, whatever fields its text happens to name.
  EXPECT_EQ(MessageInTerms(absl::InvalidArgumentError("KVCacheSpec.budget < 1"), Flag),
            "KVCacheSpec.budget < 1");
}

TEST(StatusFieldTest, WithFieldsReplacesAndWithMessageKeeps) {
  absl::Status status = WithFields(absl::InvalidArgumentError("a"), "KVCacheSpec.budget");
  status = WithFields(status, "KVCacheSpec.policy");
  EXPECT_EQ(ErrorField(status), "KVCacheSpec.policy");
  status.SetPayload("other.dev/x", absl::Cord("y"));
  const absl::Status renewed = WithMessage(status, "KVCacheSpec.policy is wrong (and more)");
  EXPECT_EQ(renewed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(renewed.message(), "KVCacheSpec.policy is wrong (and more)");
  EXPECT_EQ(ErrorField(renewed), "KVCacheSpec.policy");
  ASSERT_TRUE(renewed.GetPayload("other.dev/x").has_value());
  EXPECT_EQ(std::string(*renewed.GetPayload("other.dev/x")), "y");
  EXPECT_EQ(MessageInTerms(renewed, Flag), "--kv_cache is wrong (and more)");
}

TEST(StatusFieldTest, OnlyThePayloadsFieldsAreRendered) {
  // The message names two fields; the payload one: the other stays as written.
  const absl::Status status = InvalidFieldError(
      "KVCacheSpec.budget", "KVCacheSpec.budget must be >= 1 for KVCacheSpec.policy h2o");
  EXPECT_EQ(MessageInTerms(status, Flag), "--kv_budget must be >= 1 for KVCacheSpec.policy h2o");
  const absl::Status both =
      InvalidFieldError("KVCacheSpec.budget",
                        "KVCacheSpec.budget must be >= 1 for KVCacheSpec.policy h2o, "
                        "KVCacheSpec.budget",
                        {"KVCacheSpec.policy"});
  EXPECT_EQ(MessageInTerms(both, Flag), "--kv_budget must be >= 1 for --kv_cache h2o, --kv_budget");
  // A field the term does not know stays as the library wrote it.
  EXPECT_EQ(MessageInTerms(InvalidFieldError("X.y", "X.y is bad"), Flag), "X.y is bad");
}

TEST(StatusFieldTest, MentionsAreWholeNames) {
  const std::vector<FieldRef> budget = {"KVCacheSpec.budget"};
  EXPECT_EQ(RenderFields("KVCacheSpec.budget_rule, KVCacheSpec.budget.x, XKVCacheSpec.budget, "
                         "a.KVCacheSpec.budget",
                         budget, Flag),
            "KVCacheSpec.budget_rule, KVCacheSpec.budget.x, XKVCacheSpec.budget, "
            "a.KVCacheSpec.budget");
  EXPECT_EQ(RenderFields("(KVCacheSpec.budget), 'KVCacheSpec.budget'. KVCacheSpec.budget[0] "
                         "KVCacheSpec.budget.",
                         budget, Flag),
            "(--kv_budget), '--kv_budget'. --kv_budget[0] --kv_budget.");
  // A field the message writes otherwise than its path.
  const std::vector<FieldRef> tokens = {
      FieldRef("RequestOptions.max_new_tokens", "max_new_tokens")};
  EXPECT_EQ(RenderFields("prompt plus max_new_tokens (9); my_max_new_tokens", tokens, Flag),
            "prompt plus --max_new_tokens (9); my_max_new_tokens");
}

TEST(StatusFieldTest, TheTermSeesTheValue) {
  std::vector<std::string> seen;
  const FieldTerm record = [&seen](const FieldMention& mention) -> std::optional<std::string> {
    seen.push_back(std::string(mention.path) + "|" + std::string(mention.value.value_or("-")) +
                   "|" + std::string(mention.text));
    return Flag(mention);
  };
  const std::vector<FieldRef> fields = {"KVCacheSpec.positions", "EngineOptions.verify_checksums",
                                        "KVCacheSpec.budget"};
  EXPECT_EQ(RenderFields("KVCacheSpec.positions=cache needs KVCacheSpec.budget below 9; set "
                         "EngineOptions.verify_checksums = false. [0, KVCacheSpec.budget=4], "
                         "KVCacheSpec.positions=absolute.",
                         fields, record),
            "--kv_positions=cache needs --kv_budget below 9; set --verify_checksums=false. "
            "[0, --kv_budget=4], --kv_positions=absolute.");
  EXPECT_EQ(seen, (std::vector<std::string>{
                      "KVCacheSpec.positions|cache|KVCacheSpec.positions=cache",
                      "KVCacheSpec.budget|-|KVCacheSpec.budget",
                      "EngineOptions.verify_checksums|false|EngineOptions.verify_checksums = false",
                      "KVCacheSpec.budget|4|KVCacheSpec.budget=4",
                      "KVCacheSpec.positions|absolute|KVCacheSpec.positions=absolute"}));
  // A field written with its value.
  seen.clear();
  const std::vector<FieldRef> written = {
      FieldRef("EngineOptions.quantize", "EngineOptions.quantize int4"),
      FieldRef("EngineOptions.dtype", "EngineOptions.dtype float32")};
  EXPECT_EQ(RenderFields("EngineOptions.quantize int4 needs EngineOptions.dtype float32; "
                         "EngineOptions.quantize int8, EngineOptions.dtype",
                         written, record),
            "EngineOptions.quantize int4 needs EngineOptions.dtype float32; "
            "EngineOptions.quantize int8, EngineOptions.dtype");
  EXPECT_EQ(seen,
            (std::vector<std::string>{"EngineOptions.quantize|int4|EngineOptions.quantize int4",
                                      "EngineOptions.dtype|float32|EngineOptions.dtype float32"}));
  // "=" with nothing after it assigns nothing.
  EXPECT_EQ(RenderFields("KVCacheSpec.budget= 3", fields, Flag), "--kv_budget= 3");
}

TEST(StatusFieldTest, RenameFieldRenamesPayloadAndMentions) {
  const absl::Status loaded = absl::DataLossError(
      "x fails its CRC-32 check; set LoadOptions.verify_checksums = false to load it anyway");
  const absl::Status named = WithFields(loaded, "LoadOptions.verify_checksums");
  const absl::Status renamed =
      RenameField(named, "LoadOptions.verify_checksums", "EngineOptions.verify_checksums");
  EXPECT_TRUE(absl::IsDataLoss(renamed));
  EXPECT_EQ(renamed.message(),
            "x fails its CRC-32 check; set EngineOptions.verify_checksums = false to load it "
            "anyway");
  EXPECT_EQ(ErrorField(renamed), "EngineOptions.verify_checksums");
  EXPECT_EQ(MessageInTerms(renamed, Flag),
            "x fails its CRC-32 check; set --verify_checksums=false to load it anyway");
  // Without the field in its payload a status is left alone.
  EXPECT_EQ(RenameField(loaded, "LoadOptions.verify_checksums", "EngineOptions.verify_checksums"),
            loaded);
  // The others keep their place.
  const absl::Status many = InvalidFieldError("A.a", "A.a and B.b", {"B.b"});
  const absl::Status renamed_other = RenameField(many, "B.b", "C.c");
  EXPECT_EQ(renamed_other.message(), "A.a and C.c");
  EXPECT_EQ(ErrorField(renamed_other), "A.a");
  EXPECT_EQ(ErrorFields(renamed_other)[1].path, "C.c");
}

}  // namespace
}  // namespace lgpt
