#!/bin/bash
# lgpt against llama.cpp on the same machine, rounds interleaved:
#
#   speed: the 110M Llama shape of llama2.c (12 x 768, intermediate 2048, vocab 32000, tied
#     head) at float32 / q8_0 / q4_0 in llama.cpp (llama-bench pp512 and tg128) and at
#     float32 / int8 / int4 in lgpt (gpt_benchmark Prefill/llama-110m/512 and
#     Decode/llama-110m/128, i.e. one token with 128 cached entries: tg128's mean context is
#     64, so lgpt's decode figure is the harder one). Weights are random (speed does not depend
#     on their values); both engines read all of them, head and embedding included.
#   quality: the embedded default model (tools/default_model) converted with lgpt's
#     convert_lit and llama.cpp's own convert_hf_to_gguf.py, then quantised with llama-quantize
#     --pure; perplexity of tools/eval_data/kjv_heldout.txt in each engine at each precision.
#     The two engines chunk the text differently, so compare each engine's quantisation cost
#     (quantised / float32), not the absolute values across engines.
#
#   tools/bench/llama_cpp_side_by_side.sh LLAMA_CPP_DIR [rounds]
#
# llama.cpp is not part of lgpt: bring a checkout (github.com/ggml-org/llama.cpp); it is built
# here with cmake (GGML_NATIVE) into LLAMA_CPP_DIR/build unless its tools are there already.
# Needs cmake and Debian's python3-torch, python3-numpy, python3-sentencepiece, python3-yaml,
# python3-tqdm (the converter's imports; safetensors is read without the safetensors package).
# THREADS (default 2) sets the threads of both engines.
set -euo pipefail
llama=$(realpath "${1:?usage: $0 LLAMA_CPP_DIR [rounds]}")
rounds=${2:-5}
threads=${THREADS:-2}
py=/usr/bin/python3
repo=$(realpath "$(dirname "$0")/../..")
work=${TMPDIR:-/tmp}/lgpt_llama_cpp_bench
mkdir -p "$work"
[ -f "$llama/convert_hf_to_gguf.py" ] || { echo "error: $llama is not a llama.cpp checkout" >&2; exit 1; }

# --- llama.cpp's tools -------------------------------------------------------------------
bin=$llama/build/bin
if [ ! -x "$bin/llama-bench" ] || [ ! -x "$bin/llama-quantize" ] || [ ! -x "$bin/llama-perplexity" ]; then
  cmake -S "$llama" -B "$llama/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >&2
  cmake --build "$llama/build" -j"$(nproc)" --target llama-bench llama-quantize llama-perplexity >&2
fi
export PYTHONPATH="$llama/gguf-py${PYTHONPATH:+:$PYTHONPATH}"

# --- lgpt's tools --------------------------------------------------------------------------
cd "$repo"
./lgpt bazel build //core/model:gpt_benchmark //tools:convert_lit //tools:perplexity >&2
lgpt_bin=$(./lgpt bazel info bazel-bin 2>/dev/null | tail -n 1)

# Writes a Hugging Face directory llama.cpp's converter reads: config.json, tokenizer.model
# and pytorch_model.bin (from model.safetensors, or random 110M weights when "random").
hf_dir() {  # hf_dir OUT SOURCE
  "$py" - "$@" <<'PY'
import json, os, shutil, struct, sys
import numpy as np, torch
out, source = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
if source == "random":
    dim, hidden, layers, heads, vocab = 768, 2048, 12, 12, 32000
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": dim,
              "intermediate_size": hidden, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": heads, "vocab_size": vocab,
              "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}
    g = torch.Generator().manual_seed(0)
    w = lambda *shape: torch.randn(*shape, generator=g) * 0.02
    state = {"model.embed_tokens.weight": w(vocab, dim), "model.norm.weight": torch.ones(dim)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            state[p + f"self_attn.{name}.weight"] = w(dim, dim)
        state[p + "mlp.gate_proj.weight"] = w(hidden, dim)
        state[p + "mlp.up_proj.weight"] = w(hidden, dim)
        state[p + "mlp.down_proj.weight"] = w(dim, hidden)
        state[p + "input_layernorm.weight"] = torch.ones(dim)
        state[p + "post_attention_layernorm.weight"] = torch.ones(dim)
    json.dump(config, open(os.path.join(out, "config.json"), "w"))
    shutil.copy(os.path.join(sys.argv[3], "tokenizer.model"), out)
else:
    # safetensors: 8-byte little-endian header size, JSON header, raw little-endian data.
    with open(os.path.join(source, "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    dtypes = {"F32": np.float32, "F16": np.float16}
    state = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        array = np.frombuffer(data[begin:end], dtype=dtypes[info["dtype"]]).reshape(info["shape"])
        state[name] = torch.from_numpy(array.astype(np.float32))
    for name in ("config.json", "tokenizer.model"):
        shutil.copy(os.path.join(source, name), out)
torch.save(state, os.path.join(out, "pytorch_model.bin"))
PY
}

gguf_set() {  # gguf_set HF_DIR PREFIX: PREFIX-f32.gguf, PREFIX-q8_0.gguf, PREFIX-q4_0.gguf
  [ -f "$2-q4_0.gguf" ] && return
  "$py" - "$llama/convert_hf_to_gguf.py" "$1" --outtype f32 --outfile "$2-f32.gguf.partial" >&2 <<'PY'
import runpy, sys, torch
# Debian 12's torch 1.13 lacks two things newer converters name: float8 dtypes (only listed
# in a table) and torch.load's mmap argument.
for name in ("float8_e4m3fn", "float8_e5m2"):
    if not hasattr(torch, name):
        setattr(torch, name, torch.uint8)
_load = torch.load
torch.load = lambda *args, mmap=None, **kwargs: _load(*args, **kwargs)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
PY
  mv "$2-f32.gguf.partial" "$2-f32.gguf"
  for type in q8_0 q4_0; do
    "$bin/llama-quantize" --pure "$2-f32.gguf" "$2-$type.gguf.partial" $type >&2
    mv "$2-$type.gguf.partial" "$2-$type.gguf"
  done
}

if [ ! -f "$work/m110-q4_0.gguf" ]; then
  hf_dir "$work/hf110" random "$repo/tools/default_model"
  gguf_set "$work/hf110" "$work/m110"
fi
if [ ! -f "$work/kjv-q4_0.gguf" ]; then
  "$lgpt_bin/tools/convert_lit" --checkpoint_dir="$repo/tools/default_model" \
    --out_dir="$work/kjv_st" --dtype=float32 >&2
  hf_dir "$work/kjv_hf" "$work/kjv_st"
  gguf_set "$work/kjv_hf" "$work/kjv"
fi

# --- speed, interleaved ----------------------------------------------------------------------
llama_bench() {  # llama_bench MODEL -> "prefill decode" tok/s
  "$bin/llama-bench" -m "$1" -t "$threads" -p 512 -n 128 -r 2 -o csv 2>/dev/null |
    "$py" -c '
import csv, sys
rows = list(csv.DictReader(sys.stdin))
get = lambda key: next(r["avg_ts"] for r in rows if int(r[key]) > 0)
print(get("n_prompt"), get("n_gen"))'
}
lgpt_bench() {  # lgpt_bench QUANTIZE -> "prefill decode" tok/s
  OMP_WAIT_POLICY=passive "$lgpt_bin/core/model/gpt_benchmark" --threads="$threads" \
    --quantize="$1" --benchmark_min_time=2 \
    --benchmark_filter='(Prefill/llama-110m/512|Decode/llama-110m/128/)' 2>&1 |
    "$py" -c '
import re, sys
rate = {}
for line in sys.stdin:
    m = re.match(r"(Prefill|Decode)/.*tokens_per_s=([0-9.]+)(k?)/s", line)
    if m: rate[m.group(1)] = float(m.group(2)) * (1000 if m.group(3) else 1)
print(rate["Prefill"], rate["Decode"])'
}
results=$work/speed.txt
: >"$results"
for i in $(seq "$rounds"); do
  for pair in "f32 none" "q8_0 int8" "q4_0 int4"; do
    set -- $pair
    l=$(llama_bench "$work/m110-$1.gguf"); g=$(lgpt_bench "$2")
    echo "round $i $1: llama.cpp $l | lgpt $g" >&2
    echo "$1 $l $g" >>"$results"
  done
done

# --- quality ---------------------------------------------------------------------------------
text=$repo/tools/eval_data/kjv_heldout.txt
quality=$work/quality.txt
: >"$quality"
for pair in "f32 none" "q8_0 int8" "q4_0 int4"; do
  set -- $pair
  l=$("$bin/llama-perplexity" -m "$work/kjv-$1.gguf" -f "$text" -c 256 -b 256 -t "$threads" 2>&1 |
      grep -o 'Final estimate: PPL = [0-9.]*' | awk '{print $5}')
  g=$("$lgpt_bin/tools/perplexity" --checkpoint_dir="$repo/tools/default_model" \
      --text_file="$text" --lines_bos_eos --quantize="$2" --threads="$threads" 2>&1 |
      grep -o 'perplexity[ =:]*[0-9.]*' | tail -n 1 | grep -o '[0-9.]*$')
  echo "$1 $l $g" >>"$quality"
done

"$py" - "$results" "$quality" "$rounds" "$threads" <<'PY'
import statistics, sys
speed, quality, rounds, threads = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rows = {}
for line in open(speed):
    name, *values = line.split()
    rows.setdefault(name, []).append([float(v) for v in values])
ppl = {line.split()[0]: [float(v) for v in line.split()[1:]] for line in open(quality)}
print(f"medians of {rounds} interleaved rounds, {threads} threads; tokens/s; perplexity of the default model")
print("| weights (llama.cpp / lgpt) | prefill 512: llama.cpp | lgpt | decode: llama.cpp tg128 | lgpt @128 | ppl llama.cpp | ppl lgpt |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
names = {"f32": "f32 / float32", "q8_0": "q8_0 / int8", "q4_0": "q4_0 / int4"}
for key in ("f32", "q8_0", "q4_0"):
    med = [statistics.median(r[c] for r in rows[key]) for c in range(4)]
    base = ppl["f32"]
    cost = lambda e: f"{ppl[key][e]:.3f} ({100 * (ppl[key][e] / base[e] - 1):+.2f}%)"
    print(f"| {names[key]} | {med[0]:.0f} | {med[2]:.0f} | {med[1]:.1f} | {med[3]:.1f} | {cost(0)} | {cost(1)} |")
PY
