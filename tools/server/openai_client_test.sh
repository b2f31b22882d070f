#!/usr/bin/env bash
# The official openai npm package (tools/server/node, installed by ./lgpt setup) against
# //tools:serve on loopback: see node/openai_client_test.mjs. Fails, never skips, when Node or
# the package is missing.
set -uo pipefail
dir=tools/server/node
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v node >/dev/null || fail "node is not installed: run ./lgpt setup"
[ -f "$dir/node_modules/openai/package.json" ] ||
  fail "the openai npm package is missing ($dir/node_modules): run ./lgpt setup"

log="${TEST_TMPDIR:-/tmp}/serve.log"
key=sk-lgpt-openai-client-test
tools/serve --port=0 --api_key="$key" >/dev/null 2>"$log" &
pid=$!
port=""
for _ in $(seq 1 600); do
  port="$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\) .*|\1|p' "$log")"
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; fail "serve exited before listening"; }
  sleep 0.1
done
[ -n "$port" ] || { kill -9 "$pid"; cat "$log" >&2; fail "serve did not listen within 60 s"; }

timeout 120 node --preserve-symlinks --preserve-symlinks-main "$dir/openai_client_test.mjs" \
  "$port" "$key"
status=$?
kill -TERM "$pid"
wait "$pid"
server_status=$?
[ "$server_status" -eq 0 ] || { cat "$log" >&2; fail "serve exited $server_status after SIGTERM"; }
[ "$status" -eq 0 ] || { cat "$log" >&2; fail "the openai client checks failed"; }
echo PASS
