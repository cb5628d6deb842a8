#!/usr/bin/env bash
# scripts/thread-safety.sh: build the libraries whose locking is annotated (core/util/thread_annotations.h)
# with clang and -DCAR_THREAD_SAFETY=ON, so a member read or written without the mutex its CAR_GUARDED_BY
# names, or a CAR_REQUIRES function called without it, fails the build. Only those targets' object files are
# compiled (in build-thread-safety/, at -O0), so it stays cheap enough for every CI run.
#
# Annotated: car_util (ThreadPool), car_experts (ExpertPool, StreamedExpertSource), car_engine (the
# per-model Scheduler), the header-only
# BackendCache (compiled through cache_test, which instantiates it) and car_daemon (WorkerPool,
# RequestHandler, ModelCatalog, the metrics registry, EngineRuntime's pool). Every target that includes an
# annotated header and defines functions touching the guarded members must be here; the check below fails
# the run when a file that uses the annotations belongs to none of them.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${CAR_THREAD_SAFETY_BUILD_DIR:-$root/build-thread-safety}
cxx=${CAR_THREAD_SAFETY_CXX:-clang++-14}
jobs=${CAR_THREAD_SAFETY_JOBS:-2}
targets=(car_util car_experts car_engine cache_test car_daemon)

if ! command -v "$cxx" >/dev/null; then
  echo "thread-safety.sh: $cxx not found (scripts/install-deps.sh installs clang-14)" >&2
  exit 1
fi

# The flags must bite: a read of a guarded member without its mutex has to be an error with this compiler.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
cat >"$probe/probe.cpp" <<'CPP'
#include "core/util/thread_annotations.h"
struct Counter {
  car::Mutex mu;
  int n CAR_GUARDED_BY(mu) = 0;
  int unlocked_read() { return n; }
};
int main() { return Counter().unlocked_read(); }
CPP
if "$cxx" -std=c++20 -I"$root" -Wthread-safety -Werror=thread-safety -fsyntax-only "$probe/probe.cpp" 2>/dev/null; then
  echo "thread-safety.sh: $cxx accepted an unguarded read; the analysis is not working" >&2
  exit 1
fi

# Every source file that uses the annotations must be compiled by one of the targets (a file outside them
# would be analysed by nobody): its directory's target is looked up in the CMake lists below.
declare -A dir_target=([core/util]=car_util [core/experts]=car_experts [core/engine]=car_engine [core/cache]=cache_test [daemon]=car_daemon [daemon/http]=car_daemon)
unchecked=()
while IFS= read -r f; do
  d=$(dirname "$f")
  [ "$d" = core/cache ] && continue  # header-only: instantiated by cache_test
  [ -n "${dir_target[$d]:-}" ] || unchecked+=("$f")
done < <(cd "$root" && grep -rlE 'CAR_(GUARDED_BY|REQUIRES|EXCLUDES|ACQUIRE|RELEASE)' core daemon tools config \
  --include='*.cpp' --include='*.h' | grep -v '^core/util/thread_annotations.h$' | sort)
if [ "${#unchecked[@]}" -gt 0 ]; then
  echo "thread-safety.sh: these files use the lock annotations but no checked target compiles them:" >&2
  printf '  %s\n' "${unchecked[@]}" >&2
  exit 1
fi

mkdir -p "$build"
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0 \
  -DCMAKE_CXX_COMPILER="$cxx" "${launcher[@]}" -DCAR_THREAD_SAFETY=ON -DCAR_BUILD_BENCH=OFF \
  >"$build/configure.log" 2>&1 || { cat "$build/configure.log" >&2; exit 1; }
# Only the targets' own object files: the analysis is per translation unit, so neither their dependencies
# nor a link are needed.
mapfile -t objects < <(ninja -C "$build" -t targets all |
  sed -n "$(printf 's|^\\(.*/CMakeFiles/%s\\.dir/.*\\.o\\): .*|\\1|p;' "${targets[@]}")")
if [ "${#objects[@]}" -eq 0 ]; then
  echo "thread-safety.sh: no object files found for ${targets[*]}" >&2
  exit 1
fi
start=$(date +%s)
ninja -C "$build" -j"$jobs" "${objects[@]}"
echo "thread-safety.sh: ${#objects[@]} files of ${targets[*]} clean under -Werror=thread-safety" \
  "($(( $(date +%s) - start )) s)"
