#!/usr/bin/env python3
"""Renders every template in templates/ with every conversation of conversations.json as
Hugging Face transformers does (jinja2's ImmutableSandboxedEnvironment with trim_blocks and
lstrip_blocks, loop controls, a `generation` block, tojson as json.dumps(ensure_ascii=False),
raise_exception and strftime_now), and writes goldens.json for chat_template_test, plus the
tokenizer_config.json checkpoints under checkpoints/ that the loading tests read.

Before rendering, an assistant tool call's string `arguments` that hold a JSON object become
that object, as lgpt's ChatTemplate::Render does (templates print arguments with tojson).
strftime_now reads a fixed clock: 2024-09-26 12:00 local time.

Run from anywhere: python3 core/text/testdata/chat_templates/make_goldens.py
"""
import copy
import datetime
import json
import os

import jinja2
import jinja2.ext
import jinja2.sandbox
from jinja2 import nodes

HERE = os.path.dirname(os.path.abspath(__file__))
FIXED_NOW = datetime.datetime(2024, 9, 26, 12, 0, 0)


class GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` renders its body in place."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


class Raised(Exception):
    pass


def raise_exception(message):
    raise Raised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    return FIXED_NOW.strftime(fmt)


def environment():
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def with_object_arguments(messages):
    messages = copy.deepcopy(messages)
    for message in messages:
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            if isinstance(function.get("arguments"), str):
                try:
                    parsed = json.loads(function["arguments"])
                except ValueError:
                    continue
                if isinstance(parsed, dict):
                    function["arguments"] = parsed
    return messages


def render(env, source, tokens, messages, tools, add_generation_prompt, extra):
    try:
        text = env.from_string(source).render(
            messages=with_object_arguments(messages), tools=tools, documents=None,
            add_generation_prompt=add_generation_prompt, **tokens, **extra)
        return {"output": text}
    except Raised as e:
        return {"error": str(e), "raised": True}
    except Exception as e:  # noqa: BLE001 - any other failure: the C++ side must fail too
        return {"error": f"{type(e).__name__}: {e}", "raised": False}


def main():
    with open(os.path.join(HERE, "conversations.json"), encoding="utf-8") as f:
        data = json.load(f)
    with open(os.path.join(HERE, "templates.json"), encoding="utf-8") as f:
        templates = json.load(f)
    env = environment()
    cases = []
    for name, tokens in templates.items():
        with open(os.path.join(HERE, "templates", name + ".jinja"), encoding="utf-8") as f:
            source = f.read()
        for conversation in data["conversations"]:
            if "only" in conversation and name not in conversation["only"]:
                continue
            tools = data["tools"] if conversation.get("tools") else None
            for add_generation_prompt in (False, True):
                case = {"template": name, "conversation": conversation["name"],
                        "add_generation_prompt": add_generation_prompt}
                case.update(render(env, source, tokens, conversation["messages"], tools,
                                   add_generation_prompt, conversation.get("extra", {})))
                cases.append(case)
    with open(os.path.join(HERE, "goldens.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")

    def read(name):
        with open(os.path.join(HERE, "templates", name + ".jinja"), encoding="utf-8") as f:
            return f.read()

    checkpoints = {
        # A string template; bos_token as an AddedToken object, as Llama 3.1's file has it.
        "llama3_1": {"bos_token": {"__type": "AddedToken", "content": "<|begin_of_text|>",
                                   "lstrip": False, "normalized": False, "rstrip": False,
                                   "single_word": False},
                     "eos_token": "<|eot_id|>", "chat_template": read("llama3_1")},
        # Named templates: "default", and "tool_use" where tools are given (Hermes 2 Pro).
        "hermes": {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>",
                   "chat_template": [{"name": "default", "template": read("chatml_default")},
                                     {"name": "tool_use", "template": read("hermes_tool_use")}]},
        # No template at all.
        "no_template": {"bos_token": "<s>", "eos_token": "</s>"},
    }
    for directory, config in checkpoints.items():
        os.makedirs(os.path.join(HERE, "checkpoints", directory), exist_ok=True)
        with open(os.path.join(HERE, "checkpoints", directory, "tokenizer_config.json"), "w",
                  encoding="utf-8") as f:
            json.dump(config, f, ensure_ascii=False, indent=2)
            f.write("\n")
    # Newer checkpoints keep the template in chat_template.jinja beside tokenizer_config.json.
    os.makedirs(os.path.join(HERE, "checkpoints", "jinja_file"), exist_ok=True)
    with open(os.path.join(HERE, "checkpoints", "jinja_file", "tokenizer_config.json"), "w",
              encoding="utf-8") as f:
        json.dump({"eos_token": "<|im_end|>"}, f, indent=2)
        f.write("\n")
    with open(os.path.join(HERE, "checkpoints", "jinja_file", "chat_template.jinja"), "w",
              encoding="utf-8") as f:
        f.write(read("qwen2_5"))


if __name__ == "__main__":
    main()
