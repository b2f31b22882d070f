#!/usr/bin/env bash
# The GPU check, run from the unpacked pack's root (see pack.sh): every test binary with
# LGPT_DEVICE=cuda against this machine's own torch libraries, then the benchmarks; one
# summary at the end (tests passed / failed / skipped, kernel timings, tokens/s). Exits 1 when
# a test failed or the machine has no torch. Sections (LGPT_GPU_SECTIONS, default "tests
# kernels serving"): the tests (each at most 5 minutes; expected ~3 in all on an H200), the
# kernel and model benchmarks (at most ~9 minutes, expected ~3), serving on a 1B shape (at most
# ~9, expected ~3); LGPT_GPU_CAPACITY=1 adds the pool-capacity runs to "serving" (up to 12
# minutes more). A device call lasts at most 10 minutes: run "tests" in one call and "kernels
# serving" in the next when the first ran long. On a CPU-only machine the GPU tests skip, and so
# do the serving runs.
#
#   [LGPT_GPU_SECTIONS="tests kernels serving"] bash tools/gpu/run_checks.sh RESULTS_DIR
set -uo pipefail
results="$1"
mkdir -p "$results"
python="${PYTHON:-python3}"
# The machine's torch: the one its python3 imports, or LGPT_TORCH_DIR (a torch/ folder).
if [ -n "${LGPT_TORCH_DIR:-}" ]; then
  torch_dir="$LGPT_TORCH_DIR"
  torch_version="$(sed -n 's/^Version: //p' "$torch_dir"/../torch-*.dist-info/METADATA 2>/dev/null)"
else
  torch_dir="$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null)" || {
    echo "run_checks: no torch for $python (set PYTHON, or LGPT_TORCH_DIR to a torch/ folder)" >&2
    exit 1
  }
  torch_version="$("$python" -c 'import torch; print(torch.__version__)')"
fi
library_path="$PWD/lib:$torch_dir/lib"
for d in "$torch_dir"/../nvidia/*/lib; do [ -d "$d" ] && library_path="$library_path:$d"; done
export LD_LIBRARY_PATH="$library_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LGPT_DEVICE=cuda LGPT_BUILD_FLAVOR=cuda OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"
# LGPT_GPU_SECTIONS picks the sections (default all three: tests, kernels, serving), so that a
# device call of at most 10 minutes can run some now and the others in a second call.
sections=" ${LGPT_GPU_SECTIONS:-tests kernels serving} "
wants() { [[ "$sections" == *" $1 "* ]]; }
gpu="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
echo "== lgpt GPU check: commit $(cat commit.txt 2>/dev/null), torch $torch_version, GPU: ${gpu:-none}"

passed=0 failed=0 skipped=0 broken=()
if wants tests; then
  for test in bin/*_test; do
    name="$(basename "$test")"
    xml="$results/$name.xml"
    start=$SECONDS
    timeout 300 "$test" --gtest_output="xml:$xml" >"$results/$name.log" 2>&1
    status=$?
    if [ -f "$xml" ]; then
      read -r p f s < <("$python" - "$xml" <<'PY'
import sys
import xml.etree.ElementTree as ElementTree
cases = ElementTree.parse(sys.argv[1]).getroot().iter("testcase")
counts = [0, 0, 0]
for case in cases:
    if case.find("failure") is not None:
        counts[1] += 1
    elif case.get("result") == "skipped" or case.find("skipped") is not None:
        counts[2] += 1
    else:
        counts[0] += 1
print(*counts)
PY
      )
    else
      p=0 f=1 s=0
    fi
    [ "$status" -ne 0 ] && [ "$f" -eq 0 ] && f=1  # crashed or timed out after its XML
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    [ "$f" -gt 0 ] && broken+=("$name")
    printf '%-28s exit %3d  passed %4d  failed %3d  skipped %3d  %4d s\n' "$name" "$status" "$p" "$f" "$s" $((SECONDS - start))
  done
fi

if wants kernels; then
  echo "== kernels"
  timeout 120 bin/kv_slot_write_benchmark --benchmark_min_time=0.2 >"$results/kv_slot_write_benchmark.txt" 2>&1
  grep -E '^BM_' "$results/kv_slot_write_benchmark.txt"
  echo "== paged decode attention (1B Llama layer; GB_per_s of KV read, H200 peak ~4800)"
  timeout 150 bin/paged_attention_benchmark --benchmark_filter=cuda --benchmark_min_time=0.2 \
    >"$results/paged_attention_benchmark.txt" 2>&1
  grep -E '^BM_' "$results/paged_attention_benchmark.txt" || tail -5 "$results/paged_attention_benchmark.txt"
  echo "== block-quantised GEMV (1B Llama shapes; GB_per_s of weight bytes read)"
  timeout 60 bin/block_quant_device_benchmark --benchmark_filter=cuda --benchmark_min_time=0.2 \
    >"$results/block_quant_device_benchmark.txt" 2>&1
  grep -E '^BM_' "$results/block_quant_device_benchmark.txt" || tail -5 "$results/block_quant_device_benchmark.txt"
  echo "== a step's token choice (rows_per_s: on the device vs rows read back to the host)"
  timeout 60 bin/sampling_benchmark --benchmark_filter=cuda --benchmark_min_time=0.2 \
    >"$results/sampling_benchmark.txt" 2>&1
  grep -E '^BM_' "$results/sampling_benchmark.txt" || tail -5 "$results/sampling_benchmark.txt"
  echo "== model (float32, random weights)"
  timeout 180 bin/gpt_benchmark --benchmark_filter='(Prefill/llama-110m/512|Decode/llama-110m/(128|512))' \
    --benchmark_min_time=0.5 >"$results/gpt_benchmark.txt" 2>&1
  grep -E '^(Prefill|Decode)' "$results/gpt_benchmark.txt" || tail -5 "$results/gpt_benchmark.txt"
fi

# The serving engine on a 1B-class Llama shape (random bfloat16 weights, written here and
# deleted with the unpacked folder): aggregate tokens/s at 1 / 16 / 64 streams (generated tokens
# over each round's wall time, prefill included), then with LGPT_GPU_CAPACITY=1 the requests of
# 8184 + 8 tokens held at once in a 1 GiB pool (bench_serve's peak_decoding and mean_batch) for
# dense 16-bit, int8 and int4 entries, sink@1024 and sink@1024 in int4 entries.
if wants serving; then
  checkpoint="$PWD/llama-3.2-1b"
  echo "== serving (Llama-3.2-1B shape, random bfloat16 weights)"
  if [ -z "$gpu" ]; then
    echo "skipped: no GPU"
  elif timeout 240 tools/init_checkpoint --model_name=Llama-3.2-1B --precision=bf16-true \
    --out_dir="$checkpoint" >"$results/init_checkpoint.txt" 2>&1; then
    timeout 300 tools/bench_serve --checkpoint_dir="$checkpoint" --device=cuda --precision=bf16-true \
      --concurrency=1,16,64 --prompt_tokens=128 --new_tokens=128 --pool_mb=8192 \
      --kv_pool_dtype=model >"$results/bench_serve.txt" 2>&1
    grep -E '^(kv_pool|concurrency| *[0-9]+ )' "$results/bench_serve.txt" || tail -5 "$results/bench_serve.txt"
    if [ "${LGPT_GPU_CAPACITY:-0}" = 1 ]; then
      echo "== requests held in a 1 GiB pool at 8k context (peak_decoding, mean_batch)"
      for kind in "16 model dense" "32 int8 dense" "48 int4 dense" "64 model sink" "240 int4 sink"; do
        read -r count entries policy <<<"$kind"
        cache=(); [ "$policy" = sink ] && cache=(--kv_cache=sink --kv_budget=1024)
        echo "-- $policy ${cache[*]} --kv_pool_dtype=$entries, $count requests"
        timeout 150 tools/bench_serve --checkpoint_dir="$checkpoint" --device=cuda \
          --precision=bf16-true --concurrency="$count" --prompt_tokens=8184 --new_tokens=8 \
          --pool_mb=1024 --kv_pool_dtype="$entries" --max_running=512 --prefill_chunk=2048 \
          --step_prefill_tokens=8192 --warmup=false "${cache[@]}" \
          >"$results/capacity_${policy}_$entries.txt" 2>&1
        grep -E '^(kv_pool| *[0-9]+ )' "$results/capacity_${policy}_$entries.txt" ||
          tail -3 "$results/capacity_${policy}_$entries.txt"
      done
    fi
  else
    tail -5 "$results/init_checkpoint.txt"
  fi
  rm -rf "$checkpoint"
fi

echo "== summary: tests passed $passed, failed $failed, skipped $skipped${broken:+ (failed: ${broken[*]})}"
[ "$failed" -eq 0 ]
