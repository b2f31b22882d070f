"""Writes long-context fine-tuning data from a one-verse-a-line KJV text (kjv.txt, see the
README's default-model recipe): Alpaca-style examples whose input is a long passage and whose
output is the passage's continuation, so the loss falls on positions far past a small KV cache.

  python3 tools/finetune_data/make_kjv_long.py kjv.txt OUT.json [examples] [input_chars]
      [output_chars]

Only the first 95% of the lines are used (pretrain's --val_fraction=0.05 holds out the rest,
and eval_cache scores that tail). Deterministic: passages start at evenly spaced verses.
"""
import json
import sys


def main():
    text_file, out_file = sys.argv[1], sys.argv[2]
    examples = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    input_chars = int(sys.argv[4]) if len(sys.argv) > 4 else 5000
    output_chars = int(sys.argv[5]) if len(sys.argv) > 5 else 1800
    with open(text_file, encoding="utf-8") as f:
        verses = [line.strip() for line in f if line.strip()]
    verses = verses[: int(len(verses) * 0.95)]
    stride = max(1, (len(verses) - 400) // examples)
    data = []
    for start in range(0, stride * examples, stride):
        passage, i = [], start
        while i < len(verses) and sum(len(v) + 1 for v in passage) < input_chars:
            passage.append(verses[i])
            i += 1
        continuation = []
        while i < len(verses) and sum(len(v) + 1 for v in continuation) < output_chars:
            continuation.append(verses[i])
            i += 1
        data.append({"instruction": "Continue the passage.", "input": " ".join(passage),
                     "output": " ".join(continuation)})
    with open(out_file, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=0)
    print(f"{len(data)} examples -> {out_file}")


if __name__ == "__main__":
    main()
