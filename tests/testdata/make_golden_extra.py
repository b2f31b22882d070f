#!/usr/bin/python3
"""Generate extra golden cases (tests/testdata/golden_extra/<case>/) with LitGPT's own model code.

Test tooling: it imports LitGPT (through /work/shared/tools/litgpt_shim.py, which makes LitGPT's
model.py run under Debian's torch 1.13); nothing of LitGPT is copied here. Run it with Debian's
interpreter, which has torch, numpy and yaml:

    LITGPT_SRC=/tmp/litgpt_src /usr/bin/python3 tests/testdata/make_golden_extra.py [case ...]

Each case is a small, randomly initialised model derived from a real LitGPT preset with
`Config.from_name(preset, **overrides)`, so the family's structural features are kept. Files
per case (same meaning as in golden/README.md): model_config.yaml, model.safetensors,
tokens.npy, logits.npy, prompt.npy, greedy.npy, meta.json.

Weights: nn.Linear weights ~ N(0, 1/fan_in) (lm_head N(0, 4/fan_in)), biases ~ N(0, 0.05^2), embeddings ~ N(0, 0.5^2),
norm weights ~ 1 + N(0, 0.1^2) (N(0, 0.1^2) for Gemma's unit-offset RMSNorm), LayerNorm biases
~ N(0, 0.05^2). A seed is rejected (and the next one tried) if a greedy step or a MoE routing
decision is a near tie, or if the greedy continuation is degenerate (< 4 distinct tokens), so that a correct float32 implementation reproduces them exactly.
"""
import json
import os
import struct
import sys
from dataclasses import asdict, replace

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("LITGPT_SRC", "/tmp/litgpt_src")
SHIM_DIR = os.environ.get("LITGPT_SHIM_DIR", os.path.join(HERE, "..", "..", "..", "shared", "tools"))
for d in (SHIM_DIR, "/work/shared/tools"):
    if os.path.isfile(os.path.join(d, "litgpt_shim.py")):
        sys.path.insert(0, d)
        break
import litgpt_shim  # noqa: E402,F401  (makes `litgpt` importable)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import yaml  # noqa: E402

from litgpt.config import Config  # noqa: E402
from litgpt.model import GPT, RMSNorm, build_rope_cache  # noqa: E402

OUT_DIR = os.path.join(HERE, "golden_extra")
T, P, N_NEW = 20, 8, 12
VOCAB, PADDED = 250, 256
MIN_MARGIN = 1e-3  # smallest allowed top-1/top-2 gap (greedy steps, MoE routing)

YARN = {
    "factor": 4.0,
    "beta_fast": 32,
    "beta_slow": 1,
    "original_max_seq_len": 32,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}

# case -> (preset, overrides). Every case sets the sizes explicitly (the preset's own sizes are huge).
CASES = {
    "gemma2": ("Gemma-2-2b", dict(
        name="Gemma-2-2b-golden", n_layer=4, n_embd=32, n_head=4, n_query_groups=2, head_size=16,
        intermediate_size=64, sliding_window_size=5,
        # preset values 256 / 50 / 30 are not visible at this scale; keep the features, shrink the constants
        attention_scores_scalar=8, attention_logit_softcapping=2.0, final_logit_softcapping=5.0)),
    "gemma3": ("Gemma-3-4b-it", dict(
        name="Gemma-3-4b-it-golden", n_layer=6, n_embd=32, n_head=4, n_query_groups=2, head_size=16,
        intermediate_size=64, sliding_window_size=4, attention_scores_scalar=8)),
    "phi2": ("phi-2", dict(
        name="phi-2-golden", n_layer=2, n_embd=40, n_head=2, head_size=20, intermediate_size=80)),
    "falcon": ("falcon-7b", dict(
        name="falcon-7b-golden", n_layer=2, n_embd=32, n_head=4, n_query_groups=1, head_size=8,
        intermediate_size=128)),
    "mixtral": ("Mixtral-8x7B-v0.1", dict(
        name="Mixtral-8x7B-v0.1-golden", n_layer=2, n_embd=32, n_head=4, n_query_groups=2, head_size=8,
        intermediate_size=48, n_expert=4, n_expert_per_token=2)),
    "qwen3": ("Qwen3-0.6B", dict(
        name="Qwen3-0.6B-golden", n_layer=2, n_embd=32, n_head=4, n_query_groups=2, head_size=16,
        intermediate_size=64)),
    "olmo2": ("OLMo-2-1124-7B", dict(
        name="OLMo-2-1124-7B-golden", n_layer=2, n_embd=32, n_head=4, n_query_groups=2, head_size=16,
        intermediate_size=64)),
    "llama31_yarn": ("Llama-3.1-8B", dict(
        name="Llama-3.1-8B-yarn-golden", n_layer=2, n_embd=32, n_head=4, n_query_groups=2, head_size=16,
        intermediate_size=64, rope_adjustments=YARN)),
    "linear_rope": ("Llama-2-7b-hf", dict(
        name="Llama-2-7b-hf-linear-rope-golden", n_layer=2, n_embd=32, n_head=4, head_size=8,
        intermediate_size=64, rope_adjustments={"factor": 2.0}, rope_condense_ratio=2)),
    "interleave": ("Llama-3.2-1B", dict(
        name="Llama-3.2-1B-interleave-golden", n_layer=2, n_embd=32, n_head=4, n_query_groups=2, head_size=16,
        intermediate_size=64, rope_interleave=True)),
    "qwen25": ("Qwen2.5-0.5B", dict(
        name="Qwen2.5-0.5B-golden", n_layer=2, n_embd=48, n_head=6, n_query_groups=2, head_size=8,
        intermediate_size=96)),
    "stablelm": ("stablelm-base-alpha-3b", dict(
        name="stablelm-base-alpha-3b-golden", n_layer=2, n_embd=32, n_head=2, head_size=16,
        intermediate_size=128)),
}


def make_config(preset, overrides):
    kw = dict(vocab_size=VOCAB, padded_vocab_size=PADDED, block_size=128)
    kw.update(overrides)
    name = kw.pop("name")  # from_name's own first parameter is called `name`
    config = replace(Config.from_name(preset, **kw), name=name)
    assert config.name == name
    return config


@torch.no_grad()
def init_weights(model, gen):
    done = set()

    def normal(t, std, mean=0.0):
        t.copy_(torch.randn(t.shape, generator=gen) * std + mean)
        done.add(id(t))

    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            # lm_head twice as large: logits of a few units
            normal(m.weight, (2.0 if name == "lm_head" else 1.0) * m.in_features ** -0.5)
            if m.bias is not None:
                normal(m.bias, 0.05)
        elif isinstance(m, nn.Embedding):
            normal(m.weight, 0.5)
        elif isinstance(m, RMSNorm):
            normal(m.weight, 0.1, 0.0 if m.add_unit_offset else 1.0)
        elif isinstance(m, nn.LayerNorm):
            if m.weight is not None:
                normal(m.weight, 0.1, 1.0)
            if m.bias is not None:
                normal(m.bias, 0.05)
    # a parameter left at its construction default would be a surprise
    missed = [n for n, p in model.named_parameters() if id(p) not in done]
    assert not missed, missed


def full_logits(model, idx):
    return model(idx[None])[0]


@torch.no_grad()
def greedy_recompute(model, prompt, n_new):
    seq = prompt.clone()
    out, margins = [], []
    for _ in range(n_new):
        last = full_logits(model, seq)[-1]
        top2 = torch.topk(last, 2).values
        margins.append(float(top2[0] - top2[1]))
        nxt = int(torch.argmax(last))
        out.append(nxt)
        seq = torch.cat([seq, torch.tensor([nxt])])
    return torch.tensor(out, dtype=torch.int64), min(margins)


@torch.no_grad()
def greedy_cached(model, prompt, n_new, use_maxp1=True):
    """LitGPT's own KV cache, one token per forward (prompt included), as its generate() calls it."""
    model.set_kv_cache(batch_size=1)
    try:
        seq = prompt.tolist()
        out = []
        last = None
        pos = 0
        for tok in seq:
            last = model(torch.tensor([[tok]]), input_pos=torch.tensor([pos]),
                         input_pos_maxp1=(pos + 1) if use_maxp1 else None)[0, -1]
            pos += 1
        for i in range(n_new):
            nxt = int(torch.argmax(last))
            out.append(nxt)
            if i + 1 < n_new:
                last = model(torch.tensor([[nxt]]), input_pos=torch.tensor([pos]),
                             input_pos_maxp1=(pos + 1) if use_maxp1 else None)[0, -1]
                pos += 1
        return torch.tensor(out, dtype=torch.int64)
    finally:
        model.clear_kv_cache()


@torch.no_grad()
def cached_logits(model, tokens, use_maxp1=True):
    model.set_kv_cache(batch_size=1)
    try:
        rows = [model(tokens[None, i:i + 1], input_pos=torch.tensor([i]),
                      input_pos_maxp1=(i + 1) if use_maxp1 else None)[0, -1] for i in range(len(tokens))]
        return torch.stack(rows)
    finally:
        model.clear_kv_cache()


@torch.no_grad()
def moe_min_gap(model, tokens):
    """Smallest gap between the k-th and (k+1)-th router logit over all tokens and MoE layers."""
    gaps = []
    hooks = []
    k = model.config.n_expert_per_token

    def hook(mod, inp, out):
        x = inp[0].reshape(-1, inp[0].size(-1))
        r = torch.sort(mod.gate(x), dim=-1, descending=True).values
        gaps.append(float((r[:, k - 1] - r[:, k]).min()))

    for blk in model.transformer.h:
        if hasattr(blk.mlp, "gate"):
            hooks.append(blk.mlp.register_forward_hook(hook))
    full_logits(model, tokens)
    for h in hooks:
        h.remove()
    return min(gaps) if gaps else float("inf")


def write_safetensors(path, state_dict):
    header, blobs, off = {}, [], 0
    for name in sorted(state_dict):
        a = state_dict[name].detach().to(torch.float32).contiguous().numpy().astype("<f4")
        b = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def check_case_features(case, model):
    """Assertions that LitGPT really takes the code paths the case is meant to cover."""
    c = model.config
    if case == "llama31_yarn":
        plain_cos, _ = build_rope_cache(c.block_size, c.rope_n_elem, base=c.rope_base)
        assert not torch.allclose(model.cos, plain_cos), "YaRN did not change the RoPE cache"
        # LitGPT's YaRN branch is selected by the presence of beta_fast/beta_slow
        assert "beta_fast" in c.rope_adjustments
        assert all(abs(b.attn.mscale - 1.0) > 1e-3 for b in model.transformer.h), "YaRN mscale not applied"
    if case == "linear_rope":
        plain_cos, _ = build_rope_cache(c.block_size, c.rope_n_elem, base=c.rope_base)
        assert not torch.allclose(model.cos, plain_cos)
    if case == "gemma3":
        assert model.cos.dim() == 3, "expected a (local, global) RoPE cache"
        assert 0 in c.sliding_window_indices[: c.n_layer]
    if "Gemma" in c.name:
        assert all(m.add_unit_offset for m in model.modules() if isinstance(m, RMSNorm))


def make_case(case, preset, overrides, seed0):
    config = make_config(preset, overrides)
    for attempt in range(50):
        seed = seed0 + attempt
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        model = GPT(config).eval()
        init_weights(model, gen)
        check_case_features(case, model)
        tokens = torch.randint(0, config.vocab_size, (T,), generator=gen, dtype=torch.int64)
        with torch.no_grad():
            logits = full_logits(model, tokens)
        prompt = tokens[:P].clone()
        greedy, margin = greedy_recompute(model, prompt, N_NEW)
        gap = moe_min_gap(model, tokens) if config.n_expert else float("inf")
        if config.n_expert:
            seq = torch.cat([prompt, greedy[:-1]])
            gap = min(gap, moe_min_gap(model, seq))
        distinct = len(set(greedy.tolist()))
        if margin >= MIN_MARGIN and gap >= MIN_MARGIN and distinct >= 4:
            break
        print(f"  {case}: seed {seed} rejected (greedy margin {margin:.2e}, moe gap {gap:.2e}, "
              f"{distinct} distinct greedy tokens)")
    else:
        raise RuntimeError(f"{case}: no seed without near ties")

    cached = greedy_cached(model, prompt, N_NEW, use_maxp1=True)
    cached_nomaxp1 = greedy_cached(model, prompt, N_NEW, use_maxp1=False)
    cl = cached_logits(model, tokens, use_maxp1=True)
    cl_nomaxp1 = cached_logits(model, tokens, use_maxp1=False)
    matches = bool(torch.equal(cached, greedy))

    d = os.path.join(OUT_DIR, case)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    with open(os.path.join(d, "model_config.yaml"), "w", encoding="utf-8") as fp:
        yaml.dump(asdict(config), fp)
    write_safetensors(os.path.join(d, "model.safetensors"), model.state_dict())
    np.save(os.path.join(d, "tokens.npy"), tokens.numpy().astype(np.int64))
    np.save(os.path.join(d, "logits.npy"), logits.numpy().astype(np.float32))
    np.save(os.path.join(d, "prompt.npy"), prompt.numpy().astype(np.int64))
    np.save(os.path.join(d, "greedy.npy"), greedy.numpy().astype(np.int64))
    meta = {"T": T, "P": P, "n_new": N_NEW, "litgpt_config_name": preset,
            "litgpt_cached_greedy_matches_recompute": matches}
    with open(os.path.join(d, "meta.json"), "w") as fp:
        json.dump(meta, fp)

    lg = logits.numpy()
    print(f"{case}: preset {preset} seed {seed} | n_layer {config.n_layer} n_embd {config.n_embd} "
          f"n_head {config.n_head} n_query_groups {config.n_query_groups} head_size {config.head_size} "
          f"rope_n_elem {config.rope_n_elem} window {config.sliding_window_size} "
          f"indices {config.sliding_window_indices}")
    print(f"  logits std {lg.std():.3f} max|.| {np.abs(lg).max():.3f}; greedy {greedy.tolist()} "
          f"(min margin {margin:.3g}, moe gap {gap:.3g})")
    print(f"  cached (maxp1) greedy {cached.tolist()} match={matches}; "
          f"without maxp1 match={bool(torch.equal(cached_nomaxp1, greedy))}; "
          f"cached logits max diff maxp1 {float((cl - logits).abs().max()):.2e}, "
          f"no maxp1 {float((cl_nomaxp1 - logits).abs().max()):.2e}")
    return matches


def main(argv):
    torch.set_num_threads(1)  # reproducible reductions
    cases = argv or list(CASES)
    for i, case in enumerate(CASES):
        if case in cases:
            preset, overrides = CASES[case]
            make_case(case, preset, overrides, seed0=1000 * (i + 1))
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(OUT_DIR) for f in fs)
    print(f"golden_extra total {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main(sys.argv[1:])
