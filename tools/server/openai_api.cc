#include "tools/server/openai_api.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

// Choices one request may ask for (prompts times n): each is a request in the scheduler.
constexpr int64_t kMaxChoices = 128;
// Log-probabilities of at most this many most likely tokens (OpenAI's chat limit).
constexpr int64_t kMaxTopLogprobs = 20;

// A list of token ids at `field`.
absl::StatusOr<std::vector<int64_t>> TokenIds(const std::string& field, const json& value) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < value.size(); ++i) {
    ASSIGN_OR_RETURN(const int64_t id, Integer(absl::StrCat(field, "[", i, "]"), value[i]));
    ids.push_back(id);
  }
  if (ids.empty()) return RequestFieldError(field, absl::StrCat("'", field, "' is empty"));
  return ids;
}

// "prompt" (or embeddings' "input", `name`): a string, a list of token ids, or a list of
// either (one prompt each, at most `most`).
absl::Status ParsePrompt(const json& value, const std::string& name, int64_t most,
                         std::vector<PromptInput>& prompts) {
  if (value.is_string()) {
    prompts.push_back({value.get<std::string>(), {}});
    return absl::OkStatus();
  }
  if (!value.is_array()) return WrongType(name, "a string or an array", value);
  if (value.empty()) return RequestFieldError(name, absl::StrCat("'", name, "' is empty"));
  if (value[0].is_number()) {
    ASSIGN_OR_RETURN(std::vector<int64_t> ids, TokenIds(name, value));
    prompts.push_back({"", std::move(ids)});
    return absl::OkStatus();
  }
  if (static_cast<int64_t>(value.size()) > most) {
    return RequestFieldError(
        name, absl::StrCat("'", name, "' holds ", value.size(), " inputs; at most ", most));
  }
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string field = absl::StrCat(name, "[", i, "]");
    if (value[i].is_string()) {
      prompts.push_back({value[i].get<std::string>(), {}});
    } else if (value[i].is_array()) {
      ASSIGN_OR_RETURN(std::vector<int64_t> ids, TokenIds(field, value[i]));
      prompts.push_back({"", std::move(ids)});
    } else {
      return WrongType(field, "a string or a list of token ids", value[i]);
    }
  }
  return absl::OkStatus();
}

// "n" or "best_of": in [1, kMaxChoices].
absl::StatusOr<int64_t> ChoiceCount(const std::string& field, const json& value) {
  ASSIGN_OR_RETURN(const int64_t n, Integer(field, value));
  if (n < 1 || n > kMaxChoices) {
    return RequestFieldError(
        field, absl::StrCat("'", field, "' must be in [1, ", kMaxChoices, "], got ", n));
  }
  return n;
}

// What the log-probability fields ask: completions' `logprobs: K`; chat's `logprobs: true`
// with `top_logprobs: K`. Read after every field, whatever their order.
struct LogprobFields {
  std::optional<int64_t> completion_k;  // completions' logprobs
  std::optional<bool> chat_on;          // chat's logprobs
  std::optional<int64_t> chat_k;        // chat's top_logprobs
  std::optional<int64_t> best_of;
};

absl::StatusOr<int64_t> TopCount(const std::string& field, const json& value) {
  ASSIGN_OR_RETURN(const int64_t k, Integer(field, value));
  if (k < 0 || k > kMaxTopLogprobs) {
    return RequestFieldError(
        field, absl::StrCat("'", field, "' must be in [0, ", kMaxTopLogprobs, "], got ", k));
  }
  return k;
}

// Reads `logprobs`, `top_logprobs` and `best_of`; false when `key` is none of them.
absl::StatusOr<bool> ParseLogprobField(bool chat, const std::string& key, const json& value,
                                       LogprobFields& fields) {
  if (key == "logprobs" && chat) {
    ASSIGN_OR_RETURN(fields.chat_on, Boolean(key, value));
  } else if (key == "logprobs") {
    // false as "none" too (clients that send the chat spelling).
    if (value.is_boolean() && !value.get<bool>()) return true;
    ASSIGN_OR_RETURN(fields.completion_k, TopCount(key, value));
  } else if (key == "top_logprobs" && chat) {
    ASSIGN_OR_RETURN(fields.chat_k, TopCount(key, value));
  } else if (key == "best_of" && !chat) {
    ASSIGN_OR_RETURN(fields.best_of, ChoiceCount(key, value));
  } else {
    return false;
  }
  return true;
}

absl::Status ResolveLogprobFields(const LogprobFields& fields, ApiRequest& request) {
  if (fields.best_of && *fields.best_of != request.n) {
    // best_of > n samples extra choices and returns the likeliest: not done here.
    return Unsupported("best_of", "only equal to n");
  }
  if (fields.completion_k) request.logprobs = *fields.completion_k;
  if (fields.chat_k && !fields.chat_on.value_or(false)) {
    return RequestFieldError("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  }
  if (fields.chat_on.value_or(false)) request.logprobs = fields.chat_k.value_or(0);
  request.options.top_logprobs = request.logprobs;
  return absl::OkStatus();
}

// Chat's messages and tools as given (keys in order, for chat templates), and tool_choice's
// default: auto with tools, none without; a named function must be one of the tools.
absl::Status ResolveTools(const nlohmann::ordered_json& ordered, ApiRequest& request) {
  request.message_json = ordered["messages"];
  if (request.tools_given) request.tools = ordered["tools"];
  if (!request.tool_choice_given && request.tools_given)
    request.tool_choice.kind = ToolChoice::kAuto;
  if (request.tool_choice.kind != ToolChoice::kNone && !request.tools_given) {
    return RequestFieldError("tool_choice", "'tool_choice' needs 'tools'");
  }
  if (request.tool_choice.kind == ToolChoice::kNamed) {
    for (const auto& tool : request.tools) {
      if (tool["function"]["name"] == request.tool_choice.name) return absl::OkStatus();
    }
    return RequestFieldError("tool_choice",
                             absl::StrCat("'tool_choice' names '", request.tool_choice.name,
                                          "', which is not one of 'tools'"));
  }
  return absl::OkStatus();
}

// Sets the request's output format from `field`; a second one is refused naming it.
absl::Status SetOutputFormat(ApiRequest& request, const std::string& field, OutputFormat format) {
  if (request.output_format.kind != OutputFormat::kText) {
    return RequestFieldError(field, absl::StrCat("'", field, "' and '", request.output_format.field,
                                                 "' both constrain the output: give one"));
  }
  format.field = field;
  request.output_format = std::move(format);
  return absl::OkStatus();
}

// OpenAI's response_format: {"type": "text" | "json_object" | "json_schema", "json_schema":
// {"name", "schema", "strict", "description"}}. The schema itself is read (keys in order) by
// ResolveOutputFormat.
absl::Status ParseResponseFormat(const json& value, ApiRequest& request) {
  if (!value.is_object()) return WrongType("response_format", "an object", value);
  const json type = value.contains("type") ? value["type"] : json();
  if (type == "text") return absl::OkStatus();
  OutputFormat format;
  if (type == "json_object") {
    format.kind = OutputFormat::kJsonObject;
    return SetOutputFormat(request, "response_format", std::move(format));
  }
  if (type != "json_schema") {
    return RequestFieldError("response_format.type",
                             "'response_format.type' must be \"text\", \"json_object\" or "
                             "\"json_schema\"");
  }
  if (!value.contains("json_schema") || !value["json_schema"].is_object()) {
    return RequestFieldError("response_format.json_schema",
                             "'response_format.json_schema' must be an object with a 'schema'");
  }
  const json& spec = value["json_schema"];
  if (spec.contains("schema") && !spec["schema"].is_object() && !spec["schema"].is_boolean()) {
    return WrongType("response_format.json_schema.schema", "a JSON schema object", spec["schema"]);
  }
  format.kind = OutputFormat::kJsonSchema;
  return SetOutputFormat(request, "response_format.json_schema.schema", std::move(format));
}

// The guided fields: guided_json / json_schema (a schema object or its JSON text),
// guided_regex, guided_grammar / grammar (GBNF), guided_choice (a list of strings).
absl::StatusOr<bool> ParseGuidedField(const std::string& key, const json& value,
                                      ApiRequest& request) {
  OutputFormat format;
  if (key == "guided_json" || key == "json_schema") {
    if (!value.is_object() && !value.is_string()) {
      return WrongType(key, "a JSON schema (an object or its text)", value);
    }
    format.kind = OutputFormat::kJsonSchema;
  } else if (key == "guided_regex") {
    ASSIGN_OR_RETURN(format.text, String(key, value));
    format.kind = OutputFormat::kRegex;
  } else if (key == "guided_grammar" || key == "grammar") {
    ASSIGN_OR_RETURN(format.text, String(key, value));
    format.kind = OutputFormat::kGrammar;
  } else if (key == "guided_choice") {
    if (!value.is_array() || value.empty())
      return WrongType(key, "a non-empty list of strings", value);
    for (size_t i = 0; i < value.size(); ++i) {
      ASSIGN_OR_RETURN(std::string choice, String(absl::StrCat(key, "[", i, "]"), value[i]));
      format.choices.push_back(std::move(choice));
    }
    format.kind = OutputFormat::kChoice;
  } else {
    return false;
  }
  RETURN_IF_ERROR(SetOutputFormat(request, key, std::move(format)));
  return true;
}

// A JSON schema's text (guided_json given as a string) or object, keys in order.
absl::Status ResolveOutputFormat(const nlohmann::ordered_json& ordered, ApiRequest& request) {
  OutputFormat& format = request.output_format;
  if (format.kind != OutputFormat::kJsonSchema) return absl::OkStatus();
  if (format.field == "response_format.json_schema.schema") {
    const auto& spec = ordered["response_format"]["json_schema"];
    format.schema = spec.contains("schema") ? spec["schema"] : nlohmann::ordered_json::object();
    return absl::OkStatus();
  }
  const nlohmann::ordered_json& value = ordered[format.field];
  if (value.is_object()) {
    format.schema = value;
    return absl::OkStatus();
  }
  const std::string text = value.get<std::string>();
  format.schema = nlohmann::ordered_json::parse(text, nullptr, false);
  if (format.schema.is_discarded() || !format.schema.is_object()) {
    return RequestFieldError(format.field,
                             absl::StrCat("'", format.field, "' is not a JSON schema object"));
  }
  return absl::OkStatus();
}

// "logit_bias": {"token id": bias}.
absl::Status ParseLogitBias(const json& value, SamplingOptions& sampling) {
  if (!value.is_object()) return WrongType("logit_bias", "an object", value);
  for (const auto& [key, bias] : value.items()) {
    const std::string field = absl::StrCat("logit_bias.", key);
    int64_t id = -1;
    if (key.empty() || key.size() > 18 ||
        !std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return RequestFieldError("logit_bias", absl::StrCat("'logit_bias' keys are token ids, got '",
                                                          key.substr(0, 40), "'"));
    }
    id = std::stoll(key);
    ASSIGN_OR_RETURN(const double number, Number(field, bias));
    sampling.logit_bias.emplace_back(id, number);
  }
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

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name",
// "arguments" (JSON text)}}].
absl::Status CheckToolCalls(const std::string& field, const json& value) {
  if (!value.is_array()) return WrongType(field, "an array", value);
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string call = absl::StrCat(field, "[", i, "]");
    const json& entry = value[i];
    if (!entry.is_object() || !entry.contains("function") || !entry["function"].is_object()) {
      return RequestFieldError(call, absl::StrCat("'", call,
                                                  "' must be {\"type\": \"function\", "
                                                  "\"function\": {\"name\", \"arguments\"}}"));
    }
    const json& function = entry["function"];
    if (!function.contains("name") || !function["name"].is_string()) {
      return RequestFieldError(call + ".function.name",
                               absl::StrCat("'", call, ".function.name' must be a string"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseMessages(const json& value, ApiRequest& request) {
  if (!value.is_array()) return WrongType("messages", "an array", value);
  if (value.empty()) return RequestFieldError("messages", "'messages' is empty");
  for (size_t i = 0; i < value.size(); ++i) {
    const json& message = value[i];
    const std::string path = absl::StrCat("messages[", i, "]");
    if (!message.is_object()) return WrongType(path, "an object", message);
    ChatMessage parsed;
    bool has_content = false, has_calls = false;
    for (const auto& [key, field] : message.items()) {
      if (key == "role") {
        ASSIGN_OR_RETURN(parsed.role, String(path + ".role", field));
      } else if (key == "content" && !field.is_null()) {
        ASSIGN_OR_RETURN(parsed.content, MessageContent(path + ".content", field));
        has_content = true;
      } else if (key == "tool_calls" && !field.is_null()) {
        RETURN_IF_ERROR(CheckToolCalls(path + ".tool_calls", field));
        has_calls = !field.empty();
      } else if (key == "tool_call_id" || key == "name") {
        if (!field.is_null()) RETURN_IF_ERROR(String(absl::StrCat(path, ".", key), field).status());
      } else if (key != "content" && !field.is_null()) {
        return Unsupported(absl::StrCat(path, ".", key),
                           "messages have role, content, name, tool_calls and tool_call_id");
      }
    }
    if (parsed.role == "developer") parsed.role = "system";
    if (parsed.role != "system" && parsed.role != "user" && parsed.role != "assistant" &&
        parsed.role != "tool") {
      return RequestFieldError(
          path + ".role",
          absl::StrCat("'", path,
                       ".role' must be system, developer, user, assistant or tool, got '",
                       parsed.role, "'"));
    }
    if (has_calls && parsed.role != "assistant") {
      return RequestFieldError(path + ".tool_calls",
                               absl::StrCat("'", path, ".tool_calls' is for assistant messages"));
    }
    if (!has_content && !has_calls) {
      return RequestFieldError(path + ".content", absl::StrCat("'", path, ".content' is required"));
    }
    request.has_tool_messages = request.has_tool_messages || has_calls || parsed.role == "tool";
    request.messages.push_back(std::move(parsed));
  }
  return absl::OkStatus();
}

// "tools": [{"type": "function", "function": {"name", "description", "parameters", "strict"}}].
absl::Status CheckTools(const json& value) {
  if (!value.is_array()) return WrongType("tools", "an array", value);
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string field = absl::StrCat("tools[", i, "]");
    const json& tool = value[i];
    if (!tool.is_object() || !tool.contains("type") || tool["type"] != "function" ||
        !tool.contains("function") || !tool["function"].is_object()) {
      return RequestFieldError(field, absl::StrCat("'", field,
                                                   "' must be {\"type\": \"function\", "
                                                   "\"function\": {\"name\", ...}}"));
    }
    const json& function = tool["function"];
    if (!function.contains("name") || !function["name"].is_string() ||
        function["name"].get<std::string>().empty()) {
      return RequestFieldError(field + ".function.name",
                               absl::StrCat("'", field, ".function.name' must be a name"));
    }
    if (function.contains("parameters") && !function["parameters"].is_object()) {
      return WrongType(field + ".function.parameters", "a JSON schema object",
                       function["parameters"]);
    }
  }
  return absl::OkStatus();
}

// "tool_choice": "none" | "auto" | "required" | {"type": "function", "function": {"name"}}.
absl::StatusOr<ToolChoice> ParseToolChoice(const json& value) {
  ToolChoice choice;
  if (value.is_string()) {
    const std::string kind = value.get<std::string>();
    if (kind == "none") return choice;
    if (kind == "auto") choice.kind = ToolChoice::kAuto;
    if (kind == "required") choice.kind = ToolChoice::kRequired;
    if (choice.kind != ToolChoice::kNone) return choice;
  } else if (value.is_object() && value.contains("function") && value["function"].is_object() &&
             value["function"].contains("name") && value["function"]["name"].is_string()) {
    choice.kind = ToolChoice::kNamed;
    choice.name = value["function"]["name"].get<std::string>();
    return choice;
  }
  return RequestFieldError("tool_choice",
                           "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                           "{\"type\": \"function\", \"function\": {\"name\"}}");
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

// num_speculative_tokens at most (ValidateSpeculativeSpec's bound, which ResolveSpeculative
// applies again).
constexpr int64_t kMostSpeculativeTokens = 64;

// vLLM's speculative_config: {"method", "num_speculative_tokens", "prompt_lookup_min",
// "prompt_lookup_max"}, each optional (null: left out).
absl::Status ParseSpeculativeConfig(const json& value, ApiRequest& request) {
  const std::string name = "speculative_config";
  if (!value.is_object()) return WrongType(name, "an object", value);
  SpeculativeConfig config;
  for (const auto& [key, entry] : value.items()) {
    const std::string field = absl::StrCat(name, ".", key);
    if (entry.is_null()) continue;
    if (key == "method") {
      ASSIGN_OR_RETURN(config.method, String(field, entry));
      if (*config.method != "ngram" && *config.method != "draft" && *config.method != "none") {
        return RequestFieldError(
            field, absl::StrCat("'", field, "' must be \"ngram\", \"draft\" or \"none\", got '",
                                config.method->substr(0, 40), "'"));
      }
    } else if (key == "num_speculative_tokens") {
      ASSIGN_OR_RETURN(const int64_t k, Integer(field, entry));
      if (k < 1 || k > kMostSpeculativeTokens) {
        return RequestFieldError(field, absl::StrCat("'", field, "' must be in [1, ",
                                                     kMostSpeculativeTokens, "], got ", k));
      }
      config.num_speculative_tokens = k;
    } else if (key == "prompt_lookup_min" || key == "prompt_lookup_max") {
      ASSIGN_OR_RETURN(const int64_t n, Integer(field, entry));
      if (n < 1)
        return RequestFieldError(field, absl::StrCat("'", field, "' must be >= 1, got ", n));
      (key == "prompt_lookup_min" ? config.prompt_lookup_min : config.prompt_lookup_max) = n;
    } else {
      return Unsupported(field,
                         "speculative_config takes method, num_speculative_tokens, "
                         "prompt_lookup_min and prompt_lookup_max");
    }
  }
  if (config.prompt_lookup_min && config.prompt_lookup_max &&
      *config.prompt_lookup_max < *config.prompt_lookup_min) {
    return RequestFieldError(
        "speculative_config.prompt_lookup_max",
        absl::StrCat("'speculative_config.prompt_lookup_max' (", *config.prompt_lookup_max,
                     ") must be >= 'speculative_config.prompt_lookup_min' (",
                     *config.prompt_lookup_min, ")"));
  }
  request.speculative_config = std::move(config);
  return absl::OkStatus();
}

// Fields lgpt accepts only at the value that changes nothing (n = 1, logprobs false, no tools,
// ...): true when `value` is that value.
bool IsNeutral(absl::string_view field, const json& value) {
  if (value.is_null()) return true;
  if (field == "echo") return value.is_boolean() ? !value.get<bool>() : false;
  if (field == "functions") return value.empty();
  if (field == "suffix") return value == "";
  if (field == "function_call") return value == "none";
  return false;
}

const char* NeutralWhat(absl::string_view field) {
  if (field == "function_call") return "only \"none\" (the deprecated spelling: use tools)";
  return "only when absent, null, false or empty";
}

bool IsNeutralField(absl::string_view field) {
  static const char* const kFields[] = {"echo", "suffix", "functions", "function_call"};
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
  } else if (key == "min_p") {
    ASSIGN_OR_RETURN(options.sampling.min_p, Number(key, value));
  } else if (key == "presence_penalty") {
    ASSIGN_OR_RETURN(options.sampling.presence_penalty, Number(key, value));
  } else if (key == "frequency_penalty") {
    ASSIGN_OR_RETURN(options.sampling.frequency_penalty, Number(key, value));
  } else if (key == "repetition_penalty") {
    ASSIGN_OR_RETURN(options.sampling.repetition_penalty, Number(key, value));
  } else if (key == "logit_bias") {
    return ParseLogitBias(value, options.sampling);
  } else if (key == "n") {
    ASSIGN_OR_RETURN(request.n, ChoiceCount(key, value));
  } else if (key == "response_format") {
    return ParseResponseFormat(value, request);
  } else if (key == "tools" && request.endpoint == ApiEndpoint::kChat) {
    RETURN_IF_ERROR(CheckTools(value));
    request.tools_given = !value.empty();
  } else if (key == "tool_choice" && request.endpoint == ApiEndpoint::kChat) {
    ASSIGN_OR_RETURN(request.tool_choice, ParseToolChoice(value));
    request.tool_choice_given = true;
  } else if (key == "parallel_tool_calls" && request.endpoint == ApiEndpoint::kChat) {
    ASSIGN_OR_RETURN(request.parallel_tool_calls, Boolean(key, value));
  } else if (key == "truncate_prompt_tokens") {
    ASSIGN_OR_RETURN(const int64_t keep, Integer(key, value));
    if (keep < 1) {
      return RequestFieldError(key, absl::StrCat("'", key, "' must be >= 1, got ", keep));
    }
    request.truncate_prompt_tokens = keep;
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
  } else if (key == "return_tokens_as_token_ids") {
    // vLLM's: logprobs name tokens "token_id:<id>" (text that would not round-trip).
    ASSIGN_OR_RETURN(request.tokens_as_ids, Boolean(key, value));
  } else if (key == "ignore_eos") {
    // vLLM's extension: generate max_tokens whatever the model says (benchmarks).
    ASSIGN_OR_RETURN(const bool ignore, Boolean(key, value));
    request.ignore_eos = ignore;
    options.stop_at_eos = !ignore;
  } else if (key == "user") {
    // An end-user id for abuse monitoring: nothing to do with generation.
    return String(key, value).status();
  } else if (key == "speculative_config") {
    return ParseSpeculativeConfig(value, request);
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

namespace {

// The body as a JSON object.
absl::StatusOr<json> JsonObject(absl::string_view body) {
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
  return root;
}

absl::Status UnknownField(const std::string& key) {
  return RequestFieldError(key, absl::StrCat("unknown or unsupported field '", key, "'"));
}

}  // namespace

absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(absl::string_view body) {
  ASSIGN_OR_RETURN(const json root, JsonObject(body));
  TokenizeRequest request;
  ApiRequest chat;  // messages are read as chat reads them
  std::optional<bool> special;
  for (const auto& [key, value] : root.items()) {
    if (key == "model") {
      ASSIGN_OR_RETURN(request.model, String(key, value));
    } else if (key == "prompt") {
      ASSIGN_OR_RETURN(request.prompt, String(key, value));
    } else if (key == "messages") {
      RETURN_IF_ERROR(ParseMessages(value, chat));
    } else if (key == "add_special_tokens") {
      ASSIGN_OR_RETURN(special, Boolean(key, value));
    } else if (key == "add_generation_prompt") {
      // The chat framing always ends with the assistant's turn opening.
      ASSIGN_OR_RETURN(const bool add, Boolean(key, value));
      if (!add) return Unsupported(key, "only true: the framing opens the assistant's turn");
    } else {
      return UnknownField(key);
    }
  }
  if (request.prompt.has_value() == !chat.messages.empty()) {
    return RequestFieldError("prompt", "give one of 'prompt' or 'messages'");
  }
  request.messages = std::move(chat.messages);
  if (!request.prompt) {
    request.message_json = nlohmann::ordered_json::parse(body.begin(), body.end())["messages"];
  }
  request.add_special_tokens = special.value_or(request.prompt.has_value());
  return request;
}

std::string TokenizeJson(const std::vector<int64_t>& ids, int64_t max_model_len) {
  return Dump(json{{"count", ids.size()}, {"max_model_len", max_model_len}, {"tokens", ids}});
}

absl::StatusOr<DetokenizeRequest> ParseDetokenizeRequest(absl::string_view body) {
  ASSIGN_OR_RETURN(const json root, JsonObject(body));
  DetokenizeRequest request;
  bool has_tokens = false;
  for (const auto& [key, value] : root.items()) {
    if (key == "model") {
      ASSIGN_OR_RETURN(request.model, String(key, value));
    } else if (key == "tokens") {
      if (!value.is_array()) return WrongType(key, "a list of token ids", value);
      for (size_t i = 0; i < value.size(); ++i) {
        ASSIGN_OR_RETURN(const int64_t id, Integer(absl::StrCat("tokens[", i, "]"), value[i]));
        request.tokens.push_back(id);
      }
      has_tokens = true;
    } else {
      return UnknownField(key);
    }
  }
  if (!has_tokens) return RequestFieldError("tokens", "'tokens' is required");
  return request;
}

std::string DetokenizeJson(absl::string_view text) {
  return Dump(json{{"prompt", std::string(text)}});
}

absl::StatusOr<EmbeddingsRequest> ParseEmbeddingsRequest(absl::string_view body) {
  ASSIGN_OR_RETURN(const json root, JsonObject(body));
  EmbeddingsRequest request;
  bool has_input = false;
  for (const auto& [key, value] : root.items()) {
    if (key == "input") {
      RETURN_IF_ERROR(ParsePrompt(value, "input", kMaxEmbeddingInputs, request.inputs));
      has_input = true;
    } else if (key == "model") {
      ASSIGN_OR_RETURN(request.model, String(key, value));
    } else if (key == "encoding_format") {
      ASSIGN_OR_RETURN(const std::string format, String(key, value));
      if (format != "float" && format != "base64") {
        return RequestFieldError(key, "'encoding_format' must be \"float\" or \"base64\"");
      }
      request.base64 = format == "base64";
    } else if (key == "dimensions") {
      ASSIGN_OR_RETURN(request.dimensions, Integer(key, value));
    } else if (key == "truncate_prompt_tokens") {
      ASSIGN_OR_RETURN(request.truncate_prompt_tokens, Integer(key, value));
      if (*request.truncate_prompt_tokens < 1) {
        return RequestFieldError(key, "'truncate_prompt_tokens' must be >= 1");
      }
    } else if (key == "user") {
      RETURN_IF_ERROR(String(key, value).status());
    } else {
      return UnknownField(key);
    }
  }
  if (!has_input) return RequestFieldError("input", "'input' is required");
  return request;
}

std::string EmbeddingsJson(const std::vector<std::vector<float>>& vectors, bool base64,
                           absl::string_view model, int64_t prompt_tokens) {
  json data = json::array();
  for (size_t i = 0; i < vectors.size(); ++i) {
    json embedding;
    if (base64) {
      // float32 little-endian bytes, as OpenAI's (and numpy's frombuffer) read them.
      std::string bytes(vectors[i].size() * sizeof(float), '\0');
      for (size_t j = 0; j < vectors[i].size(); ++j) {
        uint32_t bits;
        std::memcpy(&bits, &vectors[i][j], sizeof(bits));
        for (int b = 0; b < 4; ++b) bytes[4 * j + b] = static_cast<char>((bits >> (8 * b)) & 0xff);
      }
      embedding = absl::Base64Escape(bytes);
    } else {
      embedding = vectors[i];
    }
    data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", std::move(embedding)}});
  }
  return Dump(json{{"object", "list"},
                   {"data", std::move(data)},
                   {"model", std::string(model)},
                   {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}});
}

absl::StatusOr<ApiRequest> ParseApiRequest(ApiEndpoint endpoint, absl::string_view body) {
  ASSIGN_OR_RETURN(const json root, JsonObject(body));
  ApiRequest request;
  request.endpoint = endpoint;
  request.options.sampling = {1.0, 0, 1.0};  // OpenAI's defaults
  bool has_input = false;
  const bool chat = endpoint == ApiEndpoint::kChat;
  LogprobFields logprobs;
  for (const auto& [key, value] : root.items()) {
    if (key == (chat ? "messages" : "prompt")) {
      RETURN_IF_ERROR(chat ? ParseMessages(value, request)
                           : ParsePrompt(value, "prompt", kMaxChoices, request.prompts));
      has_input = true;
    } else if ((key == "max_completion_tokens" && !chat) ||
               (chat && (key == "echo" || key == "suffix" || key == "best_of"))) {
      return RequestFieldError(key, absl::StrCat("unknown or unsupported field '", key, "'"));
    } else if (value.is_null() && key != "prompt" && key != "messages") {
      continue;  // null: the default
    } else {
      ASSIGN_OR_RETURN(bool read, ParseLogprobField(chat, key, value, logprobs));
      if (!read) {
        ASSIGN_OR_RETURN(read, ParseGuidedField(key, value, request));
      }
      if (!read) RETURN_IF_ERROR(ParseField(key, value, request));
    }
  }
  if (!has_input) {
    const char* input = chat ? "messages" : "prompt";
    return RequestFieldError(input, absl::StrCat("'", input, "' is required"));
  }
  RETURN_IF_ERROR(ResolveLogprobFields(logprobs, request));
  if (chat || request.output_format.kind == OutputFormat::kJsonSchema) {
    // Keys in the order the request gives them: a template prints tools as given, a schema's
    // properties are written in its order.
    const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(body.begin(), body.end());
    if (chat) RETURN_IF_ERROR(ResolveTools(ordered, request));
    RETURN_IF_ERROR(ResolveOutputFormat(ordered, request));
  }
  const int64_t prompts = chat ? 1 : static_cast<int64_t>(request.prompts.size());
  if (prompts * request.n > kMaxChoices) {
    return RequestFieldError("n", absl::StrCat(prompts, " prompts times 'n' (", request.n,
                                               ") make more than ", kMaxChoices, " choices"));
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

absl::StatusOr<SpeculativeSpec> ResolveSpeculative(const ApiRequest& request,
                                                   const SpeculativeSpec& server_default,
                                                   bool has_draft) {
  if (!request.speculative_config) return server_default;
  const SpeculativeConfig& given = *request.speculative_config;
  SpeculativeSpec spec = server_default;
  if (given.method) {
    spec.method = *given.method;
  } else if (!server_default.enabled() &&
             (given.num_speculative_tokens || given.prompt_lookup_min || given.prompt_lookup_max)) {
    return RequestFieldError("speculative_config.method",
                             "'speculative_config.method' is required (\"ngram\" or \"draft\"): "
                             "this server does not decode speculatively by default");
  }
  if (given.num_speculative_tokens) spec.num_speculative_tokens = *given.num_speculative_tokens;
  if (given.prompt_lookup_min) spec.prompt_lookup_min = *given.prompt_lookup_min;
  if (given.prompt_lookup_max) spec.prompt_lookup_max = *given.prompt_lookup_max;
  // The library's checks over the merged values (a prompt_lookup_min above the server's
  // prompt_lookup_max), its fields named as the request names them.
  const absl::Status valid = ValidateSpeculativeSpec(spec);
  if (!valid.ok()) return WithMessage(valid, InRequestTerms(valid));
  if (spec.method == "draft" && !has_draft) {
    return RequestFieldError("speculative_config.method",
                             "'speculative_config.method' is \"draft\", but this server has no "
                             "draft model (serve --speculative=draft:DIR loads one)");
  }
  return spec;
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
      {"SamplingOptions.min_p", "min_p"},
      {"SamplingOptions.presence_penalty", "presence_penalty"},
      {"SamplingOptions.frequency_penalty", "frequency_penalty"},
      {"SamplingOptions.repetition_penalty", "repetition_penalty"},
      {"SamplingOptions.logit_bias", "logit_bias"},
      {"RequestOptions.top_logprobs", "logprobs"},
      {"SubmitChoices.n", "n"},
      {"SpeculativeSpec.method", "speculative_config.method"},
      {"SpeculativeSpec.num_speculative_tokens", "speculative_config.num_speculative_tokens"},
      {"SpeculativeSpec.prompt_lookup_min", "speculative_config.prompt_lookup_min"},
      {"SpeculativeSpec.prompt_lookup_max", "speculative_config.prompt_lookup_max"},
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
    case absl::StatusCode::kUnimplemented:  // e.g. an option the serving engine lacks yet
      error.http_status = 400;
      error.type = "invalid_request_error";
      if (field) error.param = ParamOf(*field);
      break;
    case absl::StatusCode::kOutOfRange:
      error.http_status = 400;
      error.type = "invalid_request_error";
      if (absl::StrContains(status.message(), "context")) error.code = "context_length_exceeded";
      if (field) error.param = ParamOf(*field);
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
  json object = {{"prompt_tokens", usage.prompt_tokens},
                 {"completion_tokens", usage.completion_tokens},
                 {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
  if (const std::optional<SpeculativeUsage>& speculative = usage.speculative) {
    const double rate =
        speculative->proposed_tokens > 0
            ? static_cast<double>(speculative->accepted_tokens) / speculative->proposed_tokens
            : 0.0;
    object["speculative"] = {{"proposed_tokens", speculative->proposed_tokens},
                             {"accepted_tokens", speculative->accepted_tokens},
                             {"acceptance_rate", rate},
                             {"verify_steps", speculative->verify_steps}};
  }
  return object;
}

json FinishValue(absl::string_view finish_reason) {
  return finish_reason.empty() ? json(nullptr) : json(std::string(finish_reason));
}

}  // namespace

json CompletionLogprobs(const std::vector<TokenLogprob>& logprobs, const TokenText& token_text,
                        int64_t text_offset) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  for (const TokenLogprob& logprob : logprobs) {
    const std::string text = token_text(logprob.token);
    tokens.push_back(text);
    token_logprobs.push_back(logprob.logprob);
    json alternatives = json::object();
    for (const auto& [id, value] : logprob.top) alternatives[token_text(id)] = value;
    top.push_back(std::move(alternatives));
    offsets.push_back(text_offset);
    text_offset += static_cast<int64_t>(text.size());
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top},
          {"text_offset", offsets}};
}

namespace {

json TokenEntry(const std::string& text, double logprob) {
  json bytes = json::array();
  for (const char c : text) bytes.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return {{"token", text}, {"logprob", logprob}, {"bytes", bytes}};
}

json ChoiceBase(const ChoiceJson& choice) {
  return {{"index", choice.index},
          {"logprobs", choice.logprobs},
          {"finish_reason", FinishValue(choice.finish_reason)}};
}

}  // namespace

json ChatLogprobs(const std::vector<TokenLogprob>& logprobs, const TokenText& token_text) {
  json content = json::array();
  for (const TokenLogprob& logprob : logprobs) {
    json entry = TokenEntry(token_text(logprob.token), logprob.logprob);
    json top = json::array();
    for (const auto& [id, value] : logprob.top) top.push_back(TokenEntry(token_text(id), value));
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return {{"content", content}};
}

std::string CompletionJson(const ResponseHeader& header, const std::vector<ChoiceJson>& choices,
                           const Usage& usage) {
  json response = Base(header, "text_completion");
  response["choices"] = json::array();
  for (const ChoiceJson& choice : choices) {
    json entry = ChoiceBase(choice);
    entry["text"] = choice.text;
    response["choices"].push_back(std::move(entry));
  }
  response["usage"] = UsageObject(usage);
  return Dump(response);
}

json ToolCallsJson(const std::vector<ToolCall>& calls, const std::function<uint64_t()>& random) {
  json list = json::array();
  for (const ToolCall& call : calls) {
    const std::string id = call.id.empty() ? absl::StrFormat("call_%016x%08x", random(),
                                                             static_cast<uint32_t>(random()))
                                           : call.id;
    list.push_back({{"id", id},
                    {"type", "function"},
                    {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
  }
  return list;
}

std::string ChatCompletionJson(const ResponseHeader& header, const std::vector<ChoiceJson>& choices,
                               const Usage& usage) {
  json response = Base(header, "chat.completion");
  response["choices"] = json::array();
  for (const ChoiceJson& choice : choices) {
    json entry = ChoiceBase(choice);
    entry["message"] = {{"role", "assistant"}, {"content", choice.text}};
    if (!choice.tool_calls.is_null()) {
      if (choice.text.empty()) entry["message"]["content"] = nullptr;
      entry["message"]["tool_calls"] = choice.tool_calls;
    }
    response["choices"].push_back(std::move(entry));
  }
  response["usage"] = UsageObject(usage);
  return Dump(response);
}

std::string CompletionChunkJson(const ResponseHeader& header, const ChoiceJson& choice) {
  json chunk = Base(header, "text_completion");
  json entry = ChoiceBase(choice);
  entry["text"] = choice.text;
  chunk["choices"] = json::array({std::move(entry)});
  return Dump(chunk);
}

std::string ChatChunkJson(const ResponseHeader& header, bool role, const ChoiceJson& choice) {
  json chunk = Base(header, "chat.completion.chunk");
  json delta = json::object();
  if (role) delta["role"] = "assistant";
  if (role || !choice.text.empty()) delta["content"] = choice.text;
  if (!choice.tool_calls.is_null()) {
    // Streamed calls carry their position in the list (unless they name it).
    json calls = choice.tool_calls;
    for (size_t i = 0; i < calls.size(); ++i) {
      if (!calls[i].contains("index")) calls[i]["index"] = i;
    }
    delta["tool_calls"] = std::move(calls);
  }
  json entry = ChoiceBase(choice);
  entry["delta"] = std::move(delta);
  chunk["choices"] = json::array({std::move(entry)});
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

json ModelObject(absl::string_view model_id, int64_t created, absl::string_view parent) {
  json model = {{"id", std::string(model_id)},
                {"object", "model"},
                {"created", created},
                {"owned_by", "lgpt"}};
  if (!parent.empty()) model["parent"] = std::string(parent);
  return model;
}

}  // namespace

std::string ModelJson(absl::string_view model_id, int64_t created, absl::string_view parent) {
  return Dump(ModelObject(model_id, created, parent));
}

std::string ModelsJson(absl::string_view model_id, const std::vector<std::string>& adapters,
                       int64_t created) {
  json data = json::array({ModelObject(model_id, created, "")});
  for (const std::string& adapter : adapters) {
    data.push_back(ModelObject(adapter, created, model_id));
  }
  return Dump(json{{"object", "list"}, {"data", std::move(data)}});
}

}  // namespace lgpt
