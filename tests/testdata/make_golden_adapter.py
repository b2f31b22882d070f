#!/usr/bin/python3
"""Generate the LLaMA-Adapter / Adapter v2 golden cases (tests/testdata/golden_adapter/<case>/).

Test tooling: it imports LitGPT's own adapter.py and adapter_v2.py (through
/work/shared/tools/litgpt_shim.py, which makes them run under Debian's torch 1.13); nothing of
LitGPT is copied here. Run it with Debian's interpreter, which has torch, numpy and yaml:

    LITGPT_SRC=/tmp/litgpt_src /usr/bin/python3 tests/testdata/make_golden_adapter.py [case ...]

Each case is a small, randomly initialised Llama-style model with grouped-query attention
(4 query heads, 2 KV groups), 3 layers, the adapter prefix on layers 1 and 2 only
(adapter_start_layer 1, adapter_prompt_length 5). Every parameter is random and non-zero:
adapter_wte and gating_factor (so the prefix changes the logits), and for Adapter v2 also
adapter_bias and adapter_scale (around 1, not 1). Files per case (meaning as in
golden/README.md): model_config.yaml (LitGPT's adapter Config, adapter fields included),
lit_model.pth (`torch.save(model.state_dict())`, LitGPT's names: `adapter_wte.weight`,
`gating_factor`, and for v2 `*.linear.weight`, `adapter_bias`, `adapter_scale`), tokens.npy,
logits.npy, prompt.npy, greedy.npy, meta.json.

Weights: nn.Linear weights ~ N(0, 1/fan_in) (lm_head N(0, 4/fan_in)), embeddings (wte and
adapter_wte) ~ N(0, 0.5^2), RMSNorm weights ~ 1 + N(0, 0.1^2), gating_factor ~ N(0, 0.5^2),
adapter_bias ~ N(0, 0.05^2), adapter_scale ~ 1 + N(0, 0.1^2). A seed is rejected if a greedy
step is a near tie (top-1/top-2 gap < 1e-3) or the continuation has < 4 distinct tokens.
"""
import json
import os
import sys
from dataclasses import asdict

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

import litgpt.adapter as adapter_v1  # noqa: E402
import litgpt.adapter_v2 as adapter_v2  # noqa: E402
from litgpt.model import RMSNorm  # noqa: E402

OUT_DIR = os.path.join(HERE, "golden_adapter")
T, P, N_NEW = 20, 8, 12
MIN_MARGIN = 1e-3

# Config.from_name(preset, **SIZES), then the name replaced (keeps the "Llama-2" substring).
PRESET = "Llama-2-7b-hf"
SIZES = dict(
    vocab_size=250, padded_vocab_size=256, block_size=128, n_layer=3, n_embd=32, n_head=4,
    n_query_groups=2, head_size=8, intermediate_size=64, adapter_prompt_length=5,
    adapter_start_layer=1)

CASES = {
    "adapter": (adapter_v1, "Llama-2-7b-hf-adapter-golden"),
    "adapter_v2": (adapter_v2, "Llama-2-7b-hf-adapter-v2-golden"),
}


@torch.no_grad()
def init_weights(model, gen):
    done = set()

    def normal(t, std, mean=0.0):
        t.copy_(torch.randn(t.shape, generator=gen) * std + mean)
        done.add(id(t))

    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            normal(m.weight, (2.0 if name.startswith("lm_head") else 1.0) * m.in_features ** -0.5)
            if m.bias is not None:
                normal(m.bias, 0.05)
        elif isinstance(m, nn.Embedding):
            normal(m.weight, 0.5)
        elif isinstance(m, RMSNorm):
            normal(m.weight, 0.1, 1.0)
    for name, p in model.named_parameters():
        if name.endswith("gating_factor"):
            normal(p, 0.5)
        elif name.endswith("adapter_bias"):
            normal(p, 0.05)
        elif name.endswith("adapter_scale"):
            normal(p, 0.1, 1.0)
    missed = [n for n, p in model.named_parameters() if id(p) not in done]
    assert not missed, missed


def clear_adapter_cache(model):
    # LitGPT keeps the prefix keys/values of the first call for good (adapter_kv_cache):
    # harmless here (the weights never change after init), cleared anyway for clarity.
    for m in model.modules():
        if hasattr(m, "adapter_kv_cache"):
            m.adapter_kv_cache = None


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
def cached_logits(model, tokens):
    """LitGPT's own KV cache, one token per call, with input_pos_maxp1 as its generate() passes it."""
    model.set_kv_cache(batch_size=1)
    try:
        rows = [model(tokens[None, i:i + 1], input_pos=torch.tensor([i]), input_pos_maxp1=i + 1)[0, -1]
                for i in range(len(tokens))]
        return torch.stack(rows)
    finally:
        model.clear_kv_cache()


@torch.no_grad()
def without_prefix(model, tokens):
    """Logits with every gating_factor zeroed: how much the adapter prefix matters."""
    saved = {n: p.clone() for n, p in model.named_parameters() if n.endswith("gating_factor")}
    for n, p in model.named_parameters():
        if n in saved:
            p.zero_()
    out = full_logits(model, tokens)
    for n, p in model.named_parameters():
        if n in saved:
            p.copy_(saved[n])
    return out


def make_case(case, module, name, seed0):
    config = module.Config.from_name(PRESET, **SIZES)
    config.name = name
    assert config.n_query_groups < config.n_head  # GQA: the interleaved and [Q|K|V] splits differ
    for attempt in range(50):
        seed = seed0 + attempt
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        model = module.GPT(config).eval()
        init_weights(model, gen)
        tokens = torch.randint(0, config.vocab_size, (T,), generator=gen, dtype=torch.int64)
        with torch.no_grad():
            logits = full_logits(model, tokens)
        prompt = tokens[:P].clone()
        greedy, margin = greedy_recompute(model, prompt, N_NEW)
        distinct = len(set(greedy.tolist()))
        if margin >= MIN_MARGIN and distinct >= 4:
            break
        print(f"  {case}: seed {seed} rejected (greedy margin {margin:.2e}, {distinct} distinct)")
    else:
        raise RuntimeError(f"{case}: no seed without near ties")

    names = list(model.state_dict())
    assert any(n.endswith("adapter_wte.weight") for n in names)
    assert not any(n.startswith("transformer.h.0.attn.") and "adapter_wte" in n for n in names)
    if module is adapter_v2:
        assert "lm_head.linear.weight" in names and any(n.endswith("adapter_scale") for n in names)
    clear_adapter_cache(model)
    cl = cached_logits(model, tokens)
    clear_adapter_cache(model)
    no_prefix = without_prefix(model, tokens)
    prefix_effect = float((no_prefix - logits).abs().max())
    cached_diff = float((cl - logits).abs().max())
    assert prefix_effect > 0.1, prefix_effect

    d = os.path.join(OUT_DIR, case)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    with open(os.path.join(d, "model_config.yaml"), "w", encoding="utf-8") as fp:
        yaml.dump(asdict(config), fp)
    torch.save(model.state_dict(), os.path.join(d, "lit_model.pth"))
    np.save(os.path.join(d, "tokens.npy"), tokens.numpy().astype(np.int64))
    np.save(os.path.join(d, "logits.npy"), logits.numpy().astype(np.float32))
    np.save(os.path.join(d, "prompt.npy"), prompt.numpy().astype(np.int64))
    np.save(os.path.join(d, "greedy.npy"), greedy.numpy().astype(np.int64))
    meta = {"T": T, "P": P, "n_new": N_NEW, "litgpt_config_name": PRESET, "seed": seed,
            "litgpt_module": module.__name__,
            "prefix_qkv_split": "interleaved per query group (lgpt: legacy_qkv_split = true)",
            "max_abs_logit_change_without_prefix": round(prefix_effect, 4),
            "litgpt_cached_logits_max_abs_diff": cached_diff}
    with open(os.path.join(d, "meta.json"), "w") as fp:
        json.dump(meta, fp)
    lg = logits.numpy()
    print(f"{case}: seed {seed}; logits std {lg.std():.3f} max|.| {np.abs(lg).max():.3f}; "
          f"greedy {greedy.tolist()} (min margin {margin:.3g}); gates zeroed change the logits "
          f"by up to {prefix_effect:.3f}; LitGPT cached vs full {cached_diff:.2e}")


def main(argv):
    torch.set_num_threads(1)  # reproducible reductions
    cases = argv or list(CASES)
    for i, case in enumerate(CASES):
        if case in cases:
            module, name = CASES[case]
            make_case(case, module, name, seed0=5000 + 100 * i)
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(OUT_DIR) for f in fs)
    print(f"golden_adapter total {total / 1e3:.0f} KB")


if __name__ == "__main__":
    main(sys.argv[1:])
