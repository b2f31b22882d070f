#include "tools/server/openai_api.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "cache/kv_cache_factory.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "core/model/sampling.h"
#include "nlohmann/json.hpp"

namespace lgpt {
namespace {

using json = nlohmann::json;

// Invalid UTF-8 in generated text becomes U+FFFD instead of an exception.
std::string Dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

const char* TypeName(const json& value) {
  switch (value.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::string:
      return "string";
    case json::value_t::array:
      return "array";
    case json::value_t::object:
      return "object";
    case json::value_t::number_float:
      return "number";
    default:
      return "integer";
  }
}

// An error about the request's field `field` (its JSON path, "messages[2].content"), which the
// status carries (core/base/status_field.h) for OpenAI's `param`.
absl::Status RequestFieldError(absl::string_view field, absl::string_view message) {
  return InvalidFieldError(field, message);
}

absl::Status WrongType(absl::string_view field, absl::string_view expected, const json& value) {
  return RequestFieldError(
      field, absl::StrCat("'", field, "' must be ", expected, ", got ", TypeName(value)));
}

absl::StatusOr<double> Number(absl::string_view field, const json& value) {
  if (!value.is_number()) return WrongType(field, "a number", value);
  const double number = value.get<double>();
  if (!std::isfinite(number)) {
    return RequestFieldError(field, absl::StrCat("'", field, "' must be finite"));
  }
  return number;
}

absl::StatusOr<int64_t> Integer(absl::string_view field, const json& value) {
  if (!value.is_number_integer()) return WrongType(field, "an integer", value);
  if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return RequestFieldError(field, absl::StrCat("'", field, "' is out of range"));
  }
  return value.get<int64_t>();
}

absl::StatusOr<bool> Boolean(absl::string_view field, const json& value) {
  if (!value.is_boolean()) return WrongType(field, "a boolean", value);
  return value.get<bool>();
}

absl::StatusOr<std::string> String(absl::string_view field, const json& value) {
  if (!value.is_string()) return WrongType(field, "a string", value);
  return value.get<std::string>();
}

absl::Status Unsupported(absl::string_view field, absl::string_view what) {
  return RequestFieldError(field,
                           absl::StrCat("'", field, "' is not supported by lgpt (", what, ")"));
}

// "stop": a string or a list of strings.
absl::Status ParseStop(const json& value, std::vector<std::string>& stops) {
  if (value.is_string()) {
    stops.push_back(value.get<std::string>());
  } else if (value.is_array()) {
    for (const json& entry : value) {
      if (!entry.is_string()) return WrongType("stop", "a string or a list of strings", entry);
      stops.push_back(entry.get<std::string>());
    }
  } else {
    return WrongType("stop", "a string or a list of strings", value);
  }
  for (const std::string& stop : stops) {
    if (stop.empty()) return RequestFieldError("stop", "'stop' holds an empty string");
  }
  return absl::OkStatus();
}

// "prompt": a string, a list of one string, or a list of token ids.
absl::Status ParsePrompt(const json& value, ApiRequest& request) {
  if (value.is_string()) {
    request.prompt = value.get<std::string>();
    return absl::OkStatus();
  }
  if (!value.is_array()) return WrongType("prompt", "a string or an array", value);
  if (value.size() == 1 && value[0].is_string()) {
    request.prompt = value[0].get<std::string>();
    return absl::OkStatus();
  }
  for (const json& entry : value) {
    if (entry.is_string() || entry.is_array()) {
      return Unsupported("prompt", "one prompt per request: a string or a list of token ids");
    }
    ASSIGN_OR_RETURN(const int64_t id, Integer("prompt", entry));
    request.prompt_ids.push_back(id);
  }
  if (request.prompt_ids.empty()) return RequestFieldError("prompt", "'prompt' is empty");
  return absl::OkStatus();
}

// A message's content: a string, or a list of text parts joined with "\n" (as vLLM and
// llama.cpp join them). `field` is its path, messages[i].content.
absl::StatusOr<std::string> MessageContent(const std::string& field, const json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (!value.is_array()) return WrongType(field, "a string or a list of text parts", value);
  std::vector<std::string> parts;
  for (size_t i = 0; i < value.size(); ++i) {
    const json& part = value[i];
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" ||
        !part.contains("text") || !part["text"].is_string()) {
      return Unsupported(absl::StrCat(field, "[", i, "]"),
                         "only text parts: {\"type\": \"text\", \"text\"}");
    }
    parts.push_back(part["text"].get<std::string>());
  }
  return absl::StrJoin(parts, "\n");
}

absl::Status ParseMessages(const json& value, ApiRequest& request) {
  if (!value.is_array()) return WrongType("messages", "an array", value);
  if (value.empty()) return RequestFieldError("messages", "'messages' is empty");
  for (size_t i = 0; i < value.size(); ++i) {
    const json& message = value[i];
    const std::string path = absl::StrCat("messages[", i, "]");
    if (!message.is_object()) return WrongType(path, "an object", message);
    ChatMessage parsed;
    bool has_content = false;
    for (const auto& [key, field] : message.items()) {
      if (key == "role") {
        ASSIGN_OR_RETURN(parsed.role, String(path + ".role", field));
      } else if (key == "content") {
        ASSIGN_OR_RETURN(parsed.content, MessageContent(path + ".content", field));
        has_content = true;
      } else if (!field.is_null()) {
        return Unsupported(absl::StrCat(path, ".", key), "messages have role and content");
      }
    }
    if (!has_content) {
      return RequestFieldError(path + ".content", absl::StrCat("'", path, ".content' is required"));
    }
    if (parsed.role == "developer") parsed.role = "system";
    if (parsed.role != "system" && parsed.role != "user" && parsed.role != "assistant") {
      return RequestFieldError(
          path + ".role",
          absl::StrCat("'", path, ".role' must be system, developer, user or assistant, got '",
                       parsed.role, "'"));
    }
    request.messages.push_back(std::move(parsed));
  }
  return absl::OkStatus();
}

absl::Status ParseStreamOptions(const json& value, ApiRequest& request) {
  if (!value.is_object()) return WrongType("stream_options", "an object", value);
  for (const auto& [key, field] : value.items()) {
    if (key != "include_usage") {
      return Unsupported(absl::StrCat("stream_options.", key), "only include_usage");
    }
    ASSIGN_OR_RETURN(request.include_usage, Boolean("stream_options.include_usage", field));
  }
  return absl::OkStatus();
}

// Fields lgpt accepts only at the value that changes nothing (n = 1, logprobs false, no tools,
// ...): true when `value` is that value.
bool IsNeutral(absl::string_view field, const json& value) {
  if (value.is_null()) return true;
  if (field == "n" || field == "best_of") return value == 1;
  if (field == "logprobs" || field == "echo") {
    return value.is_boolean() ? !value.get<bool>() : false;
  }
  if (field == "top_logprobs") return value == 0;
  if (field == "presence_penalty" || field == "frequency_penalty") {
    return value.is_number() && value.get<double>() == 0;
  }
  if (field == "logit_bias" || field == "tools" || field == "functions") return value.empty();
  if (field == "suffix") return value == "";
  if (field == "tool_choice" || field == "function_call") return value == "none";
  if (field == "response_format") {
    // Compared, not read as a string: json::value throws on {"type": 5}.
    return value.is_object() && value.contains("type") && value["type"] == "text";
  }
  return false;
}

const char* NeutralWhat(absl::string_view field) {
  if (field == "n" || field == "best_of") return "one choice per request: 1";
  if (field == "presence_penalty" || field == "frequency_penalty") return "only 0";
  if (field == "response_format") return "only {\"type\": \"text\"}";
  if (field == "tool_choice" || field == "function_call") return "only \"none\"";
  return "only when absent, null, false or empty";
}

bool IsNeutralField(absl::string_view field) {
  static const char* const kFields[] = {"n",
                                        "best_of",
                                        "logprobs",
                                        "top_logprobs",
                                        "echo",
                                        "suffix",
                                        "logit_bias",
                                        "tools",
                                        "tool_choice",
                                        "functions",
                                        "function_call",
                                        "response_format",
                                        "presence_penalty",
                                        "frequency_penalty"};
  for (const char* name : kFields) {
    if (field == name) return true;
  }
  return false;
}

// The fields lgpt reads, shared by both endpoints (prompt / messages aside).
absl::Status ParseField(const std::string& key, const json& value, ApiRequest& request) {
  RequestOptions& options = request.options;
  if (key == "model") {
    ASSIGN_OR_RETURN(request.model, String(key, value));
  } else if (key == "max_tokens" || key == "max_completion_tokens") {
    // Chat takes both names (max_tokens is the older one): given together they must agree.
    const std::optional<int64_t> other = request.max_tokens;
    ASSIGN_OR_RETURN(request.max_tokens, Integer(key, value));
    if (*request.max_tokens < 1) {
      return RequestFieldError(key,
                               absl::StrCat("'", key, "' must be >= 1, got ", *request.max_tokens));
    }
    if (other.has_value() && *other != *request.max_tokens) {
      return RequestFieldError(
          key, absl::StrCat("'max_tokens' and 'max_completion_tokens' disagree (", *other, " and ",
                            *request.max_tokens, "): give one"));
    }
  } else if (key == "temperature") {
    ASSIGN_OR_RETURN(options.sampling.temperature, Number(key, value));
  } else if (key == "top_p") {
    ASSIGN_OR_RETURN(options.sampling.top_p, Number(key, value));
  } else if (key == "top_k") {
    ASSIGN_OR_RETURN(options.sampling.top_k, Integer(key, value));
    if (options.sampling.top_k == -1) options.sampling.top_k = 0;  // vLLM's "all"
  } else if (key == "seed") {
    ASSIGN_OR_RETURN(const int64_t seed, Integer(key, value));
    options.seed = static_cast<uint64_t>(seed);
    request.seed_given = true;
  } else if (key == "stop") {
    return ParseStop(value, options.stop_sequences);
  } else if (key == "stream") {
    ASSIGN_OR_RETURN(request.stream, Boolean(key, value));
  } else if (key == "stream_options") {
    return ParseStreamOptions(value, request);
  } else if (key == "ignore_eos") {
    // vLLM's extension: generate max_tokens whatever the model says (benchmarks).
    ASSIGN_OR_RETURN(const bool ignore, Boolean(key, value));
    request.ignore_eos = ignore;
    options.stop_at_eos = !ignore;
  } else if (key == "user") {
    // An end-user id for abuse monitoring: nothing to do with generation.
    return String(key, value).status();
  } else if (key == "kv_cache") {
    ASSIGN_OR_RETURN(options.kv_cache.policy, String(key, value));
  } else if (key == "kv_budget") {
    ASSIGN_OR_RETURN(options.kv_cache.budget, Integer(key, value));
  } else if (key == "kv_bits") {
    ASSIGN_OR_RETURN(const int64_t bits, Integer(key, value));
    // KVCacheSpec.bits is an int: a value beyond it is refused here, as given, rather than
    // clamped into one that the library's check would then report instead.
    if (bits < std::numeric_limits<int>::min() || bits > std::numeric_limits<int>::max()) {
      return RequestFieldError(key, absl::StrCat("'kv_bits' must be 16, 8 or 4, got ", bits));
    }
    options.kv_cache.bits = static_cast<int>(bits);
  } else if (IsNeutralField(key)) {
    if (!IsNeutral(key, value)) return Unsupported(key, NeutralWhat(key));
  } else {
    return RequestFieldError(key, absl::StrCat("unknown or unsupported field '", key, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ApiRequest> ParseApiRequest(ApiEndpoint endpoint, absl::string_view body) {
  json root;
  try {
    root = json::parse(body.begin(), body.end());
  } catch (const json::exception& error) {
    // A syntax error, or a number beyond a double (1e400 is an out_of_range error, not a
    // parse_error). what() reads "[json.exception.parse_error.101] parse error at line 1, ...".
    absl::string_view what = error.what();
    if (const size_t end = what.find("] "); end != absl::string_view::npos)
      what.remove_prefix(end + 2);
    return absl::InvalidArgumentError(absl::StrCat("malformed JSON body: ", what));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request body must be a JSON object, got ", TypeName(root)));
  }
  ApiRequest request;
  request.endpoint = endpoint;
  request.options.sampling = {1.0, 0, 1.0};  // OpenAI's defaults
  bool has_input = false;
  const bool chat = endpoint == ApiEndpoint::kChat;
  for (const auto& [key, value] : root.items()) {
    if (key == (chat ? "messages" : "prompt")) {
      RETURN_IF_ERROR(chat ? ParseMessages(value, request) : ParsePrompt(value, request));
      has_input = true;
    } else if ((key == "max_completion_tokens" && !chat) ||
               (chat && (key == "echo" || key == "suffix" || key == "best_of"))) {
      return RequestFieldError(key, absl::StrCat("unknown or unsupported field '", key, "'"));
    } else if (value.is_null() && key != "prompt" && key != "messages") {
      continue;  // null: the default
    } else {
      RETURN_IF_ERROR(ParseField(key, value, request));
    }
  }
  if (!has_input) {
    const char* input = chat ? "messages" : "prompt";
    return RequestFieldError(input, absl::StrCat("'", input, "' is required"));
  }
  if (request.include_usage && !request.stream) {
    return RequestFieldError("stream_options", "'stream_options' needs 'stream': true");
  }
  // The library's checks, its fields named as the request names them (a sink budget below the
  // sink tokens and a budget on the dense cache among them: cache/kv_cache_factory.h).
  const absl::Status sampling = ValidateSampling(request.options.sampling);
  if (!sampling.ok()) return WithMessage(sampling, InRequestTerms(sampling));
  const absl::Status cache = ValidateKVCacheSpec(request.options.kv_cache);
  if (!cache.ok()) return WithMessage(cache, InRequestTerms(cache));
  return request;
}

std::optional<std::string> RequestFieldOf(absl::string_view path) {
  static const std::pair<const char*, const char*> kFields[] = {
      {"KVCacheSpec.policy", "kv_cache"},
      {"KVCacheSpec.budget", "kv_budget"},
      {"KVCacheSpec.bits", "kv_bits"},
      {"RequestOptions.max_new_tokens", "max_tokens"},
      {"GenerateOptions.max_new_tokens", "max_tokens"},
      {"SamplingOptions.temperature", "temperature"},
      {"SamplingOptions.top_k", "top_k"},
      {"SamplingOptions.top_p", "top_p"},
  };
  for (const auto& [field, name] : kFields) {
    if (path == field) return std::string(name);
  }
  return std::nullopt;
}

namespace {

// A library field's mention as a request reads it: the request field ("kv_budget"), with a
// value as 'kv_budget' (8); settings no request field reaches, in words.
std::optional<std::string> RequestTerm(const FieldMention& mention) {
  if (mention.path == "KVCacheSpec.positions") {
    if (mention.value == "cache") return "cache positions";
    if (mention.value == "absolute") return "the dense cache";
    return std::nullopt;
  }
  if (mention.path == "KVCacheSpec.sink_tokens" && mention.value) {
    return absl::StrCat(*mention.value, " sink tokens");
  }
  std::optional<std::string> field = RequestFieldOf(mention.path);
  if (!field || !mention.value) return field;
  return absl::StrCat("'", *field, "' (", *mention.value, ")");
}

// OpenAI's `param` for a field a status carries: the request field a library field maps to,
// or the request's own JSON path (lower case, where library paths begin with their options
// type: "KVCacheSpec.budget"); empty for fields no request field reaches.
std::string ParamOf(absl::string_view path) {
  if (std::optional<std::string> field = RequestFieldOf(path)) return *field;
  if (!path.empty() && absl::ascii_islower(static_cast<unsigned char>(path[0]))) {
    return std::string(path);
  }
  return "";
}

}  // namespace

std::string ApiError::Json() const {
  json error = {{"message", message}, {"type", type}};
  error["param"] = param.empty() ? json(nullptr) : json(param);
  error["code"] = code.empty() ? json(nullptr) : json(code);
  return Dump(json{{"error", error}});
}

std::string InRequestTerms(const absl::Status& status) {
  return MessageInTerms(status, RequestTerm);
}

ApiError ApiErrorFromStatus(const absl::Status& status) {
  ApiError error;
  const std::optional<std::string> field = ErrorField(status);
  error.message = InRequestTerms(status);
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
      error.http_status = 400;
      error.type = "invalid_request_error";
      if (field) error.param = ParamOf(*field);
      break;
    case absl::StatusCode::kOutOfRange:
      error.http_status = 400;
      error.type = "invalid_request_error";
      if (absl::StrContains(status.message(), "context")) error.code = "context_length_exceeded";
      break;
    case absl::StatusCode::kUnauthenticated:
      error.http_status = 401;
      error.type = "invalid_request_error";
      error.code = "invalid_api_key";
      break;
    case absl::StatusCode::kNotFound:
      error.http_status = 404;
      error.type = "invalid_request_error";
      error.code = "model_not_found";
      break;
    case absl::StatusCode::kResourceExhausted:
      error.http_status = 429;
      error.type = "rate_limit_error";
      error.code = "rate_limit_exceeded";
      break;
    case absl::StatusCode::kUnavailable:
      error.http_status = 503;
      error.type = "server_error";
      error.code = "unavailable";
      break;
    default:
      error.http_status = 500;
      error.type = "server_error";
      break;
  }
  return error;
}

const char* ApiFinishReason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStopToken:
    case FinishReason::kStopSequence:
      return "stop";
    case FinishReason::kMaxTokens:
    case FinishReason::kContextFull:
      return "length";
    case FinishReason::kCancelled:
      break;
  }
  return "cancelled";
}

namespace {

json Base(const ResponseHeader& header, absl::string_view object) {
  return {
      {"id", header.id}, {"object", object}, {"created", header.created}, {"model", header.model}};
}

json UsageObject(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

json FinishValue(absl::string_view finish_reason) {
  return finish_reason.empty() ? json(nullptr) : json(std::string(finish_reason));
}

}  // namespace

std::string CompletionJson(const ResponseHeader& header, absl::string_view text,
                           absl::string_view finish_reason, const Usage& usage) {
  json response = Base(header, "text_completion");
  response["choices"] = json::array({{{"index", 0},
                                      {"text", std::string(text)},
                                      {"logprobs", nullptr},
                                      {"finish_reason", FinishValue(finish_reason)}}});
  response["usage"] = UsageObject(usage);
  return Dump(response);
}

std::string ChatCompletionJson(const ResponseHeader& header, absl::string_view text,
                               absl::string_view finish_reason, const Usage& usage) {
  json response = Base(header, "chat.completion");
  const json message = {{"role", "assistant"}, {"content", std::string(text)}};
  response["choices"] = json::array({{{"index", 0},
                                      {"message", message},
                                      {"logprobs", nullptr},
                                      {"finish_reason", FinishValue(finish_reason)}}});
  response["usage"] = UsageObject(usage);
  return Dump(response);
}

std::string CompletionChunkJson(const ResponseHeader& header, absl::string_view text,
                                absl::string_view finish_reason) {
  json chunk = Base(header, "text_completion");
  chunk["choices"] = json::array({{{"index", 0},
                                   {"text", std::string(text)},
                                   {"logprobs", nullptr},
                                   {"finish_reason", FinishValue(finish_reason)}}});
  return Dump(chunk);
}

std::string ChatChunkJson(const ResponseHeader& header, bool role, absl::string_view content,
                          absl::string_view finish_reason) {
  json chunk = Base(header, "chat.completion.chunk");
  json delta = json::object();
  if (role) delta["role"] = "assistant";
  if (role || !content.empty()) delta["content"] = std::string(content);
  chunk["choices"] = json::array({{{"index", 0},
                                   {"delta", delta},
                                   {"logprobs", nullptr},
                                   {"finish_reason", FinishValue(finish_reason)}}});
  return Dump(chunk);
}

std::string UsageChunkJson(const ResponseHeader& header, bool chat, const Usage& usage) {
  json chunk = Base(header, chat ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = json::array();
  chunk["usage"] = UsageObject(usage);
  return Dump(chunk);
}

std::string SseEvent(absl::string_view payload) { return absl::StrCat("data: ", payload, "\n\n"); }

namespace {

json ModelObject(absl::string_view model_id, int64_t created) {
  return {{"id", std::string(model_id)},
          {"object", "model"},
          {"created", created},
          {"owned_by", "lgpt"}};
}

}  // namespace

std::string ModelJson(absl::string_view model_id, int64_t created) {
  return Dump(ModelObject(model_id, created));
}

std::string ModelsJson(absl::string_view model_id, int64_t created) {
  return Dump(json{{"object", "list"}, {"data", json::array({ModelObject(model_id, created)})}});
}

}  // namespace lgpt
