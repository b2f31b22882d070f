#!/usr/bin/env bash
# ./lgpt's command line: help lists every tool with one line and exits 0, an unknown command
# is one message and exit 1, and the README still opens with the two commands.
set -uo pipefail
# The script beside the README the runfiles link to (a Bazel rule shares the name //:lgpt).
lgpt="$(dirname "$(readlink -f README.md)")/lgpt"
[ -x "$lgpt" ] || { echo "FAIL: no executable $lgpt" >&2; exit 1; }
fail() { echo "FAIL: $*" >&2; exit 1; }

out="$($lgpt help)" || fail "./lgpt help exited $?"
for tool in generate chat score tokenize convert_hf convert_lit pretrain finetune merge_lora serve \
    eval_cache perplexity; do
  echo "$out" | grep -Eq "^  $tool +[a-zA-Z]" || fail "./lgpt help does not list $tool: $out"
done
for command in test setup bazel help; do
  echo "$out" | grep -Eq "^  $command" || fail "./lgpt help does not list $command"
done
echo "$out" | grep -q "set -euo" && fail "./lgpt help prints the script's source"
[ "$($lgpt --help)" = "$out" ] || fail "./lgpt --help differs from ./lgpt help"
$lgpt --help >/dev/null || fail "./lgpt --help exited $?"

err="$($lgpt no_such_command 2>&1 >/dev/null)"
status=$?
[ "$status" -eq 1 ] || fail "unknown command exited $status"
echo "$err" | grep -q "unknown command 'no_such_command'" || fail "message: $err"
[ "$(echo "$err" | wc -l)" -eq 1 ] || fail "more than one line: $err"

head -5 README.md | grep -q '^./lgpt generate --prompt=' || fail "README does not open with ./lgpt generate"
head -6 README.md | grep -q '^./lgpt test$' || fail "README does not open with ./lgpt test"
echo PASS
