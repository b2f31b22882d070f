#include "core/text/chat_template.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/base/file_util.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"

namespace lgpt {
namespace {

using OrderedJson = nlohmann::ordered_json;

// A special token as tokenizer_config.json writes it: a string, an AddedToken object
// ({"content": ...}) or null.
absl::StatusOr<std::optional<std::string>> SpecialToken(const OrderedJson& config,
                                                        const std::string& key,
                                                        const std::string& source) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) {
      return std::optional<std::string>(content->get<std::string>());
    }
  }
  return InvalidFieldError(key, absl::StrCat(source, ": ", key,
                                             " must be a string or an object with a string "
                                             "\"content\", got ",
                                             it->dump()));
}

absl::StatusOr<jinja::Template> ParseNamed(absl::string_view text, const std::string& name,
                                           const jinja::TemplateOptions& options) {
  jinja::TemplateOptions named = options;
  if (named.name == jinja::TemplateOptions().name) named.name = name;
  auto parsed = jinja::Template::Parse(text, named);
  if (!parsed.ok() && !ErrorField(parsed.status()).has_value()) {
    return WithFields(parsed.status(), FieldRef("chat_template", name));
  }
  return parsed;
}

// `messages` with each assistant tool call's `arguments` string that holds a JSON object
// replaced by that object.
OrderedJson WithObjectArguments(const OrderedJson& messages) {
  OrderedJson out = messages;
  for (auto& message : out) {
    if (!message.is_object()) continue;
    auto calls = message.find("tool_calls");
    if (calls == message.end() || !calls->is_array()) continue;
    for (auto& call : *calls) {
      if (!call.is_object()) continue;
      auto function = call.find("function");
      if (function == call.end() || !function->is_object()) continue;
      auto arguments = function->find("arguments");
      if (arguments == function->end() || !arguments->is_string()) continue;
      OrderedJson parsed = OrderedJson::parse(arguments->get<std::string>(), nullptr,
                                              /*allow_exceptions=*/false);
      if (parsed.is_object()) *arguments = std::move(parsed);
    }
  }
  return out;
}

// Whether arrays and objects nest deeper than `limit` in `json` (walked without recursion).
bool DeeperThan(const OrderedJson& json, int limit) {
  std::vector<std::pair<const OrderedJson*, int>> stack = {{&json, 1}};
  while (!stack.empty()) {
    auto [node, depth] = stack.back();
    stack.pop_back();
    if (!node->is_array() && !node->is_object()) continue;
    if (depth > limit) return true;
    for (const auto& child : *node) stack.emplace_back(&child, depth + 1);
  }
  return false;
}

OrderedJson ToOrdered(const nlohmann::json& json) {
  return OrderedJson::parse(json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Load(const std::string& checkpoint_dir,
                                                const jinja::TemplateOptions& options) {
  const std::string config_path = checkpoint_dir + "/tokenizer_config.json";
  const std::string jinja_path = checkpoint_dir + "/chat_template.jinja";
  OrderedJson config = OrderedJson::object();
  if (IsFile(config_path)) {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(config_path));
    config = OrderedJson::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, " is not a JSON object"));
    }
  }
  auto chat_template = config.find("chat_template");
  if (chat_template != config.end() && !chat_template->is_null()) {
    return FromTokenizerConfig(config, config_path, options);
  }
  if (IsFile(jinja_path)) {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(jinja_path));
    ASSIGN_OR_RETURN(std::optional<std::string> bos,
                     SpecialToken(config, "bos_token", config_path));
    ASSIGN_OR_RETURN(std::optional<std::string> eos,
                     SpecialToken(config, "eos_token", config_path));
    return FromSource(text, bos, eos, std::nullopt, options);
  }
  return absl::NotFoundError(absl::StrCat(checkpoint_dir,
                                          " has no chat template (no chat_template in "
                                          "tokenizer_config.json, no chat_template.jinja)"));
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromTokenizerConfig(
    const OrderedJson& config, const std::string& source, const jinja::TemplateOptions& options) {
  if (!config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, " is not a JSON object"));
  }
  ASSIGN_OR_RETURN(std::optional<std::string> bos, SpecialToken(config, "bos_token", source));
  ASSIGN_OR_RETURN(std::optional<std::string> eos, SpecialToken(config, "eos_token", source));
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    return absl::NotFoundError(absl::StrCat(source, " has no chat_template"));
  }
  if (it->is_string()) return FromSource(it->get<std::string>(), bos, eos, std::nullopt, options);
  if (!it->is_array()) {
    return InvalidFieldError("chat_template",
                             absl::StrCat(source,
                                          ": chat_template must be a string or a list of "
                                          "{name, template}"));
  }
  std::optional<std::string> default_source, tool_use_source;
  for (size_t i = 0; i < it->size(); ++i) {
    const OrderedJson& entry = (*it)[i];
    const std::string field = absl::StrCat("chat_template[", i, "]");
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
        !entry.contains("template") || !entry["template"].is_string()) {
      return InvalidFieldError(field, absl::StrCat(source, ": ", field,
                                                   " must be an object with string \"name\" and "
                                                   "\"template\""));
    }
    const std::string name = entry["name"].get<std::string>();
    if (name == "default") default_source = entry["template"].get<std::string>();
    if (name == "tool_use") tool_use_source = entry["template"].get<std::string>();
  }
  if (!default_source.has_value()) {
    return InvalidFieldError("chat_template", absl::StrCat(source,
                                                           ": chat_template has no template named "
                                                           "\"default\""));
  }
  std::optional<absl::string_view> tool_use;
  if (tool_use_source.has_value()) tool_use = *tool_use_source;
  return FromSource(*default_source, bos, eos, tool_use, options);
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromSource(absl::string_view source,
                                                      std::optional<std::string> bos_token,
                                                      std::optional<std::string> eos_token,
                                                      std::optional<absl::string_view> tool_use,
                                                      const jinja::TemplateOptions& options) {
  ChatTemplate chat;
  chat.default_source_ = std::string(source);
  ASSIGN_OR_RETURN(jinja::Template parsed, ParseNamed(source, "chat_template", options));
  chat.default_template_ = std::move(parsed);
  if (tool_use.has_value()) {
    chat.tool_use_source_ = std::string(*tool_use);
    ASSIGN_OR_RETURN(jinja::Template tools,
                     ParseNamed(*tool_use, "chat_template[tool_use]", options));
    chat.tool_use_template_ = std::move(tools);
  }
  chat.bos_token_ = std::move(bos_token);
  chat.eos_token_ = std::move(eos_token);
  return chat;
}

const std::string& ChatTemplate::source(bool with_tools) const {
  return with_tools && tool_use_source_.has_value() ? *tool_use_source_ : default_source_;
}

absl::StatusOr<std::string> ChatTemplate::Render(const OrderedJson& messages,
                                                 const OrderedJson& tools,
                                                 bool add_generation_prompt,
                                                 const OrderedJson& extra) const {
  if (!messages.is_array()) {
    return InvalidFieldError(
        "messages", absl::StrCat("messages must be a JSON array, got ", messages.type_name()));
  }
  if (!tools.is_null() && !tools.is_array()) {
    return InvalidFieldError(
        "tools", absl::StrCat("tools must be a JSON array or null, got ", tools.type_name()));
  }
  if (!extra.is_object()) {
    return InvalidFieldError("extra", absl::StrCat("extra template variables must be a JSON "
                                                   "object, got ",
                                                   extra.type_name()));
  }
  for (const auto& [field, json] :
       {std::pair<const char*, const OrderedJson*>{"messages", &messages},
        {"tools", &tools},
        {"extra", &extra}}) {
    if (DeeperThan(*json, jinja::kMaxJsonDepth)) {
      return InvalidFieldError(field, absl::StrCat(field, " nests arrays and objects deeper than ",
                                                   jinja::kMaxJsonDepth));
    }
  }
  jinja::ValueDict context;
  context.Set("messages", jinja::Value::FromJson(WithObjectArguments(messages)));
  context.Set("tools", tools.is_null() ? jinja::Value::None() : jinja::Value::FromJson(tools));
  context.Set("documents", jinja::Value::None());
  context.Set("add_generation_prompt", jinja::Value(add_generation_prompt));
  if (bos_token_.has_value()) context.Set("bos_token", jinja::Value(*bos_token_));
  if (eos_token_.has_value()) context.Set("eos_token", jinja::Value(*eos_token_));
  for (auto it = extra.begin(); it != extra.end(); ++it) {
    context.Set(it.key(), jinja::Value::FromJson(it.value()));
  }
  const bool use_tools = !tools.is_null() && tool_use_template_.has_value();
  return (use_tools ? *tool_use_template_ : *default_template_).Render(context);
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::json& messages,
                                                 const nlohmann::json& tools,
                                                 bool add_generation_prompt,
                                                 const nlohmann::json& extra) const {
  return Render(ToOrdered(messages), ToOrdered(tools), add_generation_prompt, ToOrdered(extra));
}

}  // namespace lgpt
