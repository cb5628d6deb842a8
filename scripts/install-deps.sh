#!/usr/bin/env bash
# Installs the Debian packages the project needs, by purpose. Idempotent: packages already present are
# skipped, so the README, CI and a new user can all run it as often as they like. Needs root or sudo.
#
#   bash scripts/install-deps.sh [SETS...] [--allow-boost-replace] [--list]
#     --runtime   what the built binaries need to run (shared libraries; systemd for the units/sysusers)
#     --build     compilers, CMake and the headers to build car and car-inferenced (the demo needs no more)
#     --test      GoogleTest/GoogleMock, systemd-analyze (unit check), promtool (metrics check), dpkg-dev (the
#                 .deb check), Node.js and npm (the HTTP front's test with the `openai` client)
#     --bench     Google Benchmark (bench/)
#     --fuzz      clang-14 and its libFuzzer/sanitizer runtimes (scripts/fuzz.sh)
#     --all       every set
#   No set given: --build --test --bench, what scripts/test.sh needs.
#   --list                 print the packages of the chosen sets and exit (nothing installed)
#   --allow-boost-replace  see below
#
# Boost: the daemon needs Boost >= 1.81 (Asio: 1.74's coroutine headers miss an include under g++ 12).
# libboost-dev is used when its version is new enough. Otherwise libboost1.81-dev is installed, which
# conflicts with an installed older libboost1.NN-dev: apt would remove it. The script then names what would
# be removed and stops, unless --allow-boost-replace is given or you confirm at the terminal.
set -euo pipefail
want_runtime=0 want_build=0 want_test=0 want_bench=0 want_fuzz=0 list=0 allow_boost_replace=0 any=0
for arg in "$@"; do
  case "$arg" in
    --runtime) want_runtime=1; any=1 ;;
    --build) want_build=1; any=1 ;;
    --test) want_test=1; any=1 ;;
    --bench) want_bench=1; any=1 ;;
    --fuzz) want_fuzz=1; any=1 ;;
    --all) want_runtime=1 want_build=1 want_test=1 want_bench=1 want_fuzz=1; any=1 ;;
    --list) list=1 ;;
    --allow-boost-replace) allow_boost_replace=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-deps: unknown argument $arg (--help lists them)" >&2; exit 2 ;;
  esac
done
[ "$any" -eq 1 ] || { want_build=1; want_test=1; want_bench=1; }

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# The Boost headers package: an installed new-enough one, else libboost-dev when new enough, else 1.81.
boost_pkg() {
  local p v
  for p in $(dpkg-query -W -f='${Package}\n' 'libboost1.*-dev' 2>/dev/null); do
    if installed "$p"; then
      v=${p#libboost}; v=${v%-dev}
      if dpkg --compare-versions "$v" ge 1.81; then echo "$p"; return; fi
    fi
  done
  v=$(apt-cache policy libboost-dev 2>/dev/null | sed -n 's/^ *Candidate: //p')
  if [ -n "$v" ] && [ "$v" != "(none)" ] && dpkg --compare-versions "$v" ge 1.81; then
    echo libboost-dev
  else
    echo libboost1.81-dev
  fi
}

pkgs=()
if [ "$want_runtime" -eq 1 ]; then
  # Debian 12 names; the .deb (scripts/check-package.sh) computes its own from the binaries.
  pkgs+=(systemd libspdlog1.10 libfmt9 libpcre2-8-0 libicu72 libsystemd0)
fi
if [ "$want_build" -eq 1 ]; then
  pkgs+=(
    build-essential cmake ninja-build pkg-config git
    "$(boost_pkg)"            # Asio
    nlohmann-json3-dev libspdlog-dev libcli11-dev
    libsystemd-dev            # sd_notify, socket activation
    libpcre2-dev              # Unicode-property regexes for BPE pre-tokenizers
    libicu-dev                # Unicode normalisation and properties for the WordPiece tokenizer
  )
fi
if [ "$want_test" -eq 1 ]; then
  pkgs+=(libgtest-dev libgmock-dev
    systemd                   # systemd-analyze verifies the units (scripts/check-units.sh)
    prometheus                # promtool checks the daemon's metrics page (tests/daemon/check_metrics_page.sh)
    dpkg-dev fakeroot         # cpack -G DEB: dpkg-shlibdeps computes Depends (scripts/check-package.sh)
    python3-kubernetes python3-yaml  # the Kubernetes examples checked against the API schema (tests/packaging)
    nodejs)                   # the HTTP front's test with the official `openai` npm client (tests/http/node)
  # Debian's nodejs has no npm; a Node from elsewhere (NodeSource) brings its own.
  command -v npm >/dev/null || pkgs+=(npm)
fi
[ "$want_bench" -eq 1 ] && pkgs+=(libbenchmark-dev)
[ "$want_fuzz" -eq 1 ] && pkgs+=(clang-14 libclang-rt-14-dev)  # libFuzzer and sanitizer runtimes
# De-duplicate, keeping order.
mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | awk '!seen[$0]++')

if [ "$list" -eq 1 ]; then
  printf '%s\n' "${pkgs[@]}"
  exit 0
fi
missing=()
for p in "${pkgs[@]}"; do installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -q

# Never remove a package behind the user's back (libboost1.74-dev conflicts with libboost1.81-dev).
removals=$(apt-get -s install --no-install-recommends "${missing[@]}" 2>/dev/null | sed -n 's/^Remv \([^ ]*\).*/\1/p' | tr '\n' ' ')
if [ -n "$removals" ]; then
  echo "install-deps: installing ${missing[*]} would REMOVE: $removals" >&2
  echo "install-deps: (the daemon needs Boost >= 1.81; this release's libboost-dev is older)" >&2
  if [ "$allow_boost_replace" -ne 1 ]; then
    if [ -t 0 ]; then
      read -r -p "Remove them? [y/N] " answer
      case "$answer" in y|Y|yes) ;; *) echo "install-deps: nothing installed" >&2; exit 1 ;; esac
    else
      echo "install-deps: nothing installed; rerun with --allow-boost-replace to accept" >&2
      exit 1
    fi
  fi
fi
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
