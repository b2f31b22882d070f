// Tool calls in a model's generated text, in the format its family was tuned on:
//
//   kHermes   Hermes / Qwen2.5 / Falcon3: <tool_call>{"name": ..., "arguments": {...}}</tool_call>,
//             one or several (Falcon3 puts a JSON list of calls in one block)
//   kLlama3   Llama 3.1 / 3.2: {"name": ..., "parameters": {...}}, optionally after
//             <|python_tag|>, several separated by ';'
//   kMistral  Mistral v3: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (and the newer
//             [TOOL_CALLS]name[ARGS]{...})
//   kGeneric  anything else: a bare JSON object with "name" and "arguments" (or "parameters")
//
// ToolCallFormatForTemplate picks the format from a checkpoint's chat template text (the
// markers it contains), so a server parses each checkpoint's output its own way. A call whose
// JSON is malformed is no call: its text stays in the content.
#ifndef LGPT_CORE_TEXT_TOOL_CALLS_H_
#define LGPT_CORE_TEXT_TOOL_CALLS_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace lgpt {

enum class ToolCallFormat { kHermes, kLlama3, kMistral, kGeneric };

// "hermes", "llama3", "mistral", "generic".
absl::string_view ToolCallFormatName(ToolCallFormat format);

// The format a chat template's model writes calls in: <tool_call> -> kHermes,
// [TOOL_CALLS] -> kMistral, <|python_tag|> or the Llama 3 header with "parameters" ->
// kLlama3, else kGeneric.
ToolCallFormat ToolCallFormatForTemplate(absl::string_view chat_template);

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, compact, keys in the model's order
  std::string id;         // where the model wrote one (Mistral), else empty
};

struct ParsedToolCalls {
  std::string content;  // the text outside the calls, trimmed
  std::vector<ToolCall> calls;
};

ParsedToolCalls ParseToolCalls(absl::string_view text, ToolCallFormat format);

// The text a call to `name` starts with in `format`, up to where its arguments object
// begins, and the text after the object that closes the call: a server forcing a call
// emits the prefix, constrains the arguments, then the suffix.
struct ForcedToolCall {
  std::string prefix;
  std::string suffix;
};
ForcedToolCall ForcedToolCallText(ToolCallFormat format, absl::string_view name);

}  // namespace lgpt

#endif  // LGPT_CORE_TEXT_TOOL_CALLS_H_
