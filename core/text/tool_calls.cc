#include "core/text/tool_calls.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

namespace lgpt {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr absl::string_view kToolCallOpen = "<tool_call>";
constexpr absl::string_view kToolCallClose = "</tool_call>";
constexpr absl::string_view kPythonTag = "<|python_tag|>";
constexpr absl::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr absl::string_view kMistralArgs = "[ARGS]";
constexpr absl::string_view kMistralCallId = "[CALL_ID]";

std::string Trim(absl::string_view s) { return std::string(absl::StripAsciiWhitespace(s)); }

size_t SkipSpace(absl::string_view s, size_t p) {
  while (p < s.size() && absl::ascii_isspace(s[p])) ++p;
  return p;
}

// The end (one past) of the JSON object or array that starts at `start`, by bracket matching
// outside strings; npos when it does not close.
size_t JsonEnd(absl::string_view s, size_t start) {
  if (start >= s.size() || (s[start] != '{' && s[start] != '[')) return absl::string_view::npos;
  std::string stack;
  bool in_string = false;
  for (size_t i = start; i < s.size(); ++i) {
    char c = s[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      stack.push_back(c == '{' ? '}' : ']');
    } else if (c == '}' || c == ']') {
      if (stack.empty() || stack.back() != c) return absl::string_view::npos;
      stack.pop_back();
      if (stack.empty()) return i + 1;
    }
  }
  return absl::string_view::npos;
}

std::optional<OrderedJson> ParseJson(absl::string_view s) {
  OrderedJson json = OrderedJson::parse(s.begin(), s.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return std::nullopt;
  return json;
}

std::string Dump(const OrderedJson& json) {
  return json.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

// A call from {"name": ..., "arguments"|"parameters": {...} or "{...}", "id"?}; nullopt when
// the object is not one.
std::optional<ToolCall> CallFromObject(const OrderedJson& object) {
  if (!object.is_object()) return std::nullopt;
  auto name = object.find("name");
  if (name == object.end() || !name->is_string() || name->get<std::string>().empty()) {
    return std::nullopt;
  }
  auto arguments = object.find("arguments");
  if (arguments == object.end()) arguments = object.find("parameters");
  OrderedJson args = OrderedJson::object();
  if (arguments != object.end()) {
    args = *arguments;
    if (args.is_string()) {
      std::optional<OrderedJson> parsed = ParseJson(args.get<std::string>());
      if (!parsed.has_value()) return std::nullopt;
      args = std::move(*parsed);
    }
    if (!args.is_object()) return std::nullopt;
  }
  ToolCall call;
  call.name = name->get<std::string>();
  call.arguments = Dump(args);
  auto id = object.find("id");
  if (id != object.end() && id->is_string()) call.id = id->get<std::string>();
  return call;
}

// Calls from one JSON value: an object, or a list of objects (all must be calls).
std::optional<std::vector<ToolCall>> CallsFromJson(const OrderedJson& json) {
  std::vector<ToolCall> calls;
  if (json.is_array()) {
    if (json.empty()) return std::nullopt;
    for (const auto& item : json) {
      std::optional<ToolCall> call = CallFromObject(item);
      if (!call.has_value()) return std::nullopt;
      calls.push_back(std::move(*call));
    }
    return calls;
  }
  std::optional<ToolCall> call = CallFromObject(json);
  if (!call.has_value()) return std::nullopt;
  calls.push_back(std::move(*call));
  return calls;
}

ParsedToolCalls NoCalls(absl::string_view text) { return ParsedToolCalls{Trim(text), {}}; }

ParsedToolCalls ParseHermes(absl::string_view text) {
  ParsedToolCalls result;
  std::string content;
  size_t pos = 0;
  while (true) {
    size_t open = text.find(kToolCallOpen, pos);
    if (open == absl::string_view::npos) {
      absl::StrAppend(&content, text.substr(pos));
      break;
    }
    absl::StrAppend(&content, text.substr(pos, open - pos));
    size_t body = open + kToolCallOpen.size();
    size_t close = text.find(kToolCallClose, body);
    size_t end = close == absl::string_view::npos ? text.size() : close + kToolCallClose.size();
    absl::string_view inner =
        text.substr(body, (close == absl::string_view::npos ? text.size() : close) - body);
    std::optional<OrderedJson> json = ParseJson(absl::StripAsciiWhitespace(inner));
    std::optional<std::vector<ToolCall>> calls;
    if (json.has_value()) calls = CallsFromJson(*json);
    if (calls.has_value()) {
      for (ToolCall& call : *calls) result.calls.push_back(std::move(call));
    } else {
      absl::StrAppend(&content, text.substr(open, end - open));  // malformed: kept as text
    }
    pos = end;
  }
  result.content = Trim(content);
  return result;
}

// Consecutive JSON call objects from `start` (separated by whitespace or ';'); the calls and
// where they end, or nullopt where there is none or one is malformed.
std::optional<std::pair<std::vector<ToolCall>, size_t>> ObjectSequence(absl::string_view text,
                                                                       size_t start) {
  std::vector<ToolCall> calls;
  size_t p = SkipSpace(text, start);
  while (p < text.size() && text[p] == '{') {
    size_t end = JsonEnd(text, p);
    if (end == absl::string_view::npos) return std::nullopt;
    std::optional<OrderedJson> json = ParseJson(text.substr(p, end - p));
    if (!json.has_value()) return std::nullopt;
    std::optional<ToolCall> call = CallFromObject(*json);
    if (!call.has_value()) return std::nullopt;
    calls.push_back(std::move(*call));
    p = SkipSpace(text, end);
    if (p < text.size() && text[p] == ';') p = SkipSpace(text, p + 1);
  }
  if (calls.empty()) return std::nullopt;
  return std::make_pair(std::move(calls), p);
}

// Llama 3 and the generic format: JSON call objects, after <|python_tag|> where there is one,
// else from the first '{'.
ParsedToolCalls ParseObjects(absl::string_view text, bool python_tag) {
  size_t tag = python_tag ? text.find(kPythonTag) : absl::string_view::npos;
  size_t start = tag != absl::string_view::npos ? tag + kPythonTag.size() : text.find('{');
  size_t before = tag != absl::string_view::npos ? tag : start;
  if (start == absl::string_view::npos) return NoCalls(text);
  auto sequence = ObjectSequence(text, start);
  if (!sequence.has_value()) return NoCalls(text);
  ParsedToolCalls result;
  result.calls = std::move(sequence->first);
  result.content = Trim(absl::StrCat(text.substr(0, before), text.substr(sequence->second)));
  return result;
}

ParsedToolCalls ParseMistral(absl::string_view text) {
  size_t marker = text.find(kMistralCalls);
  if (marker == absl::string_view::npos) return NoCalls(text);
  ParsedToolCalls result;
  std::string content(text.substr(0, marker));
  size_t p = marker;
  while (absl::StartsWith(text.substr(p), kMistralCalls)) {
    p = SkipSpace(text, p + kMistralCalls.size());
    if (p < text.size() && text[p] == '[') {
      size_t end = JsonEnd(text, p);
      if (end == absl::string_view::npos) return NoCalls(text);
      std::optional<OrderedJson> json = ParseJson(text.substr(p, end - p));
      if (!json.has_value() || !json->is_array()) return NoCalls(text);
      std::optional<std::vector<ToolCall>> calls = CallsFromJson(*json);
      if (!calls.has_value()) return NoCalls(text);
      for (ToolCall& call : *calls) result.calls.push_back(std::move(call));
      p = SkipSpace(text, end);
      continue;
    }
    // The newer form: name[CALL_ID]id[ARGS]{...}.
    size_t args = text.find(kMistralArgs, p);
    if (args == absl::string_view::npos) return NoCalls(text);
    ToolCall call;
    absl::string_view head = text.substr(p, args - p);
    size_t id = head.find(kMistralCallId);
    call.name = Trim(head.substr(0, id));
    if (id != absl::string_view::npos) call.id = Trim(head.substr(id + kMistralCallId.size()));
    size_t object = SkipSpace(text, args + kMistralArgs.size());
    size_t end = JsonEnd(text, object);
    if (call.name.empty() || end == absl::string_view::npos) return NoCalls(text);
    std::optional<OrderedJson> json = ParseJson(text.substr(object, end - object));
    if (!json.has_value() || !json->is_object()) return NoCalls(text);
    call.arguments = Dump(*json);
    result.calls.push_back(std::move(call));
    p = SkipSpace(text, end);
  }
  absl::StrAppend(&content, text.substr(p));
  result.content = Trim(content);
  return result;
}

}  // namespace

absl::string_view ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3:
      return "llama3";
    case ToolCallFormat::kMistral:
      return "mistral";
    case ToolCallFormat::kGeneric:
      return "generic";
  }
  return "generic";
}

ToolCallFormat ToolCallFormatForTemplate(absl::string_view chat_template) {
  if (absl::StrContains(chat_template, kToolCallOpen)) return ToolCallFormat::kHermes;
  if (absl::StrContains(chat_template, kMistralCalls)) return ToolCallFormat::kMistral;
  if (absl::StrContains(chat_template, kPythonTag) ||
      (absl::StrContains(chat_template, "<|start_header_id|>") &&
       absl::StrContains(chat_template, "\"parameters\""))) {
    return ToolCallFormat::kLlama3;
  }
  return ToolCallFormat::kGeneric;
}

ParsedToolCalls ParseToolCalls(absl::string_view text, ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return ParseHermes(text);
    case ToolCallFormat::kLlama3:
      return ParseObjects(text, /*python_tag=*/true);
    case ToolCallFormat::kMistral:
      return ParseMistral(text);
    case ToolCallFormat::kGeneric:
      return ParseObjects(text, /*python_tag=*/false);
  }
  return NoCalls(text);
}

ForcedToolCall ForcedToolCallText(ToolCallFormat format, absl::string_view name) {
  const std::string quoted =
      OrderedJson(std::string(name)).dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
  switch (format) {
    case ToolCallFormat::kHermes:
      return {absl::StrCat("<tool_call>\n{\"name\": ", quoted, ", \"arguments\": "),
              "}\n</tool_call>"};
    case ToolCallFormat::kLlama3:
      return {absl::StrCat("{\"name\": ", quoted, ", \"parameters\": "), "}"};
    case ToolCallFormat::kMistral:
      return {absl::StrCat("[TOOL_CALLS] [{\"name\": ", quoted, ", \"arguments\": "), "}]"};
    case ToolCallFormat::kGeneric:
      return {absl::StrCat("{\"name\": ", quoted, ", \"arguments\": "), "}"};
  }
  return {};
}

}  // namespace lgpt
