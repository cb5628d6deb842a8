#!/usr/bin/env bash
# Installs every build and test dependency from Debian packages. Idempotent: packages already present are
# skipped, so the README, CI and a new user can all run it as often as they like.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build pkg-config git
  libboost1.81-dev          # Asio (1.74's coroutine headers miss an include under g++ 12)
  nlohmann-json3-dev libspdlog-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libsystemd-dev systemd    # sd_notify; systemd-analyze verifies the units
  libpcre2-dev              # Unicode-property regexes for BPE pre-tokenizers
  libicu-dev                # Unicode normalisation and properties for the WordPiece tokenizer
  clang-14 libclang-rt-14-dev  # libFuzzer and sanitizer runtimes
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
