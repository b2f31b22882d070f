// OpenAI's HTTP API as lgpt speaks it: request bodies of /v1/completions and
// /v1/chat/completions into RequestOptions (errors name the request's fields), and the JSON of
// responses, stream chunks, /v1/models and errors. Pure: no engine, no sockets.
//
//   absl::StatusOr<ApiRequest> request = ParseApiRequest(ApiEndpoint::kChat, body);
//   if (!request.ok()) reply(ApiErrorFromStatus(request.status()));
//
// Beside OpenAI's fields it takes vLLM's `top_k`, `min_p`, `repetition_penalty`, `ignore_eos`,
// `truncate_prompt_tokens` and `speculative_config`, and lgpt's KV cache fields `kv_cache`,
// `kv_budget`, `kv_bits` (cache/kv_cache_factory.h). Fields lgpt cannot honour and fields it does
// not know are refused, never ignored (README.md's server section lists every field).
#ifndef LGPT_TOOLS_SERVER_OPENAI_API_H_
#define LGPT_TOOLS_SERVER_OPENAI_API_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/text/prompt_style.h"
#include "core/text/tool_calls.h"
#include "lgpt.h"
#include "nlohmann/json.hpp"

namespace lgpt {

enum class ApiEndpoint { kCompletions, kChat };

// One prompt of /v1/completions: text, or token ids.
struct PromptInput {
  std::string text;
  std::vector<int64_t> ids;  // given as ids when not empty
};

// Chat's tool_choice: none, auto (OpenAI's default with tools), required, or one named function.
struct ToolChoice {
  enum Kind { kNone, kAuto, kRequired, kNamed } kind = kNone;
  std::string name;  // kNamed
};

// What a reply must match (structured outputs), and the request field that asked: OpenAI's
// response_format (json_object, json_schema), vLLM's guided_json / guided_regex /
// guided_grammar / guided_choice, llama.cpp's grammar and json_schema.
struct OutputFormat {
  enum Kind { kText, kJsonObject, kJsonSchema, kRegex, kGrammar, kChoice } kind = kText;
  nlohmann::ordered_json schema;     // kJsonSchema, keys in the request's order
  std::string text;                  // kRegex, kGrammar
  std::vector<std::string> choices;  // kChoice
  std::string field;                 // "response_format.json_schema.schema", "guided_regex", ...
};

// vLLM's speculative_config as a request gives it (core/speculative/README.md): {"method":
// "ngram" | "draft" | "none", "num_speculative_tokens", "prompt_lookup_min",
// "prompt_lookup_max"}. A field left out takes the server's default (ResolveSpeculative).
struct SpeculativeConfig {
  std::optional<std::string> method;
  std::optional<int64_t> num_speculative_tokens;
  std::optional<int64_t> prompt_lookup_min;
  std::optional<int64_t> prompt_lookup_max;
};

struct ApiRequest {
  ApiEndpoint endpoint = ApiEndpoint::kCompletions;
  std::string model;  // empty when the request names none
  // /v1/completions: one or more prompts (a list of strings or of token-id lists); each has
  // `n` choices, indexed prompt * n + choice as OpenAI indexes them.
  std::vector<PromptInput> prompts;
  int64_t n = 1;
  // Log-probabilities: -1 none; completions' `logprobs: K` and chat's `logprobs: true` with
  // `top_logprobs: K` give K (0: the chosen token's only).
  int64_t logprobs = -1;
  // vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:<id>".
  bool tokens_as_ids = false;
  // vLLM's truncate_prompt_tokens: keep the last K prompt tokens.
  std::optional<int64_t> truncate_prompt_tokens;
  // /v1/chat/completions: the messages (roles system, user, assistant; tool messages and
  // assistant tool_calls only in message_json), and as given, keys in order, for chat templates.
  std::vector<ChatMessage> messages;
  nlohmann::ordered_json message_json;
  // Whether a message is a tool result or an assistant's tool calls (a chat template needed).
  bool has_tool_messages = false;
  // Chat's tools (null or a non-empty array of {"type": "function", "function": {"name",
  // "description", "parameters"}}), tool_choice and parallel_tool_calls.
  nlohmann::ordered_json tools;
  ToolChoice tool_choice;
  bool parallel_tool_calls = true;
  bool tools_given = false, tool_choice_given = false;  // as parsed
  OutputFormat output_format;
  // max_tokens (or max_completion_tokens); unset: the server's default.
  std::optional<int64_t> max_tokens;
  bool seed_given = false;
  bool ignore_eos = false;  // vLLM's extension: no EOS or prompt-style stop ends the reply
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // vLLM's speculative_config; absent or null: the server's default speculation.
  std::optional<SpeculativeConfig> speculative_config;
  // Sampling (OpenAI's defaults: temperature 1, top_p 1, every token), seed, stop sequences
  // and KV cache; no callbacks.
  RequestOptions options;
};

// InvalidArgument naming the field for malformed JSON, wrong types, bad values and fields lgpt
// does not support; the status carries the field (its JSON path, or the library's field behind
// a library check: core/base/status_field.h).
absl::StatusOr<ApiRequest> ParseApiRequest(ApiEndpoint endpoint, absl::string_view body);

// The speculative decoding a request runs with: `server_default` (the server's
// --speculative), with the fields of the request's speculative_config over it;
// {"method": "none"} turns it off. InvalidArgument naming speculative_config's field for a
// combination the library refuses (prompt_lookup_max below prompt_lookup_min), for fields
// without a method on a server that does not speculate by default, and for "draft" on a server
// without a draft model (`has_draft`: EngineOptions.draft_checkpoint_dir).
absl::StatusOr<SpeculativeSpec> ResolveSpeculative(const ApiRequest& request,
                                                   const SpeculativeSpec& server_default,
                                                   bool has_draft);

// vLLM's POST /tokenize: {"prompt": text} or {"messages": [...]} (with the chat framing),
// "add_special_tokens" (default true for a prompt: BOS as the tokenizer adds it; false for
// messages, whose framing has its own), "add_generation_prompt" (default true; messages only),
// "model".
struct TokenizeRequest {
  std::string model;
  std::optional<std::string> prompt;
  std::vector<ChatMessage> messages;    // when no prompt
  nlohmann::ordered_json message_json;  // the messages as given, for chat templates
  bool add_special_tokens = true;
};
absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(absl::string_view body);
// {"count", "max_model_len", "tokens"}.
std::string TokenizeJson(const std::vector<int64_t>& ids, int64_t max_model_len);

// vLLM's POST /detokenize: {"tokens": [ids], "model"}.
struct DetokenizeRequest {
  std::string model;
  std::vector<int64_t> tokens;
};
absl::StatusOr<DetokenizeRequest> ParseDetokenizeRequest(absl::string_view body);
// {"prompt": text}.
std::string DetokenizeJson(absl::string_view text);

// POST /v1/embeddings: "input" (a string, a list of strings, a list of token ids or a list of
// such lists; at most kMaxEmbeddingInputs), "encoding_format" ("float" or "base64": the
// float32 values' little-endian bytes), "dimensions" (only the model's own), "model", "user",
// vLLM's "truncate_prompt_tokens".
inline constexpr int64_t kMaxEmbeddingInputs = 2048;
struct EmbeddingsRequest {
  std::string model;
  std::vector<PromptInput> inputs;
  bool base64 = false;
  std::optional<int64_t> dimensions;
  std::optional<int64_t> truncate_prompt_tokens;
};
absl::StatusOr<EmbeddingsRequest> ParseEmbeddingsRequest(absl::string_view body);
// OpenAI's {"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
// "model", "usage"}; `vectors` [inputs, dimensions] float32.
std::string EmbeddingsJson(const std::vector<std::vector<float>>& vectors, bool base64,
                           absl::string_view model, int64_t prompt_tokens);

// The request field that sets a library field ("KVCacheSpec.budget" -> "kv_budget",
// "RequestOptions.max_new_tokens" -> "max_tokens"); nullopt where none does.
std::optional<std::string> RequestFieldOf(absl::string_view path);

// The library names its fields (KVCacheSpec.budget, max_new_tokens) and carries them in its
// statuses; the API's names are kv_budget, max_tokens, ...: the status's message with the
// fields it carries named as the request names them.
std::string InRequestTerms(const absl::Status& status);

// An error response: HTTP status and OpenAI's {"error": {"message", "type", "code"}}.
struct ApiError {
  int http_status = 500;
  std::string message;
  std::string type;   // invalid_request_error, authentication_error, ...
  std::string code;   // empty: null
  std::string param;  // the request field at fault; empty: null
  std::string Json() const;
};
// InvalidArgument, OutOfRange, FailedPrecondition, Unimplemented (a request asking what lgpt
// cannot do yet) -> 400; Unauthenticated -> 401;
// NotFound -> 404; ResourceExhausted -> 429; Unavailable -> 503; others 500. The message names
// the fields the status carries in request terms (InRequestTerms). An InvalidArgument,
// FailedPrecondition or Unimplemented carrying a field a request sets has it as `param`, as
// OpenAI's errors do;
// one carrying no field, whose message names one the way request errors do ("'temperature'
// must be ...", "unknown or unsupported field 'x'"), has that.
ApiError ApiErrorFromStatus(const absl::Status& status);

// "stop" for stop tokens and stop sequences, "length" for max_tokens and a full context,
// "cancelled" otherwise.
const char* ApiFinishReason(FinishReason reason);

// What every response and chunk of one request repeats.
struct ResponseHeader {
  std::string id;  // cmpl-..., chatcmpl-...
  int64_t created = 0;
  std::string model;
};

// lgpt's extension of `usage`, for requests that decoded speculatively: over all choices, the
// tokens proposed, those accepted and the verification steps (GenerateStats).
struct SpeculativeUsage {
  int64_t proposed_tokens = 0;
  int64_t accepted_tokens = 0;
  int64_t verify_steps = 0;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  // Set for requests that speculated: "usage" then holds "speculative": {"proposed_tokens",
  // "accepted_tokens", "acceptance_rate", "verify_steps"} (extra fields OpenAI's clients keep).
  std::optional<SpeculativeUsage> speculative;
};

// The text of one token as the logprobs objects show it.
using TokenText = std::function<std::string(int64_t token)>;

// Log-probabilities in each endpoint's shape. Completions: {"tokens", "token_logprobs",
// "top_logprobs" (a {token text: logprob} object per token), "text_offset"} with offsets from
// `text_offset`; chat: {"content": [{"token", "logprob", "bytes", "top_logprobs"}]}.
nlohmann::json CompletionLogprobs(const std::vector<TokenLogprob>& logprobs,
                                  const TokenText& token_text, int64_t text_offset = 0);
nlohmann::json ChatLogprobs(const std::vector<TokenLogprob>& logprobs, const TokenText& token_text);

// One choice of a response or a chunk. `logprobs` null: none asked.
struct ChoiceJson {
  int64_t index = 0;
  std::string text;
  std::string finish_reason;  // empty: null
  nlohmann::json logprobs;
  // Chat: the assistant's tool calls, [{"id", "type": "function", "function": {"name",
  // "arguments"}}] (null: none); with them an empty text is a null content.
  nlohmann::json tool_calls;
};

// Tool calls as a chat message carries them, each with a fresh id ("call_<hex>") unless the
// model wrote one.
nlohmann::json ToolCallsJson(const std::vector<ToolCall>& calls,
                             const std::function<uint64_t()>& random);

// Whole responses.
std::string CompletionJson(const ResponseHeader& header, const std::vector<ChoiceJson>& choices,
                           const Usage& usage);
std::string ChatCompletionJson(const ResponseHeader& header, const std::vector<ChoiceJson>& choices,
                               const Usage& usage);

// Stream chunks (the JSON after "data: "), one choice each. Chat: `role` first (delta
// {"role": "assistant", "content": ""}), then content pieces, then an empty delta with the
// finish reason.
std::string CompletionChunkJson(const ResponseHeader& header, const ChoiceJson& choice);
std::string ChatChunkJson(const ResponseHeader& header, bool role, const ChoiceJson& choice);
// The last chunk with stream_options.include_usage: no choices, the usage.
std::string UsageChunkJson(const ResponseHeader& header, bool chat, const Usage& usage);
// One server-sent event: "data: <payload>\n\n".
std::string SseEvent(absl::string_view payload);

// GET /v1/models (the model, then its LoRA adapters, each with "parent": the model) and
// GET /v1/models/{id} (`parent` empty for the model itself).
std::string ModelsJson(absl::string_view model_id, const std::vector<std::string>& adapters,
                       int64_t created);
std::string ModelJson(absl::string_view model_id, int64_t created, absl::string_view parent = "");

}  // namespace lgpt

#endif  // LGPT_TOOLS_SERVER_OPENAI_API_H_
