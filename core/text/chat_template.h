// A checkpoint's Hugging Face chat template (tokenizer_config.json's `chat_template`, or a
// chat_template.jinja beside it), rendered as transformers' apply_chat_template renders it:
// the variables messages, tools, documents (none), add_generation_prompt, the tokenizer's
// bos_token and eos_token, and any extra variables (which win over the tokens).
//
//   ASSIGN_OR_RETURN(ChatTemplate chat, ChatTemplate::Load(checkpoint_dir));
//   ASSIGN_OR_RETURN(std::string prompt,
//                    chat.Render(messages, /*tools=*/nullptr, /*add_generation_prompt=*/true));
//
// Messages are OpenAI-shaped: {"role", "content"} with assistant `tool_calls`
// ([{"id", "type": "function", "function": {"name", "arguments"}}]) and `tool` messages
// ({"role": "tool", "tool_call_id", "content"}). As servers built on transformers do, an
// assistant tool call's `arguments` given as a JSON string holding an object is passed to the
// template as that object (templates print it with tojson). Object keys keep their order when
// the messages are an nlohmann::ordered_json; an nlohmann::json sorts them.
//
// Where the checkpoint has no template, callers fall back to LitGPT's prompt styles
// (core/text/prompt_style.h).
#ifndef LGPT_CORE_TEXT_CHAT_TEMPLATE_H_
#define LGPT_CORE_TEXT_CHAT_TEMPLATE_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/text/jinja.h"
#include "nlohmann/json.hpp"

namespace lgpt {

class ChatTemplate {
 public:
  // Reads `checkpoint_dir`/tokenizer_config.json: `chat_template` (a string, or a list of
  // {"name", "template"}), else `checkpoint_dir`/chat_template.jinja; bos_token and eos_token
  // (strings or {"content": ...} objects). NotFound where the checkpoint has no template;
  // errors name the file and field.
  static absl::StatusOr<ChatTemplate> Load(const std::string& checkpoint_dir,
                                           const jinja::TemplateOptions& options = {});

  // From a parsed tokenizer_config.json (`source` names it in messages).
  static absl::StatusOr<ChatTemplate> FromTokenizerConfig(
      const nlohmann::ordered_json& config, const std::string& source = "tokenizer_config.json",
      const jinja::TemplateOptions& options = {});

  // From template text: `tool_use` (optional) is used where tools are given.
  static absl::StatusOr<ChatTemplate> FromSource(
      absl::string_view source, std::optional<std::string> bos_token = std::nullopt,
      std::optional<std::string> eos_token = std::nullopt,
      std::optional<absl::string_view> tool_use = std::nullopt,
      const jinja::TemplateOptions& options = {});

  // The prompt for `messages` (a JSON array). `tools`: a JSON array of tool schemas, or null
  // for none. `extra`: a JSON object of further template variables (date_string,
  // tools_in_user_message, builtin_tools, ...). A template's raise_exception() fails with
  // InvalidArgument and its message; malformed inputs (the wrong JSON kind, nesting deeper than
  // jinja::kMaxJsonDepth) fail naming the field.
  absl::StatusOr<std::string> Render(
      const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
      bool add_generation_prompt,
      const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  absl::StatusOr<std::string> Render(const nlohmann::json& messages, const nlohmann::json& tools,
                                     bool add_generation_prompt,
                                     const nlohmann::json& extra = nlohmann::json::object()) const;

  // The template text Render uses with (`with_tools`) or without tools.
  const std::string& source(bool with_tools) const;
  const std::optional<std::string>& bos_token() const { return bos_token_; }
  const std::optional<std::string>& eos_token() const { return eos_token_; }

 private:
  ChatTemplate() = default;

  std::string default_source_;
  std::optional<std::string> tool_use_source_;
  std::optional<jinja::Template> default_template_;
  std::optional<jinja::Template> tool_use_template_;
  std::optional<std::string> bos_token_;
  std::optional<std::string> eos_token_;
};

}  // namespace lgpt

#endif  // LGPT_CORE_TEXT_CHAT_TEMPLATE_H_
