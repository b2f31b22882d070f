#!/usr/bin/env bash
# No target of a lower layer depends on a higher one: core <- cache <- attention <- model.
set -euo pipefail
fail=0
check() {  # check FILE FORBIDDEN_PATTERN
  if grep -E "$2" "$1"; then
    echo "FAIL: $1 depends on a higher layer (above)"; fail=1
  fi
  [ -s "$1" ] || { echo "FAIL: $1 is empty"; fail=1; }
}
check tests/core_deps '^//(cache|attention|peft|tools|core/model)[:/]'
check tests/cache_deps '^//(attention|peft|tools|core/model)[:/]'
check tests/attention_deps '^//(peft|tools|core/model)[:/]'
check tests/peft_deps '^//tools[:/]'
# PEFT composes the base model's own attention and cache targets.
for needed in //attention:causal_self_attention //cache:kv_cache //core/model:gpt; do
  grep -qx "$needed" tests/peft_deps || { echo "FAIL: peft does not reach $needed"; fail=1; }
done
grep -q '^//core:config$' tests/attention_deps || { echo "FAIL: attention_deps looks wrong"; fail=1; }
exit $fail
