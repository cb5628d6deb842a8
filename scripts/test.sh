#!/usr/bin/env bash
# Set up, build and run every test:   bash scripts/test.sh
#   --sanitize LIST   build with -fsanitize=LIST (address,undefined | thread) in build-<LIST>/
#   -R REGEX          run only the ctest tests matching REGEX
#   --no-deps         skip the dependency check
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=""; regex=""; deps=1
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) sanitize="$2"; shift 2 ;;
    -R) regex="$2"; shift 2 ;;
    --no-deps) deps=0; shift ;;
    *) echo "test.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ "$deps" -eq 1 ] && bash scripts/install-deps.sh
build=build
# Tests are required here (the build's default, AUTO, would skip them without GoogleTest).
cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAR_BUILD_TESTS=ON)
if [ -n "$sanitize" ]; then
  build="build-${sanitize//,/-}"
  cmake_args+=(-DCAR_SANITIZE="$sanitize" -DCAR_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-O1)
fi
cmake -S . -B "$build" "${cmake_args[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"
ctest_args=(--test-dir "$build" --output-on-failure -j "$(nproc)")
[ -n "$regex" ] && ctest_args+=(-R "$regex")
ctest "${ctest_args[@]}"
