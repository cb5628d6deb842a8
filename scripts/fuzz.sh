#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS]: build the libFuzzer targets with clang-14 (ASan+UBSan) in build-fuzz/ and run
# each for a share of SECONDS (default 120) from a seed corpus, CAR_FUZZ_JOBS (default 2) fuzzers at a
# time. Exits non-zero when a fuzzer finds a crash, leak, timeout or UB report; the reproducer is left in
# build-fuzz/artifacts/<name>/.
#
# Each fuzzer runs under a small stack (ulimit -s CAR_FUZZ_STACK_KB, default 1024 KiB, an eighth of the
# usual 8 MiB): an input that recurses without a bound (a long operator chain in a chat template, a deeply
# nested JSON request) overflows it and is reported as a crash, where under 8 MiB it might pass unnoticed.
# The value leaves room for ASan's larger frames on every legitimate input (the seeds all pass).
#
# Conventions (fuzz/README.md): fuzz/<name>/CMakeLists.txt defines the fuzzer `fuzz_<name>` and optionally a
# seed writer `corpus_<name>` run as `corpus_<name> OUT_DIR [CONFORMANCE_DIR]`; files in fuzz/<name>/seeds/
# are seeds too; fuzz/<name>/<name>.dict, when present, is passed as -dict.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
total=${1:-120}
build=${CAR_FUZZ_BUILD_DIR:-$root/build-fuzz}
jobs=${CAR_FUZZ_JOBS:-2}
stack_kb=${CAR_FUZZ_STACK_KB:-1024}
cxx=${CAR_FUZZ_CXX:-clang++-14}
conformance=${CAR_CONFORMANCE_DIR:-$root/../shared/conformance}

if ! command -v "$cxx" >/dev/null; then
  echo "fuzz.sh: $cxx not found (scripts/install-deps.sh installs clang-14)" >&2
  exit 1
fi

mkdir -p "$build"
echo "fuzz.sh: configuring $build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
  -DCAR_BUILD_FUZZERS=ON -DCAR_BUILD_TESTS=OFF -DCAR_BUILD_BENCH=OFF \
  -DCAR_SANITIZE=address,undefined -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -gline-tables-only -DNDEBUG" >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log" >&2; exit 1; }

# -gline-tables-only (above): the file:line a crash report's stack needs, without -g's variable and type
# information, which is most of the debug-info cost of the build.
# Only the fuzz targets are built (by name), so a half-finished module elsewhere cannot break this.
mapfile -t fuzzers < <(ninja -C "$build" -t targets all | sed -n 's/^\(fuzz_[A-Za-z0-9_]*\): .*/\1/p' | sort -u)
mapfile -t corpora < <(ninja -C "$build" -t targets all | sed -n 's/^\(corpus_[A-Za-z0-9_]*\): .*/\1/p' | sort -u)
if [ "${#fuzzers[@]}" -eq 0 ]; then
  echo "fuzz.sh: no fuzz_* targets found" >&2
  exit 1
fi
echo "fuzz.sh: building ${fuzzers[*]} ${corpora[*]}"
ninja -C "$build" -j"$jobs" "${fuzzers[@]}" "${corpora[@]}"

per=$(( total / ${#fuzzers[@]} ))
[ "$per" -lt 1 ] && per=1
# A libFuzzer process uses one core: the fuzzers run $jobs at a time, each still for its full share of
# SECONDS, so the wall time is about SECONDS / jobs.
run_one() {  # run_one FUZZER: writes $build/FUZZER.log and $build/FUZZER.rc
  local fuzzer=$1 name=${1#fuzz_} bin seeds corpus artifacts gen dict=() rc
  bin=$(find "$build/fuzz" -type f -name "$fuzzer" -perm -u+x | head -n1)
  seeds=$build/seeds/$name
  corpus=$build/corpus/$name
  artifacts=$build/artifacts/$name
  rm -rf "$seeds"
  mkdir -p "$seeds" "$corpus" "$artifacts"
  if [ -d "fuzz/$name/seeds" ]; then cp -r "fuzz/$name/seeds/." "$seeds/"; fi
  gen=$(find "$build/fuzz" -type f -name "corpus_$name" -perm -u+x | head -n1 || true)
  if [ -n "$gen" ]; then
    if [ -d "$conformance" ]; then "$gen" "$seeds" "$conformance"; else "$gen" "$seeds"; fi
  fi
  if [ -f "fuzz/$name/$name.dict" ]; then dict=(-dict="fuzz/$name/$name.dict"); fi
  echo "fuzz.sh: running $fuzzer for ${per}s ($(ls "$seeds" | wc -l) seeds, $(ls "$corpus" | wc -l) corpus files, ${stack_kb} KiB stack)"
  set +e
  (
    ulimit -s "$stack_kb"
    exec "$bin" "$corpus" "$seeds" -max_total_time="$per" -max_len="${CAR_FUZZ_MAX_LEN:-65536}" \
      -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 -artifact_prefix="$artifacts/" "${dict[@]}"
  ) >"$build/$fuzzer.log" 2>&1
  rc=$?
  set -e
  echo "$rc" >"$build/$fuzzer.rc"
}
running=0
for fuzzer in "${fuzzers[@]}"; do
  rm -f "$build/$fuzzer.rc"
  if [ "$running" -ge "$jobs" ]; then wait -n || true; running=$(( running - 1 )); fi
  run_one "$fuzzer" &
  running=$(( running + 1 ))
done
wait
status=0
summary=()
for fuzzer in "${fuzzers[@]}"; do
  log=$build/$fuzzer.log
  artifacts=$build/artifacts/${fuzzer#fuzz_}
  rc=$(cat "$build/$fuzzer.rc" 2>/dev/null || echo "?")
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
  secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -n1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n1 || true)
  if [ "$rc" != 0 ]; then
    status=1
    echo "fuzz.sh: $fuzzer FAILED (exit $rc); log $log, artifacts in $artifacts:" >&2
    grep -E 'ERROR|SUMMARY|runtime error|==[0-9]+==' "$log" | head -n 20 >&2 || true
    ls "$artifacts" >&2
  fi
  summary+=("$fuzzer: ${runs:-?} executions in ${secs:-?} s, ${cov:-cov: ?}, exit $rc")
done
echo "fuzz.sh: summary"
for line in "${summary[@]}"; do echo "  $line"; done
exit "$status"
