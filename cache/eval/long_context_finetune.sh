#!/usr/bin/env bash
# Cache-aware fine-tuning, shown on a model with a 2048-token context (cache/eval/RESULTS.md,
# "Cache-aware fine-tuning"): pretrain lgpt-kjv-3m's architecture at block size 2048 on the KJV,
# fine-tune LoRA on ~1,700-token passages with h2o@256 in place and, for comparison, without the
# cache, then evaluate every model with and without the cache: the fine-tune task's validation
# loss (response tokens, far past the cache) through dense, h2o@256 and h2o@64, and eval_cache's
# perplexity of the held-out text on 2048-token segments through dense and h2o@256.
# Usage: cache/eval/long_context_finetune.sh WORK_DIR [pretrain_steps] [finetune_steps]
# Needs the bible-kjv package; run from the repository root. About an hour on 2 cores, most of
# it the pretraining (RESULTS.md used the step-300 checkpoint of a 700-step schedule:
# pretrain_steps=700 with --save_every=100, stopped after step 300).
set -euo pipefail
work=$1
pretrain_steps=${2:-300}
finetune_steps=${3:-30}
mkdir -p "$work"
root=$(pwd)
bazel build //tools:pretrain //tools:finetune //tools:eval_cache //tools:merge_lora
bin=$root/bazel-bin/tools

[ -s "$work/kjv.txt" ] ||
  bible -f Gen1:1-Rev22:21 | sed -E 's/^[0-9A-Za-z]+[0-9]+:[0-9]+ //' >"$work/kjv.txt"
tail -n 933 "$work/kjv.txt" >"$work/kjv_heldout.txt"
sed 's/^block_size: 256/block_size: 2048/; s/^name: lgpt-kjv-3m/name: lgpt-kjv-3m-ctx2048/' \
  tools/default_model/train_config.yaml >"$work/ctx2048.yaml"

if [ ! -s "$work/base/model.safetensors" ]; then
  "$bin/pretrain" --model_config="$work/ctx2048.yaml" --text_file="$work/kjv.txt" \
    --tokenizer_dir=tools/default_model --out_dir="$work/base" --max_steps="$pretrain_steps" \
    --seq_len=2048 --micro_batch=1 --warmup_steps=50 --lr=3e-3 --min_lr=3e-4 \
    --eval_every=100 --save_every=100
fi

python3 tools/finetune_data/make_kjv_long.py "$work/kjv.txt" "$work/long.json" 200
tune() {  # name, extra flags
  local name=$1
  shift
  [ -s "$work/$name/lit_model.pth.lora" ] && return 0
  "$bin/finetune" --method=lora --checkpoint_dir="$work/base" --data="$work/long.json" \
    --out_dir="$work/$name" --max_seq_length=2048 --max_steps="$finetune_steps" \
    --micro_batch_size=1 --global_batch_size=2 --lr=2e-3 --min_lr=2e-4 --warmup_steps=3 \
    --lora_r=16 --lora_alpha=32 --lora_query --lora_key --lora_value --lora_projection \
    --lora_mlp --lora_dropout=0 --val_split_fraction=0.05 --eval_interval=10 --eval_iters=4 \
    --log_interval=1 "$@" >"$work/$name.log" 2>&1
  "$bin/merge_lora" --checkpoint_dir="$work/$name" --pretrained_checkpoint_dir="$work/base" \
    --out_dir="$work/merged_$name"
  cp "$work"/base/tokenizer* "$work/merged_$name/"
}
tune tuned_h2o --kv_cache=h2o --kv_budget=256 --chunk_size=128
tune tuned_plain

# The task's validation loss (the same 10 held-out examples: finetune's split by seed) with
# and without the cache in place: finetune's initial validation, then one step at lr 0.
for model in base merged_tuned_h2o merged_tuned_plain; do
  for cache in dense h2o@256 h2o@64; do
    flags=()
    [ "$cache" != dense ] && flags=(--kv_cache=h2o --kv_budget="${cache#h2o@}" --chunk_size=128)
    loss=$("$bin/finetune" --method=lora --checkpoint_dir="$work/$model" --data="$work/long.json" \
      --out_dir="$work/val_$model" --max_seq_length=2048 --max_steps=1 --micro_batch_size=1 \
      --global_batch_size=1 --lr=0 --min_lr=0 --warmup_steps=0 --val_split_fraction=0.05 \
      --eval_interval=1000 --eval_iters=10 "${flags[@]}" 2>&1 | grep -o 'initial_val_loss=[0-9.]*')
    echo "$model $cache $loss"
  done
done

for model in base merged_tuned_h2o merged_tuned_plain; do
  "$bin/eval_cache" --checkpoint_dir="$work/$model" --text_file="$work/kjv_heldout.txt" \
    --lines_bos_eos --segment=2048 --chunk=128 --policies=dense,h2o --budgets=256 --bits=16 \
    --out_dir="$work/eval_$model" 2>&1 | grep -E '^\[[0-9]'
done
