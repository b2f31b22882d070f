#!/usr/bin/env bash
# Builds lgpt's GPU check here, with --config=cuda, and packs it into OUT_DIR for a machine
# with a GPU and PyTorch 2.11 (CUDA 13.0) but no Bazel: the GPU test binaries, the GPU
# benchmarks, the non-LibTorch shared libraries they load, the test data they read and
# run.sh, which runs them there against that machine's own torch libraries and prints one
# summary. The pack is at most 60 MiB (it travels with the 18 MiB working tree under a 64 MiB
# limit): binaries and libraries stripped, then compressed.
#
#   tools/gpu/pack.sh OUT_DIR          # here
#   bash OUT_DIR/run.sh [RESULTS_DIR]  # on the GPU machine, from any directory
set -euo pipefail
[ "$#" -eq 1 ] || { echo "usage: tools/gpu/pack.sh OUT_DIR" >&2; exit 2; }
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
mkdir -p "$1"
OUT="$(cd "$1" && pwd)"
cd "$ROOT"

# Tests that need a GPU or check the CUDA build, then benchmarks and the tools of the serving
# runs; each runs with LGPT_DEVICE=cuda there.
TESTS=(
  //core/ops:cuda_build_test
  //core/ops:kv_slot_write_test
  //core/ops:paged_attention_test
  //core/ops:block_quant_device_test
  //core/model:quantize_model_test
  //core/model:sampling_test
  //core/model:next_token_test
  //core/ops:row_sampler_test
  //cache:paged_kv_cache_test
  //cache:routing_kv_cache_test
  //cache:scored_paged_kv_cache_test
  //core/base:device_test
  //core/base:device_memory_test
  //tests:golden_test
  //tests:serving_device_test
  //tools:tools_device_test
)
BENCHMARKS=(
  //core/ops:kv_slot_write_benchmark
  //core/ops:paged_attention_benchmark
  //core/ops:block_quant_device_benchmark
  //core/model:gpt_benchmark
  //core/model:sampling_benchmark
)
# Tools that tools_device_test runs and the serving runs use, at tools/NAME in the pack (where
# the test finds them, as in its runfiles).
TOOLS=(
  //tools:bench_serve
  //tools:eval_cache
  //tools:finetune
  //tools:generate
  //tools:init_checkpoint
  //tools:perplexity
  //tools:pretrain
  //tools:score
)
DATA=(tests/testdata/golden tests/testdata/golden_extra tools/default_model
  tools/eval_data/kjv_heldout.txt)
MAX_MIB=60

./lgpt setup --cuda
bazel build --config=cuda --ui_event_filters=-info,-debug,-stdout --noshow_progress \
  "${TESTS[@]}" "${BENCHMARKS[@]}" "${TOOLS[@]}"
torch_home="$(bazel info --config=cuda output_base)/external/libtorch"
torch_lib="$(sed -n 's|^LIBTORCH_LIBDIR = .\(.*\).$|\1|p' "$torch_home/build_defs.bzl")"

staging="$(mktemp -d)"
trap 'rm -rf "$staging"' EXIT
mkdir -p "$staging/check/bin" "$staging/check/lib" "$staging/check/tools"
binary_path() { local label="${1#//}"; echo "bazel-bin/${label/://}"; }
for label in "${TESTS[@]}" "${BENCHMARKS[@]}"; do
  path="$(binary_path "$label")"
  strip --strip-unneeded -o "$staging/check/bin/$(basename "$path")" "$path"
done
for label in "${TOOLS[@]}"; do
  path="$(binary_path "$label")"
  strip --strip-unneeded -o "$staging/check/tools/$(basename "$path")" "$path"
done

# Shared libraries the binaries load, less those the GPU machine's torch provides (torch/lib
# and the nvidia wheels) and the C and C++ runtimes of its own system.
runtime_dirs="$torch_lib"
for d in "$torch_lib"/../../nvidia/*/lib; do runtime_dirs="$runtime_dirs:$d"; done
for binary in "${TESTS[@]}" "${BENCHMARKS[@]}" "${TOOLS[@]}"; do
  LD_LIBRARY_PATH="$runtime_dirs" ldd "$(binary_path "$binary")"
done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
  case "$lib" in
    "$torch_lib"/* | */nvidia/*) continue ;;
  esac
  case "$(basename "$lib")" in
    libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux* | \
      libstdc++.so.* | libgcc_s.so.* | libgomp.so.* | libresolv.so.*) continue ;;
  esac
  strip --strip-unneeded -o "$staging/check/lib/$(basename "$lib")" "$lib"
done
for d in "${DATA[@]}"; do
  mkdir -p "$staging/check/$(dirname "$d")"
  cp -r "$d" "$staging/check/$d"
done
mkdir -p "$staging/check/tools/gpu"
cp tools/gpu/run_checks.sh "$staging/check/tools/gpu/"
printf '%s\n' "${TESTS[@]}" >"$staging/check/tests.txt"
git rev-parse HEAD >"$staging/check/commit.txt" 2>/dev/null || true

tar -C "$staging" -cf - check | xz -T2 -6 >"$staging/check.tar.xz"
size=$(stat -c %s "$staging/check.tar.xz")
if [ "$size" -gt $((MAX_MIB << 20)) ]; then
  echo "pack.sh: the pack is $((size >> 20)) MiB, over its $MAX_MIB MiB limit" >&2
  exit 1
fi
# The pack goes in under its final names only when complete.
cp tools/gpu/run.sh "$staging/run.sh"
mv "$staging/check.tar.xz" "$OUT/check.tar.xz"
mv "$staging/run.sh" "$OUT/run.sh"
echo "pack.sh: $OUT: check.tar.xz $((size >> 20)) MiB ($(ls "$staging/check/bin" | wc -l) tests and benchmarks, ${#TOOLS[@]} tools, $(ls "$staging/check/lib" | wc -l) libraries); run: bash $OUT/run.sh" >&2
