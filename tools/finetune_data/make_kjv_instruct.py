"""Writes kjv_instruct.json: a small Alpaca-style instruction set from Debian's bible-kjv.

Deterministic (no randomness beyond a fixed seed): for a fixed list of chapters it makes
three kinds of examples,
  "Quote Genesis 1:3."                                  -> the verse
  "Which book of the Bible contains this verse?" + verse -> the book's name
  "Complete this verse." + its first half                -> its second half
Run from the repository root (needs the `bible` command of package bible-kjv):
  python3 tools/finetune_data/make_kjv_instruct.py
"""
import json
import os
import random
import re
import subprocess

# (book as `bible` takes it, book name, chapter, verses)
CHAPTERS = [
    ("Gen", "Genesis", 1, range(1, 32)),
    ("Exod", "Exodus", 20, range(1, 18)),
    ("Ps", "Psalms", 23, range(1, 7)),
    ("Ps", "Psalms", 1, range(1, 7)),
    ("Prov", "Proverbs", 3, range(1, 21)),
    ("Isa", "Isaiah", 40, range(1, 32)),
    ("Matt", "Matthew", 5, range(1, 31)),
    ("John", "John", 1, range(1, 30)),
    ("1Cor", "1 Corinthians", 13, range(1, 14)),
    ("Rev", "Revelation", 21, range(1, 28)),
]
PER_KIND = 80


def verse(book, chapter, number):
    out = subprocess.run(["bible", "-f", f"{book}{chapter}:{number}"], capture_output=True,
                         text=True, check=True).stdout
    text = re.sub(r"^\S+\d+:\d+ ", "", out.strip())
    return " ".join(text.split())


def main():
    verses = []
    for book, name, chapter, numbers in CHAPTERS:
        for number in numbers:
            verses.append((name, chapter, number, verse(book, chapter, number)))
    rng = random.Random(1234)
    examples = []
    for name, chapter, number, text in rng.sample(verses, PER_KIND):
        examples.append({"instruction": f"Quote {name} {chapter}:{number}.", "input": "",
                         "output": text})
    for name, chapter, number, text in rng.sample(verses, PER_KIND):
        examples.append({"instruction": "Which book of the Bible contains this verse?",
                         "input": text, "output": name})
    for name, chapter, number, text in rng.sample(verses, PER_KIND):
        words = text.split()
        half = len(words) // 2
        if half < 2:
            continue
        examples.append({"instruction": "Complete this verse.", "input": " ".join(words[:half]),
                         "output": " ".join(words[half:])})
    rng.shuffle(examples)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kjv_instruct.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(examples, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {len(examples)} examples to {out}")


if __name__ == "__main__":
    main()
