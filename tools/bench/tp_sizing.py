#!/usr/bin/env python3
"""Sizing model for tensor-parallel Llama inference: decode tokens/s, prefill time and memory
per rank, from the terms lgpt's tensor parallelism has (README, "Tensor parallelism").

Per layer and token, TP=N does two all-reduces of the hidden state (after attn.proj and after
mlp.proj): S = n_embd x bytes per activation. A ring all-reduce over N ranks takes 2(N-1) steps,
each paying the link latency a, and moves 2(N-1)/N x S bytes per rank at link bandwidth b:
    t_ar(S) = 2(N-1) a + 2(N-1)/N x S / b.
Decode is bound by reading each rank's weights once a token (its 1/N of the projections plus
the replicated head; a token reads one embedding row) at memory bandwidth M, plus 2 L all-reduces:
    t_token = (W/N + W_rep) / M + 2 L t_ar(n_embd x bytes).
Prefill of P tokens is bound by compute F per rank, plus 2 L all-reduces of P x n_embd:
    t_prefill = 2 params P / (N F) + 2 L t_ar(P x n_embd x bytes).
Memory per rank: W/N + W_rep + the KV cache of its query groups (replicated when
n_query_groups < N) for `context` tokens.

Serving (--serving): one continuous-batching decode step of B streams reads the weights once,
each stream's KV entries of the rank's groups (B x context/2 tokens on average, as streams
are at every point of their replies), all-reduces B x n_embd twice a layer, and waits for
rank 0's step plan (one small broadcast a step, log2(N) link latencies):
    t_step = (W/N + W_rep + B x kv_rank x context/2) / M + 2 L t_ar(B x n_embd x bytes)
             + ceil(log2 N) a.

    tools/bench/tp_sizing.py [--device=h100|cpu] [--context=4096] [--prompt=2048] [--serving]
"""
import math
import argparse

MODELS = {  # Llama 2 7B and 70B (LitGPT configs)
    "7B": dict(n_layer=32, n_embd=4096, n_head=32, n_query_groups=32, head_size=128,
               intermediate=11008, vocab=32000),
    "70B": dict(n_layer=80, n_embd=8192, n_head=64, n_query_groups=8, head_size=128,
                intermediate=28672, vocab=32000),
}
# Per rank: memory bandwidth (bytes/s), achieved compute (flop/s), weight/activation bytes.
DEVICES = {
    "h100": dict(mem=3.35e12, flops=400e12, bytes=2, label="H100-class GPU, bf16"),
    "cpu": dict(mem=200e9, flops=3e12, bytes=2, label="CPU socket (12-channel DDR5), bf16 weights"),
}
# Links: latency per ring step (s), bandwidth per direction (bytes/s). The latencies are
# typical published figures (TCP on Ethernet; NCCL on NVLink), not measurements of lgpt.
LINKS = {
    "10GbE": (30e-6, 1.25e9),
    "25GbE": (20e-6, 3.1e9),
    "100GbE": (10e-6, 12.5e9),
    "NVLink": (3e-6, 450e9),
}


def params(m):
    d, h, L = m["n_embd"], m["head_size"], m["n_layer"]
    attn = d * (m["n_head"] + 2 * m["n_query_groups"]) * h + m["n_head"] * h * d
    mlp = 3 * d * m["intermediate"]
    # sharded; replicated embedding and head (a token reads all of the head, one embedding row)
    return L * (attn + mlp), m["vocab"] * d


def all_reduce(n, size, link):
    latency, bandwidth = LINKS[link]
    return 2 * (n - 1) * latency + 2 * (n - 1) / n * size / bandwidth if n > 1 else 0.0


def serving(args, dev):
    """70B decode steps of B streams at TP 2/4/8: the all-reduces' share of a step."""
    b = dev["bytes"]
    m = MODELS["70B"]
    sharded, replicated = params(m)
    print(f"serving 70B, per rank: {dev['label']}; streams at {args.context // 2} tokens of "
          f"context on average")
    print("| TP | link | streams | step ms | all-reduce ms | share | tok/s |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for n in (2, 4, 8):
        groups = max(1, m["n_query_groups"] // n)
        kv_token = 2 * m["n_layer"] * groups * m["head_size"] * b  # one token's entries, a rank
        for link in ("25GbE", "100GbE", "NVLink"):
            for streams in (1, 16, 64):
                t_mem = ((sharded / n + replicated) * b
                         + streams * kv_token * args.context / 2) / dev["mem"]
                t_ar = 2 * m["n_layer"] * all_reduce(n, streams * m["n_embd"] * b, link)
                t_plan = math.ceil(math.log2(n)) * LINKS[link][0]
                step = t_mem + t_ar + t_plan
                print(f"| {n} | {link} | {streams} | {step * 1e3:.2f} | {t_ar * 1e3:.2f} | "
                      f"{t_ar / step:.0%} | {streams / step:,.0f} |")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="h100", choices=sorted(DEVICES))
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--serving", action="store_true",
                        help="the serving table: 70B decode steps of 1, 16 and 64 streams")
    args = parser.parse_args()
    dev = DEVICES[args.device]
    if args.serving:
        serving(args, dev)
        return
    b = dev["bytes"]
    print(f"per rank: {dev['label']}, {dev['mem'] / 1e9:.0f} GB/s, {dev['flops'] / 1e12:.0f} "
          f"TFLOP/s; KV cache for {args.context} tokens; prefill of {args.prompt} tokens")
    print("| model | TP | link | decode tok/s | all-reduce share | prefill s | GB per rank |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for name, m in MODELS.items():
        sharded, replicated = params(m)
        for n in (1, 2, 4, 8):
            if m["n_head"] % n or m["intermediate"] % n:
                continue
            groups = max(1, m["n_query_groups"] // n)
            kv = 2 * m["n_layer"] * groups * m["head_size"] * b * args.context
            memory = (sharded / n + 2 * replicated) * b + kv
            t_mem = (sharded / n + replicated) * b / dev["mem"]
            for link in (LINKS if n > 1 else ["-"]):
                t_ar = 2 * m["n_layer"] * all_reduce(n, m["n_embd"] * b, link) if n > 1 else 0
                t_token = t_mem + t_ar
                flops = 2 * (sharded + replicated) * args.prompt
                prefill = flops / (n * dev["flops"])
                if n > 1:
                    prefill += 2 * m["n_layer"] * all_reduce(n, args.prompt * m["n_embd"] * b, link)
                print(f"| {name} | {n} | {link} | {1 / t_token:,.0f} | {t_ar / t_token:.0%} | "
                      f"{prefill:.2f} | {memory / 1e9:.1f} |")


if __name__ == "__main__":
    main()
