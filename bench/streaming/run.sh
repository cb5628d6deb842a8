#!/usr/bin/env bash
# The expert streamer's benchmark: decode of a ~6 GB llama MoE (24 layers, n_embd 2048, 32
# experts of n_ff 2048, 4 used, Q4_K_M, vocab 32000) inside a cgroup v1 memory group capped at 2.5 GB,
# against the disk's own parallel read rate measured in the same run. Prints markdown tables.
#
#   sudo bench/streaming/run.sh            (root: cgroups and drop_caches)
#
# What it does, in order (each decode run preceded by `sync; echo 3 > /proc/sys/vm/drop_caches`):
#   1. writes the model with `car gguf synth` once, cached in $WORK;
#   2. capped at $CAP_GB: the streamed run (budget $EXPERT_RAM_GB, prefetch on and off), then the
#      memory-mapped run (--stream-experts off; it is slow, so fewer tokens and a timeout);
#   3. uncapped: the budget sweep (10 % .. 100 % of the expert bytes, with and without prefetch);
#   4. uncapped: `car bench` streamed with a budget holding every expert vs resident.
# Decode runs are `car run --json --prompt-ids <16 ids> -n 32 --threads 2 --temperature 0`. The experts
# counters cover the whole run (prefill too), so each configuration runs a second time with -n 1, and the
# decode figures are the differences: bytes read per decoded token = (bytes(n=32) - bytes(n=1)) / 31 (the
# first token comes from the prompt pass), decode hit rate the same way. Disk rate: disk_read (O_DIRECT,
# queue depth 8, expert-sized reads, 5 s) just before each streamed run. Disk-bound limit: disk GB/s /
# bytes read per decoded token; "of limit" = measured decode tok/s over it.
#
# Environment: CAR (default build/tools/car), DISK_READ (build/bench/streaming/disk_read), WORK
# (/var/tmp/car-bench: the model and results), CAP_GB (2.5), EXPERT_RAM_GB (2.0: the capped runs'
# budget; `auto` = none forced, the streamer sizes it from the cgroup's limit), THREADS (2), N (32), MMAP_N (4), MMAP_TIMEOUT (600 s), RUN_TIMEOUT (900 s per run),
# BUDGETS ("10 20 30 40 50 60 70 80 90 100", % of expert bytes; empty = skip the sweep), COMPARE (1 = run
# step 4), BENCH_REPS (3).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
car=${CAR:-$here/../../build/tools/car}
disk_read=${DISK_READ:-$here/../../build/bench/streaming/disk_read}
work=${WORK:-/var/tmp/car-bench}
cap_gb=${CAP_GB:-2.5}
expert_ram_gb=${EXPERT_RAM_GB:-2.0}
threads=${THREADS:-2}
n=${N:-32}
mmap_n=${MMAP_N:-4}
mmap_timeout=${MMAP_TIMEOUT:-600}
run_timeout=${RUN_TIMEOUT:-900}
budgets=${BUDGETS-10 20 30 40 50 60 70 80 90 100}
compare=${COMPARE:-1}
bench_reps=${BENCH_REPS:-3}
prompt_ids=1,450,1203,877,3301,29,15000,642,9001,318,2750,77,12345,560,4096,31000  # 16 ids, BOS first

die() { echo "$0: $*" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || die "needs root (memory cgroup, drop_caches)"
command -v jq >/dev/null || die "needs jq"
[[ -x $car ]] || die "no car binary at $car (set CAR=...)"
[[ -x $disk_read ]] || die "no disk_read at $disk_read (build the disk_read target; set DISK_READ=...)"
cgroot=/sys/fs/cgroup/memory
[[ -w $cgroot/cgroup.procs ]] || die "no writable cgroup v1 memory controller at $cgroot"
mkdir -p "$work"
out=$work/results-$(date -u +%Y%m%dT%H%M%S)
mkdir -p "$out"
model=$work/moe-L24-E32x4-D2048-q4km.gguf

# ---- cgroup handling: one group per capped run, removed after it and on any exit -------------------------
cg=""
cleanup_cg() {
  [[ -n $cg && -d $cg ]] || return 0
  # Anything still in the group (a run killed by timeout leaves none, but be sure) is killed first.
  local pid
  for pid in $(cat "$cg/cgroup.procs" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  for _ in 1 2 3 4 5 6 7 8 9 10; do [[ -z $(cat "$cg/cgroup.procs" 2>/dev/null) ]] && break; sleep 0.5; done
  rmdir "$cg" 2>/dev/null || echo "$0: warning: could not remove $cg" >&2
  cg=""
}
trap cleanup_cg EXIT
trap 'exit 130' INT TERM

drop_caches() {
  sync
  echo 3 >/proc/sys/vm/drop_caches
}

# run_one NAME CAPPED(0|1) TIMEOUT CMD...: drop caches, run CMD (under a fresh capped group when CAPPED=1)
# with its stdout in $out/NAME.json; writes $out/NAME.mem (cgroup max usage, failcnt, oom kills, process
# peak RSS, exit status, seconds).
run_one() {
  local name=$1 capped=$2 tmo=$3
  shift 3
  drop_caches
  local status=0 t0 t1
  t0=$(date +%s.%N)
  if [[ $capped == 1 ]]; then
    cg=$cgroot/car-bench-$$-$name
    mkdir "$cg"
    echo "$(awk -v g="$cap_gb" 'BEGIN { printf "%.0f", g * 1e9 }')" >"$cg/memory.limit_in_bytes"
    # The child joins the group, then execs the command: everything it starts is capped.
    sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$cg" \
      timeout -s KILL "$tmo" /usr/bin/time -f %M -o "$out/$name.maxrss" "$@" >"$out/$name.json" 2>"$out/$name.err" ||
      status=$?
  else
    timeout -s KILL "$tmo" /usr/bin/time -f %M -o "$out/$name.maxrss" "$@" >"$out/$name.json" 2>"$out/$name.err" ||
      status=$?
  fi
  t1=$(date +%s.%N)
  local max_usage=0 failcnt=0 oom=0
  if [[ $capped == 1 ]]; then
    max_usage=$(cat "$cg/memory.max_usage_in_bytes")
    failcnt=$(cat "$cg/memory.failcnt")
    oom=$(awk '$1 == "oom_kill" { print $2 }' "$cg/memory.oom_control")
    cleanup_cg
  fi
  local rss_kb
  rss_kb=$(grep -Eo '^[0-9]+$' "$out/$name.maxrss" 2>/dev/null | tail -1 || true)
  jq -n --argjson s "$status" --argjson mu "$max_usage" --argjson fc "$failcnt" --argjson oom "${oom:-0}" \
    --argjson rss "${rss_kb:-0}" --argjson sec "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
    '{status: $s, cgroup_max_usage: $mu, failcnt: $fc, oom_kill: $oom, peak_rss: ($rss * 1024), seconds: $sec}' \
    >"$out/$name.mem"
  return 0
}

disk_rate() {  # GB/s of the disk, measured now
  "$disk_read" "$model" --depth 8 --seconds 5 --json >"$out/disk-$1.json"
  jq -r .gb_per_s "$out/disk-$1.json"
}

# decode NAME CAPPED TIMEOUT ARGS...: the n-token run and the 1-token run of one configuration.
decode() {
  local name=$1 capped=$2 tmo=$3
  shift 3
  local args=("$model" --json --prompt-ids "$prompt_ids" --threads "$threads" --temperature 0 "$@")
  run_one "$name" "$capped" "$tmo" "$car" run "${args[@]}" -n "$n"
  run_one "$name-n1" "$capped" "$tmo" "$car" run "${args[@]}" -n 1
}

# figures NAME DISK_GBS: the decode pair's figures as JSON in $out/NAME.figures (null tps when it failed).
figures() {
  local name=$1 disk=$2
  local j=$out/$name.json j1=$out/$name-n1.json m=$out/$name.mem
  if [[ $(jq .status "$m") != 0 ]] || ! jq -e .timings "$j" >/dev/null 2>&1 || ! jq -e .timings "$j1" >/dev/null 2>&1; then
    jq -n --slurpfile mem "$m" '{tps: null, mem: $mem[0]}' >"$out/$name.figures"
    return
  fi
  jq -n --slurpfile a "$j" --slurpfile b "$j1" --slurpfile mem "$m" --argjson disk "$disk" '
    $a[0] as $r | $b[0] as $r1 |
    ($r.tokens | length) as $nt |
    ($r.experts // {}) as $e | ($r1.experts // {}) as $e1 |
    (($e.bytes_read // 0) - ($e1.bytes_read // 0)) as $db |
    (($e.hits // 0) - ($e1.hits // 0)) as $dh | (($e.misses // 0) - ($e1.misses // 0)) as $dm |
    (if $nt > 1 then $db / ($nt - 1) else 0 end) as $bpt |
    (if $bpt > 0 and $disk > 0 then $disk * 1e9 / $bpt else null end) as $bound |
    {tps: $r.timings.decode_tokens_per_s, tokens: $nt, hit_rate: (if ($dh + $dm) > 0 then $dh / ($dh + $dm) else null end),
     bytes_per_token: $bpt, disk_gbs: $disk, bound_tps: $bound,
     of_bound: (if $bound then $r.timings.decode_tokens_per_s / $bound else null end),
     run_hit_rate: $e.hit_rate, budget_bytes: $e.budget_bytes, cap: $e.cap, mem: $mem[0]}' >"$out/$name.figures"
}

# One markdown row (without the leading cells) from $out/NAME.figures: tok/s | decode hit rate | MB read /
# decoded token | cgroup peak MiB | process peak RSS MiB | disk GB/s | disk-bound tok/s | of limit
row() {
  local name=$1 disk=$2
  figures "$name" "$disk"
  jq -r --arg err "$out/$name.err" '
    def r(k): . * k | round / k;
    if .tps == null then
      "failed (exit \(.mem.status), oom kills \(.mem.oom_kill); see \($err)) | | | | | | |"
    else
      [ (.tps | r(100) | tostring) + " (" + (.tokens | tostring) + " tokens)",
        (if .hit_rate then (.hit_rate * 100 | r(10) | tostring) + " %" else "-" end),
        (.bytes_per_token / 1e6 | round | tostring),
        (if .mem.cgroup_max_usage > 0 then (.mem.cgroup_max_usage / 1048576 | round | tostring) else "-" end),
        (.mem.peak_rss / 1048576 | round | tostring),
        (.disk_gbs | r(100) | tostring),
        (if .bound_tps then (.bound_tps | r(100) | tostring) else "-" end),
        (if .of_bound then (.of_bound * 100 | round | tostring) + " %" else "-" end)
      ] | join(" | ")
    end' "$out/$name.figures"
}

echo "# Streaming experts benchmark, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "results: $out"
echo

# ---- 1. the model --------------------------------------------------------------------------------------
if [[ ! -f $model ]]; then
  echo "writing $model (car gguf synth; once)"
  /usr/bin/time -f "synth peak RSS %M KiB, %e s" "$car" gguf synth -o "$model" --layers 24 --embd 2048 --heads 16 \
    --kv-heads 4 --experts 32 --experts-used 4 --ff-expert 2048 --vocab 32000 --type q4_k_m --seed 1
fi
"$car" gguf inspect --json "$model" >"$out/inspect.json"
expert_bytes=$(jq '[.expert_banks[].bytes] | add' "$out/inspect.json")
file_bytes=$(jq .file_size "$out/inspect.json")
echo "model: $model, $((file_bytes / 1000000)) MB, expert bytes $((expert_bytes / 1000000)) MB"
echo

# ---- 2. capped at CAP_GB --------------------------------------------------------------------------------
echo "## Decode under a $cap_gb GB memory cgroup (v1), 16-token prompt, $n tokens, $threads threads"
echo
echo "| run | tok/s | decode hit rate | MB read / token | cgroup peak MiB | process peak RSS MiB | disk GB/s | disk-bound tok/s | of limit |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for pf in on off; do
  name=capped-stream-prefetch-$pf
  extra=()
  [[ $pf == off ]] && extra=(--no-prefetch)
  disk=$(disk_rate "$name")
  state=$(mktemp -d)
  ram_args=(--expert-ram-gb "$expert_ram_gb")
  label="budget $expert_ram_gb GB"
  if [[ $expert_ram_gb == auto ]]; then  # the budget the streamer derives from the cgroup's limit
    ram_args=()
    label="budget from the cgroup"
  fi
  decode "$name" 1 "$run_timeout" --stream-experts on "${ram_args[@]}" --state-dir "$state" "${extra[@]}"
  rm -rf "$state"
  echo "| streamed, $label, prefetch $pf | $(row "$name" "$disk") |"
done
# The memory-mapped run: every expert page faulted in through the page cache, which the cap keeps small.
run_one capped-mmap 1 "$mmap_timeout" "$car" run "$model" --json --prompt-ids "$prompt_ids" --threads "$threads" \
  --temperature 0 --stream-experts off -n "$mmap_n"
m=$out/capped-mmap.mem
if [[ $(jq .status "$m") == 0 ]] && jq -e .timings "$out/capped-mmap.json" >/dev/null 2>&1; then
  echo "| memory-mapped (--stream-experts off), $mmap_n tokens | $(jq -r '.timings.decode_tokens_per_s * 1000 | round / 1000' "$out/capped-mmap.json") | - | - | $(jq '.cgroup_max_usage / 1048576 | round' "$m") | $(jq '.peak_rss / 1048576 | round' "$m") | - | - | - |"
else
  echo "| memory-mapped (--stream-experts off) | not done after $(jq '.seconds | round' "$m") s (exit $(jq .status "$m"): timeout $mmap_timeout s for a 16-token prompt + $mmap_n tokens) | | | $(jq '.cgroup_max_usage / 1048576 | round' "$m") | | | | |"
fi
echo

# ---- 3. the budget sweep (no cap) -------------------------------------------------------------------------
if [[ -n $budgets ]]; then
  echo "## Budget sweep (no cap): decode tok/s and hit rate against the expert cache budget"
  echo
  echo "| budget | GB | prefetch | tok/s | decode hit rate | MB read / token | cgroup peak MiB | process peak RSS MiB | disk GB/s | disk-bound tok/s | of limit |"
  echo "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  for pct in $budgets; do
    gb=$(awk -v e="$expert_bytes" -v p="$pct" 'BEGIN { printf "%.3f", e * p / 100 / 1e9 }')
    for pf in on off; do
      name=sweep-$pct-prefetch-$pf
      extra=()
      [[ $pf == off ]] && extra=(--no-prefetch)
      disk=$(disk_rate "$name")
      state=$(mktemp -d)
      decode "$name" 0 "$run_timeout" --stream-experts on --expert-ram-gb "$gb" --state-dir "$state" "${extra[@]}"
      rm -rf "$state"
      echo "| $pct % | $gb | $pf | $(row "$name" "$disk") |"
    done
  done
  echo
fi

# ---- 4. streamed with every expert in budget vs resident (no cap) ----------------------------------------
if [[ $compare == 1 ]]; then
  all_gb=$(awk -v e="$expert_bytes" 'BEGIN { printf "%.3f", e * 1.05 / 1e9 }')
  echo "## car bench without a cap: streamed (budget $all_gb GB, every expert) vs resident"
  echo
  echo "| mode | pp16 tok/s | tg$n tok/s | hit rate | peak RSS MiB |"
  echo "|---|---:|---:|---:|---:|"
  for mode in resident streamed; do
    args=(bench "$model" -p 16 -n "$n" -r "$bench_reps" --threads "$threads" --json)
    if [[ $mode == streamed ]]; then
      state=$(mktemp -d)
      args+=(--stream-experts on --expert-ram-gb "$all_gb" --state-dir "$state")
    else
      args+=(--stream-experts off)
    fi
    run_one "bench-$mode" 0 "$run_timeout" "$car" "${args[@]}"
    [[ $mode == streamed ]] && rm -rf "$state"
    j=$out/bench-$mode.json
    if jq -e .tg "$j" >/dev/null 2>&1; then
      jq -r --arg mode "$mode" '"| \($mode) | \(.pp.tokens_per_s.mean * 100 | round / 100) | \(.tg.tokens_per_s.mean * 100 | round / 100) | \(if .experts.mode == "streamed" then (.experts.hit_rate * 1000 | round / 10 | tostring) + " %" else "-" end) | \(.peak_rss_bytes / 1048576 | round) |"' "$j"
    else
      echo "| $mode | failed (see $out/bench-$mode.err) | | | |"
    fi
  done
  echo
fi
# ---- the issue's targets -------------------------------------------------------------------------------
echo "## Targets"
echo
cap_bytes=$(awk -v g="$cap_gb" 'BEGIN { printf "%.0f", g * 1e9 }')
jq -r -n --slurpfile f "$out/capped-stream-prefetch-on.figures" --argjson cap "$cap_bytes" '
  $f[0] as $x |
  if $x.tps == null then "- capped streamed run failed: no figures" else
  "- decode >= 2.0 tok/s under the cap: \($x.tps * 100 | round / 100) tok/s: \(if $x.tps >= 2.0 then "met" else "NOT met" end)",
  "- >= 80 % of the disk-bound limit: \(if $x.of_bound then ($x.of_bound * 100 | round | tostring) + " %: " + (if $x.of_bound >= 0.8 then "met" else "NOT met" end) else "no disk reads" end)",
  "- peak within the cap: cgroup max usage \($x.mem.cgroup_max_usage / 1048576 | round) MiB of \($cap / 1048576 | round) MiB, oom kills \($x.mem.oom_kill): \(if $x.mem.oom_kill == 0 and $x.mem.status == 0 then "met" else "NOT met" end)"
  end'
if [[ $compare == 1 ]] && jq -e .tg "$out/bench-resident.json" >/dev/null 2>&1 && jq -e .tg "$out/bench-streamed.json" >/dev/null 2>&1; then
  jq -r -n --slurpfile r "$out/bench-resident.json" --slurpfile s "$out/bench-streamed.json" '
    ($s[0].tg.tokens_per_s.mean / $r[0].tg.tokens_per_s.mean) as $q |
    "- streamed car bench (every expert in budget) within 10 % of resident decode: \($q * 100 | round) % of resident: \(if $q >= 0.9 then "met" else "NOT met" end)"'
fi
echo
echo "done: $(date -u '+%H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
