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
grep -q '^//core:config$' tests/attention_deps || { echo "FAIL: attention_deps looks wrong"; fail=1; }
exit $fail
