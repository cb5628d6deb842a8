#!/usr/bin/env bash
# Set up, build and run every test:   bash scripts/test.sh
#   --sanitize LIST   build with -fsanitize=LIST (address,undefined | thread) in build-<LIST>/
#   -R REGEX          run only the ctest tests matching REGEX, and build only the test executables that can
#                     hold such a test (see below) and what they depend on
#   -E REGEX          do not run the ctest tests matching REGEX (they are still built)
#   --tests-from DIR  with -R: DIR is a built tree of the same sources (CI: build/, which the README stage
#                     built and ran) whose test list names the executables of the matching tests exactly;
#                     build only those (falls back to the rule below when DIR cannot tell)
#   --no-deps         skip the dependency check
#   --dry-run         configure, say what -R would build, and stop
# CAR_TEST_DEBUG_INFO=-g1 (set by .ci/run): build/ gets line tables only instead of -g, same -O2 and NDEBUG
# (so the same code and tests, and the same stripped .deb); unset, build/ keeps CMake's RelWithDebInfo flags.
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=""; regex=""; exclude=""; tests_from=""; deps=1; dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) sanitize="$2"; shift 2 ;;
    -R) regex="$2"; shift 2 ;;
    -E) exclude="$2"; shift 2 ;;
    --tests-from) tests_from="$2"; shift 2 ;;
    --no-deps) deps=0; shift ;;
    --dry-run) dry=1; shift ;;
    *) echo "test.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ "$deps" -eq 1 ] && bash scripts/install-deps.sh
build=build
# Tests are required here (the build's default, AUTO, would skip them without GoogleTest).
# Unity batches for the daemon and the chat interpreter (CAR_UNITY_BUILD): a build from scratch is what this
# script mostly does.
cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAR_BUILD_TESTS=ON -DCAR_UNITY_BUILD=ON)
if [ -n "${CAR_TEST_DEBUG_INFO:-}" ] && [ -z "$sanitize" ]; then
  cmake_args+=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 $CAR_TEST_DEBUG_INFO -DNDEBUG")
fi
if [ -n "$sanitize" ]; then
  build="build-${sanitize//,/-}"
  # -g1: line tables and function names - all a sanitizer report's stack needs - without the variable and
  # type information of -g, which costs a quarter of the compile time of a test file here.
  # The test executables, car and car-inferenced are compiled at -O0, the libraries at -O1
  # (CAR_TEST_COMPILE_OPTIONS in cmake/CarDefaults.cmake): half the compile time of those files.
  cmake_args+=(-DCAR_SANITIZE="$sanitize" -DCAR_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-O1
    -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DCAR_TEST_COMPILE_OPTIONS=-O0)
fi
cmake -S . -B "$build" "${cmake_args[@]}" >/dev/null

# targets_of_tests DIR STRICT: append to `targets` the targets of the tests matching REGEX that the configured
# tree DIR lists: a gtest executable's own target; for a script run on programs of DIR (bash, python3 or node
# given car, car-inferenced...), those programs' targets here. Returns 1 when a test's cannot be told; with
# STRICT 1 also for a gtest executable DIR has not built (its tests are not listed yet).
targets_of_tests() {
  local dir name cmd exe w found strict=$2
  local -a words
  dir=$(cd "$1" && pwd)
  while IFS=$'\t' read -r name cmd; do
    read -r -a words <<< "$cmd"
    exe=${words[0]:-}
    exe=${exe##*/}
    if [[ $name == *_NOT_BUILT ]]; then
      [ "$strict" -eq 1 ] && return 1
      exe=${name%_NOT_BUILT}; words=()
    fi
    if [ -n "$exe" ] && [[ " ${gtests[*]} " == *" $exe "* ]]; then targets+=("$exe"); continue; fi
    found=0
    if [ "${#words[@]}" -gt 1 ] && [[ ${words[0]} != "$dir"/* ]]; then
      for w in "${words[@]:1}"; do
        [[ $w == "$dir"/* ]] || continue
        if ninja -C "$build" -t query "${w##*/}" >/dev/null 2>&1; then targets+=("${w##*/}"); found=1; else found=0; break; fi
      done
    fi
    [ "$found" -eq 1 ] || return 1
  done < <(ctest --test-dir "$dir" -N -V -R "$regex" | awk '
      match($0, /^[0-9]+: Test command: /) { cmd = substr($0, RLENGTH + 1); gsub(/"/, "", cmd) }
      match($0, /^ *Test +#[0-9]+: /) { print substr($0, RLENGTH + 1) "\t" cmd; cmd = "" }')
}


# With -R, only the GoogleTest executables whose sources (or the headers beside them) contain text matching
# REGEX are built - a test's suite, name, instantiation prefix and parameter names are written in its
# source, so this is a superset of the executables holding a matching test - plus the executable of any
# other matching test; their add_dependencies (car, car-inferenced) come along. That holds for a REGEX of
# words, | and parentheses, which cannot match across the '.' or '/' of "Suite.Name"; any other REGEX, or a
# matching test whose executable cannot be told (a script, a binary not built yet), builds everything.
# With --tests-from DIR, exactly the executables DIR lists for the matching tests (targets_of_tests).
targets=()
words='^[()|A-Za-z0-9_]+$'
if [ -n "$regex" ]; then
  # gtest_discover_tests leaves <target>[1]_include.cmake in the target's binary folder at configure time.
  mapfile -t gtests < <(find "$build" -name '*\[1\]_include.cmake' -printf '%f\n' | sed 's/\[1\]_include\.cmake$//' | sort -u)
fi
if [ -n "$regex" ] && [ -n "$tests_from" ] && [ -f "$tests_from/CTestTestfile.cmake" ] &&
   targets_of_tests "$tests_from" 1 && [ "${#targets[@]}" -gt 0 ]; then
  echo "test.sh: -R $regex: the executables $tests_from lists for it"
  mapfile -t targets < <(printf '%s\n' "${targets[@]}" | sort -u)
elif [ -n "$regex" ] && ! [[ $regex =~ $words ]]; then
  targets=(all)
elif [ -n "$regex" ]; then
  targets=()
  # Source files per target, from the compile database: "target<TAB>file".
  sources=$(awk -F'"' '$2 == "command" && match($0, / -o [^ ]*CMakeFiles\/[^\/ ]*\.dir\//) {
      t = substr($0, RSTART, RLENGTH - 5); sub(/.*CMakeFiles\//, "", t) } $2 == "file" { print t "\t" $4 }' \
    "$build/compile_commands.json")
  for t in "${gtests[@]}"; do
    mapfile -t files < <(printf '%s\n' "$sources" | awk -F'\t' -v t="$t" '$1 == t { print $2 }')
    # A unity batch (CAR_UNITY_BUILD, written at configure time) stands for the files it includes.
    mapfile -t files < <(for f in "${files[@]}"; do
      if [[ $f == */Unity/unity_*.cxx ]]; then sed -n 's/^#include "\(.*\)"$/\1/p' "$f"; else printf '%s\n' "$f"; fi
    done)
    mapfile -t headers < <(for f in "${files[@]}"; do find "$(dirname "$f")" -maxdepth 1 -name '*.h'; done | sort -u)
    if [ "${#files[@]}" -eq 0 ] || grep -Eq -- "$regex" "${files[@]}" "${headers[@]}" || [[ $t =~ $regex ]]; then
      targets+=("$t")
    fi
  done
  # Tests the configured tree already lists (scripts, checks run through a test binary, tests of binaries
  # built before): their executable's target; for a script run on programs of this tree (bash, python3 or
  # node given car, car-inferenced...), those programs' targets; everything when that cannot be told.
  # (A test binary not built yet shows an empty command; a gtest target not built yet, <target>_NOT_BUILT.)
  targets_of_tests "$build" 0 || targets=(all)
  mapfile -t targets < <(printf '%s\n' "${targets[@]}" | sort -u)
  [ "${#targets[@]}" -eq 0 ] && targets=(all)
  [[ " ${targets[*]} " == *" all "* ]] && targets=(all)
fi
[ "${#targets[@]}" -gt 0 ] && echo "test.sh: -R $regex: building ${targets[*]}"
[ "$dry" -eq 1 ] && exit 0
cmake --build "$build" -j "$(nproc)" ${targets[@]:+--target "${targets[@]}"}
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"
ctest_args=(--test-dir "$build" --output-on-failure -j "$(nproc)")
[ -n "$regex" ] && ctest_args+=(-R "$regex")
[ -n "$exclude" ] && ctest_args+=(-E "$exclude")
ctest "${ctest_args[@]}"
