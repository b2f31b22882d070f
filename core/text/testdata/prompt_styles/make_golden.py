"""Writes golden.json: LitGPT's prompt strings, for //core:prompt_style_test.

Runs LitGPT's own prompts.py (its Config import stubbed out, as prompts.py only uses it for
type hints) with Debian's /usr/bin/python3:
  /usr/bin/python3 core/text/testdata/prompt_styles/make_golden.py /tmp/litgpt_src/litgpt/prompts.py
"""
import json
import os
import sys
import types

source = open(sys.argv[1], encoding="utf-8").read()
litgpt = types.ModuleType("litgpt")
config_module = types.ModuleType("litgpt.config")
config_module.Config = object
sys.modules["litgpt"] = litgpt
sys.modules["litgpt.config"] = config_module
prompts = types.ModuleType("litgpt.prompts")
exec(compile(source, "prompts.py", "exec"), prompts.__dict__)

PROMPTS = ["What is 2+2?", "  Tell me\nabout {braces} and \"quotes\".  "]
cases = []
for name, cls in prompts.prompt_styles.items():
    style = cls()
    for prompt in PROMPTS:
        cases.append({"style": name, "prompt": prompt, "text": style.apply(prompt)})
        cases.append({"style": name, "prompt": prompt, "sys_prompt": "Be brief.",
                      "text": style.apply(prompt, sys_prompt="Be brief.")})
        cases.append({"style": name, "prompt": prompt, "input": "Some context.",
                      "text": style.apply(prompt, input="Some context.")})
        # An empty input counts as none (Alpaca tests `if kwargs.get("input")`).
        cases.append({"style": name, "prompt": prompt, "input": "",
                      "text": style.apply(prompt, input="")})

conversations = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
     {"role": "user", "content": " And then? "}],
    [{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
     {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
     {"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}],
]
chats = []
for name in ["llama3", "r1-base"]:
    style = prompts.Llama3() if name == "llama3" else prompts.R1Base()
    for turns in conversations:
        chats.append({"style": name, "turns": turns, "text": style.apply(turns)})

model_names = [
    "stablelm-tuned-alpha-7b", "stablelm-zephyr-3b", "stablecode-instruct-alpha-3b",
    "Falcon3-7B-Instruct", "falcon-7b-instruct", "falcon-7b", "Llama-2-7b-chat-hf-function-calling-v2",
    "Llama-2-7b-chat-hf", "Llama-2-7b-hf", "Llama-3.2-1B-Instruct", "Llama-3.2-1B",
    "OLMo-2-1124-7B-Instruct", "DeepSeek-R1-Distill-Llama-8B", "FreeWilly2", "Platypus2-7B",
    "CodeLlama-7b-Instruct-hf", "Mistral-7B-Instruct-v0.2", "Mixtral-8x7B-Instruct-v0.1",
    "Mistral-7B-v0.1", "phi-1_5", "phi-2", "Phi-3-mini-4k-instruct", "Phi-4-reasoning",
    "Phi-4-mini-reasoning", "Phi-4-mini-instruct", "phi-4", "tiny-llama-1.1b-chat",
    "tiny-llama-1.1b", "gemma-2b-it", "Gemma-2-2b-it", "CodeGemma-7b-it", "gemma-2b",
    "OLMo-1B-hf", "Qwen2.5-Math-1.5B-Instruct", "Qwen2.5-7B-Instruct", "QwQ-32B",
    "Qwen3-0.6B", "SmolLM2-135M-Instruct", "salamandra-2b-instruct", "pythia-14m",
    "lgpt-kjv-3m",
]
names = [{"model_name": n, "class": type(prompts.model_name_to_prompt_style(n)).__name__}
         for n in model_names]
classes = {name: cls.__name__ for name, cls in prompts.prompt_styles.items()}

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden.json")
with open(out, "w", encoding="utf-8") as f:
    json.dump({"apply": cases, "chat": chats, "model_names": names, "classes": classes}, f,
              indent=1, ensure_ascii=False)
    f.write("\n")
print(f"wrote {len(cases)} apply, {len(chats)} chat, {len(names)} name cases to {out}")
