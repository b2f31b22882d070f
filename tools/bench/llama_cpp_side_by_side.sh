#!/bin/bash
# lgpt against llama.cpp on the same machine, rounds interleaved. Two modes (MODE=...):
#
# MODE=speed (the default): speed and quality.
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
# MODE=serving: batched serving throughput on the same 110M weights (the random ones above:
#   the f32 GGUF and its --pure q8_0 / q4_0 quantisations in llama.cpp; the same f32 weights
#   converted with lgpt's convert_hf and quantised at load, --quantize=none / int8 / int4, in
#   lgpt). Every request: 128 random prompt tokens, 128 new tokens; STREAMS (default 1,4,16)
#   requests at once. A round is, for each precision, one llama.cpp run then one lgpt run:
#     llama.cpp: llama-batched-bench -npp 128 -ntg 128 -npl 1,4,16 -t $THREADS
#       -c max(STREAMS)*(128+128): a static batch (all streams prefilled in one batch, then decoded in
#       lock step, no sampling), its most favourable case. Its columns: S_PP = B*PP / T_PP
#       (prompt tokens over the prefill time), S_TG = B*TG / T_TG (generated tokens over the
#       generation time alone, prefill left out), S = (B*PP + B*TG) / T (prompt and generated
#       tokens together over T = T_PP + T_TG). Neither S_TG nor S is lgpt's figure, so the
#       script uses B*TG / T from the row: generated tokens over the whole batch's wall time.
#     lgpt: bench_serve --concurrency=1,4,16 --prompt_tokens=128 --new_tokens=128
#       --threads=$THREADS (continuous batching: all requests submitted at once, prefill chunks
#       and decode rows sharing steps; tokens sampled, top-k 50 at temperature 0.8): its
#       decode_tok/s, generated tokens over the round's wall time, submission to the last
#       completion, after its unmeasured warm-up request.
#   Both figures: B*128 generated tokens over the time from the first prompt token to the last
#   new one (llama.cpp runs one decode pass more: it decodes 128 tokens after the prefill,
#   whose last logits lgpt samples the first new token from). Medians over the rounds, and the
#   table: weights x streams, llama.cpp / lgpt tokens/s and lgpt / llama.cpp.
#
#   [MODE=serving] tools/bench/llama_cpp_side_by_side.sh LLAMA_CPP_DIR [rounds]
#
# llama.cpp is not part of lgpt: bring a checkout (github.com/ggml-org/llama.cpp); the tools a
# mode needs (llama-bench, llama-quantize, llama-perplexity; serving: llama-quantize,
# llama-batched-bench) are built here with cmake (GGML_NATIVE) into LLAMA_CPP_DIR/build unless
# they are there already.
# Needs cmake and Debian's python3-torch, python3-numpy, python3-sentencepiece, python3-yaml,
# python3-tqdm (the converter's imports; safetensors is read without the safetensors package).
# THREADS (default 2) sets the threads of both engines. LLAMA_NO_AMX=1 builds llama.cpp without
# its AMX kernels (-mno-amx-* beside GGML_NATIVE's -march=native) for CPUs with AMX where they
# die with an illegal instruction (commit 0c1e57098 does on the project's AMX Xeon VM: tilezero
# in tinygemm_kernel_amx, q8_0 weights; lgpt's AMX kernels run there); its other native paths
# (AVX-512 VNNI/BF16, weight repacking) stay. Say so beside any figure taken that way.
set -euo pipefail
usage="usage: [MODE=speed|serving] $0 LLAMA_CPP_DIR [rounds]"
if [ $# -lt 1 ] || [ $# -gt 2 ]; then echo "$usage" >&2; exit 1; fi
[ -d "$1" ] || { echo "error: LLAMA_CPP_DIR $1 is not a directory" >&2; exit 1; }
llama=$(realpath "$1")
rounds=${2:-5}
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "error: rounds must be a positive integer, not '$rounds'" >&2; exit 1; }
mode=${MODE:-speed}
case "$mode" in
  speed | serving) ;;
  *) echo "error: MODE must be speed (the default: speed and quality) or serving, not '$mode'" >&2; exit 1 ;;
esac
threads=${THREADS:-2}
streams=${STREAMS:-1,4,16}
[[ "$streams" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "error: STREAMS must be a list like 1,4,16, not '$streams'" >&2; exit 1; }
py=/usr/bin/python3
repo=$(realpath "$(dirname "$0")/../..")
work=${TMPDIR:-/tmp}/lgpt_llama_cpp_bench
mkdir -p "$work"
[ -f "$llama/convert_hf_to_gguf.py" ] || { echo "error: $llama is not a llama.cpp checkout" >&2; exit 1; }

# --- llama.cpp's tools -------------------------------------------------------------------
bin=$llama/build/bin
if [ "$mode" = serving ]; then
  llama_tools=(llama-quantize llama-batched-bench)
else
  llama_tools=(llama-bench llama-quantize llama-perplexity)
fi
missing=()
for tool in "${llama_tools[@]}"; do [ -x "$bin/$tool" ] || missing+=("$tool"); done
cmake_args=()
if [ "${LLAMA_NO_AMX:-0}" = 1 ]; then
  no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  cmake_args+=("-DCMAKE_C_FLAGS=$no_amx" "-DCMAKE_CXX_FLAGS=$no_amx")
fi
if [ ${#missing[@]} -gt 0 ]; then
  command -v cmake >/dev/null || { echo "error: cmake is needed to build llama.cpp's ${missing[*]} (apt-get install cmake)" >&2; exit 1; }
  cmake -S "$llama" -B "$llama/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF "${cmake_args[@]}" >&2
  cmake --build "$llama/build" -j"$(nproc)" --target "${missing[@]}" >&2
fi
export PYTHONPATH="$llama/gguf-py${PYTHONPATH:+:$PYTHONPATH}"

# --- lgpt's tools --------------------------------------------------------------------------
cd "$repo"
if [ "$mode" = serving ]; then
  ./lgpt bazel build //tools:bench_serve //tools:convert_hf >&2
else
  ./lgpt bazel build //core/model:gpt_benchmark //tools:convert_lit //tools:perplexity >&2
fi
lgpt_bin=$(./lgpt bazel info bazel-bin 2>/dev/null | tail -n 1)

# run_logged LOG COMMAND...: runs COMMAND with its output in LOG; if it fails, says so with
# the end of LOG and exits.
run_logged() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 || {
    local status=$?
    echo "error: $(basename "$1") failed (exit status $status); the end of $log:" >&2
    tail -n 20 "$log" >&2
    if [ $status = 132 ]; then
      echo "(an illegal instruction: where llama.cpp's AMX kernels die so, build it without them:" \
        "remove LLAMA_CPP_DIR/build and run again with LLAMA_NO_AMX=1)" >&2
    fi
    exit 1
  }
}

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
import os, runpy, sys, torch
# Debian 12's torch 1.13 lacks two things newer converters name: float8 dtypes (only listed
# in a table) and torch.load's mmap argument.
for name in ("float8_e4m3fn", "float8_e5m2"):
    if not hasattr(torch, name):
        setattr(torch, name, torch.uint8)
_load = torch.load
torch.load = lambda *args, mmap=None, **kwargs: _load(*args, **kwargs)
# Newer converters import transformers for AutoConfig alone and read config.json when it
# fails; without transformers (Debian 12 has none) a stand-in that always fails.
try:
    import transformers
except ImportError:
    import types
    class _Unavailable:
        @classmethod
        def from_pretrained(cls, *args, **kwargs):
            raise ImportError("transformers is not installed")
    transformers = types.ModuleType("transformers")
    transformers.AutoConfig = transformers.AutoTokenizer = _Unavailable
    sys.modules["transformers"] = transformers
sys.argv = sys.argv[1:]
# As `python3 convert_hf_to_gguf.py` would: newer converters import modules beside them.
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
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

# --- serving, interleaved (MODE=serving) ------------------------------------------------------
if [ "$mode" = serving ]; then
  prompt=128 new=128
  # lgpt reads the same f32 weights as the GGUF: the Hugging Face directory through convert_hf
  # (hf_dir's random weights are seeded, so a directory made again holds the same ones). The
  # borrowed tokenizer has 4,096 pieces against the shape's 32,000 ids (the GGUF pads its
  # vocabulary), so lgpt's copy goes without one: token ids only, nothing detokenised, as in
  # llama-batched-bench.
  if [ ! -f "$work/lit110/lit_model.pth" ]; then
    [ -f "$work/hf110/pytorch_model.bin" ] || hf_dir "$work/hf110" random "$repo/tools/default_model"
    rm -rf "$work/lit110.partial"
    run_logged "$work/convert_hf.log" "$lgpt_bin/tools/convert_hf" --hf_dir="$work/hf110" \
      --out_dir="$work/lit110.partial" --dtype=float32
    rm -f "$work/lit110.partial"/tokenizer*
    rm -rf "$work/lit110"
    mv "$work/lit110.partial" "$work/lit110"
  fi
  # Non-unified KV cache: every sequence gets n_ctx / max(streams) entries, prompt + new each.
  max_streams=$(tr , '\n' <<<"$streams" | sort -n | tail -n 1)
  llama_serve() {  # llama_serve MODEL -> "STREAMS TOK/S S_TG" lines
    run_logged "$work/batched_bench.log" "$bin/llama-batched-bench" -m "$1" \
      -c $((max_streams * (prompt + new))) -npp $prompt -ntg $new -npl "$streams" -t "$threads"
    "$py" - "$work/batched_bench.log" "$streams" $prompt $new <<'PY'
import sys
log, streams = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
prompt, new = sys.argv[3], sys.argv[4]
# |  PP |  TG |  B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
rows = {}
for line in open(log):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 10 and cells[0] == prompt and cells[1] == new:
        pp, tg, b, _, t_pp, s_pp, t_tg, s_tg, t, s = cells
        rows[int(b)] = (int(b) * int(tg) / float(t), float(s_tg))
for b in streams:
    if b not in rows:  # it skips a batch whose KV entries exceed -c
        sys.exit(f"error: llama-batched-bench printed no row for {b} streams (see {log})")
    print(b, *rows[b])
PY
  }
  lgpt_serve() {  # lgpt_serve QUANTIZE -> "STREAMS TOK/S" lines
    OMP_WAIT_POLICY=passive run_logged "$work/bench_serve.log" "$lgpt_bin/tools/bench_serve" \
      --checkpoint_dir="$work/lit110" --quantize="$1" --concurrency="$streams" \
      --prompt_tokens=$prompt --new_tokens=$new --threads="$threads"
    "$py" - "$work/bench_serve.log" "$streams" <<'PY'
import re, sys
log, streams = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
# concurrency  decode_tok/s  ttft_p50 ...: one row per concurrency (a single round)
rows = {}
for line in open(log):
    m = re.match(r"(\d+)\s+([0-9.]+)\s+[0-9.]+s\s", line)
    if m: rows[int(m.group(1))] = float(m.group(2))
for b in streams:
    if b not in rows:
        sys.exit(f"error: bench_serve printed no row for {b} streams (see {log})")
    print(b, rows[b])
PY
  }
  results=$work/serving.txt
  : >"$results"
  for i in $(seq "$rounds"); do
    for pair in "f32 none" "q8_0 int8" "q4_0 int4"; do
      set -- $pair
      l=$(llama_serve "$work/m110-$1.gguf")
      g=$(lgpt_serve "$2")
      echo "round $i $1: llama.cpp (streams tok/s S_TG) ${l//$'\n'/, } | lgpt (streams tok/s) ${g//$'\n'/, }" >&2
      while read -r b rate _; do echo "$1 llama.cpp $b $rate" >>"$results"; done <<<"$l"
      while read -r b rate; do echo "$1 lgpt $b $rate" >>"$results"; done <<<"$g"
    done
  done
  "$py" - "$results" "$rounds" "$threads" "$streams" "$prompt" "$new" <<'PY'
import statistics, sys
path, rounds, threads, streams, prompt, new = sys.argv[1:]
streams = [int(s) for s in streams.split(",")]
rates = {}
for line in open(path):
    weights, engine, b, rate = line.split()
    rates.setdefault((weights, engine, int(b)), []).append(float(rate))
med = {key: statistics.median(values) for key, values in rates.items()}
print(f"serving: medians of {rounds} interleaved rounds, {threads} threads, {prompt} prompt + "
      f"{new} new tokens per request; generated tokens/s over the round's wall time, "
      "llama.cpp (llama-batched-bench, B*TG / T) / lgpt (bench_serve) (lgpt / llama.cpp)")
print("| weights (llama.cpp / lgpt) | " + " | ".join(
    f"{b} stream{'s' if b > 1 else ''}: llama.cpp / lgpt" for b in streams) + " |")
print("| --- |" + " ---: |" * len(streams))
names = {"f32": "f32 / float32", "q8_0": "q8_0 / int8", "q4_0": "q4_0 / int4"}
for key in ("f32", "q8_0", "q4_0"):
    cells = []
    for b in streams:
        l, g = med[(key, "llama.cpp", b)], med[(key, "lgpt", b)]
        cells.append(f"{l:.1f} / {g:.1f} ({g / l:.2f}x)")
    print(f"| {names[key]} | " + " | ".join(cells) + " |")
PY
  exit 0
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
