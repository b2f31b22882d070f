// OpenAI request bodies into RequestOptions (defaults, every field, every refusal) and the
// JSON lgpt answers with.
#include "tools/server/openai_api.h"

#include <gtest/gtest.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "core/base/status_field.h"
#include "nlohmann/json.hpp"

namespace lgpt {
namespace {

using json = nlohmann::json;

ApiRequest ParseOk(ApiEndpoint endpoint, const std::string& body) {
  absl::StatusOr<ApiRequest> request = ParseApiRequest(endpoint, body);
  EXPECT_TRUE(request.ok()) << request.status() << " for " << body;
  return request.ok() ? *request : ApiRequest();
}

std::string ParseError(ApiEndpoint endpoint, const std::string& body) {
  absl::StatusOr<ApiRequest> request = ParseApiRequest(endpoint, body);
  EXPECT_FALSE(request.ok()) << body;
  if (request.ok()) return "";
  EXPECT_EQ(request.status().code(), absl::StatusCode::kInvalidArgument) << request.status();
  return std::string(request.status().message());
}

constexpr ApiEndpoint kCompletions = ApiEndpoint::kCompletions;
constexpr ApiEndpoint kChat = ApiEndpoint::kChat;

TEST(OpenAiApiTest, CompletionDefaultsAreOpenAis) {
  const ApiRequest request = ParseOk(kCompletions, R"({"prompt": "Hello"})");
  ASSERT_EQ(request.prompts.size(), 1u);
  EXPECT_EQ(request.prompts[0].text, "Hello");
  EXPECT_FALSE(request.max_tokens.has_value());
  EXPECT_EQ(request.options.sampling.temperature, 1.0);
  EXPECT_EQ(request.options.sampling.top_p, 1.0);
  EXPECT_EQ(request.options.sampling.top_k, 0);
  EXPECT_FALSE(request.seed_given);
  EXPECT_FALSE(request.stream);
  EXPECT_EQ(request.options.kv_cache.policy, "dense");
}

TEST(OpenAiApiTest, EveryFieldIsRead) {
  const ApiRequest request = ParseOk(kCompletions, R"({
      "model": "m", "prompt": [1, 2, 3], "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
      "top_k": 20, "seed": 42, "stop": ["a", "bc"], "stream": true,
      "stream_options": {"include_usage": true}, "kv_cache": "sink", "kv_budget": 64,
      "kv_bits": 8, "user": "x", "n": 1, "logprobs": null, "ignore_eos": true})");
  EXPECT_TRUE(request.ignore_eos);
  EXPECT_FALSE(request.options.stop_at_eos);
  EXPECT_EQ(request.model, "m");
  ASSERT_EQ(request.prompts.size(), 1u);
  EXPECT_EQ(request.prompts[0].ids, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(*request.max_tokens, 7);
  EXPECT_EQ(request.options.sampling.temperature, 0.5);
  EXPECT_EQ(request.options.sampling.top_p, 0.9);
  EXPECT_EQ(request.options.sampling.top_k, 20);
  EXPECT_TRUE(request.seed_given);
  EXPECT_EQ(request.options.seed, 42u);
  EXPECT_EQ(request.options.stop_sequences, (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(request.stream);
  EXPECT_TRUE(request.include_usage);
  EXPECT_EQ(request.options.kv_cache.policy, "sink");
  EXPECT_EQ(request.options.kv_cache.budget, 64);
  EXPECT_EQ(request.options.kv_cache.bits, 8);
  EXPECT_EQ(ParseOk(kCompletions, R"({"prompt": "x", "stop": "end"})").options.stop_sequences,
            std::vector<std::string>{"end"});
  EXPECT_EQ(ParseOk(kCompletions, R"({"prompt": "x", "top_k": -1})").options.sampling.top_k, 0);
}

TEST(OpenAiApiTest, ChatMessagesAndMaxCompletionTokens) {
  const ApiRequest request = ParseOk(kChat, R"({
      "messages": [{"role": "developer", "content": "Be brief."},
                   {"role": "user", "content": [{"type": "text", "text": "Hi "},
                                                {"type": "text", "text": "there"}]}],
      "max_completion_tokens": 9})");
  ASSERT_EQ(request.messages.size(), 2u);
  EXPECT_EQ(request.messages[0].role, "system");
  // Parts are joined with a newline, as vLLM and llama.cpp join them.
  EXPECT_EQ(request.messages[1].content, "Hi \nthere");
  EXPECT_EQ(*request.max_tokens, 9);
  // Both names: the same value is fine, two values are a conflict.
  EXPECT_EQ(*ParseOk(kChat, R"({"messages": [{"role": "user", "content": "x"}],
                               "max_tokens": 4, "max_completion_tokens": 4})")
                 .max_tokens,
            4);
  EXPECT_NE(ParseError(kChat, R"({"messages": [{"role": "user", "content": "x"}],
                                  "max_tokens": 3, "max_completion_tokens": 2})")
                .find("disagree"),
            std::string::npos);
}

TEST(OpenAiApiTest, MalformedAndMistypedBodies) {
  EXPECT_NE(ParseError(kCompletions, "{").find("malformed JSON"), std::string::npos);
  EXPECT_NE(ParseError(kCompletions, "3").find("JSON object"), std::string::npos);
  EXPECT_NE(ParseError(kCompletions, "{}").find("'prompt' is required"), std::string::npos);
  EXPECT_NE(ParseError(kChat, "{}").find("'messages' is required"), std::string::npos);
  EXPECT_NE(ParseError(kCompletions, R"({"prompt": 3})").find("'prompt'"), std::string::npos);
  EXPECT_NE(ParseError(kCompletions, R"({"prompt": "x", "max_tokens": 1.5})")
                .find("'max_tokens' must be an integer, got number"),
            std::string::npos);
  EXPECT_NE(ParseError(kCompletions, R"({"prompt": "x", "max_tokens": 0})").find(">= 1"),
            std::string::npos);
  EXPECT_NE(ParseError(kCompletions, R"({"prompt": "x", "seed": "1"})").find("'seed'"),
            std::string::npos);
  EXPECT_NE(ParseError(kCompletions, R"({"prompt": "x", "stop": ["a", 1]})").find("'stop'"),
            std::string::npos);
  EXPECT_NE(ParseError(kCompletions, R"({"prompt": "x", "stop": ""})").find("empty"),
            std::string::npos);
  EXPECT_NE(ParseError(kCompletions, R"({"prompt": "x", "stream_options": {"include_usage":
                                        true}})")
                .find("'stream'"),
            std::string::npos);
  EXPECT_NE(ParseError(kChat, R"({"messages": "hi"})").find("'messages'"), std::string::npos);
  EXPECT_NE(ParseError(kChat, R"({"messages": [{"role": "robot", "content": "x"}]})").find("role"),
            std::string::npos);
  EXPECT_NE(ParseError(kChat, R"({"messages": [{"role": "user"}]})")
                .find("'messages[0].content' is required"),
            std::string::npos);
  EXPECT_NE(ParseError(kChat, R"({"messages": [{"role": "user", "content": [{"type":
                                  "image_url", "image_url": {}}]}]})")
                .find("not supported"),
            std::string::npos);
}

TEST(OpenAiApiTest, NumbersBeyondADoubleAreMalformedJson) {
  // nlohmann reports them as out_of_range, not parse_error: they escaped as a 500.
  for (const char* body :
       {R"({"prompt": "x", "temperature": 1e309})", R"({"prompt": "x", "max_tokens": -1e400})"}) {
    const std::string message = ParseError(kCompletions, body);
    EXPECT_NE(message.find("malformed JSON body: number overflow"), std::string::npos) << message;
  }
}

TEST(OpenAiApiTest, ResponseFormatOfAnotherTypeIsRefusedNotThrown) {
  for (const char* format : {R"({"type": 5})", R"({"type": null})", R"({})"}) {
    absl::StatusOr<ApiRequest> parsed =
        ParseApiRequest(kChat, absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], )",
                                            R"("response_format": )", format, "}"));
    ASSERT_FALSE(parsed.ok()) << format;
    EXPECT_EQ(ApiErrorFromStatus(parsed.status()).param, "response_format.type") << format;
  }
  const ApiRequest schema = ParseOk(kChat, R"({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema":
      {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}}}}})");
  EXPECT_EQ(schema.output_format.kind, OutputFormat::kJsonSchema);
  EXPECT_EQ(schema.output_format.field, "response_format.json_schema.schema");
  EXPECT_EQ(schema.output_format.schema["properties"].begin().key(), "z");  // the request's order
  EXPECT_EQ(ParseOk(kCompletions, R"({"prompt": "x", "guided_json": "{\"type\": \"object\"}"})")
                .output_format.schema["type"],
            "object");
  EXPECT_EQ(ParseOk(kCompletions, R"({"prompt": "x", "guided_choice": ["a", "b"]})")
                .output_format.choices,
            (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(ParseOk(kCompletions, R"({"prompt": "x", "response_format": {"type": "text"}})")
                .output_format.kind,
            OutputFormat::kText);
}

TEST(OpenAiApiTest, KvBitsBeyondAnIntAreReportedAsGiven) {
  // They were clamped to 64 or -1 first, and the error named those values.
  EXPECT_EQ(ParseError(kCompletions, R"({"prompt": "x", "kv_bits": 1099511627776})"),
            "'kv_bits' must be 16, 8 or 4, got 1099511627776");
  EXPECT_EQ(ParseError(kCompletions, R"({"prompt": "x", "kv_bits": -1099511627776})"),
            "'kv_bits' must be 16, 8 or 4, got -1099511627776");
  EXPECT_EQ(ParseError(kCompletions, R"({"prompt": "x", "kv_bits": 1000000})"),
            "kv_bits must be 16, 8 or 4, got 1000000");
}

TEST(OpenAiApiTest, KvBudgetOnTheDenseCacheIsRefusedNotIgnored) {
  // The library ignores a dense cache's budget: the request would get a full cache silently.
  for (const char* fields : {R"("kv_budget": 8)", R"("kv_cache": "dense", "kv_budget": -5)"}) {
    const std::string message =
        ParseError(kCompletions, absl::StrCat(R"({"prompt": "x", )", fields, "}"));
    EXPECT_NE(message.find("'kv_budget'"), std::string::npos) << message;
    EXPECT_NE(message.find("not dense"), std::string::npos) << message;
  }
  ParseOk(kCompletions, R"({"prompt": "x", "kv_budget": 0})");
  ParseOk(kCompletions, R"({"prompt": "x", "kv_budget": null})");
  EXPECT_EQ(ParseOk(kCompletions, R"({"prompt": "x", "kv_cache": "window", "kv_budget": 8})")
                .options.kv_cache.budget,
            8);
}

TEST(OpenAiApiTest, SinkBudgetBelowTheSinkTokensNamesTheBudget) {
  const std::string message =
      ParseError(kCompletions, R"({"prompt": "x", "kv_cache": "sink", "kv_budget": 1})");
  EXPECT_NE(message.find("'kv_budget' (1) must be at least the sink cache's 4 sink tokens"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("KVCacheSpec"), std::string::npos) << message;
  ParseOk(kCompletions, R"({"prompt": "x", "kv_cache": "sink", "kv_budget": 4})");
}

TEST(OpenAiApiTest, LibraryChecksNameRequestFields) {
  EXPECT_NE(ParseError(kCompletions, R"({"prompt": "x", "temperature": -0.5})").find("temperature"),
            std::string::npos);
  EXPECT_NE(ParseError(kCompletions, R"({"prompt": "x", "top_p": 1.5})").find("top_p"),
            std::string::npos);
  const std::string budget =
      ParseError(kCompletions, R"({"prompt": "x", "kv_cache": "h2o", "kv_budget": 0})");
  EXPECT_NE(budget.find("kv_budget must be >= 1"), std::string::npos) << budget;
  EXPECT_EQ(budget.find("KVCacheSpec"), std::string::npos) << budget;
  EXPECT_NE(ParseError(kCompletions, R"({"prompt": "x", "kv_bits": 5})").find("kv_bits"),
            std::string::npos);
  EXPECT_NE(ParseError(kCompletions, R"({"prompt": "x", "kv_cache": "lru"})").find("kv_cache"),
            std::string::npos);
}

TEST(OpenAiApiTest, SamplingFieldsAndChoices) {
  const ApiRequest request = ParseOk(kCompletions, R"({"prompt": ["a", [5, 6], "c"], "n": 2,
      "best_of": 2, "logprobs": 3, "presence_penalty": 0.5, "frequency_penalty": -1,
      "repetition_penalty": 1.2, "min_p": 0.05, "logit_bias": {"7": -100, "12": 3.5},
      "truncate_prompt_tokens": 9})");
  ASSERT_EQ(request.prompts.size(), 3u);
  EXPECT_EQ(request.prompts[0].text, "a");
  EXPECT_EQ(request.prompts[1].ids, (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(request.n, 2);
  EXPECT_EQ(request.logprobs, 3);
  EXPECT_EQ(request.options.top_logprobs, 3);
  const SamplingOptions& s = request.options.sampling;
  EXPECT_EQ(s.presence_penalty, 0.5);
  EXPECT_EQ(s.frequency_penalty, -1);
  EXPECT_EQ(s.repetition_penalty, 1.2);
  EXPECT_EQ(s.min_p, 0.05);
  using Biases = std::set<std::pair<int64_t, double>>;
  EXPECT_EQ(Biases(s.logit_bias.begin(), s.logit_bias.end()), (Biases{{7, -100}, {12, 3.5}}));
  EXPECT_EQ(*request.truncate_prompt_tokens, 9);
  // Chat: logprobs true with top_logprobs K, in either order; false or absent: none.
  const char* user = R"("messages": [{"role": "user", "content": "x"}])";
  EXPECT_EQ(
      ParseOk(kChat, absl::StrCat("{", user, R"(, "top_logprobs": 4, "logprobs": true})")).logprobs,
      4);
  EXPECT_EQ(ParseOk(kChat, absl::StrCat("{", user, R"(, "logprobs": true})")).logprobs, 0);
  EXPECT_EQ(ParseOk(kChat, absl::StrCat("{", user, R"(, "logprobs": false})")).logprobs, -1);
  EXPECT_EQ(ParseOk(kCompletions, R"({"prompt": "x"})").logprobs, -1);
  EXPECT_EQ(ParseOk(kCompletions, R"({"prompt": "x", "logprobs": false})").logprobs, -1);
}

TEST(OpenAiApiTest, BadSamplingFieldsNameThemselves) {
  const auto param = [](ApiEndpoint endpoint, const std::string& body) {
    absl::StatusOr<ApiRequest> parsed = ParseApiRequest(endpoint, body);
    EXPECT_FALSE(parsed.ok()) << body;
    return ApiErrorFromStatus(parsed.status()).param;
  };
  EXPECT_EQ(param(kCompletions, R"({"prompt": "x", "n": 0})"), "n");
  EXPECT_EQ(param(kCompletions, R"({"prompt": "x", "n": 129})"), "n");
  EXPECT_EQ(param(kCompletions, R"({"prompt": ["a", "b", "c"], "n": 50})"), "n");
  EXPECT_EQ(param(kCompletions, R"({"prompt": "x", "n": 2, "best_of": 3})"), "best_of");
  EXPECT_EQ(param(kCompletions, R"({"prompt": "x", "logprobs": 21})"), "logprobs");
  EXPECT_EQ(param(kCompletions, R"({"prompt": "x", "logprobs": true})"), "logprobs");
  EXPECT_EQ(param(kCompletions, R"({"prompt": "x", "presence_penalty": 3})"), "presence_penalty");
  EXPECT_EQ(param(kCompletions, R"({"prompt": "x", "frequency_penalty": "1"})"),
            "frequency_penalty");
  EXPECT_EQ(param(kCompletions, R"({"prompt": "x", "repetition_penalty": 0})"),
            "repetition_penalty");
  EXPECT_EQ(param(kCompletions, R"({"prompt": "x", "min_p": 2})"), "min_p");
  EXPECT_EQ(param(kCompletions, R"({"prompt": "x", "logit_bias": {"a": 1}})"), "logit_bias");
  EXPECT_EQ(param(kCompletions, R"({"prompt": "x", "logit_bias": {"1": 101}})"), "logit_bias");
  EXPECT_EQ(param(kCompletions, R"({"prompt": "x", "logit_bias": {"1": "x"}})"), "logit_bias.1");
  EXPECT_EQ(param(kCompletions, R"({"prompt": "x", "truncate_prompt_tokens": 0})"),
            "truncate_prompt_tokens");
  EXPECT_EQ(param(kCompletions, R"({"prompt": []})"), "prompt");
  EXPECT_EQ(param(kCompletions, R"({"prompt": [[1], []]})"), "prompt[1]");
  EXPECT_EQ(param(kCompletions, R"({"prompt": [[1], 2]})"), "prompt[1]");
  EXPECT_EQ(param(kCompletions, R"({"prompt": [1, "a"]})"), "prompt[1]");
  const char* user = R"("messages": [{"role": "user", "content": "x"}])";
  EXPECT_EQ(param(kChat, absl::StrCat("{", user, R"(, "top_logprobs": 2})")), "top_logprobs");
  EXPECT_EQ(param(kChat, absl::StrCat("{", user, R"(, "top_logprobs": 21, "logprobs": true})")),
            "top_logprobs");
  EXPECT_EQ(param(kChat, absl::StrCat("{", user, R"(, "logprobs": 2})")), "logprobs");
}

TEST(OpenAiApiTest, ToolsAndToolChoice) {
  const char* user = R"("messages": [{"role": "user", "content": "x"}])";
  const char* tools =
      R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
          "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}}}])";
  const ApiRequest automatic = ParseOk(kChat, absl::StrCat("{", user, ", ", tools, "}"));
  EXPECT_EQ(automatic.tool_choice.kind, ToolChoice::kAuto);  // OpenAI's default with tools
  // Key order kept for chat templates.
  EXPECT_EQ(automatic.tools[0]["function"]["parameters"]["properties"].begin().key(), "b");
  EXPECT_EQ(ParseOk(kChat, absl::StrCat("{", user, "}")).tool_choice.kind, ToolChoice::kNone);
  const ApiRequest named = ParseOk(
      kChat, absl::StrCat("{", user, ", ", tools,
                          R"(, "tool_choice": {"type": "function", "function": {"name": "f"}},
                             "parallel_tool_calls": false})"));
  EXPECT_EQ(named.tool_choice.kind, ToolChoice::kNamed);
  EXPECT_EQ(named.tool_choice.name, "f");
  EXPECT_FALSE(named.parallel_tool_calls);
  // Tool results and assistant calls are read (a chat template renders them).
  const ApiRequest turns = ParseOk(kChat, R"({"messages": [{"role": "user", "content": "x"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
       "function": {"name": "f", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "3"}]})");
  EXPECT_TRUE(turns.has_tool_messages);
  EXPECT_EQ(turns.message_json.size(), 3u);
  const auto param = [](const std::string& body) {
    absl::StatusOr<ApiRequest> parsed = ParseApiRequest(kChat, body);
    EXPECT_FALSE(parsed.ok()) << body;
    return ApiErrorFromStatus(parsed.status()).param;
  };
  EXPECT_EQ(param(absl::StrCat("{", user, R"(, "tools": [{"type": "function"}]})")), "tools[0]");
  EXPECT_EQ(param(absl::StrCat("{", user, R"(, "tools": [{"type": "function", "function":
      {"name": "f", "parameters": 3}}]})")),
            "tools[0].function.parameters");
  EXPECT_EQ(param(absl::StrCat("{", user, R"(, "tool_choice": "required"})")), "tool_choice");
  EXPECT_EQ(param(absl::StrCat("{", user, ", ", tools, R"(, "tool_choice": "always"})")),
            "tool_choice");
  EXPECT_EQ(
      param(absl::StrCat("{", user, ", ", tools,
                         R"(, "tool_choice": {"type": "function", "function": {"name": "g"}}})")),
      "tool_choice");
  EXPECT_EQ(param(R"({"messages": [{"role": "user", "tool_calls": []}]})"), "messages[0].content");
  EXPECT_EQ(param(R"({"messages": [{"role": "user", "content": "x", "tool_calls": [{}]}]})"),
            "messages[0].tool_calls[0]");
  EXPECT_EQ(param(R"({"messages": [{"role": "user", "content": "x", "tool_calls": [{"function":
      {"name": "f"}}]}]})"),
            "messages[0].tool_calls");
}

TEST(OpenAiApiTest, UnsupportedFieldsAreRefused) {
  for (const char* field : {R"("echo": true)", R"("suffix": "s")"}) {
    const std::string message =
        ParseError(kCompletions, std::string(R"({"prompt": "x", )") + field + "}");
    EXPECT_NE(message.find("not supported by lgpt"), std::string::npos) << field << message;
  }
  const std::string functions =
      ParseError(kChat, R"({"messages": [{"role": "user", "content": "x"}], "functions": [{}]})");
  EXPECT_NE(functions.find("not supported by lgpt"), std::string::npos) << functions;
  EXPECT_NE(ParseError(kCompletions, R"({"prompt": "x", "temprature": 1})")
                .find("unknown or unsupported field 'temprature'"),
            std::string::npos);
  EXPECT_NE(ParseError(kCompletions, R"({"prompt": "x", "messages": []})").find("'messages'"),
            std::string::npos);
  EXPECT_NE(ParseError(kChat, R"({"messages": [{"role": "user", "content": "x"}], "echo": false})")
                .find("'echo'"),
            std::string::npos);
  // Their neutral values are accepted.
  ParseOk(kChat, R"({"messages": [{"role": "user", "content": "x"}], "n": 1, "logprobs": false,
                     "tools": [], "tool_choice": "none", "response_format": {"type": "text"},
                     "frequency_penalty": 0, "top_logprobs": null})");
}

TEST(OpenAiApiTest, ErrorsHaveOpenAisShapeAndStatus) {
  const ApiError bad = ApiErrorFromStatus(InvalidFieldError("x", "'x' is bad"));
  EXPECT_EQ(bad.http_status, 400);
  const json body = json::parse(bad.Json());
  EXPECT_EQ(body["error"]["message"], "'x' is bad");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(body["error"]["code"].is_null());
  EXPECT_EQ(body["error"]["param"], "x");
  EXPECT_EQ(
      ApiErrorFromStatus(InvalidFieldError("bogus", "unknown or unsupported field 'bogus'")).param,
      "bogus");
  EXPECT_TRUE(json::parse(ApiErrorFromStatus(absl::InvalidArgumentError("malformed JSON body: x"))
                              .Json())["error"]["param"]
                  .is_null());
  // param is a field path or null, never prose.
  auto param_of = [](const std::string& body) {
    ApiError error;
    absl::StatusOr<ApiRequest> parsed = ParseApiRequest(kChat, body);
    if (!parsed.ok()) error = ApiErrorFromStatus(parsed.status());
    return json::parse(error.Json())["error"]["param"];
  };
  EXPECT_EQ(param_of(R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant",
                         "content": "b"}, {"role": "user", "content": 5}]})"),
            "messages[2].content");
  EXPECT_EQ(param_of(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})"),
            "messages[0].content[0]");
  EXPECT_EQ(param_of(R"({"messages": [7]})"), "messages[0]");
  EXPECT_EQ(param_of(R"({"messages": [{"role": "user", "content": "x", "weight": 1}]})"),
            "messages[0].weight");
  EXPECT_TRUE(param_of("[1, 2]").is_null());
  const ApiError context = ApiErrorFromStatus(FieldError(
      absl::StatusCode::kOutOfRange, FieldRef("RequestOptions.max_new_tokens", "max_new_tokens"),
      "prompt plus max_new_tokens (9) exceeds the context"));
  EXPECT_EQ(context.http_status, 400);
  EXPECT_EQ(context.code, "context_length_exceeded");
  EXPECT_EQ(context.message, "prompt plus max_tokens (9) exceeds the context");
  EXPECT_EQ(ApiErrorFromStatus(absl::UnauthenticatedError("")).http_status, 401);
  EXPECT_EQ(ApiErrorFromStatus(absl::NotFoundError("")).http_status, 404);
  EXPECT_EQ(ApiErrorFromStatus(absl::ResourceExhaustedError("")).http_status, 429);
  EXPECT_EQ(ApiErrorFromStatus(absl::UnavailableError("")).http_status, 503);
  EXPECT_EQ(ApiErrorFromStatus(absl::InternalError("")).http_status, 500);
}

// OpenAI's param comes from the field the status carries (core/base/status_field.h), in the
// request's terms, whatever the message quotes; the message names the carried fields the same
// way.
TEST(OpenAiApiTest, ParamComesFromTheCarriedField) {
  // A library field, in a message that does not quote it.
  ApiError error =
      ApiErrorFromStatus(InvalidFieldError("KVCacheSpec.budget", "too small a budget"));
  EXPECT_EQ(error.http_status, 400);
  EXPECT_EQ(error.param, "kv_budget");
  EXPECT_EQ(error.message, "too small a budget");
  // The payload wins over a quoted word; a field no request sets has no param.
  error = ApiErrorFromStatus(
      InvalidFieldError("SchedulerOptions.max_running", "'x' SchedulerOptions.max_running"));
  EXPECT_EQ(error.param, "");
  EXPECT_TRUE(json::parse(error.Json())["error"]["param"].is_null());
  EXPECT_EQ(error.message, "'x' SchedulerOptions.max_running");
  // Named as the library writes it, rendered as the request names it.
  error = ApiErrorFromStatus(InvalidFieldError(
      FieldRef("RequestOptions.max_new_tokens", "max_new_tokens"), "max_new_tokens must be >= 1"));
  EXPECT_EQ(error.param, "max_tokens");
  EXPECT_EQ(error.message, "max_tokens must be >= 1");
  // Only the carried field is renamed.
  error = ApiErrorFromStatus(
      InvalidFieldError("SamplingOptions.top_p", "SamplingOptions.top_p and KVCacheSpec.bits"));
  EXPECT_EQ(error.param, "top_p");
  EXPECT_EQ(error.message, "top_p and KVCacheSpec.bits");
  // The pool's limit on a request (429): max_tokens in the text, no param.
  error = ApiErrorFromStatus(
      FieldError(absl::StatusCode::kResourceExhausted,
                 FieldRef("GenerateOptions.max_new_tokens", "max_new_tokens"),
                 "the request needs 9 KV blocks (prompt plus max_new_tokens) and the pool has 4"));
  EXPECT_EQ(error.http_status, 429);
  EXPECT_EQ(error.message,
            "the request needs 9 KV blocks (prompt plus max_tokens) and the pool has 4");
  EXPECT_EQ(error.param, "");
}

TEST(OpenAiApiTest, RequestErrorsCarryTheirField) {
  auto error_of = [](ApiEndpoint endpoint, const std::string& body) {
    absl::StatusOr<ApiRequest> request = ParseApiRequest(endpoint, body);
    EXPECT_FALSE(request.ok()) << body;
    return request.ok() ? ApiError() : ApiErrorFromStatus(request.status());
  };
  // The library's checks: the field behind them, named as the request names it. "kv_cache:
  // unknown KV cache policy 'lru'" quotes the value, not the field.
  const ApiError lru = error_of(kCompletions, R"({"prompt": "x", "kv_cache": "lru"})");
  EXPECT_EQ(lru.param, "kv_cache");
  EXPECT_EQ(lru.message.find("KVCacheSpec"), std::string::npos) << lru.message;
  EXPECT_EQ(error_of(kCompletions, R"({"prompt": "x", "kv_cache": "sink", "kv_budget": 1})").param,
            "kv_budget");
  EXPECT_EQ(error_of(kCompletions, R"({"prompt": "x", "kv_budget": 8})").param, "kv_budget");
  EXPECT_EQ(error_of(kCompletions, R"({"prompt": "x", "kv_cache": "qh2o", "kv_budget": 8})").param,
            "kv_bits");
  EXPECT_EQ(error_of(kCompletions, R"({"prompt": "x", "temperature": -1})").param, "temperature");
  EXPECT_EQ(error_of(kCompletions, R"({"prompt": "x", "top_k": -2})").param, "top_k");
  absl::StatusOr<ApiRequest> cold = ParseApiRequest(kCompletions, R"({"prompt": "x", "top_p": 2})");
  EXPECT_EQ(ErrorField(cold.status()), "SamplingOptions.top_p");
  // The request's own: its JSON path.
  absl::StatusOr<ApiRequest> content =
      ParseApiRequest(kChat, R"({"messages": [{"role": "user", "content": 5}]})");
  EXPECT_EQ(ErrorField(content.status()), "messages[0].content");
  EXPECT_EQ(error_of(kChat, R"({"messages": [], "n": 2})").param, "messages");
  EXPECT_EQ(error_of(kCompletions, R"({"prompt": "x", "n": -2})").param, "n");
  EXPECT_EQ(
      error_of(kCompletions, R"({"prompt": "x", "stream_options": {"include_usage": true}})").param,
      "stream_options");
  EXPECT_EQ(error_of(kCompletions, R"({"max_tokens": 3})").param, "prompt");
}

TEST(OpenAiApiTest, ResponsesAndChunks) {
  const ResponseHeader header{"cmpl-1", 1700000000, "m"};
  const json completion = json::parse(CompletionJson(
      header, {{0, "text", "length", nullptr}, {1, "more", "stop", nullptr}}, {3, 4}));
  EXPECT_EQ(completion["object"], "text_completion");
  EXPECT_EQ(completion["choices"][0]["text"], "text");
  EXPECT_EQ(completion["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(completion["choices"][1]["index"], 1);
  EXPECT_EQ(completion["choices"][1]["text"], "more");
  EXPECT_TRUE(completion["choices"][1]["logprobs"].is_null());
  EXPECT_EQ(completion["usage"]["total_tokens"], 7);
  const json chat = json::parse(ChatCompletionJson(header, {{0, "hi", "stop", nullptr}}, {1, 2}));
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(chat["choices"][0]["message"]["content"], "hi");
  const json role = json::parse(ChatChunkJson(header, true, {2, "", "", nullptr}));
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(role["choices"][0]["index"], 2);
  EXPECT_TRUE(role["choices"][0]["finish_reason"].is_null());
  const json end = json::parse(ChatChunkJson(header, false, {0, "", "stop", nullptr}));
  EXPECT_TRUE(end["choices"][0]["delta"].empty());
  EXPECT_EQ(end["choices"][0]["finish_reason"], "stop");
  const json usage = json::parse(UsageChunkJson(header, true, {2, 5}));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 5);
  EXPECT_EQ(SseEvent("[DONE]"), "data: [DONE]\n\n");
  // Invalid UTF-8 from a model becomes U+FFFD rather than an exception.
  EXPECT_NO_THROW(json::parse(CompletionChunkJson(header, {0, "\xff\xfe", "", nullptr})));
  const json models = json::parse(ModelsJson("m", {"lora1"}, 5));
  EXPECT_EQ(models["data"][1]["id"], "lora1");
  EXPECT_EQ(models["data"][1]["parent"], "m");
  EXPECT_EQ(models["data"][0]["id"], "m");
  EXPECT_EQ(json::parse(ModelJson("a\"b", 5))["id"], "a\"b");
  EXPECT_STREQ(ApiFinishReason(FinishReason::kStopSequence), "stop");
  EXPECT_STREQ(ApiFinishReason(FinishReason::kContextFull), "length");
}

TEST(OpenAiApiTest, LogprobsInEachEndpointsShape) {
  const TokenText text = [](int64_t id) {
    return id == 1 ? std::string("\xc3\xa9") : "t" + std::to_string(id);
  };
  const std::vector<TokenLogprob> logprobs = {{1, -0.5, {{1, -0.5}, {2, -1.5}}},
                                              {3, -2.0, {{4, -0.1}, {3, -2.0}}}};
  const json completion = CompletionLogprobs(logprobs, text, 10);
  EXPECT_EQ(completion["tokens"], json({"\xc3\xa9", "t3"}));
  EXPECT_EQ(completion["token_logprobs"], json({-0.5, -2.0}));
  EXPECT_EQ(completion["top_logprobs"][1]["t4"], -0.1);
  EXPECT_EQ(completion["text_offset"], json({10, 12}));  // "é" is two bytes
  const json chat = ChatLogprobs(logprobs, text);
  EXPECT_EQ(chat["content"][0]["token"], "\xc3\xa9");
  EXPECT_EQ(chat["content"][0]["bytes"], json({0xc3, 0xa9}));
  EXPECT_EQ(chat["content"][1]["top_logprobs"][0]["token"], "t4");
  EXPECT_EQ(chat["content"][1]["top_logprobs"][1]["logprob"], -2.0);
  EXPECT_EQ(chat["content"][1]["top_logprobs"].size(), 2u);
}

// vLLM's speculative_config: read field by field, each refusal naming its field; the server's
// default fills what a request leaves out.
TEST(OpenAiApiTest, SpeculativeConfigIsRead) {
  const ApiRequest request = ParseOk(kCompletions, R"({"prompt": "x", "speculative_config":
      {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 1,
       "prompt_lookup_max": 3}})");
  ASSERT_TRUE(request.speculative_config.has_value());
  EXPECT_EQ(request.speculative_config->method, "ngram");
  EXPECT_EQ(request.speculative_config->num_speculative_tokens, 6);
  EXPECT_EQ(request.speculative_config->prompt_lookup_min, 1);
  EXPECT_EQ(request.speculative_config->prompt_lookup_max, 3);
  const char* user = R"("messages": [{"role": "user", "content": "x"}])";
  const ApiRequest chat =
      ParseOk(kChat, absl::StrCat("{", user, R"(, "speculative_config": {"method": "draft"}})"));
  ASSERT_TRUE(chat.speculative_config.has_value());
  EXPECT_EQ(chat.speculative_config->method, "draft");
  EXPECT_FALSE(chat.speculative_config->num_speculative_tokens.has_value());
  // Absent or null: the server's default; null fields inside: left out.
  EXPECT_FALSE(ParseOk(kCompletions, R"({"prompt": "x"})").speculative_config.has_value());
  EXPECT_FALSE(ParseOk(kCompletions, R"({"prompt": "x", "speculative_config": null})")
                   .speculative_config.has_value());
  const ApiRequest nulls = ParseOk(
      kCompletions,
      R"({"prompt": "x", "speculative_config": {"method": "none", "prompt_lookup_min": null}})");
  ASSERT_TRUE(nulls.speculative_config.has_value());
  EXPECT_FALSE(nulls.speculative_config->prompt_lookup_min.has_value());
  // The request options carry no speculation until the server resolves it.
  EXPECT_FALSE(request.options.speculative.enabled());
}

TEST(OpenAiApiTest, BadSpeculativeConfigNamesItsField) {
  const auto error_of = [](const std::string& config) {
    absl::StatusOr<ApiRequest> parsed = ParseApiRequest(
        kCompletions, absl::StrCat(R"({"prompt": "x", "speculative_config": )", config, "}"));
    EXPECT_FALSE(parsed.ok()) << config;
    return parsed.ok() ? ApiError() : ApiErrorFromStatus(parsed.status());
  };
  struct Case {
    const char* config;
    const char* param;
    const char* message;
  };
  for (const Case& bad : std::vector<Case>{
           {R"("ngram")", "speculative_config",
            "'speculative_config' must be an object, got string"},
           {R"({"method": "eagle"})", "speculative_config.method",
            "'speculative_config.method' must be \"ngram\", \"draft\" or \"none\", got 'eagle'"},
           {R"({"method": 1})", "speculative_config.method",
            "'speculative_config.method' must be a string, got integer"},
           {R"({"method": "ngram", "num_speculative_tokens": 0})",
            "speculative_config.num_speculative_tokens",
            "'speculative_config.num_speculative_tokens' must be in [1, 64], got 0"},
           {R"({"method": "ngram", "num_speculative_tokens": 65})",
            "speculative_config.num_speculative_tokens",
            "'speculative_config.num_speculative_tokens' must be in [1, 64], got 65"},
           {R"({"method": "ngram", "num_speculative_tokens": 2.5})",
            "speculative_config.num_speculative_tokens",
            "'speculative_config.num_speculative_tokens' must be an integer, got number"},
           {R"({"method": "ngram", "prompt_lookup_min": 0})",
            "speculative_config.prompt_lookup_min",
            "'speculative_config.prompt_lookup_min' must be >= 1, got 0"},
           {R"({"method": "ngram", "prompt_lookup_max": -1})",
            "speculative_config.prompt_lookup_max",
            "'speculative_config.prompt_lookup_max' must be >= 1, got -1"},
           {R"({"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2})",
            "speculative_config.prompt_lookup_max",
            "'speculative_config.prompt_lookup_max' (2) must be >= "
            "'speculative_config.prompt_lookup_min' (4)"},
           {R"({"method": "draft", "model": "/models/draft"})", "speculative_config.model",
            "'speculative_config.model' is not supported by lgpt (speculative_config takes "
            "method, num_speculative_tokens, prompt_lookup_min and prompt_lookup_max)"},
       }) {
    const ApiError error = error_of(bad.config);
    EXPECT_EQ(error.http_status, 400) << bad.config;
    EXPECT_EQ(error.type, "invalid_request_error") << bad.config;
    EXPECT_EQ(error.param, bad.param) << bad.config;
    EXPECT_EQ(error.message, bad.message) << bad.config;
  }
}

TEST(OpenAiApiTest, SpeculativeConfigOverridesTheServerDefault) {
  const auto resolve = [](const std::string& fields, const SpeculativeSpec& server_default,
                          bool has_draft = false) {
    absl::StatusOr<ApiRequest> parsed =
        ParseApiRequest(kCompletions, absl::StrCat(R"({"prompt": "x")", fields, "}"));
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    return parsed.ok() ? ResolveSpeculative(*parsed, server_default, has_draft)
                       : absl::StatusOr<SpeculativeSpec>(parsed.status());
  };
  const SpeculativeSpec none;
  SpeculativeSpec ngram;
  ngram.method = "ngram";
  ngram.num_speculative_tokens = 8;
  ngram.prompt_lookup_min = 1;
  ngram.prompt_lookup_max = 3;
  // No speculative_config (or null, or {}): the default, whatever it is.
  EXPECT_FALSE(resolve("", none)->enabled());
  EXPECT_EQ(resolve("", ngram)->method, "ngram");
  EXPECT_EQ(resolve(R"(, "speculative_config": null)", ngram)->num_speculative_tokens, 8);
  EXPECT_EQ(resolve(R"(, "speculative_config": {})", ngram)->method, "ngram");
  EXPECT_FALSE(resolve(R"(, "speculative_config": {})", none)->enabled());
  // A request turns it on over no default, with the library's defaults for what it leaves out.
  absl::StatusOr<SpeculativeSpec> on =
      resolve(R"(, "speculative_config": {"method": "ngram", "num_speculative_tokens": 3})", none);
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->method, "ngram");
  EXPECT_EQ(on->num_speculative_tokens, 3);
  EXPECT_EQ(on->prompt_lookup_min, SpeculativeSpec().prompt_lookup_min);
  EXPECT_EQ(on->prompt_lookup_max, SpeculativeSpec().prompt_lookup_max);
  // ... changes single fields of the default, or turns it off.
  absl::StatusOr<SpeculativeSpec> k2 =
      resolve(R"(, "speculative_config": {"num_speculative_tokens": 2})", ngram);
  ASSERT_TRUE(k2.ok()) << k2.status();
  EXPECT_EQ(k2->method, "ngram");
  EXPECT_EQ(k2->num_speculative_tokens, 2);
  EXPECT_EQ(k2->prompt_lookup_max, 3);
  EXPECT_FALSE(resolve(R"(, "speculative_config": {"method": "none"})", ngram)->enabled());
  // A draft only where the server loaded one.
  EXPECT_EQ(resolve(R"(, "speculative_config": {"method": "draft"})", none, true)->method, "draft");
  const auto error_of = [&](const std::string& fields, const SpeculativeSpec& server_default) {
    absl::StatusOr<SpeculativeSpec> spec = resolve(fields, server_default);
    EXPECT_FALSE(spec.ok()) << fields;
    return spec.ok() ? ApiError() : ApiErrorFromStatus(spec.status());
  };
  ApiError error = error_of(R"(, "speculative_config": {"method": "draft"})", ngram);
  EXPECT_EQ(error.http_status, 400);
  EXPECT_EQ(error.param, "speculative_config.method");
  EXPECT_NE(error.message.find("no draft model"), std::string::npos) << error.message;
  // Fields without a method where the server does not speculate: nothing to apply them to.
  error = error_of(R"(, "speculative_config": {"num_speculative_tokens": 2})", none);
  EXPECT_EQ(error.param, "speculative_config.method");
  EXPECT_NE(error.message.find("'speculative_config.method' is required"), std::string::npos)
      << error.message;
  // The library's check over the merged values, in the request's names.
  error = error_of(R"(, "speculative_config": {"prompt_lookup_min": 5})", ngram);
  EXPECT_EQ(error.http_status, 400);
  EXPECT_EQ(error.param, "speculative_config.prompt_lookup_max");
  EXPECT_EQ(error.message,
            "speculative_config.prompt_lookup_max (3) must be >= "
            "speculative_config.prompt_lookup_min (5)");
}

// The serving engine refuses what it cannot do yet with Unimplemented naming the field: the
// request's fault to fix (400 with the param), not a server error.
TEST(OpenAiApiTest, UnimplementedRequestOptionsAreBadRequests) {
  const ApiError error = ApiErrorFromStatus(
      FieldError(absl::StatusCode::kUnimplemented, "SpeculativeSpec.method",
                 "SpeculativeSpec.method=ngram: speculative decoding runs in Engine::Generate"));
  EXPECT_EQ(error.http_status, 400);
  EXPECT_EQ(error.type, "invalid_request_error");
  EXPECT_EQ(error.param, "speculative_config.method");
  EXPECT_EQ(error.message,
            "'speculative_config.method' (ngram): speculative decoding runs in Engine::Generate");
}

TEST(OpenAiApiTest, UsageHasSpeculativeStatisticsOnlyWhenSpeculating) {
  const ResponseHeader header{"cmpl-1", 1700000000, "m"};
  const json plain = json::parse(CompletionJson(header, {{0, "t", "stop", nullptr}}, {3, 4}));
  EXPECT_FALSE(plain["usage"].contains("speculative")) << plain;
  Usage usage{3, 9};
  usage.speculative = SpeculativeUsage{8, 6, 3};
  for (const json& response :
       {json::parse(CompletionJson(header, {{0, "t", "stop", nullptr}}, usage)),
        json::parse(ChatCompletionJson(header, {{0, "t", "stop", nullptr}}, usage)),
        json::parse(UsageChunkJson(header, true, usage))}) {
    const json& usage_json = response["usage"];
    EXPECT_EQ(usage_json["total_tokens"], 12) << response;
    EXPECT_EQ(usage_json["speculative"]["proposed_tokens"], 8) << response;
    EXPECT_EQ(usage_json["speculative"]["accepted_tokens"], 6) << response;
    EXPECT_EQ(usage_json["speculative"]["acceptance_rate"], 0.75) << response;
    EXPECT_EQ(usage_json["speculative"]["verify_steps"], 3) << response;
  }
  // Speculation that proposed nothing: zeros, no division by zero.
  usage.speculative = SpeculativeUsage();
  const json empty = json::parse(CompletionJson(header, {{0, "t", "stop", nullptr}}, usage));
  EXPECT_EQ(empty["usage"]["speculative"]["acceptance_rate"], 0.0) << empty;
}

}  // namespace
}  // namespace lgpt
