// LitGPT's prompt styles (litgpt/prompts.py) as data: how an instruction (and optional
// input and system prompt) becomes the text a model was tuned on, the multi-turn layout of
// chat models, and the token sequences that end a reply.
//
//   ASSIGN_OR_RETURN(PromptStyle style, PromptStyleFromName("alpaca"));
//   std::string text = style.Apply("Quote Genesis 1:3.");
//
// Apply() equals LitGPT's PromptStyle.apply byte for byte. Multi-turn layouts follow
// LitGPT's list form where it has one (llama3, r1-base) and the model's own chat template
// elsewhere; a conversation's first user turn is always Apply() of it.
#ifndef LGPT_CORE_TEXT_PROMPT_STYLE_H_
#define LGPT_CORE_TEXT_PROMPT_STYLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/config/config.h"

namespace lgpt {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// One element of a stop sequence: the tokenizer's EOS, a token looked up by its text, or a
// fixed id (LitGPT's Falcon style stops on id 193, '\n').
struct StopToken {
  enum class Kind { kEos, kToken, kId };
  Kind kind = Kind::kEos;
  std::string text;
  int64_t id = -1;

  static StopToken Eos() { return {}; }
  static StopToken Token(std::string text) { return {Kind::kToken, std::move(text), -1}; }
  static StopToken Id(int64_t id) { return {Kind::kId, "", id}; }
};
using StopSequence = std::vector<StopToken>;

// Looks a token's text up in a tokenizer; nullopt where it has no such token.
using TokenLookup = std::function<std::optional<int64_t>(absl::string_view token)>;

struct PromptStyleSpec;

class PromptStyle {
 public:
  // LitGPT's registry name ("alpaca", "llama3", ...; lgpt adds "default", "falcon3" and
  // "r1-base" for the classes the registry lacks).
  const std::string& name() const;
  // LitGPT's class name ("Alpaca", "Llama3", ...), as prompt_style.yaml's class_path ends.
  const std::string& class_name() const;

  // LitGPT's apply(prompt, sys_prompt=..., input=...). As in LitGPT, an empty `input` or
  // `sys_prompt` counts as none (the style's default system prompt is used).
  std::string Apply(absl::string_view prompt, absl::string_view input = "",
                    absl::string_view sys_prompt = "") const;

  // Whether the style has a multi-turn layout (chat models; not alpaca, default, ...).
  bool SupportsChat() const;

  // A whole conversation, ready for the assistant's next reply: an optional leading system
  // message, then user and assistant messages alternating, starting and ending with a user
  // message. InvalidArgument for other shapes or unknown roles; FailedPrecondition where the
  // style has no multi-turn layout.
  absl::StatusOr<std::string> ApplyChat(const std::vector<ChatMessage>& messages) const;

  // The text that follows an assistant reply (as generated, without its stop token) to add
  // the next user turn, so a chat session prefills only this:
  //   ApplyChat(m + {assistant: r, user: u}) == ApplyChat(m) + r + ContinueChat(u)
  // (for replies the style does not strip, i.e. without surrounding whitespace).
  absl::StatusOr<std::string> ContinueChat(absl::string_view user) const;

  // LitGPT's stop_tokens(tokenizer), plus the end-of-turn token of chat layouts.
  const std::vector<StopSequence>& stop_sequences() const;
  // stop_sequences() as ids; sequences naming a token the tokenizer lacks are left out.
  std::vector<std::vector<int64_t>> StopTokenIds(std::optional<int64_t> eos_id,
                                                 const TokenLookup& token_to_id) const;

  // prompt_style.yaml text as LitGPT's save_prompt_style writes it.
  std::string ToYaml() const;

 private:
  friend absl::StatusOr<PromptStyle> PromptStyleFromName(absl::string_view name);
  explicit PromptStyle(const PromptStyleSpec* spec) : spec_(spec) {}
  const PromptStyleSpec* spec_;  // static storage
};

// NotFound naming the known styles for an unknown name.
absl::StatusOr<PromptStyle> PromptStyleFromName(absl::string_view name);
// By LitGPT class name ("Alpaca") or class path ("litgpt.prompts.Alpaca").
absl::StatusOr<PromptStyle> PromptStyleFromClassPath(absl::string_view class_path);
// LitGPT's model_name_to_prompt_style: a style from the model name's pattern, else Default.
PromptStyle PromptStyleForModelName(absl::string_view model_name);
// prompt_style.yaml of the directory if present (errors name the file), else from
// config.name.
absl::StatusOr<PromptStyle> PromptStyleForCheckpoint(const std::string& checkpoint_dir,
                                                     const Config& config);
// Every registered name, in LitGPT's registry order.
std::vector<std::string> PromptStyleNames();

}  // namespace lgpt

#endif  // LGPT_CORE_TEXT_PROMPT_STYLE_H_
