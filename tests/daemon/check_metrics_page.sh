#!/usr/bin/env bash
# The page `car metrics` prints from a real car-inferenced, after loads, inferences (a dense and an MoE model
# with streamed experts), a miss and an eviction, checked by `promtool check metrics` (the Prometheus text
# format and its naming lints) and for the series docs/metrics.md promises.
# Usage: check_metrics_page.sh CAR CAR_INFERENCED PROMTOOL
set -euo pipefail
car=$1 daemon_bin=$2 promtool=$3
dir=$(mktemp -d /tmp/car-metrics-test.XXXXXX)
daemon=
cleanup() {
  if [ -n "$daemon" ]; then kill -TERM "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT
mkdir -p "$dir/models" "$dir/state"
synth=(gguf synth --arch llama --layers 2 --embd 64 --ff 128 --heads 4 --kv-heads 2 --vocab 300)
"$car" "${synth[@]}" --seed 1 -o "$dir/models/dense.gguf" >/dev/null
"$car" "${synth[@]}" --experts 4 --seed 2 -o "$dir/models/moe.gguf" >/dev/null
sock="$dir/d.sock"
"$daemon_bin" --socket "$sock" --models-dir "$dir/models" --state-dir "$dir/state" --stream-experts on \
  2>"$dir/daemon.log" &
daemon=$!
for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
c() { "$car" "$@" --socket "$sock"; }
c infer dense "hello" -n 4 --temperature 0 >/dev/null 2>&1
c infer moe "hello" -n 4 --temperature 0 >/dev/null 2>&1
c infer moe "again" -n 2 --temperature 0 >/dev/null 2>&1
c invalidate dense >/dev/null
if c infer nosuch "x" -n 1 >/dev/null 2>&1; then echo "FAIL: an unknown model was served" >&2; exit 1; fi
c metrics >"$dir/page.txt"
[ -n "${CAR_METRICS_PAGE_OUT:-}" ] && cp "$dir/page.txt" "$CAR_METRICS_PAGE_OUT"

status=0
if ! "$promtool" check metrics <"$dir/page.txt"; then
  echo "FAIL: promtool check metrics rejected the page:" >&2
  cat "$dir/page.txt" >&2
  status=1
fi
expect() {  # a line of the page, exactly
  if ! grep -qxF -- "$1" "$dir/page.txt"; then echo "FAIL: no line '$1'" >&2; status=1; fi
}
expect_re() {  # a line matching an extended regex
  if ! grep -qxE -- "$1" "$dir/page.txt"; then echo "FAIL: no line matching '$1'" >&2; status=1; fi
}
expect 'car_inference_requests_total{op="infer",outcome="ok"} 3'
expect 'car_inference_requests_total{op="infer",outcome="not_found"} 1'
expect 'car_inference_requests_total{op="invalidate",outcome="ok"} 1'
expect 'car_inference_cache_evictions_total{cause="invalidate"} 1'
expect 'car_inference_cache_eviction_age_seconds_count{cause="invalidate"} 1'
expect 'car_inference_cache_entries 1'
expect 'car_inference_cache_loads_total 2'
expect 'car_inference_cache_hits_total 1'
expect 'car_inference_prompt_seconds_count 3'
expect_re 'car_inference_completion_tokens_total [1-9][0-9]*'
expect 'car_inference_model_load_seconds_count 2'
expect 'car_inference_request_queue_wait_seconds_count 3'
expect_re 'car_inference_expert_cache_misses_total\{model="moe"\} [1-9][0-9]*'
expect_re 'car_inference_expert_read_bytes_total\{model="moe"\} [1-9][0-9]*'
expect_re 'car_inference_decode_seconds_per_token_bucket\{le="\+Inf"\} [1-3]'
# The MoE model's idle sequences keep their prefixes: KV pages held, within its pool.
expect_re 'car_inference_model_kv_bytes_resident\{model="moe"\} [1-9][0-9.e+]*'
expect_re 'car_inference_model_kv_tokens_capacity\{model="moe"\} [1-9][0-9.e+]*'
# The process families of every Prometheus client, and what runs.
expect_re 'process_cpu_seconds_total [0-9.e+-]+'
expect_re 'process_resident_memory_bytes [1-9][0-9.e+]*'
expect_re 'process_open_fds [1-9][0-9]*'
expect_re 'process_threads [1-9][0-9]*'
expect_re 'process_start_time_seconds 1[0-9]{9}(\.[0-9]+)?(e\+[0-9]+)?'
expect_re 'car_inference_build_info\{version="[^"]+",commit="[^"]+",isa="(scalar|avx2|avx512)"\} 1'
[ "$status" -eq 0 ] && echo "metrics page OK ($(grep -vc '^#' "$dir/page.txt") samples)"
exit "$status"
