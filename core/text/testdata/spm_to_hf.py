#!/usr/bin/env python3
"""Converts a SentencePiece BPE model to a Hugging Face tokenizer.json the way
transformers' convert_slow_tokenizer does (LlamaConverter / GemmaConverter): the same pieces as
vocabulary, merges generated from the pieces and their scores (SentencePieceExtractor), and
the normalizer / pre-tokenizer / decoder layout of the chosen style.

  python3 spm_to_hf.py --style=llama-legacy|llama-metaspace|gemma MODEL OUT_DIR

Needs no protobuf package: the few ModelProto fields used are read from the wire format.
User-defined pieces become non-special added tokens (Gemma's real converter marks its turn
markers special; non-special keeps decoding comparable with SentencePiece's own).
"""
import argparse
import json
import os
import struct

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def varint(data, pos):
    value, shift = 0, 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def fields(data):
    pos = 0
    while pos < len(data):
        key, pos = varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = varint(data, pos)
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 2:
            length, pos = varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield field, wire, value


def read_model(path):
    with open(path, "rb") as f:
        data = f.read()
    pieces, trainer, normalizer = [], {}, {}
    for field, _, value in fields(data):
        if field == 1:
            piece = {"type": NORMAL, "score": 0.0}
            for f, _, v in fields(value):
                if f == 1:
                    piece["piece"] = v.decode("utf-8")
                elif f == 2:
                    piece["score"] = struct.unpack("<f", v)[0]
                elif f == 3:
                    piece["type"] = v
            pieces.append(piece)
        elif field == 2:
            trainer = {f: v for f, _, v in fields(value)}
        elif field == 3:
            normalizer = {f: v for f, _, v in fields(value)}
    return pieces, trainer, normalizer


def generate_merges(vocab, vocab_scores):
    merges = []
    for merge, piece_score in vocab_scores.items():
        local = []
        for index in range(1, len(merge)):
            left, right = merge[:index], merge[index:]
            if left in vocab and right in vocab:
                local.append((left, right, piece_score))
        local = sorted(local, key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges = sorted(merges, key=lambda val: (val[2], len(val[0]), len(val[1])), reverse=True)
    return [[left, right] for left, right, _ in merges]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--style", choices=["llama-legacy", "llama-metaspace", "gemma"])
    parser.add_argument("model")
    parser.add_argument("out_dir")
    args = parser.parse_args()

    pieces, trainer, normalizer = read_model(args.model)
    assert trainer.get(3, 1) == 2, "only BPE models are converted"
    assert trainer.get(35, 0) == 1, "expected byte_fallback"
    vocab = {p["piece"]: i for i, p in enumerate(pieces)}
    scores = {p["piece"]: p["score"] for p in pieces}
    unk = next(p["piece"] for p in pieces if p["type"] == UNKNOWN)
    bos, eos = pieces[1]["piece"], pieces[2]["piece"]

    added = []
    for i, p in enumerate(pieces):
        if p["type"] in (UNKNOWN, CONTROL, USER_DEFINED):
            added.append({"id": i, "content": p["piece"], "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False,
                          "special": p["type"] != USER_DEFINED})

    replace_space = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    decoders = [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}]
    if args.style == "llama-legacy":
        normalizer_json = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"}, replace_space]}
        pre_tokenizer = None
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    elif args.style == "llama-metaspace":
        normalizer_json = None
        pre_tokenizer = {"type": "Metaspace", "replacement": "\u2581",
                         "prepend_scheme": "first", "split": False}
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    else:
        normalizer_json = replace_space
        pre_tokenizer = None
    bos_id = vocab[bos]
    post_processor = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": bos, "type_id": 1}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": normalizer_json,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {"type": "BPE", "dropout": None, "unk_token": unk,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": generate_merges(vocab, scores)},
    }
    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": bos,
              "eos_token": eos, "unk_token": unk,
              "tokenizer_class": "GemmaTokenizer" if args.style == "gemma" else "LlamaTokenizer"}
    if args.style != "gemma":
        config["legacy"] = args.style == "llama-legacy"
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(args.out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
