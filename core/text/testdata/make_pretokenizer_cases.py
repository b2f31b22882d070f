#!/usr/bin/env python3
"""Writes pretokenizer_cases.json: how Python's `regex` module (the engine GPT-2's encoder.py
used; same semantics as Oniguruma in Hugging Face tokenizers for these patterns) splits crafted
and random strings with the GPT-2, Llama 3 and Qwen2 pre-tokenizer patterns.

Run from the repository root:  python3 core/text/testdata/make_pretokenizer_cases.py
"""
import json
import random

import regex

PATTERNS = {
    "gpt2": r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    "llama3": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "qwen2": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
}

CRAFTED = [
    "Hello world",
    "Hello, world! How's it going? I'm fine; they're here, we've left, you'll see, he'd go.",
    "DON'T SHOUT, IT'S RUDE. We'Re Mixed 'Ll 'D",
    "'s 't 're 've 'm 'll 'd 'x '",
    "The year 2024 had 1234567 events and 3.14159 pies.",
    "   leading spaces",
    "trailing spaces   ",
    "a    b\t\tc\n\nd\r\ne \n f",
    "line1\nline2\r\n\r\nline3\n\n\n",
    "  \n  word",
    "tabs\tand\u3000ideographic\u00a0nbsp",
    "naïve café résumé – “quotes” — and ünïcödé",
    "e\u0301 combining acute, Å vs A\u030a",
    "日本語のテキストと中文字符",
    "emoji 😀👍🏽 and flags 🇫🇷!",
    "¡Hola! ¿Qué tal? Ελληνικά русский العربية ١٢٣٤",
    "superscript x² and roman Ⅻ and fractions ½",
    "!!!abc ...def ?ghi",
    "$100 and 50% off #hashtag @user",
    "snake_case and camelCase and kebab-case",
    "def f(x):\n    return x ** 2  # square\n",
    "'ſ 'ſt long s",
    "",
    " ",
    "\n",
    "x",
    "  ",
]

ALPHABET = list("abcXYZ019 '\t\n\r.,!?-_\"") + [
    "s", "t", "re", "ve", "ll", "d", "m", "S", "T", "RE", "LL", "'s", "'T", "'Re",
    "é", "\u0301", "中", "文", "😀", "٣", "²", "Ⅻ", "\u00a0", "\u3000", "\u2028", "\u0085",
    "\x0b", "\x0c", "  ", "\n\n", " \n", "\r\n", "123", "4567", "ſ",
]


def main():
    rng = random.Random(1234)
    texts = list(CRAFTED)
    for _ in range(400):
        texts.append("".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 24))))
    cases = []
    for name, pattern in PATTERNS.items():
        compiled = regex.compile(pattern)
        for text in texts:
            pieces = compiled.findall(text)
            assert "".join(pieces) == text, (name, text)
            cases.append({"pattern": name, "text": text, "pieces": pieces})
    with open("core/text/testdata/pretokenizer_cases.json", "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=0)
        f.write("\n")


if __name__ == "__main__":
    main()
