#include "core/text/prompt_style.h"

#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "yaml-cpp/yaml.h"

namespace lgpt {

using ApplyFn = std::function<std::string(absl::string_view prompt, absl::string_view input,
                                          absl::string_view sys)>;

struct PromptStyleSpec {
  std::string name;
  std::string class_name;
  ApplyFn apply;
  // Closes an assistant reply and adds the next user turn; null without a multi-turn layout.
  std::function<std::string(absl::string_view user)> next_turn;
  bool strip_turns = false;   // LitGPT's Llama3/R1 list form strips message contents
  bool strip_system = false;  // ... and Llama3 the system message too
  std::vector<StopSequence> stops = {{StopToken::Eos()}};
};

namespace {

// Python's `a or b` for strings.
absl::string_view Or(absl::string_view value, absl::string_view fallback) {
  return value.empty() ? fallback : value;
}

constexpr char kAlpacaSystem[] =
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n";
constexpr char kAlpacaInputSystem[] =
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n";
constexpr char kStableLMAlphaSystem[] =
    "# StableLM Tuned (Alpha version)\n- StableLM is a helpful and harmless open-source AI "
    "language model developed by StabilityAI.\n- StableLM is excited to be able to help the "
    "user, but will refuse to do anything that could be considered harmful to the user.\n- "
    "StableLM is more than just an information source, StableLM is also able to write poetry, "
    "short stories, and make jokes.\n- StableLM will refuse to participate in anything that "
    "could harm a human.";
constexpr char kLlama2System[] =
    "You are a helpful, respectful and honest assistant. Always answer as helpfully as "
    "possible, while being safe.  Your answers should not include any harmful, unethical, "
    "racist, sexist, toxic, dangerous, or illegal content. Please ensure that your responses "
    "are socially unbiased and positive in nature.\n\nIf a question does not make any sense, "
    "or is not factually coherent, explain why instead of answering something not correct. If "
    "you don't know the answer to a question, please don't share false information.";
// LitGPT's string really lacks the space in "aspossible".
constexpr char kLlama2FunctionSystem[] =
    "You are a helpful, respectful and honest assistant. Always answer as helpfully "
    "aspossible. Your only response should be JSON formatted functions";
// json.dumps of LitGPT's example function, braces doubled as LitGPT does.
constexpr char kLlama2Functions[] =
    "{{\"function\": \"search_bing\", \"description\": \"Search the web for content on Bing. "
    "This allows users to search online/the internet/the web for content.\", \"arguments\": "
    "[{{\"name\": \"query\", \"type\": \"string\", \"description\": \"The search query "
    "string\"}}]}}";
constexpr char kPhi4ReasoningSystem[] =
    "You are Phi, a language model trained by Microsoft to help users. Your role as an "
    "assistant involves thoroughly exploring questions through a systematic thinking process "
    "before providing the final precise and accurate solutions. This requires engaging in a "
    "comprehensive cycle of analysis, summarizing, exploration, reassessment, reflection, "
    "backtracing, and iteration to develop well-considered thinking process. Please structure "
    "your response into two main sections: Thought and Solution using the specified format: "
    "<think> {Thought section} </think> {Solution section}. In the Thought section, detail "
    "your reasoning process in steps. Each step should include detailed considerations such "
    "as analysing questions, summarizing relevant findings, brainstorming new ideas, verifying "
    "the accuracy of the current steps, refining any errors, and revisiting previous steps. In "
    "the Solution section, based on various attempts, explorations, and reflections from the "
    "Thought section, systematically present the final solution that you deem correct. The "
    "Solution section should be logical, accurate, and concise and detail necessary steps "
    "needed to reach the conclusion. Now, try to solve the following question through the "
    "above guidelines:";
constexpr char kSalamandraSystem[] =
    "I am Salamandra, an AI language model developed at the Barcelona Supercomputing Centre "
    "(BSC) by the Language Technologies Unit. My knowledge base was last updated on August "
    "2023. Today Date: 2024-09-30\nSoy Salamandra, un modelo ling\u00fc\u00edstico de IA "
    "desarrollado en el Barcelona Supercomputing Centre (BSC) por la Language Technologies "
    "Unit. Mi base de conocimientos se actualiz\u00f3 por \u00faltima vez en agosto de 2023.\n"
    "Soc Salamandra, un model de llenguatge d'IA desenvolupat al Barcelona Supercomputing "
    "Centre (BSC) per la Language Technologies Unit.";

ApplyFn ChatMLApply(std::string default_system) {
  return [default_system](absl::string_view prompt, absl::string_view, absl::string_view sys) {
    const absl::string_view system = Or(sys, default_system);
    std::string text;
    // No system turn without a system message (Qwen3).
    if (!system.empty()) text = absl::StrCat("<|im_start|>system\n", system, "<|im_end|>\n");
    absl::StrAppend(&text, "<|im_start|>user\n", prompt, "<|im_end|>\n<|im_start|>assistant\n");
    return text;
  };
}

std::string ChatMLNext(absl::string_view user) {
  return absl::StrCat("<|im_end|>\n<|im_start|>user\n", user,
                      "<|im_end|>\n<|im_start|>assistant\n");
}

std::string Llama3Next(absl::string_view user) {
  return absl::StrCat("<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n", user,
                      "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
}

PromptStyleSpec ChatML(std::string name, std::string class_name, std::string system) {
  PromptStyleSpec spec{std::move(name), std::move(class_name), ChatMLApply(std::move(system)),
                       ChatMLNext};
  spec.stops = {{StopToken::Eos()}, {StopToken::Token("<|im_end|>")}};
  return spec;
}

std::vector<PromptStyleSpec> BuildSpecs() {
  std::vector<PromptStyleSpec> specs;
  specs.push_back({"alpaca", "Alpaca",
                   [](absl::string_view prompt, absl::string_view input, absl::string_view sys) {
                     if (!input.empty()) {
                       return absl::StrCat(Or(sys, kAlpacaInputSystem), "### Instruction:\n",
                                           prompt, "\n\n### Input:\n", input,
                                           "\n\n### Response:\n");
                     }
                     return absl::StrCat(Or(sys, kAlpacaSystem), "### Instruction:\n", prompt,
                                         "\n\n### Response:\n");
                   }});
  specs.push_back(
      {"flan", "FLAN", [](absl::string_view prompt, absl::string_view, absl::string_view sys) {
         return absl::StrCat(Or(sys, kAlpacaSystem), "### Instruction:\n", prompt,
                             "\n\n### Response:\n");
       }});
  specs.push_back({"longform", "Longform",
                   [](absl::string_view prompt, absl::string_view, absl::string_view sys) {
                     return absl::StrCat(Or(sys, kAlpacaInputSystem), "### Instruction:\n", prompt,
                                         "\n\n### Response:\n");
                   }});
  {
    PromptStyleSpec spec{"stablelm-alpha", "StableLMAlpha",
                         [](absl::string_view prompt, absl::string_view, absl::string_view sys) {
                           return absl::StrCat("<|SYSTEM|>", Or(sys, kStableLMAlphaSystem),
                                               "<|USER|>", prompt, "<|ASSISTANT|>");
                         }};
    spec.stops = {{StopToken::Eos()},
                  {StopToken::Token("<|SYSTEM|>")},
                  {StopToken::Token("<|ASSISTANT|>")},
                  {StopToken::Token("<|USER|>")}};
    specs.push_back(std::move(spec));
  }
  auto zephyr_apply = [](absl::string_view prompt, absl::string_view, absl::string_view) {
    return absl::StrCat("<|user|>\n", prompt, "<|endoftext|>\n<|assistant|>\n");
  };
  auto zephyr_next = [](absl::string_view user) {
    return absl::StrCat("<|endoftext|>\n<|user|>\n", user, "<|endoftext|>\n<|assistant|>\n");
  };
  {
    PromptStyleSpec spec{"stablelm-zephyr", "StableLMZephyr", zephyr_apply, zephyr_next};
    spec.stops = {{StopToken::Eos()}, {StopToken::Token("<|endoftext|>")}};
    specs.push_back(std::move(spec));
  }
  {
    PromptStyleSpec spec{"falcon", "Falcon",
                         [](absl::string_view prompt, absl::string_view, absl::string_view) {
                           return absl::StrCat(prompt, "\nAnswer:");
                         }};
    spec.stops = {{StopToken::Eos()},
                  {StopToken::Token("User"), StopToken::Token(":")},
                  {StopToken::Id(193), StopToken::Token("User")}};
    specs.push_back(std::move(spec));
  }
  specs.push_back({"llama2-function-calling", "Llama2FunctionCalling",
                   [](absl::string_view prompt, absl::string_view, absl::string_view sys) {
                     return absl::StrCat("<FUNCTIONS>", kLlama2Functions,
                                         "</FUNCTIONS>\n\n[INST]<<SYS>>\n",
                                         absl::StripAsciiWhitespace(Or(sys, kLlama2FunctionSystem)),
                                         "\n<</SYS>>\n\n", prompt, "[/INST]\n\n");
                   }});
  {
    PromptStyleSpec spec{
        "llama2", "Llama2",
        [](absl::string_view prompt, absl::string_view, absl::string_view sys) {
          return absl::StrCat("[INST] <<SYS>>\n", Or(sys, kLlama2System), "\n<</SYS>>\n\n ", prompt,
                              " [/INST] ");
        },
        // Meta's layout: [/INST] answer </s><s>[INST] next [/INST]
        [](absl::string_view user) { return absl::StrCat(" </s><s>[INST] ", user, " [/INST] "); }};
    specs.push_back(std::move(spec));
  }
  specs.push_back({"freewilly2", "FreeWilly2",
                   [](absl::string_view prompt, absl::string_view, absl::string_view sys) {
                     return absl::StrCat(
                         "### System:\n",
                         Or(sys, "This is a system prompt, please behave and help the user."),
                         "\n\n### User:\n", prompt, "\n\n### Assistant:\n");
                   }});
  specs.push_back(
      {"platypus", "Platypus", [](absl::string_view prompt, absl::string_view, absl::string_view) {
         return absl::StrCat("### Instruction:\n\n", prompt, "\n\n### Response:\n");
       }});
  specs.push_back({"stablecode", "StableCode",
                   [](absl::string_view prompt, absl::string_view, absl::string_view) {
                     return absl::StrCat("###Instruction\n", prompt, "###Response\n");
                   }});
  specs.push_back(
      {"codellama", "CodeLlama",
       [](absl::string_view prompt, absl::string_view, absl::string_view sys) {
         if (!sys.empty()) {
           return absl::StrCat("[INST] <<SYS>>\n", sys, "\n<</SYS>>\n\n", prompt, " [/INST]");
         }
         return absl::StrCat("[INST] ", prompt, " [/INST]");
       },
       // Mistral's layout: [/INST]answer</s>[INST] next [/INST]
       [](absl::string_view user) { return absl::StrCat("</s>[INST] ", user, " [/INST]"); }});
  {
    PromptStyleSpec spec{"phi-1", "Phi1",
                         [](absl::string_view prompt, absl::string_view, absl::string_view) {
                           return absl::StrCat(prompt, "\n\nAnswer:");
                         }};
    spec.stops = {{StopToken::Eos()},
                  {StopToken::Token("Answer"), StopToken::Token(":")},
                  {StopToken::Id(198), StopToken::Token("Answer"), StopToken::Token(":")}};
    specs.push_back(std::move(spec));
  }
  specs.push_back(
      {"phi-2", "Phi2", [](absl::string_view prompt, absl::string_view, absl::string_view) {
         return absl::StrCat("Instruct: ", prompt, "\nOutput:");
       }});
  {
    PromptStyleSpec spec{
        "phi-3", "Phi3",
        [](absl::string_view prompt, absl::string_view, absl::string_view sys) {
          return absl::StrCat("<|system|>\n", Or(sys, "You are a helpful assistant."),
                              "<|end|>\n<|user|>\n", prompt, "<|end|>\n<|assistant|>\n");
        },
        [](absl::string_view user) {
          return absl::StrCat("<|end|>\n<|user|>\n", user, "<|end|>\n<|assistant|>\n");
        }};
    spec.stops = {{StopToken::Eos()}, {StopToken::Token("<|end|>")}};
    specs.push_back(std::move(spec));
  }
  {
    PromptStyleSpec spec{"phi-4", "Phi4",
                         [](absl::string_view prompt, absl::string_view, absl::string_view sys) {
                           std::string text;
                           if (!sys.empty())
                             text = absl::StrCat("<|im_start|>system<|im_sep|>", sys, "<|im_end|>");
                           absl::StrAppend(&text, "<|im_start|>user<|im_sep|>", prompt,
                                           "<|im_end|><|im_start|>assistant<|im_sep|>");
                           return text;
                         },
                         [](absl::string_view user) {
                           return absl::StrCat("<|im_end|><|im_start|>user<|im_sep|>", user,
                                               "<|im_end|><|im_start|>assistant<|im_sep|>");
                         }};
    spec.stops = {{StopToken::Eos()}, {StopToken::Token("<|im_end|>")}};
    specs.push_back(std::move(spec));
  }
  // LitGPT's string really opens with "<|im_start>".
  specs.push_back({"phi-4-reasoning", "Phi4Reasoning",
                   [](absl::string_view prompt, absl::string_view, absl::string_view sys) {
                     return absl::StrCat("<|im_start>system<|im_sep|>",
                                         Or(sys, kPhi4ReasoningSystem),
                                         "<|im_end|><|im_start|>user<|im_sep|>", prompt,
                                         "<|im_end|><|im_start|>assistant<|im_sep|>");
                   }});
  auto phi4_mini_next = [](absl::string_view user) {
    return absl::StrCat("<|end|><|user|>", user, "<|end|><|assistant|>");
  };
  {
    PromptStyleSpec spec{"phi-4-mini", "Phi4Mini",
                         [](absl::string_view prompt, absl::string_view, absl::string_view sys) {
                           std::string text;
                           if (!sys.empty()) text = absl::StrCat("<|system|>", sys, "<|end|>");
                           absl::StrAppend(&text, "<|user|>", prompt, "<|end|><|assistant|>");
                           return text;
                         },
                         phi4_mini_next};
    spec.stops = {{StopToken::Eos()}, {StopToken::Token("<|end|>")}};
    specs.push_back(std::move(spec));
  }
  {
    PromptStyleSpec spec{
        "phi-4-mini-reasoning", "Phi4MiniReasoning",
        [](absl::string_view prompt, absl::string_view, absl::string_view sys) {
          return absl::StrCat(
              "<|system|>", Or(sys, "Your name is Phi, an AI math expert developed by Microsoft."),
              "<|end|><|user|>", prompt, "<|end|><|assistant|>");
        },
        phi4_mini_next};
    spec.stops = {{StopToken::Eos()}, {StopToken::Token("<|end|>")}};
    specs.push_back(std::move(spec));
  }
  specs.push_back(
      {"tinyllama", "TinyLlama",
       [](absl::string_view prompt, absl::string_view, absl::string_view sys) {
         return absl::StrCat(
             "<|system|>\n",
             Or(sys,
                "You are a friendly chatbot who always gives helpful, detailed, and polite "
                "answers."),
             "</s>\n<|user|>\n", prompt, "</s>\n<|assistant|>\n");
       },
       [](absl::string_view user) {
         return absl::StrCat("</s>\n<|user|>\n", user, "</s>\n<|assistant|>\n");
       }});
  {
    PromptStyleSpec spec{"gemma", "Gemma",
                         [](absl::string_view prompt, absl::string_view, absl::string_view) {
                           return absl::StrCat("<start_of_turn>user\n", prompt,
                                               "<end_of_turn>\n<start_of_turn>model\n");
                         },
                         [](absl::string_view user) {
                           return absl::StrCat("<end_of_turn>\n<start_of_turn>user\n", user,
                                               "<end_of_turn>\n<start_of_turn>model\n");
                         }};
    spec.stops = {{StopToken::Eos()}, {StopToken::Token("<end_of_turn>")}};
    specs.push_back(std::move(spec));
  }
  {
    PromptStyleSpec spec{"llama3", "Llama3",
                         [](absl::string_view prompt, absl::string_view, absl::string_view sys) {
                           return absl::StrCat(
                               "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n",
                               Or(sys, "You are a helpful assistant."),
                               "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n", prompt,
                               "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
                         },
                         Llama3Next};
    spec.strip_turns = spec.strip_system = true;
    spec.stops = {{StopToken::Eos()}, {StopToken::Token("<|eot_id|>")}};
    specs.push_back(std::move(spec));
  }
  specs.push_back(
      {"olmo", "OLMo", [](absl::string_view prompt, absl::string_view, absl::string_view) {
         return absl::StrCat("<|endoftext|><|user|>\n", prompt, "\n<|assistant|>\n");
       }});
  specs.push_back(ChatML("qwen2.5", "Qwen2_5",
                         "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."));
  specs.push_back(ChatML("qwen2.5-math", "Qwen2_5_Math",
                         "Please reason step by step, and put your final answer within "
                         "\\boxed{}."));
  specs.push_back(ChatML("qwq", "QwQ",
                         "You are a helpful and harmless assistant. You are Qwen developed by "
                         "Alibaba. You should think step-by-step."));
  specs.push_back(ChatML("qwen3", "Qwen3", ""));
  specs.push_back(ChatML("smollm2", "SmolLM2",
                         "You are a helpful AI assistant named SmolLM, trained by Hugging Face"));
  specs.push_back(ChatML("salamandra", "Salamandra", kSalamandraSystem));
  // Classes LitGPT maps model names to but does not register by name.
  specs.push_back(
      {"default", "Default", [](absl::string_view prompt, absl::string_view, absl::string_view) {
         return std::string(prompt);
       }});
  {
    PromptStyleSpec spec{"falcon3", "Falcon3", zephyr_apply, zephyr_next};
    spec.stops = {{StopToken::Eos()}, {StopToken::Token("<|endoftext|>")}};
    specs.push_back(std::move(spec));
  }
  {
    PromptStyleSpec spec{
        "r1-base", "R1Base",
        [](absl::string_view prompt, absl::string_view, absl::string_view sys) {
          return absl::StrCat(sys, "<\uff5cUser\uff5c>", prompt, "<\uff5cAssistant\uff5c>");
        },
        [](absl::string_view user) {
          return absl::StrCat("<\uff5cUser\uff5c>", user, "<\uff5cAssistant\uff5c>");
        }};
    spec.strip_turns = true;
    spec.stops = {{StopToken::Eos()},
                  {StopToken::Token("<\uff5cend\u2581of\u2581sentence\uff5c>")}};
    specs.push_back(std::move(spec));
  }
  return specs;
}

const std::vector<PromptStyleSpec>& Specs() {
  static const auto* specs = new std::vector<PromptStyleSpec>(BuildSpecs());
  return *specs;
}

std::string Strip(absl::string_view text, bool strip) {
  return std::string(strip ? absl::StripAsciiWhitespace(text) : text);
}

}  // namespace

const std::string& PromptStyle::name() const { return spec_->name; }
const std::string& PromptStyle::class_name() const { return spec_->class_name; }

std::string PromptStyle::Apply(absl::string_view prompt, absl::string_view input,
                               absl::string_view sys_prompt) const {
  return spec_->apply(prompt, input, sys_prompt);
}

bool PromptStyle::SupportsChat() const { return spec_->next_turn != nullptr; }

absl::StatusOr<std::string> PromptStyle::ApplyChat(const std::vector<ChatMessage>& messages) const {
  if (!SupportsChat()) {
    return absl::FailedPreconditionError(
        absl::StrCat("prompt style '", name(), "' has no multi-turn layout"));
  }
  size_t first = 0;
  std::string system;
  if (!messages.empty() && messages[0].role == "system") {
    system = Strip(messages[0].content, spec_->strip_system);
    first = 1;
  }
  if (messages.size() == first) {
    return absl::InvalidArgumentError("a conversation needs at least one user message");
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown role '", role, "'; supported roles are 'assistant', 'user' and 'system'"));
    }
    const char* expected = (i - first) % 2 == 0 ? "user" : "assistant";
    if (role != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          "message ", i, " has role '", role, "', expected '", expected,
          "' (an optional system message first, then user and assistant alternating)"));
    }
  }
  if (messages.back().role != "user") {
    return absl::InvalidArgumentError("a conversation must end with a user message");
  }
  std::string text = Apply(Strip(messages[first].content, spec_->strip_turns), "", system);
  for (size_t i = first + 1; i + 1 < messages.size(); i += 2) {
    absl::StrAppend(&text, Strip(messages[i].content, spec_->strip_turns),
                    spec_->next_turn(Strip(messages[i + 1].content, spec_->strip_turns)));
  }
  return text;
}

absl::StatusOr<std::string> PromptStyle::ContinueChat(absl::string_view user) const {
  if (!SupportsChat()) {
    return absl::FailedPreconditionError(
        absl::StrCat("prompt style '", name(), "' has no multi-turn layout"));
  }
  return spec_->next_turn(Strip(user, spec_->strip_turns));
}

const std::vector<StopSequence>& PromptStyle::stop_sequences() const { return spec_->stops; }

std::vector<std::vector<int64_t>> PromptStyle::StopTokenIds(std::optional<int64_t> eos_id,
                                                            const TokenLookup& token_to_id) const {
  std::vector<std::vector<int64_t>> out;
  for (const StopSequence& sequence : spec_->stops) {
    std::vector<int64_t> ids;
    for (const StopToken& token : sequence) {
      std::optional<int64_t> id;
      switch (token.kind) {
        case StopToken::Kind::kEos:
          id = eos_id;
          break;
        case StopToken::Kind::kToken:
          if (token_to_id) id = token_to_id(token.text);
          break;
        case StopToken::Kind::kId:
          id = token.id;
          break;
      }
      if (!id) break;
      ids.push_back(*id);
    }
    if (ids.size() == sequence.size()) out.push_back(std::move(ids));
  }
  return out;
}

std::string PromptStyle::ToYaml() const {
  return absl::StrCat("class_path: litgpt.prompts.", class_name(), "\n");
}

absl::StatusOr<PromptStyle> PromptStyleFromName(absl::string_view name) {
  for (const PromptStyleSpec& spec : Specs()) {
    if (spec.name == name) return PromptStyle(&spec);
  }
  return absl::NotFoundError(absl::StrCat("unknown prompt style '", name,
                                          "'; known: ", absl::StrJoin(PromptStyleNames(), ", ")));
}

absl::StatusOr<PromptStyle> PromptStyleFromClassPath(absl::string_view class_path) {
  absl::string_view class_name = class_path;
  const size_t dot = class_path.rfind('.');
  if (dot != absl::string_view::npos) {
    if (class_path.substr(0, dot) != "litgpt.prompts") {
      return absl::UnimplementedError(absl::StrCat("prompt style class '", class_path,
                                                   "' is not one of litgpt.prompts' classes"));
    }
    class_name = class_path.substr(dot + 1);
  }
  for (const PromptStyleSpec& spec : Specs()) {
    if (spec.class_name == class_name) return PromptStyleFromName(spec.name);
  }
  return absl::NotFoundError(absl::StrCat("unknown prompt style class '", class_path, "'"));
}

PromptStyle PromptStyleForModelName(absl::string_view model_name) {
  // LitGPT's model_name_to_prompt_style, in its order (re.search: a match anywhere).
  static const auto* rules = new std::vector<std::pair<std::regex, std::string>>([] {
    const std::vector<std::pair<const char*, const char*>> table = {
        {"stablelm-tuned-alpha", "stablelm-alpha"},
        {"stablelm-zephyr-3b", "stablelm-zephyr"},
        {"stablecode-instruct", "stablecode"},
        {"Falcon3.*-Instruct", "falcon3"},
        {"falcon.*-instruct", "falcon"},
        {"Llama-2-7b-chat-hf-function-calling-v2", "llama2-function-calling"},
        {"Llama-2.*-chat", "llama2"},
        {"Llama-3.*-Instruct", "llama3"},
        {"OLMo-2.*-(Instruct|SFT|DPO)", "llama3"},
        {"R1", "r1-base"},
        {"FreeWilly2", "freewilly2"},
        {"Platypus", "platypus"},
        {"CodeLlama|Mi[sx]tral.*Instruct", "codellama"},
        {"phi-1", "phi-1"},
        {"phi-2", "phi-2"},
        {"Phi-3", "phi-3"},
        {"Phi-4-reasoning", "phi-4-reasoning"},
        {"Phi-4-mini-reasoning", "phi-4-mini-reasoning"},
        {"Phi-4-mini", "phi-4-mini"},
        {"phi-4", "phi-4"},
        {"tiny-llama.*chat", "tinyllama"},
        {"(Code)?Gemma.*-it", "gemma"},
        {"OLMo.*-hf", "olmo"},
        {"Qwen2\\.5-Math-.*", "qwen2.5-math"},
        {"Qwen2\\.5-.*", "qwen2.5"},
        {"QwQ-.*", "qwq"},
        {"Qwen3-.*", "qwen3"},
        {"SmolLM2.*-Instruct", "smollm2"},
        {"salamandra-.*-instruct", "salamandra"},
    };
    std::vector<std::pair<std::regex, std::string>> compiled;
    for (const auto& [pattern, style] : table) compiled.emplace_back(std::regex(pattern), style);
    return compiled;
  }());
  const std::string name(model_name);
  for (const auto& [pattern, style] : *rules) {
    if (std::regex_search(name, pattern)) return *PromptStyleFromName(style);
  }
  return *PromptStyleFromName("default");
}

absl::StatusOr<PromptStyle> PromptStyleForCheckpoint(const std::string& checkpoint_dir,
                                                     const Config& config) {
  const std::string path = checkpoint_dir + "/prompt_style.yaml";
  std::ifstream in(path, std::ios::binary);
  if (!in) return PromptStyleForModelName(config.name);
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string class_path;
  try {
    const YAML::Node root = YAML::Load(buffer.str());
    if (!root.IsMap() || !root["class_path"] || !root["class_path"].IsScalar()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": expected a 'class_path' key"));
    }
    class_path = root["class_path"].as<std::string>();
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
  absl::StatusOr<PromptStyle> style = PromptStyleFromClassPath(class_path);
  if (!style.ok()) {
    return absl::Status(style.status().code(), absl::StrCat(path, ": ", style.status().message()));
  }
  return style;
}

std::vector<std::string> PromptStyleNames() {
  std::vector<std::string> names;
  for (const PromptStyleSpec& spec : Specs()) names.push_back(spec.name);
  return names;
}

}  // namespace lgpt
