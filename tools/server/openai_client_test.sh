#!/usr/bin/env bash
# The official openai Python package (pinned by python/requirements.txt, installed by ./lgpt
# setup into python/site-packages) against //tools:serve on loopback: see
# python/openai_client_test.py. Fails, never skips, when Python or the package is missing.
set -uo pipefail
dir=tools/server/python
fail() { echo "FAIL: $*" >&2; exit 1; }
python=/usr/bin/python3
[ -x "$python" ] || fail "$python is not installed: run ./lgpt setup"
[ -f "$dir/site-packages/openai/__init__.py" ] ||
  fail "the openai Python package is missing ($dir/site-packages): run ./lgpt setup"

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

PYTHONPATH="$dir/site-packages" PYTHONDONTWRITEBYTECODE=1 timeout 120 "$python" \
  "$dir/openai_client_test.py" "$port" "$key"
status=$?
kill -TERM "$pid"
wait "$pid"
server_status=$?
[ "$server_status" -eq 0 ] || { cat "$log" >&2; fail "serve exited $server_status after SIGTERM"; }
[ "$status" -eq 0 ] || { cat "$log" >&2; fail "the openai client checks failed"; }
echo PASS
