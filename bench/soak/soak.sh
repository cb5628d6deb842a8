#!/usr/bin/env bash
# Soak car-inferenced: write three synthetic models with `car gguf synth`, start the real daemon on them
# with a cache budget that holds two of the three (so load/invalidate/infer churn evicts), run
# soak_client.py (64 clients x 10,000 mixed requests by default, among them chat requests with templates
# in the request, some hostile and expecting bad_request or a prompt cancel), and report errors (must be 0
# besides `busy`), p50/p99 per op, the daemon's RSS before and after and its peak, and whether it stayed up.
#
#   bench/soak/soak.sh [--clients N] [--requests N] [--max-seconds S] [...soak_client.py options]
#   BUILD=build (where car and car-inferenced are)   KEEP=1 (keep the work directory)
# Exit status: 0 when there were no errors and the daemon exited cleanly on SIGTERM.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${BUILD:-$here/../../build}
car=$build/tools/car
daemon=$build/daemon/car-inferenced
for b in "$car" "$daemon"; do [[ -x $b ]] || { echo "$0: $b not built" >&2; exit 2; }; done
command -v python3 >/dev/null || { echo "$0: python3 is needed for the client" >&2; exit 2; }

work=$(mktemp -d /tmp/car-soak.XXXXXX)
pid=
cleanup() {
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  [[ ${KEEP:-0} == 1 ]] && echo "work directory: $work" || rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/models" "$work/state"

# Three small llama models (13.1 MiB charged each: 3.9 MB of f32 weights, a KV pool of 8 MiB - the whole
# 1024-token context of each of the 8 sequences set below, 1 KiB a position - and scratch for 256-token batches), so a
# request costs milliseconds and the soak measures the serving path; the default budget of 27 MiB holds two.
for i in 1 2 3; do
  "$car" gguf synth -o "$work/models/m$i.gguf" --arch llama --layers 4 --embd 128 --ff 384 --heads 4 \
    --kv-heads 2 --vocab 512 --ctx 1024 --seed "$i" >/dev/null
done

sock=$work/d.sock
CAR_INFERENCE_SOCKET=$sock CAR_INFERENCE_MODELS_DIR=$work/models CAR_INFERENCE_STATE_DIR=$work/state \
  CAR_INFERENCE_MODEL_CACHE_MB=${CACHE_MB:-27} CAR_INFERENCE_MODEL_IDLE_SECS=0 CAR_INFERENCE_THREADS=1 \
  CAR_INFERENCE_PARALLEL=8 \
  CAR_INFERENCE_WORKERS=${WORKERS:-2} CAR_INFERENCE_QUEUE_DEPTH=${QUEUE_DEPTH:-64} CAR_INFERENCE_LOG_LEVEL=warn \
  "$daemon" >"$work/daemon.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.1; done
[[ -S $sock ]] || { echo "$0: daemon did not start:" >&2; cat "$work/daemon.log" >&2; exit 1; }

rss() { awk -v k="$1:" '$1 == k { print $2 }' "/proc/$pid/status"; }
sizes=$("$car" load --socket "$sock" --json m1 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["result"]["size_bytes"])' || echo "?")
rss_before=$(rss VmRSS)
echo "daemon pid $pid, budget ${CACHE_MB:-27} MiB, each model charged $sizes bytes, RSS before ${rss_before} kB"

status=0
python3 "$here/soak_client.py" --socket "$sock" --models m1,m2,m3 "$@" || status=$?

rss_after=$(rss VmRSS)
rss_peak=$(rss VmHWM)
echo "daemon RSS before ${rss_before} kB, after ${rss_after} kB, peak ${rss_peak} kB"
kill -0 "$pid" 2>/dev/null || { echo "the daemon died during the soak:" >&2; tail -20 "$work/daemon.log" >&2; exit 1; }
kill -TERM "$pid"
code=0
wait "$pid" || code=$?
pid=
echo "daemon exit code on SIGTERM: $code; log lines at warn or above: $(wc -l <"$work/daemon.log")"
grep -m5 -iE "error|critical" "$work/daemon.log" >&2 || true
[[ $code == 0 ]] || status=1
exit $status
