#!/bin/bash
# Float32 decode of the 110M Llama (n_layer 12, n_embd 768, n_head 12, intermediate 2048,
# vocab 32000, tied head) in lgpt and in llama2.c's run.c, interleaved round by round on the
# same machine, with the same weights geometry and the same mean context:
#   llama2.c generating 256 tokens (mean context 128)  vs  lgpt decode at 128 cached entries
#   llama2.c generating 1024 tokens (mean context 512) vs  lgpt decode at 512 cached entries
# Both read every weight once per token; the weights' values do not matter for speed (the
# pattern here makes llama2.c sample, plain multinomial, since greedy would stop at once).
#
#   tools/bench/llama2c_side_by_side.sh /path/to/llama2.c [rounds]
#
# llama2.c is not part of lgpt: bring your own checkout (github.com/karpathy/llama2.c).
set -euo pipefail
l2c=$(realpath "${1:?usage: $0 LLAMA2C_DIR [rounds]}")
rounds=${2:-6}
threads=${THREADS:-2}
work=${TMPDIR:-/tmp}/lgpt_llama2c_bench
mkdir -p "$work"
[ -f "$l2c/run.c" ] || { echo "error: $l2c/run.c not found" >&2; exit 1; }
gcc -Ofast -fopenmp -march=native "$l2c/run.c" -lm -o "$work/runomp"
if [ ! -f "$work/m110.bin" ]; then
  python3 - "$work" <<'PY'
import array, struct, sys
work = sys.argv[1]
dim, hidden, layers, heads, kv_heads, vocab, seq = 768, 2048, 12, 12, 12, 32000, 1024
tile = array.array("f", [0.02 * ((i * 7919) % 13 - 6) / 6 for i in range(1 << 16)])
def write(f, n):
    while n > 0:
        chunk = tile if n >= len(tile) else tile[:n]
        chunk.tofile(f)
        n -= len(chunk)
hs = dim // heads
with open(work + "/m110.bin", "wb") as f:
    f.write(struct.pack("7i", dim, hidden, layers, heads, kv_heads, vocab, seq))
    for n in [vocab * dim, layers * dim, layers * dim * dim, layers * dim * dim,
              layers * dim * dim, layers * dim * dim, layers * dim, layers * dim * hidden,
              layers * hidden * dim, layers * dim * hidden, dim, seq * hs // 2, seq * hs // 2]:
        write(f, n)
with open(work + "/tok.bin", "wb") as f:
    f.write(struct.pack("i", 16))
    for i in range(vocab):
        s = ("<s>" if i == 1 else "t%d" % i).encode()
        f.write(struct.pack("fi", 0.0, len(s)))
        f.write(s)
PY
fi
cd "$(dirname "$0")/../.."
bazel build -c opt //core/model:gpt_benchmark >&2
bench=$(bazel info -c opt bazel-bin 2>/dev/null | tail -n 1)/core/model/gpt_benchmark
llama2c() {
  OMP_NUM_THREADS=$threads "$work/runomp" "$work/m110.bin" -z "$work/tok.bin" -t 1 -p 1 -s 1 -n "$1" -i "" 2>&1 |
    grep -o 'achieved tok/s: [0-9.]*' | awk '{print $3}'
}
lgpt() {
  OMP_WAIT_POLICY=passive "$bench" --threads=$threads --benchmark_min_time=3 \
    --benchmark_filter="Decode/llama-110m/$1/" 2>&1 | grep -o 'tokens_per_s=[0-9.]*' | cut -d= -f2
}
median() { sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
: >"$work/results.txt"
for i in $(seq "$rounds"); do
  a=$(llama2c 256); b=$(lgpt 128); c=$(llama2c 1024); d=$(lgpt 512)
  echo "round $i: llama2.c n=256 $a | lgpt @128 $b | llama2.c n=1024 $c | lgpt @512 $d" >&2
  echo "$a $b $c $d" >>"$work/results.txt"
done
for col in 1 2 3 4; do
  name=("" "llama2.c, 256 tokens (mean context 128)" "lgpt, 128 cached entries"
        "llama2.c, 1024 tokens (mean context 512)" "lgpt, 512 cached entries")
  printf '%-42s median %6.1f tok/s over %d rounds\n' "${name[$col]}" \
    "$(awk -v c=$col '{print $c}' "$work/results.txt" | median)" "$rounds"
done
