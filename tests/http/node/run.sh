#!/usr/bin/env bash
# tests/http/node/run.sh CAR_INFERENCED CAR: the HTTP front end to end with the official `openai` and `ollama`
# npm clients.
# Installs the pinned client (npm ci, package-lock.json), writes the models (the conformance model
# stories260K from CAR_CONFORMANCE_DIR / ../shared/conformance when there, else a synthetic one; and a
# synthetic model with a ChatML template for chat), starts car-inferenced with --http 127.0.0.1:0 and an
# API key, reads the port it bound from its log, and runs openai.test.mjs and ollama.test.mjs against it.
set -euo pipefail
daemon=$(realpath "$1")
car=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
if [ ! -d node_modules/openai ] || [ ! -d node_modules/ollama ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund --ignore-scripts >/dev/null
fi
tmp=$(mktemp -d)
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  if [ "${KEEP_TMP:-0}" = 1 ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
mkdir -p "$tmp/models" "$tmp/state"
conformance=${CAR_CONFORMANCE_DIR:-$here/../../../../shared/conformance}
if [ -f "$conformance/models/stories260K.gguf" ]; then
  cp "$conformance/models/stories260K.gguf" "$tmp/models/text.gguf"
else
  "$car" gguf synth -o "$tmp/models/text.gguf" --arch llama --seed 7 >/dev/null
fi
"$car" gguf synth -o "$tmp/models/slow.gguf" --arch llama --seed 3 --layers 8 --embd 512 --ff 1024 --ctx 4096 >/dev/null
"$car" gguf synth -o "$tmp/models/chatty.gguf" --arch llama --seed 11 --chat-template "$here/chatml.jinja" >/dev/null
key="test-key-$RANDOM$RANDOM"
printf '%s\n' "$key" >"$tmp/key"
"$daemon" --socket "$tmp/car.sock" --models-dir "$tmp/models" --state-dir "$tmp/state" --http 127.0.0.1:0 \
  --http-api-key-file "$tmp/key" --threads 1 --log-level info >"$tmp/daemon.log" 2>&1 &
pid=$!
port=""
for _ in $(seq 1 200); do
  port=$(sed -n 's/.*http: listening on 127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' "$tmp/daemon.log" | head -n1)
  [ -n "$port" ] && grep -q "car-inferenced ready" "$tmp/daemon.log" && break
  kill -0 "$pid" 2>/dev/null || { cat "$tmp/daemon.log" >&2; exit 1; }
  sleep 0.05
done
[ -n "$port" ] || { echo "run.sh: the daemon did not report its HTTP port" >&2; cat "$tmp/daemon.log" >&2; exit 1; }
status=0
CAR_HTTP_BASE="http://127.0.0.1:$port/v1" CAR_HTTP_KEY="$key" CAR_BIN="$car" CAR_MODELS="$tmp/models" \
  CAR_DAEMON_LOG="$tmp/daemon.log" CAR_SOCKET="$tmp/car.sock" node --test --test-reporter=spec openai.test.mjs || status=$?
# The Ollama API with the `ollama` client, after the OpenAI tests (one file at a time: both read the log).
CAR_HTTP_BASE="http://127.0.0.1:$port/v1" CAR_HTTP_KEY="$key" CAR_BIN="$car" CAR_MODELS="$tmp/models" \
  CAR_DAEMON_LOG="$tmp/daemon.log" CAR_SOCKET="$tmp/car.sock" node --test --test-reporter=spec ollama.test.mjs || status=$?
if [ "$status" -ne 0 ]; then echo "--- daemon log ---" >&2; tail -n 60 "$tmp/daemon.log" >&2; fi
exit "$status"
