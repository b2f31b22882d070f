// OpenAI's HTTP API as lgpt speaks it: request bodies of /v1/completions and
// /v1/chat/completions into RequestOptions (errors name the request's fields), and the JSON of
// responses, stream chunks, /v1/models and errors. Pure: no engine, no sockets.
//
//   absl::StatusOr<ApiRequest> request = ParseApiRequest(ApiEndpoint::kChat, body);
//   if (!request.ok()) reply(ApiErrorFromStatus(request.status()));
//
// Beside OpenAI's fields it takes vLLM's `top_k` and `ignore_eos` and lgpt's KV cache fields
// `kv_cache`, `kv_budget`, `kv_bits` (cache/kv_cache_factory.h). Fields lgpt cannot honour
// (`n` > 1, `logprobs`, `tools`, penalties, ...) and fields it does not know are refused, never
// ignored.
#ifndef LGPT_TOOLS_SERVER_OPENAI_API_H_
#define LGPT_TOOLS_SERVER_OPENAI_API_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/text/prompt_style.h"
#include "lgpt.h"

namespace lgpt {

enum class ApiEndpoint { kCompletions, kChat };

struct ApiRequest {
  ApiEndpoint endpoint = ApiEndpoint::kCompletions;
  std::string model;  // empty when the request names none
  // /v1/completions: text, or token ids.
  std::string prompt;
  std::vector<int64_t> prompt_ids;
  // /v1/chat/completions.
  std::vector<ChatMessage> messages;
  // max_tokens (or max_completion_tokens); unset: the server's default.
  std::optional<int64_t> max_tokens;
  bool seed_given = false;
  bool ignore_eos = false;  // vLLM's extension: no EOS or prompt-style stop ends the reply
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Sampling (OpenAI's defaults: temperature 1, top_p 1, every token), seed, stop sequences
  // and KV cache; no callbacks.
  RequestOptions options;
};

// InvalidArgument naming the field for malformed JSON, wrong types, bad values and fields lgpt
// does not support; the status carries the field (its JSON path, or the library's field behind
// a library check: core/base/status_field.h).
absl::StatusOr<ApiRequest> ParseApiRequest(ApiEndpoint endpoint, absl::string_view body);

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
  std::string type;  // invalid_request_error, authentication_error, ...
  std::string code;  // empty: null
  std::string param;  // the request field at fault; empty: null
  std::string Json() const;
};
// InvalidArgument, OutOfRange, FailedPrecondition -> 400; Unauthenticated -> 401;
// NotFound -> 404; ResourceExhausted -> 429; Unavailable -> 503; others 500. The message names
// the fields the status carries in request terms (InRequestTerms). An InvalidArgument or
// FailedPrecondition carrying a field a request sets has it as `param`, as OpenAI's errors do;
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

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// Whole responses.
std::string CompletionJson(const ResponseHeader& header, absl::string_view text,
                           absl::string_view finish_reason, const Usage& usage);
std::string ChatCompletionJson(const ResponseHeader& header, absl::string_view text,
                               absl::string_view finish_reason, const Usage& usage);

// Stream chunks (the JSON after "data: "). `finish_reason` empty: null. Chat: `role` first
// (delta {"role": "assistant", "content": ""}), then content pieces, then an empty delta with
// the finish reason.
std::string CompletionChunkJson(const ResponseHeader& header, absl::string_view text,
                                absl::string_view finish_reason);
std::string ChatChunkJson(const ResponseHeader& header, bool role, absl::string_view content,
                          absl::string_view finish_reason);
// The last chunk with stream_options.include_usage: no choices, the usage.
std::string UsageChunkJson(const ResponseHeader& header, bool chat, const Usage& usage);
// One server-sent event: "data: <payload>\n\n".
std::string SseEvent(absl::string_view payload);

// GET /v1/models (a list of the one model) and GET /v1/models/{id}.
std::string ModelsJson(absl::string_view model_id, int64_t created);
std::string ModelJson(absl::string_view model_id, int64_t created);

}  // namespace lgpt

#endif  // LGPT_TOOLS_SERVER_OPENAI_API_H_
